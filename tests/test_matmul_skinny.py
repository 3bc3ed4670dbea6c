"""The small-m GEMM (codegen/gemm_skinny.py, runtime/matmul_skinny.py): picked under the auto
backend for a few rows, for both forms of B (x @ w.T with w (n, k) row-major, and x @ w), with
the matmul epilogue applied in its store, and called inside the native program.  Checked
against NumPy in f64, and native against per-kernel execution bit for bit."""
import ctypes

import ml_dtypes
import numpy as np
import pytest

import lazycandle as lc
from lazycandle.dtype import DType
from lazycandle.layout import Layout
from lazycandle.runtime import matmul as MM
from lazycandle.runtime import matmul_skinny as SK

DTYPES = {"f32": (lc.f32, np.float32, 1e-5), "f64": (lc.f64, np.float64, 1e-12),
          "f16": (lc.f16, np.float16, 4e-3), "bf16": (lc.bf16, ml_dtypes.bfloat16, 3e-2)}


@pytest.fixture(autouse=True)
def auto_backend():
    old = lc.get_matmul_backend()
    lc.set_matmul_backend("auto")
    yield
    lc.set_matmul_backend(old)


def _arr(rng, shape, npdt, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(npdt)


def _close(got, ref, tol):
    scale = max(float(np.abs(ref).max()), 1.0)
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=tol, atol=tol * scale)


def _run_both(prog, feeds, monkeypatch):
    """(python-path outputs, native outputs), after checking the native program calls the
    small-m kernel in a phase (no Python matmul step)."""
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
    py = prog.run(**feeds)
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    nat = prog.run(**feeds)
    sched = prog.dump("schedule")
    assert "matmul (small-m)" in sched and "python step: MatmulStep" not in sched, sched
    return py, nat


def _assert_bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("form", ["t", "n"])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 5), (7, 15, 17), (15, 17, 33), (16, 100, 31),
                                   (17, 33, 9), (8, 768, 96), (3, 1, 70), (9, 64, 129), (5, 1000, 40),
                                   (16, 3001, 20)])
def test_small_m_matmul_matches_numpy_both_weight_forms_native_and_python_bit_identical(form, m, k, n, monkeypatch):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    x = _arr(rng, (m, k), np.float32)
    w = _arr(rng, (n, k) if form == "t" else (k, n), np.float32)
    xp, wp = lc.placeholder("x", x.shape, lc.f32), lc.placeholder("w", w.shape, lc.f32)
    prog = lc.compile([xp @ wp.T if form == "t" else xp @ wp])
    ref = x.astype(np.float64) @ (w.T if form == "t" else w).astype(np.float64)
    if m > SK.RULE_M:
        _close(prog.run(x=x, w=w)[0], ref, 1e-5)
        return
    (py,), (nat,) = _run_both(prog, dict(x=x, w=w), monkeypatch)
    _close(nat, ref, 1e-5)
    _assert_bits_equal(py, nat)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("form", ["t", "n"])
def test_small_m_matmul_dtypes_accumulate_in_their_compute_type(dt, form):
    ldt, npdt, tol = DTYPES[dt]
    rng = np.random.default_rng(7)
    m, k, n = 5, 37, 45
    x, w = _arr(rng, (m, k), npdt), _arr(rng, (n, k) if form == "t" else (k, n), npdt, k ** -0.5)
    X, W = lc.tensor(x), lc.tensor(w)
    got = (X @ W.T if form == "t" else X @ W).numpy()
    ref = x.astype(np.float64) @ (w.T if form == "t" else w).astype(np.float64)
    assert got.dtype == npdt
    _close(got, ref, tol)


def test_small_m_plan_is_chosen_for_both_forms_and_not_for_many_rows():
    f32 = DType.from_name("f32")
    t = MM.geometry(Layout((8, 64), (64, 1)), Layout((64, 32), (1, 64)), f32)
    n = MM.geometry(Layout((8, 64), (1, 8)), Layout((64, 32), (32, 1)), f32)
    big = MM.geometry(Layout((SK.MEASURED_M + 1, 64), (64, 1)), Layout((64, 32), (1, 64)), f32)
    ints = MM.geometry(Layout((8, 64), (64, 1)), Layout((64, 32), (1, 64)), DType.from_name("i32"))
    gap = MM.geometry(Layout((8, 64), (64, 1)), Layout((64, 32), (2, 128)), f32)
    assert SK.layout_of(SK._fold_batch(t)) == "t" and SK.layout_of(SK._fold_batch(n)) == "n"
    assert not SK.applies(big) and not SK.applies(ints) and not SK.applies(gap)
    assert MM.plan_for(Layout((8, 64), (64, 1)), Layout((64, 32), (1, 64)), f32, "auto", 1).backend == "skinny"
    assert MM.plan_for(Layout((8, 64), (64, 1)), Layout((64, 32), (1, 64)), f32, "blas", 1).backend == "blas"


def test_long_k_is_chunked_so_a_row_block_of_a_stays_in_l1():
    f32 = DType.from_name("f32")
    plan = SK.SkinnyPlan(MM.geometry(Layout((8, 3072), (3072, 1)), Layout((3072, 768), (1, 3072)), f32), 1)
    size = dict(zip(SK.K.SIZES, plan.sizes_list))
    assert size["kchunks"] > 1 and size["kc"] * plan.spec.mr * 4 <= SK.A_L1_BYTES and size["kc"] % plan.spec.vw == 0
    f16 = DType.from_name("f16")         # partial sums would round to f16: never chunked
    plan = SK.SkinnyPlan(MM.geometry(Layout((8, 3072), (3072, 1)), Layout((3072, 768), (1, 3072)), f16), 1)
    assert dict(zip(SK.K.SIZES, plan.sizes_list))["kchunks"] == 1


def test_rows_per_block_is_a_power_of_two_holding_m_up_to_the_register_limit():
    top = SK.K.max_rows()
    assert SK.rows_per_block(1) == 1 and SK.rows_per_block(3) == 4 and SK.rows_per_block(top) == top
    assert SK.rows_per_block(top + 1) == top and SK.rows_per_block(100) == top
    assert {SK.rows_per_block(m) for m in range(1, 130)} == {1 << i for i in range(top.bit_length())}


@pytest.mark.parametrize("case", ["x_transposed_w_nk", "x_transposed_w_kn", "w_rows_with_gap",
                                  "x_every_other_row", "w_every_other_column"])
def test_small_m_matmul_on_strided_views_matches_numpy(case):
    rng = np.random.default_rng(11)
    m, k, n = 6, 40, 24
    X = lc.tensor(_arr(rng, (m, k), np.float32))
    W = lc.tensor(_arr(rng, (n, k), np.float32)).T                        # (k, n), k stride 1
    if case.startswith("x_transposed"):                                  # a's k stride is m
        X = lc.tensor(_arr(rng, (k, m), np.float32)).T
        if case.endswith("kn"):
            W = lc.tensor(_arr(rng, (k, n), np.float32))
    elif case == "w_rows_with_gap":                                      # ldb = 50 > k
        W = lc.tensor(_arr(rng, (n, 50), np.float32))[:, 5:5 + k].T
    elif case == "x_every_other_row":
        X = lc.tensor(_arr(rng, (2 * m + 3, k), np.float32))[3::2]
    else:                                                                # no unit stride in w
        W = lc.tensor(_arr(rng, (k, 2 * n), np.float32))[:, ::2]
    ref = X.numpy().astype(np.float64) @ W.numpy().astype(np.float64)
    _close((X @ W).numpy(), ref, 1e-5)


@pytest.mark.parametrize("shape_x,shape_w", [((2, 3, 40), (24, 40)), ((4, 1, 40), (24, 40)),
                                             ((3, 5, 16), (3, 9, 16)), ((2, 2, 3, 16), (2, 2, 9, 16))])
def test_small_m_batched_and_broadcast_weight_matches_numpy(shape_x, shape_w, monkeypatch):
    rng = np.random.default_rng(13)
    x, w = _arr(rng, shape_x, np.float32), _arr(rng, shape_w, np.float32)
    xp, wp = lc.placeholder("x", x.shape, lc.f32), lc.placeholder("w", w.shape, lc.f32)
    prog = lc.compile([xp @ wp.transpose(-2, -1)])
    ref = x.astype(np.float64) @ np.swapaxes(w, -1, -2).astype(np.float64)
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")
    py = prog.run(x=x, w=w)[0]
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    nat = prog.run(x=x, w=w)[0]
    _close(nat, ref, 1e-5)
    _assert_bits_equal(py, nat)


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("form,k", [("t", 53), ("n", 53), ("t", 1001), ("n", 1001)])    # k = 1001: k chunks
@pytest.mark.parametrize("epilogue", ["bias_gelu", "residual", "scaled_bias_relu", "row_bias", "strided_residual"])
def test_small_m_epilogue_applied_in_the_store_matches_numpy(form, k, epilogue, monkeypatch):
    rng = np.random.default_rng(17)
    m, n = 7, 70
    x, r = _arr(rng, (1, m, k), np.float32), _arr(rng, (1, m, n), np.float32)
    w = _arr(rng, (n, k) if form == "t" else (k, n), np.float32, k ** -0.5)
    b, c, rt = _arr(rng, (n,), np.float32), _arr(rng, (m, 1), np.float32), _arr(rng, (1, n, m), np.float32)
    xp, wp, bp, rp, cp, rtp = (lc.placeholder(nm, a.shape, lc.f32) for nm, a in
                               (("x", x), ("w", w), ("b", b), ("r", r), ("c", c), ("rt", rt)))
    y = xp @ (wp.T if form == "t" else wp)
    y64 = x.astype(np.float64) @ (w.T if form == "t" else w).astype(np.float64)
    out, ref = {"bias_gelu": ((y + bp).gelu(), _gelu(y64 + b)),
                "residual": (rp + y + bp, r + y64 + b),
                "scaled_bias_relu": ((y * 0.5 + bp).relu(), np.maximum(y64 * 0.5 + b, 0)),
                "row_bias": (y - cp, y64 - c),      # strided_residual: column stride m, read lane by lane
                "strided_residual": (rtp.transpose(1, 2) + y, rt.transpose(0, 2, 1) + y64)}[epilogue]
    prog = lc.compile([out])
    assert len(prog._fixed.plan.kernels) == 1
    feeds = {nm: a for nm, a in dict(x=x, w=w, b=b, r=r, c=c, rt=rt).items() if nm in {i[0] for i in prog.inputs}}
    (py,), (nat,) = _run_both(prog, feeds, monkeypatch)
    _close(nat, ref, 1e-5)
    _assert_bits_equal(py, nat)


def test_zero_size_small_m_matmuls():
    for m, k, n in [(0, 5, 7), (3, 0, 7), (3, 5, 0)]:
        x, w = np.ones((m, k), np.float32), np.ones((n, k), np.float32)
        got = (lc.tensor(x) @ lc.tensor(w).T).numpy()
        np.testing.assert_array_equal(got, np.zeros((m, n), np.float32) + (x @ w.T))


def test_gpt2_style_linear_chain_runs_as_one_native_segment(monkeypatch):
    rng = np.random.default_rng(19)
    x = _arr(rng, (1, 8, 64), np.float32)
    w1, b1 = _arr(rng, (256, 64), np.float32, 0.1), _arr(rng, (256,), np.float32)
    w2, b2 = _arr(rng, (64, 256), np.float32, 0.1), _arr(rng, (64,), np.float32)
    ps = {nm: lc.placeholder(nm, a.shape, lc.f32) for nm, a in (("x", x), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))}
    h = lc.nn.linear(lc.nn.linear(ps["x"], ps["w1"], ps["b1"]).gelu(), ps["w2"], ps["b2"]) + ps["x"]
    prog = lc.compile([h])
    (py,), (nat,) = _run_both(prog, dict(x=x, w1=w1, b1=b1, w2=w2, b2=b2), monkeypatch)
    assert prog.dump("schedule").count("segment ") == 1
    ref = _gelu(x.astype(np.float64) @ w1.T + b1) @ w2.T + b2 + x
    _close(nat, ref, 1e-5)
    _assert_bits_equal(py, nat)


def test_auto_runs_small_m_kernel_by_rule_then_where_it_measured_fastest(monkeypatch):
    from lazycandle import clear_caches
    from lazycandle.runtime import matmul_auto
    timings = {"blas": 2.0, "tiled": 3.0, "skinny": 1.0}
    calls = []

    def fake_measure(g, threads, make_plans):
        calls.append(sorted(make_plans(g)))
        return {k: timings[k] for k in make_plans(g)}

    monkeypatch.setattr(matmul_auto, "measure", fake_measure)
    monkeypatch.setenv("LAZYCANDLE_CACHE_DIR", "off")      # the choices are made in memory only
    f32 = DType.from_name("f32")

    def backend(m):
        return MM.plan_for(Layout((m, 64), (64, 1)), Layout((64, 48), (1, 64)), f32, "auto", 1).backend
    clear_caches()
    assert backend(SK.RULE_M) == "skinny" and not calls              # by rule: nothing timed
    assert backend(40) == "skinny" and calls == [["blas", "skinny", "tiled"]]
    assert backend(41) == "skinny" and len(calls) == 1               # same bucket
    timings.update(skinny=5.0)
    clear_caches()
    assert backend(40) == "blas" and len(calls) == 3                 # small-m lost, then blas vs tiled
    timings.update(skinny=1.0, blas=1.0 + 2 * SK.WIN_MARGIN)
    clear_caches()
    assert backend(40) == "skinny"                                   # won by more than the margin
    timings.update(blas=1.0 + SK.WIN_MARGIN / 2)
    clear_caches()
    assert backend(40) == "blas"                                     # a close call keeps BLAS
    clear_caches()


@pytest.mark.parametrize("form", ["t", "n"])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_eager_small_m_matmul_on_two_threads_runs_on_the_native_pool_and_equals_one_thread(form, dt, monkeypatch):
    """An eager small-m matmul big enough to split (SkinnyPlan.run) runs its units on the native
    pool at 2 threads, each unit computed alone: the same bits as one thread, NumPy's values."""
    from lazycandle.runtime import native_pool
    lcdt, npdt, tol = DTYPES[dt]
    rng = np.random.default_rng(11)
    x = _arr(rng, (3, 768), npdt)
    w = _arr(rng, (1536, 768) if form == "t" else (768, 1536), npdt)
    xt, wt = lc.tensor(x), lc.tensor(w)
    rhs = wt.transpose(0, 1) if form == "t" else wt
    calls = []
    real = native_pool.parallel
    monkeypatch.setattr(native_pool, "parallel", lambda *a: calls.append(a[-1]) or real(*a))
    outs = {}
    for threads in (1, 2):
        with lc.num_threads(threads):
            plan = MM.plan_for(xt._node.layout, rhs._node.layout, lcdt, "auto", threads)
            assert isinstance(plan, SK.SkinnyPlan)
            outs[threads] = (xt @ rhs).numpy()
    assert calls == [2]
    _assert_bits_equal(outs[1], outs[2])
    ref = x.astype(np.float64) @ (w.astype(np.float64).T if form == "t" else w.astype(np.float64))
    _close(outs[2], ref, tol * 10)


@pytest.mark.parametrize("form,m,k,n", [("t", 16, 384, 1536), ("t", 7, 3072, 70), ("n", 16, 384, 1536), ("n", 5, 200, 70)])
def test_small_m_epilogue_runs_once_per_unit_over_all_its_rows_and_columns(form, m, k, n):
    """The epilogue's tile function gets a whole unit (m rows x the unit's columns) after its last
    k chunk: called per group, "t" tiles were 3 columns wide, so gelu_erf ran in 3 of 16 lanes
    (16 x 384 @ 384 x 1536 + bias + gelu: 620 us against 245 without the gelu)."""
    f32 = DType.from_name("f32")
    b = Layout((k, n), (1, k)) if form == "t" else Layout((k, n), (n, 1))
    plan = SK.SkinnyPlan(MM.geometry(Layout((m, k), (k, 1)), b, f32), 1)
    size = dict(zip(SK.K.SIZES, plan.sizes_list))
    calls = []
    x, w = np.ones((m, k), np.float32), np.ones((n, k) if form == "t" else (k, n), np.float32)
    out = np.zeros((m, n), np.float32)
    tile = ctypes.CFUNCTYPE(None, *(ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64) + (ctypes.c_void_p,) * 4)(
        lambda t, ldo, rows, cols, *_: calls.append(((t - out.ctypes.data) // 4, ldo, rows, cols)))
    plan.sizes[SK.K.SIZES.index("ep_fn")] = ctypes.cast(tile, ctypes.c_void_p).value
    plan.run(x.ctypes.data, w.ctypes.data, out.ctypes.data)
    ucols = size["ucols"]
    assert calls == [(j, n, m, min(ucols, n - j)) for j in range(0, n, ucols)]
    np.testing.assert_array_equal(out, np.full((m, n), k, np.float32))
