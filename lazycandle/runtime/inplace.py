"""Writing new rows into a donated buffer (slice_set_): the block-copy kernel
(codegen/block_copy.py) run over the thread pool, split by blocks."""
from __future__ import annotations

from . import pool
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
    fn = copy_blocks_fn()
    d0 = address(dst) + start * inner
    s0 = address(src)
    dst_stride, src_stride = shape[dim] * inner, nbytes
    pool.parallel_for(lambda a, b: fn(d0, s0, dst_stride, src_stride, nbytes, a, b), 0, outer,
                      cost_per_item=nbytes / 4)
