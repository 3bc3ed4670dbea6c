"""Building blocks of the vector math library: an emission context `V` (type-generic float
arithmetic on a scalar or vector LLVM type, with splat constants, selects, bit casts and
error-free transforms) and the shared exp / log kernels.

Everything is branch-free straight-line IR on `float`, `double`, `<N x float>` or
`<N x double>`; no fast-math flags (explicit `llvm.fma` calls instead), so NaN / Inf / -0
handling survives optimisation.  Constants that differ by precision live in small tables
keyed by `V.key` ("f32" / "f64"); coefficient provenance: bench/fit_vmath.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import llvmlite.ir as ir

from . import jit
from .llvmutil import F32, F64, I8, I16, I32, I64, call_intrinsic, const, intrinsic, scalar_type, vec, width_of


@dataclass(frozen=True)
class Fmt:
    """IEEE binary format facts for one float type."""
    bits: int
    mant: int          # explicit mantissa bits
    bias: int
    ity: ir.Type       # integer type of the same width
    min_normal: float
    max_float: float


FMT = {"f32": Fmt(32, 23, 127, I32, 2.0 ** -126, 3.4028234663852886e38),
       "f64": Fmt(64, 52, 1023, I64, 2.0 ** -1022, 1.7976931348623157e308)}


def key_of(t: ir.Type) -> str:
    s = scalar_type(t)
    if isinstance(s, ir.FloatType):
        return "f32"
    if isinstance(s, ir.DoubleType):
        return "f64"
    raise TypeError(f"vmath: expected float or double (vector) type, got {t}")


class V:
    """Emission context: builder + float type.  Methods build IR and return ir.Values."""

    def __init__(self, b: ir.IRBuilder, t: ir.Type):
        self.b, self.t = b, t
        self.key = key_of(t)
        self.fmt = FMT[self.key]
        self.n = width_of(t)
        self.it = vec(self.fmt.ity, self.n)               # matching integer type
        self.bt = vec(ir.IntType(1), self.n)              # mask type

    def other(self, key: str) -> "V":
        """Context for the other precision with the same lane count (f32 <-> f64)."""
        return V(self.b, vec(F64 if key == "f64" else F32, self.n))

    # -- constants ---------------------------------------------------------------------------
    def c(self, value: float):
        return const(self.t, float(value))

    def ci(self, value: int):
        return const(self.it, int(value))

    # -- arithmetic --------------------------------------------------------------------------
    def add(self, a, b):
        return self.b.fadd(a, b)

    def sub(self, a, b):
        return self.b.fsub(a, b)

    def mul(self, a, b):
        return self.b.fmul(a, b)

    def div(self, a, b):
        return self.b.fdiv(a, b)

    def neg(self, a):
        return self.b.fneg(a)

    def fma(self, a, b, c):
        return call_intrinsic(self.b, "fma", [a, b, c])

    def abs(self, a):
        return call_intrinsic(self.b, "fabs", [a])

    def sqrt(self, a):
        return call_intrinsic(self.b, "sqrt", [a])

    def copysign(self, mag, sgn):
        return call_intrinsic(self.b, "copysign", [mag, sgn])

    def roundeven(self, a):
        return call_intrinsic(self.b, "roundeven", [a])

    def round_fma(self, x, c: float):
        """x * c rounded to the nearest integer (ties even, the product unrounded) for
        |x c| < 2^(mant-1): add and subtract 1.5 * 2^mant (two FMA-port ops, where a
        roundeven costs a multiply plus a two-uop vrndscale)."""
        magic = self.c(1.5 * 2.0 ** self.fmt.mant)
        return self.sub(self.fma(x, self.c(c), magic), magic)

    def poly(self, x, coeffs, tail=None):
        """Horner with fma: coeffs[0] + coeffs[1]*x + ... (+ tail * x^len if given)."""
        acc = tail if tail is not None else self.c(coeffs[-1])
        rest = coeffs if tail is not None else coeffs[:-1]
        for cf in reversed(rest):
            acc = self.fma(acc, x, self.c(cf))
        return acc

    # -- comparisons and selection ------------------------------------------------------------
    def cmp(self, op, a, b):
        """Ordered comparison (false when either side is NaN)."""
        return self.b.fcmp_ordered(op, a, b)

    def isnan(self, a):
        return self.b.fcmp_unordered("uno", a, a)

    def is_subnormal(self, a):
        """a is a nonzero subnormal: one AVX-512 DQ vfpclass where the host has it (LLVM
        lowers llvm.is.fpclass to three integer ops instead), else llvm.is.fpclass."""
        fn = _fpclass(self)
        if fn is not None:
            return fn(a, 0x20)
        return call_intrinsic(self.b, "is.fpclass", [a, I32(0x90)], ret=self.bt)

    def flush_subnormal(self, a):
        """a with subnormal lanes replaced by +0: with the MXCSR's DAZ off, every FP op that
        reads a subnormal takes a ~150-cycle microcode assist, so functions whose result is
        a known constant or a single product there compute on 0 and select at the end."""
        return self.sel(self.is_subnormal(a), self.c(0.0), a)

    def subnormal_times(self, x, c: float, res):
        """res, or x * c where x is subnormal: for f(x) ~ c x near 0 computed on a flushed
        x, the one op that has to read the subnormal."""
        return self.sel(self.is_subnormal(x), x if c == 1 else self.mul(x, self.c(c)), res)

    def sel(self, cond, a, b):
        return self.b.select(cond, a, b)

    def clamp(self, x, lo: float, hi: float):
        """max(lo, min(hi, x)); NaN maps to lo (callers restore NaN at the end)."""
        x = self.sel(self.cmp(">", x, self.c(lo)), x, self.c(lo))
        return self.sel(self.cmp("<", x, self.c(hi)), x, self.c(hi))

    def neg_abs_floor(self, x, m: float):
        """-max(|x|, m) for m > 0 (-m for NaN x): one AVX-512 DQ vrangeps / pd (the larger
        magnitude, sign set) where the host has it, else -|x| and a select."""
        fn = _range(self)
        if fn is None:
            a = self.neg(self.abs(x))
            return self.sel(self.b.fcmp_unordered(">=", a, self.c(-m)), self.c(-m), a)
        return fn(x, self.c(m), 0b1111)

    def abs_floor(self, x, m: float):
        """max(|x|, m) for m > 0 (m for NaN x): one vrangeps / pd (the larger magnitude, sign
        cleared) where the host has it, else |x| and a select."""
        fn = _range(self)
        if fn is None:
            a = self.abs(x)
            return self.sel(self.b.fcmp_unordered("<=", a, self.c(m)), self.c(m), a)
        return fn(x, self.c(m), 0b1011)

    def cap(self, x, hi: float):
        """min(x, hi); NaN maps to hi (callers restore NaN at the end)."""
        return self.sel(self.cmp("<", x, self.c(hi)), x, self.c(hi))

    def clamp_keep_nan(self, x, lo: float, hi: float):
        """min(hi, max(lo, x)) with NaN passing through (vmaxps / vminps operand order)."""
        x = self.sel(self.cmp(">", self.c(lo), x), self.c(lo), x)
        return self.sel(self.cmp("<", self.c(hi), x), self.c(hi), x)

    # -- bits ------------------------------------------------------------------------------
    def bits(self, a):
        return self.b.bitcast(a, self.it)

    def from_bits(self, i):
        return self.b.bitcast(i, self.t)

    def to_int(self, a):
        return self.b.fptosi(a, self.it)

    def to_float(self, i):
        return self.b.sitofp(i, self.t)

    def pow2i(self, k):
        """2**k for an integer vector k inside the normal exponent range."""
        return self.from_bits(self.b.shl(self.b.add(k, self.ci(self.fmt.bias)), self.ci(self.fmt.mant)))

    def ldexp(self, y, k, scalef=True):
        """y * 2^k rounded once (overflow to inf, gradual underflow) for an integer-valued
        float k in the exp reduction's range, where y * 2^(k >> 1) is exact.  One AVX-512
        vscalef where the host has it for this vector width, else two power-of-two factors
        (the same bits: the first product is exact, the second rounds once).  scalef=False:
        always the two factors."""
        fn = _scalef(self) if scalef else None
        if fn is not None:
            return fn(y, k)
        ki = self.to_int(k)
        k1 = self.b.ashr(ki, self.ci(1))
        return self.mul(self.mul(y, self.pow2i(k1)), self.pow2i(self.b.sub(ki, k1)))

    def ldexp_where(self, keep, y, k, other):
        """keep ? y * 2^k : other, with no arithmetic on the lanes not kept (an underflowing
        scale there would take a microcode assist): one masked vscalef on AVX-512 hosts."""
        fn = _scalef(self, masked=True)
        if fn is not None:
            return fn(y, k, other, keep)
        return self.sel(keep, self.ldexp(y, self.sel(keep, k, self.c(0.0))), other)

    # -- error-free transforms ---------------------------------------------------------------
    def two_prod(self, a, b):
        p = self.mul(a, b)
        return p, self.fma(a, b, self.neg(p))

    def two_sum(self, a, b):
        s = self.add(a, b)
        bb = self.sub(s, a)
        e = self.add(self.sub(a, self.sub(s, bb)), self.sub(b, bb))
        return s, e

    def fast_two_sum(self, a, b):
        """|a| >= |b| required."""
        s = self.add(a, b)
        return s, self.sub(b, self.sub(s, a))


def _avx512_width(v: V):
    """v's vector width in bits if AVX-512 instructions exist for it on the host, else None
    (no AVX-512 F, or below 512 bits without VL, or a scalar or odd width)."""
    total = v.n * v.fmt.bits
    if v.n == 1 or total not in (128, 256, 512) or not jit.has_feature("avx512f"):
        return None
    if total < 512 and not jit.has_feature("avx512vl"):
        return None
    return total


def _fpclass(v: V):
    """A builder of AVX-512 DQ's vfpclassps / pd (lanes of a class set, imm8 categories) for
    v's vector type, or None."""
    total = _avx512_width(v)
    if total is None or not jit.has_feature("avx512dq"):
        return None
    name = f"llvm.x86.avx512.fpclass.{'ps' if v.fmt.bits == 32 else 'pd'}.{total}"
    fn = intrinsic(v.b.module, name, v.bt, [v.t, I32])
    return lambda a, imm: v.b.call(fn, [a, I32(imm)])


def _range(v: V):
    """A builder of AVX-512 DQ's vrangeps / pd (a, b, imm8: bits 1:0 pick min / max / min
    |.| / max |.|, bits 3:2 the sign: a's, the pick's, +, -) for v's vector type, or None."""
    total = _avx512_width(v)
    if total is None or not jit.has_feature("avx512dq"):
        return None
    mask_t = I16 if v.n == 16 else I8
    name = f"llvm.x86.avx512.mask.range.{'ps' if v.fmt.bits == 32 else 'pd'}.{total}"
    tail = [I32(4)] if total == 512 else []
    fn = intrinsic(v.b.module, name, v.t, [v.t, v.t, I32, v.t, mask_t] + [I32] * len(tail))
    return lambda a, b, imm: v.b.call(fn, [a, b, I32(imm), ir.Constant(v.t, ir.Undefined),
                                          const(mask_t, -1)] + tail)


def _exp_mant(v: V):
    """Builders of AVX-512's vgetexpps / pd (floor(log2 |a|) as a float) and vgetmantps / pd
    (|a|'s significand in [1, 2)) for v's vector type, or None.  Both read a subnormal
    exactly and without a microcode assist."""
    total = _avx512_width(v)
    if total is None:
        return None
    mask_t, sfx = (I16 if v.n == 16 else I8), f"{'ps' if v.fmt.bits == 32 else 'pd'}.{total}"
    tail = [I32(4)] if total == 512 else []
    getexp = intrinsic(v.b.module, f"llvm.x86.avx512.mask.getexp.{sfx}", v.t,
                       [v.t, v.t, mask_t] + [I32] * len(tail))
    getmant = intrinsic(v.b.module, f"llvm.x86.avx512.mask.getmant.{sfx}", v.t,
                        [v.t, I32, v.t, mask_t] + [I32] * len(tail))
    undef, ones = ir.Constant(v.t, ir.Undefined), const(mask_t, -1)
    return (lambda a: v.b.call(getexp, [a, undef, ones] + tail),
            lambda a: v.b.call(getmant, [a, I32(0b0100), undef, ones] + tail))   # [1, 2), sign +


def table_lookup(v: V, name: str, values: tuple, slot):
    """values[slot] per lane, for a table of 32 floats of v's precision and an integer vector
    slot whose low 5 bits index it (higher bits ignored): one AVX-512 vpermi2ps (the table in
    two registers) at 16 f32 lanes, else one load per lane from a module constant."""
    assert len(values) == 32
    slot = v.b.and_(slot, v.ci(31))
    if v.key == "f32" and v.n == 16 and _avx512_width(v) == 512:
        fn = intrinsic(v.b.module, "llvm.x86.avx512.vpermi2var.ps.512", v.t, [v.t, v.it, v.t])
        lo, hi = (ir.Constant(v.t, [ir.Constant(F32, float(c)) for c in part])
                  for part in (values[:16], values[16:]))
        return v.b.call(fn, [lo, slot, hi])
    g = v.b.module.globals.get(name)
    if g is None:
        aty = ir.ArrayType(scalar_type(v.t), 32)
        g = ir.GlobalVariable(v.b.module, aty, name=name)
        g.initializer = ir.Constant(aty, [float(c) for c in values])
        g.global_constant = True
        g.linkage = "internal"
    return lane_loads(v, g, slot)


def lane_loads(v: V, g, idx):
    """Per-lane load g[idx] from a module constant array (idx: integer vector of v's width)."""
    b = v.b
    if v.n == 1:
        return b.load(b.gep(g, [I32(0), idx], inbounds=True))
    out = ir.Constant(v.t, ir.Undefined)
    for lane in range(v.n):
        i = b.extract_element(idx, I32(lane))
        out = b.insert_element(out, b.load(b.gep(g, [I32(0), i], inbounds=True)), I32(lane))
    return out


def _scalef(v: V, masked: bool = False):
    """A builder of AVX-512's vscalefps / vscalefpd (y * 2^floor(k)) for v's vector type, or
    None: no AVX-512 (F, plus VL below 512 bits) on the host, or a scalar or odd width.
    masked: the builder takes (y, k, passthru, mask) and computes only the mask's lanes."""
    n, bits = v.n, v.fmt.bits
    total = _avx512_width(v)
    if total is None:
        return None
    mask_t = I16 if n == 16 else I8
    name = f"llvm.x86.avx512.mask.scalef.{'ps' if bits == 32 else 'pd'}.{total}"
    args = [v.t, v.t, v.t, mask_t] + ([I32] if total == 512 else [])
    fn = intrinsic(v.b.module, name, v.t, args)
    tail = [const(mask_t, -1)] + ([I32(4)] if total == 512 else [])       # all lanes, current rounding

    def scalef(y, k):
        return v.b.call(fn, [y, k, ir.Constant(v.t, ir.Undefined)] + tail)

    def scalef_masked(y, k, passthru, mask):
        bits = v.b.bitcast(mask, ir.IntType(n))
        m = bits if n == mask_t.width else v.b.zext(bits, mask_t)
        return v.b.call(fn, [y, k, passthru, m] + tail[1:])
    return scalef_masked if masked else scalef


# ---- exp ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _ExpConsts:
    lo: float            # input clamp: k stays where both 2^(k>>1) and 2^(k-(k>>1)) are normal
    hi: float
    ln2_hi: float
    ln2_lo: float
    coeffs: tuple        # c2.. of e^r = 1 + r + c2 r^2 + ... (minimax, rel. error, |r| <= ln2/2)


_EXP = {
    "f32": _ExpConsts(-170.0, 89.0, 0.6931471824645996, -1.904654323148236e-09,
                      (0.4999999403953552, 0.1666652113199234, 0.04166838899254799,
                       0.008368710055947304, 0.001381461275741458)),
    "f64": _ExpConsts(-1400.0, 710.0, 0.6931471805599453, 2.3190468138462996e-17,
                      (0.5000000000000011, 0.16666666666666413, 0.041666666666530267,
                       0.008333333333494336, 0.001388888894359816, 0.0001984126950677123,
                       2.480149313566701e-05, 2.755758627349263e-06, 2.763023411588095e-07,
                       2.5000070209272746e-08)),
}


def exp_reduce(v: V, x, x_lo=None, with_lo=False, keep_nan=False, poly_only=False, in_range=False):
    """e^(x + x_lo) = p 2^k (or (p + p_lo) 2^k with with_lo): (p, [p_lo,] k), k an
    integer-valued float; see exp_parts.  Scale with v.ldexp.  keep_nan: a NaN x stays NaN
    in p and k (only for vscalef, which takes a NaN k; the integer split would not).
    poly_only: x already inside the clamp; returns ((q, r), k), e^r = (q r + 1) r + 1 left
    to the caller (which may mask that last fma).  in_range: the caller knows x is inside
    the clamp (no clamp, and x_lo is always added)."""
    K = _EXP[v.key]
    if poly_only or in_range:
        xc = x
    else:
        xc = v.clamp_keep_nan(x, K.lo, K.hi) if keep_nan else v.clamp(x, K.lo, K.hi)
    k = v.round_fma(xc, 1.4426950408889634)
    r = v.fma(k, v.c(-K.ln2_hi), xc)
    r = v.fma(k, v.c(-K.ln2_lo), r)
    if x_lo is not None:                                  # (meaningless once x is clamped)
        r = v.add(r, x_lo if in_range else v.sel(v.cmp("==", x, xc), x_lo, v.c(0.0)))
    p = v.poly(r, K.coeffs)
    if poly_only:
        return (p, r), k
    q = v.fma(p, r, v.c(1.0))
    p = v.fma(q, r, v.c(1.0))
    if with_lo:
        return p, v.fma(q, r, v.sub(v.c(1.0), p)), k          # 1 - p is exact (Sterbenz)
    return p, k


def scale_pow2(v: V, m, k, zero_k: float):
    """m 2^k for exp_reduce's k, rounded once (gradual underflow), m * 0 (finite m: a zero
    of its sign) where k <= zero_k, which the caller picks so that m 2^k rounds to 0 there: one vscalef masked
    to the other lanes on AVX-512 hosts (an underflowing vscalef takes a microcode assist),
    else exp_parts' two power-of-two factors (a product underflowing to 0 takes none)."""
    fn = _scalef(v, masked=True)
    if fn is not None:
        return fn(m, k, v.mul(m, v.c(0.0)), v.b.fcmp_unordered(">", k, v.c(zero_k)))
    ki = v.to_int(k)
    k1 = v.b.ashr(ki, v.ci(1))
    return v.mul(v.mul(m, v.pow2i(k1)), v.pow2i(v.b.sub(ki, k1)))


def exp_parts(v: V, x, x_lo=None, with_lo=False):
    """e^(x + x_lo) as three factors (p, s1, s2), p in [0.7, 1.42], s1 = 2^(k>>1), s2 = 2^(k-(k>>1)).
    With with_lo, returns (p, p_lo, s1, s2), p + p_lo being e^r to ~0.2 ulp.

    Cody-Waite reduction r = x - k ln2 (ln2 in two pieces, fma), minimax polynomial on
    [-ln2/2, ln2/2].  Multiplying p (times any factor) by s1 then s2 rounds at most once into
    the subnormal range, so underflow is gradual and overflow gives inf.  x is clamped, so NaN
    input gives a finite garbage value: callers restore NaN."""
    *parts, k = exp_reduce(v, x, x_lo, with_lo)
    ki = v.to_int(k)
    k1 = v.b.ashr(ki, v.ci(1))
    return (*parts, v.pow2i(k1), v.pow2i(v.b.sub(ki, k1)))


_EXP_ZERO_K = {"f32": -151.0, "f64": -1076.0}   # k at or below: p 2^k (p < sqrt 2) rounds to 0


def exp(v: V, x, flush: bool = True):
    """e^x.  On AVX-512 hosts p 2^k is one vscalef masked to the lanes whose result does not
    round to 0 (the rest are 0 without computing: softmax rows are full of -inf and very
    negative inputs, and a vscalef whose result underflows takes a microcode assist, exp of
    4M values of -inf: 33 ms against 2.6 ms, Emerald Rapids).  Elsewhere two power-of-two
    factors (below).  The clamp reads a subnormal x without an assist (vmaxps / vminps do
    no arithmetic), and the vminps zeroes it, masked by one vfpclass.

    k is rounded by adding 1.5 * 2^mant + 2 bias, so the low bits of that sum are
    t = k + 2 bias; (t >> 1) << mant and (t - (t >> 1)) << mant are then the bits of
    2^(k >> 1) and 2^(k - (k >> 1)) (the constant's own exponent bits shift out), with no
    float-to-int conversion or bias adds.  The clamp lets NaN through, and NaN times the
    factors stays NaN.  Subnormal x gives exactly 1, so it is flushed to 0 first (no assist);
    flush=False for callers whose x is never subnormal."""
    K, F = _EXP[v.key], v.fmt
    scalef = _scalef(v, masked=True)
    if scalef is not None:
        xc = v.clamp_keep_nan(x, K.lo, K.hi)
        xc = v.sel(v.is_subnormal(x), v.c(0.0), xc) if flush else xc        # a masked vminps
        k = v.round_fma(xc, 1.4426950408889634)
        r = v.fma(k, v.c(-K.ln2_hi), xc)
        r = v.fma(k, v.c(-K.ln2_lo), r)
        p = v.poly(r, K.coeffs)
        p = v.fma(v.fma(p, r, v.c(1.0)), r, v.c(1.0))
        return scalef(p, k, v.c(0.0), v.b.fcmp_unordered(">", k, v.c(_EXP_ZERO_K[v.key])))
    xc = v.clamp_keep_nan(v.flush_subnormal(x) if flush else x, K.lo, K.hi)
    magic = v.c(1.5 * 2.0 ** F.mant + 2 * F.bias)
    t = v.fma(xc, v.c(1.4426950408889634), magic)
    k = v.sub(t, magic)
    r = v.fma(k, v.c(-K.ln2_hi), xc)
    r = v.fma(k, v.c(-K.ln2_lo), r)
    p = v.poly(r, K.coeffs)
    p = v.fma(v.fma(p, r, v.c(1.0)), r, v.c(1.0))
    tb = v.bits(t)
    half = v.b.ashr(tb, v.ci(1))
    s1 = v.from_bits(v.b.shl(half, v.ci(F.mant)))
    s2 = v.from_bits(v.b.shl(v.b.sub(tb, half), v.ci(F.mant)))
    return v.mul(v.mul(p, s1), s2)


_EXPM1_CLAMP = {"f32": (-30.0, 88.0), "f64": (-60.0, 709.0)}


def expm1(v: V, x):
    """e^x - 1 without cancellation near 0: 2^k (p - 1) + (2^k - 1), p - 1 = r + r^2 q(r).
    Single-factor scale, so valid up to x = 88 (f32) / 709 (f64); elu uses it for x < 0."""
    K = _EXP[v.key]
    lo, hi = _EXPM1_CLAMP[v.key]
    xc = v.clamp(x, lo, hi)
    k = v.roundeven(v.mul(xc, v.c(1.4426950408889634)))
    r = v.fma(k, v.c(-K.ln2_hi), xc)
    r = v.fma(k, v.c(-K.ln2_lo), r)
    q = v.mul(v.poly(r, K.coeffs), r)                  # (e^r - 1 - r) / r
    pm1 = v.fma(q, r, r)                              # e^r - 1
    s = v.pow2i(v.to_int(k))
    res = v.fma(s, pm1, v.sub(s, v.c(1.0)))
    res = v.sel(v.cmp("==", x, v.c(0.0)), x, res)     # keeps -0
    res = v.sel(v.cmp(">", x, v.c(hi)), v.c(math.inf), res)
    return v.sel(v.isnan(x), x, res)


# ---- log ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _LogConsts:
    sqrt_half_bits: int
    coeffs: tuple        # Q(z): 2 atanh(s) = 2s + s^3 Q(s^2), |s| <= 0.1716 (minimax)


_LOG = {
    "f32": _LogConsts(0x3F3504F3, (0.6666677594184875, 0.3997754156589508, 0.29871729016304016)),
    "f64": _LogConsts(0x3FE6A09E667F3BCD, (0.6666666666666666, 0.40000000000002256, 0.2857142857010003,
                                           0.22222222519829682, 0.1818178437613034, 0.15386756881535374,
                                           0.13256828941783652, 0.13196218748429792)),   # Q0 = 2/3 fixed
}


def log_reduce(v: V, x):
    """x = 2^e * m with m in [sqrt(1/2), sqrt(2)); returns (e as float, f = m - 1 exactly).
    A subnormal x = b 2^(1 - bias - mant) (b its bits) is replaced by the float b, an exact
    integer conversion, and e corrected: no FP op reads the subnormal (each would take a
    microcode assist).  Meaningless for x <= 0, inf, NaN."""
    F, L = v.fmt, _LOG[v.key]
    em = _exp_mant(v)
    if em is not None:          # the same e and m from vgetexp / vgetmant: 6 ops instead of 9
        getexp, getmant = em
        m = getmant(x)
        top = v.cmp(">=", m, v.from_bits(v.ci(L.sqrt_half_bits + (1 << F.mant))))   # m >= sqrt 2
        e = getexp(x)
        ef = v.sel(top, v.add(e, v.c(1.0)), e)                 # (masked ops)
        return ef, v.sub(v.sel(top, v.mul(m, v.c(0.5)), m), v.c(1.0))
    tiny = v.is_subnormal(x)
    xs = v.sel(tiny, v.to_float(v.bits(x)), x)
    u = v.b.sub(v.bits(xs), v.ci(L.sqrt_half_bits))
    e = v.b.ashr(u, v.ci(F.mant))
    m = v.from_bits(v.b.add(v.b.and_(u, v.ci((1 << F.mant) - 1)), v.ci(L.sqrt_half_bits)))
    ef = v.sub(v.to_float(e), v.sel(tiny, v.c(F.bias + F.mant - 1), v.c(0.0)))
    return ef, v.sub(m, v.c(1.0))


_LOG_FIXUP = 0x03530421   # vfixupimm responses by input class: QNaN -> x, SNaN -> quiet x,
#                           +-0 -> -inf, 1 / positive -> keep, -inf / negative -> NaN, +inf -> +inf


def log_specials(v: V, x, res):
    """log's results for 0 (-inf), negative (NaN), +inf and NaN inputs: one AVX-512 vfixupimm
    where the host has it for this width, else four compare-and-selects."""
    total = _avx512_width(v)
    if total is not None:
        mask_t = I16 if v.n == 16 else I8
        name = f"llvm.x86.avx512.mask.fixupimm.{'ps' if v.fmt.bits == 32 else 'pd'}.{total}"
        tail = [I32(4)] if total == 512 else []
        fn = intrinsic(v.b.module, name, v.t, [v.t, v.t, v.it, I32, mask_t] + [I32] * len(tail))
        table = v.ci(_LOG_FIXUP)
        return v.b.call(fn, [res, x, table, I32(0), const(mask_t, -1)] + tail)
    res = v.sel(v.cmp("==", x, v.c(0.0)), v.c(-math.inf), res)
    res = v.sel(v.cmp("<", x, v.c(0.0)), v.c(math.nan), res)
    res = v.sel(v.cmp("==", x, v.c(math.inf)), x, res)
    return v.sel(v.isnan(x), x, res)


def log(v: V, x):
    """log(x) = e ln2 + log1p(f), log1p(f) = f - (f^2/2 - s (f^2/2 + s^2 Q(s^2))), s = f/(2+f)
    (the atanh form, arranged so that the rounding of s only touches small terms)."""
    L = _LOG[v.key]
    ef, f = log_reduce(v, x)
    s = v.div(f, v.add(v.c(2.0), f))
    z = v.mul(s, s)
    R = v.mul(z, v.poly(z, L.coeffs))
    f2 = v.mul(f, f)                  # f^2 / 2 enters as fma(f2, 0.5, .): halving is exact
    K = _EXP[v.key]
    t = v.fma(s, v.fma(f2, v.c(0.5), R), v.mul(ef, v.c(K.ln2_lo)))
    y = v.sub(f, v.fma(f2, v.c(0.5), v.neg(t)))
    return log_specials(v, x, v.fma(ef, v.c(K.ln2_hi), y))
