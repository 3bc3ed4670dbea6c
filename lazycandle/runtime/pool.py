"""The one thread pool.  Kernels are native functions called through ctypes CFUNCTYPE, which
releases the GIL, so Python threads run them truly in parallel.  `parallel_for` splits an
iteration range into one chunk per thread; the calling thread runs the first chunk itself."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from .. import config

_pool = None
_pool_size = 0
_pool_lock = threading.Lock()


def _executor(workers: int):
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < workers:
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lazycandle")
            _pool_size = workers
            if old is not None:
                old.shutdown(wait=False)
        return _pool


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
    trip costs ~20 us."""
    n = hi - lo
    if n <= 0:
        return
    t = threads or config.get_num_threads()
    if t <= 1 or n * cost_per_item < min_cost or n < 2:
        fn(lo, hi)
        return
    chunks = split(lo, hi, t, align)
    if len(chunks) == 1:
        fn(lo, hi)
        return
    pool = _executor(len(chunks) - 1)
    futures = [pool.submit(fn, a, b) for a, b in chunks[1:]]
    fn(*chunks[0])
    for f in futures:
        f.result()
