"""The training step's backward graph shapes (issue 42): gradients of views that split one
tensor (q, k, v = h.chunk(3, -1)) are written as ONE cat of their pieces, not zero-padded
full-size copies summed; checked for values against NumPy and for the kernels it compiles to."""
import numpy as np
import pytest

import lazycandle as lc


def _kernel_ops(prog):
    return [k.kind for k in prog._fixed.plan.kernels]


def _split_loss(h, w, n, dim, pieces=None):
    parts = h.chunk(n, dim)
    pieces = range(n) if pieces is None else pieces
    return sum(((parts[i] * float(i + 1)).sqr() * w.narrow(dim, 0, parts[i].shape[dim])).sum_all()
               for i in pieces)


def _split_grad_ref(h, w, n, dim, pieces=None):
    """d/dh of _split_loss in NumPy (float64)."""
    parts = np.array_split(np.arange(h.shape[dim]), n)
    pieces = range(n) if pieces is None else pieces
    g = np.zeros_like(h)
    for i in pieces:
        idx = [slice(None)] * h.ndim
        idx[dim] = parts[i]
        wi = np.take(w, np.arange(len(parts[i])), axis=dim)
        g[tuple(idx)] += 2 * (i + 1) ** 2 * h[tuple(idx)] * wi
    return g


@pytest.mark.parametrize("shape,n,dim,pieces", [
    ((4, 5, 12), 3, -1, None),          # q, k, v
    ((3, 7, 10), 3, -1, None),          # odd sizes: pieces of 4, 3, 3
    ((6, 9), 3, 0, (0, 2)),             # a piece without gradient stays zero
    ((2, 8, 6), 2, 1, (1,)),
    ((5, 0, 6), 3, -1, None),           # zero-size
])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_split_gradients_match_numpy(shape, n, dim, pieces, dtype):
    rng = np.random.default_rng(3)
    h = rng.standard_normal(shape)
    w = rng.standard_normal(shape)
    ht, wt = lc.tensor(h, dtype), lc.tensor(w, dtype)
    _, (g,) = lc.value_and_grad(lambda a: _split_loss(a, wt, n, dim, pieces), (0,))(ht)
    tol = 1e-5 if dtype == "f32" else 1e-12
    np.testing.assert_allclose(g.numpy(), _split_grad_ref(h, w, n, dim, pieces), rtol=tol, atol=tol)


def test_overlapping_views_still_add():
    """Two narrows that overlap: their gradients add where they overlap."""
    h = np.random.default_rng(4).standard_normal((3, 8))
    _, (g,) = lc.value_and_grad(lambda a: (a.narrow(1, 0, 5).sum_all() + a.narrow(1, 3, 5).sqr().sum_all()),
                                (0,))(lc.tensor(h))
    want = np.zeros_like(h)
    want[:, :5] += 1
    want[:, 3:] += 2 * h[:, 3:]
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-12)


def test_transposed_head_views_of_qkv_gradient_is_one_cat():
    """The attention pattern: h (b, t, 3d) chunked, each piece reshaped to heads and
    transposed; the compiled gradient of h has one cat and no add of full-size pads."""
    b, t, d, heads = 2, 4, 8, 2
    rng = np.random.default_rng(5)
    h = rng.standard_normal((b, t, 3 * d)).astype(np.float32)
    w = rng.standard_normal((b, heads, t, d // heads)).astype(np.float32)
    hp = lc.placeholder("h", h.shape)
    wt = lc.tensor(w)

    def loss(a):
        q, k, v = (z.reshape((b, t, heads, d // heads)).transpose(1, 2) for z in a.chunk(3, -1))
        return (q * wt).sum_all() + (k * wt).sqr().sum_all() + (v * 3.0).sum_all()
    _, (g,) = lc.value_and_grad(loss, (0,))(hp)
    prog = lc.compile([g])
    got = prog.run(h=h)[0]
    wm = w.transpose(0, 2, 1, 3).reshape(b, t, d)
    hk = h[..., d:2 * d]
    want = np.concatenate([wm, 2 * hk * wm * wm, np.full((b, t, d), 3.0, np.float32)], -1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    kinds = _kernel_ops(prog)
    assert kinds.count("index") <= 1, kinds          # one cat (no padded cats summed by an add)


def _two_layer_step(seed, rows, d_in, d_hid, act):
    """((x, w1, b1, w2, dy), loss, [d w1, d b1, d w2]) of the loss
    sum(linear(act(linear(x, w1, b1)), w2) * dy), the weights placeholders."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, d_in)).astype(np.float32)
    w1 = (rng.standard_normal((d_hid, d_in)) / 3).astype(np.float32)
    b1 = rng.standard_normal(d_hid).astype(np.float32)
    w2 = (rng.standard_normal((5, d_hid)) / 3).astype(np.float32)
    dy = rng.standard_normal((rows, 5)).astype(np.float32)
    ps = [lc.placeholder(n, a.shape) for n, a in (("w1", w1), ("b1", b1), ("w2", w2))]
    xt, dyt = lc.tensor(x), lc.tensor(dy)

    def loss(w1_, b1_, w2_):
        return (lc.nn.linear(getattr(lc.nn.linear(xt, w1_, b1_), act)(), w2_) * dyt).sum_all()
    val, grads = lc.value_and_grad(loss, (0, 1, 2))(*ps)
    return (x, w1, b1, w2, dy), val, list(grads)


def test_bias_gradient_reads_the_buffered_product_instead_of_recomputing_gelu():
    """y = gelu(x @ w1.T + b1) @ w2.T: d b1 = column sums of dy @ w2 * gelu'(f), a value the
    next GEMM reads from memory anyway; the sum reads that one buffer instead of re-deriving
    gelu' from the product f and dy @ w2 (three full-size reads)."""
    (x, w1, b1, w2, dy), _, grads = _two_layer_step(6, 16, 8, 12, "gelu")
    prog = lc.compile(grads)
    gw1, gb1, gw2 = prog.run(w1=w1, b1=b1, w2=w2)
    f = x.astype(np.float64) @ w1.T + b1
    c = np.sqrt(2 / np.pi)
    th = np.tanh(c * (f + 0.044715 * f ** 3))
    df = (dy @ w2) * (0.5 * (1 + th) + 0.5 * f * (1 - th ** 2) * c * (1 + 3 * 0.044715 * f ** 2))
    np.testing.assert_allclose(gb1, df.sum(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gw1, df.T @ x, rtol=1e-4, atol=1e-5)
    sums = [k for k in prog._fixed.plan.kernels if k.kind == "reduce" and k.spec is not None]
    big = [k for k in sums if len(k.inputs) > 1]
    assert sums and not big, [(k.kind, k.inputs) for k in sums]


@pytest.mark.parametrize("shape", [(2, 5, 8), (3, 1, 4, 8), (0, 3, 8)])
def test_linear_bias_on_merged_rows_is_the_gemm_epilogue(shape):
    """nn.linear over (..., in) merges the leading dims into one 2-D GEMM and adds the bias
    before reshaping back, so the add is that GEMM's epilogue, not a pass of its own."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    xp = lc.placeholder("x", x.shape)
    prog = lc.compile([lc.nn.linear(xp, lc.tensor(w), lc.tensor(b))])
    np.testing.assert_allclose(prog.run(x=x)[0], x @ w.T + b, rtol=1e-5, atol=1e-5)
    if x.size:
        assert _kernel_ops(prog) == ["matmul"]
    b2 = rng.standard_normal(shape[-2:-1] + (6,)).astype(np.float32)   # a bias that is not a row
    got = lc.nn.linear(lc.tensor(x), lc.tensor(w), lc.tensor(b2)).numpy()
    np.testing.assert_allclose(got, x @ w.T + b2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,dim,ids_shape", [
    ((6, 10), 1, (6, 1)),               # cross-entropy's pick
    ((2, 3, 7), 2, (2, 3, 1)),
    ((5, 4), 0, (1, 4)),                # along a leading dim
    ((6, 10), 1, (6, 3)),               # several ids per row (repeats add): scatter_add
    ((0, 10), 1, (0, 1)),
])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_gather_gradient_matches_numpy(shape, dim, ids_shape, dtype):
    rng = np.random.default_rng(8)
    x = rng.standard_normal(shape)
    ids = rng.integers(0, shape[dim], ids_shape)
    w = rng.standard_normal(ids_shape)
    wt = lc.tensor(w, dtype)
    _, (g,) = lc.value_and_grad(lambda a: (a.gather(lc.tensor(ids), dim) * wt).sum_all(), (0,))(lc.tensor(x, dtype))
    want = np.zeros(shape)
    for pos in np.ndindex(*ids_shape):
        at = list(pos)
        at[dim] = ids[pos]
        want[tuple(at)] += w[pos]
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-6, atol=1e-6)


def test_cross_entropy_gradient_needs_no_scatter():
    """The gradient of cross_entropy over (..., C) logits compiles to no index kernel other than
    the forward's gather (no zero fill, no scatter_add) and matches torch's formula."""
    rng = np.random.default_rng(9)
    logits = rng.standard_normal((3, 4, 11)).astype(np.float32)
    y = rng.integers(0, 11, (3, 4))
    lp = lc.placeholder("logits", logits.shape)
    _, (g,) = lc.value_and_grad(lambda a: lc.nn.cross_entropy(a, lc.tensor(y)), (0,))(lp)
    prog = lc.compile([g])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = p - np.eye(11)[y]
    np.testing.assert_allclose(prog.run(logits=logits)[0], want / 12, rtol=1e-5, atol=1e-6)
    assert _kernel_ops(prog).count("index") <= 1, _kernel_ops(prog)


def test_relu_layer_is_its_gemm_epilogue_in_a_training_step():
    """An MLP step's forward linear + relu is one matmul kernel (the backward's mask `out > 0`
    is fused into the backward GEMM's epilogue, not written by the forward), gradients as NumPy."""
    (x, w1, b1, w2, dy), val, grads = _two_layer_step(10, 32, 12, 16, "relu")
    prog = lc.compile([val, *grads])
    _, gw1, gb1, gw2 = prog.run(w1=w1, b1=b1, w2=w2)
    f = x.astype(np.float64) @ w1.T + b1
    h = np.maximum(f, 0)
    df = (dy @ w2) * (f > 0)
    np.testing.assert_allclose(gw2, dy.T @ h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gw1, df.T @ x, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(gb1, df.sum(0), rtol=1e-4, atol=1e-5)
    fwd = prog._fixed.plan.kernels[0]
    assert fwd.kind == "matmul" and fwd.epilogue is not None and "relu" in fwd.epilogue.ops
    assert not any(k.kind == "elementwise" and "relu" in [i[0] for i in k.spec.instrs]
                   for k in prog._fixed.plan.kernels)


@pytest.mark.parametrize("causal", [True, False])
def test_self_attention_projection_gradient_is_the_backward_buffer(causal):
    """q, k, v split from one projection h (b, t, 3 d) into heads: the fused attention backward
    writes dq, dk, dv as (b, t, 3, heads, e), which IS h's gradient (no cat, no copy); values
    against the graph attention's gradient in f64."""
    from lazycandle.nn_attention import _graph_sdpa
    b, t, d, heads = 2, 9, 16, 2
    rng = np.random.default_rng(11)
    h = rng.standard_normal((b, t, 3 * d))
    w = rng.standard_normal((b, t, d))
    wt = lc.tensor(w)

    def loss(a, attn):
        q, k, v = (z.reshape((b, t, heads, d // heads)).transpose(1, 2) for z in a.chunk(3, -1))
        y = attn(q, k, v).transpose(1, 2).reshape((b, t, d))
        return (y * wt).sum_all()
    fused = lambda q, k, v: lc.nn.scaled_dot_product_attention(q, k, v, is_causal=causal)   # noqa: E731
    graph = lambda q, k, v: _graph_sdpa(q, k, v, None, causal, 1 / np.sqrt(d // heads))    # noqa: E731
    hp = lc.placeholder("h", h.shape, lc.f64)
    _, (g,) = lc.value_and_grad(lambda a: loss(a, fused), (0,))(hp)
    prog = lc.compile([g])
    _, (want,) = lc.value_and_grad(lambda a: loss(a, graph), (0,))(lc.tensor(h))
    np.testing.assert_allclose(prog.run(h=h)[0], want.numpy(), rtol=1e-10, atol=1e-12)
    kinds = _kernel_ops(prog)
    assert kinds.count("index") == 2, kinds         # forward + its log-sum-exp, backward: no cat


@pytest.mark.parametrize("residual_layout", ["contiguous", "permuted"])
def test_gemm_epilogue_reads_the_product_through_a_reshape(residual_layout):
    """x @ w over merged rows, read back as (b, t, n) by bias + residual: the add is the GEMM's
    epilogue with the residual restrided over the (b t, n) product; a residual whose strides
    cannot be merged that way (a permuted view) keeps its own kernel.  Values as NumPy."""
    b, t, k, n = 3, 5, 8, 6
    rng = np.random.default_rng(12)
    x = rng.standard_normal((b, t, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    r = rng.standard_normal((b, t, n) if residual_layout == "contiguous" else (t, b, n)).astype(np.float32)
    xp, rp = lc.placeholder("x", x.shape), lc.placeholder("r", r.shape)
    res = rp if residual_layout == "contiguous" else rp.transpose(0, 1)
    prog = lc.compile([lc.nn.linear(xp, lc.tensor(w), lc.tensor(bias)) + res])
    rn = r if residual_layout == "contiguous" else r.transpose(1, 0, 2)
    np.testing.assert_allclose(prog.run(x=x, r=r)[0], x @ w.T + bias + rn, rtol=1e-5, atol=1e-5)
    kinds = _kernel_ops(prog)
    assert kinds == (["matmul"] if residual_layout == "contiguous" else ["matmul", "elementwise"]), kinds


@pytest.mark.parametrize("dims", [("b", 7)])
def test_self_attention_projection_gradient_over_named_dims(dims):
    """The same gradient with a named batch dim, at two bindings, against the fixed-size fused
    program.  (A named length fails before the attention: chunk's gradient over a named dim
    raises SymbolicSizeError on main too.)"""
    d, heads = 8, 2

    def loss(a, w):
        b, t = a.shape[0], a.shape[1]
        q, k, v = (z.reshape((b, t, heads, d // heads)).transpose(1, 2) for z in a.chunk(3, -1))
        y = lc.nn.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape((b, t, d))
        return (y * w).sum_all()
    hp = lc.placeholder("h", dims + (3 * d,), lc.f64)
    wp = lc.placeholder("w", dims + (d,), lc.f64)
    _, (g,) = lc.value_and_grad(lambda a: loss(a, wp), (0,))(hp)
    prog = lc.compile([g])
    for b, t in ((2, 7), (3, 7)):
        rng = np.random.default_rng(b * 10 + t)
        h, w = rng.standard_normal((b, t, 3 * d)), rng.standard_normal((b, t, d))
        _, (want,) = lc.value_and_grad(lambda a: loss(a, lc.tensor(w)), (0,))(lc.tensor(h))
        np.testing.assert_allclose(prog.run(h=h, w=w)[0], want.numpy(), rtol=1e-10, atol=1e-12)


def _planned_ops(prog) -> list:
    desc = prog._fixed.plan.opt_desc
    return [desc["nodes"][j][0] for k in prog._fixed.plan.kernels for j in k.nodes]


@pytest.mark.parametrize("fn", ["cross_entropy", "log_softmax", "softmax"])
def test_softmax_family_gradient_has_no_max_path(fn):
    """The max that keeps exp finite is a constant shift: the backward neither differentiates
    it (no tie-count pass, no `eq` against the max) nor recomputes exp a third time; one row
    kernel, exp twice (forward sum, backward probabilities), gradient as NumPy's."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 37)).astype(np.float32)
    x[0, :3] = x[0].max() + 1.0                 # ties of the max: no gradient reaches them unevenly
    y = rng.integers(0, 37, 6)
    w = rng.standard_normal((6, 37)).astype(np.float32)
    xp = lc.placeholder("x", x.shape)
    losses = {"cross_entropy": lambda a: lc.nn.cross_entropy(a, lc.tensor(y)),
              "log_softmax": lambda a: (lc.nn.log_softmax(a, -1) * lc.tensor(w)).sum_all(),
              "softmax": lambda a: (lc.nn.softmax(a, -1) * lc.tensor(w)).sum_all()}
    _, (g,) = lc.value_and_grad(losses[fn], (0,))(xp)
    prog = lc.compile([g])
    x64 = x.astype(np.float64)
    p = np.exp(x64 - x64.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = {"cross_entropy": (p - np.eye(37)[y]) / 6,
            "log_softmax": w - p * w.sum(-1, keepdims=True),
            "softmax": p * (w - (p * w).sum(-1, keepdims=True))}[fn]
    np.testing.assert_allclose(prog.run(x=x)[0], want, rtol=1e-5, atol=1e-6)
    ops = _planned_ops(prog)
    # (cross_entropy's one-hot of the target is an eq against the ids; softmax's backward
    # pass needs its probabilities once more)
    assert ops.count("max") == 1 and ops.count("eq") == (fn == "cross_entropy"), ops
    assert ops.count("exp") == (3 if fn == "softmax" else 2), ops


@pytest.mark.parametrize("dtype,tol", [("f32", 5e-6), ("f64", 1e-13)])
def test_gelu_derivative_reads_the_forward_output_instead_of_a_second_tanh(dtype, tol):
    """gelu'(x) is built from the forward's s = gelu(x) / x: the step computes no tanh besides
    the gelu itself; values as torch's formula (f64 NumPy) over the whole range, x = 0 and
    both saturated tails included."""
    x = np.concatenate([np.linspace(-40, 40, 4001), [0.0, -0.0, 1e-30, -1e-30, 1e-300, 3e3, -3e3]])
    x = x.astype(np.float32 if dtype == "f32" else np.float64)
    xp = lc.placeholder("x", x.shape, dtype)
    _, (g,) = lc.value_and_grad(lambda a: a.gelu().sum_all(), (0,))(xp)
    prog = lc.compile([g])
    x64 = x.astype(np.float64)
    c, k = np.sqrt(2 / np.pi), 0.044715
    t = np.tanh(c * (x64 + k * x64 ** 3))
    want = 0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * c * (1 + 3 * k * x64 * x64)
    np.testing.assert_allclose(prog.run(x=x)[0], want, rtol=0, atol=tol)
    assert "tanh" not in _planned_ops(prog), _planned_ops(prog)


def test_softmax_shift_constant_is_no_growing_state_in_an_eager_loop():
    """The max shift is marked constant per node (no no_grad span per call): an eager loop of
    cross-entropy steps leaves no marks behind, and its gradients match NumPy's."""
    import gc
    from lazycandle import autograd
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    y = np.array([0, 3, 6, 2, 2])
    v = lc.Var(x)
    spans, marks = len(autograd._NO_GRAD_STARTS), len(autograd._CONSTANT_IDS)
    for _ in range(4):
        g = lc.nn.cross_entropy(v, lc.tensor(y)).backward()[v].numpy()
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(g, (p - np.eye(7)[y]) / 5, rtol=1e-5, atol=1e-7)
    gc.collect()
    assert len(autograd._NO_GRAD_STARTS) == spans and len(autograd._CONSTANT_IDS) == marks
