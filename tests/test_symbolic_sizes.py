"""lc.Size: sizes of named dims are values of their own (SPEC 0.3 "Symbolic sizes", issue 38)."""
import pickle

import numpy as np
import pytest

import lazycandle as lc


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ---- the rows of issue 38's table ------------------------------------------------------------
@pytest.mark.parametrize("n", [8, 3, 1])
def test_grad_of_a_mean_over_a_named_dim_divides_by_the_bound_count(n):
    x = lc.placeholder("x", ("n", 6), lc.f32)
    prog = lc.compile([lc.grad(lambda t: t.sqr().mean())(x)])
    xs = _rand(n, 6, seed=n)
    np.testing.assert_allclose(prog(x=xs)[0], 2 * xs / (n * 6), rtol=1e-5, atol=1e-7)
    if n == 8:
        ones = prog(x=np.ones((8, 6), np.float32))[0]
        np.testing.assert_allclose(ones, np.full((8, 6), 2 / 48, np.float32), rtol=1e-6)


def test_training_losses_over_a_named_batch_dim():
    x = lc.placeholder("x", ("b", 5), lc.f32)
    y = lc.placeholder("y", ("b", 5), lc.f32)
    w = lc.Var(_rand(5, 5, seed=1))
    loss, g = lc.value_and_grad(lambda w: lc.nn.mse_loss(x @ w, y))(w)
    prog = lc.compile([loss, g])
    for b in (2, 7):
        xs, ys, ws = _rand(b, 5, seed=b), _rand(b, 5, seed=b + 1), w.numpy()
        r = xs @ ws - ys
        got = prog(x=xs, y=ys)
        np.testing.assert_allclose(got[0], (r ** 2).mean(), rtol=1e-5)
        np.testing.assert_allclose(got[1], 2 * xs.T @ r / r.size, rtol=1e-4, atol=1e-6)


def test_a_slice_by_a_named_size_has_the_bound_length():
    x = lc.placeholder("x", (2, "n"), lc.f32)
    big = lc.tensor(np.arange(512 * 4, dtype=np.float32).reshape(512, 4))
    y = big[:x.shape[1]]
    assert repr(y.shape) == "(n, 4)"
    prog = lc.compile([y, x.sum()])
    for n in (3, 17, 512):
        np.testing.assert_array_equal(prog(x=np.ones((2, n), np.float32))[0], big.numpy()[:n])
    with pytest.raises(lc.IndexOutOfBounds, match="slice"):           # past the end: at run
        prog(x=np.ones((2, 513), np.float32))


def test_narrow_by_a_named_size():
    x = lc.placeholder("x", (2, "n"), lc.f32)
    zeros = lc.zeros((512, 4))
    y = zeros.narrow(0, 0, x.shape[1])
    assert repr(y.shape) == "(n, 4)"
    prog = lc.compile([y + 1.0, x.sum()])
    np.testing.assert_array_equal(prog(x=np.ones((2, 5), np.float32))[0], np.ones((5, 4), np.float32))
    with pytest.raises(lc.NarrowInvalidArgs, match="narrow"):
        prog(x=np.ones((2, 600), np.float32))


def test_argmax_over_a_named_dim():
    x = lc.placeholder("x", (2, "n"), lc.f32)
    prog = lc.compile([x.argmax(-1), x.argmin(1)])
    for n in (1, 4, 33):
        xs = _rand(2, n, seed=n)
        got = prog(x=xs)
        np.testing.assert_array_equal(got[0], xs.argmax(-1))
        np.testing.assert_array_equal(got[1], xs.argmin(1))


def test_argmax_over_more_than_u32_elements_raises_at_run():
    x = lc.placeholder("x", ("n",), lc.f32)
    prog = lc.compile([lc.zeros((x.shape[0] * 2 ** 30,)).argmax(0), x * 1.0])
    with pytest.raises(lc.ShapeMismatch, match="argmax.*4294967295"):
        prog(x=np.ones(8, np.float32))


def test_mT_products_of_a_named_dim_rebound_to_one():
    x = lc.placeholder("x", (1, "n"), lc.f32)
    prog = lc.compile([(x.mT @ x) + (x @ x.mT)])
    for n in (3, 1, 3, 2, 1):
        xs = _rand(1, n, seed=n)
        np.testing.assert_allclose(prog(x=xs)[0], xs.T @ xs + xs @ xs.T, rtol=1e-5, atol=1e-6)


# ---- the value ---------------------------------------------------------------------------
def test_sizes_print_compare_and_hash_as_expressions():
    x = lc.placeholder("x", ("n", 4), lc.f32)
    n = x.shape[0]
    assert isinstance(n, lc.Size) and repr(n) == "n" and str(2 * n + 1) == "2*n + 1"
    assert x.size(0) == n and x.__len__() == n and repr(x.numel()) == "4*n"
    assert x.shape[1] == 4 and type(x.shape[1]) is int and type(x.size(-1)) is int
    assert n + 1 - 1 == n and hash(n * 2) == hash(n + n) and {n * 2: 1}[2 * n] == 1
    assert (2 * n + 4) // 2 == n + 2 and (4 * n + 3) % 2 == 1 and n - n == 0 and type(n - n) is int
    assert repr((n + 1) // 2) == "(n + 1)//2" and repr(n % 3) == "n % 3"
    assert repr(n.min(4)) == "min(n, 4)" == repr(lc.Size.max(n, 4)).replace("max", "min") and n.max(n + 2) == n + 2 and n.min(0) == 0
    assert n + 1 > 0 and n >= 0 and n != n + 2 and not (n < 0)
    assert pickle.loads(pickle.dumps((n * 3 - 1) // 2)) == (n * 3 - 1) // 2


@pytest.mark.parametrize("use", [int, float, bool, range, lambda s: s == 3, lambda s: s < 5, len,
                                 lambda s: [0][s], lambda s: 1.0 / s])
def test_a_python_value_of_a_size_raises_symbolic_size_error_naming_the_dim(use):
    x = lc.placeholder("x", ("seq", 4), lc.f32)
    arg = x if use is len else x.shape[0] - 1
    with pytest.raises(lc.SymbolicSizeError, match="'seq'") as e:
        use(arg)
    assert isinstance(e.value, lc.Error) and isinstance(e.value, TypeError)
    with pytest.raises(lc.SymbolicSizeError):
        if x.shape[0] == 3:
            pass


def test_sizes_are_accepted_wherever_a_size_is():
    x = lc.placeholder("x", ("n", 6), lc.f32)
    n = x.shape[0]
    outs = [x[: n - 1], x[1:n], x.narrow(0, 1, n - 1), x.reshape(n * 3, 2), x.view(-1, n), x.reshape(-1),
            lc.arange(n), lc.arange(1, n * 2, 3), lc.zeros((n, 4)), lc.ones((2, n)) * 2.0, lc.full((n + 1,), 7.0),
            lc.ones((1, 6)).broadcast_as((n, 6)), x[n - 1], x[::2], x[::-1], x.flip(0)]
    prog = lc.compile(outs + [x])
    for k in (1, 2, 5):
        xs = _rand(k, 6, seed=k)
        want = [xs[:k - 1], xs[1:k], xs[1:k], xs.reshape(k * 3, 2), xs.reshape(-1, k), xs.reshape(-1),
                np.arange(k), np.arange(1, 2 * k, 3), np.zeros((k, 4)), np.full((2, k), 2.0), np.full(k + 1, 7.0),
                np.ones((k, 6)), xs[k - 1], xs[::2], xs[::-1], xs[::-1]]
        for g, w in zip(prog(x=xs), want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.filterwarnings("ignore:Degrees of freedom")
def test_a_size_as_a_scalar_operand_is_the_bound_size():
    x = lc.placeholder("x", ("n", 3), lc.f32)
    n = x.shape[0]
    prog = lc.compile([x.sum(0) / n, x * (n - 1), (n * 2 + 1) - x, x.mean(0), x.var(0), x.std(0, correction=0),
                       (x.astype(lc.i64) + n).astype(lc.f32)])
    for k in (1, 4, 9):
        xs = _rand(k, 3, seed=k) * 3
        with np.errstate(divide="ignore", invalid="ignore"):
            want = [xs.sum(0) / k, xs * (k - 1), 2 * k + 1 - xs, xs.mean(0), xs.var(0, ddof=1), xs.std(0),
                    xs.astype(np.int64) + k]
        for g, w in zip(prog(x=xs), want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_jit_dynamic_computes_with_sizes():
    f = lc.jit(lambda a: a.sum(-1) / a.shape[-1] + a.shape[0], dynamic=True)
    for shape in ((3, 5), (4, 7), (2, 2)):
        a = _rand(*shape, seed=shape[0])
        np.testing.assert_allclose(f(a), a.mean(-1) + shape[0], rtol=1e-5)


# ---- bad input ----------------------------------------------------------------------------
def test_feeds_disagreeing_on_a_named_dim_name_both():
    a = lc.placeholder("a", ("n", 2), lc.f32)
    b = lc.placeholder("b", ("n",), lc.f32)
    prog = lc.compile([a.sum(1) + b])
    with pytest.raises(lc.FeedError) as e:
        prog(a=np.ones((3, 2), np.float32), b=np.ones(4, np.float32))
    assert all(s in str(e.value) for s in ("'a'", "'b'", "3", "4", "'n'"))


def test_a_size_that_binds_negative_raises_the_ops_error_at_run():
    x = lc.placeholder("x", ("n",), lc.f32)
    prog = lc.compile([lc.zeros((x.shape[0] - 5, 2)) + 1.0, x * 1.0])
    assert prog(x=np.ones(7, np.float32))[0].shape == (2, 2)
    with pytest.raises(lc.ShapeMismatch, match="n=3"):
        prog(x=np.ones(3, np.float32))
    prog = lc.compile([x.narrow(0, 0, x.shape[0] - 5) * 1.0])
    with pytest.raises(lc.NarrowInvalidArgs, match="narrow"):
        prog(x=np.ones(3, np.float32))
    prog = lc.compile([x.reshape(x.shape[0] - 5, -1) * 1.0])
    with pytest.raises(lc.ShapeMismatch, match="reshape"):
        prog(x=np.ones(3, np.float32))


def test_a_slice_past_the_end_raises_at_run():
    x = lc.placeholder("x", ("n", 2), lc.f32)
    with pytest.raises(lc.IndexOutOfBounds, match="slice"):     # past the end at every n: at the call
        x[: x.shape[0] + 1]
    prog = lc.compile([x[:3] * 1.0])
    np.testing.assert_array_equal(prog(x=np.ones((4, 2), np.float32))[0], np.ones((3, 2), np.float32))
    with pytest.raises(lc.IndexOutOfBounds, match="slice"):
        prog(x=np.ones((2, 2), np.float32))
    prog = lc.compile([x[x.shape[0] - 1] * 1.0])          # x[n - 1]: in range at every n >= 1
    np.testing.assert_array_equal(prog(x=np.arange(6, dtype=np.float32).reshape(3, 2))[0], [4, 5])
    with pytest.raises(lc.IndexOutOfBounds):
        prog(x=np.ones((0, 2), np.float32))


def test_broadcast_and_inner_dims_are_checked_at_run():
    x = lc.placeholder("x", ("n", 4), lc.f32)
    y = lc.placeholder("y", ("m", 4), lc.f32)
    prog = lc.compile([x + y, x.mT @ y])
    xs, ys = _rand(3, 4), _rand(3, 4, seed=1)
    got = prog(x=xs, y=ys)
    np.testing.assert_allclose(got[0], xs + ys, rtol=1e-6)
    np.testing.assert_allclose(got[1], xs.T @ ys, rtol=1e-5, atol=1e-6)
    with pytest.raises(lc.BroadcastIncompatibleShapes):
        prog(x=xs, y=_rand(2, 4))


# ---- attention under named dims: the fused flash kernel (issue 38 item 4) ---------------------
def _sdpa_ref(q, k, v, causal=False):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_attention_over_named_lengths_runs_the_flash_kernel(causal):
    q = lc.placeholder("q", (2, 3, "t", 16), lc.f32)
    kv = lc.placeholder("kv", (2, 3, "t", 16), lc.f32)
    prog = lc.compile([lc.nn.scaled_dot_product_attention(q, kv, kv, is_causal=causal)])
    for t in (1, 5, 19):
        a, b = _rand(2, 3, t, 16, seed=t), _rand(2, 3, t, 16, seed=t + 1)
        np.testing.assert_allclose(prog(q=a, kv=b)[0], _sdpa_ref(a, b, b, causal), rtol=1e-5, atol=1e-6)
    assert "flash" in prog.dump("schedule")


def test_decode_attention_over_a_named_cache_length_runs_the_flash_kernel():
    q = lc.placeholder("q", (4, 1, 8), lc.f32)
    k = lc.placeholder("k", (4, "L", 8), lc.f32)
    v = lc.placeholder("v", (4, "L", 8), lc.f32)
    out = lc.nn.scaled_dot_product_attention(q, k, v)
    assert out.shape == (4, 1, 8)
    prog = lc.compile([out])
    for L in (1, 2, 9, 40):
        a, b, c = _rand(4, 1, 8, seed=L), _rand(4, L, 8, seed=L + 1), _rand(4, L, 8, seed=L + 2)
        np.testing.assert_allclose(prog(q=a, k=b, v=c)[0], _sdpa_ref(a, b, c), rtol=1e-5, atol=1e-6)
    assert "flash" in prog.dump("schedule")


def test_a_program_whose_sizes_no_input_binds_is_refused_at_compile():
    x = lc.placeholder("x", ("n", 3), lc.f32)
    with pytest.raises(lc.FeedError, match="'n'"):
        lc.compile([lc.arange(x.shape[0])])
    got = lc.compile([lc.arange(x.shape[0]), x])(x=np.ones((4, 3), np.float32))[0]
    np.testing.assert_array_equal(got, np.arange(4))


def test_a_size_on_the_left_of_a_tensor_operator():
    x = lc.placeholder("x", ("n", 2), lc.f32)
    n = x.shape[0]
    prog = lc.compile([n * x, n - x, n / (x + 10.0), (n + 1) + x])
    xs = _rand(3, 2)
    want = [3 * xs, 3 - xs, 3 / (xs + 10), 4 + xs]
    for g, w in zip(prog(x=xs), want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


_LOSSES = {
    "bias": lambda x, w, b: ((x @ w + b) ** 2).mean(),
    "layer_norm": lambda x, w, b: lc.nn.layer_norm(x @ w, b, b).sum(),
    "softmax_max": lambda x, w, b: lc.nn.softmax(x @ w, -1).max(-1).sum(),
    "slices": lambda x, w, b: (x @ w)[:, 1:].sum() + ((x @ w)[1:] * b).sum() + (x @ w)[::-1][0].sum(),
    "transpose": lambda x, w, b: ((x @ w).t() @ x).sum() + (x.t() * b.unsqueeze(1)).sum(),
    "centred": lambda x, w, b: (x @ w - (x @ w).mean(0, keepdim=True)).sqr().sum() / x.shape[0],
    "cross_entropy": lambda x, w, b: lc.nn.cross_entropy(x @ w + b, (x.sum(-1) > 2.0).astype(lc.i64)),
    "attention": lambda x, w, b: lc.nn.scaled_dot_product_attention((x @ w).unsqueeze(0), x.unsqueeze(0),
                                                                    (x * b).unsqueeze(0), is_causal=True).sum(),
}


@pytest.mark.parametrize("loss", sorted(_LOSSES))
def test_gradients_over_a_named_batch_dim_match_fixed_shapes(loss):
    f = _LOSSES[loss]
    w0, b0 = _rand(4, 4, seed=7) * 0.5, _rand(4, seed=8)
    x = lc.placeholder("x", ("n", 4), lc.f32)
    value, (gw, gb) = lc.value_and_grad(lambda w, b: f(x, w, b), argnums=(0, 1))(lc.Var(w0), lc.Var(b0))
    prog = lc.compile([value, gw, gb])
    for n in (5, 1, 3):
        xs = _rand(n, 4, seed=n) + 0.5
        want_v, (want_w, want_b) = lc.value_and_grad(lambda w, b: f(lc.tensor(xs), w, b), argnums=(0, 1))(
            lc.Var(w0), lc.Var(b0))
        for g, e in zip(prog(x=xs), (want_v, want_w, want_b)):
            np.testing.assert_allclose(g, e.numpy(), rtol=2e-5, atol=2e-5)


def test_topk_over_a_named_dim_checks_k_at_run():
    x = lc.placeholder("x", (3, "n"), lc.f32)
    values, ids = x.topk(2, -1)
    prog = lc.compile([values, ids])
    xs = _rand(3, 6)
    got = prog(x=xs)
    np.testing.assert_array_equal(got[0], -np.sort(-xs, -1)[:, :2])
    np.testing.assert_array_equal(got[1], np.argsort(-xs, -1, kind="stable")[:, :2])
    with pytest.raises(lc.NarrowInvalidArgs):
        prog(x=_rand(3, 1))


def test_pooling_over_named_spatial_dims():
    x = lc.placeholder("x", (1, 2, "h", "w"), lc.f32)
    prog = lc.compile([x.max_pool2d(2), x.avg_pool2d(2, 1)])
    for h, w in ((4, 6), (5, 3)):
        xs = _rand(1, 2, h, w, seed=h)
        got = prog(x=xs)
        win = np.lib.stride_tricks.sliding_window_view(xs, (2, 2), axis=(2, 3))
        np.testing.assert_allclose(got[0], win[:, :, ::2, ::2].max((-1, -2)), rtol=1e-6)
        np.testing.assert_allclose(got[1], win.mean((-1, -2)), rtol=1e-5, atol=1e-6)
    with pytest.raises(lc.ShapeMismatch, match="max_pool2d"):
        prog(x=_rand(1, 2, 1, 4))


def test_chunk_gradients_under_named_dims_match_numpy():
    """The gradient of a chunk -- qkv = h.chunk(3, -1) over a named (b, t), and a chunk of the
    named dim itself -- is its piece padded with zeros: it raised SymbolicSizeError (the
    general view rule could not split the offset in the base's radix over named sizes)."""
    x = lc.placeholder("x", ("b", "t", 6))

    def qkv(h):
        q, k, v = h.chunk(3, -1)
        return (q * k + v.sqr()).sum()
    prog = lc.compile([lc.grad(qkv)(x)])
    rng = np.random.default_rng(0)
    for b, t in ((2, 5), (1, 1), (3, 7)):
        xv = rng.standard_normal((b, t, 6)).astype(np.float32)
        q, k, v = xv[..., :2], xv[..., 2:4], xv[..., 4:]
        np.testing.assert_allclose(prog.run(x=xv)[0], np.concatenate([k, q, 2 * v], -1), rtol=1e-6)
    y = lc.placeholder("y", (2, "n"))

    def halves(h):
        a, c = h.chunk(2, 1)
        return (a * c * 3.0).sum()
    prog = lc.compile([lc.grad(halves)(y)])
    for n in (2, 4, 10):
        yv = rng.standard_normal((2, n)).astype(np.float32)
        a, c = yv[:, :n // 2], yv[:, n // 2:]
        np.testing.assert_allclose(prog.run(y=yv)[0], np.concatenate([3 * c, 3 * a], 1), rtol=1e-6)
