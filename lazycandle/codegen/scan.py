"""LLVM kernel of cumsum: an inclusive scan along one dim (the kernel ABI of codegen/loops.py,
over lines; bufs = [out, input]; sizes and non-unit strides are run-time values,
codegen/sizes_arg.py).  A unit is one line (a position of every other dim); consecutive units
are neighbouring positions of the last other dim, so a scan over a leading dim still walks
memory that neighbouring units share.

The running sum lives in the accumulator type of the dtype: integers wrap in their own width
(like `np.cumsum(x, dtype=x.dtype)`); f16 / bf16 / f8e4m3 accumulate in f32 and round each
output once (exactly `np.cumsum(x.astype(f32)).astype(dt)`, SPEC's compute-in-f32 rule); f32
accumulates in f64 and rounds each output once (no error growth along long lines); f64 in f64.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from .. import dtype as D
from ..layout import merge_dims
from . import codecs, jit, registry, sizes_arg as SA
from .llvmutil import F32, F64, I64, ltype
from .loops import KERNEL_FN, new_module, kernel_function, arg_pointer, counted_loop, unit_range
from ..ir.kernels import KernelSpec



@dataclass(frozen=True)
class ScanSpec(SA.OuterRows, KernelSpec):
    """Shape class of one cumsum kernel (also its cache key): dtype, the number of line dims
    (the other dims, merged) and the stride classes of input and output over (line dims, the
    scanned dim).  Sizes (`scan_kernel`): the line dims' sizes, the line length n, then the
    RUNTIME strides of input and output."""
    dtype: str
    rank: int
    src: tuple
    dst: tuple

    def describe(self) -> str:
        return f"cumsum of {self.dtype} lines over {self.rank} merged dims"


def scan_kernel(dtype: D.DType, shape, dim, in_strides, out_strides):
    """(ScanSpec, sizes) of cumsum along `dim` of `shape`, read and written with those strides."""
    keep = [d for d in range(len(shape)) if d != dim]
    lines, (ls, lo) = merge_dims(tuple(shape[d] for d in keep),
                                 [tuple(in_strides[d] for d in keep), tuple(out_strides[d] for d in keep)])
    src, dst = tuple(ls) + (in_strides[dim],), tuple(lo) + (out_strides[dim],)
    spec = ScanSpec(dtype.name, len(lines), SA.classes(src), SA.classes(dst))
    return spec, tuple(lines) + (shape[dim],) + SA.runtime_values(src) + SA.runtime_values(dst)


def _accumulator(dt: D.DType):
    if dt.is_int:
        return ltype(dt.storage)
    return F64 if dt.name in ("f32", "f64") else F32


def build_scan(spec: ScanSpec, name: str = "cumsum") -> str:
    dt = D.DType.from_name(spec.dtype)
    st, acc_t = ltype(dt.storage), _accumulator(dt)
    m = new_module(name)
    fn, b = kernel_function(m, name)
    ptrs, (lo, hi) = fn.args[0], unit_range(fn)
    out = arg_pointer(b, ptrs, 0, st, "out")
    src = arg_pointer(b, ptrs, 1, st, "src")
    al = dt.size_in_bytes
    sz = SA.SizesReader(b, fn)
    lines, n = sz.many(spec.rank, "lines"), sz.next("n")
    src_st, dst_st = sz.strides(spec.src), sz.strides(spec.dst)
    in_step, out_step = src_st[-1], dst_st[-1]
    with counted_loop(b, lo, hi, 1, "line") as r:
        idx = SA.unravel(b, r, lines)
        in_base, out_base = SA.dot(b, idx, src_st[:-1]), SA.dot(b, idx, dst_st[:-1])
        pre = b.block
        head = b.append_basic_block("scan.head")
        body = b.append_basic_block("scan.body")
        done = b.append_basic_block("scan.done")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, "i")
        acc = b.phi(acc_t, "acc")
        i.add_incoming(I64(0), pre)
        acc.add_incoming(ir.Constant(acc_t, 0 if dt.is_int else -0.0), pre)   # -0: x + -0 is x, -0 included
        b.cbranch(b.icmp_signed("<", i, n), body, done)
        b.position_at_end(body)
        x = b.load(b.gep(src, [b.add(in_base, SA.scaled(b, i, in_step))], inbounds=True), align=al)
        if dt.is_int:
            nxt = b.add(acc, x)
            y = nxt
        else:
            v = codecs.decode(b, dt.codec, x) if dt.codec else x
            if v.type != acc_t:
                v = b.fpext(v, acc_t)
            nxt = b.fadd(acc, v)
            if dt.codec:
                y = codecs.encode(b, dt.codec, nxt)
            else:
                y = b.fptrunc(nxt, st) if st != acc_t else nxt
        b.store(y, b.gep(out, [b.add(out_base, SA.scaled(b, i, out_step))], inbounds=True), align=al)
        i.add_incoming(b.add(i, I64(1), flags=("nsw",)), b.block)
        acc.add_incoming(nxt, b.block)
        b.branch(head)
        b.position_at_end(done)
    b.ret_void()
    return str(m)


_kernels = jit.KernelCache(lambda spec: (build_scan(spec), "cumsum"), KERNEL_FN)


def get_kernel(spec: ScanSpec):
    """(CompiledModule, ctypes function) for a spec, from the one kernel cache of jit.py."""
    fn = _kernels(spec)
    return fn._module, fn
registry.register(ScanSpec, build_scan, _kernels)
