"""The native worker pool: pthreads started once that spin briefly after each section and then
park on a condition variable (the IR is codegen/pool_ir.py, linked once per process on first
use; the spin budget is calibrated here to SPIN_US).  Whole-program modules
(codegen/program.py) call its `lc_pool_run(jobs, njobs, nthreads)` directly; Python calls it
only through `launch` / `parallel` (one kernel), `ensure` (grow the pool), `hush` (spinning
workers park) and `wake` (parked workers spin, ahead of a section).  It is the only pool: work
that is not a plain kernel (BLAS task lists, argsort's per-chunk workspace, the gemm_copy
kernels) runs through the glue functions of codegen/task_ir.py (`tasks`).

Thread rule (SPEC): the caller passes lc.get_num_threads() to every section; the pool only
grows, a smaller setting leaves workers parked.  In a forked child the
workers do not exist: the pool state is reset after fork and workers are started again by
the next `ensure`."""
from __future__ import annotations

import ctypes
import os
import threading
import time

from .. import config

MIN_COST = 65536.0   # below this total cost (rough element-operations) a call stays on the calling thread
SPIN_US = 30.0       # how long an idle worker, or a caller waiting for workers, polls before parking

_lock = threading.Lock()
_state: dict = {}            # "module", the exported functions, "started", "poll_ns"

RUN_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
POLLS_FN = ctypes.CFUNCTYPE(None, ctypes.c_int64)


def _poll_ns(probe, polls: int = 4096) -> float:
    """Nanoseconds of one spin poll (the `pause` latency varies 10x between x86 cores): the
    fastest of a few timed spins, so a descheduled run cannot inflate it."""
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        probe(polls)
        best = min(best, time.perf_counter_ns() - t0)
    return max(best / polls, 0.1)


def _load() -> dict:
    if not _state:
        with _lock:
            if not _state:
                from ..codegen import jit, pool_ir
                cm = jit.link_ir(pool_ir.build(), list(pool_ir.EXPORTS), process=True, optimize=False)
                fns = {n: cm.address(n) for n in pool_ir.EXPORTS}
                ctypes.CFUNCTYPE(None)(fns["lc_pool_init"])()
                _state.update(module=cm, addresses=fns, started=0,
                              poll_ns=_poll_ns(POLLS_FN(fns["lc_pool_spin"])),
                              set_spin=POLLS_FN(fns["lc_pool_set_spin"]),
                              hush=ctypes.CFUNCTYPE(None)(fns["lc_pool_hush"]),
                              wake=ctypes.CFUNCTYPE(None)(fns["lc_pool_wake"]),
                              run=RUN_FN(fns["lc_pool_run"]),
                              start=ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(fns["lc_pool_start"]),
                              ready=ctypes.CFUNCTYPE(ctypes.c_int64)(fns["lc_pool_ready"]),
                              reset=ctypes.CFUNCTYPE(None)(fns["lc_pool_reset"]))
                set_spin_us(SPIN_US)
    return _state


def set_spin_us(us: float) -> None:
    """How long idle workers and a waiting caller poll before they park (0: park at once)."""
    st = _load()
    st["set_spin"](max(0, int(us * 1000.0 / st["poll_ns"])))


def hush() -> None:
    """Workers spinning after a section park now (the next section clears it): call before
    work that wants every core, such as a multi-threaded BLAS call."""
    if _state:
        _state["hush"]()


def wake() -> None:
    """Parked workers wake and spin for a while, as after a section: call ahead of Python work
    that ends in a parallel section, so their wake-up overlaps it.  A no-op before the pool
    has workers, or at one thread."""
    if _state and _state["started"] and config._num_threads > 1:
        _state["wake"]()


def address(name: str) -> int:
    """Address of an exported pool function (for modules that call it)."""
    return _load()["addresses"][name]


def module():
    return _load()["module"]


def ensure(n: int) -> None:
    """Make sure n - 1 workers exist (the calling thread is the n-th)."""
    st = _state if _state else _load()
    if st["started"] + 1 >= n:
        return
    with _lock:
        if st["started"] + 1 < n:
            st["started"] = st["start"](n)


def ready() -> int:
    """Workers started and parked (or working)."""
    return _load()["ready"]()


def thread_arg(memo: dict):
    """The thread count of the next section as a ctypes argument (one per count, kept in
    `memo`), with the workers for it: what a prepared runner passes its native call."""
    n = config._num_threads
    if not _state or _state["started"] + 1 < n:
        ensure(n)
    arg = memo.get(n)
    if arg is None:
        arg = memo[n] = ctypes.c_int64(n)
    return arg


def threads() -> int:
    """The thread count of the next section (SPEC's one setting), with the workers for it."""
    n = config._num_threads
    if not _state or _state["started"] + 1 < n:
        ensure(n)
    return n


def parallel(fn: int, bufs: int, sizes: int, scalars: int, lo: int, hi: int, align: int = 1,
             nthreads: int | None = None, parts: int = 1 << 40) -> None:
    """Run the kernel at address `fn` (codegen/loops.py KERNEL_FN) over [lo, hi), split on
    multiples of `align` into at most `parts` chunks over the workers, and return when every
    chunk is done."""
    n = threads() if nthreads is None else nthreads
    ensure(n)
    job = (ctypes.c_int64 * 8)(fn, bufs or 0, sizes or 0, scalars or 0, lo, hi, align, parts)
    _state["run"](ctypes.addressof(job), 1, n)


def split_threads(n: int, cost_per_item: float = 1.0, min_cost: float | None = None,
                  nthreads: int | None = None) -> int:
    """Threads for n items of `cost_per_item` rough element-operations each: 1 (the calling
    thread, no wake-up) below `min_cost` (default MIN_COST) of work, for fewer than 2 items or
    at one thread; else the setting (or `nthreads`).  A section costs ~10-20 us, far more
    than small work."""
    t = nthreads or config._num_threads
    if t <= 1 or n < 2 or n * cost_per_item < (MIN_COST if min_cost is None else min_cost):
        return 1
    return t


def launch(fn, fn_addr: int, bufs, sizes, scalars, lo: int, hi: int, cost_per_item: float = 1.0,
           align: int = 1, min_cost: float | None = None, nthreads: int | None = None) -> None:
    """Kernel `fn` (a ctypes KERNEL_FN at `fn_addr`) over [lo, hi): called directly when
    `split_threads` says the calling thread, else split over the pool."""
    n = hi - lo
    t = nthreads or config._num_threads
    if t <= 1 or n < 2 or n * cost_per_item < (MIN_COST if min_cost is None else min_cost):  # split_threads, inline
        if n > 0:
            fn(bufs, sizes, scalars, lo, hi)
        return
    parallel(fn_addr, bufs, sizes, scalars, lo, hi, align, t)


def fn_address(fn) -> int:
    """The address of a ctypes function (what a job word holds)."""
    return ctypes.cast(fn, ctypes.c_void_p).value


_tasks: dict = {}


def tasks() -> dict:
    """The glue of codegen/task_ir.py, linked once per process: name -> (ctypes KERNEL_FN,
    address); the BLAS task functions only when runtime/blas.py found a library."""
    if not _tasks:
        with _lock:
            if not _tasks:
                from ..codegen import jit, task_ir
                from ..codegen.loops import KERNEL_FN
                from . import blas
                imports = {}
                if blas.available():
                    imports = {f"lc_cblas_{name}": blas.address(name)
                               for name in ("sgemm", "sgemv", "dgemm", "dgemv")}
                names = task_ir.EXPORTS + (task_ir.EXPORTS_BLAS if imports else ())
                cm = jit.link_ir(task_ir.build(bool(imports)), list(names), imports=imports)
                got = {n: (KERNEL_FN(cm.address(n)), cm.address(n)) for n in names}
                got["module"] = cm
                _tasks.update(got)
    return _tasks


def run_jobs(jobs: int, njobs: int, nthreads: int) -> None:
    """lc_pool_run on a caller-built job list at address `jobs` (pool_ir.JOB_WORDS i64 words
    each), on nthreads threads (their workers made by `ensure`)."""
    (_state if _state else _load())["run"](jobs, njobs, nthreads)


def _after_fork_in_child():
    global _lock
    _lock = threading.Lock()
    if _state:
        _state["reset"]()
        _state["started"] = 0


os.register_at_fork(after_in_child=_after_fork_in_child)
