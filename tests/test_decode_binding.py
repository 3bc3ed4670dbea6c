"""A decode step at a new cache length binds by arithmetic (issue 9): the small-m matmul is
re-bound from the layouts without a plan, a backend decision or a geometry search, the native
sizes block comes from one generated pass, and the results equal the per-kernel path bit for
bit across lengths of one size class (including the small-m rule's 16 / 17 row boundary)."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle.layout import Layout
from lazycandle.runtime import matmul as MM, matmul_skinny as SK

from decode_cases import D, attention as _attention, decode_program as _decode_program, decode_feeds as _feeds


def _numpy_attention(f):
    s = f["q"].astype(np.float64) @ f["k"].T.astype(np.float64) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True)) if s.size else s
    p = p / p.sum(-1, keepdims=True) if s.size else p
    return p @ f["v"].astype(np.float64)


def _run(prog, feeds, mode, monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", mode)
    return prog.run(**feeds)[0]


def test_native_and_per_kernel_decode_steps_are_bit_identical_across_lengths_and_row_counts(monkeypatch):
    prog = _decode_program()
    for m in (1, 0, 2, 15, 16, 17, 1):         # softmax over L = 0 is an EmptyReduction (its max)
        for L in (1, 2, 3, 31, 33, 127, 129, 3):
            f = _feeds(m, L)
            slow = _run(prog, f, "python", monkeypatch)
            fast = _run(prog, f, "native", monkeypatch)
            assert slow.shape == fast.shape == (m, D)
            assert np.array_equal(slow, fast), (m, L)
            np.testing.assert_allclose(fast, _numpy_attention(f), rtol=2e-4, atol=2e-5)


def test_a_new_length_makes_no_matmul_plan_or_backend_decision(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _decode_program(rows=1)
    for L in (3, 4, 5):             # the class plan, its binder and its native program
        for _ in range(2):
            prog.run(**_feeds(1, L))
    calls = {"plan_for": 0, "backend_for": 0, "geometry": 0}

    def counted(name):
        real = getattr(MM, name)

        def wrapper(*a, **kw):
            calls[name] += 1
            return real(*a, **kw)
        return wrapper
    for name in calls:
        monkeypatch.setattr(MM, name, counted(name))
    monkeypatch.setattr(SK, "SkinnyPlan", None)      # no small-m plan is built either
    for L in range(6, 60, 7):
        f = _feeds(1, L)
        np.testing.assert_allclose(prog.run(**f)[0], _numpy_attention(f), rtol=2e-4, atol=2e-5)
    assert calls == {"plan_for": 0, "backend_for": 0, "geometry": 0}


def _skinny_plan(m, n, k, transposed=True):
    la = Layout((m, k), (k, 1))
    lb = Layout((k, n), (1, k)) if transposed else Layout((k, n), (n, 1))
    return SK.SkinnyPlan(MM.geometry(la, lb, lc.f32), 2), la, lb


@pytest.mark.parametrize("transposed", [True, False])
def test_rebinder_gives_the_small_m_plan_sizes_inside_its_bucket_and_none_at_its_edges(transposed):
    own = _skinny_plan(1, 40, 64, transposed)[0]
    rebind = SK.Rebinder(own)
    for n, k in ((1, 1), (7, 64), (100, 64), (257, 3), (64, 5000), (64, 7000), (0, 64), (5, 0)):
        plan, la, lb = _skinny_plan(1, n, k, transposed)
        same = plan.spec == own.spec        # (x @ w with one column is the x @ w.T form)
        assert rebind(la, lb) == ((plan.sizes_list, plan.extent, plan.cost) if same else None), (n, k)
    for m in (2, 3, 17):            # another row class: the caller decides again
        _, la, lb = _skinny_plan(m, 40, 64, transposed)
        assert rebind(la, lb) is None
    eight = SK.Rebinder(_skinny_plan(9, 40, 64, transposed)[0])     # rows 5..16: one kernel by rule
    for m in (5, 8, 16):
        plan, la, lb = _skinny_plan(m, 33, 64, transposed)
        assert plan.spec == eight.plan.spec and eight(la, lb) == (plan.sizes_list, plan.extent, plan.cost), m
    assert eight(*_skinny_plan(17, 33, 64, transposed)[1:]) is None    # past RULE_M: a measured choice


def test_index_out_of_bounds_is_raised_at_new_lengths():
    t = lc.placeholder("t", ("n", 8), lc.f32)
    ids = lc.placeholder("ids", (4,), lc.i64)
    prog = lc.compile((t * 2.0).index_select(ids, 0).sum(-1))
    for n in (3, 5, 9, 20, 41):
        tv = np.ones((n, 8), np.float32)
        for _ in range(2):
            np.testing.assert_array_equal(prog.run(t=tv, ids=np.array([0, 1, 2, n - 1]))[0], np.full(4, 16.0))
        with pytest.raises(lc.IndexOutOfBounds):
            prog.run(t=tv, ids=np.array([0, n, 1, 2]))


def test_named_dims_that_disagree_raise_feed_error_naming_both_inputs_and_sizes():
    prog = _decode_program(rows=1)
    f = _feeds(1, 5)
    prog.run(**f)
    f["v"] = np.zeros((6, D), np.float32)
    with pytest.raises(lc.FeedError, match=r"'L' is 5 in input 'k' \(shape \(5, 64\)\) but 6 in input 'v'"):
        prog.run(**f)


def test_program_bindings_are_bounded_and_cleared_by_clear_caches(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "python")     # the layered path: one binding per size
    prog = _decode_program(rows=1)
    for L in range(2, prog.BINDINGS_KEPT + 12):
        prog.run(**_feeds(1, L))
    assert len(prog._bound) == prog.BINDINGS_KEPT
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")     # the direct path keeps the sizes run last
    for L in (3, 4, 5, 300):
        prog.run(**_feeds(1, L))
    runners = prog._traced.direct
    assert runners and runners[0].bound_sizes() == {"L": 300}
    assert lc.cache_info()["caches"]["program bindings"] >= prog.BINDINGS_KEPT + 1
    lc.clear_caches()
    assert len(prog._bound) == 0 and all(r.last is None for r in runners)
    assert lc.cache_info()["caches"]["program bindings"] == 0
    f = _feeds(1, 7)
    np.testing.assert_allclose(prog.run(**f)[0], _numpy_attention(f), rtol=2e-4, atol=2e-5)


def test_the_same_length_again_reuses_its_binding(monkeypatch):
    monkeypatch.setenv("LAZYCANDLE_EXEC", "native")
    prog = _decode_program(rows=1)
    for L in (3, 4, 9):
        prog.run(**_feeds(1, L))
    runner = prog._traced.direct[0]
    bound = runner.last
    prog.run(**_feeds(1, 9))
    assert runner.last is bound
    prog.run(**_feeds(1, 10))
    assert runner.last is not bound and runner.bound_sizes() == {"L": 10}


@pytest.mark.parametrize("broadcast_b", [True, False])
def test_rebinder_on_batched_operands_matches_the_small_m_plan_or_decides_again(broadcast_b):
    def plan(b, m, n, k):
        la = Layout((b, m, k), (m * k, k, 1))
        lb = Layout((b, k, n), (0 if broadcast_b else k * n, 1, k))
        return SK.SkinnyPlan(MM.geometry(la, lb, lc.f32), 2), la, lb
    own = plan(3, 1, 40, 64)[0]
    rebind = SK.Rebinder(own)
    for shape in ((3, 1, 50, 64), (4, 1, 7, 9), (2, 1, 100, 33), (5, 2, 10, 10), (17, 1, 10, 10)):
        p, la, lb = plan(*shape)    # a broadcast B folds its batch into the rows: more rows, another class
        # own's rows are within the rule (RULE_M): past it the choice is measured, so decided again
        # (with 4-row blocks, AVX2's, 17 folded rows have own's spec but not its side of RULE_M)
        same = p.spec == own.spec and SK._fold_batch(p.g).m <= SK.RULE_M
        assert rebind(la, lb) == ((p.sizes_list, p.extent, p.cost) if same else None), shape


def _sdpa_decode_program(h=4, d=16):
    e = h * d
    x, wq = lc.placeholder("x", (1, e)), lc.placeholder("wq", (e, e))
    k, v = lc.placeholder("k", (1, h, "L", d)), lc.placeholder("v", (1, h, "L", d))
    q = (x @ wq).reshape((1, h, 1, d))
    return lc.compile([lc.nn.scaled_dot_product_attention(q, k, v).reshape((1, e))])


def _sdpa_feeds(L, h=4, d=16, seed=0):
    rng = np.random.default_rng(seed + L)
    return {"x": rng.standard_normal((1, h * d), np.float32), "wq": rng.standard_normal((h * d, h * d), np.float32) / 8,
            "k": rng.standard_normal((1, h, L, d), np.float32), "v": rng.standard_normal((1, h, L, d), np.float32)}


def _sdpa_numpy(f, h=4, d=16):
    q = (f["x"].astype(np.float64) @ f["wq"]).reshape(1, h, 1, d)
    s = q @ np.swapaxes(f["k"], -1, -2).astype(np.float64) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    return ((p / p.sum(-1, keepdims=True)) @ f["v"]).reshape(1, h * d)


def test_fused_attention_decode_binds_each_new_length_natively_without_a_plan(monkeypatch):
    """The flash-attention step takes its sizes at run time (steps.SizedStep), so a decode
    program over a growing cache binds every new length through its class plan and runs it in
    the native program: no Plan, no compile, no per-kernel run after the class is learnt --
    also when the class was learnt at L = 2, where head_dim / 2 == L could be misread."""
    from lazycandle.codegen import jit
    from lazycandle.runtime import executor
    prog = _sdpa_decode_program(h=3, d=4)      # head_dim 4 = 2 * L at L = 2
    for L in (1, 2, 3, 4, 5):
        for _ in range(2):
            f = _sdpa_feeds(L, h=3, d=4)
            np.testing.assert_allclose(prog.run(**f)[0], _sdpa_numpy(f, h=3, d=4), rtol=1e-4, atol=1e-5)
    compiled = jit.stats["compiled"]
    made, slow = [], []
    real_init, real_python = executor.Plan.__init__, executor.Plan.run_python
    monkeypatch.setattr(executor.Plan, "__init__", lambda self, *a, **k: made.append(1) or real_init(self, *a, **k))
    monkeypatch.setattr(executor.Plan, "run_python",
                        lambda self, *a, **k: slow.append(1) or real_python(self, *a, **k))
    for L in (6, 9, 17, 64, 130):
        f = _sdpa_feeds(L, h=3, d=4)
        np.testing.assert_allclose(prog.run(**f)[0], _sdpa_numpy(f, h=3, d=4), rtol=1e-4, atol=1e-5)
    assert (made, slow, jit.stats["compiled"] - compiled) == ([], [], 0)


def test_fused_attention_native_and_per_kernel_paths_agree(monkeypatch):
    prog = _sdpa_decode_program()
    for L in (1, 3, 40, 3):
        f = _sdpa_feeds(L)
        slow = _run(prog, f, "python", monkeypatch)
        fast = _run(prog, f, "native", monkeypatch)
        assert np.array_equal(slow, fast), L
        np.testing.assert_allclose(fast, _sdpa_numpy(f), rtol=1e-4, atol=1e-5)


def _epilogue_program(width=24, blocks=3):
    rng = np.random.default_rng(3)
    ws = [rng.standard_normal((width, width), np.float32) / 5 for _ in range(blocks)]
    bs = [rng.standard_normal(width, np.float32) for _ in range(blocks)]
    x = lc.placeholder("x", ("n", width))
    h = x
    for w, b in zip(ws, bs):
        h = h + (h @ lc.tensor(w) + lc.tensor(b)).relu()       # bias, activation, residual: one GEMM epilogue
    return lc.compile([h]), ws, bs


def _epilogue_numpy(x, ws, bs):
    h = x.astype(np.float64)
    for w, b in zip(ws, bs):
        h = h + np.maximum(h @ w + b, 0)
    return h


@pytest.mark.parametrize("backend", ["auto", "blas", "tiled"])
def test_matmul_epilogues_bind_new_sizes_without_a_plan(backend, monkeypatch):
    """A GEMM with a fused epilogue takes its operands' and its epilogue's layouts from the
    binding, so a named-dim program of such GEMMs binds each new row count through its class
    plan (no Plan built, nothing compiled), on the native program and the per-kernel path alike,
    whichever GEMM runs (the BLAS one applies the epilogue as its own kernel at each size)."""
    from lazycandle.codegen import jit
    from lazycandle.runtime import executor
    lc.set_matmul_backend(backend)
    try:
        prog, ws, bs = _epilogue_program()
        rng = np.random.default_rng(0)
        for n in (3, 4, 5, 5):
            x = rng.standard_normal((n, 24), np.float32)
            np.testing.assert_allclose(prog.run(x=x)[0], _epilogue_numpy(x, ws, bs), rtol=1e-4, atol=1e-4)
        compiled, made = jit.stats["compiled"], []
        real_init = executor.Plan.__init__
        monkeypatch.setattr(executor.Plan, "__init__", lambda self, *a, **k: made.append(1) or real_init(self, *a, **k))
        shift = {"auto": 0, "blas": 300, "tiled": 600}[backend]     # sizes no other case bound
        for n in (6, 7, 40, 200, 9):
            x = rng.standard_normal((n + shift, 24), np.float32)
            fast = _run(prog, {"x": x}, "native", monkeypatch)
            slow = _run(prog, {"x": x}, "python", monkeypatch)
            assert np.array_equal(fast, slow), n
            np.testing.assert_allclose(fast, _epilogue_numpy(x, ws, bs), rtol=1e-4, atol=1e-4)
        assert made == []
        if backend != "auto":       # (auto may measure a new size regime once)
            assert jit.stats["compiled"] == compiled
    finally:
        lc.set_matmul_backend("auto")
