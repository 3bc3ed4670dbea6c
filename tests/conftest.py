"""Shared helpers for the lazycandle test suite: dtype lists, deterministic test data, a
high-precision NumPy oracle and comparisons that follow SPEC's tolerances.

Tolerances ("match NumPy", SPEC.md):
  * integers, comparisons, copies, views, exact ops: bit-exact (NaN positions must match);
  * f64: rtol 1e-12 for + - * / (and other rounding ops), 1e-13 for transcendentals;
  * f32: rtol 1e-6 / atol 1e-6 elementwise, with a 4-ulp allowance for transcendentals;
  * f16 / bf16 / f8e4m3: the f32 result rounded once to the type, within 1 ulp of the type.
The oracle evaluates the op in long double on the exactly decoded inputs, so the reference is
(almost always) the correctly rounded value; for the low-precision dtypes it is rounded to f32
and then to the target, exactly as `op(x.astype(f32)).astype(target)`.
"""
from __future__ import annotations

import atexit
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import pytest

# The disk kernel cache is on by default (~/.cache/lazycandle): a session that has not chosen
# a directory gets its own, deleted at exit, so the suite neither reads nor fills the user's.
if not os.environ.get("LAZYCANDLE_CACHE_DIR"):
    os.environ["LAZYCANDLE_CACHE_DIR"] = tempfile.mkdtemp(prefix="lazycandle-test-cache-")
    atexit.register(shutil.rmtree, os.environ["LAZYCANDLE_CACHE_DIR"], True)

import lazycandle as lc     # noqa: E402 - after the cache directory is chosen

# ---- dtypes ------------------------------------------------------------------------------
ALL_DTYPES = [lc.u8, lc.u32, lc.i16, lc.i32, lc.i64, lc.bf16, lc.f16, lc.f32, lc.f64, lc.f8e4m3,
              lc.f6e2m3, lc.f6e3m2, lc.f4, lc.f8e8m0]
STORAGE_ONLY = [lc.f6e2m3, lc.f6e3m2, lc.f4, lc.f8e8m0]
COMPUTE = [d for d in ALL_DTYPES if d not in STORAGE_ONLY]
FLOATS = [lc.bf16, lc.f16, lc.f32, lc.f64, lc.f8e4m3]
INTS = [lc.u8, lc.u32, lc.i16, lc.i32, lc.i64]
LOWP = [lc.bf16, lc.f16, lc.f8e4m3]

HP = np.longdouble          # oracle precision (80-bit extended on x86-64)


def ids(dts):
    return [d.name for d in dts]


def is_lowp(dt) -> bool:
    return dt in LOWP


# ---- test data ----------------------------------------------------------------------------
SPECIAL_FLOATS = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 2.5, 3.0, -7.0]


def rng_for(*key) -> np.random.Generator:
    """A deterministic generator per test case (stable across runs and orderings)."""
    h = 0
    for part in key:
        for ch in str(part):
            h = (h * 131 + ord(ch)) % (1 << 61)
    return np.random.default_rng(h)


def int_info(dt):
    return np.iinfo(dt.numpy)


def float_data(dt, shape, rng, domain="any"):
    """Float data in `dt.numpy`, values rounded to the type.

    domain: any  (symmetric, |x| <= ~4, includes halves and small integers)
            wide (normal * 3, clipped to +-8)
            pos  (0.05 .. 8)
            nonzero (|x| in 0.1 .. 6)
            away (|x| in 0.1 .. 3, avoids cancellation near 0 in composite ops)
    """
    n = int(np.prod(shape)) if len(shape) else 1
    if domain == "pos":
        v = rng.uniform(0.05, 8.0, n)
    elif domain == "nonzero":
        v = rng.uniform(0.1, 6.0, n) * rng.choice([-1.0, 1.0], n)
    elif domain == "away":
        v = rng.uniform(0.1, 3.0, n) * rng.choice([-1.0, 1.0], n)
    elif domain == "wide":
        v = np.clip(rng.normal(0, 3.0, n), -8, 8)
    else:
        v = rng.uniform(-4.0, 4.0, n)
        # sprinkle exact halves / integers so rounding ops see ties
        k = rng.random(n) < 0.25
        v[k] = rng.integers(-8, 9, k.sum()) / 2.0
    v = v.reshape(shape)
    if dt is lc.f64:
        return v.astype(np.float64)
    return v.astype(np.float32).astype(dt.numpy)


def int_data(dt, shape, rng, domain="any"):
    info = int_info(dt)
    if domain == "small":
        lo, hi = (0, 60) if info.min == 0 else (-30, 30)
    else:
        lo, hi = int(info.min), int(info.max)
    v = rng.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64 if dt is not lc.u32 else np.uint64)
    v = np.asarray(v).astype(dt.numpy)
    if domain == "any" and v.size >= 4:
        flat = v.reshape(-1)
        # make sure the extremes and small values appear (wrap-around is exercised)
        flat[0], flat[1], flat[2], flat[3] = info.min, info.max, 0, 1
    return v


def data(dt, shape, rng, domain="any"):
    shape = tuple(shape)
    if dt.is_float:
        if domain == "small":
            domain = "any"
        return float_data(dt, shape, rng, domain)
    return int_data(dt, shape, rng, "small" if domain in ("small", "pos", "nonzero", "away") else "any")


def with_specials(arr):
    """Overwrite the first elements of a float array with NaN, +-Inf, +-0 ... (in its dtype)."""
    flat = arr.reshape(-1)
    sp = np.array(SPECIAL_FLOATS, np.float32).astype(arr.dtype)
    k = min(len(sp), flat.size)
    flat[:k] = sp[:k]
    return arr


def to_hp(a) -> np.ndarray:
    """Exact high-precision copy of a numpy / ml_dtypes array."""
    a = np.asarray(a)
    if a.dtype.kind == "f" and a.dtype.itemsize >= 4:
        return a.astype(HP)
    if a.dtype.kind in "iub":
        return a.astype(HP)
    return a.astype(np.float32).astype(HP)    # ml_dtypes types, f16


# ---- the oracle ---------------------------------------------------------------------------
_erf = np.vectorize(math.erf, otypes=[np.float64])
_erfc = np.vectorize(math.erfc, otypes=[np.float64])
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x):
    # 0.5 x (1 + tanh(u)) == x * sigmoid(2u), without cancellation
    u = HP(SQRT_2_OVER_PI) * (x + HP(0.044715) * x * x * x)
    return x * _sigmoid(2 * u)


def _erfc_hp(z):
    """erfc of long-double arguments: math.erfc at the nearest double z0, plus the first-order
    correction for z - z0 (the argument's rounding matters in the tail, where
    d log erfc / dz ~ -2z)."""
    z0 = z.astype(np.float64)
    dz = np.where(np.isfinite(z0), z - z0.astype(HP), HP(0))
    z0h = z0.astype(HP)
    return _erfc(z0).astype(HP) - HP(2) / np.sqrt(HP(np.pi)) * np.exp(-z0h * z0h) * dz


def _gelu_erf(x):
    # 0.5 x (1 + erf(x / sqrt 2)) == 0.5 x erfc(-x / sqrt 2), without cancellation
    with np.errstate(all="ignore"):
        return HP(0.5) * x * _erfc_hp(-x / np.sqrt(HP(2)))


def _round_half_away(x):
    t = np.trunc(x)
    frac = np.abs(x - t)
    return np.where(frac >= 0.5, t + np.sign(x), t)


def _elu(x, alpha):
    return np.where(x > 0, x, HP(alpha) * np.expm1(np.minimum(x, 0)))


# name -> (reference on high precision values, kind); kind "transc" or "arith" or "exact"
UNARY_FLOAT_REF = {
    "exp": (np.exp, "transc"),
    "log": (np.log, "transc"),
    "sin": (np.sin, "transc"),
    "cos": (np.cos, "transc"),
    "tanh": (np.tanh, "transc"),
    "erf": (lambda x: _erf(x.astype(np.float64)).astype(HP), "transc"),
    "gelu": (_gelu, "transc"),
    "gelu_erf": (_gelu_erf, "transc"),
    "silu": (lambda x: x * _sigmoid(x), "transc"),
    "sigmoid": (_sigmoid, "transc"),
    "sqrt": (np.sqrt, "arith"),
    "recip": (lambda x: 1.0 / x, "arith"),
    "neg": (np.negative, "exact"),
    "abs": (np.abs, "exact"),
    "sqr": (lambda x: x * x, "arith"),
    "relu": (lambda x: np.maximum(x, HP(0)), "exact"),
    "sign": (np.sign, "exact"),
    "ceil": (np.ceil, "exact"),
    "floor": (np.floor, "exact"),
    "round": (_round_half_away, "exact"),
}

# parametrised unary ops: name -> (call(t), ref(x_hp, dt), kind)
PARAM_OPS = {
    "affine": (lambda t: t.affine(1.5, -0.25), lambda x: x * HP(1.5) + HP(-0.25), "arith"),
    "affine2": (lambda t: t.affine(-3.0, 2.0), lambda x: x * HP(-3.0) + HP(2.0), "arith"),
    "clamp": (lambda t: t.clamp(-1.5, 2.0), lambda x: np.minimum(np.maximum(x, HP(-1.5)), HP(2.0)), "exact"),
    "powf2": (lambda t: t.powf(2.0), lambda x: np.power(x, HP(2.0)), "transc"),
    # NumPy evaluates x ** 0.5 as sqrt(x): (-inf) ** 0.5 is NaN there (C pow would say +inf)
    "powf0.5": (lambda t: t.powf(0.5), lambda x: np.sqrt(x), "transc"),
    "powf-1.5": (lambda t: t.powf(-1.5), lambda x: np.power(x, HP(-1.5)), "transc"),
    "pow_op3": (lambda t: t ** 3.0, lambda x: np.power(x, HP(3.0)), "transc"),
    "elu1": (lambda t: t.elu(1.0), lambda x: _elu(x, 1.0), "transc"),
    "elu0.5": (lambda t: t.elu(0.5), lambda x: _elu(x, 0.5), "transc"),
}

# which input domain each op is tested on
DOMAIN = {"log": "pos", "sqrt": "pos", "recip": "nonzero", "powf2": "pos", "powf0.5": "pos",
          "powf-1.5": "pos", "pow_op3": "pos", "elu1": "away", "elu0.5": "away", "gelu": "any",
          "gelu_erf": "any", "exp": "any", "silu": "any", "sigmoid": "wide", "tanh": "any"}

FLOAT_ONLY_UNARY = ["exp", "log", "sin", "cos", "tanh", "erf", "gelu", "gelu_erf", "silu", "sigmoid",
                    "sqrt", "recip"]
ALL_DTYPE_UNARY = ["neg", "abs", "sqr", "relu", "sign", "ceil", "floor", "round"]

BINARY_REF = {
    "add": (np.add, "arith"),
    "sub": (np.subtract, "arith"),
    "mul": (np.multiply, "arith"),
    "div": (np.divide, "arith"),
    "maximum": (np.maximum, "exact"),
    "minimum": (np.minimum, "exact"),
}
CMP_REF = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
           "ge": np.greater_equal}


def wrap_int(v: int, dt) -> int:
    bits = dt.size_in_bytes * 8
    v %= 1 << bits
    if dt.is_signed and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def int_div_ref(a, b, dt):
    """Truncating integer division, x/0 -> 0, INT_MIN/-1 wraps."""
    out = []
    for x, y in zip(np.asarray(a).reshape(-1).tolist(), np.asarray(b).reshape(-1).tolist()):
        if y == 0:
            out.append(0)
        else:
            q = abs(x) // abs(y)
            out.append(wrap_int(q if (x < 0) == (y < 0) else -q, dt))
    return np.array(out, dtype=np.int64 if dt is not lc.u32 else np.uint64).astype(dt.numpy).reshape(np.shape(a))


def int_unary_ref(op, x, dt):
    x = np.asarray(x, dt.numpy)
    with np.errstate(over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if op == "neg":
            return (np.zeros_like(x) - x).astype(dt.numpy)
        if op == "abs":
            return np.abs(x) if dt.is_signed else x.copy()
        if op == "sqr":
            return (x * x).astype(dt.numpy)
        if op == "relu":
            return np.maximum(x, dt.numpy.type(0))
        if op == "sign":
            return np.sign(x).astype(dt.numpy)
        if op in ("ceil", "floor", "round"):
            return x.copy()
    raise KeyError(op)


def int_binary_ref(op, a, b, dt):
    a = np.asarray(a, dt.numpy)
    b = np.asarray(b, dt.numpy)
    if op == "div":
        return int_div_ref(a, b, dt)
    with np.errstate(over="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BINARY_REF[op][0](a, b).astype(dt.numpy)


def float_binary_ref(op, a, b):
    with np.errstate(all="ignore"):
        return BINARY_REF[op][0](to_hp(a), to_hp(b))


def float_unary_ref(op, x):
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if op in PARAM_OPS:
            return PARAM_OPS[op][1](to_hp(x))
        return UNARY_FLOAT_REF[op][0](to_hp(x))


# ---- comparisons ---------------------------------------------------------------------------
def ordinal(a: np.ndarray) -> np.ndarray:
    """Map a float array (any 1/2/4/8-byte IEEE-like type with a sign bit) to integers whose
    differences are distances in ulps; +0 and -0 both map to 0."""
    a = np.ascontiguousarray(a)
    nbytes = a.dtype.itemsize
    u = a.view(f"u{nbytes}").astype(np.uint64)
    bits = nbytes * 8
    sign = (u >> np.uint64(bits - 1)) & np.uint64(1)
    mag = (u & np.uint64((1 << (bits - 1)) - 1)).astype(np.int64)
    return np.where(sign == 1, -mag, mag)


def _fail(msg, got, exp, bad, what):
    idx = np.argwhere(bad)[:8]
    lines = [f"{what}: {msg}; {int(bad.sum())} of {bad.size} elements differ"]
    for i in idx:
        i = tuple(i)
        lines.append(f"  at {i}: got {got[i]!r} expected {exp[i]!r}")
    pytest.fail("\n".join(lines), pytrace=False)


def assert_same(got, expected, what="", bits=False):
    """Exact equality (NaN positions must match).  bits=True also compares the raw bytes of
    non-NaN elements (so -0.0 != +0.0)."""
    got = np.asarray(got)
    expected = np.asarray(expected)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != expected {expected.shape}"
    assert got.dtype == expected.dtype, f"{what}: dtype {got.dtype} != expected {expected.dtype}"
    if got.size == 0:
        return
    if got.dtype.kind in "iub":
        bad = got != expected
        if bad.any():
            _fail("not exactly equal", got, expected, bad, what)
        return
    g32 = got.astype(np.float64) if got.dtype.itemsize < 8 else got
    e32 = expected.astype(np.float64) if expected.dtype.itemsize < 8 else expected
    gn, en = np.isnan(g32), np.isnan(e32)
    bad = gn != en
    if bits:
        gb = np.ascontiguousarray(got).view(f"u{got.dtype.itemsize}")
        eb = np.ascontiguousarray(expected).view(f"u{expected.dtype.itemsize}")
        bad |= ~gn & ~en & (gb != eb)
    else:
        bad |= ~gn & ~en & (g32 != e32)
    if bad.any():
        _fail("not exactly equal" + (" (bitwise)" if bits else ""), got, expected, bad, what)


def assert_matches(got, ref, dt, kind="arith", what=""):
    """Compare a lazycandle result `got` (array of dt.numpy) with the high-precision reference
    `ref` using SPEC's tolerance for `dt` and the op `kind` ("exact" | "arith" | "transc")."""
    got = np.asarray(got)
    assert got.dtype == dt.numpy, f"{what}: result dtype {got.dtype} != {dt.numpy}"
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != expected {ref.shape}"
    if dt.is_int:
        assert_same(got, ref.astype(dt.numpy), what)
        return
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dt is lc.f64:
            exp = ref.astype(np.float64)
        else:
            exp = ref.astype(np.float32)            # "the f32 result" ...
            if dt is not lc.f32:
                exp = exp.astype(dt.numpy)          # ... rounded once to the type
    if got.size == 0:
        return
    if kind == "exact":
        assert_same(got, exp, what)
        return
    gn, en = np.isnan(got.astype(np.float64)), np.isnan(exp.astype(np.float64))
    bad = gn != en
    ok_vals = ~gn & ~en
    if dt is lc.f64:
        rtol = 1e-13 if kind == "transc" else 1e-12
        g, e = got, ref.astype(HP)
        with np.errstate(all="ignore"):
            # equal to the rounded reference (covers +-Inf and underflow to 0), or within rtol of
            # the exact value
            close = (g == exp) | (np.abs(g.astype(HP) - e) <= rtol * np.abs(e))
        bad |= ok_vals & ~close
        tol = f"rtol {rtol}"
    elif dt is lc.f32:
        with np.errstate(all="ignore"):
            close = (got == exp) | (np.abs(got.astype(np.float64) - exp.astype(np.float64))
                                    <= 1e-6 + 1e-6 * np.abs(exp.astype(np.float64)))
            if kind == "transc":
                fin = np.isfinite(got) & np.isfinite(exp)
                close |= fin & (np.abs(ordinal(got) - ordinal(exp)) <= 4)
        bad |= ok_vals & ~close
        tol = "rtol 1e-6 / atol 1e-6" + (" / 4 ulp" if kind == "transc" else "")
    else:
        close = np.abs(ordinal(got) - ordinal(exp)) <= 1
        bad |= ok_vals & ~close
        tol = f"1 ulp of {dt.name}"
    if bad.any():
        _fail(f"outside {tol} ({kind})", got, exp, bad, what)


# ---- layouts -------------------------------------------------------------------------------
LAYOUTS = ["contiguous", "transposed", "narrowed", "broadcast", "permuted", "stepped"]


def make_input(kind, shape, dt, rng, domain="any"):
    """(lazycandle tensor, equal numpy array) whose lazycandle side has the layout `kind`,
    built with lazycandle view ops over a bigger / permuted buffer."""
    shape = tuple(shape)
    r = len(shape)
    if kind == "contiguous" or r == 0:
        a = data(dt, shape, rng, domain)
        return lc.tensor(a), a
    if kind == "transposed":
        if r == 1:
            a = data(dt, (1,) + shape, rng, domain)
            return lc.tensor(a).t()[:, 0], a.T[:, 0]
        src = shape[:-2] + (shape[-1], shape[-2])
        a = data(dt, src, rng, domain)
        return lc.tensor(a).t(), np.swapaxes(a, -1, -2)
    if kind == "permuted":
        perm = tuple(reversed(range(r)))        # its own inverse
        a = data(dt, tuple(shape[p] for p in perm), rng, domain)
        return lc.tensor(a).permute(perm), np.transpose(a, perm)
    if kind == "narrowed":
        big = tuple(d + 3 for d in shape)
        a = data(dt, big, rng, domain)
        t = lc.tensor(a)
        sl = []
        for d in range(r):
            t = t.narrow(d, 1 if d % 2 == 0 else 2, shape[d])
            sl.append(slice(1 if d % 2 == 0 else 2, (1 if d % 2 == 0 else 2) + shape[d]))
        return t, a[tuple(sl)]
    if kind == "stepped":
        big = tuple(2 * d + 1 for d in shape)
        a = data(dt, big, rng, domain)
        sl = tuple(slice(1, None, 2) if d % 2 == 0 else slice(0, 2 * shape[d], 2) for d in range(r))
        t = lc.tensor(a)[sl]
        return t, a[sl]
    if kind == "broadcast":
        src = tuple(1 if d % 2 == 0 else s for d, s in enumerate(shape))
        a = data(dt, src, rng, domain)
        return lc.tensor(a).broadcast_as(shape), np.broadcast_to(a, shape)
    raise ValueError(kind)


@pytest.fixture
def compiled_counter():
    from lazycandle.codegen import jit
    return lambda: jit.stats["compiled"]


def run_in_threads(work, n: int) -> list:
    """Run work(i) for i in range(n) on n Python threads at once; the exceptions they raised."""
    import threading
    errors = []

    def guarded(i):
        try:
            work(i)
        except Exception as e:      # noqa: BLE001 - returned to the test
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(lc.__file__)))


def run_probe(code, *args, timeout=150, **env_vars):
    """Run `code` in a fresh Python process group (this checkout first on its path, `env_vars`
    set); on timeout kill the whole group, forked children too.  Returns its stdout."""
    env = dict(os.environ, PYTHONPATH=ROOT, **env_vars)
    p = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise AssertionError(f"probe {args} hung for {timeout}s")
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)     # nothing of the probe outlives it
        except ProcessLookupError:
            pass
    assert p.returncode == 0, f"probe {args} exited {p.returncode}: {out[-1000:]} {err[-2000:]}"
    return out
