"""Accuracy sweeps of the vector math library (lazycandle/codegen/vmath*.py).

    .venv/bin/python bench/vmath_accuracy.py                  # full sweep, markdown table
    .venv/bin/python bench/vmath_accuracy.py --quick          # ~10^5 points per function
    .venv/bin/python bench/vmath_accuracy.py exp:f32 sin      # selected functions

Error measure: |ours - exact| / ulp(exact rounded to the dtype), with the ulp of subnormals
(2^-149 / 2^-1074) as the floor, so tiny and denormal results are judged in absolute terms
of the format's smallest step.  No extra atol: the functions are evaluated without
cancellation (gelu / silu use x * sigmoid(2u) and exp's pieces, gelu_erf uses erfc for x < 0),
so relative ulps are meaningful down to the underflow threshold; an exact result that
overflows counts as 0 ulp when we return inf.

References: f32 results against float64 NumPy (math.erf / erfc for erf and gelu_erf);
f64 results against numpy longdouble (x87 80-bit, 11 extra bits) for exp, log, sin, cos, tanh,
sigmoid, silu, elu, powf, and against mpmath (bench-only dependency, 200 bits, carried as
longdouble) for erf, gelu_erf and gelu, whose tails need more than 11 extra bits (fewer
points: mpmath is slow); without mpmath those three fall back to longdouble / math.erf.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from lazycandle.codegen import vmath_run

TARGET = {  # max ulp allowed, per dtype
    "f32": {"exp": 1, "log": 1, "sin": 2, "cos": 2, "tanh": 2, "erf": 2, "sigmoid": 2,
            "gelu": 4, "gelu_erf": 4, "silu": 4, "elu": 4, "powf": 2, "sqrt": 0.5, "recip": 0.5},
    "f64": {"exp": 1, "log": 1, "sin": 2, "cos": 2, "tanh": 2, "erf": 2, "sigmoid": 2,
            "gelu": 2, "gelu_erf": 2, "silu": 2, "elu": 2, "powf": 2, "sqrt": 0.5, "recip": 0.5},
}
DT = {"f32": np.float32, "f64": np.float64}
K1 = 0.7978845608028654
K2 = 0.044715
ELU_ALPHA = 1.5
POW_EXPONENTS = (0.1, 1 / 3, 2.5, -1.7, 3.0, -3.0, 17.0, -0.5, 7.25, 1000.5)

try:
    import mpmath
except ImportError:                      # pragma: no cover - depends on the environment
    mpmath = None


# ---- inputs --------------------------------------------------------------------------------
def _bits(rng, n, dt):
    """Random bit patterns: every finite binade (and subnormals) equally likely, both signs."""
    if dt == np.float32:
        x = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    else:
        x = rng.integers(0, 2 ** 64, n, dtype=np.uint64).view(np.float64)
    return x[np.isfinite(x)].astype(dt)


def specials(dt):
    """The special values every function is checked on."""
    fi = np.finfo(dt)
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, fi.tiny, -fi.tiny, fi.smallest_subnormal,
         -fi.smallest_subnormal, fi.max, -fi.max, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-30, -1e-30,
         88.72, 88.73, -87.33, -103.97, -104.0, -110.0, 709.78, 709.79, -745.13, -745.14, -746.0,
         20.0, -20.0, 3.0, -3.0, 6.0, -6.0, 10.0, -10.0, 14.0, -14.5, 40.0, -40.0, 1e5, -1e5,
         1e10, -1e10, 1e20, -1e20, 1e38, -1e38, 1e300, -1e300, math.pi, -math.pi, math.pi / 2]
    with np.errstate(over="ignore"):
        return np.array(v, dtype=np.float64).astype(dt)


DOMAINS = {  # name -> list of (kind, lo, hi) per dtype key ("" = both)
    "exp": {"f32": [("u", -104, 89)], "f64": [("u", -746, 710), ("u", -1, 1)]},
    "log": {"": [("pos",)]},
    "sin": {"": [("u", -4, 4), ("u", -1e5, 1e5), ("bits",)]},
    "cos": {"": [("u", -4, 4), ("u", -1e5, 1e5), ("bits",)]},
    "tanh": {"": [("u", -10, 10), ("u", -1, 1), ("bits",)]},
    "erf": {"": [("u", -6, 6), ("u", -1, 1), ("bits",)]},
    "sigmoid": {"f32": [("u", -105, 90)], "f64": [("u", -750, 710), ("u", -5, 5)]},
    "silu": {"f32": [("u", -112, 90)], "f64": [("u", -750, 710), ("u", -5, 5)]},
    "gelu": {"f32": [("u", -14, 12), ("u", -3, 3)], "f64": [("u", -40, 40), ("u", -3, 3)]},
    "gelu_erf": {"f32": [("u", -15, 12), ("u", -3, 3)], "f64": [("u", -40, 40), ("u", -3, 3)]},
    "elu": {"": [("u", -20, 5), ("u", -1e-3, 1e-3)]},
    "powf": {"": [("pow",)]},
    "sqrt": {"": [("pos",)]},
    "recip": {"": [("bits",)]},
}


def inputs(name, key, n, seed=0):
    """n-ish inputs spread over the function's domains (plus the special values)."""
    dt = DT[key]
    rng = np.random.default_rng(seed)
    doms = DOMAINS[name].get(key) or DOMAINS[name][""]
    per = max(1, n // len(doms))
    parts = [specials(dt)]
    for d in doms:
        if d[0] == "u":
            parts.append(rng.uniform(d[1], d[2], per).astype(dt))
        elif d[0] == "bits":
            parts.append(_bits(rng, per, dt))
        elif d[0] in ("pos", "pow"):
            parts.append(np.abs(_bits(rng, per // 2, dt)))
            parts.append(rng.uniform(0.25, 4, per - per // 2).astype(dt))
    return np.concatenate(parts)


# ---- references ------------------------------------------------------------------------------
def _ld_or_f64(key):
    return np.longdouble if key == "f64" else np.float64


def _sigmoid_ref(x, T):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _mp_ref(fn, x):
    """longdouble reference from mpmath at 200 bits (hi double + scaled low part)."""
    mpmath.mp.prec = 200
    out = np.empty(x.size, dtype=np.longdouble)
    for i, v in enumerate(x.astype(np.float64)):
        if not math.isfinite(v):
            out[i] = np.nan
            continue
        r = fn(mpmath.mpf(float(v)))
        h = float(r)
        lo = float(mpmath.ldexp(r - h, 1100)) if math.isfinite(h) else 0.0
        out[i] = np.longdouble(h) + np.longdouble(lo) * np.longdouble(2.0) ** -1100
    return out


def _mp_fn(name, params):
    mp = mpmath
    mp.mp.prec = 200            # before the constants: at mpmath's default 53 bits, K1 and K2
    #                             would be their doubles, not the decimals (~100 ulp in gelu's tail)
    if name == "erf":
        return lambda x: mp.sign(x) if abs(x) > 30 else mp.erf(x)
    if name == "gelu_erf":
        return lambda x: x if x > 60 else mp.mpf(0) if x < -60 else x * mp.erfc(-x / mp.sqrt(2)) / 2
    if name == "gelu":
        k1, k2 = mp.mpf(str(K1)), mp.mpf(str(K2))
        return lambda x: x / (1 + mp.exp(-2 * k1 * (x + k2 * x ** 3)))
    raise KeyError(name)


def reference(name, x, params=(), use_mp=True):
    """Exact-ish values of name(x): float64 for f32 inputs, longdouble for f64 inputs."""
    key = "f32" if x.dtype == np.float32 else "f64"
    if key == "f64" and use_mp and mpmath is not None and name in ("erf", "gelu_erf", "gelu"):
        return _mp_ref(_mp_fn(name, params), x)
    T = _ld_or_f64(key)
    xs = x.astype(T)
    with np.errstate(all="ignore"):
        if name in ("exp", "log", "sin", "cos", "tanh", "sqrt"):
            r = getattr(np, name)(xs)
        elif name == "recip":
            r = 1 / xs
        elif name == "sigmoid":
            r = _sigmoid_ref(xs, T)
        elif name == "silu":
            r = xs * _sigmoid_ref(xs, T)
        elif name == "gelu":
            r = xs * _sigmoid_ref(2 * T(K1) * (xs + T(K2) * xs ** 3), T)
        elif name == "elu":
            a = float(np.float32(params[0])) if key == "f32" else params[0]
            r = np.where(xs >= 0, xs, T(a) * np.expm1(xs))
        elif name == "powf":
            e = float(np.float32(params[0])) if key == "f32" else params[0]
            r = np.power(xs, T(e))
        elif name in ("erf", "gelu_erf"):
            f = math.erf if name == "erf" else (lambda v: 0.5 * v * math.erfc(-v / math.sqrt(2)))
            r = np.frompyfunc(lambda v: f(float(v)) if math.isfinite(v) else np.nan, 1, 1)(
                x.astype(np.float64)).astype(np.float64)
        else:
            raise KeyError(name)
    return np.asarray(r).astype(T)


def ulp_errors(got, ref):
    """|got - ref| in ulps of ref rounded to got's dtype (subnormal ulp as the floor), computed
    in ref's precision.  NaN where the reference is not finite (checked as special values)."""
    dt, T = got.dtype, ref.dtype
    with np.errstate(all="ignore"):
        rd = ref.astype(dt)
        sp = np.maximum(np.spacing(np.abs(rd)).astype(T), T.type(np.finfo(dt).smallest_subnormal))
        err = (np.abs(got.astype(T) - ref) / sp).astype(np.float64)
    err[np.isinf(rd) & (got == rd)] = 0.0          # overflow to inf on both sides
    err[~np.isfinite(ref)] = np.nan
    return err


def run_threads(name, x, params=(), threads=2):
    """vmath_run.run over `threads` slices of x at once (Python threads: the kernel call releases
    the GIL) -- this harness's own parallelism for long sweeps; the engine's is native_pool."""
    x = np.ascontiguousarray(x)
    if threads <= 1 or x.size < 1 << 16:
        return vmath_run.run(name, x, *params)
    from concurrent.futures import ThreadPoolExecutor
    flat, out = x.reshape(-1), np.empty(x.size, x.dtype)
    cuts = np.linspace(0, x.size, threads + 1).astype(int)
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda k: vmath_run.run(name, flat[cuts[k]:cuts[k + 1]], *params, out=out[cuts[k]:cuts[k + 1]]),
                    range(threads)))
    return out.reshape(x.shape)


def measure(name, key, n, params=(), threads=2, use_mp=True, x=None):
    """(max ulp, argmax input, points) for name on dtype key."""
    if x is None:
        x = inputs(name, key, n)
    got = run_threads(name, x, params, threads)
    err = ulp_errors(got, reference(name, x, params, use_mp))
    if not np.isfinite(err).any():
        return 0.0, None, x.size
    i = int(np.nanargmax(err))
    return float(err[i]), x[i], x.size


EXHAUSTIVE = {"exp": (-87.0, 88.0), "tanh": (2.0 ** -14, 10.5)}   # f32 ranges swept in full
#   (tanh is odd by a copysign and x below 2^-14 is scale-invariant, so its positive part is enough)


def exhaustive_f32(name, chunk=1 << 24, threads=2):
    """Every float32 in EXHAUSTIVE[name] through name, against float64 (reference())."""
    lo, hi = EXHAUSTIVE[name]
    a = int(np.float32(lo).view(np.uint32))       # negative floats: bits grow with magnitude
    b = int(np.float32(hi).view(np.uint32))
    ranges = [(0x80000000, a), (0, b)] if lo < 0 else [(a, b)]
    worst, where, count = 0.0, None, 0
    for start, stop in ranges:
        s = int(start)
        while s <= int(stop):
            e = min(s + chunk, int(stop) + 1)
            x = np.arange(s, e, dtype=np.uint64).astype(np.uint32).view(np.float32)
            got = run_threads(name, x, (), threads)
            err = ulp_errors(got, reference(name, x))
            i = int(np.argmax(err))
            if err[i] > worst:
                worst, where = float(err[i]), x[i]
            count += x.size
            s = e
    return worst, where, count


def sweep(names, n, n_mp, threads=2, out=sys.stdout):
    rows = []
    for spec in names:
        name, _, only = spec.partition(":")
        for key in (("f32", "f64") if not only else (only,)):
            t0 = time.time()
            exps = POW_EXPONENTS if name == "powf" else [ELU_ALPHA] if name == "elu" else [None]
            worst = (0.0, None, 0, None)
            for p in exps:
                params = () if p is None else (p,)
                heavy = key == "f64" and name in ("erf", "gelu_erf", "gelu") and mpmath is not None
                m = measure(name, key, (n_mp if heavy else n) // len(exps), params, threads)
                if m[0] >= worst[0]:
                    worst = (*m, p)
            err, where, npts, p = worst
            ref = ("mpmath" if (key == "f64" and name in ("erf", "gelu_erf", "gelu") and mpmath)
                   else "longdouble" if key == "f64" else "float64")
            rows.append((name, key, err, where, p, n_mp if ref == "mpmath" else n, ref, time.time() - t0))
            pstr = f" (param {p:g})" if p is not None else ""
            ok = "ok" if err <= TARGET[key][name] else "OVER"
            print(f"| {name} | {key} | {err:.3f} | {where!r}{pstr} | {rows[-1][5]:.0e} | {ref} | "
                  f"{TARGET[key][name]} {ok} |", file=out, flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="function or function:f32 / function:f64 (default: all)")
    ap.add_argument("--quick", action="store_true", help="10^5 points per function, no exhaustive exp")
    ap.add_argument("-n", type=int, default=10_000_000, help="points per function and dtype")
    ap.add_argument("--mp-points", type=int, default=200_000, help="points for the mpmath-checked f64 ones")
    ap.add_argument("--no-exhaustive", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    n, n_mp = (100_000, 20_000) if args.quick else (args.n, args.mp_points)
    names = args.names or list(TARGET["f32"])
    print("| function | dtype | max ulp | at x | points | reference | target |")
    print("|---|---|---|---|---|---|---|")
    for name, (lo, hi) in EXHAUSTIVE.items():
        if args.quick or args.no_exhaustive or (args.names and name not in args.names
                                                and f"{name}:f32" not in args.names):
            continue
        t0 = time.time()
        err, where, cnt = exhaustive_f32(name, threads=args.threads)
        target = TARGET["f32"][name]
        print(f"| {name} (every f32 in [{lo:g}, {hi:g}]) | f32 | {err:.3f} | {where!r} | {cnt} | float64 | "
              f"{target} {'ok' if err <= target else 'OVER'} |", flush=True)
        print(f"<!-- exhaustive {name}: {time.time() - t0:.0f} s -->", file=sys.stderr)
    sweep(names, n, n_mp, args.threads)


if __name__ == "__main__":
    main()
