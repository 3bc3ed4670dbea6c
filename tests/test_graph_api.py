"""Build-then-run programs, lc.jit, realize semantics and the kernel cache."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle.codegen import jit as jitmod

rng = np.random.default_rng(1)


def test_program_run_and_inputs():
    x = lc.placeholder("x", (8, 16), lc.f32)
    w = lc.placeholder("w", (16, 4), lc.f32)
    y = lc.nn.softmax_last_dim((x @ w).relu())
    prog = lc.compile([y])
    assert prog.inputs == [("x", (8, 16), lc.f32), ("w", (16, 4), lc.f32)]
    a = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal((16, 4)).astype(np.float32)
    r = np.maximum(a.astype(np.float64) @ b, 0)
    e = np.exp(r - r.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    for outs in (prog.run(x=a, w=b), prog(x=a, w=b)):
        assert len(outs) == 1 and isinstance(outs[0], np.ndarray)
        np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-6)
    # new data, no new compile
    before = jitmod.stats["compiled"]
    a2 = rng.standard_normal((8, 16)).astype(np.float32)
    prog.run(x=a2, w=b)
    assert jitmod.stats["compiled"] == before


def test_feed_errors_name_the_input():
    x = lc.placeholder("x", (2, 3), lc.f32)
    prog = lc.compile([x.exp()])
    good = np.ones((2, 3), np.float32)
    with pytest.raises(lc.FeedError, match="x"):
        prog.run()
    with pytest.raises(lc.FeedError, match="zz"):
        prog.run(x=good, zz=good)
    with pytest.raises(lc.FeedError, match=r"\(2, 3\)"):
        prog.run(x=np.ones((3, 2), np.float32))
    with pytest.raises(lc.FeedError, match="f32"):
        prog.run(x=np.ones((2, 3), np.float64))
    assert isinstance(lc.FeedError("x"), ValueError)


def test_unbound_placeholder():
    x = lc.placeholder("x", (3,), lc.f32)
    with pytest.raises(lc.UnboundPlaceholder):
        (x + 1).numpy()
    with pytest.raises(lc.UnboundPlaceholder):
        x.numpy()


def test_constants_and_multiple_outputs():
    c = lc.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    x = lc.placeholder("x", (2, 3))
    s = x + c
    prog = lc.compile([s, s.t(), (s * 2).sum(-1)])
    a = np.ones((2, 3), np.float32)
    o1, o2, o3 = prog.run(x=a)
    np.testing.assert_array_equal(o1, a + c.numpy())
    np.testing.assert_array_equal(o2, (a + c.numpy()).T)
    np.testing.assert_allclose(o3, ((a + c.numpy()) * 2).sum(-1))


def test_jit_compiles_once_per_signature():
    calls = []

    def f(a, b):
        calls.append(1)
        return (a * b).exp(), a - b

    g = lc.jit(f)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((4, 5)).astype(np.float32)
    r1, r2 = g(a, b)
    np.testing.assert_allclose(r1, np.exp(a * b), rtol=1e-6)
    np.testing.assert_array_equal(r2, a - b)
    g(b, a)
    assert len(calls) == 1
    g(a.astype(np.float64), b.astype(np.float64))
    assert len(calls) == 2


def test_realize_several_shares_work():
    a = lc.tensor(rng.standard_normal(1000).astype(np.float32))
    shared = (a * 3).exp()
    x, y = shared + 1, shared * 2
    assert x.is_lazy and y.is_lazy
    lc.realize(x, y)
    assert not x.is_lazy and not y.is_lazy
    e = np.exp(a.numpy() * 3)
    np.testing.assert_allclose(x.numpy(), e + 1, rtol=1e-6)
    np.testing.assert_allclose(y.numpy(), e * 2, rtol=1e-6)


def test_rebuilding_same_graph_compiles_nothing():
    a, b = (lc.tensor(rng.standard_normal(4096).astype(np.float32)) for _ in range(2))
    ((a * b + 1).exp() - a).numpy()
    before = jitmod.stats["compiled"]
    for _ in range(3):
        a2, b2 = (lc.tensor(rng.standard_normal(4096).astype(np.float32)) for _ in range(2))
        ((a2 * b2 + 1).exp() - a2).numpy()
    assert jitmod.stats["compiled"] == before


def test_views_of_inputs_with_different_offsets_share_a_plan():
    x = lc.tensor(np.arange(100, dtype=np.float32))
    outs = [(x.narrow(0, i, 10) * 2).numpy() for i in range(5)]
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o, np.arange(i, i + 10, dtype=np.float32) * 2)
