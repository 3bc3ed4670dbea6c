"""Progress of a long compile.  Once a streak of kernel compiles (compiles less than GAP
seconds apart) has run for DELAY seconds, a line on stderr says what is compiling, at most
once per DELAY; a streak that printed ends with a line of its total.  A daemon thread, started
by the first compile of the process (never in a process whose kernels all come from the disk
cache), does the printing, so the line appears while one long LLVM call runs (llvmlite's calls
into LLVM release the GIL); a streak still open at exit prints its total then.  LAZYCANDLE_PROGRESS=0 silences it.
Kernels may compile on several threads at once (codegen/jit.prefetch): each thread's nesting
counts as its outermost kernel, and the streak is busy while any thread compiles.
`busy_seconds()` is the process's wall time with at least one compile running (the "compile
share" bench/first_run.py reports), kept whether or not the line is on."""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time

DELAY = 1.0     # seconds of compiling before the first line, and between lines
GAP = 0.5       # compiles closer than this belong to one streak

_cond = threading.Condition()
_st = {"depth": 0, "what": None, "start": None, "last_end": 0.0, "count": 0, "printed": 0.0,
       "lines": 0, "thread": None, "busy": 0.0, "busy_from": None}
_tls = threading.local()         # .depth: this thread's nesting of compiling()


def _after_fork():
    """A forked child has no watcher thread, and the condition's lock may be held."""
    global _cond
    global _tls
    _cond = threading.Condition()
    _tls = threading.local()
    _st.update(depth=0, what=None, start=None, lines=0, thread=None, busy_from=None)


os.register_at_fork(after_in_child=_after_fork)


def enabled() -> bool:
    return os.environ.get("LAZYCANDLE_PROGRESS", "1").strip().lower() not in ("0", "off", "false", "no")


@contextlib.contextmanager
def compiling(what: str):
    """Mark the body as compiling the kernel `what` (nesting on one thread counts as the
    outermost one; `depth` counts the threads compiling)."""
    outer = getattr(_tls, "depth", 0) == 0
    _tls.depth = getattr(_tls, "depth", 0) + 1
    cond = _cond
    if outer:
        _enter(cond, what)
    try:
        yield
    finally:
        _tls.depth -= 1
        if outer:
            with cond:
                _st["depth"] -= 1
                if _st["depth"] == 0:
                    now = time.monotonic()
                    _st["busy"] += now - _st["busy_from"]
                    _st.update(last_end=now, what=None, busy_from=None)
                    cond.notify()


def _enter(cond, what: str) -> None:
    """A thread starts compiling `what`: count it, open a streak (and the busy clock) when no
    other thread compiles, start the watcher thread on the first compile of the process."""
    with cond:
        now = time.monotonic()
        if _st["depth"] == 0:
            _st["busy_from"] = now
            if _st["start"] is None or now - _st["last_end"] > GAP:
                _st.update(start=now, count=0, printed=now, lines=0)
        _st["what"] = what
        _st["count"] += 1
        _st["depth"] += 1
        if _st["thread"] is None and enabled():
            _st["thread"] = threading.Thread(target=_watch, args=(cond,), name="lazycandle-progress",
                                             daemon=True)
            _st["thread"].start()
            atexit.register(_at_exit)
        cond.notify()


def busy_seconds() -> float:
    """Wall seconds of this process with at least one kernel compiling (so far)."""
    with _cond:
        busy_from = _st["busy_from"]
        return _st["busy"] + (time.monotonic() - busy_from if busy_from is not None else 0.0)


def _at_exit():
    """The total of a streak that printed and ended less than GAP before the process did."""
    with _cond:
        line = _next_line(time.monotonic() + GAP)[0] if _st["depth"] == 0 else None
    if line:
        _print(line)


def _print(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError, AttributeError):       # stderr closed or gone
        pass


def _watch(cond):
    while cond is _cond:
        with cond:
            line, wait = _next_line(time.monotonic())
            if line is None:
                cond.wait(wait)
                continue
        _print(line)


def _next_line(now: float):
    """(line to print now or None, seconds to wait before looking again or None for a notify)."""
    st = _st
    if st["depth"] == 0:
        if st["start"] is None:
            return None, None
        idle = now - st["last_end"]
        if idle < GAP:
            return None, GAP - idle
        line = (f"lazycandle: compiled {st['count']} kernel{'s' if st['count'] != 1 else ''} in "
                f"{st['last_end'] - st['start']:.1f} s" if st["lines"] else None)
        st.update(start=None, lines=0)
        return line, None
    due = st["printed"] + DELAY
    if now < due:
        return None, due - now
    st["printed"], st["lines"] = now, st["lines"] + 1
    return f"lazycandle: compiling {st['what']} (kernel {st['count']}, {now - st['start']:.1f} s so far)", None
