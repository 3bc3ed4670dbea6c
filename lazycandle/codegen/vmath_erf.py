"""erf and gelu_erf (exact GELU, 0.5 x (1 + erf(x / sqrt 2))).

f64:
* |a| < 0.5: erf(a) = a E(a^2), minimax polynomial (below 0.5, 1 - erf cancels by < 1.1x).
* a >= 0.5: erfc(a) = exp(-a^2) erfcx(a) with one near-minimax rational up to where
  erfc underflows; erf = 1 - erfc.  erfcx = (c + P(a)/Q(a)) / a with c = 1/sqrt(pi), so the
  rational is a small correction and its rounding errors are damped (plain P/Q loses ~8 units
  of 2^-53 in Horner).  exp(-a^2) gets a^2 as a double-word, because its rounding error is
  amplified a^2 times.

gelu_erf for x < 0 is 0.5 x erfc(|x|/sqrt 2), so its tail is relative-accurate down to the
underflow threshold (|x|/sqrt 2 is formed as a double-word).

f32 stays in f32 (16 lanes at 512 bits, no double division): below CUT32 erf(a) = a E(a^2);
above, erf(a) = 1 - C(a - 2.4375) up to 4 (a polynomial: erf needs erfc only to absolute
accuracy).  gelu_erf's erfc(a) = t Q(t) e^(-a^2) with t = 1/(1 + a/2), Q a polynomial in t - 0.483 (relative
error 8e-9 on [0.5, 10]) and t's rounding corrected to first order, and e^(-a^2) from a^2 as
an exact double-word (an FMA product), so the tail of gelu_erf keeps its relative accuracy
where e^(-a^2) amplifies a^2's rounding error.  gelu_erf for x < 0 switches to erfc at
a = 0.5, where 1 + erf(-a) starts to cancel.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from . import vmath_core as core
from .vmath_core import V

CUT = 0.5


@dataclass(frozen=True)
class _ErfConsts:
    small: tuple         # E(z), erf(a) = a E(a^2) on [0, CUT]
    num: tuple           # P(a) of erfcx on [CUT, amax] (see module doc)
    den: tuple           # Q(a)
    offset: float        # c: erfcx = (c + P/Q) / a
    amax: float          # erfc(amax) underflows the format
    gelu_zero: float     # gelu_erf(x) = -0 below this, = x above -gelu_zero


_ERF64 = _ErfConsts((1.1283791670955126, -0.37612638903183465, 0.11283791670924813, -0.02686617063271577,
                    0.005223977370326127, -0.0008548297524379599, 0.00012053324313128172,
                    -1.4845583730203071e-05, 1.4723215310356647e-06),
                    (-0.564189583428364, -0.9624256536914597, -0.833338105831987, -0.46382529045574244,
                    -0.1792911747688333, -0.049093222964831706, -0.009325960056233385,
                    -0.0011360318159579148, -6.997808886446723e-05),
                    (1.0, 3.4783089035521777, 5.6421953719852915, 5.638475753026241, 3.859141765080699,
                    1.8992261487548585, 0.6847879200014695, 0.18007164232053197, 0.0334317662532569,
                    0.004027127936882874, 0.0002480658661508497),
                    0.5641895835477563, 27.5, -40.0)
_INV_SQRT2 = (0.7071067811865476, -4.833646656726457e-17)      # 1/sqrt(2) = hi + lo


def _erfc_big(v: V, C, a, a2, a2_lo, mul=None, a_lo=None):
    """(mul *) erfc(a) for a >= CUT (f64); a^2 = a2 + a2_lo, a = a + a_lo.  The power-of-two
    factors of exp go last, so tiny results underflow gradually."""
    ac = v.sel(v.cmp("<", a, v.c(C.amax)), a, v.c(C.amax))
    h = v.div(v.poly(ac, C.num), v.poly(ac, C.den))
    p, p_lo, s1, s2 = core.exp_parts(v, v.neg(a2), v.neg(a2_lo), with_lo=True)
    # erfcx = (c + h) / (a + a_lo) as q + q_lo, times mul and (p + p_lo), one rounding
    n, n_lo = v.two_sum(v.c(C.offset), h)
    q = v.div(n, ac)
    rem = v.add(v.fma(v.neg(q), ac, n), n_lo)
    if a_lo is not None:
        rem = v.fma(v.neg(q), a_lo, rem)
    q_lo = v.div(rem, ac)
    if mul is not None:
        q, t_lo = v.two_prod(q, mul)
        q_lo = v.fma(q_lo, mul, t_lo)
    m = v.fma(q, p, v.fma(q, p_lo, v.mul(q_lo, p)))
    return v.mul(v.mul(m, s1), s2)


CUT32 = 0.875       # erf: the polynomial below, erfc above
CUT32_NEG = 0.5     # gelu_erf, x < 0: 1 - erf(a) cancels above this, so erfc takes over
_E32 = (1.1283791574913127, -0.3761255046101938, 0.11282455296620215, -0.026791461835332462,
        0.005032179541684599, -0.0006203245889704982)          # erf(a)/a in a^2 on [0, CUT32]
_Q32 = (0.4994932522982278, 0.6686538978429036, 0.5513724519856945, 0.15693436661518997,
        -0.16295280866919792, -0.1128396559613334, 0.08987893711121973, 0.059537839757231786,
        -0.06178874980506203)          # erfc(a) e^(a^2) / t in t - _Q32_T0, for a in [0.5, 10]
_DQ32 = tuple(i * c for i, c in enumerate(_Q32))[1:]
_Q32_T0 = 0.48333333333333334         # centre of t's range: Horner's terms shrink, no cancellation
_A32_MAX = 10.0                                                 # erfc(10) underflows f32
_ERFC32_ZERO_K = -165.0      # m 2^k rounds to 0 at or below (|m| < 2^13: |x| <= 1e4, h e^r < 1)
_E32_C0 = (struct.unpack("f", struct.pack("f", _E32[0]))[0],)
_E32_C0 += (_E32[0] - _E32_C0[0],)                              # E's constant term as f32 hi + lo


def _erfc32(v: V, a, a2, a2_lo, mul=None, scale=1.0):
    """(mul *) erfc(a) for CUT32 <= a (f32), a = scale * `a`; a^2 = a2 + a2_lo exactly.
    (gelu_erf passes |x| and 1/sqrt 2: t's denominator is then rounded once, not twice.)"""
    ac = v.sel(v.cmp("<", a, v.c(_A32_MAX / scale)), a, v.c(_A32_MAX / scale))
    # t Q(t) changes ~2x faster than t, so t's two roundings are corrected to first order:
    # d + d_lo = 1 + k a (1 - d is exact here), 1/(d + d_lo) = t + t_lo
    k = v.c(0.5 * scale)
    d = v.fma(ac, k, v.c(1.0))
    d_lo = v.fma(ac, k, v.sub(v.c(1.0), d))
    t = v.div(v.c(1.0), d)
    t_lo = v.mul(t, v.fma(v.neg(t), d_lo, v.fma(v.neg(t), d, v.c(1.0))))
    u = v.sub(t, v.c(_Q32_T0))
    q = v.poly(u, _Q32)
    dq = v.poly(u, _DQ32)                                  # Q'(u)
    h = v.fma(t, v.fma(dq, t_lo, q), v.mul(t_lo, q))       # (t + t_lo) Q(t + t_lo)
    p, p_lo, k = core.exp_reduce(v, v.neg(a2), v.neg(a2_lo), with_lo=True)
    m = v.fma(h, p, v.mul(h, p_lo))                        # h e^r, rounded once
    m = m if mul is None else v.mul(m, mul)
    return core.scale_pow2(v, m, k, _ERFC32_ZERO_K)


ERF_ONE = {"f32": 4.0, "f64": 6.0}   # erfc(a) < 2^-25 / 2^-54 above: erf(a) rounds to 1
_ERFC32_MID = 2.4375                 # erfc(a) = C(a - mid) on [CUT32, 4], absolute error 1.3e-9
_ERFC32_POLY = (0.0005665436037816107, -0.002965740393847227, 0.007229002192616463, -0.010758851654827595, 0.010702577419579029, -0.007205635774880648, 0.0030009793117642403, -0.00037873844848945737, -0.0004131098394282162, 0.00030337736825458705, -7.352053944487125e-05, -2.165525802411139e-05, 1.9323822925798595e-05, -2.175713689211989e-06, -1.5558230188617017e-06, 3.0501564651785884e-07, 4.004088083320312e-08)


def _erf32(v: V, x):
    """Below CUT32 erf(a) = a E(a^2); above, 1 - C(a - mid), a polynomial for erfc: erf only
    needs erfc to absolute accuracy (~2^-26), and with the variable centred the Horner terms
    stay below 0.3 in sum, so no exp, division or error-free correction is needed (the
    relative tail, _erfc32, is gelu_erf's).  |x| is capped at 4, where erf rounds to 1."""
    a = v.cap(v.abs(v.flush_subnormal(x)), ERF_ONE["f32"])
    a2 = v.mul(a, a)
    # a c0 + a (a^2 P(a^2)) with c0 split in two: the product a c0 is rounded once, by the fma
    small = v.fma(a, v.c(_E32_C0[0]), v.mul(a, v.fma(a2, v.poly(a2, _E32[1:]), v.c(_E32_C0[1]))))
    big = v.sub(v.c(1.0), v.poly(v.sub(a, v.c(_ERFC32_MID)), _ERFC32_POLY))
    res = v.copysign(v.sel(v.cmp("<", a, v.c(CUT32)), small, big), x)
    res = v.subnormal_times(x, _E32_C0[0], res)                     # erf(x) = x 2/sqrt(pi)
    return v.sel(v.isnan(x), x, res)


# f32 gelu_erf: erfc(s / sqrt 2) = e^(-s^2/2) G(s), s = |x| < 15, G one degree-5 polynomial per
# interval (bench/fit_vmath.py gelu_erf32_table): each binade of s + 1 in [1, 16) cut in eighths.
# slot j: s = |x| with (bits(s + 1) >> 20) & 31 == j; G(s) = sum c_i (s - centre)^i; max rel. error 1.8e-09
_G32_CENTRES = (1.125, 1.375, 1.625, 1.875, 2.125, 2.375, 2.625, 2.875, 3.25, 3.75, 4.25, 4.75, 5.25, 5.75, 6.25, 6.75, 7.5, 8.5, 9.5, 10.5, 11.5, 12.5, 13.5, 14.5, 0.0625, 0.1875, 0.3125, 0.4375, 0.5625, 0.6875, 0.8125, 0.9375)
_G32_COEFFS = (
    (0.4906627833843231, 0.43527963757514954, 0.39004620909690857, 0.35258176922798157, 0.3211601972579956, 0.2945081293582916, 0.27167120575904846, 0.25192344188690186, 0.22690412402153015, 0.20007841289043427, 0.17871864140033722, 0.1613508015871048, 0.14697645604610443, 0.13489846885204315, 0.12461697310209274, 0.11576526612043381, 0.10458619147539139, 0.09262008965015411, 0.08308658003807068, 0.07531771808862686, 0.06886811554431915, 0.06342985481023788, 0.05878346413373947, 0.05476845055818558, 0.9520222544670105, 0.866364598274231, 0.792423665523529, 0.7282097339630127, 0.6721228957176208, 0.622868001461029, 0.5793901681900024, 0.540824830532074),
    (-0.24588893353939056, -0.19937504827976227, -0.16405946016311646, -0.13679371774196625, -0.11541913449764252, -0.09842773526906967, -0.08474766463041306, -0.07360465824604034, -0.060446158051490784, -0.04759048670530319, -0.038330353796482086, -0.03146826848387718, -0.026258137077093124, -0.022218400612473488, -0.019028473645448685, -0.016469033434987068, -0.01348810363560915, -0.010613828897476196, -0.008562079630792141, -0.0070485277101397514, -0.0059012132696807384, -0.005011421628296375, -0.004307806957513094, -0.00374203035607934, -0.7383831739425659, -0.6354411840438843, -0.5502521395683289, -0.4792928099632263, -0.41981545090675354, -0.3696628212928772, -0.3271300792694092, -0.2908612787723541),
    (0.10701864957809448, 0.08056934922933578, 0.061724722385406494, 0.04804673045873642, 0.03794723376631737, 0.030371109023690224, 0.024604273959994316, 0.02015502192080021, 0.015226970426738262, 0.01080700010061264, 0.007907296530902386, 0.005938248708844185, 0.004560614470392466, 0.0035713263787329197, 0.0028445017524063587, 0.0022996452171355486, 0.0017126933671534061, 0.0012012660736218095, 0.000873408920597285, 0.0006540867034345865, 0.000502081704325974, 0.0003935403365176171, 0.00031403539469465613, 0.0002545056922826916, 0.4529365003108978, 0.3736095726490021, 0.31023484468460083, 0.25925952196121216, 0.2179882973432541, 0.18436235189437866, 0.15679845213890076, 0.13407117128372192),
    (-0.041830889880657196, -0.029530659317970276, -0.021252207458019257, -0.01556866243481636, -0.011593728326261044, -0.008765432052314281, -0.0067204684019088745, -0.005219644866883755, -0.003652728395536542, -0.0023546856828033924, -0.0015747451689094305, -0.0010871745180338621, -0.0007716235122643411, -0.0005610825610347092, -0.00041677398257888854, -0.00031547172693535686, -0.00021426570310723037, -0.0001343374460702762, -8.822157542454079e-05, -6.020016735419631e-05, -4.242109935148619e-05, -3.072033359785564e-05, -2.2774967874283902e-05, -1.7231699530384503e-05, -0.23669156432151794, -0.18846313655376434, -0.1511012464761734, -0.12195558100938797, -0.09906566888093948, -0.08097122609615326, -0.06657709926366806, -0.05505651235580444),
    (0.015026431530714035, 0.010013292543590069, 0.0068110995925962925, 0.0047224462032318115, 0.0033331424929201603, 0.002391899237409234, 0.0017431541346013546, 0.001288754167035222, 0.0008426234708167613, 0.0004960898077115417, 0.00030463215080089867, 0.00019407727813813835, 0.00012770314060617238, 8.645608613733202e-05, 6.0026461142115295e-05, 4.262217044015415e-05, 2.6571111447992735e-05, 1.4915709471097216e-05, 8.858397450239863e-06, 5.513097221410135e-06, 3.5690179629455088e-06, 2.389351038800669e-06, 1.6465043017888092e-06, 1.1634705288088298e-06, 0.10964006930589676, 0.08464451134204865, 0.06581021845340729, 0.0515177920460701, 0.04059722647070885, 0.032197196036577225, 0.025693973526358604, 0.020627520978450775),
    (-0.00500181969255209, -0.0031635104678571224, -0.0020442598033696413, -0.0013478763867169619, -0.000905655266251415, -0.0006193798617459834, -0.00043067129445262253, -0.00030413977219723165, -0.00018594514403957874, -0.00010058481711894274, -5.699923713109456e-05, -3.365180964465253e-05, -2.060136102954857e-05, -1.3024570762354415e-05, -8.473989510093816e-06, -5.656595021719113e-06, -3.231408527426538e-06, -1.6300367633448332e-06, -8.778796996011806e-07, -4.993564743926981e-07, -2.9747553753622924e-07, -1.8434934645483736e-07, -1.1820539214113523e-07, -7.807815904925519e-08, -0.04599219188094139, -0.034538473933935165, -0.026123402640223503, -0.01989651471376419, -0.015256630256772041, -0.011775771155953407, -0.009147138334810734, -0.0071493047289550304),
)
_G32_S_MAX = 14.9           # s + 1 < 16; beyond, 0.5 x erfc(s / sqrt 2) rounds to 0 like at 14.9
_G32_ZERO_K = -155.0       # m 2^k rounds to 0 at or below (|m| = |x| G e^r / 2 < 16 for |x| <= 20)


def _gelu_erf32(v: V, x):
    """gelu_erf(x) = x - T (x > 0) or T (x <= 0), T = 0.5 x erfc(|x| / sqrt 2) = 0.5 x G(s)
    e^(-s^2/2), s = |x|: one table-driven G for every x (no separate erf branch near 0: x - T
    does not cancel, T <= x / 2), its coefficients looked up by the interval slot, and
    -s^2/2 as an exact double-word (-s/2 is exact), so the tail keeps its relative accuracy
    where e^(-s^2/2) amplifies the rounding of s^2."""
    xf = v.flush_subnormal(x)
    xc = v.clamp(xf, -20.0, 20.0)
    s = v.cap(v.abs(xc), _G32_S_MAX)
    slot = v.b.lshr(v.bits(v.add(s, v.c(1.0))), v.ci(20))
    u = v.sub(s, core.table_lookup(v, "lc_gelu_erf32_c", _G32_CENTRES, slot))       # exact
    g = core.table_lookup(v, "lc_gelu_erf32_5", _G32_COEFFS[5], slot)
    for j in range(4, -1, -1):
        g = v.fma(g, u, core.table_lookup(v, f"lc_gelu_erf32_{j}", _G32_COEFFS[j], slot))
    hs = v.mul(s, v.c(-0.5))
    n2 = v.mul(s, hs)
    p, p_lo, k = core.exp_reduce(v, n2, v.fma(s, hs, v.neg(n2)), with_lo=True, in_range=True)
    m = v.mul(v.fma(g, p, v.mul(g, p_lo)), v.mul(xc, v.c(0.5)))      # 0.5 x G e^r
    tail = core.scale_pow2(v, m, k, _G32_ZERO_K)
    res = v.sel(v.cmp("<=", xc, v.c(0.0)), tail, v.sub(xc, tail))
    res = v.sel(v.cmp(">", x, v.c(20.0)), x, res)
    res = v.sel(v.cmp("<", x, v.c(-20.0)), v.c(-0.0), res)
    res = v.sel(v.cmp("==", x, v.c(-math.inf)), v.c(math.nan), res)
    return _subnormal_half(v, x, res)


def _subnormal_half(v: V, x, res):
    """NaN passes; subnormal x (computed as 0) gives x / 2: gelu_erf(x) = x (1 + erf(..)) / 2."""
    return v.sel(v.isnan(x), x, v.subnormal_times(x, 0.5, res))


def erf(v: V, x):
    """erf(x); erf(-0) = -0, erf(+-inf) = +-1.  |x| is clamped where erf rounds to +-1
    (ERF_ONE): beyond it e^(-x^2) and its scaled pieces would be subnormal, and every op
    producing one takes a microcode assist (erf over U(-10, 10): 4x slower)."""
    if v.key == "f32":
        return _erf32(v, x)
    C = _ERF64
    a = v.cap(v.abs(v.flush_subnormal(x)), ERF_ONE["f64"])
    a2, a2_lo = v.two_prod(a, a)
    small = v.mul(a, v.poly(a2, C.small))
    big = v.sub(v.c(1.0), _erfc_big(v, C, a, a2, a2_lo))
    res = v.copysign(v.sel(v.cmp("<", a, v.c(CUT)), small, big), x)
    res = v.subnormal_times(x, C.small[0], res)
    return v.sel(v.isnan(x), x, res)


def gelu_erf(v: V, x):
    """0.5 x (1 + erf(x/sqrt 2)); x < 0 uses 0.5 x erfc(|x|/sqrt 2).  gelu_erf(-inf) = NaN
    (as NumPy's formula gives -inf * 0)."""
    if v.key == "f32":
        return _gelu_erf32(v, x)
    C = _ERF64
    x0, x = x, v.flush_subnormal(x)
    ax = v.abs(x)
    neg = v.cmp("<", x, v.c(0.0))
    a, a_lo = v.two_prod(ax, v.c(_INV_SQRT2[0]))                  # a = |x|/sqrt2 as a double-word
    a_lo = v.fma(ax, v.c(_INV_SQRT2[1]), a_lo)
    a2, a2_lo = v.two_prod(a, a)
    a2_lo = v.fma(v.add(a, a), a_lo, a2_lo)
    half_x = v.mul(x, v.c(0.5))
    sa = v.sel(neg, v.neg(a), a)                                    # x / sqrt 2
    E = v.poly(a2, C.small)
    one_pm = v.fma(sa, E, v.c(1.0))                                 # 1 + erf(x/sqrt2), one rounding
    one_pm = v.fma(v.sel(neg, v.neg(a_lo), a_lo), E, one_pm)
    small = v.mul(half_x, one_pm)
    tail = _erfc_big(v, C, a, a2, a2_lo, half_x, a_lo)             # 0.5 x erfc(a)
    big = v.sel(neg, tail, v.sub(x, tail))                          # x >= 0: x - 0.5 x erfc(a)
    res = v.sel(v.cmp("<", a, v.c(CUT)), small, big)
    res = v.sel(v.cmp("<", x, v.c(C.gelu_zero)), v.c(-0.0), res)
    res = v.sel(v.cmp(">", x, v.c(-C.gelu_zero)), x, res)          # erfc term below 2^-600
    res = v.sel(v.cmp("==", x, v.c(-math.inf)), v.c(math.nan), res)
    return _subnormal_half(v, x0, res)
