"""Symbolic plan binding (issue 9): one plan per size class, bound to each capture's sizes by
precomputed formulas -- for eager realize, lc.compile'd named-dim programs and
lc.jit(dynamic=True) -- with results bit-identical to a plan compiled for that size alone."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle import caches, compiler, named_dims
from lazycandle.codegen import jit

D = 64


def _attention(q, k, v):
    s = q @ k.transpose(0, 1)
    return lc.nn.softmax_last_dim(s * 0.125) @ v


def _decode_data(n):
    rng = np.random.default_rng(7)
    return (rng.standard_normal((1, D)).astype(np.float32), rng.standard_normal((n, D)).astype(np.float32),
            rng.standard_normal((n, D)).astype(np.float32))


def _eager(q, k, v):
    return _attention(lc.tensor(q), lc.tensor(k), lc.tensor(v)).numpy()


def _w():
    """Vector lanes of an f32 elementwise kernel on this host."""
    return jit.vector_bits() // 32


def _sizes():
    w = _w()
    return sorted({0, 1, w - 1, w, w + 1, 3 * w + 5, 1000})


def _fresh_plans(monkeypatch):
    """Empty plan caches (the kernel cache stays): the next capture compiles its own plan, and
    no eager realize finds a plan filed under its trace key."""
    monkeypatch.setattr(compiler, "_plans", caches.LRU(64))
    monkeypatch.setattr(compiler, "_bound", caches.LRU(64))
    monkeypatch.setattr(compiler, "_eager", caches.LRU(64))


def _count_compiles(monkeypatch):
    calls = []
    orig = compiler.compile_capture

    def spy(cap, template=None):
        calls.append(template is not None)
        return orig(cap, template)
    monkeypatch.setattr(compiler, "compile_capture", spy)
    return calls


def test_a_size_class_plan_is_bound_to_every_new_length_without_compiling(monkeypatch):
    q, k, v = _decode_data(200)
    _fresh_plans(monkeypatch)
    _eager(q, k[:5], v[:5])
    kernels = lc.cache_info()["kernels"]
    calls = _count_compiles(monkeypatch)
    for n in (6, 7, 31, 33, 65, 100, 199):
        np.testing.assert_allclose(_eager(q, k[:n], v[:n]), _eager_numpy(q, k[:n], v[:n]), rtol=2e-5, atol=1e-6)
    assert calls == [], "a new length of a known size class compiled or replayed a plan"
    assert len(compiler._plans) == 1 and lc.cache_info()["kernels"] == kernels


def _eager_numpy(q, k, v):
    s = (q @ k.T) * 0.125
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


def test_symbolic_binding_is_bit_identical_to_a_plan_compiled_for_the_size(monkeypatch):
    q, k, v = _decode_data(1000)
    for n in _sizes():
        if n < 2:
            continue
        _fresh_plans(monkeypatch)
        fixed = _eager(q, k[:n], v[:n])               # the class plan is compiled for n itself
        _fresh_plans(monkeypatch)
        _eager(q, k[:n + 3], v[:n + 3])               # ... for another size: n is bound symbolically
        calls = _count_compiles(monkeypatch)
        assert np.array_equal(_eager(q, k[:n], v[:n]), fixed), n
        assert calls == [] and len(compiler._plans) == 1
        monkeypatch.undo()


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 17, 1000])
def test_elementwise_and_reduction_bound_symbolically_match_fixed_bits(n, monkeypatch):
    rng = np.random.default_rng(n)
    a = rng.standard_normal((3, n)).astype(np.float32)

    def f(x):
        y = (x * 1.5 - 0.25).exp()
        return y, y.sum(-1), x.transpose(0, 1) + 1.0

    _fresh_plans(monkeypatch)
    fixed = [t.numpy() for t in f(lc.tensor(a))]
    _fresh_plans(monkeypatch)
    other = rng.standard_normal((3, n + 11)).astype(np.float32)
    [t.numpy() for t in f(lc.tensor(other))]
    calls = _count_compiles(monkeypatch)
    bound = [t.numpy() for t in f(lc.tensor(a))]
    for x, y in zip(fixed, bound):
        assert x.shape == y.shape and np.array_equal(x, y)
    if n > 1:   # sizes 0 and 1 are size classes of their own
        assert calls == []


def test_named_dim_program_binds_new_lengths_without_rebuilding_its_graph(monkeypatch):
    q, k, v = _decode_data(300)
    prog = lc.compile(_attention(lc.placeholder("q", (1, D)), lc.placeholder("k", ("L", D)),
                                 lc.placeholder("v", ("L", D))))
    prog.run(q=q, k=k[:10], v=v[:10])
    kernels = lc.cache_info()["kernels"]
    rebuilt = []
    orig = named_dims.bind
    monkeypatch.setattr(named_dims, "bind", lambda *a: rebuilt.append(a) or orig(*a))
    for n in (11, 12, 50, 129, 300):
        fixed = lc.compile(_attention(lc.placeholder("q", (1, D)), lc.placeholder("k", (n, D)),
                                      lc.placeholder("v", (n, D))))
        want = fixed.run(q=q, k=k[:n], v=v[:n])[0]
        got = prog.run(q=q, k=k[:n], v=v[:n])[0]
        assert got.shape == (1, D) and np.array_equal(got, want), n
    assert rebuilt == []
    assert lc.cache_info()["kernels"] == kernels


def test_jit_dynamic_keeps_one_plan_and_its_kernels_over_lengths():
    @lc.jit(dynamic=True)
    def f(x):
        return (x * 2.0).exp().sum(-1)

    rng = np.random.default_rng(3)
    f(rng.standard_normal((4, 9)).astype(np.float32))
    plans, kernels = lc.cache_info()["plans"], lc.cache_info()["kernels"]
    for n in (10, 33, 100, 257):
        x = rng.standard_normal((4, n)).astype(np.float32)
        np.testing.assert_allclose(f(x), np.exp(x * 2).sum(-1), rtol=1e-5)
    assert lc.cache_info()["plans"] == plans and lc.cache_info()["kernels"] == kernels


def test_fixed_size_programs_of_one_class_share_the_plan_and_kernels(monkeypatch):
    rng = np.random.default_rng(4)
    _fresh_plans(monkeypatch)
    for n in (20, 21, 64 + 3, 500):
        x = lc.placeholder("x", (n, 3))
        prog = lc.compile([(x * 3.0).tanh().max(0)])
        a = rng.standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_allclose(prog.run(x=a)[0], np.tanh(a * 3).max(0), rtol=1e-6)
    assert len(compiler._plans) == 1


def test_a_stride_the_formulas_do_not_fit_gets_its_own_plan_and_stays_right():
    """x[::3] at n = 8 reads stride 3, equal to its length ceil(8/3): the binder's stride
    formula may take one for the other; its layout check must then refuse other lengths."""
    for n in (8, 20, 31, 9):
        a = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal((lc.tensor(a)[::3] + 1.0).numpy(), a[::3] + 1)


def test_program_binding_still_rejects_a_view_outside_its_input():
    x = lc.placeholder("x", ("n",))
    prog = lc.compile([x[:5] * 2.0])
    np.testing.assert_array_equal(prog.run(x=np.arange(10, dtype=np.float32))[0], np.arange(5) * 2.0)
    np.testing.assert_array_equal(prog.run(x=np.arange(7, dtype=np.float32))[0], np.arange(5) * 2.0)
    with pytest.raises(lc.IndexOutOfBounds, match="slice"):     # a slice past the end: the op's error
        prog.run(x=np.arange(3, dtype=np.float32))


def test_program_binding_handles_sizes_that_change_the_class():
    """n = 1, n equal to another dim, n = 0: other size classes, still right."""
    x = lc.placeholder("x", ("n", 4))
    prog = lc.compile([(x + 1.0).sum(0)])
    for n in (5, 6, 1, 4, 0, 9):
        a = np.ones((n, 4), np.float32)
        np.testing.assert_array_equal(prog.run(x=a)[0], (a + 1).sum(0))
