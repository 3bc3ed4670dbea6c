"""A new size of a named-dim program binds its tiled / BLAS / small-m GEMMs by arithmetic (issue
38 item 2, runtime/matmul_words.py): the words the binders write equal the plans' own
parameter blocks and task words, a new size in a regime builds no plan, measures nothing and
decides no backend, and every backend setting gives NumPy's product at every size (0, 1, odd,
across the small-m / tiled / BLAS regimes)."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle import dtype as D
from lazycandle.layout import Layout
from lazycandle.runtime import blas, matmul as MM, matmul_blas as MB, matmul_skinny as SK, matmul_words as MW


def _sized(form, la, lb, eps=()):
    return MW.layered(form, [len(x.shape) for x in (la, lb, *eps)])([la, lb, *eps])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_tiled_words_are_the_tiled_plans_parameters(threads, dt):
    """At every size its lines take, the words equal TiledPlan's parameter block (a, b, o and
    the scalars pointer excepted: written per run) and its task count, parallel flag and
    workspace; they return None where the plan would share B or split otherwise."""
    dtype = D.DType.from_name(dt)
    form = None
    for (m, k, n) in [(1, 8, 8), (37, 64, 40), (300, 32, 32), (5, 2000, 3), (129, 1500, 70), (2, 1, 1),
                      (700, 700, 300), (64, 64, 64), (0, 8, 8), (13, 0, 9), (2048, 64, 2048), (600, 128, 128)]:
        la, lb = Layout((m, k), (k, 1), 0), Layout((k, n), (1, k), 0)        # b transposed
        plan = MM.TiledPlan(MM.geometry(la, lb, dtype), threads)
        if form is None:
            form = MW.form_of(plan)
            assert isinstance(form, MW.TiledWords)
        got = _sized(form, la, lb)
        if not MW.TiledWords.applies(plan):
            assert got is None or plan.out_elems == 0, (m, k, n)
            continue
        words = list(got[0])
        want = list(plan.params)
        for slot in (*MM._ABO_SLOTS, MM._ESCAL_SLOT):
            want[slot] = words[slot] = 0
        assert words[:len(want)] == want, (m, k, n)
        ntask, parallel, ws_bytes = words[len(want):len(want) + 3]
        assert ntask == (plan.ntask if plan.out_elems else 0) and ws_bytes == plan.ws_bytes
        assert bool(parallel) == (plan.parallel if plan.out_elems else parallel)


@pytest.mark.skipif(not blas.available(), reason="no BLAS library")
@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True)])
def test_blas_words_are_the_blas_plans_task_words(ta, tb):
    form = None
    for m, k, n in [(7, 9, 11), (1, 30, 20), (40, 30, 1), (1, 5, 1), (300, 32, 32), (3, 1, 4)]:
        la = Layout((m, k), (1, m), 0) if ta else Layout((m, k), (k, 1), 0)
        lb = Layout((k, n), (1, k), 0) if tb else Layout((k, n), (n, 1), 0)
        plan = MB.BlasPlan(MM.geometry(la, lb, D.f32), 1)
        assert MW.BlasWords.applies(plan)
        form = form or MW.form_of(plan)
        words = list(_sized(form, la, lb)[0])
        assert words[:14] == list(plan.table) and words[14:17] == [1, m, n], (m, k, n)


def _mlp(width=24, hidden=40):
    """x (n, width) -> gelu(x @ w1 + bias) @ w2.T + x, then the same block again: GEMMs with a
    fused epilogue (bias broadcast over rows, a residual), plain and transposed weights."""
    rng = np.random.default_rng(3)
    ws = [(rng.standard_normal((width, hidden), np.float32) / 5, rng.standard_normal(hidden, np.float32),
           rng.standard_normal((width, hidden), np.float32) / 5) for _ in range(2)]
    x = lc.placeholder("x", ("n", width))
    h = x
    for w1, b1, w2 in ws:
        h = ((h @ lc.tensor(w1) + lc.tensor(b1)).gelu() @ lc.tensor(w2).mT) + h
    return lc.compile([h]), ws


def _reference(xv, ws):
    h = xv.astype(np.float64)
    for w1, b1, w2 in ws:
        y = h @ w1 + b1
        g = 0.5 * y * (1 + np.tanh(np.sqrt(2 / np.pi) * (y + 0.044715 * y ** 3)))      # lc's gelu (tanh form)
        h = g @ w2.T + h
    return h


SIZES = [0, 1, 2, 3, 5, 16, 17, 31, 33, 64, 127, 128, 129, 200, 257, 300, 2, 17, 129, 300, 1, 0]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("backend", ["auto", "tiled", "blas"])
def test_every_form_matches_numpy_at_sizes_across_the_regimes(backend, threads):
    before = lc.get_num_threads()
    lc.set_matmul_backend(backend)
    lc.set_num_threads(threads)
    try:
        prog, ws = _mlp()
        rng = np.random.default_rng(threads)
        for n in SIZES:
            for _ in range(2):              # the first run of a size binds it, the second runs it bound
                xv = rng.standard_normal((n, 24), np.float32)
                out = prog.run(x=xv)[0]
                assert out.shape == (n, 24)
                np.testing.assert_allclose(out, _reference(xv, ws), rtol=2e-4, atol=2e-4, err_msg=str(n))
    finally:
        lc.set_matmul_backend("auto")
        lc.set_num_threads(before)


def _counting(monkeypatch):
    calls = {}

    def counted(owner, name):
        real = getattr(owner, name)
        calls[name] = 0

        def wrapper(*a, **kw):
            calls[name] += 1
            return real(*a, **kw)
        monkeypatch.setattr(owner, name, wrapper)
    for owner, name in [(MM, "plan_for"), (MM, "backend_for"), (MM, "geometry"), (MM, "TiledPlan"),
                        (MB, "BlasPlan"), (SK, "SkinnyPlan"), (MW.matmul_auto, "measure")]:
        counted(owner, name)
    return calls


@pytest.mark.parametrize("backend, sizes", [("tiled", range(40, 61)), ("blas", range(40, 61)),
                                            ("auto", None), ("tiled", range(200, 230))])
def test_a_new_size_builds_no_gemm_plan(backend, sizes, monkeypatch):
    """Sizes of one regime: the first three bind the program (the class plan, its native
    program, the direct path); every later new size constructs no plan, geometry or backend
    decision, and measures nothing."""
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    lc.set_matmul_backend(backend)
    try:
        prog, ws = _mlp()
        rng = np.random.default_rng(0)
        sizes = list(sizes) if backend != "auto" else [SK.rows_per_block(16) // 2 + 1 + j for j in range(5)]
        for n in sizes[:3]:
            for _ in range(2):
                prog.run(x=rng.standard_normal((n, 24), np.float32))
        calls = _counting(monkeypatch)
        for n in sizes[3:]:
            xv = rng.standard_normal((n, 24), np.float32)
            np.testing.assert_allclose(prog.run(x=xv)[0], _reference(xv, ws), rtol=2e-4, atol=2e-4)
        assert set(calls.values()) == {0}, calls
    finally:
        lc.set_matmul_backend("auto")


def test_parallel_tiled_words_match_numpy(monkeypatch):
    """A tiled GEMM split over two threads from its words (the pool job of matmul_words): rows
    whose problem is above the parallel threshold, at new sizes on the direct path."""
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    before = lc.get_num_threads()
    lc.set_matmul_backend("tiled")
    lc.set_num_threads(2)
    try:
        w = np.random.default_rng(5).standard_normal((128, 128), np.float32) / 8
        x = lc.placeholder("x", ("n", 128))
        prog = lc.compile([(x @ lc.tensor(w)).relu()])
        rng = np.random.default_rng(6)
        for n in (600, 601, 602, 650, 777, 1000):
            xv = rng.standard_normal((n, 128), np.float32)
            np.testing.assert_allclose(prog.run(x=xv)[0], np.maximum(xv.astype(np.float64) @ w, 0),
                                       rtol=2e-4, atol=2e-4)
        form = prog._traced.binders[0].plan.native_program
        assert any(kind == "words" for kind, _ in form.items)
        assert prog._last_direct is not None
    finally:
        lc.set_matmul_backend("auto")
        lc.set_num_threads(before)
