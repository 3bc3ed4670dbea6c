"""The parallel tiled GEMM runs as one job of the native worker pool (codegen/gemm_pool.py):
results against a float64 NumPy oracle, one native section per call, concurrent callers of
one plan, and the fused epilogue at 2 threads."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from conftest import run_in_threads
from lazycandle import config
from lazycandle import dtype as D
from lazycandle.layout import Layout
from lazycandle.runtime import matmul as MM, native_pool


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
    monkeypatch.setattr(MM, "SHARED_B_MIN_FLOPS", 0)
    calls = []
    real = native_pool.run_jobs
    monkeypatch.setattr(native_pool, "run_jobs", lambda *a: (calls.append(a), real(*a)))
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
    monkeypatch.setattr(MM, "SHARED_B_MIN_FLOPS", 0)
    p = _plan(96, 64, 130, 2)
    rng = np.random.default_rng(2)
    work = [_operands(rng, 96, 64, 130) for _ in range(4)]

    def caller(i):
        a, b, out = work[i]
        for _ in range(20):
            p.run(a.ctypes.data, b.ctypes.data, out.ctypes.data)
            _close(out, a, b)

    errors = run_in_threads(caller, len(work))
    assert not errors, errors[0]


@pytest.mark.parametrize("tiles", [8, 21])        # 21 row tiles: B packed once, shared by the threads
def test_fused_bias_gelu_epilogue_on_the_native_parallel_path(monkeypatch, two_threads, tiles):
    m = (tiles - 1) * MM._tile_kernel(D.f32)[0].mr + 2      # the host's register tile sets the count
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "SHARED_B_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "_plans", {})
    rng = np.random.default_rng(4)
    x = rng.standard_normal((m, 70)).astype(np.float32)
    w = rng.standard_normal((70, 200)).astype(np.float32)
    bias = rng.standard_normal(200).astype(np.float32)
    old = config.get_matmul_backend()
    config.set_matmul_backend("tiled")
    try:
        got = (lc.tensor(x) @ lc.tensor(w) + lc.tensor(bias)).gelu().numpy()
    finally:
        config.set_matmul_backend(old)
    assert any(getattr(p, "shared_rows", 0) for p in MM._plans.values()) == (tiles == 21)
    y = x.astype(np.float64) @ w + bias
    ref = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def _layouts(rng, dt, a_shape, b_shape, b_strides=None):
    def buf(shape, strides=None):
        if strides is None:
            x = rng.integers(-3, 4, shape).astype(dt.numpy)
            return x, Layout.contiguous(shape), x
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
        flat = rng.integers(-3, 4, span).astype(dt.numpy)
        view = np.lib.stride_tricks.as_strided(flat, shape, [s * flat.itemsize for s in strides])
        return flat, Layout(tuple(shape), tuple(strides), 0), view
    return buf(a_shape), buf(b_shape, b_strides)


@pytest.mark.parametrize("dt", [D.f32, D.f64, D.bf16, D.i32], ids=lambda d: d.name)
@pytest.mark.parametrize("a_shape,b_shape,b_strides", [
    ((301, 77), (77, 250), None),                 # ragged row tiles, panels and k
    ((260, 300), (300, 97), (1, 300)),            # transposed B, several KC blocks (patched KC)
    ((4, 70, 45), (4, 45, 66), (0, 66, 1)),       # one B broadcast over the batch
])
def test_parallel_tiled_gemm_packs_b_once_and_matches_one_thread_bit_for_bit(monkeypatch, dt, a_shape, b_shape,
                                                                           b_strides):
    """A parallel plan whose B is one matrix packs it once, shared by every thread (KC blocks
    x panel groups as tasks), then splits rows: the result is the 1-thread result exactly."""
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "SHARED_B_MIN_FLOPS", 0)
    real = MM._blocking
    monkeypatch.setattr(MM, "_blocking", lambda spec, ab, k: (real(spec, ab, k)[0], 64, real(spec, ab, k)[2]))
    (abuf, la, av), (bbuf, lb, bv) = _layouts(np.random.default_rng(5), dt, a_shape, b_shape, b_strides)
    g = MM.geometry(la, lb, dt)
    def check(p, threads):
        partial_sums = MM._tile_kernel(dt)[3] and g.k > 64      # 16-bit output over KC blocks: scratch W
        few_rows = g.nbatch * -(-g.m // MM._tile_kernel(dt)[0].mr) < 8 * threads   # (AMX's 32-row tiles)
        assert bool(p.shared_rows) == (threads > 1 and not partial_sums and not few_rows) \
            and p.parallel == (threads > 1)
        if p.shared_rows:
            assert p.npack == -(-g.k // 64) * -(-g.n // p.params[MM._BGROUP_SLOT])
    out_shape = np.broadcast_shapes(av.shape[:-1] + (1,), bv.shape[:-2] + (1, bv.shape[-1]))
    _run_at_one_and_two_threads(g, dt, (abuf, av), (bbuf, bv), out_shape, check)


def _run_at_one_and_two_threads(g, dt, a, b, out_shape, check):
    """The tiled plan of `g` run at 1 and 2 threads (`check(plan, threads)` first): the 1-thread
    result against NumPy in f64, the 2-thread one equal to it bit for bit."""
    (abuf, av), (bbuf, bv) = a, b
    outs = []
    for threads in (1, 2):
        p = MM.TiledPlan(g, threads)
        check(p, threads)
        out = np.full(out_shape, 7, dt.numpy)
        native_pool.ensure(threads)
        p.run(abuf.ctypes.data, bbuf.ctypes.data, out.ctypes.data)
        outs.append(out)
    ref = np.matmul(av.astype(np.float64), bv.astype(np.float64))
    if dt.is_int:
        np.testing.assert_array_equal(outs[0], ref.astype(dt.numpy))
    else:
        np.testing.assert_allclose(outs[0].astype(np.float64), ref.astype(dt.numpy).astype(np.float64), rtol=0,
                                   atol=1e-2 if dt is D.bf16 else 1e-6)
    np.testing.assert_array_equal(outs[1], outs[0])


def test_b_is_not_shared_when_it_differs_per_batch_or_the_rows_are_few(monkeypatch):
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "SHARED_B_MIN_FLOPS", 0)
    assert _plan(301, 77, 250, 2).shared_rows
    mr = MM._tile_kernel(D.f32)[0].mr
    assert not _plan(7 * mr, 64, 130, 2).shared_rows        # 7 row tiles: the n split keeps both busy
    assert not _plan(301, 77, 250, 2, (3,)).shared_rows     # a B per batch element: tasks are batches
    assert not _plan(301, 77, 250, 1).shared_rows


def test_b_is_shared_only_from_shared_b_min_flops():
    """256^2 at 2 threads: the n split (each thread packs A and its half of B), 512^2 shared."""
    assert MM.SHARED_B_MIN_FLOPS > 2 * 256 ** 3
    p = _plan(256, 256, 256, 2)
    assert not p.shared_rows and p.parallel and p.ntask == 2
    assert _plan(512, 512, 512, 2).shared_rows


def test_a_shared_b_plan_cuts_its_rows_into_about_8_tasks_per_thread():
    """Small tasks from a counter: a thread the machine preempts holds up at most one small
    task (512^2 at 2 threads, 14-row tiles: 37 row tiles in 13 tasks of 3, not 8 of 5)."""
    p = _plan(512, 512, 512, 2)
    assert p.shared_rows and p.ntask > 4 * 2


def test_concurrent_callers_of_a_shared_b_plan(monkeypatch, two_threads):
    """Concurrent callers get their own job words and counters, and each caller's thread its own
    shared-B scratch."""
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "SHARED_B_MIN_FLOPS", 0)
    p = _plan(250, 64, 130, 2)
    assert p.shared_rows
    rng = np.random.default_rng(6)
    work = [_operands(rng, 250, 64, 130) for _ in range(3)]

    def caller(i):
        a, b, out = work[i]
        for _ in range(10):
            out.fill(np.nan)
            p.run(a.ctypes.data, b.ctypes.data, out.ctypes.data)
            _close(out, a, b)

    errors = run_in_threads(caller, len(work))
    assert not errors, errors[0]


def test_a_2048_square_b_is_packed_once_for_both_threads_in_row_tasks_of_one_mc_block():
    """2048^2 at 2 threads: the 16 MB packed B is shared (not the 2-task n split, which packs
    A again per column block and stalls on one descheduled thread), in ~25 tasks."""
    p = _plan(2048, 2048, 2048, 2)
    assert p.shared_rows and p.ntask >= 8 * 2 and p.parallel


def test_a_large_problem_whose_b_is_not_shared_is_cut_into_a_grid_of_tasks():
    """A B over SHARED_B_MAX_BYTES (4096^2 f32: 64 MB): rows x columns blocks, ~4 tasks a
    thread (whole register tiles), fewest packs: cut along both dims, never 8 thin strips."""
    p = _plan(4096, 4096, 4096, 2)
    assert not p.shared_rows
    mchunk, nchunk = p.params[MM.gemm.param_index("mchunk")], p.params[MM.gemm.param_index("nchunk")]
    spec = MM._tile_kernel(D.f32)[0]
    assert p.ntask >= 4 * 2 and mchunk < 4096 and nchunk < 4096
    assert mchunk % spec.mr == 0 and nchunk % spec.nr == 0
    assert MM._chunks(1, 4096, 4096, 14, 32, 2.0 * 4096 ** 3, 1) == (4096, 4096)    # 1 thread: one task


@pytest.mark.parametrize("dt", [D.f32, D.f64, D.bf16, D.i32], ids=lambda d: d.name)
@pytest.mark.parametrize("a_shape,a_strides,b_shape,b_strides", [
    ((301, 77), None, (77, 250), None),                   # ragged row tiles, panels and k
    ((260, 300), (1, 260), (300, 97), (1, 300)),          # both transposed, several KC blocks
    ((3, 70, 45), None, (3, 45, 66), None),               # a B per batch element, 3 over 2 threads
])
def test_the_task_grid_of_a_large_problem_matches_one_thread_bit_for_bit(monkeypatch, dt, a_shape, a_strides,
                                                                          b_shape, b_strides):
    """The grid split (forced on small odd shapes) gives the 1-thread result exactly."""
    monkeypatch.setattr(MM, "PARALLEL_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "SHARED_B_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "BALANCED_MIN_FLOPS", 0)
    monkeypatch.setattr(MM, "SHARED_B_MAX_BYTES", 0)
    real = MM._blocking
    monkeypatch.setattr(MM, "_blocking", lambda spec, ab, k: (real(spec, ab, k)[0], 64, real(spec, ab, k)[2]))
    rng = np.random.default_rng(8)

    def buf(shape, strides):
        if strides is None:
            x = rng.integers(-3, 4, shape).astype(dt.numpy)
            return x, Layout.contiguous(shape), x
        x = rng.integers(-3, 4, shape[::-1]).astype(dt.numpy)     # the transpose's storage
        return x, Layout(tuple(shape), tuple(strides), 0), x.T
    (abuf, la, av), (bbuf, lb, bv) = buf(a_shape, a_strides), buf(b_shape, b_strides)
    g = MM.geometry(la, lb, dt)
    def check(p, threads):
        assert not p.shared_rows and p.parallel == (threads > 1)
        if threads > 1:
            assert p.ntask >= 4 * 2
    _run_at_one_and_two_threads(g, dt, (abuf, av), (bbuf, bv), av.shape[:-1] + (bv.shape[-1],), check)
