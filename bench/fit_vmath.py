"""Derive the polynomial / rational coefficients used by lazycandle/codegen/vmath*.py.

Run: .venv/bin/python bench/fit_vmath.py [name ...]   (needs mpmath: bench-only dependency)

* `remez`: minimax fit of F(x) by sum(c_j * x**p_j) under weight w(x) (Remez exchange on a
  dense grid, all arithmetic in mpmath at 50 digits).
* `rational`: near-minimax P(x)/Q(x) by Loeb's linearised least squares with Lawson
  re-weighting (weighted relative error), again in mpmath.

Each fit prints the coefficient list (repr of the double, or of the float32 for the f32 sets)
and the max weighted error, which is what vmath's constant tables contain.
"""
from __future__ import annotations

import sys

import mpmath as mp
import numpy as np

mp.mp.dps = 50


def _grid(a, b, n):
    """Chebyshev-distributed points on [a, b] (dense near the ends)."""
    return [mp.mpf(a) + (mp.mpf(b) - a) * (1 - mp.cos(mp.pi * i / (n - 1))) / 2 for i in range(n)]


def _extrema(xs, es, count):
    """Alternating local extrema of the error curve, trimmed to `count` points."""
    idx = [0]
    for i in range(1, len(xs) - 1):
        if (es[i] >= es[i - 1] and es[i] >= es[i + 1]) or (es[i] <= es[i - 1] and es[i] <= es[i + 1]):
            idx.append(i)
    idx.append(len(xs) - 1)
    # merge same-sign neighbours, keeping the larger magnitude
    alt = []
    for i in idx:
        if alt and mp.sign(es[alt[-1]]) == mp.sign(es[i]):
            if abs(es[i]) > abs(es[alt[-1]]):
                alt[-1] = i
        else:
            alt.append(i)
    while len(alt) > count:   # drop the smaller end point
        if abs(es[alt[0]]) < abs(es[alt[-1]]):
            alt.pop(0)
        else:
            alt.pop()
    return alt


def remez(F, w, powers, a, b, iters=30, grid=3000, verbose=False):
    """Minimax coefficients c for F(x) ~ sum c_j x**powers[j] with error weight w(x)."""
    n = len(powers)
    xs = _grid(a, b, grid)
    Fs = [F(x) for x in xs]
    ws = [w(x) for x in xs]
    ref = [xs[int(round(i * (grid - 1) / n))] for i in range(n + 1)]
    best = None
    for it in range(iters):
        A = mp.matrix(n + 1, n + 1)
        rhs = mp.matrix(n + 1, 1)
        for i, x in enumerate(ref):
            for j, p in enumerate(powers):
                A[i, j] = x ** p
            A[i, n] = (-1) ** i / w(x)
            rhs[i] = F(x)
        sol = mp.lu_solve(A, rhs)
        c = [sol[j] for j in range(n)]
        es = [ws[i] * (Fs[i] - sum(cj * xs[i] ** p for cj, p in zip(c, powers))) for i in range(len(xs))]
        emax = max(abs(e) for e in es)
        if verbose:
            print(it, mp.nstr(emax, 5), mp.nstr(abs(sol[n]), 5))
        if best is None or emax < best[1]:
            best = (c, emax)
        alt = _extrema(xs, es, n + 1)
        if len(alt) < n + 1 or emax <= abs(sol[n]) * (1 + mp.mpf("1e-6")):
            break
        ref = [xs[i] for i in alt]
    return best


def rational(F, a, b, nd, dd, iters=40, npts=None, verbose=False, var=lambda x: x, scale=None):
    """Near-minimax rational P(v)/Q(v), v = var(x), deg P = nd, deg Q = dd, Q(0) = 1, error
    relative to scale(x) (default: to F(x))."""
    scale = scale or F
    npts = npts or 6 * (nd + dd + 2)
    xs = _grid(a, b, npts)
    vs = [var(x) for x in xs]
    Fs = [F(x) for x in xs]
    Ss = [scale(x) for x in xs]
    lw = [mp.mpf(1)] * npts           # Lawson weights
    qprev = [mp.mpf(1)] * npts
    best = None
    m = nd + 1 + dd
    for it in range(iters):
        A = mp.matrix(npts, m)
        rhs = mp.matrix(npts, 1)
        for i in range(npts):
            s = mp.sqrt(lw[i]) / (Ss[i] * qprev[i])
            for j in range(nd + 1):
                A[i, j] = s * vs[i] ** j
            for j in range(1, dd + 1):
                A[i, nd + j] = -s * Fs[i] * vs[i] ** j
            rhs[i] = s * Fs[i]
        sol = mp.qr_solve(A, rhs)[0]
        P = [sol[j] for j in range(nd + 1)]
        Q = [mp.mpf(1)] + [sol[nd + j] for j in range(1, dd + 1)]
        qv = [mp.polyval(Q[::-1], v) for v in vs]
        es = [(mp.polyval(P[::-1], v) / q - f) / sc for v, q, f, sc in zip(vs, qv, Fs, Ss)]
        emax = max(abs(e) for e in es)
        if verbose:
            print(it, mp.nstr(emax, 5))
        if best is None or emax < best[2]:
            best = (P, Q, emax)
        qprev = qv
        tot = sum(l * abs(e) for l, e in zip(lw, es))
        lw = [l * abs(e) / tot * npts for l, e in zip(lw, es)]
    # check on a much denser grid
    xs2 = _grid(a, b, 4000)
    P, Q, _ = best
    e2 = max(abs((mp.polyval(P[::-1], var(x)) / mp.polyval(Q[::-1], var(x)) - F(x)) / scale(x)) for x in xs2)
    return P, Q, e2


def _show(name, c, err, f32=False):
    conv = (lambda v: repr(float(np.float32(float(v))))) if f32 else (lambda v: repr(float(v)))
    print(f"{name}: max weighted error {mp.nstr(err, 4)} (2^{float(mp.log(err, 2)):.1f})")
    print("    (" + ", ".join(conv(v) for v in c) + ")")


# ---- the fits -------------------------------------------------------------------------------
LN2H = mp.log(2) / 2 * (1 + mp.mpf(2) ** -20)
SMAX = (mp.sqrt(2) - 1) / (mp.sqrt(2) + 1) * (1 + mp.mpf(2) ** -20)
PIO4 = mp.pi / 4 * (1 + mp.mpf(2) ** -20)
EPS = mp.mpf(10) ** -30


def fit_exp():
    # e^r = 1 + r + sum_{j>=2} c_j r^j on [-ln2/2, ln2/2], relative error
    F = lambda r: mp.exp(r) - 1 - r
    w = lambda r: 1 / mp.exp(r)
    for name, deg, f32 in (("exp f32", 6, True), ("exp f64", 11, False)):
        c, e = remez(F, w, list(range(2, deg + 1)), -LN2H, LN2H)
        _show(name + " c2..", c, e, f32)


def fit_log():
    # 2 atanh(s) = 2s + s^3 Q(z), z = s^2 in [0, smax^2]; error relative to 2s weighs dQ by z/2
    F = lambda z: (2 * mp.atanh(mp.sqrt(z)) - 2 * mp.sqrt(z)) / mp.sqrt(z) ** 3
    c, e = remez(F, lambda z: z / 2, list(range(3)), EPS, SMAX ** 2)
    _show("log f32 Q", c, e, True)
    # f64: Q(z) = 2/3 + z Q2(z) with 2/3 exact (powf's double-double log uses exactly 2/3)
    F2 = lambda z: (F(z) - mp.mpf(2) / 3) / z
    c, e = remez(F2, lambda z: z * z / 2, list(range(7)), mp.mpf(10) ** -8, SMAX ** 2)
    _show("log f64 Q (after the leading 2/3)", c, e)


def fit_tanh(t32=0.625, t64=0.625):
    F = lambda z: (mp.tanh(mp.sqrt(z)) - mp.sqrt(z)) / mp.sqrt(z) ** 3
    w = lambda z: z * mp.sqrt(z) / mp.tanh(mp.sqrt(z))
    for name, t, deg, f32 in (("tanh f32", t32, 4, True), ("tanh f64", t64, 10, False)):
        c, e = remez(F, w, list(range(deg + 1)), EPS, mp.mpf(t) ** 2)
        _show(f"{name} [0,{t}] P", c, e, f32)


def fit_trig():
    Fs = lambda z: (mp.sin(mp.sqrt(z)) - mp.sqrt(z)) / mp.sqrt(z) ** 3
    ws = lambda z: z * mp.sqrt(z) / mp.sin(mp.sqrt(z))
    Fc = lambda z: (mp.cos(mp.sqrt(z)) - 1 + z / 2) / z ** 2
    wc = lambda z: z ** 2 / mp.cos(mp.sqrt(z))
    for name, ds, dc in (("f32 (evaluated in f64)", 2, 2), ("f64", 5, 5)):
        c, e = remez(Fs, ws, list(range(ds + 1)), EPS, PIO4 ** 2)
        _show(f"sin {name} S", c, e)
        c, e = remez(Fc, wc, list(range(dc + 1)), mp.mpf(10) ** -8, PIO4 ** 2)
        _show(f"cos {name} C", c, e)


ERF_CUT = mp.mpf("0.5")


def fit_erf():
    # erf(x) = x E(x^2) on [0, 0.84375], relative error; f32 coefficients are evaluated in double
    F = lambda z: mp.erf(mp.sqrt(z)) / mp.sqrt(z)
    w = lambda z: 1 / F(z)
    for name, deg in (("f32 (evaluated in f64)", 4), ("f64", 8)):
        c, e = remez(F, w, list(range(deg + 1)), EPS, ERF_CUT ** 2)
        _show(f"erf {name} E", c, e)


def fit_erfc():
    # f32 (evaluated in double): erfc(a) = exp(-a^2) P(a)/Q(a) on [0.84375, 10.5], relative error
    F = lambda a: mp.erfc(a) * mp.exp(a * a)
    P, Q, e = rational(F, ERF_CUT, 10.5, 4, 5)
    _show("erfc f32 (evaluated in f64) P", P, e)
    _show("erfc f32 (evaluated in f64) Q", Q, e)
    # f64: erfc(a) = exp(-a^2) (c + h(a)) / a, c = double(1/sqrt(pi)), h = P/Q small, so the
    # rounding errors of evaluating h are damped; error relative to c + h
    c = mp.mpf(float(1 / mp.sqrt(mp.pi)))
    H = lambda a: a * mp.erfc(a) * mp.exp(a * a) - c
    P, Q, e = rational(H, ERF_CUT, 27.5, 8, 10, scale=lambda a: H(a) + c)
    _show("erfc f64 h P", P, e)
    _show("erfc f64 h Q", Q, e)


def table_intervals(offset, first_exp):
    """The 32 intervals of s >= 0 of an f32 table-driven function, by table slot: slot j holds
    the s whose t = s + offset (rounded; 4 binades from 2^first_exp) has (bits(t) >> 20) & 31
    == j, i.e. each binade of t cut in eighths.  (lo, hi, centre): widened by 2^-20 t for the
    rounding of s + offset; the centre is the unwidened one."""
    out = {}
    for e in range(first_exp, first_exp + 4):
        for m in range(8):
            t_lo, t_hi = 2.0 ** e * (1 + m / 8), 2.0 ** e * (1 + (m + 1) / 8)
            slot = int((np.float32(t_lo).view(np.uint32) >> 20) & 31)
            out[slot] = (max(0.0, t_lo * (1 - 2.0 ** -20) - offset), t_hi * (1 + 2.0 ** -20) - offset,
                         (t_lo + t_hi) / 2 - offset)
    return [out[j] for j in range(32)]


def fit_table(G, offset, first_exp, deg=5, odd_at_0=False):
    """One minimax polynomial (relative error) of G(s) in u = s - centre per interval of
    table_intervals(offset, first_exp); odd_at_0: the interval starting at s = 0 is centred
    at 0 with no constant term (G(0) = 0, relative accuracy down to 0).  Returns (centres,
    f32 coefficient rows by power, the f32 remainders c1 - f32(c1), max relative error)."""
    mp.mp.dps = 30
    centres, rows, c1_lo, worst = [], [[] for _ in range(deg + 1)], [], 0
    for lo, hi, c in table_intervals(offset, first_exp):
        zero = odd_at_0 and lo == 0.0
        c = 0.0 if zero else c
        powers = list(range(1 if zero else 0, deg + 1))
        coeffs, e = remez(lambda u: G(u + c), lambda u: 1 / G(u + c), powers,
                          mp.mpf(lo) - c + (mp.mpf(10) ** -12 if zero else 0), mp.mpf(hi) - c, iters=12, grid=400)
        coeffs = [mp.mpf(0)] * (len(rows) - len(powers)) + list(coeffs)
        centres.append(c)
        for j in range(deg + 1):
            rows[j].append(float(np.float32(float(coeffs[j]))))
        c1_lo.append(float(np.float32(float(coeffs[1] - mp.mpf(rows[1][-1])))))
        worst = max(worst, float(e))
    mp.mp.dps = 50
    return centres, rows, c1_lo, worst


def _show_table(name, centres, rows, c1_lo, worst):
    print(f"{name}: degree {len(rows) - 1}, max relative error {worst:.3g}")
    print("centres", tuple(centres))
    for j, r in enumerate(rows):
        print(f"c{j}", tuple(r))
    print("c1 - f32(c1)", tuple(c1_lo))


def fit_gelu_erf32_table(deg=5):
    """f32 gelu_erf: erfc(s / sqrt 2) = e^(-s^2/2) G(s), s = |x| in [0, 15), t = s + 1."""
    _show_table("gelu_erf f32 G", *fit_table(lambda s: mp.erfc(s / mp.sqrt(2)) * mp.exp(s * s / 2), 1.0, 0, deg))


def fit_erf32_table(deg=5):
    """f32 erf: erf(s), s = |x| in [0, 4], t = s + 0.5; the first interval odd (erf(0) = 0)."""
    _show_table("erf f32", *fit_table(mp.erf, 0.5, -1, deg, odd_at_0=True))


FITS = {"exp": fit_exp, "log": fit_log, "tanh": fit_tanh, "trig": fit_trig, "erf": fit_erf, "erfc": fit_erfc,
        "erf32_table": fit_erf32_table, "gelu_erf32_table": fit_gelu_erf32_table}

if __name__ == "__main__":
    for n in sys.argv[1:] or list(FITS):
        FITS[n]()
