"""Vector math library (lazycandle/codegen/vmath*.py) through the vmath_run test kernels.

Fast subset: ~5*10^4 points per function and dtype plus every special value, against
float64 (for f32) / longdouble (for f64) references from bench/vmath_accuracy.py; the full
sweeps (10^7 points; every f32 in [-87, 88] for exp, in [2^-14, 10.5] for tanh) are the `slow` test at the end.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import llvmlite.ir as ir
import numpy as np
import pytest

from lazycandle.codegen import jit, vmath, vmath_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import vmath_accuracy as acc  # noqa: E402

NAMES = sorted(vmath.FUNCS)
KEYS = ("f32", "f64")
PARAMS = {"elu": (1.5,), "powf": (2.5,)}
MP_HEAVY = ("erf", "gelu_erf", "gelu")          # f64 needs mpmath for a tight reference


def test_api_table():
    assert set(vmath.FUNCS) == {"exp", "log", "sin", "cos", "tanh", "erf", "sigmoid", "gelu",
                                "gelu_erf", "silu", "elu", "powf", "sqrt", "recip"}
    with pytest.raises(KeyError):
        vmath.emit(None, "nope", None)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("name", NAMES)
def test_accuracy_fast(name, key):
    params = PARAMS.get(name, ())
    target = acc.TARGET[key][name]
    if key == "f64" and name in MP_HEAVY:
        if acc.mpmath is not None:
            err, where, _ = acc.measure(name, key, 3000, params, threads=1)
        else:   # math.erf / longdouble references are themselves ~1 ulp off here
            x = acc.inputs(name, key, 30000)
            x = x[np.abs(x) < 6]
            err, where, _ = acc.measure(name, key, 0, params, threads=1, use_mp=False, x=x)
            target += 1
    else:
        err, where, _ = acc.measure(name, key, 50_000, params, threads=1)
    assert err <= target, f"{name} {key}: {err:.3f} ulp at x={where!r} (target {target})"


@pytest.mark.parametrize("e", [0.1, 1 / 3, -1.7, 3.0, -3.0, 17.0, 1000.5, -0.5])
@pytest.mark.parametrize("key", KEYS)
def test_powf_accuracy(e, key):
    err, where, _ = acc.measure("powf", key, 20_000, (e,), threads=1)
    assert err <= acc.TARGET[key]["powf"], f"powf({e}) {key}: {err:.3f} ulp at {where!r}"


# ---- special values against NumPy -------------------------------------------------------------
def _numpy(name, x, params):
    d = x.dtype.type
    with np.errstate(all="ignore"):
        return {
            "exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
            "sqrt": np.sqrt, "recip": lambda v: d(1) / v,
            "erf": lambda v: np.array([math.erf(t) if not math.isnan(t) else t for t in v], v.dtype),
            "sigmoid": lambda v: d(1) / (d(1) + np.exp(-v)),
            "silu": lambda v: v / (d(1) + np.exp(-v)),
            "gelu": lambda v: d(0.5) * v * (d(1) + np.tanh(d(0.7978845608028654) * (v + d(0.044715) * v ** 3))),
            "gelu_erf": lambda v: d(0.5) * v * (d(1) + np.array(
                [math.erf(t / math.sqrt(2)) if not math.isnan(t) else t for t in v], v.dtype)),
            "elu": lambda v: np.where(v >= 0, v, d(params[0]) * (np.exp(v) - d(1))),
            "powf": lambda v: np.power(v, d(params[0]) if d is np.float32 else params[0]),
        }[name](x)


def _same(a, b):
    """Bitwise-class equality: both NaN, or equal with the same sign of zero."""
    return (np.isnan(a) & np.isnan(b)) | ((a == b) & (np.signbit(a) == np.signbit(b)))


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("name", NAMES)
def test_special_values_match_numpy(name, key):
    dt = acc.DT[key]
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], dt)
    params = PARAMS.get(name, ())
    got = vmath_run.run(name, x, *params)
    exp = _numpy(name, x, params)
    assert _same(got, exp).all(), f"{name} {key}: {list(zip(x, got, exp))}"


def _neighbours(dt, v, k=4):
    """The k floats on either side of v (v rounded to dt)."""
    x = [dt(v)]
    for _ in range(k):
        x = [np.nextafter(x[0], dt(-np.inf))] + x + [np.nextafter(x[-1], dt(np.inf))]
    return np.array(x, dt)


@pytest.mark.parametrize("key", KEYS)
def test_exp_thresholds_and_denormals(key):
    """Overflow to inf, gradual underflow and flush to 0 exactly where the rounded exact
    result does."""
    dt = acc.DT[key]
    fi = np.finfo(dt)
    T = np.float64 if key == "f32" else np.longdouble
    x = np.concatenate([_neighbours(dt, np.log(T(fi.max))), _neighbours(dt, np.log(T(fi.smallest_subnormal) / 2)),
                        _neighbours(dt, np.log(T(fi.tiny))), np.linspace(np.log(T(fi.tiny)), np.log(T(fi.tiny)) - 20, 50).astype(dt)])
    got = vmath_run.run("exp", x)
    ref = acc.reference("exp", x)
    with np.errstate(over="ignore"):
        rd = ref.astype(dt)
    assert _same(np.isinf(got), np.isinf(rd)).all() and _same(got == 0, rd == 0).all()
    assert ((got > 0) & (got < fi.tiny)).sum() > 40                 # denormal results
    assert np.nanmax(acc.ulp_errors(got, ref)) <= 1


@pytest.mark.parametrize("key", KEYS)
def test_log_specials(key):
    dt = acc.DT[key]
    fi = np.finfo(dt)
    x = np.array([-1.0, -fi.smallest_subnormal, fi.smallest_subnormal, fi.tiny, fi.max, 1.0], dt)
    got = vmath_run.run("log", x)
    with np.errstate(all="ignore"):
        exp = np.log(x)
    assert np.isnan(got[:2]).all() and got[-1] == 0 and not np.signbit(got[-1])
    assert np.all(acc.ulp_errors(got[2:], acc.reference("log", x[2:])) <= 1)
    assert _same(got[:2], exp[:2]).all()


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("name", ["sin", "tanh", "erf", "gelu", "gelu_erf", "silu", "elu"])
def test_odd_functions_keep_signed_zero_and_tiny(name, key):
    dt = acc.DT[key]
    fi = np.finfo(dt)
    x = np.array([-0.0, 0.0, fi.smallest_subnormal, -fi.smallest_subnormal, fi.tiny, -fi.tiny], dt)
    got = vmath_run.run(name, x, *PARAMS.get(name, ()))
    assert np.signbit(got[0]) and not np.signbit(got[1])
    assert np.all(np.signbit(got[2:]) == np.signbit(x[2:]))


@pytest.mark.parametrize("key", KEYS)
def test_trig_huge_arguments(key):
    dt = acc.DT[key]
    x = np.array([1e5, -1e5, 2.0 ** 40, 3e9, 1e15, 1e22, 1e30, 3e38, -3e38]
                 + ([1e100, 1e200, 1e300, -1.7e308] if key == "f64" else []), dt)
    x = np.concatenate([x, x[::-1], x * 0.5])                        # mixed huge / moderate lanes
    for name in ("sin", "cos"):
        err = acc.ulp_errors(vmath_run.run(name, x), acc.reference(name, x))
        assert err.max() <= 2, f"{name} {key}: {err.max():.3f} at {x[np.argmax(err)]!r}"


# ---- powf special cases, bit for bit against np.power -------------------------------------------
POW_X = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0,
         1e-40, -1e-40, 1e30, -1e30, 1.0000001, 0.9999999, 1e-300, -1e300]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("e", [0.0, -0.0, 1.0, 2.0, -1.0, 0.5, -0.5, 3.0, -3.0, 2.5, -2.5, 0.1, 7.0,
                               1e20, -1e20, 1e300, np.inf, -np.inf, np.nan, 2.0 ** 53 + 2])
def test_powf_special_cases(e, key):
    dt = acc.DT[key]
    with np.errstate(all="ignore"):
        x = np.array(POW_X, np.float64).astype(dt)
        got = vmath_run.run("powf", x, e)
        exp = np.power(x, dt(e) if key == "f32" else e)
    with np.errstate(all="ignore"):
        close = np.isfinite(exp) & np.isfinite(got) & (np.abs(got - exp) <= 2 * np.spacing(np.abs(exp)))
    ok = _same(got, exp) | (close & (np.signbit(got) == np.signbit(exp)))
    assert ok.all(), [(a, g, r) for a, g, r, k in zip(x, got, exp, ok) if not k]


def test_powf_f32_rounds_exponent_like_numpy():
    x = np.linspace(0.1, 10, 1001, dtype=np.float32)
    got = vmath_run.run("powf", x, 0.1)
    exp = np.power(x, 0.1)                       # NumPy 2 casts the Python float to float32
    assert exp.dtype == np.float32
    assert np.max(np.abs(got - exp) / np.spacing(exp)) <= 1


# ---- code paths ------------------------------------------------------------------------------
@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("name", NAMES)
def test_vector_body_and_scalar_tail_agree(name, key):
    dt = acc.DT[key]
    w = vmath_run.width(dt)
    x = acc.inputs(name, key, 3 * w)[: 3 * w + 3]
    params = PARAMS.get(name, ())
    whole = vmath_run.run(name, x, *params)
    scalar = vmath_run.run(name, x, *params, lanes=1)
    assert _same(whole, scalar).all(), [(a, b, c) for a, b, c in zip(x, whole, scalar) if not _same(b, c)]
    for n in range(1, 2 * w + 2):                                   # every tail length
        assert _same(vmath_run.run(name, x[:n], *params), whole[:n]).all()


@pytest.mark.parametrize("lanes", [4, 16])
@pytest.mark.parametrize("name", ["exp", "sin", "gelu", "erf"])
def test_other_vector_widths(name, lanes):
    for key in KEYS:
        x = acc.inputs(name, key, 200)
        params = PARAMS.get(name, ())
        assert _same(vmath_run.run(name, x, *params, lanes=lanes), vmath_run.run(name, x, *params, lanes=1)).all()


def test_the_accuracy_harness_threads_match_single_thread():
    x = np.random.default_rng(3).uniform(-50, 50, 300_001).astype(np.float32)
    for name in ("exp", "sin", "gelu"):
        assert _same(acc.run_threads(name, x, (), 2), vmath_run.run(name, x)).all()


def test_emit_on_builder_types():
    """emit returns x's type for scalars and vectors of both precisions."""
    for t in (ir.FloatType(), ir.DoubleType(), ir.VectorType(ir.FloatType(), 8), ir.VectorType(ir.DoubleType(), 2)):
        for name in NAMES:
            m = ir.Module()
            f = ir.Function(m, ir.FunctionType(t, [t]), name="f")
            b = ir.IRBuilder(f.append_basic_block())
            y = vmath.emit(b, name, f.args[0], *PARAMS.get(name, ()))
            assert y.type == t
            b.ret(y)
            m.triple, m.data_layout = jit.triple_and_layout()
            import llvmlite.binding as llvm
            llvm.parse_assembly(str(m)).verify()


def test_no_libm_calls_or_fast_math():
    for name in NAMES:
        text = vmath_run.kernel_ir(name, np.float32, PARAMS.get(name, ()))
        for bad in (" nnan", " ninf", " fast ", "@exp", "@sin", "@llvm.exp.", "@llvm.log.", "@llvm.sin.",
                    "@llvm.cos.", "@llvm.pow."):
            assert bad not in text, (name, bad)


@pytest.mark.slow
def test_full_accuracy_sweep():
    """The bench's full sweep: every f32 in [-87, 88] through exp and in [2^-14, 10.5]
    through tanh, 10^7 points elsewhere."""
    err, where, count = acc.exhaustive_f32("exp")
    assert count > 2_000_000_000 and err <= 1, (err, where)
    err, where, count = acc.exhaustive_f32("tanh")
    assert count > 140_000_000 and err <= acc.TARGET["f32"]["tanh"], (err, where)
    rows = acc.sweep(list(acc.TARGET["f32"]), 10_000_000, 200_000, out=sys.stderr)
    bad = [r for r in rows if r[2] > acc.TARGET[r[1]][r[0]]]
    assert not bad, bad


# ---- vscalef (AVX-512) exp scaling against the two-factor scalar path -------------------------------
def _edge_inputs(key):
    """±0, ±inf, NaN, denormals, and the neighbours of exp's overflow, denormal and flush
    thresholds (and of their negatives, where sigmoid / silu / gelu saturate)."""
    dt = acc.DT[key]
    fi = np.finfo(dt)
    T = np.float64 if key == "f32" else np.longdouble
    cuts = [np.log(T(fi.max)), np.log(T(fi.tiny)), np.log(T(fi.smallest_subnormal) / 2)]
    x = [np.array([0.0, -0.0, np.inf, -np.inf, np.nan, fi.smallest_subnormal, -fi.smallest_subnormal,
                   fi.tiny, -fi.tiny, fi.max, -fi.max, 1.0, -1.0], dt)]
    for c in cuts:
        x += [_neighbours(dt, c), _neighbours(dt, -c)]
    return np.concatenate(x)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid", "silu", "gelu", "erf", "gelu_erf", "powf"])
def test_vscalef_widths_match_scalar_path_at_edge_values(name, key):
    x = _edge_inputs(key)
    params = PARAMS.get(name, ())
    scalar = vmath_run.run(name, x, *params, lanes=1)
    for lanes in (2, 4, 8, 16):
        got = vmath_run.run(name, x, *params, lanes=lanes)
        bad = ~_same(got, scalar)
        assert not bad.any(), f"{name} {key} lanes={lanes}: {list(zip(x[bad], got[bad], scalar[bad]))}"


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("name", ["exp", "sigmoid", "silu", "gelu"])
def test_edge_values_match_numpy_or_the_reference(name, key):
    """Specials bit for bit like NumPy's formula; finite results within the ulp target."""
    x = _edge_inputs(key)
    got = vmath_run.run(name, x)
    want = _numpy(name, x, ())
    special = ~np.isfinite(x) | (x == 0)
    assert _same(got[special], want[special]).all(), list(zip(x[special], got[special], want[special]))
    fin = ~special & (np.abs(x) < 1e4)
    if key == "f64" and name == "gelu" and acc.mpmath is None:
        return
    err = acc.ulp_errors(got[fin], acc.reference(name, x[fin]))
    assert np.nanmax(err) <= acc.TARGET[key][name], f"{name} {key}: {np.nanmax(err):.3f} at {x[fin][np.nanargmax(err)]!r}"


@pytest.mark.skipif(not jit.has_feature("avx512f"), reason="AVX-512 hosts only")
def test_logistic_uses_vscalef_and_exp_a_masked_one_on_avx512():
    """sigmoid scales by one vscalef; exp's vscalef is masked to the lanes whose result does
    not round to 0, because softmax feeds it -inf and very negative values whose underflowing
    vscalef would take a microcode assist."""
    cm = jit.compile_ir(vmath_run.kernel_ir("sigmoid", np.float32), export=["k"], name="vmath_sigmoid_scalef")
    assert "vscalefps" in cm.asm()
    cm = jit.compile_ir(vmath_run.kernel_ir("exp", np.float32), export=["k"], name="vmath_exp_scalef")
    scalefs = [ln for ln in cm.asm().splitlines() if "vscalefps" in ln and "zmm" in ln]
    assert scalefs and all("{%k" in ln and "{z}" in ln for ln in scalefs)


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "erf", "sigmoid", "gelu", "gelu_erf", "silu"])
def test_signalling_nan_inputs_give_nan(name):
    """vrange / vfpclass / vgetmant treat a signalling NaN unlike a quiet one (vrange returns the
    other operand for a quiet NaN, a quiet NaN for a signalling one): both must come out NaN,
    in the vector body and the scalar tail (bf16 NaN payloads widen to signalling f32 NaNs)."""
    bits = np.array([0x7F800001, 0x7FA00000, 0xFF800001, 0x7FC00000, 0xFFC00001] * 7, np.uint32)
    x = bits.view(np.float32)
    for lanes in (None, 1):
        assert np.isnan(vmath_run.run(name, x, lanes=lanes)).all(), (name, lanes)
