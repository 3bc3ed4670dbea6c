"""erf and gelu_erf (exact GELU, 0.5 x (1 + erf(x / sqrt 2))).

* |a| < 0.5: erf(a) = a E(a^2), minimax polynomial (below 0.5, 1 - erf cancels by < 1.1x).
* a >= 0.5: erfc(a) = exp(-a^2) erfcx(a) with one near-minimax rational up to where
  erfc underflows; erf = 1 - erfc.  f32 (computed in double): erfcx = P(a)/Q(a).  f64:
  erfcx = (c + P(a)/Q(a)) / a with c = 1/sqrt(pi), so the rational is a small correction and
  its rounding errors are damped (plain P/Q loses ~8 units of 2^-53 in Horner).  exp(-a^2)
  gets a^2 as a double-word, because its rounding error is amplified a^2 times.

gelu_erf for x < 0 is 0.5 x erfc(|x|/sqrt 2), so its tail is relative-accurate down to the
underflow threshold (|x|/sqrt 2 is formed as a double-word in f64).  f32 inputs are computed
in double with f32-grade coefficient sets and rounded once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import vmath_core as core
from .vmath_core import V

CUT = 0.5


@dataclass(frozen=True)
class _ErfConsts:
    small: tuple         # E(z), erf(a) = a E(a^2) on [0, CUT]
    num: tuple           # P(a) of erfcx on [CUT, amax] (see module doc)
    den: tuple           # Q(a)
    offset: float        # 0: erfcx = P/Q;  c: erfcx = (c + P/Q) / a
    amax: float          # erfc(amax) underflows the format
    gelu_zero: float     # gelu_erf(x) = -0 below this, = x above -gelu_zero


_ERF = {
    "f32": _ErfConsts((1.1283791655673476, -0.37612608572857487, 0.11282822810143045, -0.026757184283790415,
                       0.004717990095638839),
                      (1.0000105050861332, 1.3175337051083698, 0.8221092868012007, 0.27551048426292085,
                       0.04419325292006692),
                      (1.0, 2.4460150871811166, 2.5816883376508533, 1.4961075740129295, 0.48834078555255234,
                       0.07833024074903729),
                      0.0, 10.5, -20.0),
    "f64": _ErfConsts((1.1283791670955126, -0.37612638903183465, 0.11283791670924813, -0.02686617063271577,
                       0.005223977370326127, -0.0008548297524379599, 0.00012053324313128172,
                       -1.4845583730203071e-05, 1.4723215310356647e-06),
                      (-0.564189583428364, -0.9624256536914597, -0.833338105831987, -0.46382529045574244,
                       -0.1792911747688333, -0.049093222964831706, -0.009325960056233385,
                       -0.0011360318159579148, -6.997808886446723e-05),
                      (1.0, 3.4783089035521777, 5.6421953719852915, 5.638475753026241, 3.859141765080699,
                       1.8992261487548585, 0.6847879200014695, 0.18007164232053197, 0.0334317662532569,
                       0.004027127936882874, 0.0002480658661508497),
                      0.5641895835477563, 27.5, -40.0),
}
_INV_SQRT2 = (0.7071067811865476, -4.833646656726457e-17)      # 1/sqrt(2) = hi + lo


def _erfc_big(w: V, C, a, a2, a2_lo, mul=None, a_lo=None):
    """(mul *) erfc(a) for a >= CUT in double context w; a^2 = a2 + a2_lo, a = a + a_lo.
    The power-of-two factors of exp go last, so tiny f64 results underflow gradually."""
    ac = w.sel(w.cmp("<", a, w.c(C.amax)), a, w.c(C.amax))
    h = w.div(w.poly(ac, C.num), w.poly(ac, C.den))
    p, p_lo, s1, s2 = core.exp_parts(w, w.neg(a2), None if a2_lo is None else w.neg(a2_lo), with_lo=True)
    if not C.offset:                                   # f32 grade: erfcx = P/Q, plain double
        m = h if mul is None else w.mul(h, mul)
        return w.mul(w.mul(w.mul(m, p), s1), s2)
    # f64: erfcx = (c + h) / (a + a_lo) as q + q_lo, times mul and (p + p_lo), one rounding
    n, n_lo = w.two_sum(w.c(C.offset), h)
    q = w.div(n, ac)
    rem = w.add(w.fma(w.neg(q), ac, n), n_lo)
    if a_lo is not None:
        rem = w.fma(w.neg(q), a_lo, rem)
    q_lo = w.div(rem, ac)
    if mul is not None:
        q, t_lo = w.two_prod(q, mul)
        q_lo = w.fma(q_lo, mul, t_lo)
    m = w.fma(q, p, w.fma(q, p_lo, w.mul(q_lo, p)))
    return w.mul(w.mul(m, s1), s2)


def _work(v: V, x):
    """Double context and x in it."""
    if v.key == "f64":
        return v, x
    w = v.other("f64")
    return w, v.b.fpext(x, w.t)


def _finish(v: V, w: V, res):
    return res if w is v else v.b.fptrunc(res, v.t)


def erf(v: V, x):
    """erf(x); erf(-0) = -0, erf(+-inf) = +-1."""
    C = _ERF[v.key]
    w, xd = _work(v, x)
    a = w.abs(xd)
    a2, a2_lo = w.two_prod(a, a)
    small = w.mul(a, w.poly(a2, C.small))
    big = w.sub(w.c(1.0), _erfc_big(w, C, a, a2, a2_lo if w is v else None))
    res = w.copysign(w.sel(w.cmp("<", a, w.c(CUT)), small, big), xd)
    res = _finish(v, w, res)
    return v.sel(v.isnan(x), x, res)


def gelu_erf(v: V, x):
    """0.5 x (1 + erf(x/sqrt 2)); x < 0 uses 0.5 x erfc(|x|/sqrt 2).  gelu_erf(-inf) = NaN
    (as NumPy's formula gives -inf * 0)."""
    C = _ERF[v.key]
    w, xd = _work(v, x)
    ax = w.abs(xd)
    neg = w.cmp("<", xd, w.c(0.0))
    if w is v:                                   # f64: a = |x|/sqrt2 as a double-word
        a, a_lo = w.two_prod(ax, w.c(_INV_SQRT2[0]))
        a_lo = w.fma(ax, w.c(_INV_SQRT2[1]), a_lo)
        a2, a2_lo = w.two_prod(a, a)
        a2_lo = w.fma(w.add(a, a), a_lo, a2_lo)
    else:
        a = w.mul(ax, w.c(_INV_SQRT2[0]))
        a2, a2_lo = w.mul(a, a), None
    half_x = w.mul(xd, w.c(0.5))
    sa = w.sel(neg, w.neg(a), a)                                    # x / sqrt 2
    E = w.poly(a2, C.small)
    one_pm = w.fma(sa, E, w.c(1.0))                                 # 1 + erf(x/sqrt2), one rounding
    if w is v:
        one_pm = w.fma(w.sel(neg, w.neg(a_lo), a_lo), E, one_pm)
    small = w.mul(half_x, one_pm)
    tail = _erfc_big(w, C, a, a2, a2_lo, half_x, a_lo if w is v else None)   # 0.5 x erfc(a)
    big = w.sel(neg, tail, w.sub(xd, tail))                         # x >= 0: x - 0.5 x erfc(a)
    res = w.sel(w.cmp("<", a, w.c(CUT)), small, big)
    res = _finish(v, w, res)
    res = v.sel(v.cmp("<", x, v.c(C.gelu_zero)), v.c(-0.0), res)
    res = v.sel(v.cmp(">", x, v.c(-C.gelu_zero)), x, res)          # erfc term below 2^-600
    res = v.sel(v.cmp("==", x, v.c(-math.inf)), v.c(math.nan), res)
    return v.sel(v.isnan(x), x, res)
