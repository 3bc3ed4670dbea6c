"""sin and cos with accurate argument reduction over the whole float range.

x = k pi/2 + r, |r| <= pi/4, then sin/cos of r by odd/even minimax polynomials and the
quadrant k mod 4 picks and signs one of them.  All reduction is done in double:

* moderate |x|: Cody-Waite with pi/2 split into three doubles and fma (the first step is exact);
  for f64 the second step is error-free too, so r comes out as a double-double.
* huge |x| (from 2^40 for f32, 2^32 for f64): Payne-Hanek.  x = m 2^(e-p) with an integer
  mantissa m, and x 2/pi mod 4 = m T(e) mod 4 with T(e) = 2^(e-p) 2/pi mod 4 read from a table
  (2 doubles per exponent for f32, 4 for f64: m T is formed from exact products, reduced mod 4
  piecewise and summed with error-free transforms).

f32 inputs are reduced in double; r is then split into a float pair and the polynomials run in
f32 on all lanes.  The Payne-Hanek block runs only when some lane of the vector needs it (a
conditional branch: emit() may add basic blocks and leaves the builder in the join block), and
its table loads are per-lane extract / load / insert.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import llvmlite.ir as ir

from .llvmutil import F64, call_intrinsic
from .vmath_core import V, lane_loads


@lru_cache(maxsize=None)
def _two_over_pi_bits(nbits: int) -> int:
    """floor(2/pi * 2^nbits), from pi by Machin's formula in integer arithmetic."""
    guard = nbits + 64
    one = 1 << guard

    def atan_inv(n):
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k += 2
            sign = -sign
        return total

    pi = 16 * atan_inv(5) - 4 * atan_inv(239)
    return (2 * one * (1 << nbits)) // pi


@dataclass(frozen=True)
class _TrigConsts:
    mant: int            # explicit mantissa bits of the input format
    emin_big: int        # |x| >= 2^emin_big takes the Payne-Hanek path
    emax: int
    parts: int           # doubles per table entry
    dd_reduce: bool      # keep r as a double-double (f64)
    sin_c: tuple         # sin r = r + r^3 S(r^2)
    cos_c: tuple         # cos r = 1 - r^2/2 + r^4 C(r^2)


_TRIG = {
    "f32": _TrigConsts(23, 40, 127, 2, False,
                       (-0.16666654609482548, 0.008332160757462969, -0.00019515282575821948),
                       (0.0416666456828542, -0.0013887316248309529, 2.4433156351822776e-05)),
    "f64": _TrigConsts(52, 32, 1023, 4, True,
                       (-0.1666666666666663, 0.008333333333322118, -0.0001984126982958944,
                        2.755731362135088e-06, -2.5050747757289207e-08, 1.5896229828028065e-10),
                       (0.041666666666666595, -0.0013888888888873056, 2.4801587288851602e-05,
                        -2.7557314179266835e-07, 2.087570083781765e-09, -1.1358536301358819e-11)),
}
_PIO2 = (1.5707963267948966, 6.123233995736766e-17, -1.4973849048591698e-33)   # pi/2 = sum
_INV_PIO2 = 0.6366197723675814
_ROUND = 6755399441055744.0        # 1.5 * 2^52: adding it rounds to an integer kept in the low bits


@lru_cache(maxsize=None)
def table_values(key: str) -> tuple:
    """T(e) = 2^(e - mant) * 2/pi mod 4 for e = emin_big..emax, each as `parts` 53-bit chunks
    (most significant first; the last chunk's LSB is 2^-(51 + 53 (parts-1)))."""
    C = _TRIG[key]
    frac_bits = 51 + 53 * (C.parts - 1)
    nbits = C.emax - C.mant + frac_bits + 8
    tpi = _two_over_pi_bits(nbits)
    out = []
    for e in range(C.emin_big, C.emax + 1):
        t = (tpi >> (nbits - (e - C.mant) - frac_bits)) & ((1 << (2 + frac_bits)) - 1)
        for j in range(C.parts):
            lo_bit = 53 * (C.parts - 1 - j)
            out.append(math.ldexp((t >> lo_bit) & ((1 << 53) - 1), lo_bit - frac_bits))
    return tuple(out)


def _table(v: V, key: str):
    name = f"lc_vmath_2opi_{key}"
    g = v.b.module.globals.get(name)
    if g is None:
        vals = table_values(key)
        aty = ir.ArrayType(F64, len(vals))
        g = ir.GlobalVariable(v.b.module, aty, name=name)
        g.initializer = ir.Constant(aty, [float(x) for x in vals])
        g.global_constant = True
        g.linkage = "internal"
    return g


def _mod4(v: V, a):
    """a - 4 round(a/4): exact for any double a (result in [-2, 2])."""
    return v.fma(v.roundeven(v.mul(a, v.c(0.25))), v.c(-4.0), a)


def _reduce_big(v: V, key: str, ax):
    """Payne-Hanek for ax = |x| >= 2^emin_big (double context v): returns (k, r_hi, r_lo)."""
    C = _TRIG[key]
    b = v.b
    e = b.sub(b.lshr(v.bits(ax), v.ci(52)), v.ci(1023))
    m = v.mul(ax, v.pow2i(b.sub(v.ci(C.mant), e)))                  # integer mantissa, exact
    nent = C.emax - C.emin_big + 1
    idx = b.sub(e, v.ci(C.emin_big))
    idx = b.select(b.icmp_signed("<", idx, v.ci(0)), v.ci(0), idx)
    idx = b.select(b.icmp_signed(">", idx, v.ci(nent - 1)), v.ci(nent - 1), idx)
    idx = b.mul(idx, v.ci(C.parts))
    g = _table(v, key)
    T = [lane_loads(v, g, b.add(idx, v.ci(j))) for j in range(C.parts)]
    h0, l0 = v.two_prod(m, T[0])
    a = _mod4(v, v.add(_mod4(v, h0), _mod4(v, l0)))                # exact: multiples of 2^-51, |.| <= 4
    h1, l1 = v.two_prod(m, T[1])
    bb, err = v.two_sum(a, h1)
    k = v.roundeven(bb)
    f = v.sub(bb, k)                                                # exact, |f| <= 1/2
    if C.parts == 2:                                                # f32: 2^-80 is plenty
        return k, v.add(f, v.add(err, l1)), None
    s, e1 = v.two_sum(err, l1)
    h2, l2 = v.two_prod(m, T[2])
    s, e2 = v.two_sum(s, h2)
    lo = v.add(v.add(e1, e2), v.fma(m, T[3], l2))
    fh, e3 = v.two_sum(f, s)
    return k, fh, v.add(e3, lo)


def _reduce(v: V, key: str, x):
    """x = k pi/2 + (r_hi + r_lo) in double context v.  Returns (q, r_hi, r_lo): q an i64
    vector whose low bits are k (two's complement), r_lo None for f32."""
    C = _TRIG[key]
    t = v.fma(x, v.c(_INV_PIO2), v.c(_ROUND))                      # k in t's low mantissa bits
    k = v.sub(t, v.c(_ROUND))
    nk = v.neg(k)
    r1 = v.fma(nk, v.c(_PIO2[0]), x)                                # exact for |k| < 2^52
    if C.dd_reduce:
        p, pe = v.two_prod(k, v.c(_PIO2[1]))
        r2, e = v.two_sum(r1, v.neg(p))
        lo = v.fma(nk, v.c(_PIO2[2]), v.sub(e, pe))
        rh, rl = v.fast_two_sum(r2, lo)
    else:
        rh = v.fma(nk, v.c(_PIO2[2]), v.fma(nk, v.c(_PIO2[1]), r1))
        rl = None
    ax = v.abs(x)
    big = v.cmp(">=", ax, v.c(2.0 ** C.emin_big))
    return _huge_lanes(v, key, x, ax, big, (v.bits(t), rh, rl))


def _huge_lanes(v: V, key: str, x, ax, big, moderate):
    """Replace the lanes with |x| >= 2^emin_big by the Payne-Hanek reduction, computed in a
    block that only runs when some lane needs it (huge arguments are rare; the table loads and
    ~50 double ops would otherwise double the cost of every sin / cos).  The builder is left in
    the join block."""
    b = v.b
    any_big = big if v.n == 1 else call_intrinsic(b, "vector.reduce.or", [big], ret=ir.IntType(1))
    start = b.block
    huge = b.append_basic_block("trig_huge")
    join = b.append_basic_block("trig_join")
    b.cbranch(any_big, huge, join)
    b.position_at_end(huge)
    kb, fh, fl = _reduce_big(v, key, ax)
    if fl is None:
        bh, bl = v.mul(fh, v.c(_PIO2[0])), None
    else:
        bh, bl = v.two_prod(fh, v.c(_PIO2[0]))
        bl = v.fma(fh, v.c(_PIO2[1]), v.fma(fl, v.c(_PIO2[0]), bl))
    negx = v.cmp("<", x, v.c(0.0))
    signed = lambda t: v.sel(negx, v.neg(t), t)                    # reduced |x|; sin, cos odd/even
    q, rh, rl = moderate
    merged = (b.select(big, v.bits(v.add(signed(kb), v.c(_ROUND))), q),
              v.sel(big, signed(bh), rh),
              None if rl is None else v.sel(big, signed(bl), rl))
    huge_end = b.block
    b.branch(join)
    b.position_at_end(join)
    out = []
    for m, h in zip(moderate, merged):
        if m is None:
            out.append(None)
            continue
        phi = b.phi(m.type)
        phi.add_incoming(m, start)
        phi.add_incoming(h, huge_end)
        out.append(phi)
    return tuple(out)


def _sincos(v: V, key: str, rh, rl):
    C = _TRIG[key]
    z = v.mul(rh, rh)
    rl0 = v.c(0.0) if rl is None else rl
    s = v.add(rh, v.fma(v.mul(rh, z), v.poly(z, C.sin_c), rl0))
    hz = v.mul(z, v.c(0.5))
    w = v.sub(v.c(1.0), hz)
    tail = v.fma(v.mul(z, z), v.poly(z, C.cos_c), v.neg(v.mul(rh, rl0)))
    c = v.add(w, v.add(v.sub(v.sub(v.c(1.0), w), hz), tail))       # 1 - hz with its rounding error
    return s, c


def _trig(v: V, x, is_cos: bool):
    key = v.key
    w = v if key == "f64" else v.other("f64")
    xd = x if key == "f64" else v.b.fpext(x, w.t)
    q, rh, rl = _reduce(w, key, xd)
    if key == "f32":                                                # r as a float pair, polys in f32
        r32 = v.b.fptrunc(rh, v.t)
        rl = v.b.fptrunc(w.sub(rh, v.b.fpext(r32, w.t)), v.t)
        rh = r32
    s, c = _sincos(v, key, rh, rl)
    if key == "f32":
        q = v.b.trunc(q, v.it)
    if is_cos:
        q = v.b.add(q, v.ci(1))                                     # cos x = sin(x + pi/2)
    swap = v.b.icmp_signed("!=", v.b.and_(q, v.ci(1)), v.ci(0))
    flip = v.b.icmp_signed("!=", v.b.and_(q, v.ci(2)), v.ci(0))
    res = v.sel(swap, c, s)
    res = v.sel(flip, v.neg(res), res)
    if not is_cos:
        res = v.sel(v.cmp("==", x, v.c(0.0)), x, res)              # sin(-0) = -0
    return v.sel(v.isnan(v.sub(x, x)), v.sub(x, x), res)            # inf, NaN -> NaN


def sin(v: V, x):
    """sin(x), NumPy semantics (sin(+-inf) = NaN, sin(-0) = -0)."""
    return _trig(v, x, False)


def cos(v: V, x):
    """cos(x), NumPy semantics."""
    return _trig(v, x, True)
