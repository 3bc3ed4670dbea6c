"""The parallel tiled GEMM runs as one job of the native worker pool (codegen/gemm_pool.py):
results against a float64 NumPy oracle, one native section per call, concurrent callers of
one plan, a call from a Python pool worker, and the fused epilogue at 2 threads."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import lazycandle as lc
from lazycandle import config
from lazycandle import dtype as D
from lazycandle.layout import Layout
from lazycandle.runtime import matmul as MM, native_pool, pool


def _plan(m, k, n, threads, batch=()):
    la, lb = Layout.contiguous(batch + (m, k)), Layout.contiguous(batch + (k, n))
    return MM.TiledPlan(MM.geometry(la, lb, D.f32), threads)


def _operands(rng, m, k, n, batch=()):
    a = rng.standard_normal(batch + (m, k)).astype(np.float32)
    b = rng.standard_normal(batch + (k, n)).astype(np.float32)
    return a, b, np.full(batch + (m, n), np.nan, np.float32)


def _close(out, a, b):
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


@pytest.fixture
def two_threads():
    old = config.get_num_threads()
    config.set_num_threads(2)
    yield
    config.set_num_threads(old)


@pytest.mark.parametrize("m,k,n,batch", [(256, 256, 256, ()), (301, 77, 250, ()), (37, 130, 90, (5,)),
                                         (200, 3, 1000, ())])
def test_parallel_tiled_gemm_is_one_native_section_and_matches_numpy(monkeypatch, two_threads, m, k, n, batch):
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    calls = []
    real = native_pool.run_jobs
    monkeypatch.setattr(native_pool, "run_jobs", lambda *a: (calls.append(a), real(*a)))
    monkeypatch.setattr(pool, "parallel_for", lambda *a, **k: pytest.fail("tiled GEMM used the Python pool"))
    p = _plan(m, k, n, 2, batch)
    assert p.parallel
    a, b, out = _operands(np.random.default_rng(1), m, k, n, batch)
    p.run(a.ctypes.data, b.ctypes.data, out.ctypes.data)
    _close(out, a, b)
    p.run(a.ctypes.data, b.ctypes.data, out.ctypes.data)      # the task counter starts again at 0
    _close(out, a, b)
    assert len(calls) == 2


def test_concurrent_callers_of_one_parallel_plan(monkeypatch, two_threads):
    """Callers that find the plan busy run on copies of its parameter block and job words."""
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    p = _plan(96, 64, 130, 2)
    rng = np.random.default_rng(2)
    work = [_operands(rng, 96, 64, 130) for _ in range(4)]
    errors = []

    def caller(a, b, out):
        try:
            for _ in range(20):
                p.run(a.ctypes.data, b.ctypes.data, out.ctypes.data)
                _close(out, a, b)
        except Exception as e:         # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=caller, args=w) for w in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_parallel_tiled_gemm_from_a_python_pool_worker_runs_inline(monkeypatch, two_threads):
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    real, on_worker = native_pool.run_jobs, []
    monkeypatch.setattr(native_pool, "run_jobs",
                        lambda *a: (on_worker.append(getattr(pool._in_worker, "flag", False)), real(*a)))
    p = _plan(70, 50, 90, 2)
    rng = np.random.default_rng(3)
    work = [_operands(rng, 70, 50, 90) for _ in range(2)]

    ran_on_worker = []

    def chunk(lo, hi):
        ran_on_worker.append(getattr(pool._in_worker, "flag", False))
        for a, b, out in work[lo:hi]:
            p.run(a.ctypes.data, b.ctypes.data, out.ctypes.data)

    pool.parallel_for(chunk, 0, 2, cost_per_item=1e12, min_cost=0, threads=2)
    for a, b, out in work:
        _close(out, a, b)
    assert any(ran_on_worker) and not any(on_worker)


def test_fused_bias_gelu_epilogue_on_the_native_parallel_path(monkeypatch, two_threads):
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "_plans", {})
    rng = np.random.default_rng(4)
    x = rng.standard_normal((130, 70)).astype(np.float32)
    w = rng.standard_normal((70, 200)).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    old = config.get_matmul_backend()
    config.set_matmul_backend("tiled")
    try:
        got = (lc.tensor(x) @ lc.tensor(w) + lc.tensor(bias)).gelu().numpy()
    finally:
        config.set_matmul_backend(old)
    y = x.astype(np.float64) @ w + bias
    ref = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
