"""Writing new rows into a donated buffer (slice_set_): the block-copy kernel
(codegen/block_copy.py) run over the native pool, split by blocks."""
from __future__ import annotations

import ctypes

from . import native_pool
from .buffers import address


def write_rows(dst, src, shape, dim: int, start: int, n: int) -> None:
    """Rows [start, start + n) along `dim` of the contiguous `shape` held in 1-D buffer dst
    take the contiguous 1-D buffer src (shape with n along dim).  Bounds are the caller's."""
    from ..codegen.block_copy import copy_blocks_fn
    item = dst.itemsize
    inner = item
    for s in shape[dim + 1:]:
        inner *= s
    outer = 1
    for s in shape[:dim]:
        outer *= s
    nbytes = n * inner
    if nbytes == 0 or outer == 0:
        return
    fn, fn_addr = copy_blocks_fn()
    words = (ctypes.c_int64 * 5)(address(dst) + start * inner, address(src), shape[dim] * inner, nbytes, nbytes)
    at = ctypes.addressof(words)            # pointers [dst, src], then sizes [strides, nbytes]
    native_pool.launch(fn, fn_addr, at, at + 16, None, 0, outer, nbytes / 4)
