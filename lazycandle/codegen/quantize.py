"""LLVM kernels that quantize f32 rows to GGML blocks and dequantize blocks back to f32.

Quantizers reproduce llama.cpp's reference quantizers (`quantize_row_*_ref` in ggml-quants.c,
the code behind `llama-quantize` without an importance matrix) operation for operation, in
IEEE f32 without contraction (ggml-base is built for baseline x86-64: no FMA), so the bytes
match: per-block max search, GGML's rounding (roundf for q8_0, truncating casts of x + 8.5 /
16.5 / 0.5 for q4_0 / q5_0 / q4_1, `nearest_int` = the 1.5*2^23 bit trick for the k-quants) and
the k-quants' scale searches (make_qkx2_quants for q4_k, make_qx_quants with rmse_type 1 for
q6_k), written as scalar code in sequential order.  One deliberate difference: a block holding a
NaN gets a NaN scale (GGML's result there is undefined behaviour), so NaN spreads to every value
of its block and every dot product touching it.

ABI (codegen/loops.py): bufs = [out, in]; units = blocks; [lo, hi) blocks per call."""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ..ir.kernels import KernelSpec
from ..ir.qformats import FORMATS
from . import jit, registry
from .llvmutil import F32, I1, I8, I32, I64, call_intrinsic
from .loops import KERNEL_FN, arg_pointer, counted_loop, kernel_function, new_module, unit_range
from .qblocks import chunk_floats
from .qscalar import Scalar as _Scalar, scan as _scan, store as _store, store_half as _store_half


@dataclass(frozen=True)
class QuantSpec(KernelSpec):
    """Quantize (`to_blocks`) or dequantize f32 values in format `fmt`; units = blocks."""
    fmt: str
    to_blocks: bool

    def extent(self, sizes) -> int:
        return int(sizes[0])

    def cost(self, sizes) -> float:
        f = FORMATS[self.fmt]
        work = 40.0 if self.to_blocks and f.block == 256 else 4.0
        return int(sizes[0]) * f.block * work

    def describe(self) -> str:
        return f"{'quantize to' if self.to_blocks else 'dequantize'} {self.fmt}"


F32P = F32.as_pointer()
I8P = I8.as_pointer()


# ---- q8_0 q4_0 q4_1 q5_0 --------------------------------------------------------------------
def _q8_0(s, x, y, nan):
    b = s.b
    amax = s.local(F32)
    s.put(amax, s.f(0))
    for _, v in _scan(s, x, 32, nan):
        a, cur = s.fabs(v), s.get(amax)
        s.put(amax, b.select(b.fcmp_ordered(">", cur, a), cur, a))       # MAX(amax, |v|)
    d = b.fdiv(s.get(amax), s.f(127))
    idv = b.select(b.fcmp_unordered("!=", d, s.f(0)), b.fdiv(s.f(1), d), s.f(0))
    _store_half(b, y, 0, d, s.get(nan))
    with s.loop(32, "q") as j:
        v = b.fmul(b.load(b.gep(x, [j], inbounds=True)), idv)
        _store(b, y, b.add(j, I64(2)), s.trunc_i8(call_intrinsic(b, "round", [v])))


def _signed_max(s, x, n, nan):
    """(amax, max): the first value of largest magnitude (GGML's `if (amax < fabsf(v))`)."""
    b = s.b
    amax, mx = s.local(F32), s.local(F32)
    s.put(amax, s.f(0))
    s.put(mx, s.f(0))
    for _, v in _scan(s, x, n, nan):
        a = s.fabs(v)
        with b.if_then(b.fcmp_ordered("<", s.get(amax), a)):
            s.put(amax, a)
            s.put(mx, v)
    return s.get(amax), s.get(mx)


def _nibble_pairs(s, x, y, qs_off, code, qh=None):
    """qs[j] = code(x[j]) | code(x[j+16]) << 4; with qh (an i32 local) bit 4 of each code goes
    to bit j (and j + 16) of qh."""
    b = s.b
    with s.loop(16, "q") as j:
        c0 = code(b.load(b.gep(x, [j], inbounds=True)))
        c1 = code(b.load(b.gep(x, [b.add(j, I64(16))], inbounds=True)))
        byte = b.or_(b.and_(c0, I8(0xF)), b.shl(b.and_(c1, I8(0xF)), I8(4)))
        _store(b, y, b.add(j, I64(qs_off)), byte)
        if qh is not None:
            j32 = b.trunc(j, I32)
            h0 = b.shl(b.lshr(b.zext(b.and_(c0, I8(0x10)), I32), I32(4)), j32)
            h1 = b.shl(b.lshr(b.zext(b.and_(c1, I8(0x10)), I32), I32(4)), b.add(j32, I32(16)))
            s.put(qh, b.or_(s.get(qh), b.or_(h0, h1)))


def _q4_0_q5_0(bits):
    def body(s, x, y, nan):
        b = s.b
        _, mx = _signed_max(s, x, 32, nan)
        half = 1 << (bits - 1)
        d = b.fdiv(mx, s.f(-half))
        idv = b.select(b.fcmp_unordered("!=", d, s.f(0)), b.fdiv(s.f(1), d), s.f(0))
        _store_half(b, y, 0, d, s.get(nan))

        def code(v):
            q = s.trunc_i8(b.fadd(b.fmul(v, idv), s.f(half + 0.5)))
            top = I8((1 << bits) - 1)
            return b.select(b.icmp_signed("<", q, top), q, top)
        if bits == 4:
            _nibble_pairs(s, x, y, 2, code)
        else:
            qh = s.local(I32)
            s.put(qh, I32(0))
            _nibble_pairs(s, x, y, 6, code, qh)
            _store(b, y, 2, s.get(qh))
    return body


def _q4_1(s, x, y, nan):
    b = s.b
    mn, mx = s.local(F32), s.local(F32)
    s.put(mn, s.f(3.4028234663852886e38))
    s.put(mx, s.f(-3.4028234663852886e38))
    for _, v in _scan(s, x, 32, nan):
        with b.if_then(b.fcmp_ordered("<", v, s.get(mn))):
            s.put(mn, v)
        with b.if_then(b.fcmp_ordered(">", v, s.get(mx))):
            s.put(mx, v)
    lo = s.get(mn)
    d = b.fdiv(b.fsub(s.get(mx), lo), s.f(15))
    idv = b.select(b.fcmp_unordered("!=", d, s.f(0)), b.fdiv(s.f(1), d), s.f(0))
    _store_half(b, y, 0, d, s.get(nan))
    _store_half(b, y, 2, lo, s.get(nan))

    def code(v):
        q = s.trunc_i8(b.fadd(b.fmul(b.fsub(v, lo), idv), s.f(0.5)))
        return b.select(b.icmp_signed("<", q, I8(15)), q, I8(15))
    _nibble_pairs(s, x, y, 4, code)


from .quantize_k import q4_k as _q4_k, q6_k as _q6_k   # noqa: E402  (the k-quants' searches)

_QUANTIZERS = {"q8_0": _q8_0, "q4_0": _q4_0_q5_0(4), "q5_0": _q4_0_q5_0(5), "q4_1": _q4_1,
               "q4_k": _q4_k, "q6_k": _q6_k}


def build(spec: QuantSpec, name: str = "quantize") -> str:
    f = FORMATS[spec.fmt]
    m = new_module(name)
    fn, b = kernel_function(m, name)
    lo, hi = unit_range(fn)
    ptrs = fn.args[0]
    if spec.to_blocks:
        s = _Scalar(b)
        out, src = arg_pointer(b, ptrs, 0, I8, "y"), arg_pointer(b, ptrs, 1, F32, "x")
        nan = s.local(I1)
        with counted_loop(b, lo, hi, 1, "blk") as blk:
            s.put(nan, ir.Constant(I1, 0))
            x = b.gep(src, [b.mul(blk, I64(f.block))], inbounds=True)
            y = b.gep(out, [b.mul(blk, I64(f.nbytes))], inbounds=True)
            _QUANTIZERS[spec.fmt](s, x, y, nan)
        b.ret_void()
        s.close()
        return str(m)
    else:
        out, src = arg_pointer(b, ptrs, 0, F32, "y"), arg_pointer(b, ptrs, 1, I8, "q")
        v8p = ir.VectorType(F32, 8).as_pointer()
        with counted_loop(b, lo, hi, 1, "blk") as blk:
            q = b.gep(src, [b.mul(blk, I64(f.nbytes))], inbounds=True)
            y = b.gep(out, [b.mul(blk, I64(f.block))], inbounds=True)
            for c in range(f.chunks):
                for k, part in enumerate(chunk_floats(b, spec.fmt, q, c)):
                    p = b.gep(y, [I64(32 * c + 8 * k)], inbounds=True)
                    b.store(part, b.bitcast(p, v8p), align=4)
    b.ret_void()
    return str(m)


def _build(spec):
    return build(spec, "quantize" if spec.to_blocks else "dequantize"), \
        "quantize" if spec.to_blocks else "dequantize"


_kernels = jit.KernelCache(_build, KERNEL_FN)
registry.register(QuantSpec, lambda spec: _build(spec)[0], _kernels)


def kernel(fmt: str, to_blocks: bool):
    """(spec, compiled ctypes function) of the (de)quantizer of `fmt`."""
    spec = QuantSpec(fmt, bool(to_blocks))
    return spec, _kernels(spec)
