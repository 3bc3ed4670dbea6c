"""Named (symbolic) dims of placeholders: lc.placeholder("x", ("n", 768)), bound at run."""
import numpy as np
import pytest

import lazycandle as lc
from conftest import run_in_threads


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_prog_inputs_show_the_names():
    x = lc.placeholder("x", ("n", 8), lc.f32)
    assert repr(x.shape) == "(n, 8)"
    prog = lc.compile([x * 2.0])
    assert prog.inputs == [("x", ("n", 8), lc.f32)]


@pytest.mark.parametrize("n", [1, 2, 7, 16, 33])
def test_named_dim_program_matches_numpy_for_each_size(n):
    x = lc.placeholder("x", ("n", 8), lc.f32)
    w = lc.tensor(_rand(8, 3, seed=1))
    outs = [lc.nn.softmax_last_dim((x @ w).relu()), x.sum(0) + 1.0, x.mean(1), x.transpose(0, 1)[:, 1:],
            x.reshape(-1), x[-1], x.max(0), (x * x).sqrt().exp()]
    prog = lc.compile(outs)
    xs = _rand(n, 8, seed=n)
    got = prog(x=xs)
    want = [_softmax(np.maximum(xs @ w.numpy(), 0)), xs.sum(0) + 1, xs.mean(1), xs.T[:, 1:], xs.reshape(-1),
            xs[-1], xs.max(0), np.exp(np.sqrt(xs * xs))]
    for g, e in zip(got, want):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def test_one_program_serves_several_sizes_and_reuses_each_binding():
    x = lc.placeholder("x", ("n",), lc.f32)
    prog = lc.compile([(x * 3.0 + 1.0).tanh()])
    for n in (5, 9, 5, 9, 0):
        xs = np.linspace(-1, 1, n, dtype=np.float32)
        np.testing.assert_allclose(prog(x=xs)[0], np.tanh(xs * 3 + 1), rtol=1e-6, atol=1e-6)
    plans = lc.cache_info()["plans"]
    prog(x=np.ones(5, np.float32))
    prog(x=np.ones(9, np.float32))
    assert lc.cache_info()["plans"] == plans      # a binding seen before compiles nothing


def test_several_names_and_products_of_them():
    x = lc.placeholder("x", ("b", "t", 4), lc.f32)
    w = lc.placeholder("w", (4, "h"), lc.f32)
    flat = x.reshape(-1, 4) @ w                    # (b*t, h)
    y = flat.reshape(x.shape[0], x.shape[1], -1).sum(1)
    prog = lc.compile([flat, y, x.permute((2, 0, 1)).contiguous()])
    assert [s for _, s, _ in prog.inputs] == [("b", "t", 4), (4, "h")]
    for b, t, h in [(2, 3, 5), (1, 4, 2), (3, 1, 6)]:
        xs, ws = _rand(b, t, 4, seed=b), _rand(4, h, seed=h)
        got = prog(x=xs, w=ws)
        ref = xs.reshape(-1, 4) @ ws
        np.testing.assert_allclose(got[0], ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], ref.reshape(b, t, h).sum(1), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[2], xs.transpose(2, 0, 1))


def test_growing_kv_cache_attention():
    q = lc.placeholder("q", (1, 16), lc.f32)
    k = lc.placeholder("k", ("L", 16), lc.f32)
    v = lc.placeholder("v", ("L", 16), lc.f32)
    prog = lc.compile([lc.nn.softmax_last_dim(q @ k.t() * 0.25) @ v])
    for L in (1, 2, 3, 8, 17):
        qs, ks, vs = _rand(1, 16, seed=L), _rand(L, 16, seed=L + 1), _rand(L, 16, seed=L + 2)
        np.testing.assert_allclose(prog(q=qs, k=ks, v=vs)[0], _softmax(qs @ ks.T * 0.25) @ vs, rtol=1e-5, atol=1e-6)


def test_feeds_disagreeing_on_a_named_dim_raise_feed_error_naming_both():
    a = lc.placeholder("a", ("n",), lc.f32)
    b = lc.placeholder("b", ("n", 2), lc.f32)
    prog = lc.compile([a + b.sum(1)])
    with pytest.raises(lc.FeedError) as e:
        prog(a=np.ones(3, np.float32), b=np.ones((4, 2), np.float32))
    msg = str(e.value)
    assert "'n'" in msg and "'a'" in msg and "'b'" in msg and "3" in msg and "4" in msg
    np.testing.assert_allclose(prog(a=np.ones(3, np.float32), b=np.ones((3, 2), np.float32))[0], [3, 3, 3])


def test_wrong_fixed_dim_or_rank_with_named_dims_raises_feed_error():
    prog = lc.compile([lc.placeholder("x", ("n", 8), lc.f32) * 2.0])
    with pytest.raises(lc.FeedError, match="expects shape"):
        prog(x=np.ones((3, 7), np.float32))
    with pytest.raises(lc.FeedError, match="expects shape"):
        prog(x=np.ones(8, np.float32))
    with pytest.raises(lc.FeedError, match="dtype"):
        prog(x=np.ones((3, 8), np.float64))


def test_shape_checks_with_named_dims_run_when_the_sizes_are_bound():
    """Sizes that may differ (a name against a concrete size or another name) are checked at
    run, with the error the op raises for concrete sizes (SPEC 0.3 "Symbolic sizes")."""
    x = lc.placeholder("x", ("n", 8), lc.f32)
    assert (x + lc.placeholder("y", ("n", 8), lc.f32)).shape == x.shape          # same name: equal
    assert (x + lc.placeholder("r", (1, 8), lc.f32)).shape == x.shape            # broadcast against 1
    assert (lc.placeholder("c", ("n", 1), lc.f32) * x).shape == x.shape
    z = lc.placeholder("z", (5, 8), lc.f32)
    prog = lc.compile([x + z])                                                   # against a concrete size
    np.testing.assert_array_equal(prog(x=np.ones((5, 8), np.float32), z=np.ones((5, 8), np.float32))[0],
                                  np.full((5, 8), 2, np.float32))
    with pytest.raises(lc.BroadcastIncompatibleShapes, match="broadcast"):
        prog(x=np.ones((4, 8), np.float32), z=np.ones((5, 8), np.float32))
    m = lc.placeholder("m", ("m", 8), lc.f32)
    prog = lc.compile([x + m])                                                   # against another name
    with pytest.raises(lc.BroadcastIncompatibleShapes):
        prog(x=np.ones((4, 8), np.float32), m=np.ones((3, 8), np.float32))
    prog = lc.compile([x @ lc.placeholder("w", ("k", 3), lc.f32)])
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="inner dims"):
        prog(x=np.ones((4, 8), np.float32), w=np.ones((7, 3), np.float32))
    with pytest.raises(lc.ShapeMismatchBinaryOp):                                # provably unequal: at the call
        x @ lc.placeholder("w", (9, 3), lc.f32)


def test_named_dim_bound_to_zero():
    x = lc.placeholder("x", ("n", 3), lc.f32)
    prog = lc.compile([x.sum(0), x * 2.0])
    s, d = prog(x=np.ones((0, 3), np.float32))
    np.testing.assert_array_equal(s, np.zeros(3, np.float32))
    assert d.shape == (0, 3)
    with pytest.raises(lc.EmptyReduction):
        lc.compile([x.max(0)])(x=np.ones((0, 3), np.float32))


def test_a_view_that_the_bound_size_puts_out_of_range_raises_the_ops_error():
    x = lc.placeholder("x", ("n", 4), lc.f32)
    prog = lc.compile([x.narrow(0, 2, 3) + 1.0])
    np.testing.assert_array_equal(prog(x=np.zeros((5, 4), np.float32))[0], np.ones((3, 4), np.float32))
    with pytest.raises(lc.NarrowInvalidArgs, match="narrow.*n=4"):
        prog(x=np.zeros((4, 4), np.float32))


def test_a_strided_slice_of_a_named_dim_has_a_floor_div_size():
    x = lc.placeholder("x", ("n",), lc.f32)
    y = x[::2] * 2.0
    assert repr(y.shape) == "((n + 1)//2,)"
    prog = lc.compile([y])
    for n in (0, 1, 5, 6):
        xs = np.arange(n, dtype=np.float32)
        np.testing.assert_array_equal(prog(x=xs)[0], xs[::2] * 2)


def test_bad_named_dim_is_rejected():
    with pytest.raises(ValueError):
        lc.placeholder("x", ("", 3))
    with pytest.raises(ValueError):
        lc.placeholder("x", ("2n", 3))


def test_placeholder_with_named_dim_realized_outside_a_program_raises():
    with pytest.raises(lc.UnboundPlaceholder):
        (lc.placeholder("x", ("n",), lc.f32) + 1.0).numpy()


def test_jit_dynamic_traces_once_for_new_sizes():
    traces = []

    def fn(a, b):
        traces.append(a.shape)
        return lc.nn.softmax_last_dim(a @ b.t()), (a * 2.0).sum(1)

    f = lc.jit(fn, dynamic=True)
    for n, m in [(3, 5), (4, 5), (6, 2), (2, 7)]:
        a, b = _rand(n, 8, seed=n), _rand(m, 8, seed=m)
        s, r = f(a, b)
        np.testing.assert_allclose(s, _softmax(a @ b.T), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(r, (a * 2).sum(1), rtol=1e-5, atol=1e-5)
    assert len(traces) == 1 and repr(traces[0]) == "(a0_d0, a0_d1)"


def test_jit_dynamic_keeps_size_one_and_equal_sizes_apart():
    traces = []

    def fn(a, b):
        traces.append((a.shape, b.shape))
        return a + b

    f = lc.jit(fn, dynamic=True)
    np.testing.assert_array_equal(f(np.ones((3, 4), np.float32), np.ones((3, 4), np.float32)), np.full((3, 4), 2))
    np.testing.assert_array_equal(f(np.ones((5, 6), np.float32), np.ones((5, 6), np.float32)), np.full((5, 6), 2))
    np.testing.assert_array_equal(f(np.ones((5, 6), np.float32), np.ones((1, 6), np.float32)), np.full((5, 6), 2))
    assert len(traces) == 2        # equal sizes share a name; a size of 1 is a new signature


def test_a_named_size_used_as_a_scalar_is_the_bound_size():
    x = lc.placeholder("x", ("n", 4), lc.f32)
    prog = lc.compile([x.sum(0) / x.shape[0], x * (x.shape[0] - 1)])
    for n in (1, 3, 7):
        xs = _rand(n, 4, seed=n)
        got = prog(x=xs)
        np.testing.assert_allclose(got[0], xs.sum(0) / n, rtol=1e-6)
        np.testing.assert_allclose(got[1], xs * (n - 1), rtol=1e-6)
    assert (x.sum(0) / x.shape[1]).shape == (4,)        # a concrete dim is an ordinary number


def test_many_live_names_still_print_and_bind():
    xs = [lc.placeholder(f"x{i}", (f"n{i}", 2), lc.f32) for i in range(7)]
    y = xs[-1].reshape(-1)[1:] * 2.0
    assert repr(y.shape) == "(2*n6 - 1,)"
    assert "n6" in repr(lc.ones((xs[-1].shape[0],)).shape)
    prog = lc.compile([y])
    np.testing.assert_array_equal(prog(x6=np.ones((3, 2), np.float32))[0], np.full(5, 2, np.float32))


def test_dump_of_a_graph_with_named_dims_points_to_the_program():
    x = lc.placeholder("x", ("n",), lc.f32)
    with pytest.raises(ValueError, match="named dims"):
        lc.dump(x * 2.0, stage="schedule")
    prog = lc.compile([x * 2.0])
    with pytest.raises(ValueError, match="run it once"):
        prog.dump()
    prog(x=np.ones(4, np.float32))
    assert "kernel" in prog.dump("schedule")


def test_one_named_dim_program_run_from_several_threads():
    x = lc.placeholder("x", ("n", 4), lc.f32)
    prog = lc.compile([(x * 2.0).sum(1)])

    def work(seed):
        for i in range(6):
            n = 1 + (seed + i) % 4
            xs = _rand(n, 4, seed=seed * 10 + i)
            np.testing.assert_allclose(prog(x=xs)[0], (xs * 2).sum(1), rtol=1e-5, atol=1e-6)

    errors = run_in_threads(work, 3)
    assert not errors, errors


def test_named_dim_program_pickles_by_name_into_a_process_with_other_probes(tmp_path):
    """Unpickled where other names took the first probe exponents, the program still binds
    its sizes by name (sizes, strides and offsets are stored as polynomials of the names)."""
    import pickle
    import subprocess
    import sys
    x = lc.placeholder("x", ("n", 3), lc.f32)
    y = (x.t()[:, 1:] * 2.0 + 1.0).sum(1)          # a transposed view with an offset in n
    path = tmp_path / "prog.pkl"
    path.write_bytes(pickle.dumps(lc.compile([y])))
    code = ("import pickle, sys, numpy as np, lazycandle as lc\n"
            "others = [lc.placeholder(f'o{i}', (f'm{i}',)) for i in range(3)]\n"
            "prog = pickle.loads(open(sys.argv[1], 'rb').read())\n"
            "print(prog.inputs)\n"
            "for n in (2, 7):\n"
            "    xs = np.arange(3 * n, dtype=np.float32).reshape(n, 3)\n"
            "    np.testing.assert_allclose(prog(x=xs)[0], (xs.T[:, 1:] * 2 + 1).sum(1), rtol=1e-6)\n")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "('x', ('n', 3)" in r.stdout


def test_new_bindings_of_a_named_dim_compile_no_new_kernels(compiled_counter):
    """Kernels take runtime sizes, so each new binding replays the size-class template of the
    first: a growing dim compiles its kernels once."""
    x = lc.placeholder("x", ("n", 16), lc.f32)
    prog = lc.compile([lc.nn.softmax_last_dim(x * 0.5) + x.sum_keepdim(1)])
    xs = _rand(5, 16)
    prog(x=xs)
    before = compiled_counter()
    for n in (6, 9, 31, 64):
        xs = _rand(n, 16, seed=n)
        e = np.exp(xs * 0.5 - (xs * 0.5).max(1, keepdims=True))
        np.testing.assert_allclose(prog(x=xs)[0], e / e.sum(1, keepdims=True) + xs.sum(1, keepdims=True),
                                   rtol=1e-5, atol=1e-5)
    assert compiled_counter() == before


@pytest.mark.filterwarnings("ignore:Degrees of freedom")
@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_statistics_over_a_named_dim_count_the_bound_size(n):
    """var / std divide by the bound size less the correction (not the probe's), as NumPy's ddof."""
    x = lc.placeholder("x", ("n", 3), lc.f32)
    prog = lc.compile([x.var(0), x.std(0), x.var(0, unbiased=False), x.var(), x.std(1, correction=2)])
    xs = _rand(n, 3, seed=n) * 4 + 1
    with np.errstate(divide="ignore", invalid="ignore"):
        want = [xs.var(0, ddof=1), xs.std(0, ddof=1), xs.var(0), xs.var(ddof=1), xs.std(1, ddof=2)]
    for g, e in zip(prog(x=xs), want):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    jitted = lc.jit(lambda t: t.var(0), dynamic=True)
    np.testing.assert_allclose(jitted(xs), want[0], rtol=1e-5, atol=1e-6)


def test_triangles_arange_and_negative_ids_over_a_named_dim():
    x = lc.placeholder("x", ("n", 4), lc.f32)
    sq = lc.placeholder("s", ("n", "n"), lc.f32)
    prog = lc.compile([x.tril(), x.triu(1), lc.tril(sq, -1), x * lc.arange(x.shape[0]).to_dtype(lc.f32).reshape((-1, 1)),
                       x[[0, -1]], lc.arange(2, x.shape[0])])
    for n in (2, 3, 6):
        xs, ss = _rand(n, 4, seed=n), _rand(n, n, seed=n + 1)
        want = [np.tril(xs), np.triu(xs, 1), np.tril(ss, -1), xs * np.arange(n, dtype=np.float32)[:, None],
                xs[[0, -1]], np.arange(2, n)]
        for g, e in zip(prog(x=xs, s=ss), want):
            np.testing.assert_array_equal(g, e)
    got = prog(x=_rand(1, 4), s=_rand(1, 1))                # arange(2, n) has max(n - 2, 0) elements
    assert got[-1].shape == (0,)


def test_causal_attention_over_a_named_length_and_a_named_head_dim():
    x = lc.placeholder("x", (1, "t", 8), lc.f32)
    prog = lc.compile([lc.nn.scaled_dot_product_attention(x, x, x, is_causal=True)])
    for t in (1, 5):
        xs = _rand(1, t, 8, seed=t)
        want = lc.nn.scaled_dot_product_attention(lc.tensor(xs), lc.tensor(xs), lc.tensor(xs), is_causal=True)
        np.testing.assert_allclose(prog(x=xs)[0], want.numpy(), rtol=1e-5, atol=1e-6)
    e = lc.placeholder("e", (1, 4, "e"), lc.f32)
    with pytest.raises(lc.UnboundPlaceholder, match="scale"):
        lc.nn.scaled_dot_product_attention(e, e, e)
    got = lc.compile([lc.arange(0, x.shape[1], 2), x])(x=_rand(1, 5, 8))[0]     # step 2: (t + 1)//2 values
    np.testing.assert_array_equal(got, np.arange(0, 5, 2))
