"""powf(x, e) for a constant exponent with np.power's (C99 pow's) special cases.

|x|^e = exp(e log|x|).  The product e log|x| must be accurate to ~2^-54 absolute for a
1-ulp result, so f32 computes log and exp in double (then rounds once), and f64 carries
log|x| as a double-double (atanh series with the leading terms in double-word arithmetic)
into exp's reduction.  Exponents 0, 1, -1, 2 and 1/2 are exact special cases (1/2 is sqrt, as in NumPy 2's power); the sign for
negative x (odd integer e) and the NaN for negative x with non-integer e are decided from e
at build time.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from . import vmath_core as core
from .llvmutil import call_intrinsic
from .vmath_core import V


def _log_dd(v: V, ax):
    """log(ax) as (hi, lo) to ~2^-66 relative, ax >= 0 (specials: hi = log's, lo = 0)."""
    L = core._LOG[v.key]
    K = core._EXP[v.key]
    ef, f = core.log_reduce(v, ax)
    d, d_lo = v.fast_two_sum(v.c(2.0), f)
    s = v.div(f, d)
    rem = v.fma(v.neg(s), d_lo, v.fma(v.neg(s), d, f))
    s_lo = v.div(rem, d)                                   # s + s_lo = f / (2 + f)
    z, z_lo = v.two_prod(s, s)
    z_lo = v.fma(v.add(s, s), s_lo, z_lo)
    c, c_lo = v.two_prod(s, z)                             # s^3
    c_lo = v.fma(s, z_lo, v.fma(s_lo, z, c_lo))
    tt = Fraction(2, 3)
    tt_hi = float(tt)
    t, t_lo = v.two_prod(c, v.c(tt_hi))                    # (2/3) s^3
    t_lo = v.fma(c, v.c(float(tt - Fraction(tt_hi))), v.fma(c_lo, v.c(tt_hi), t_lo))
    u = v.mul(v.mul(c, z), v.poly(z, L.coeffs[1:]))        # rest of 2 atanh(s) - 2s
    a, a_lo = v.two_prod(ef, v.c(K.ln2_hi))
    a_lo = v.fma(ef, v.c(K.ln2_lo), a_lo)
    sh, e1 = v.two_sum(a, v.add(s, s))
    sh, e2 = v.two_sum(sh, t)
    lo = v.add(v.add(v.add(a_lo, v.add(s_lo, s_lo)), v.add(t_lo, u)), v.add(e1, e2))
    hi, lo = v.fast_two_sum(sh, lo)
    hi = core.log_specials(v, ax, hi)
    finite = v.cmp("<", v.abs(hi), v.c(math.inf))
    return hi, v.sel(finite, lo, v.c(0.0))


class RuntimeExponent:
    """An exponent known at run time only: its value (x's type) and the class of exponent the
    code is built for (finite, integer, odd integer), as ops.powf_exponent_class computes it."""

    def __init__(self, value, finite: bool, is_int: bool, odd: bool):
        self.value, self.finite, self.is_int, self.odd = value, finite, is_int, odd


def _abs_pow(v: V, ax, e):
    """|x|^e for ax = |x| (NaN, 0 and inf handled by log / exp's own rules); e a float or an
    ir.Value of x's type."""
    const_e = isinstance(e, float)
    if v.key == "f32":
        w = v.other("f64")
        ew = w.c(e) if const_e else v.b.fpext(e, w.t)
        y = w.mul(core.log(w, v.b.fpext(ax, w.t)), ew)
        return v.b.fptrunc(core.exp(w, y), v.t)
    ev = v.c(e) if const_e else e
    hi, lo = _log_dd(v, ax)
    y, y_lo = v.two_prod(hi, ev)
    y_lo = v.fma(lo, ev, y_lo)
    y_lo = v.sel(v.cmp("<", v.abs(y), v.c(2000.0)), y_lo, v.c(0.0))   # beyond: 0 or inf anyway
    p, s1, s2 = core.exp_parts(v, y, y_lo)
    return v.sel(v.isnan(y), y, v.mul(v.mul(p, s1), s2))


def powf(v: V, x, e):
    """np.power(x, e) with e a constant (rounded to x's precision first, as NumPy does) or a
    RuntimeExponent (the special exponents 0, 1, 2, -1 and 0.5 are always constants)."""
    if isinstance(e, RuntimeExponent):
        return _general_pow(v, x, e.value, e.finite, e.is_int, e.odd, None)
    if v.key == "f32":
        e = float(np.float32(e))
    if e == 0.0:
        return v.c(1.0)                                    # even for NaN x
    if e == 1.0:
        return x
    if e == 2.0:
        return v.mul(x, x)
    if e == -1.0:
        return v.div(v.c(1.0), x)
    if e == 0.5:                                           # NumPy 2 uses sqrt here: (-0)^.5 = -0, (-inf)^.5 = NaN
        return v.sqrt(x)
    finite = math.isfinite(e)
    is_int = finite and e == math.floor(e)
    return _general_pow(v, x, e, finite, is_int, is_int and abs(e) < 2.0 ** 53 and int(e) % 2 == 1, math.isinf(e))


def _general_pow(v: V, x, e, finite, is_int, odd, is_inf):
    """|x|^e with the sign and special-value rules of np.power for an exponent of this class
    (is_inf None: e is a run-time value, and whether it is infinite is decided at run time)."""
    res = _abs_pow(v, v.abs(x), e)
    if odd:
        res = v.copysign(res, x)                           # odd integer: sign of x (also for -0, -inf)
    if finite and not is_int:                              # negative finite x: NaN
        neg = v.b.and_(v.cmp("<", x, v.c(0.0)), v.cmp(">", x, v.c(-math.inf)))
        res = v.sel(neg, v.c(math.nan), res)
    one = v.c(1.0)
    if is_inf:
        res = v.sel(v.cmp("==", x, v.c(-1.0)), one, res)    # pow(-1, +-inf) = 1
    elif is_inf is None and not finite:                    # run-time e: +-inf or NaN
        e_inf = v.cmp("==", v.abs(e), v.c(math.inf))
        res = v.sel(v.b.and_(e_inf, v.cmp("==", x, v.c(-1.0))), one, res)
    return v.sel(v.cmp("==", x, one), one, res)            # pow(1, anything) = 1


def pow_values(v: V, x, e):
    """np.power(x, e) elementwise for two values of the same type: powf's special cases
    decided per lane at run time (C99 pow, as NumPy's power of two arrays)."""
    one, zero, inf = v.c(1.0), v.c(0.0), v.c(math.inf)
    res = _abs_pow(v, v.abs(x), e)
    b = v.b
    finite_e = v.cmp("<", v.abs(e), inf)
    floor_e = call_intrinsic(b, "floor", [e])
    is_int = b.and_(finite_e, v.cmp("==", floor_e, e))
    half = v.mul(e, v.c(0.5))
    odd = b.and_(is_int, v.cmp("!=", call_intrinsic(b, "floor", [half]), half))
    res = v.sel(odd, v.copysign(res, x), res)             # odd integer: sign of x (also -0, -inf)
    neg_x = b.and_(v.cmp("<", x, zero), v.cmp(">", x, v.c(-math.inf)))
    res = v.sel(b.and_(neg_x, b.and_(finite_e, b.not_(is_int))), v.c(math.nan), res)
    res = v.sel(b.and_(v.cmp("==", x, v.c(-1.0)), b.not_(finite_e)), v.sel(v.isnan(e), res, one), res)
    return v.sel(b.or_(v.cmp("==", x, one), v.cmp("==", e, zero)), one, res)   # pow(1, y) = pow(x, 0) = 1
