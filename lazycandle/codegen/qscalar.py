"""Scalar LLVM helpers for the quantizers (codegen/quantize.py, quantize_k.py): f32 arithmetic
without fast-math flags (so results are IEEE-exact and in source order), locals as entry-block
allocas (promoted to registers by mem2reg), GGML's nearest_int and saturating casts."""
from __future__ import annotations

import llvmlite.ir as ir

from . import codecs
from .llvmutil import F16, F32, I8, I16, I32, I64, call_intrinsic, intrinsic
from .loops import counted_loop


class Scalar:
    """Scalar IR helpers: f32 arithmetic without fast-math, locals as entry-block allocas."""

    def __init__(self, b):
        """Moves `b` (at the end of its function's entry block) to a fresh block; the entry
        block keeps only the allocas, and `close()` ends it with a branch to that block."""
        fn = b.block.function
        self.entry, start = b.block, fn.append_basic_block("start")
        self.ab = ir.IRBuilder(self.entry)
        b.position_at_end(start)
        self.b, self.start = b, start

    def close(self):
        self.ab.branch(self.start)

    def local(self, t, count=None):
        return self.ab.alloca(t if count is None else ir.ArrayType(t, count))

    def at(self, arr, i):
        i = I64(i) if isinstance(i, int) else i
        return self.b.gep(arr, [I64(0), i], inbounds=True)

    def get(self, p):
        return self.b.load(p)

    def put(self, p, v):
        self.b.store(v, p)

    def f(self, v):
        return ir.Constant(F32, float(v))

    def fabs(self, v):
        return call_intrinsic(self.b, "fabs", [v])

    def nearest_int(self, v):
        """GGML's nearest_int: the low 23 bits of v + 1.5*2^23, minus 2^22 (i32)."""
        b = self.b
        bits = b.bitcast(b.fadd(v, self.f(12582912.0)), I32)
        return b.sub(b.and_(bits, I32(0x7FFFFF)), I32(0x400000))

    def trunc_i8(self, v):
        """C's (int8_t) cast of a float (saturating: NaN -> 0 instead of undefined)."""
        return self.b.call(sat_i8(self.b.module), [v])

    def loop(self, n, name="i", start=0):
        return counted_loop(self.b, I64(start), I64(n), 1, name)


def sat_i8(m):
    return intrinsic(m, "llvm.fptosi.sat.i8.f32", I8, [F32])


def store(b, base, off, v):
    p = b.gep(base, [off if not isinstance(off, int) else I64(off)], inbounds=True)
    b.store(v, b.bitcast(p, v.type.as_pointer()), align=1)


def store_half(b, base, off, v, nan):
    h = b.bitcast(codecs.encode(b, "half", v), I16)
    store(b, base, off, b.select(nan, I16(0x7E00), h))


def half_back(b, v):
    """The float value of v rounded to f16 (GGML_FP16_TO_FP32(GGML_FP32_TO_FP16(v)))."""
    return b.fpext(b.fptrunc(v, F16), F32)


def scan(s, x, n, nan):
    """Loop over n floats of x: yields (j, v); ORs isnan(v) into the i1 local `nan`."""
    b = s.b
    with s.loop(n, "j") as j:
        v = b.load(b.gep(x, [j], inbounds=True))
        s.put(nan, b.or_(s.get(nan), b.fcmp_unordered("uno", v, v)))
        yield j, v
