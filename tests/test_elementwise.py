"""Every elementwise op of SPEC x every compute dtype, against a high-precision NumPy oracle,
plus special values, integer semantics, to_dtype between all pairs, layouts and sizes."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import lazycandle as lc
from conftest import (ALL_DTYPE_UNARY, ALL_DTYPES, BINARY_REF, CMP_REF, COMPUTE, DOMAIN, FLOAT_ONLY_UNARY, FLOATS,
                      HP, INTS, LAYOUTS, LOWP, PARAM_OPS, SPECIAL_FLOATS, STORAGE_ONLY, UNARY_FLOAT_REF,
                      assert_matches, assert_same, data, float_binary_ref, float_unary_ref, ids, int_binary_ref,
                      int_info, int_unary_ref, make_input, rng_for, with_specials, wrap_int)

N = 33      # odd: a full vector body plus a scalar tail on every vector width


def _float_kind(op):
    return PARAM_OPS[op][2] if op in PARAM_OPS else UNARY_FLOAT_REF[op][1]


def _call(op, t):
    if op in PARAM_OPS:
        return PARAM_OPS[op][0](t)
    return getattr(t, op)()


FLOAT_ONLY_PARAM = [k for k in PARAM_OPS if k.startswith(("powf", "pow_op", "elu"))]
UNARY_NAMES = FLOAT_ONLY_UNARY + ALL_DTYPE_UNARY + list(PARAM_OPS)


# ---- unary ---------------------------------------------------------------------------------
def _int_param_case(op, dt):
    """Integer versions of the parametrised ops: (call, reference on python ints)."""
    signed = dt.is_signed
    if op == "affine":
        return (lambda t: t.affine(3, -7)), (lambda v: v * 3 - 7)
    if op == "affine2":     # float scalars truncate toward zero: 2.9 -> 2, -1.7 -> -1
        return (lambda t: t.affine(2.9, -1.7)), (lambda v: v * 2 - 1)
    if op == "clamp":
        lo, hi = (-20, 15) if signed else (2, 40)
        return (lambda t: t.clamp(lo, hi)), (lambda v: min(max(v, lo), hi))
    raise KeyError(op)


@pytest.mark.parametrize("dt", COMPUTE, ids=ids(COMPUTE))
@pytest.mark.parametrize("op", UNARY_NAMES)
def test_unary(op, dt):
    rng = rng_for("unary", op, dt.name)
    float_only = op in FLOAT_ONLY_UNARY or op in FLOAT_ONLY_PARAM
    if dt.is_int:
        x = data(dt, (N,), rng)
        t = lc.tensor(x)
        if float_only:
            with pytest.raises(lc.UnsupportedDTypeForOp):
                _call(op, t)
            return
        if op in PARAM_OPS:
            call, ref = _int_param_case(op, dt)
            got = call(t)
            expected = np.array([wrap_int(ref(int(v)), dt) for v in x.tolist()], dtype=object).astype(dt.numpy)
        else:
            got = _call(op, t)
            expected = int_unary_ref(op, x, dt)
        assert got.dtype is dt and got.shape == (N,)
        assert_same(got.numpy(), expected, f"{op} {dt.name}")
        return
    x = data(dt, (N,), rng, DOMAIN.get(op, "any"))
    got = _call(op, lc.tensor(x))
    assert got.dtype is dt and got.shape == (N,)
    assert_matches(got.numpy(), float_unary_ref(op, x), dt, _float_kind(op), f"{op} {dt.name}")


SPECIAL_EXTRA = [1e-3, -1e-3, 1e-6, 30.0, -30.0, 100.0, -100.0, 7.25, 0.75]
# The limit of x*sigmoid(x) etc. at -inf is 0 but the NumPy expression gives NaN (-inf * 0): ambiguous.
NO_NEG_INF = {"gelu", "gelu_erf", "silu"}


@pytest.mark.parametrize("dt", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("op", [o for o in UNARY_NAMES])
def test_unary_special_values(op, dt):
    vals = [v for v in SPECIAL_FLOATS + SPECIAL_EXTRA if not (op in NO_NEG_INF and v == -np.inf)]
    x = np.array(vals, np.float64).astype(np.float32).astype(dt.numpy) if dt is not lc.f64 else np.array(vals)
    got = _call(op, lc.tensor(x))
    assert_matches(got.numpy(), float_unary_ref(op, x), dt, _float_kind(op), f"{op} {dt.name} specials")


@pytest.mark.parametrize("dt", [lc.f32, lc.f64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", ["sin", "cos", "exp", "log", "tanh", "sigmoid", "erf"])
def test_unary_wide_range(op, dt):
    """Range reduction / tails: arguments far from 0."""
    rng = rng_for("wide", op, dt.name)
    if op == "log":
        x = np.exp(rng.uniform(-80, 80, 200))
    elif op == "exp":
        x = rng.uniform(-87, 88, 200)
    elif op in ("sin", "cos"):
        x = rng.uniform(-200, 200, 200)
    else:
        x = rng.uniform(-12, 12, 200)
    x = x.astype(dt.numpy)
    assert_matches(_call(op, lc.tensor(x)).numpy(), float_unary_ref(op, x), dt, "transc", f"{op} {dt.name} wide")


DENSE_OPS = FLOAT_ONLY_UNARY + FLOAT_ONLY_PARAM + ["sqr", "round", "affine"]


def _all_values(dt):
    """Every bit pattern of a 1- or 2-byte float type."""
    bits = np.arange(2 ** (8 * dt.size_in_bytes), dtype=np.uint64).astype(f"u{dt.size_in_bytes}")
    return bits.view(dt.numpy)


@pytest.mark.parametrize("dt", LOWP, ids=ids(LOWP))
@pytest.mark.parametrize("op", DENSE_OPS)
def test_unary_exhaustive_lowp(op, dt):
    """Every f16 / bf16 / f8e4m3 input (same kernel as test_unary: a contiguous 1-D walk)."""
    x = _all_values(dt)
    if op in NO_NEG_INF:
        x = x[~(np.isinf(x.astype(np.float32)) & (x.astype(np.float32) < 0))]
    got = _call(op, lc.tensor(x)).numpy()
    assert_matches(got, float_unary_ref(op, x), dt, _float_kind(op), f"{op} {dt.name} exhaustive")


@pytest.mark.parametrize("dt", [lc.f32, lc.f64], ids=["f32", "f64"])
@pytest.mark.parametrize("op", DENSE_OPS)
def test_unary_dense_f32_f64(op, dt):
    rng = rng_for("dense", op, dt.name)
    n = 20011
    dom = DOMAIN.get(op, "any")
    if dom == "pos":
        x = np.exp(rng.uniform(-20, 20, n))
    elif dom in ("nonzero", "away"):
        x = np.exp(rng.uniform(-6, 3, n)) * rng.choice([-1.0, 1.0], n)
    else:
        x = rng.normal(0, 4, n) * np.exp(rng.uniform(-8, 0, n) * (rng.random(n) < 0.2))
    x = x.astype(dt.numpy)
    got = _call(op, lc.tensor(x)).numpy()
    assert_matches(got, float_unary_ref(op, x), dt, _float_kind(op), f"{op} {dt.name} dense")


@pytest.mark.parametrize("dt", FLOATS, ids=ids(FLOATS))
def test_round_halves_away_from_zero(dt):
    vals = [-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5, -4.5, 0.25, -0.75, 5.0, -6.0]
    x = np.array(vals, np.float32).astype(dt.numpy)
    expected = np.array([-4, -3, -2, -1, 1, 2, 3, 4, 5, -5, 0, -1, 5, -6], np.float32).astype(dt.numpy)
    assert_same(lc.tensor(x).round().numpy(), expected, f"round {dt.name}")


def test_round_near_half_f32_f64():
    x32 = np.array([np.nextafter(np.float32(0.5), np.float32(0)), np.float32(8388609.0), np.float32(-8388609.0),
                    np.float32(2.5000002)], np.float32)
    assert_same(lc.tensor(x32).round().numpy(), np.array([0, 8388609.0, -8388609.0, 3], np.float32))
    x64 = np.array([0.49999999999999994, 4503599627370497.0, -2.5, 1e300])
    assert_same(lc.tensor(x64).round().numpy(), np.array([0.0, 4503599627370497.0, -3.0, 1e300]))


@pytest.mark.parametrize("dt", INTS, ids=ids(INTS))
def test_ceil_floor_round_identity_on_ints(dt):
    x = data(dt, (N,), rng_for("cfr", dt.name))
    t = lc.tensor(x)
    for op in ("ceil", "floor", "round"):
        r = getattr(t, op)()
        assert r.dtype is dt
        assert_same(r.numpy(), x, f"{op} {dt.name}")


@pytest.mark.parametrize("dt", [lc.f32, lc.f64, lc.bf16, lc.f16], ids=["f32", "f64", "bf16", "f16"])
def test_powf_negative_base_integer_exponent(dt):
    """NumPy: (-2.0) ** 2.0 == 4, (-2.0) ** 3.0 == -8, (-2.0) ** 0.5 is NaN."""
    x = np.array([-2.0, -1.5, -3.0, 0.0, 2.0], np.float32).astype(dt.numpy)
    for e in (2.0, 3.0, 0.5, -1.0, 0.0):
        got = lc.tensor(x).powf(e).numpy()
        with np.errstate(all="ignore"):
            ref = np.power(x.astype(np.float32).astype(HP), HP(e))
        assert_matches(got, ref, dt, "transc", f"powf({e}) {dt.name}")


# ---- binary --------------------------------------------------------------------------------
def _binary_data(op, dt, shape_a, shape_b, rng):
    if dt.is_int:
        a = data(dt, shape_a, rng)
        b = data(dt, shape_b, rng)
        if op == "div":
            info = int_info(dt)
            fb = b.reshape(-1)
            fb[: min(fb.size, 6)] = np.array([0, 1, 0, 2, 3, 0][: min(fb.size, 6)]).astype(dt.numpy)
            fa = a.reshape(-1)
            if dt.is_signed and fb.size > 8 and fa.size > 6:
                fb[6:9] = -1
                fa[6] = info.min
            # a healthy share of small divisors
            k = rng.random(fb.size) < 0.4
            fb[k] = data(dt, (int(k.sum()),), rng, "small")
        return a, b
    dom_b = "nonzero" if op == "div" else "any"
    return data(dt, shape_a, rng), data(dt, shape_b, rng, dom_b)


def _binary_expected(op, a, b, dt):
    if dt.is_int:
        return int_binary_ref(op, *np.broadcast_arrays(a, b), dt)
    return float_binary_ref(op, a, b)


@pytest.mark.parametrize("dt", COMPUTE, ids=ids(COMPUTE))
@pytest.mark.parametrize("op", list(BINARY_REF))
def test_binary(op, dt):
    a, b = _binary_data(op, dt, (N,), (N,), rng_for("bin", op, dt.name))
    got = getattr(lc.tensor(a), op)(lc.tensor(b))
    assert got.dtype is dt and got.shape == (N,)
    assert_matches(got.numpy(), _binary_expected(op, a, b, dt), dt, BINARY_REF[op][1], f"{op} {dt.name}")


@pytest.mark.parametrize("dt", [lc.f32, lc.i32, lc.bf16], ids=["f32", "i32", "bf16"])
@pytest.mark.parametrize("op", list(BINARY_REF))
@pytest.mark.parametrize("shapes", [((3, 1, 5), (4, 1)), ((5,), (2, 3, 5)), ((), (3, 2))], ids=str)
def test_broadcast_binary(op, dt, shapes):
    sa, sb = shapes
    a, b = _binary_data(op, dt, sa, sb, rng_for("bbin", op, dt.name, sa, sb))
    got = getattr(lc.tensor(a), "broadcast_" + op)(lc.tensor(b))
    out_shape = np.broadcast_shapes(sa, sb)
    assert got.shape == out_shape and got.dtype is dt
    assert_matches(got.numpy(), _binary_expected(op, a, b, dt), dt, BINARY_REF[op][1], f"broadcast_{op} {dt.name}")


@pytest.mark.parametrize("dt", FLOATS, ids=ids(FLOATS))
@pytest.mark.parametrize("op", list(BINARY_REF))
def test_binary_special_values(op, dt):
    """NaN / +-Inf / +-0 in every combination, including x/0 and max/min with NaN."""
    sp = np.array(SPECIAL_FLOATS, np.float32)
    a32, b32 = np.meshgrid(sp, sp, indexing="ij")
    a = a32.reshape(-1).astype(dt.numpy)
    b = b32.reshape(-1).astype(dt.numpy)
    got = getattr(lc.tensor(a), op)(lc.tensor(b)).numpy()
    assert_matches(got, float_binary_ref(op, a, b), dt, BINARY_REF[op][1], f"{op} {dt.name} specials")


@pytest.mark.parametrize("dt", FLOATS, ids=ids(FLOATS))
def test_maximum_minimum_nan_like_numpy(dt):
    a = np.array([np.nan, 1.0, np.nan, -0.5, 2.0], np.float32).astype(dt.numpy)
    b = np.array([1.0, np.nan, np.nan, -1.0, 2.0], np.float32).astype(dt.numpy)
    mx = lc.tensor(a).maximum(lc.tensor(b)).numpy()
    mn = lc.tensor(a).minimum(lc.tensor(b)).numpy()
    assert_same(mx, np.maximum(a.astype(np.float32), b.astype(np.float32)).astype(dt.numpy))
    assert_same(mn, np.minimum(a.astype(np.float32), b.astype(np.float32)).astype(dt.numpy))


# ---- low-precision dtypes: bit-exact where the f32 result is well defined --------------------
EXACT_LOWP_UNARY = ["neg", "abs", "relu", "sqr", "ceil", "floor", "round", "sign"]


@pytest.mark.parametrize("dt", LOWP, ids=ids(LOWP))
def test_lowp_bit_exact_vs_eager_numpy(dt):
    """Each op is computed in f32 and rounded once to the dtype: exactly what eager
    NumPy / ml_dtypes give for + - * / max min and the exact unary ops."""
    rng = rng_for("lowp_exact", dt.name)
    a = with_specials(data(dt, (N,), rng))
    b = data(dt, (N,), rng, "nonzero")
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    ta, tb = lc.tensor(a), lc.tensor(b)
    with np.errstate(all="ignore"):
        cases = {
            "add": (ta + tb, a32 + b32), "sub": (ta - tb, a32 - b32), "mul": (ta * tb, a32 * b32),
            "div": (ta / tb, a32 / b32), "maximum": (ta.maximum(tb), np.maximum(a32, b32)),
            "minimum": (ta.minimum(tb), np.minimum(a32, b32)),
            "neg": (ta.neg(), -a32), "abs": (ta.abs(), np.abs(a32)), "relu": (ta.relu(), np.maximum(a32, 0)),
            "sqr": (ta.sqr(), a32 * a32), "ceil": (ta.ceil(), np.ceil(a32)), "floor": (ta.floor(), np.floor(a32)),
            "sign": (ta.sign(), np.sign(a32)), "clamp": (ta.clamp(-1.5, 2.0), np.clip(a32, -1.5, 2.0)),
        }
    for name, (t, e) in cases.items():
        with np.errstate(all="ignore"):
            assert_same(t.numpy(), e.astype(dt.numpy), f"{name} {dt.name}")


# ---- operators and Python scalars ----------------------------------------------------------
OP_DTYPES = [lc.f32, lc.f64, lc.i32, lc.u8, lc.bf16, lc.i64, lc.f16]


@pytest.mark.parametrize("dt", OP_DTYPES, ids=ids(OP_DTYPES))
def test_operators_tensor_tensor(dt):
    rng = rng_for("ops", dt.name)
    a = data(dt, (3, 1, 5), rng, "small")
    b = data(dt, (4, 1), rng, "small")
    ta, tb = lc.tensor(a), lc.tensor(b)
    for sym, op in (("+", "add"), ("-", "sub"), ("*", "mul")):
        got = {"+": ta + tb, "-": ta - tb, "*": ta * tb}[sym]
        assert got.shape == (3, 4, 5)
        assert_matches(got.numpy(), _binary_expected(op, a, b, dt), dt, "arith", f"a {sym} b {dt.name}")
    bnz = data(dt, (4, 1), rng, "nonzero")
    if dt.is_int:
        bnz[bnz == 0] = 3
    got = ta / lc.tensor(bnz)
    assert_matches(got.numpy(), _binary_expected("div", a, bnz, dt), dt, "arith", f"a / b {dt.name}")
    if dt.is_signed or dt.is_float:
        assert_matches((-ta).numpy(), -a.astype(np.float64) if dt.is_float else int_unary_ref("neg", a, dt), dt,
                       "exact", "-a")
    else:
        assert_same((-ta).numpy(), int_unary_ref("neg", a, dt))


def _scalar_ref(dt, x, s, op, reflected=False):
    """Reference for `tensor op scalar`: the scalar takes the tensor's dtype first."""
    if dt.is_int:
        sv = wrap_int(int(s), dt)            # float scalars truncate toward zero
        sarr = np.full(x.shape, sv, dtype=object).astype(dt.numpy)
        a, b = (sarr, x) if reflected else (x, sarr)
        return int_binary_ref(op, a, b, dt)
    sv = np.array(s, np.float64).astype(dt.numpy) if dt is lc.f64 else np.array(s, np.float32).astype(dt.numpy)
    sarr = np.broadcast_to(sv, x.shape)
    a, b = (sarr, x) if reflected else (x, sarr)
    return float_binary_ref(op, a, b)


@pytest.mark.parametrize("dt", OP_DTYPES, ids=ids(OP_DTYPES))
def test_operators_with_python_scalars(dt):
    rng = rng_for("scal", dt.name)
    x = data(dt, (N,), rng, "nonzero" if dt.is_float else "small")
    if dt.is_int:
        x[x == 0] = 1
    t = lc.tensor(x)
    cases = [
        (t + 2, "add", 2, False), (t - 3, "sub", 3, False), (t * 3, "mul", 3, False), (t / 2, "div", 2, False),
        (2 + t, "add", 2, True), (7 - t, "sub", 7, True), (3 * t, "mul", 3, True), (12 / t, "div", 12, True),
        (t + 1.5, "add", 1.5, False), (2.0 - t, "sub", 2.0, True), (t * 2.7, "mul", 2.7, False),
        (t / 0.5 if dt.is_float else t / 2.9, "div", 0.5 if dt.is_float else 2.9, False),
        (9.75 / t, "div", 9.75, True),
    ]
    for got, op, s, refl in cases:
        assert got.dtype is dt, f"scalar {op} {s} changed dtype to {got.dtype}"
        assert got.shape == (N,)
        exp = _scalar_ref(dt, x, s, op, refl)
        assert_matches(got.numpy(), exp, dt, "arith", f"{'s op t' if refl else 't op s'} {op} {s} {dt.name}")


def test_int_scalar_wraps_into_dtype():
    x = np.array([0, 1, 100, 255], np.uint8)
    assert_same((lc.tensor(x) + 300).numpy(), (x + np.uint8(44)).astype(np.uint8))
    y = np.array([1, -2, 3], np.int16)
    assert_same((lc.tensor(y) * 65537).numpy(), y * np.int16(1))


def test_float_scalar_with_int_tensor_truncates_toward_zero():
    x = np.array([10, -10, 7, 3], np.int32)
    t = lc.tensor(x)
    assert_same((t * 2.9).numpy(), x * 2)
    assert_same((t + (-1.9)).numpy(), x - 1)
    assert_same((t - 0.99).numpy(), x)
    assert_same((5.5 - t).numpy(), 5 - x)


@pytest.mark.parametrize("dt", [lc.f32, lc.f64, lc.bf16], ids=["f32", "f64", "bf16"])
def test_pow_operator(dt):
    x = data(dt, (N,), rng_for("pow", dt.name), "pos")
    for e in (2, 3.0, 0.5, -1.0):
        got = lc.tensor(x) ** e
        assert got.dtype is dt
        with np.errstate(all="ignore"):
            ref = np.power(x.astype(np.float32).astype(HP) if dt is not lc.f64 else x.astype(HP), HP(e))
        assert_matches(got.numpy(), ref, dt, "transc", f"** {e}")


def test_abs_builtin_and_neg_operator():
    x = np.array([-1.5, 2.0, -0.0, 3.25], np.float32)
    assert_same(abs(lc.tensor(x)).numpy(), np.abs(x))
    assert_same((-lc.tensor(x)).numpy(), -x)


# ---- comparisons ---------------------------------------------------------------------------
@pytest.mark.parametrize("dt", COMPUTE, ids=ids(COMPUTE))
@pytest.mark.parametrize("op", list(CMP_REF))
def test_comparison(op, dt):
    rng = rng_for("cmp", op, dt.name)
    dom = "any" if dt.is_int else "small"      # full range: unsigned compares see the top bit set
    a = data(dt, (N,), rng, dom)
    b = a.copy()
    k = rng.random(N) < 0.6
    b[k] = data(dt, (int(k.sum()),), rng, dom)
    if dt.is_float:
        a[0], b[1], a[2], b[2] = np.nan, np.nan, np.nan, np.nan
        a[3], b[3] = np.float32(0.0).astype(dt.numpy), np.float32(-0.0).astype(dt.numpy)
        if dt is not lc.f8e4m3:
            a[4], b[5] = np.inf, -np.inf
    got = getattr(lc.tensor(a), op)(lc.tensor(b))
    assert got.dtype is lc.u8 and got.shape == (N,)
    a64, b64 = (a.astype(np.float64), b.astype(np.float64)) if dt.is_float else (a, b)
    assert_same(got.numpy(), CMP_REF[op](a64, b64).astype(np.uint8), f"{op} {dt.name}")


@pytest.mark.parametrize("dt", [lc.f32, lc.i64, lc.bf16, lc.u32], ids=["f32", "i64", "bf16", "u32"])
@pytest.mark.parametrize("op", list(CMP_REF))
def test_broadcast_comparison(op, dt):
    rng = rng_for("bcmp", op, dt.name)
    a = data(dt, (3, 1, 4), rng, "small")
    b = data(dt, (5, 1), rng, "small")
    b.reshape(-1)[:2] = a.reshape(-1)[:2]
    got = getattr(lc.tensor(a), "broadcast_" + op)(lc.tensor(b))
    assert got.dtype is lc.u8 and got.shape == (3, 5, 4)
    a64, b64 = (a.astype(np.float64), b.astype(np.float64)) if dt.is_float else (a, b)
    assert_same(got.numpy(), CMP_REF[op](a64, b64).astype(np.uint8), f"broadcast_{op} {dt.name}")


def test_comparison_operators():
    a = np.array([1.0, 2.0, 3.0, np.nan], np.float32)
    b = np.array([2.0, 2.0, 2.0, 1.0], np.float32)
    ta, tb = lc.tensor(a), lc.tensor(b)
    assert_same((ta < tb).numpy(), (a < b).astype(np.uint8))
    assert_same((ta <= tb).numpy(), (a <= b).astype(np.uint8))
    assert_same((ta > tb).numpy(), (a > b).astype(np.uint8))
    assert_same((ta >= tb).numpy(), (a >= b).astype(np.uint8))
    assert_same((ta > 1.5).numpy(), (a > 1.5).astype(np.uint8))
    assert_same(ta.lt(2.5).numpy(), (a < 2.5).astype(np.uint8))


# ---- where_cond ----------------------------------------------------------------------------
@pytest.mark.parametrize("mask_dt", [lc.u8, lc.u32, lc.i64], ids=["u8", "u32", "i64"])
@pytest.mark.parametrize("dt", COMPUTE, ids=ids(COMPUTE))
def test_where_cond(mask_dt, dt):
    rng = rng_for("where", mask_dt.name, dt.name)
    m = rng.integers(0, 3, N).astype(np.int64)
    m[:4] = [0, 1, 2, 0]
    if mask_dt is lc.u8:
        m[4] = 255
    elif mask_dt is lc.u32:
        m[4] = 2**32 - 1
        m[5] = 2**31
    else:
        m[4] = -1
        m[5] = -(2**40)
    m = m.astype(mask_dt.numpy)
    a = data(dt, (N,), rng)
    b = data(dt, (N,), rng)
    got = lc.tensor(m).where_cond(lc.tensor(a), lc.tensor(b))
    assert got.dtype is dt and got.shape == (N,)
    assert_same(got.numpy(), np.where(m != 0, a, b), f"where {mask_dt.name} {dt.name}")


def test_where_cond_from_comparison_and_views():
    rng = rng_for("where2")
    a = rng.normal(size=(4, 6)).astype(np.float32)
    b = rng.normal(size=(6, 4)).astype(np.float32)
    ta, tb = lc.tensor(a), lc.tensor(b)
    got = ta.gt(tb.t()).where_cond(ta, tb.t() * 2.0)
    assert_same(got.numpy(), np.where(a > b.T, a, b.T * np.float32(2)))


# ---- to_dtype ------------------------------------------------------------------------------
CAST_SRC_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.5, -1.0, -2.0, -6.0, 2.75, 7.5, 100.0, 255.0,
                   256.0, 1000.25, -37.5, 65504.0, 70000.0, -128.0, 127.9, 0.001, -0.0, 3.25]


def _cast_source(src):
    vals = np.array(CAST_SRC_VALUES, np.float64)
    if src.is_int:
        v = np.trunc(vals).astype(np.int64)
        info = int_info(src)
        v = np.clip(v, int(info.min), int(info.max))
        return v.astype(src.numpy)
    with np.errstate(over="ignore"):     # 70000 overflows f16 / f8 (to inf / NaN): intended
        return vals.astype(np.float32).astype(src.numpy)


@pytest.mark.parametrize("dst", ALL_DTYPES, ids=ids(ALL_DTYPES))
@pytest.mark.parametrize("src", ALL_DTYPES, ids=ids(ALL_DTYPES))
def test_to_dtype_all_pairs(src, dst):
    x = _cast_source(src)
    t = lc.tensor(x)
    got = t.to_dtype(dst)
    assert got.dtype is dst and got.shape == x.shape
    out = got.numpy()
    assert out.dtype == dst.numpy
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            expected = x.astype(dst.numpy)
        except TypeError:   # ml_dtypes has no direct cast between some of its types: f32 holds them all exactly
            expected = x.astype(np.float32).astype(dst.numpy)
        if src.is_float and dst.is_int:
            xf = x.astype(np.float64)
            info = int_info(dst)
            valid = np.isfinite(xf) & (np.trunc(xf) >= int(info.min)) & (np.trunc(xf) <= int(info.max))
            # out-of-range / NaN results: whatever NumPy gives, as long as nothing crashes
            out, expected = out[valid], expected[valid]
    assert_same(out, expected, f"{src.name} -> {dst.name}", bits=dst.is_float)


@pytest.mark.parametrize("dst", [lc.f16, lc.bf16, lc.f8e4m3], ids=["f16", "bf16", "f8e4m3"])
def test_to_dtype_f32_rounding_random_bits(dst):
    """f32 -> f16/bf16/f8e4m3 on random bit patterns (subnormals, ties, overflow) matches ml_dtypes."""
    rng = rng_for("bits", dst.name)
    bits = rng.integers(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    # ties and near-ties of the target's mantissa
    mant = {lc.f16: 10, lc.bf16: 7, lc.f8e4m3: 3}[dst]
    base = rng.uniform(-4, 4, 512).astype(np.float32)
    tie_bits = (base.view(np.uint32) & ~np.uint32((1 << (23 - mant)) - 1)) | np.uint32(1 << (22 - mant))
    x[:512] = tie_bits.view(np.float32)
    if dst is lc.f16:
        x[512:600] = rng.uniform(-1e-5, 1e-5, 88).astype(np.float32)    # f16 subnormals
    got = lc.tensor(x).to_dtype(dst).numpy()
    with np.errstate(all="ignore"):
        assert_same(got, x.astype(dst.numpy), f"f32 -> {dst.name}", bits=True)


def test_to_dtype_f64_to_f16_single_rounding():
    """NumPy rounds f64 -> f16 once (no detour through f32)."""
    rng = rng_for("f64f16")
    base = rng.uniform(-1000, 1000, 1000).astype(np.float16).astype(np.float64)
    ulp = np.abs(np.spacing(base.astype(np.float16)).astype(np.float64))
    x = np.concatenate([base + ulp / 2 + 1e-12 * ulp, base + ulp / 2, base - ulp / 2 - 1e-12 * ulp])
    got = lc.tensor(x).to_dtype(lc.f16).numpy()
    assert_same(got, x.astype(np.float16), "f64 -> f16", bits=True)


@pytest.mark.parametrize("src", [lc.f32, lc.f64, lc.bf16, lc.f16], ids=["f32", "f64", "bf16", "f16"])
@pytest.mark.parametrize("dst", INTS, ids=ids(INTS))
def test_to_dtype_float_to_int_truncates_and_never_crashes(src, dst):
    with np.errstate(over="ignore"):     # 1e30 -> inf in f16: intended
        x = np.array([2.9, -2.9, 0.5, -0.5, 100.7, -100.7, 1e30, -1e30, np.nan, np.inf, -np.inf, 3e9, -3e9],
                     np.float64).astype(np.float32).astype(src.numpy)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = lc.tensor(x).to_dtype(dst).numpy()
        xf = x.astype(np.float64)
        info = int_info(dst)
        valid = np.isfinite(xf) & (np.trunc(xf) >= int(info.min)) & (np.trunc(xf) <= int(info.max))
        assert_same(got[valid], x[valid].astype(dst.numpy), f"{src.name} -> {dst.name}")
    assert got.shape == x.shape and got.dtype == dst.numpy


def test_to_dtype_chain_and_same_dtype():
    x = np.array([1.25, -3.5, 7.0], np.float32)
    t = lc.tensor(x)
    assert_same(t.to_dtype(lc.f32).numpy(), x)
    assert_same(t.to_dtype(lc.f64).to_dtype(lc.i32).to_dtype(lc.f16).numpy(),
                x.astype(np.float64).astype(np.int32).astype(np.float16))
    assert_same(t.to_dtype("bf16").numpy(), x.astype(lc.bf16.numpy))


@pytest.mark.parametrize("dt", STORAGE_ONLY, ids=ids(STORAGE_ONLY))
def test_storage_only_roundtrip_through_views(dt):
    x = np.array([[0.5, 1.0, 2.0], [4.0, 1.5, 0.5]], np.float32)
    t = lc.tensor(x).to_dtype(dt)
    assert t.dtype is dt
    expected = x.astype(dt.numpy)
    assert_same(t.numpy(), expected, bits=True)
    assert_same(t.t().numpy(), np.array(expected.T, order="C"), bits=True)
    assert_same(t.t().to_dtype(lc.f32).numpy(), expected.T.astype(np.float32), bits=True)
    assert_same(t[:, 1:].to_dtype(lc.bf16).numpy(), expected[:, 1:].astype(np.float32).astype(lc.bf16.numpy))


# ---- integer semantics ---------------------------------------------------------------------
@pytest.mark.parametrize("dt", INTS, ids=ids(INTS))
def test_integer_division_semantics(dt):
    info = int_info(dt)
    lo, hi = int(info.min), int(info.max)
    if dt.is_signed:
        pairs = [(7, 2), (-7, 2), (7, -2), (-7, -2), (5, 0), (-5, 0), (0, 0), (lo, -1), (lo, 1), (hi, -1),
                 (lo, 0), (1, 3), (-1, 3), (lo, 2), (hi, hi), (lo, lo), (6, 3), (-6, 3)]
    else:
        pairs = [(7, 2), (5, 0), (0, 0), (hi, 1), (hi, 2), (hi, 0), (1, 3), (hi, hi), (6, 3)]
    a = np.array([p[0] for p in pairs], dtype=object).astype(dt.numpy)
    b = np.array([p[1] for p in pairs], dtype=object).astype(dt.numpy)
    got = (lc.tensor(a) / lc.tensor(b)).numpy()
    expected = []
    for x, y in pairs:
        if y == 0:
            expected.append(0)
        else:
            q = abs(x) // abs(y)
            expected.append(wrap_int(q if (x < 0) == (y < 0) else -q, dt))
    assert_same(got, np.array(expected, dtype=object).astype(dt.numpy), f"div {dt.name}")
    # division by a zero scalar too
    assert_same((lc.tensor(a) / 0).numpy(), np.zeros_like(a))


@pytest.mark.parametrize("dt", INTS, ids=ids(INTS))
def test_integer_wraparound(dt):
    info = int_info(dt)
    lo, hi = int(info.min), int(info.max)
    a = np.array([hi, lo, hi, lo, hi // 2 + 1, 3], dtype=object).astype(dt.numpy)
    b = np.array([1, -1 if dt.is_signed else 1, hi, lo if dt.is_signed else 5, 2, hi], dtype=object).astype(dt.numpy)
    ta, tb = lc.tensor(a), lc.tensor(b)
    A, B = a.tolist(), b.tolist()
    for name, t, f in (("add", ta + tb, lambda x, y: x + y), ("sub", ta - tb, lambda x, y: x - y),
                       ("mul", ta * tb, lambda x, y: x * y)):
        exp = np.array([wrap_int(f(x, y), dt) for x, y in zip(A, B)], dtype=object).astype(dt.numpy)
        assert_same(t.numpy(), exp, f"{name} {dt.name}")
    assert_same(ta.neg().numpy(), np.array([wrap_int(-x, dt) for x in A], dtype=object).astype(dt.numpy))
    assert_same(ta.abs().numpy(), np.array([wrap_int(abs(x), dt) for x in A], dtype=object).astype(dt.numpy))
    assert_same(ta.sqr().numpy(), np.array([wrap_int(x * x, dt) for x in A], dtype=object).astype(dt.numpy))
    assert_same(ta.affine(3, 5).numpy(), np.array([wrap_int(3 * x + 5, dt) for x in A], dtype=object).astype(dt.numpy))


def test_unsigned_neg_abs_like_numpy():
    x = np.array([0, 1, 2, 200, 255], np.uint8)
    assert_same(lc.tensor(x).neg().numpy(), np.negative(x))
    assert_same(lc.tensor(x).abs().numpy(), np.abs(x))
    y = np.array([0, 1, 2**31, 2**32 - 1], np.uint32)
    assert_same(lc.tensor(y).neg().numpy(), np.negative(y))
    assert_same(lc.tensor(y).sign().numpy(), np.sign(y))


# ---- layouts, sizes, zero-size and rank-0 --------------------------------------------------
LAYOUT_DTYPES = [lc.f32, lc.bf16, lc.i32]


def _layout_op_cases(dt):
    unary = "exp" if dt.is_float else "neg"
    return {
        "add": (lambda a, b: a + b, lambda x, y: _binary_expected("add", x, y, dt), "arith"),
        "maximum": (lambda a, b: a.maximum(b), lambda x, y: _binary_expected("maximum", x, y, dt), "exact"),
        "unary": (lambda a, b: getattr(a, unary)(),
                  lambda x, y: float_unary_ref(unary, x) if dt.is_float else int_unary_ref(unary, x, dt),
                  "transc"),
        "lt": (lambda a, b: a.lt(b), lambda x, y: (x.astype(np.float64) < y.astype(np.float64)).astype(np.uint8),
               "cmp"),
        "where": (lambda a, b: a.ge(b).where_cond(a, b), lambda x, y: np.where(x.astype(np.float64) >= y.astype(np.float64), x, y), "copy"),
        "cast": (lambda a, b: a.to_dtype(lc.f32 if dt is not lc.f32 else lc.f64),
                 lambda x, y: x.astype(np.float32 if dt is not lc.f32 else np.float64), "copy"),
        "chain": (lambda a, b: (a * b - a).maximum(b),
                  lambda x, y: None, "chain"),
    }


def _check_layout_case(name, dt, f, ref, kind, ta, a, tb, b, what):
    got = f(ta, tb)
    out = got.numpy()
    if kind == "cmp":
        assert_same(out, ref(a, b), what)
    elif kind == "copy":
        assert_same(out, np.asarray(ref(a, b)), what)
    elif kind == "chain":
        if dt.is_int:
            ab = int_binary_ref("mul", a, b, dt)
            exp = int_binary_ref("maximum", int_binary_ref("sub", ab, a, dt), b, dt)
            assert_same(out, exp, what)
        else:
            # per-op rounding in the dtype (what eager NumPy gives); f32 may contract to an FMA
            a32, b32 = (a.astype(np.float32), b.astype(np.float32)) if dt is not lc.f64 else (a, b)
            if dt in LOWP:
                ab = (a32 * b32).astype(dt.numpy).astype(np.float32)
                t = (ab - a32).astype(dt.numpy).astype(np.float32)
                assert_same(out, np.maximum(t, b32).astype(dt.numpy), what)
            else:
                exp = np.maximum(a32 * b32 - a32, b32)
                np.testing.assert_allclose(out, exp, rtol=1e-6 if dt is lc.f32 else 1e-12, atol=1e-6 if dt is lc.f32 else 1e-12,
                                           err_msg=what)
    else:
        assert_matches(out, ref(a, b), dt, kind, what)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dt", LAYOUT_DTYPES, ids=ids(LAYOUT_DTYPES))
@pytest.mark.parametrize("opname", ["add", "unary", "lt", "where", "cast", "chain"])
def test_layouts(opname, dt, layout):
    shape = (3, 5, 17)
    rng = rng_for("layout", opname, dt.name, layout)
    ta, a = make_input(layout, shape, dt, rng)
    tb, b = make_input("contiguous" if layout != "contiguous" else "transposed", shape, dt, rng)
    f, ref, kind = _layout_op_cases(dt)[opname]
    _check_layout_case(opname, dt, f, ref, kind, ta, a, tb, b, f"{opname} {dt.name} {layout}")
    if opname not in ("add", "chain"):
        return
    # both operands in the exotic layout (same layout)
    tc, c = make_input(layout, shape, dt, rng)
    _check_layout_case(opname, dt, f, ref, kind, ta, a, tc, c, f"{opname} {dt.name} {layout} x2")


SIZES = [1, 7, 17, 33, 1023]


@pytest.mark.parametrize("dt", COMPUTE, ids=ids(COMPUTE))
@pytest.mark.parametrize("n", SIZES)
def test_odd_sizes(n, dt):
    """Vector bodies and scalar tails: contiguous 1-D and a transposed 2-D walk."""
    rng = rng_for("sizes", n, dt.name)
    a = data(dt, (n,), rng)
    b = data(dt, (n,), rng)
    got = (lc.tensor(a) - lc.tensor(b)).maximum(lc.tensor(b))
    if dt.is_int:
        exp = int_binary_ref("maximum", int_binary_ref("sub", a, b, dt), b, dt)
        assert_same(got.numpy(), exp, f"n={n} {dt.name}")
    else:
        with np.errstate(all="ignore"):
            a32, b32 = (a, b) if dt is lc.f64 else (a.astype(np.float32), b.astype(np.float32))
            d = a32 - b32
            if dt in LOWP:
                d = d.astype(dt.numpy).astype(np.float32)
            exp = np.maximum(d, b32).astype(dt.numpy)
        assert_same(got.numpy(), exp, f"n={n} {dt.name}")
    # 2-D transposed walk with an odd inner size
    m = data(dt, (n, 3), rng)
    got2 = lc.tensor(m).t().neg() if (dt.is_signed or dt.is_float) else lc.tensor(m).t().abs()
    exp2 = int_unary_ref("neg" if dt.is_signed else "abs", m.T, dt) if dt.is_int else -m.T
    assert_same(got2.numpy(), np.array(exp2, order="C"), f"n={n} {dt.name} transposed")


@pytest.mark.parametrize("dt", [lc.f32, lc.i32, lc.bf16, lc.u8, lc.f64], ids=["f32", "i32", "bf16", "u8", "f64"])
@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0, 2), (4, 0)], ids=str)
def test_zero_size(dt, shape):
    a = data(dt, shape, rng_for("zs"))
    t = lc.tensor(a)
    cases = [t + t, t.neg() if dt is not lc.u8 else t.abs(), t.lt(t), t.eq(t).where_cond(t, t), t.to_dtype(lc.f64),
             t.maximum(t) * 2]
    if dt.is_float:
        cases.append(t.exp())
    for c in cases:
        out = c.numpy()
        assert out.shape == shape
        assert out.size == 0
    tt = t.t() if len(shape) >= 2 else t
    assert (tt + 1).numpy().shape == tt.shape


@pytest.mark.parametrize("dt", [lc.f32, lc.i64, lc.bf16, lc.f64, lc.u8, lc.f16], ids=["f32", "i64", "bf16", "f64", "u8", "f16"])
def test_rank0(dt):
    a = np.array(3, np.float32).astype(dt.numpy)
    b = np.array(2, np.float32).astype(dt.numpy)
    ta, tb = lc.tensor(a), lc.tensor(b)
    assert ta.shape == ()
    r = (ta * tb + ta).maximum(tb)
    assert r.shape == () and r.dtype is dt
    out = r.numpy()
    assert out.shape == () and out.dtype == dt.numpy
    assert out.item() == 9
    assert ta.lt(tb).numpy().item() == 0 and ta.gt(tb).item() == 1
    assert ta.to_dtype(lc.i32).item() == 3
    assert (ta + 1).item() == 4
    if dt.is_float:
        np.testing.assert_allclose(float(ta.exp().item()), np.exp(3.0), rtol=1e-2)
    # rank-0 broadcast against a tensor
    v = lc.tensor(np.array([1, 2, 3], np.float32).astype(dt.numpy))
    assert_same((v + ta).numpy(), (np.array([1, 2, 3], np.float32) + 3).astype(dt.numpy))
    assert_same((ta * v).numpy(), (np.array([1, 2, 3], np.float32) * 3).astype(dt.numpy))


def test_large_2d_vector_and_tail():
    rng = rng_for("big")
    a = rng.normal(size=(37, 1023)).astype(np.float32)
    b = rng.normal(size=(1023, 37)).astype(np.float32)
    got = (lc.tensor(a) * 0.5 + lc.tensor(b).t()).relu()
    np.testing.assert_allclose(got.numpy(), np.maximum(a * np.float32(0.5) + b.T, 0), rtol=1e-6, atol=1e-6)
