"""The one thread pool.  Kernels are native functions called through ctypes CFUNCTYPE, which
releases the GIL, so Python threads run them truly in parallel.  `parallel_for` splits an
iteration range into one chunk per thread; the calling thread runs the first chunk itself.

The pool only grows: `set_num_threads` never shuts down workers that kernels on other Python
threads may be using — a call that wants more threads than exist starts the missing ones, and a
smaller setting just leaves some idle.  In a forked child (where only the forking thread
survives) the pool and its lock are replaced by fresh ones."""
from __future__ import annotations

import os
import threading

from .. import config


class _Worker:
    """One thread parked on its own `go` lock: the caller hands it one task by filling `task`
    and releasing `go` (a single futex wake, no queue and no future in between)."""

    __slots__ = ("go", "task")

    def __init__(self):
        self.go = threading.Lock()
        self.go.acquire()
        self.task = None


class _Pool:
    """Idle workers on a stack; a parallel_for call takes the ones it needs and each worker puts
    itself back before it reports its chunk done."""

    def __init__(self):
        self.idle = []
        self.workers = 0
        self.lock = threading.Lock()

    def take(self, n: int) -> list:
        """Up to n idle workers, starting new ones while the pool is below MAX_WORKERS (calls
        from several Python threads at once each get their own)."""
        with self.lock:
            got = [self.idle.pop() for _ in range(min(n, len(self.idle)))]
            while len(got) < n and self.workers < MAX_WORKERS:
                self.workers += 1
                w = _Worker()
                threading.Thread(target=self._work, args=(w,), name=f"lazycandle-{self.workers}",
                                 daemon=True).start()
                got.append(w)
        return got

    def _work(self, w: _Worker):
        _in_worker.flag = True
        idle, lock = self.idle, self.lock
        while True:
            w.go.acquire()
            fn, lo, hi, batch = w.task
            w.task = None
            try:
                fn(lo, hi)
            except BaseException as e:  # handed to the caller, which re-raises it
                batch.fail(e)
            finally:
                with lock:
                    idle.append(w)
                batch.finish()


class _Batch:
    """Completion of one parallel_for call's pool chunks: the last one to finish releases
    `done`, on which the caller blocks; the first error they raised."""

    __slots__ = ("left", "lock", "done", "error")

    def __init__(self, n: int):
        self.left, self.lock, self.done, self.error = n, threading.Lock(), threading.Lock(), None
        self.done.acquire()

    def fail(self, e):
        if self.error is None:
            self.error = e

    def finish(self):
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            self.done.release()

    def wait(self):
        # (Yielding the GIL in a spin before parking was tried: under load it hands the core
        # to other processes and doubles the round trip.)
        self.done.acquire()
        if self.error is not None:
            raise self.error


MAX_WORKERS = 4 * (os.cpu_count() or 1)
_pool = _Pool()
_in_worker = threading.local()


def _reset_after_fork():
    global _pool
    _pool = _Pool()


os.register_at_fork(after_in_child=_reset_after_fork)


def split(lo: int, hi: int, parts: int, align: int = 1):
    """Split [lo, hi) into at most `parts` contiguous chunks whose inner bounds are multiples of
    `align` (so vector bodies stay whole)."""
    n = hi - lo
    if n <= 0:
        return []
    parts = max(1, min(parts, (n + align - 1) // align))
    bounds = [lo]
    for p in range(1, parts):
        b = lo + (n * p // parts) // align * align
        if b > bounds[-1]:
            bounds.append(b)
    bounds.append(hi)
    return list(zip(bounds[:-1], bounds[1:]))


MIN_COST = 65536.0      # below this total cost (rough element-operations) work stays on the calling thread


def parallel_for(fn, lo: int, hi: int, *, cost_per_item: float = 1.0, align: int = 1,
                 min_cost: float = MIN_COST, threads: int | None = None) -> None:
    """Run fn(a, b) over chunks of [lo, hi).  Work whose total cost (items x cost_per_item, in
    rough element-operations) is below `min_cost` stays on the calling thread: a pool round
    trip costs ~10-20 us.  The thread count is read once, so a concurrent set_num_threads changes
    only later calls."""
    n = hi - lo
    if n <= 0:
        return
    t = threads or config.get_num_threads()
    if t <= 1 or n * cost_per_item < min_cost or n < 2 or getattr(_in_worker, "flag", False):
        fn(lo, hi)      # (a chunk that itself runs parallel_for stays on its worker: no deadlock)
        return
    chunks = split(lo, hi, t, align)
    if len(chunks) == 1:
        fn(lo, hi)
        return
    workers = _pool.take(len(chunks) - 1)
    mine = chunks[:1] + chunks[1 + len(workers):]      # chunks no worker was free for run here too
    if not workers:
        for a, b in mine:
            fn(a, b)
        return
    batch = _Batch(len(workers))
    for w, (a, b) in zip(workers, chunks[1:]):
        w.task = (fn, a, b, batch)
        w.go.release()
    try:
        for a, b in mine:
            fn(a, b)
    finally:
        batch.wait()        # never return while a chunk may still be writing
