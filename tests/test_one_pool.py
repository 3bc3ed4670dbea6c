"""One thread pool (issue 38): every user of the former Python pool runs on the native pool --
the per-kernel executor (LAZYCANDLE_EXEC=python), the sized node steps (index, im2col,
attention), BLAS GEMM tasks (codegen/task_ir.py calls cblas from native code), the gemm_copy
operand copies, argsort (per-chunk workspace through lc_task_scratch), sort_take, cumsum,
slice_set_'s row writes and the quantized kernels.  Each runs once on the calling thread (1
thread) and once split over the pool (2 threads, thresholds at 0), counted through
native_pool.parallel, and both equal NumPy."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle.runtime import matmul as MM, matmul_blas, native_pool


@pytest.fixture(params=["serial", "parallel"])
def split(request, monkeypatch):
    """(mode, list of thread counts native_pool.parallel ran with) under that split."""
    calls = []
    real = native_pool.parallel
    monkeypatch.setattr(native_pool, "parallel", lambda *a, **k: (calls.append(a[7] if len(a) > 7 else k), real(*a, **k)))
    monkeypatch.setattr(MM, "_plans", {})
    if request.param == "parallel":
        monkeypatch.setattr(native_pool, "MIN_COST", 0.0)
        monkeypatch.setattr(matmul_blas, "PARALLEL_MIN_FLOPS", 1.0)
        threads = 2
    else:
        threads = 1
    with lc.num_threads(threads):
        yield request.param, calls


def _check_path(split):
    mode, calls = split
    assert bool(calls) is (mode == "parallel"), calls


@pytest.fixture
def python_exec(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")


def test_executor_kernels(split, python_exec):
    x = np.random.default_rng(0).standard_normal((67, 301)).astype(np.float32)
    got = ((lc.tensor(x) * 2.0 + 1.0).exp().sum(-1)).numpy()
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64) * 2 + 1).sum(-1), rtol=1e-5)
    _check_path(split)


def test_sized_steps_index_im2col_attention(split, python_exec, monkeypatch):
    from lazycandle.runtime import steps
    kinds = []
    real = steps.Launch.run
    monkeypatch.setattr(steps.Launch, "run", lambda self, addrs: (kinds.append(type(self.spec).__name__), real(self, addrs)))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 33)).astype(np.float32)
    ids = rng.integers(0, 50, 40).astype(np.int64)
    np.testing.assert_array_equal(lc.tensor(x).index_select(lc.tensor(ids), 0).numpy(), x[ids])
    img = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    k = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    got = lc.tensor(img).conv2d(lc.tensor(k), padding=1).numpy()
    xp = np.pad(img.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = sum(np.einsum("bchw,oc->bohw", xp[:, :, i:i + 9, j:j + 11], k[:, :, i, j].astype(np.float64))
               for i in range(3) for j in range(3))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    q, kk, v = (rng.standard_normal((2, 3, 17, 16)).astype(np.float32) for _ in range(3))
    got = lc.nn.scaled_dot_product_attention(lc.tensor(q), lc.tensor(kk), lc.tensor(v)).numpy()
    s = q.astype(np.float64) @ np.swapaxes(kk, -1, -2) / 4.0
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-4, atol=1e-5)
    assert len(set(kinds)) >= 3, kinds           # index, im2col and attention launches
    _check_path(split)


@pytest.mark.parametrize("case", ["f32", "f64", "bf16 (copies)", "batched", "gemv rows", "gemv cols", "transposed"])
def test_blas_tasks(split, case, monkeypatch):
    rng = np.random.default_rng(2)
    dt, shapes = lc.f32, ((70, 33), (33, 50))
    if case == "f64":
        dt = lc.f64
    elif case == "batched":
        shapes = ((3, 40, 21), (3, 21, 30))
    elif case == "gemv rows":
        shapes = ((1, 64), (64, 90))
    elif case == "gemv cols":
        shapes = ((90, 64), (64, 1))
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    if case == "bf16 (copies)":
        dt = lc.bf16
        a, b = (lc.tensor(t).astype(lc.bf16).astype(lc.f32).numpy() for t in (a, b))
    ta, tb = lc.tensor(a, dt), lc.tensor(b, dt)
    if case == "transposed":
        ta = lc.tensor(np.ascontiguousarray(a.T), dt).t()
    backend = lc.get_matmul_backend()
    lc.set_matmul_backend("blas")
    try:
        got = (ta @ tb).astype(lc.f64).numpy()
    finally:
        lc.set_matmul_backend(backend)
    want = a.astype(np.float64) @ b.astype(np.float64)
    tol = 1e-2 if dt == lc.bf16 else 1e-5
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    _check_path(split)


@pytest.mark.parametrize("shape", [(37, 100), (5, 3000), (1, 70000)])
def test_argsort_sort_take_cumsum(split, shape):
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    x[0, :3] = x[0, 3]                               # ties keep their input order
    want_ids = np.argsort(x, -1, kind="stable")
    v, i = lc.tensor(x).sort_last_dim()
    lc.realize(v, i)
    np.testing.assert_array_equal(i.numpy(), want_ids)
    np.testing.assert_array_equal(v.numpy(), np.sort(x, -1))
    v, i = lc.tensor(x).sort_last_dim()
    i.realize()                                      # sort_take runs its own kernel
    np.testing.assert_array_equal(v.numpy(), np.sort(x, -1))
    c = lc.tensor(x).cumsum(-1).numpy()
    np.testing.assert_allclose(c, np.cumsum(x.astype(np.float64), -1), rtol=1e-4, atol=1e-3)
    if shape[0] > 1:
        _check_path(split)


def test_slice_set_inplace_rows(split):
    x = np.zeros((64, 8, 32), np.float32)
    src = np.random.default_rng(4).standard_normal((64, 3, 32)).astype(np.float32)
    t = lc.tensor(x)
    t.slice_set_(lc.tensor(src), 1, 2)
    want = x.copy()
    want[:, 2:5] = src
    np.testing.assert_array_equal(t.numpy(), want)
    _check_path(split)


def test_qmatmul_units(split):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((40, 256)).astype(np.float32)
    q = lc.quantize(lc.tensor(w), "q8_0")
    x = rng.standard_normal((3, 256)).astype(np.float32)
    got = lc.qmatmul(lc.tensor(x), q).numpy()
    ref = x.astype(np.float64) @ q.dequantize().numpy().astype(np.float64).T
    assert np.abs(got - ref).max() / np.abs(ref).max() < 2e-2
    _check_path(split)


def test_serial_and_parallel_splits_give_the_same_bits(monkeypatch, python_exec):
    """The split never changes a result: kernels' units are independent, so one thread and a
    forced pool split agree bit for bit."""
    x = np.random.default_rng(6).standard_normal((300, 129)).astype(np.float32)

    def run():
        v, i = lc.tensor(x).sort_last_dim()
        lc.realize(v, i)
        return [v.numpy(), i.numpy(), lc.tensor(x).cumsum(-1).numpy(), (lc.tensor(x) * 3.0).exp().sum(0).numpy()]

    with lc.num_threads(1):
        one = run()
    monkeypatch.setattr(native_pool, "MIN_COST", 0.0)
    with lc.num_threads(2):
        other = run()
    for p, q in zip(one, other):
        assert p.tobytes() == q.tobytes()
