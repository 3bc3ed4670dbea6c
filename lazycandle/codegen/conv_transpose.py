"""The col2im kernel of conv_transpose1d / conv_transpose2d (and of the conv VJP): the adjoint
of im2col.  Columns (b, c, kh, kw, ih, iw) -- the GEMM `kernel^T @ input` -- are summed into the
image (b, c, oh, ow) at

    out[y, x] = sum of cols[ki, kj, iy, ix] over iy*sh + ki*dh - ph = y, ix*sw + kj*dw - pw = x.

The sum is gathered per output element (never scattered), so every element is written once by
one unit, in a fixed order whatever the thread count, and accumulated in the compute type
(f32 for f16 / bf16 / f8, wrapping for integers) then rounded once.  A unit is one output row
(bi, ci, y); the kernel rows that reach it are found per row, the kernel columns per element.
Sizes and the columns' strides other than 0 / 1 are read from the kernel's `sizes` argument
(codegen/sizes_arg.py), so one kernel serves every size of its shape class; the operand
offset is folded into the pointer at run time.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from .. import dtype as D
from ..ir.kernels import KernelSpec
from . import codecs, jit, registry
from . import sizes_arg as SA
from .llvmutil import I64, ltype
from .loops import KERNEL_FN, arg_pointer, counted_loop, kernel_function, new_module, unit_range


@dataclass(frozen=True)
class Col2imSpec(KernelSpec):
    """Shape class of a col2im kernel: dtype, the window (kernel, padding, stride, dilation:
    the op's arguments) and the stride classes of the columns (b, c, kh, kw, ih, iw).  Sizes
    (`col2im_kernel`): b, c, ih, iw, oh, ow, then the columns' RUNTIME strides."""
    dtype: str
    kh: int
    kw: int
    ph: int
    pw: int
    sh: int
    sw: int
    dh: int
    dw: int
    cs: tuple          # stride classes of the columns (b, c, kh, kw, ih, iw)

    def extent(self, sizes) -> int:
        return sizes[0] * sizes[1] * sizes[4]

    def unit_cost(self, sizes) -> float:
        return float(sizes[5] * self.kh * self.kw)

    def cost(self, sizes) -> float:
        return self.extent(sizes) * self.unit_cost(sizes)

    def describe(self) -> str:
        return f"col2im {self.dtype}, kernel {self.kh}x{self.kw}"


def col2im_kernel(dtype, shape, strides, window):
    """(Col2imSpec, sizes) of summing columns (shape, strides: b, c, kh, kw, ih, iw) into an
    (oh, ow) image; window = (oh, ow, kh, kw, ph, pw, sh, sw, dh, dw) (the op's argument)."""
    oh, ow, kh, kw, ph, pw, sh, sw, dh, dw = window
    b, c, _, _, ih, iw = shape
    spec = Col2imSpec(dtype.name, kh, kw, ph, pw, sh, sw, dh, dw, SA.classes(strides))
    return spec, (b, c, ih, iw, oh, ow) + SA.runtime_values(strides)


def _tap(b, pos, k, pad, stride, dil, n):
    """(in range, source index) of output position `pos` under kernel tap `k`:
    src * stride + k * dil - pad = pos with 0 <= src < n (n: an i64 value)."""
    t = b.sub(b.add(pos, I64(pad)), b.mul(k, I64(dil)))
    ok = b.and_(b.icmp_signed(">=", t, I64(0)), b.icmp_signed("<", t, b.mul(n, I64(stride))))
    if stride == 1:
        return ok, t
    # t may be negative here: the remainder test is only trusted together with `ok`
    ok = b.and_(ok, b.icmp_signed("==", b.srem(t, I64(stride)), I64(0)))
    return ok, b.sdiv(t, I64(stride))


def build_col2im(spec: Col2imSpec, name: str = "col2im") -> str:
    dt = D.DType.from_name(spec.dtype)
    st = ltype(dt.storage)
    ct = ltype(dt.compute)
    al = dt.size_in_bytes
    zero = ir.Constant(ct, 0 if dt.is_int else 0.0)
    m = new_module(name)
    fn, b = kernel_function(m, name)
    out = arg_pointer(b, fn.args[0], 0, st, "out")
    cols = arg_pointer(b, fn.args[0], 1, st, "cols")
    sz = SA.SizesReader(b, fn)
    _, c, ih, iw, oh, ow = sz.many(6)
    sb, sc, ski, skj, siy, six = sz.strides(spec.cs)
    lo, hi = unit_range(fn)
    acc_slot = b.alloca(ct, name="acc")
    with counted_loop(b, lo, hi, 1, "u") as u:
        bi, ci, y = SA.unravel(b, u, (None, c, oh))
        base = SA.dot(b, (bi, ci), (sb, sc))
        o_row = b.mul(u, ow)
        with counted_loop(b, I64(0), ow, 1, "x") as x:
            b.store(zero, acc_slot)
            with counted_loop(b, I64(0), I64(spec.kh), 1, "ki") as ki:
                ok_y, iy = _tap(b, y, ki, spec.ph, spec.sh, spec.dh, ih)
                with b.if_then(ok_y):
                    row = b.add(base, SA.dot(b, (ki, iy), (ski, siy)))
                    with counted_loop(b, I64(0), I64(spec.kw), 1, "kj") as kj:
                        ok_x, ix = _tap(b, x, kj, spec.pw, spec.sw, spec.dw, iw)
                        with b.if_then(ok_x):
                            off = b.add(row, SA.dot(b, (kj, ix), (skj, six)))
                            v = b.load(b.gep(cols, [off], inbounds=True), align=al)
                            if dt.codec:
                                v = codecs.decode(b, dt.codec, v, ct)
                            acc = b.load(acc_slot)
                            b.store(b.add(acc, v) if dt.is_int else b.fadd(acc, v), acc_slot)
            res = b.load(acc_slot)
            if dt.codec:
                res = codecs.encode(b, dt.codec, res)
            b.store(res, b.gep(out, [b.add(o_row, x)], inbounds=True), align=al)
    b.ret_void()
    return str(m)


def _build(spec):
    return build_col2im(spec), "col2im"


_kernels = jit.KernelCache(_build, KERNEL_FN)


def get_kernel(spec: Col2imSpec):
    """(CompiledModule, ctypes function) for a spec, compiled once per shape class (the one
    kernel cache of jit.py)."""
    fn = _kernels(spec)
    return fn._module, fn


registry.register(Col2imSpec, lambda spec: _build(spec)[0], _kernels)
