"""Matmul through the Tensor API: broadcasting on either side, strided operands, zero sizes,
every backend, and the call-time errors."""
import itertools

import ml_dtypes
import numpy as np
import pytest

import lazycandle as lc

rng = np.random.default_rng(5)


@pytest.fixture(params=["auto", "blas", "tiled"])
def backend(request):
    old = lc.get_matmul_backend()
    lc.set_matmul_backend(request.param)
    yield request.param
    lc.set_matmul_backend(old)


def _ref(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


@pytest.mark.parametrize("ashape,bshape", [((7, 5), (5, 3)), ((2, 7, 5), (5, 3)), ((7, 5), (4, 5, 3)),
                                           ((3, 1, 4, 6), (2, 6, 5)), ((1, 9, 4), (3, 4, 2))])
def test_broadcast_matmul(backend, ashape, bshape):
    a = rng.standard_normal(ashape).astype(np.float32)
    b = rng.standard_normal(bshape).astype(np.float32)
    got = (lc.tensor(a) @ lc.tensor(b)).numpy()
    np.testing.assert_allclose(got, _ref(a, b), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lc.tensor(a).broadcast_matmul(lc.tensor(b)).numpy(), _ref(a, b), rtol=1e-5, atol=1e-5)


def test_broadcast_lhs_is_right(backend):
    # candle 0.11 lays this out as (m, b*n) without an error
    a = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal((8, 32, 48)).astype(np.float32)
    got = (lc.tensor(a) @ lc.tensor(b)).numpy()
    assert got.shape == (8, 64, 48)
    np.testing.assert_allclose(got, _ref(a, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("view", ["t", "narrow", "step", "broadcast", "permuted_batch"])
def test_strided_operands(backend, view):
    x = rng.standard_normal((6, 20, 18)).astype(np.float32)
    y = rng.standard_normal((6, 18, 11)).astype(np.float32)
    tx, ty = lc.tensor(x), lc.tensor(y)
    cases = {
        "t": (lc.tensor(np.ascontiguousarray(x.transpose(0, 2, 1))).transpose(1, 2), ty, x, y),
        "narrow": (tx.narrow(1, 2, 15), ty, x[:, 2:17], y),
        "step": (tx[:, ::2, :], ty, x[:, ::2], y),
        "broadcast": (lc.tensor(x[0]).broadcast_as((6, 20, 18)), ty, np.broadcast_to(x[0], (6, 20, 18)), y),
        "permuted_batch": (lc.tensor(np.ascontiguousarray(x.transpose(1, 0, 2))).permute(1, 0, 2), ty, x, y),
    }
    ta, tb, na, nb = cases[view]
    np.testing.assert_allclose((ta @ tb).numpy(), _ref(na, nb), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,k,n", list(itertools.product([0, 1, 3], [0, 1, 5], [0, 2])))
def test_zero_and_tiny_sizes(backend, m, k, n):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = (lc.tensor(a) @ lc.tensor(b)).numpy()
    assert got.shape == (m, n)
    np.testing.assert_allclose(got, _ref(a, b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dt", [np.float64, np.float16, ml_dtypes.bfloat16, np.int32, np.int64, np.uint32])
def test_dtypes(backend, dt):
    if np.dtype(dt).kind in "iu":
        a = rng.integers(0, 50, (9, 13)).astype(dt)
        b = rng.integers(0, 50, (13, 6)).astype(dt)
        np.testing.assert_array_equal((lc.tensor(a) @ lc.tensor(b)).numpy(), np.matmul(a, b))
        return
    a = rng.integers(-4, 4, (9, 13)).astype(dt)
    b = rng.integers(-4, 4, (13, 6)).astype(dt)
    got = (lc.tensor(a) @ lc.tensor(b)).numpy()
    assert got.dtype == np.dtype(dt)
    np.testing.assert_array_equal(got.astype(np.float64), _ref(a, b))


def test_bias_and_activation_fuse_into_the_matmul_kernel():
    x = lc.tensor(rng.standard_normal((16, 8)).astype(np.float32))
    w = lc.tensor(rng.standard_normal((8, 4)).astype(np.float32))
    b = lc.tensor(rng.standard_normal(4).astype(np.float32))
    y = (x @ w).broadcast_add(b).relu()
    sched = lc.dump(y, stage="schedule")
    mm_id, add_id, relu_id = y._node.srcs[0].srcs[0].id, y._node.srcs[0].id, y._node.id   # user-graph ids
    assert sched.count("kernel ") == 1 and "matmul [" in sched
    assert f"fuses %{mm_id} matmul, %{add_id} add, %{relu_id} relu" in sched and "epilogue add, relu applied" in sched
    np.testing.assert_allclose(y.numpy(), np.maximum(_ref(x.numpy(), w.numpy()) + b.numpy(), 0), rtol=1e-5, atol=1e-5)


def test_matmul_errors():
    a = lc.tensor(np.ones((2, 3, 4), np.float32))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="matmul"):
        a.matmul(lc.tensor(np.ones((5, 2), np.float32)))          # k mismatch
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="batch"):
        a.matmul(lc.tensor(np.ones((3, 4, 2), np.float32)))       # batch mismatch
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        lc.tensor(np.ones(4, np.float32)).matmul(lc.tensor(np.ones((4, 2), np.float32)))   # rank 1
    with pytest.raises(lc.DTypeMismatchBinaryOp):
        a.matmul(lc.tensor(np.ones((2, 4, 2), np.float64)))
    f4 = lc.tensor(np.ones((2, 2), np.float32)).to_dtype(lc.f4)
    with pytest.raises(lc.UnsupportedDTypeForOp):
        f4.matmul(f4)
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        lc.tensor(np.ones((2, 3, 4), np.float32)) @ lc.tensor(np.ones((5, 4, 2), np.float32))


def test_threads_identical():
    a = lc.tensor(rng.standard_normal((4, 130, 70)).astype(np.float32))
    b = lc.tensor(rng.standard_normal((70, 90)).astype(np.float32))
    with lc.num_threads(1):
        r1 = (a @ b).numpy()
    with lc.num_threads(2):
        r2 = (a @ b).numpy()
    np.testing.assert_array_equal(r1, r2)


@pytest.mark.parametrize("view", ["plain", "t", "narrow", "broadcast"])
@pytest.mark.parametrize("dt", [np.float32, np.float16, np.int32])
def test_lone_eager_matmul_runs_its_gemm_plan_without_a_compiled_plan(backend, view, dt, monkeypatch):
    """An eager matmul of realized operands runs the GEMM plan directly (compiler.
    _realize_lone_matmul) and gives what the compiled Program gives, bit for bit; profiling
    takes the compiled plan (it times kernels)."""
    x = rng.integers(-3, 4, (3, 21, 17)).astype(dt)
    y = rng.integers(-3, 4, (17, 12)).astype(dt)
    tx, ty = lc.tensor(x), lc.tensor(y)
    ops = {"plain": (tx, ty), "t": (lc.tensor(np.ascontiguousarray(x.transpose(0, 2, 1))).transpose(1, 2), ty),
           "narrow": (tx.narrow(1, 3, 11), ty.narrow(1, 2, 9)), "broadcast": (tx[0], ty.broadcast_as((3, 17, 12)))}
    a, b = ops[view]
    prog = lc.compile([lc.placeholder("a", a.shape, a.dtype) @ lc.placeholder("b", b.shape, b.dtype)])
    want, = prog.run(a=np.ascontiguousarray(a.numpy()), b=np.ascontiguousarray(b.numpy()))
    lc.clear_caches()
    got = (a @ b).numpy()
    assert lc.cache_info()["caches"]["plans"] == 0
    np.testing.assert_array_equal(got, want)
    flat = (a @ b).reshape(-1).numpy()      # a contiguous view of the product aliases its buffer
    assert lc.cache_info()["caches"]["plans"] == 0
    np.testing.assert_array_equal(flat, want.reshape(-1))
    from lazycandle.runtime import profile
    seen = []
    monkeypatch.setattr(profile, "record", lambda plan, seconds: seen.append(len(seconds)))
    monkeypatch.setenv("LAZYCANDLE_PROFILE", "1")
    np.testing.assert_array_equal((a @ b).numpy(), want)
    assert lc.cache_info()["caches"]["plans"] == 1 and seen == [1]
