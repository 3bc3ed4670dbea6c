"""Compiling a plan's kernels ahead of their first use, on a few background threads.

A kernel is compiled when a step first runs it; a new plan lists its kernels before its steps
are set up -- first what each node step will compile (steps.NodeStep.ahead: the GEMM kernels
and epilogues its setup measures or runs, the attention and index kernels), which the plan
needs while it is built, then its fused kernels in plan order -- and `prefetch` queues those
neither compiled nor in the disk cache, each once, to `config.compile_threads()` daemon threads
(0: none, everything compiles on first use as before). While they compile, the thread building
the plan goes on with the rest (node steps, matmul backend measurements); a step whose kernel
is still queued compiles it itself, and one whose kernel is being compiled waits for it
(codegen/jit._once), so the results and the code are the same as compiling on first use. LLVM
runs outside llvmlite's lock (codegen/llvm_work.py), so two kernels really compile at once.

`quiet()` holds the threads back while a caller times kernels (matmul backend choices are
measured once and remembered on disk: a compile beside them would skew the choice).  At exit
the queue is dropped and the process waits for the kernels being compiled (LLVM must not run
while the interpreter shuts down); a fork waits for them too (none may hold llvmlite's lock)."""
from __future__ import annotations

import atexit
import collections
import contextlib
import os
import threading

from .. import config

_cond = threading.Condition()
_st = {"queue": collections.deque(), "threads": [], "busy": 0, "quiet": 0, "closed": False}
stats = {"background": 0}         # kernels the threads took from the queue not compiled yet


def _before_fork():
    """No compile thread is inside LLVM (holding llvmlite's lock) when the process forks."""
    with _cond:
        _st["quiet"] += 1
        while _st["busy"]:
            _cond.wait()


def _after_fork_parent():
    with _cond:
        _st["quiet"] -= 1
        _cond.notify_all()


def _after_fork():
    global _cond
    _cond = threading.Condition()
    _st.update(queue=collections.deque(), threads=[], busy=0, quiet=0, closed=False)


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork)


def _cache_of(item):
    """(kernel cache, spec) of a prefetch item: a kernel spec of a registered code generator,
    or a (cache, spec) pair (a node step's kernel: steps.NodeStep.ahead); (None, None) when it
    has no cache that says whether it is compiled."""
    if isinstance(item, tuple):
        return item
    cache = getattr(type(item).codegen.get(type(item)), "compiled", None)
    return cache, item


def prefetch(items) -> int:
    """Queue the kernels of `items` (kernel specs, ir.kernels.KernelSpec, or (kernel cache,
    spec) pairs) that are neither compiled nor in the disk cache; the number queued.  A warm
    process queues nothing: a kernel from disk loads in ~1 ms, and a thread doing it would only
    contend for the GIL."""
    n = config.compile_threads()
    if n <= 0:
        return 0
    todo, seen = [], set()
    for item in items:
        try:
            if item in seen:        # (a program's layers list the same kernels)
                continue
            seen.add(item)
        except TypeError:           # (an unhashable spec: asked as it comes)
            pass
        cache, spec = _cache_of(item)
        ready = getattr(cache, "ready", None)
        if ready is not None and not ready(spec) and not cache.on_disk(spec):
            todo.append((cache, spec))
    if not todo:
        return 0
    with _cond:
        if _st["closed"]:
            return 0
        _st["queue"].extend(todo)
        while len(_st["threads"]) < n:
            t = threading.Thread(target=_work, name=f"lazycandle-compile-{len(_st['threads'])}", daemon=True)
            _st["threads"].append(t)
            if len(_st["threads"]) == 1:
                atexit.register(_close)
            t.start()
        _cond.notify_all()
    return len(todo)


def _work():
    cond = _cond
    while True:
        with cond:
            while not _st["closed"] and (_st["quiet"] or not _st["queue"]):
                cond.wait()
            if _st["closed"]:
                return
            cache, spec = _st["queue"].popleft()
            _st["busy"] += 1
            if not cache.ready(spec):
                stats["background"] += 1
        try:
            cache(spec)              # compiles it, or finds it compiled (or being compiled)
        except Exception:            # noqa: BLE001  the step that runs it compiles it again and raises
            pass
        finally:
            with cond:
                _st["busy"] -= 1
                cond.notify_all()


@contextlib.contextmanager
def quiet():
    """No background compile runs inside the body (it waits for those under way)."""
    with _cond:
        _st["quiet"] += 1
        while _st["busy"]:
            _cond.wait()
    try:
        yield
    finally:
        with _cond:
            _st["quiet"] -= 1
            _cond.notify_all()


def pending() -> int:
    """Kernels queued or compiling on the background threads."""
    with _cond:
        return len(_st["queue"]) + _st["busy"]


def wait_idle() -> None:
    """Return once the background threads have nothing queued or compiling (tests)."""
    with _cond:
        while _st["queue"] or _st["busy"]:
            _cond.wait()


def _close():
    with _cond:
        _st["closed"] = True
        _st["queue"].clear()
        _cond.notify_all()
        while _st["busy"]:
            _cond.wait()
