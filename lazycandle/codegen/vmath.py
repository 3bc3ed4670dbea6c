"""Vector math library emitted as LLVM IR (issue 3).

LLVM turns `llvm.exp.v8f32` & co. into one libm call per lane and llvmlite cannot switch on a
vector library, so the elementwise code generator inlines these polynomial implementations
instead.  Public API:

    emit(b, name, x, *params) -> ir.Value     # result has x's type
    FUNCS: name -> builder(b, x, *params)

`x` is float, double, <N x float> or <N x double> (N = 1 included).  `elu` takes alpha and
`powf` the exponent e: Python floats (emitted as constants of x's precision, as NumPy treats a
Python scalar) or run-time values of x's type (elu: an ir.Value; powf: a RuntimeExponent, the
value plus the class of exponent the code is built for).  Semantics and special values follow NumPy on the same dtype; accuracy is
measured by bench/vmath_accuracy.py.  Modules: vmath_core (context, exp, log), vmath_trig
(sin, cos), vmath_erf (erf, gelu_erf), vmath_pow (powf).
"""
from __future__ import annotations

import math
from fractions import Fraction

import llvmlite.ir as ir
import numpy as np

from . import vmath_core as core
from .vmath_core import V
from .vmath_erf import erf, gelu_erf
from .vmath_pow import RuntimeExponent, powf
from .vmath_trig import cos, sin


def _dd(v: V, exact: Fraction):
    """A real constant as hi + lo in v's precision."""
    hi = float(exact) if v.key == "f64" else float(np.float32(float(exact)))
    return v.c(hi), v.c(float(exact - Fraction(hi)))


# ---- tanh -------------------------------------------------------------------------------------
_TANH = {   # odd minimax x + x^3 P(x^2) on [0, 0.625]; above: 1 - 2t/(1+t), t = e^(-2|x|)
    "f32": (0.625, (-0.3333328068256378, 0.13331441581249237, -0.05373971536755562,
                    0.0206390880048275, -0.005704987328499556)),
    "f64": (0.625, (-0.33333333333332854, 0.1333333333326209, -0.053968253931267696,
                    0.02186948757609444, -0.008863221002627817, 0.003591989173785757,
                    -0.001454958877801291, 0.0005863165396259108, -0.0002285642095018589,
                    7.71443646371515e-05, -1.6072568624236247e-05)),
}


_TANH_SAT = {"f32": 10.0, "f64": 20.0}      # |x| cap for e^-2|x|: tanh rounds to 1 above


def _exp_minus_2a(v: V, a):
    """e^(-2a) for 0 <= a <= _TANH_SAT (NaN passes): -2a = k ln2 + r with r = -2 (a + k ln2/2),
    the polynomial taking a + k ln2/2 directly (its coefficients scaled by (-2)^i), and 2^k
    (k >= -58) one vscalef or two power-of-two factors: no clamp below, no underflow."""
    K = core._EXP[v.key]
    ac = v.sel(v.cmp(">", a, v.c(_TANH_SAT[v.key])), v.c(_TANH_SAT[v.key]), a)
    k = v.round_fma(ac, -2.0 * 1.4426950408889634)
    h = v.fma(k, v.c(K.ln2_hi / 2), ac)
    h = v.fma(k, v.c(K.ln2_lo / 2), h)
    q = v.poly(h, [c * (-2.0) ** (i + 2) for i, c in enumerate(K.coeffs)])
    return v.ldexp(v.fma(v.fma(q, h, v.c(-2.0)), h, v.c(1.0)), k)


def tanh(v: V, x):
    """tanh(x) = sign(x) (|x| + |x|^3 P(x^2)) below 0.625, else sign(x) (1 - t)/(1 + t),
    t = e^-2|x| (f64; f32: _tanh_f32).  |x| below the smallest normal (tanh(x) = x there) is
    computed at that normal and x is selected back, so no op reads a subnormal (a microcode
    assist each); NaN passes."""
    if v.key == "f32":
        return _tanh_f32(v, x)
    cut, P = _TANH[v.key]
    ax = v.abs(x)
    tiny = v.cmp("<", ax, v.c(v.fmt.min_normal))
    a = v.sel(tiny, v.c(v.fmt.min_normal), ax)
    z = v.mul(a, a)
    small = v.fma(v.mul(a, z), v.poly(z, P), a)
    t = _exp_minus_2a(v, a)
    big = v.div(v.sub(v.c(1.0), t), v.add(v.c(1.0), t))
    return v.sel(tiny, x, v.copysign(v.sel(v.cmp("<", a, v.c(cut)), small, big), x))


def _tanh_f32(v: V, x):
    """One formula for every |x| = a: e^(-2a) = 2^k (1 + m), m = e^(2h) - 1 = 2h + h^2 Q(h)
    (-2a = k ln2 + 2h, |h| <= ln2/4; no cancellation, so m keeps its relative accuracy as
    a -> 0), and tanh = (1 - t)/(1 + t) with 1 -+ t = fma(-+2^k, m, 1 -+ 2^k), each rounded
    once (1 -+ 2^k are exact): no separate polynomial below 0.625.  n = -max(|x|, min
    normal) is one vrange; |x| at or below the smallest normal selects x (tanh(x) = x
    there), NaN included (vrange makes it -min normal).  22 vector ops (AVX-512) against
    the two branches' 29; max 1.95 ulp (bound 2) against their 1.50."""
    K = core._EXP["f32"]
    mn, sat = v.fmt.min_normal, _TANH_SAT["f32"]
    n = v.neg_abs_floor(x, mn)
    tiny = v.cmp(">=", n, v.c(-mn))
    n = v.sel(v.cmp(">", v.c(-sat), n), v.c(-sat), n)
    k = v.round_fma(n, 2.0 * 1.4426950408889634)
    h = v.fma(k, v.c(-K.ln2_hi / 2), n)                            # h = (-a - k ln2) / 2
    h = v.fma(k, v.c(-K.ln2_lo / 2), h)
    q = v.poly(h, [c * 2.0 ** (i + 2) for i, c in enumerate(K.coeffs)])
    m = v.fma(v.mul(h, h), q, v.add(h, h))
    s = v.ldexp(v.c(1.0), k)
    num = v.fma(v.neg(s), m, v.sub(v.c(1.0), s))
    den = v.fma(s, m, v.add(v.c(1.0), s))
    return v.sel(tiny, x, v.copysign(v.div(num, den), x))


# ---- logistic family ----------------------------------------------------------------------------
_ONE_PLUS_T_IS_ONE = {"f32": -64.0, "f64": -128.0}   # k below: 1 + p 2^k == 1 exactly (p < 2)
_LOGISTIC_ZERO_K = {"f32": -161.0, "f64": -1089.0}  # k below: |mul p / (1+t)| 2^k rounds to 0
#   (|mul| <= 170 / 1400 wherever the result is not forced to 0 by the callers' fixups)


def _logistic(v: V, w, w_lo=None, mul=None, compensated=True):
    """mul / (1 + e^-w), with e^-|w| = (p + p_lo) 2^k kept in pieces so that tiny results
    underflow gradually (the 2^k goes last, one rounding) and (if compensated) the division
    is corrected by its remainder:  w >= 0: mul / (1 + t);  w < 0: ((mul p) / (1 + t)) 2^k,
    t = e^-|w|.

    No op produces a subnormal unless the result is one (each such op takes a microcode
    assist): t in 1 + t is formed with k capped from below where 1 + t == 1 anyway, and the
    final 2^k is skipped (the result set to a signed 0) where it would round to 0."""
    neg = v.cmp("<", w, v.c(0.0))
    a = v.neg(v.abs(w))
    a_lo = None if w_lo is None else v.sel(neg, w_lo, v.neg(w_lo))
    one, zero = v.c(1.0), v.c(0.0)
    if not compensated:      # w < 0: ((mul p) / (1 + t)) 2^k, one rounding into subnormals
        p, k = core.exp_reduce(v, a, a_lo)
        num = v.sel(neg, p, one)
        num = num if mul is None else v.mul(num, mul)
        res = v.div(num, v.add(one, v.ldexp(p, _floor(v, k, _ONE_PLUS_T_IS_ONE[v.key]))))
        return _scale_last(v, res, neg, k)
    p, p_lo, k = core.exp_reduce(v, a, a_lo, with_lo=True)
    kt = _floor(v, k, _ONE_PLUS_T_IS_ONE[v.key])
    d, d_lo = v.fast_two_sum(v.c(1.0), v.ldexp(p, kt))
    d_lo = v.add(v.ldexp(p_lo, kt), d_lo)                  # 1 + t = d + d_lo
    n_hi = v.sel(neg, p, one)                              # w < 0: scaled by 2^k at the end
    n_lo = v.sel(neg, p_lo, zero)
    if mul is not None:
        n_hi, e = v.two_prod(n_hi, mul)
        n_lo = v.fma(n_lo, mul, e)
    r = v.div(one, d)                                      # the one division: 1/d, reused
    q = v.mul(n_hi, r)
    rem = v.fma(v.neg(q), d, n_hi)                         # exact remainder
    rem = v.fma(v.neg(q), d_lo, v.add(rem, n_lo))
    return _scale_last(v, v.fma(rem, r, q), neg, k)


def _floor(v: V, k, lo: float):
    return v.sel(v.cmp("<", k, v.c(lo)), v.c(lo), k)


def _scale_last(v: V, res, neg, k):
    """res 2^k where w < 0 (else res), a signed 0 where that rounds to 0."""
    gone = v.cmp("<", k, v.c(_LOGISTIC_ZERO_K[v.key]))
    scaled = v.ldexp(res, v.sel(v.b.and_(neg, v.b.not_(gone)), k, v.c(0.0)))
    return v.sel(v.b.and_(neg, gone), v.copysign(v.c(0.0), res), scaled)


def sigmoid(v: V, x):
    """1 / (1 + e^-x), accurate (and gradually underflowing) for x << 0 too; subnormal x
    is computed as 0 (sigmoid = 1/2 either way)."""
    if v.key == "f32":
        return v.sel(v.isnan(x), x, _sigmoid_f32(v, x))
    return v.sel(v.isnan(x), x, _logistic(v, v.flush_subnormal(x)))


_SIG32_LO, _SIG32_GONE = -112.0, -150.0   # k below: y 2^k (y < 2) rounds to 0; y is made +0


def _sigmoid_f32(v: V, x):
    """gelu's single-word pieces with a corrected quotient: n = -max(|x|, 2^-36) (one vrange;
    sigmoid is 1/2 to 2^-37 below), e^n = p 2^k, 1 + t = d + d_lo exactly (t = p 2^max(k,
    -64)), and (x < 0 ? p 2^k : 1) / (d + d_lo) from one division, corrected by its
    remainder, the x < 0 side's 2^k last (one masked vscalef; +0 where it rounds to 0).
    33 vector ops (AVX-512) against the double-word _logistic's 45; max 1.45 ulp (bound 2)."""
    n = v.neg_abs_floor(x, _X32_TINY)
    n = v.sel(v.cmp(">", v.c(_SIG32_LO), n), v.c(_SIG32_LO), n)
    (q, r), k = core.exp_reduce(v, n, poly_only=True)
    one, zero = v.c(1.0), v.c(0.0)
    p = v.fma(v.fma(q, r, one), r, one)
    neg = v.cmp("<", x, zero)
    num = v.sel(neg, v.sel(v.cmp("<", k, v.c(_SIG32_GONE)), zero, p), one)
    d, d_lo = v.fast_two_sum(one, v.ldexp(p, _floor(v, k, _ONE_PLUS_T_IS_ONE["f32"])))
    rd = v.div(one, d)
    y = v.mul(num, rd)
    rem = v.fma(v.neg(y), d_lo, v.fma(v.neg(y), d, num))      # num - y (d + d_lo)
    y = v.fma(rem, rd, y)
    return v.ldexp_where(neg, y, k, y)


def _x_times_fixups(v: V, x, res, compensated: bool):
    """Special values of x * g(x), g -> 1 at +inf and -> 0 at -inf: NaN at -inf (NumPy's
    x / (1 + exp(-x)) is -inf / inf).  The rest comes out of the arithmetic: NaN propagates,
    +-0 and +inf are x * 1 / (1 + t), and the vanishing tail is _logistic's signed 0.  With
    the compensated division (f64) the error-free product 1 * x is NaN at +inf and +0 at -0,
    so there x is selected for +-0, +inf and NaN."""
    res = v.sel(v.cmp("==", x, v.c(-math.inf)), v.c(math.nan), res)
    if not compensated:
        return res
    keep = v.b.or_(v.cmp("==", x, v.c(0.0)), v.cmp("==", x, v.c(math.inf)))
    return v.sel(v.b.or_(keep, v.isnan(x)), x, res)


def silu(v: V, x):
    """x / (1 + e^-x); silu(-inf) = NaN like NumPy's formula."""
    if v.key == "f32":
        n = v.neg_abs_floor(x, _X32_TINY)
        n = v.sel(v.cmp(">", v.c(_SILU32_LO), n), v.c(_SILU32_LO), n)
        p, k = core.exp_reduce(v, n, poly_only=True)
        return _x_logistic_f32(v, x, p, k, _SILU32_GONE)
    xf = v.flush_subnormal(x)
    comp = v.key == "f64"                                          # f32: 4-ulp budget
    res = _x_times_fixups(v, x, _logistic(v, xf, None, xf, compensated=comp), comp)
    return v.subnormal_times(x, 0.5, res)                          # x g(x), g(0) = 1/2


_GELU_CLAMP = {"f32": 1e4, "f64": 1e100}   # beyond: gelu(x) = x, or -0
_GELU_K1 = Fraction("0.7978845608028654") * 2               # the decimal constants, exactly
_GELU_K2 = _GELU_K1 * Fraction("0.044715")


def _split(exact: Fraction, bits: int):
    """exact as hi + lo: hi rounded to `bits` significant bits (exact products with short
    integers), lo the rest rounded to f32."""
    e = math.floor(math.log2(exact)) - bits + 1
    hi = float(round(exact / Fraction(2) ** e) * Fraction(2) ** e)
    return hi, float(np.float32(float(exact - Fraction(hi))))


_G32_K1 = _split(_GELU_K1, 21)              # k1_hi - t is exact for t < 16 (|x| < 11.5)
_G32_K2 = _split(_GELU_K2, 24)
_G32_LN2 = _split(Fraction(math.log(2)), 16)  # k ln2_hi exact for |k| < 2^8 (the double's ln2:
#                                               its error is far below what f32 needs)
_G32_LO = -11.0            # -|x| clamp: below it k < -155, where the x < 0 result rounds to -0
#                            _X32_TINY: the -|x| cap; n^2's rounding error, times k2, stays
#                            normal (or 0), and sigmoid(w) is 1/2 to 2^-37 above it (x / 2 either way)
_G32_GONE = -155.0         # k below (|y| < 16): y 2^k rounds to 0; y is made +-0 (NaN at -inf)
_X32_TINY = 2.0 ** -36
_SILU32_LO, _SILU32_GONE = -112.0, -157.0    # (|y| < 160)


def _gelu_f32(v: V, x):
    """f32 GELU in 31 vector ops (AVX-512; 57 with the double-word 2u): on n = -|x| (w is odd in x, so e^-|w| comes straight out
    of n), r = w - k ln2 is formed without a double-word w:  w = n t, t = k1 + k2 n^2 rounded;
    fma(n, t, -k ln2_hi) is exact up to one rounding of the small r, and t's error (its fma's
    rounding, computed exactly as fma(k2, n^2, k1_hi - t) since k1_hi - t is exact, plus the
    constants' and n^2's low parts) enters as one fma n * dt.  Then t = e^-|w| = p 2^k and
    gelu = x * (x < 0 ? p 2^k : 1) / (1 + t), the 2^k of the x < 0 side applied last (one
    rounding into the subnormals; a signed 0, NaN at -inf, where it would round to 0).
    No flush: a subnormal x meets -|x|'s clamp (no assist) and then only the division, whose
    x / 2 is the (subnormal) result."""
    (k1h, k1l), (k2h, k2l), (l2h, l2l) = _G32_K1, _G32_K2, _G32_LN2
    n = v.neg_abs_floor(x, _X32_TINY)
    n = v.sel(v.cmp(">", v.c(_G32_LO), n), v.c(_G32_LO), n)       # (NaN x: n = -2^-36, y NaN)
    n2 = v.mul(n, n)
    n2l = v.fma(n, n, v.neg(n2))
    t = v.fma(v.c(k2h), n2, v.c(k1h))
    w = v.mul(n, t)
    magic = v.c(1.5 * 2.0 ** 23)
    k = v.sub(v.fma(w, v.c(1.4426950408889634), magic), magic)
    r = v.fma(n, t, v.neg(v.mul(k, v.c(l2h))))
    dt = v.fma(v.c(k2h), n2, v.sub(v.c(k1h), t))                  # t's rounding error
    dt = v.add(dt, v.fma(v.c(k2h), n2l, v.fma(v.c(k2l), n2, v.c(k1l))))
    r = v.fma(n, dt, r)
    r = v.fma(k, v.c(-l2l), r)
    return _x_logistic_f32(v, x, (v.poly(r, core._EXP["f32"].coeffs), r), k, _G32_GONE)


def _x_logistic_f32(v: V, x, p, k, gone_k: float):
    """x / (1 + e^-w) from e^-|w| = e^r 2^k, e^r given as (q, r) with e^r = (q r + 1) r + 1:
    x (x < 0 ? e^r 2^k : 1) / (1 + e^r 2^k), the x < 0 side's 2^k applied last (one rounding
    into the subnormals) and e^r = 0 where k < gone_k (the result then rounds to a signed 0;
    NaN at -inf).  A subnormal x is computed as x / 2 by the division, the one op reading it."""
    q, r = p
    gone = v.cmp("<", k, v.c(gone_k))
    p = v.sel(gone, v.c(0.0), v.fma(v.fma(q, r, v.c(1.0)), r, v.c(1.0)))
    d = v.add(v.c(1.0), v.ldexp(p, _floor(v, k, _ONE_PLUS_T_IS_ONE["f32"])))
    neg = v.cmp("<", x, v.c(-v.fmt.min_normal))
    y = v.div(v.sel(neg, v.mul(x, p), x), d)
    return v.ldexp_where(neg, y, k, y)


def gelu(v: V, x):
    """tanh-approximation GELU = x * sigmoid(2u), 2u = x (k1 + k2 x^2); 2u is formed in
    double-word arithmetic because e^(2u) for x << 0 amplifies its rounding error |2u| times."""
    if v.key == "f32":
        return _gelu_f32(v, x)
    k1, k1l = _dd(v, _GELU_K1)
    k2, k2l = _dd(v, _GELU_K2)
    big = _GELU_CLAMP[v.key]
    xf = v.flush_subnormal(x)
    xc = v.clamp_keep_nan(xf, -big, big)
    x2, x2l = v.two_prod(xc, xc)
    th, tl = v.two_prod(k2, x2)
    tl = v.fma(k2, x2l, v.fma(k2l, x2, tl))
    ah, e = v.two_sum(k1, th)
    al = v.add(v.add(e, tl), k1l)
    wh, wl = v.two_prod(xc, ah)
    wl = v.fma(xc, al, wl)
    comp = v.key == "f64"                                          # f32: 4-ulp budget, speed
    res = _x_times_fixups(v, x, _logistic(v, wh, wl, xf, compensated=comp), comp)
    return v.subnormal_times(x, 0.5, res)                          # x g(x), g(0) = 1/2


def elu(v: V, x, alpha: float):
    """x if x >= 0 else alpha * (e^x - 1), the latter via expm1 (no cancellation near 0)."""
    a = alpha if isinstance(alpha, ir.Value) else v.c(alpha)
    return v.sel(v.cmp(">=", x, v.c(0.0)), x, v.mul(a, core.expm1(v, x)))


def sqrt(v: V, x):
    return v.sqrt(x)


def recip(v: V, x):
    return v.div(v.c(1.0), x)


_IMPLS = {"exp": core.exp, "log": core.log, "sin": sin, "cos": cos, "tanh": tanh, "erf": erf,
          "sigmoid": sigmoid, "gelu": gelu, "gelu_erf": gelu_erf, "silu": silu, "elu": elu,
          "powf": powf, "sqrt": sqrt, "recip": recip}
_NPARAMS = {"elu": 1, "powf": 1}


def _builder(name):
    impl, nparams = _IMPLS[name], _NPARAMS.get(name, 0)

    def build(b: ir.IRBuilder, x: ir.Value, *params) -> ir.Value:
        if len(params) != nparams:
            raise TypeError(f"vmath.{name}: expected {nparams} parameter(s), got {len(params)}")
        return impl(V(b, x.type), x, *(p if isinstance(p, (ir.Value, RuntimeExponent)) else float(p)
                                       for p in params))
    build.__name__ = name
    build.__doc__ = impl.__doc__
    return build


FUNCS = {name: _builder(name) for name in _IMPLS}


def emit(b: ir.IRBuilder, name: str, x: ir.Value, *params: float) -> ir.Value:
    """Emit `name`(x, *params) at b's position; returns a value of x's type.

    sin and cos add basic blocks (a branch around the huge-argument reduction, taken only
    when some lane has |x| >= 2^40 (f32) / 2^32 (f64)) and leave the builder at the end of
    their join block: take phi incoming blocks from `b.block` after emitting."""
    try:
        fn = FUNCS[name]
    except KeyError:
        raise KeyError(f"vmath: unknown function {name!r}; known: {sorted(FUNCS)}") from None
    return fn(b, x, *params)
