"""The in-place write kernel of slice_set_ (buffer donation): copy `count` blocks of `nbytes`
contiguous bytes from src to dst, block i at src + i * src_stride and dst + i * dst_stride.
One dtype-free kernel serves every dtype and dim: writing rows [start, start + n) of dim `d`
of a contiguous tensor is prod(shape[:d]) blocks of n * prod(shape[d+1:]) elements."""
from __future__ import annotations

import ctypes

import llvmlite.ir as ir

from . import jit
from .llvmutil import I64, VOID

I8P = ir.IntType(8).as_pointer()
SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
_fn = []


def _module_ir() -> str:
    """copy_blocks(dst, src, dst_stride, src_stride, nbytes, lo, hi): blocks lo..hi-1."""
    mod = ir.Module(name="block_copy")
    fn = ir.Function(mod, ir.FunctionType(VOID, [I8P, I8P, I64, I64, I64, I64, I64]), name="copy_blocks")
    dst, src, dst_stride, src_stride, nbytes, lo, hi = fn.args
    memcpy = mod.declare_intrinsic("llvm.memcpy", [I8P, I8P, I64])
    entry, body, done = fn.append_basic_block("entry"), fn.append_basic_block("body"), fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed("<", lo, hi), body, done)
    b.position_at_end(body)
    i = b.phi(I64)
    i.add_incoming(lo, entry)
    d = b.gep(dst, [b.mul(i, dst_stride)], inbounds=True)
    s = b.gep(src, [b.mul(i, src_stride)], inbounds=True)
    b.call(memcpy, [d, s, nbytes, ir.Constant(ir.IntType(1), 0)])
    nxt = b.add(i, ir.Constant(I64, 1))
    i.add_incoming(nxt, body)
    b.cbranch(b.icmp_signed("<", nxt, hi), body, done)
    b.position_at_end(done)
    b.ret_void()
    return str(mod)


def copy_blocks_fn():
    """The compiled kernel as a ctypes function (compiled once per process, cached on disk)."""
    if not _fn:
        cm = jit.compile_ir(_module_ir(), export=["copy_blocks"], name="block_copy")
        f = SIGNATURE(cm.address("copy_blocks"))
        f._cm = cm                      # keep the code alive
        _fn.append(f)
    return _fn[0]
