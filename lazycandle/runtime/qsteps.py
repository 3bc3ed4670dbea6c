"""Running the quantized-weight kernels (codegen/quantize.py, codegen/qmatmul.py) on the pool:
each call passes its buffers' addresses and run-time sizes in the common kernel ABI and splits
its units (blocks, or output rows of qmatmul) over the threads."""
from __future__ import annotations

import ctypes

import numpy as np

from . import pool
from .buffers import address


def run(fn, arrays, sizes, units: int, cost_per_unit: float, align: int = 1) -> None:
    """fn(bufs, sizes, NULL, lo, hi) over chunks of [0, units); `arrays` are numpy arrays (or
    raw addresses) in the kernel's buffer order, kept alive for the call."""
    if units <= 0:
        return
    addrs = (ctypes.c_void_p * len(arrays))(*[a if isinstance(a, int) else address(a) for a in arrays])
    sz = np.array(list(sizes) or [0], np.int64)
    base, sizes_ptr = ctypes.addressof(addrs), sz.ctypes.data
    pool.parallel_for(lambda a, b: fn(base, sizes_ptr, None, a, b), 0, units,
                      cost_per_item=cost_per_unit, align=align)
