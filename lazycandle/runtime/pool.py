"""The one thread pool.  Kernels are native functions called through ctypes CFUNCTYPE, which
releases the GIL, so Python threads run them truly in parallel.  `parallel_for` splits an
iteration range into one chunk per thread; the calling thread runs the first chunk itself.

The pool only grows: `set_num_threads` never shuts down workers that kernels on other Python
threads may be using — a call that wants more threads than exist starts the missing ones, and a
smaller setting just leaves some idle.  In a forked child (where only the forking thread
survives) the pool and its lock are replaced by fresh ones."""
from __future__ import annotations

import os
import queue
import threading

from .. import config


class _Pool:
    """Worker threads taking (fn, lo, hi, batch) tasks from one queue."""

    def __init__(self):
        self.tasks = queue.SimpleQueue()
        self.workers = 0
        self.lock = threading.Lock()

    def ensure(self, n: int) -> None:
        if self.workers >= n:
            return
        with self.lock:
            while self.workers < n:
                self.workers += 1
                threading.Thread(target=self._work, name=f"lazycandle-{self.workers}", daemon=True).start()

    def _work(self):
        _in_worker.flag = True
        tasks = self.tasks
        while True:
            fn, lo, hi, batch = tasks.get()
            try:
                fn(lo, hi)
            except BaseException as e:  # handed to the caller, which re-raises it
                batch.fail(e)
            finally:
                batch.done()


class _Batch:
    """Completion of one parallel_for call's pool chunks, and the first error they raised."""

    __slots__ = ("left", "cond", "error")

    def __init__(self, n: int):
        self.left, self.cond, self.error = n, threading.Condition(threading.Lock()), None

    def fail(self, e):
        if self.error is None:
            self.error = e

    def done(self):
        with self.cond:
            self.left -= 1
            if self.left == 0:
                self.cond.notify_all()

    def wait(self):
        with self.cond:
            while self.left:
                self.cond.wait()
        if self.error is not None:
            raise self.error


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


def parallel_for(fn, lo: int, hi: int, *, cost_per_item: float = 1.0, align: int = 1,
                 min_cost: float = 65536.0, threads: int | None = None) -> None:
    """Run fn(a, b) over chunks of [lo, hi).  Work whose total cost (items x cost_per_item, in
    rough element-operations) is below `min_cost` stays on the calling thread: a pool round
    trip costs ~20 us.  The thread count is read once, so a concurrent set_num_threads changes
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
    pool = _pool
    pool.ensure(len(chunks) - 1)
    batch = _Batch(len(chunks) - 1)
    for a, b in chunks[1:]:
        pool.tasks.put((fn, a, b, batch))
    try:
        fn(*chunks[0])
    finally:
        batch.wait()        # never return while a chunk may still be writing
