"""Buffer allocation with reuse.  Buffers are 1-D numpy arrays (numpy is the storage
container).  Large blocks are recycled: when the last array viewing a block dies, the block goes
back to a size-keyed free list instead of to the OS, so the next realize of the same shapes
writes into memory whose pages are already mapped (a fresh mapping costs a page fault per 4 KiB
on first touch -- often more than the kernel itself).  candle allocates per op; we do not."""
from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

POOL_MIN_BYTES = 1 << 20          # smaller blocks come from malloc directly
POOL_MAX_BYTES = 1 << 30          # never keep more than this idle

_free: dict = {}                  # nbytes -> [raw uint8 arrays]
_idle = [0]
_lock = threading.Lock()
stats = {"reused": 0, "fresh": 0}


def _round(nbytes: int) -> int:
    return (nbytes + 4095) & ~4095


def _release(raw):
    with _lock:
        if _idle[0] + raw.nbytes > POOL_MAX_BYTES:
            return
        _free.setdefault(raw.nbytes, []).append(raw)
        _idle[0] += raw.nbytes


def alloc(n: int, dtype) -> np.ndarray:
    """A 1-D array of n elements of `dtype` (a lazycandle DType); contents undefined."""
    npdt = dtype.numpy
    nbytes = n * npdt.itemsize
    if nbytes < POOL_MIN_BYTES:
        return np.empty(n, dtype=npdt)
    size = _round(nbytes)
    raw = None
    with _lock:
        lst = _free.get(size)
        if lst:
            raw = lst.pop()
            _idle[0] -= size
    if raw is None:
        raw = np.empty(size, dtype=np.uint8)
        stats["fresh"] += 1
    else:
        stats["reused"] += 1
    # The array's owner is a per-lease ctypes view of the block: numpy collapses view chains
    # down to the first non-ndarray owner, so the lease dies exactly when the last view does.
    lease = (ctypes.c_char * nbytes).from_address(raw.ctypes.data)
    lease.block = raw
    weakref.finalize(lease, _release, raw)
    return np.frombuffer(lease, dtype=npdt, count=n)


def trim() -> None:
    """Drop every idle block (returns memory to the OS)."""
    with _lock:
        _free.clear()
        _idle[0] = 0
