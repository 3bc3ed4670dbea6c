"""The in-place write kernel of slice_set_ (buffer donation): copy `count` blocks of `nbytes`
contiguous bytes from src to dst, block i at src + i * src_stride and dst + i * dst_stride.
One dtype-free kernel serves every dtype and dim: writing rows [start, start + n) of dim `d`
of a contiguous tensor is prod(shape[:d]) blocks of n * prod(shape[d+1:]) elements."""
from __future__ import annotations

import llvmlite.ir as ir

from . import jit
from .llvmutil import I8, I64
from .loops import KERNEL_FN, counted_loop, kernel_function, new_module

I8P = I8.as_pointer()

_fn = []


def _module_ir() -> str:
    """copy_blocks(bufs = [dst, src], sizes = [dst_stride, src_stride, nbytes], -, lo, hi):
    blocks lo..hi-1 (the kernel ABI of codegen/loops.py, so the native pool splits it)."""
    mod = new_module("block_copy")
    fn, b = kernel_function(mod, "copy_blocks")
    bufs, sizes, _, lo, hi = fn.args
    dst, src = (b.load(b.gep(bufs, [I64(k)])) for k in range(2))
    dst_stride, src_stride, nbytes = (b.load(b.gep(sizes, [I64(k)])) for k in range(3))
    memcpy = mod.declare_intrinsic("llvm.memcpy", [I8P, I8P, I64])
    with counted_loop(b, lo, hi) as i:
        d = b.gep(dst, [b.mul(i, dst_stride)], inbounds=True)
        s = b.gep(src, [b.mul(i, src_stride)], inbounds=True)
        b.call(memcpy, [d, s, nbytes, ir.Constant(ir.IntType(1), 0)])
    b.ret_void()
    return str(mod)


def copy_blocks_fn():
    """(the compiled kernel as a ctypes KERNEL_FN, its address), compiled once per process and
    cached on disk."""
    if not _fn:
        cm = jit.compile_ir(_module_ir(), export=["copy_blocks"], name="block_copy")
        f = KERNEL_FN(cm.address("copy_blocks"))
        f._cm = cm                      # keep the code alive
        _fn.append((f, cm.address("copy_blocks")))
    return _fn[0]
