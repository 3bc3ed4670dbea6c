"""Matmul epilogue fusion (ir/epilogue.py, codegen/gemm_epilogue.py): bias, activation and
residual consumers of a matmul run in the GEMM's kernel.  Each case is checked against NumPy
(f64) and against the same graph realized op at a time (no fusion), on every backend: the
tiled GEMM applies the epilogue in its store, BLAS runs it as a separate pass."""
import ml_dtypes
import numpy as np
import pytest

import lazycandle as lc
from lazycandle.compiler import schedule_capture
from lazycandle.ir.graph import capture

DTYPES = {"f32": (lc.f32, np.float32, 2e-5), "f64": (lc.f64, np.float64, 1e-12),
          "f16": (lc.f16, np.float16, 4e-3), "bf16": (lc.bf16, ml_dtypes.bfloat16, 3e-2)}


@pytest.fixture(params=["tiled", "blas", "auto"])
def backend(request):
    old = lc.get_matmul_backend()
    lc.set_matmul_backend(request.param)
    yield request.param
    lc.set_matmul_backend(old)


def _arr(rng, shape, npdt, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(npdt)


def _kernels(t):
    kernels, _, _ = schedule_capture(capture([t._node]))
    return kernels


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _check(got, ref, unfused, tol):
    """Close to NumPy; for the 16-bit floats bit for bit what the ops give one at a time
    (SPEC: fusion never changes a value), for f32/f64 within an FMA contraction of it."""
    scale = max(float(np.abs(ref).max()), 1.0)
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=tol, atol=tol * scale)
    if got.dtype in (np.float16, ml_dtypes.bfloat16):
        np.testing.assert_array_equal(got.view(np.uint16), unfused.view(np.uint16))
    else:
        np.testing.assert_allclose(got, unfused, rtol=1e-6 if got.dtype == np.float32 else 1e-13, atol=0)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("m,k,n", [(37, 29, 45), (16, 300, 130), (1, 7, 64), (65, 70, 129)])
def test_bias_gelu_epilogue_matches_numpy_and_op_at_a_time(backend, dt, m, k, n):
    ldt, npdt, tol = DTYPES[dt]
    rng = np.random.default_rng(m * 1000 + k + n)
    x, w, b = _arr(rng, (m, k), npdt), _arr(rng, (k, n), npdt, k ** -0.5), _arr(rng, n, npdt)
    X, W, B = lc.tensor(x), lc.tensor(w), lc.tensor(b)
    y = (X @ W + B).gelu()
    assert len(_kernels(y)) == 1
    unfused = ((X @ W).realize() + B).realize().gelu()
    ref = _gelu(x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64))
    _check(y.numpy(), ref, unfused.numpy(), tol)


@pytest.mark.parametrize("dt", ["f32", "bf16"])
@pytest.mark.parametrize("act", ["relu", "silu", "tanh"])
def test_transposed_operands_and_residual_epilogue(backend, dt, act):
    """x.T @ w.T with bias, activation, scale and a residual read transposed (a runtime column
    stride in the epilogue)."""
    ldt, npdt, tol = DTYPES[dt]
    rng = np.random.default_rng(3)
    m, k, n = 33, 40, 70
    xt, wt = _arr(rng, (k, m), npdt), _arr(rng, (n, k), npdt, k ** -0.5)
    b, rt = _arr(rng, n, npdt), _arr(rng, (n, m), npdt)
    X, W, B, R = lc.tensor(xt).t(), lc.tensor(wt).t(), lc.tensor(b), lc.tensor(rt).t()
    y = getattr(X @ W + B, act)() * 0.5 + R
    assert len(_kernels(y)) == 1
    unfused = getattr(((X @ W).realize() + B).realize(), act)().realize() * 0.5 + R
    h = xt.T.astype(np.float64) @ wt.T.astype(np.float64) + b.astype(np.float64)
    f = {"relu": lambda v: np.maximum(v, 0), "silu": lambda v: v / (1 + np.exp(-v)), "tanh": np.tanh}[act]
    _check(y.numpy(), f(h) * 0.5 + rt.T.astype(np.float64), unfused.numpy(), tol)


@pytest.mark.parametrize("dt", ["f32", "f16", "f64"])
def test_batched_epilogue_with_per_batch_bias_and_broadcast_lhs(backend, dt):
    ldt, npdt, tol = DTYPES[dt]
    rng = np.random.default_rng(4)
    a, bm = _arr(rng, (12, 70, 64), npdt), _arr(rng, (12, 64, 66), npdt, 0.125)
    bias = _arr(rng, (12, 1, 66), npdt)
    y = (lc.tensor(a) @ lc.tensor(bm) + lc.tensor(bias)).relu()
    assert len(_kernels(y)) == 1
    ref = np.maximum(a.astype(np.float64) @ bm.astype(np.float64) + bias.astype(np.float64), 0)
    unfused = ((lc.tensor(a) @ lc.tensor(bm)).realize() + lc.tensor(bias)).relu()
    _check(y.numpy(), ref, unfused.numpy(), tol)
    lhs = _arr(rng, (70, 64), npdt)                   # broadcast lhs: stride-0 batch on A
    y2 = (lc.tensor(lhs) @ lc.tensor(bm)) * 2.0 - lc.tensor(bias)
    ref2 = (lhs.astype(np.float64) @ bm.astype(np.float64)) * 2 - bias.astype(np.float64)
    unfused2 = (lc.tensor(lhs) @ lc.tensor(bm)).realize() * 2.0 - lc.tensor(bias)
    _check(y2.numpy(), ref2, unfused2.numpy(), tol)


def test_zero_size_epilogue(backend):
    for m, k, n in [(0, 5, 7), (5, 0, 7), (5, 7, 0)]:
        x, w, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32), np.full(n, 2.0, np.float32)
        y = (lc.tensor(x) @ lc.tensor(w) + lc.tensor(b)).relu()
        np.testing.assert_array_equal(y.numpy(), np.maximum(x @ w + b, 0))


def test_integer_matmul_epilogue_wraps_like_numpy(backend):
    rng = np.random.default_rng(6)
    a = rng.integers(-50, 50, (9, 13)).astype(np.int32)
    b = rng.integers(-50, 50, (13, 70)).astype(np.int32)
    c = rng.integers(-50, 50, 70).astype(np.int32)
    y = (lc.tensor(a) @ lc.tensor(b)) * 3 + lc.tensor(c)
    assert len(_kernels(y)) == 1
    np.testing.assert_array_equal(y.numpy(), (a @ b) * 3 + c)


def test_epilogue_refused_when_the_product_is_also_needed():
    rng = np.random.default_rng(7)
    x, w = lc.tensor(_arr(rng, (8, 8), np.float32)), lc.tensor(_arr(rng, (8, 8), np.float32))
    h = x @ w
    y = h.relu()
    kernels, _, notes = schedule_capture(capture([h._node, y._node]))
    assert [k.kind for k in kernels] == ["matmul", "elementwise"]
    t = (x @ w).t().exp()                     # read through a view: not element for element
    assert len(_kernels(t)) == 2
    np.testing.assert_allclose(t.numpy(), np.exp((x.numpy() @ w.numpy()).T), rtol=1e-5)


def test_gpt2_mlp_kernel_count_drops_with_epilogues():
    """x @ w1 + b1 -> gelu -> @ w2 + b2 + x: two kernels (one per matmul), was four."""
    rng = np.random.default_rng(8)
    x = lc.tensor(_arr(rng, (16, 32), np.float32))
    w1, b1 = lc.tensor(_arr(rng, (32, 128), np.float32, 0.2)), lc.tensor(_arr(rng, 128, np.float32))
    w2, b2 = lc.tensor(_arr(rng, (128, 32), np.float32, 0.1)), lc.tensor(_arr(rng, 32, np.float32))
    y = ((x @ w1 + b1).gelu() @ w2 + b2) + x
    kernels = _kernels(y)
    assert [k.kind for k in kernels] == ["matmul", "matmul"]
    xn = x.numpy().astype(np.float64)
    ref = _gelu(xn @ w1.numpy() + b1.numpy()) @ w2.numpy() + b2.numpy() + xn
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_epilogue_with_a_member_older_than_the_matmul():
    """The mask is computed before the matmul and joins the where's kernel: the epilogue group
    then holds a node older than its matmul (found by the fuzz test as a SchedulerError)."""
    rng = np.random.default_rng(9)
    xn, wn = _arr(rng, (3, 4), np.float32), _arr(rng, (4, 4), np.float32)
    x, w = lc.tensor(xn), lc.tensor(wn)
    mask = x > 0
    y = mask.where_cond((x @ w) * 0.5, x)
    assert len(_kernels(y)) == 1
    np.testing.assert_allclose(y.numpy(), np.where(xn > 0, (xn.astype(np.float64) @ wn) * 0.5, xn), rtol=1e-5, atol=1e-6)
