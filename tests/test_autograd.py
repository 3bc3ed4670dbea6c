"""Reverse-mode autodiff: every rule against central finite differences in f64, GradStore
semantics, errors, optimizers and a small training run (candle's grad_tests.rs values are in
test_grad_candle.py)."""
import numpy as np
import pytest

import lazycandle as lc

RNG = np.random.default_rng(0)


def _loss_of(fn, weights):
    def loss(*ts):
        out = fn(*ts)
        return (out * lc.tensor(weights)).sum() if weights is not None else out
    return loss


def _evaluator(loss, arrays):
    """loss(*arrays) as a float: one compiled program run per call (tracing the graph once for
    all the finite-difference points), or eager when the forward needs concrete values."""
    try:
        prog = lc.compile([loss(*[lc.placeholder(f"a{i}", a.shape, lc.f64) for i, a in enumerate(arrays)])])
        names = {name for name, _, _ in prog.inputs}      # an argument the loss ignores is no input
        return lambda xs: float(prog.run(**{f"a{i}": x for i, x in enumerate(xs) if f"a{i}" in names})[0])
    except lc.Error:
        return lambda xs: loss(*[lc.tensor(x) for x in xs]).numpy().item()


def check_grad(fn, *arrays, eps=1e-6, tol=1e-6, argnums=None):
    """lc.grad of sum(fn(*xs) * w) (w random) against central differences of the same forward."""
    arrays = [np.asarray(a, np.float64) for a in arrays]
    out = fn(*[lc.tensor(a) for a in arrays])
    w = RNG.standard_normal(out.shape) if out.shape else None
    loss = _loss_of(fn, w)
    argnums = tuple(range(len(arrays))) if argnums is None else argnums
    grads = lc.grad(loss, argnums)(*[lc.tensor(a) for a in arrays])
    evaluate = _evaluator(loss, arrays)
    for a, g in zip(argnums, grads):
        got = g.numpy()
        assert got.shape == arrays[a].shape
        want = np.zeros_like(arrays[a])
        for idx in np.ndindex(arrays[a].shape):
            vals = []
            for step in (eps, -eps):
                xs = list(arrays)
                xs[a] = arrays[a].copy()
                xs[a][idx] += step
                vals.append(evaluate(xs))
            want[idx] = (vals[0] - vals[1]) / (2 * eps)
        np.testing.assert_allclose(got, want, rtol=tol * 100, atol=tol * 100, err_msg=f"argument {a}")


def rnd(*shape, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, shape)


UNARY = {
    "exp": (lambda x: x.exp(), rnd(2, 3)),
    "log": (lambda x: x.log(), rnd(2, 3, lo=0.5, hi=3)),
    "sin": (lambda x: x.sin(), rnd(2, 3)),
    "cos": (lambda x: x.cos(), rnd(2, 3)),
    "tanh": (lambda x: x.tanh(), rnd(2, 3)),
    "sqrt": (lambda x: x.sqrt(), rnd(2, 3, lo=0.5, hi=3)),
    "recip": (lambda x: x.recip(), rnd(2, 3, lo=0.5, hi=3)),
    "sqr": (lambda x: x.sqr(), rnd(2, 3)),
    "abs": (lambda x: x.abs(), rnd(2, 3)),
    "relu": (lambda x: x.relu(), rnd(2, 3)),
    "neg": (lambda x: -x, rnd(2, 3)),
    "sigmoid": (lambda x: x.sigmoid(), rnd(2, 3)),
    "silu": (lambda x: x.silu(), rnd(2, 3)),
    "gelu": (lambda x: x.gelu(), rnd(2, 3)),
    "gelu_erf": (lambda x: x.gelu_erf(), rnd(2, 3)),
    "erf": (lambda x: x.erf(), rnd(2, 3)),
    "powf": (lambda x: x.powf(2.5), rnd(2, 3, lo=0.5, hi=3)),
    "affine": (lambda x: x.affine(1.5, -2.0), rnd(2, 3)),
    "clamp": (lambda x: x.clamp(-0.5, 0.7), rnd(2, 3)),
    "elu": (lambda x: x.elu(0.8), rnd(2, 3)),
    "copy": (lambda x: x.copy(), rnd(2, 3)),
    "cast": (lambda x: x.to_dtype("f32").to_dtype("f64") * 1.0, rnd(2, 3)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_rule_matches_finite_differences(name):
    fn, x = UNARY[name]
    check_grad(fn, x, **({"eps": 1e-2, "tol": 1e-5} if name == "cast" else {}))


LAYOUTS = {   # how the argument reaches the op: (wrap the op's input, the array given for an (r, c) input)
    "transposed": (lambda x: x.t(), lambda a: a.T.copy()),
    "step_sliced": (lambda x: x[::2], lambda a: np.repeat(a, 2, axis=0)),
    "broadcast": (lambda x: x.broadcast_as((2,) + x.shape), lambda a: a),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_rule_on_strided_and_broadcast_inputs(name, layout):
    fn, x = UNARY[name]
    wrap, given = LAYOUTS[layout]
    check_grad(lambda t: fn(wrap(t)), given(x), **({"eps": 1e-2, "tol": 1e-5} if name == "cast" else {}))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_rule_on_a_zero_size_input(name):
    fn, _ = UNARY[name]
    x = lc.tensor(np.zeros((0, 3)))
    g = lc.grad(lambda t: fn(t).sum())(x)
    assert g.shape == (0, 3) and g.dtype == lc.f64


BINARY = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b, "maximum": lambda a, b: a.maximum(b), "minimum": lambda a, b: a.minimum(b),
    "pow": lambda a, b: a.pow(b),
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_rule_matches_finite_differences(name):
    a, b = rnd(3, 4, lo=0.5, hi=2), rnd(3, 4, lo=0.5, hi=2)
    check_grad(BINARY[name], a, b)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_rule_on_transposed_and_zero_size_operands(name):
    a, b = rnd(4, 3, lo=0.5, hi=2), rnd(3, 4, lo=0.5, hi=2)
    check_grad(lambda x, y: BINARY[name](x.t(), y), a, b)
    ga, gb = lc.grad(lambda x, y: BINARY[name](x, y).sum(), (0, 1))(lc.tensor(np.zeros((2, 0))), lc.tensor(np.ones((2, 0))))
    assert ga.shape == gb.shape == (2, 0)


@pytest.mark.parametrize("name", ["add", "mul", "div", "sub"])
def test_broadcast_operands_sum_back_to_their_shape(name):
    check_grad(BINARY[name], rnd(3, 1, 4, lo=0.5), rnd(5, 1, lo=0.5))


def test_maximum_ties_split_the_gradient_like_candle():
    a = lc.Var(np.array([1.0, 2.0, 3.0]))
    b = lc.Var(np.array([1.0, 5.0, 0.0]))
    g = a.maximum(b).sum().backward()
    np.testing.assert_array_equal(g[a].numpy(), [0.5, 0.0, 1.0])
    np.testing.assert_array_equal(g[b].numpy(), [0.5, 1.0, 0.0])


def test_where_routes_the_gradient_by_the_mask():
    mask = np.array([[1, 0, 1], [0, 0, 1]], np.uint8)
    check_grad(lambda a, b: lc.tensor(mask).where_cond(a, b), rnd(2, 3), rnd(2, 3))


VIEWS = {
    "transpose": (lambda x: x.t() * 1.0, (3, 4)),
    "permute": (lambda x: x.permute(2, 0, 1) * 1.0, (2, 3, 4)),
    "narrow": (lambda x: x.narrow(1, 1, 2) * 1.0, (3, 4)),
    "reshape": (lambda x: x.reshape(4, 3) * 1.0, (3, 4)),
    "step_slice": (lambda x: x[::2, 1::2] * 1.0, (5, 6)),
    "flip": (lambda x: x.flip(0) * 1.0, (3, 4)),
    "index_select_view": (lambda x: x[1] * 1.0, (3, 4)),
    "broadcast": (lambda x: x.broadcast_as((2, 3, 4)) * 1.0, (3, 1)),
    "transpose_then_narrow": (lambda x: x.t().narrow(0, 1, 2).reshape(-1) * 1.0, (3, 4)),
    "narrow_of_transpose_matmul": (lambda x: x.t().narrow(1, 0, 2).matmul(x.narrow(0, 0, 2)), (3, 4)),
    "overlapping_windows": (lambda x: x.max_pool2d_with_stride(2, 1), (1, 1, 3, 4)),
    "avg_pool": (lambda x: x.avg_pool2d(2), (1, 2, 4, 4)),
    "unsqueeze_squeeze": (lambda x: x.unsqueeze(1).squeeze(1) * 2.0, (3, 4)),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_view_rule_maps_the_gradient_through_the_layout(name):
    fn, shape = VIEWS[name]
    check_grad(fn, rnd(*shape))


REDUCE = {
    "sum": lambda x: x.sum(1), "sum_all": lambda x: x.sum_all(), "mean": lambda x: x.mean((0, 2)),
    "max": lambda x: x.max(2), "min": lambda x: x.min(0), "prod": lambda x: x.prod(1),
    "max_keepdim": lambda x: x.max_keepdim(1),
}


@pytest.mark.parametrize("name", sorted(REDUCE))
def test_reduction_rule_matches_finite_differences(name):
    check_grad(REDUCE[name], rnd(2, 3, 4, lo=0.5))


def test_max_ties_share_the_gradient_like_torch():
    x = lc.Var(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]]))
    g = x.max(1).sum().backward()[x].numpy()
    np.testing.assert_allclose(g, [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])


def test_matmul_and_broadcast_matmul_rules():
    check_grad(lambda a, b: a.matmul(b), rnd(3, 4), rnd(4, 2))
    check_grad(lambda a, b: a.matmul(b), rnd(2, 3, 4), rnd(2, 4, 5))
    check_grad(lambda a, b: a.broadcast_matmul(b), rnd(2, 3, 4), rnd(4, 5))


def test_index_op_rules():
    ids = lc.tensor(np.array([2, 0, 2], np.int64))
    check_grad(lambda x: x.index_select(ids, 0), rnd(3, 4))
    gids = lc.tensor(np.array([[0, 0], [1, 0], [2, 2]], np.int64))
    check_grad(lambda x: x.gather(gids, 1), rnd(3, 3))
    check_grad(lambda t, s: t.scatter_add(gids, s, 1), rnd(3, 3), rnd(3, 2))
    check_grad(lambda t, s: t.index_add(ids, s, 0), rnd(3, 4), rnd(3, 4))
    check_grad(lambda x: x.embedding(ids), rnd(3, 4))


def test_cat_stack_pad_rules():
    check_grad(lambda a, b: lc.cat([a, b], 1), rnd(2, 3), rnd(2, 2))
    check_grad(lambda a, b: lc.stack([a, b], 0), rnd(2, 3), rnd(2, 3))
    check_grad(lambda a: a.pad_with_zeros(1, 1, 2), rnd(2, 3))


def test_conv_rules_match_finite_differences():
    check_grad(lambda x, k: x.conv2d(k, padding=1), rnd(1, 2, 4, 4), rnd(3, 2, 3, 3))
    check_grad(lambda x, k: x.conv1d(k, stride=2), rnd(1, 2, 7), rnd(2, 2, 3))


def test_zero_size_input_gets_a_zero_size_gradient():
    g = lc.grad(lambda x: (x * 2.0).sum())(lc.tensor(np.zeros((0, 3))))
    assert g.shape == (0, 3)


def test_shared_subexpression_accumulates_both_uses():
    check_grad(lambda x: (lambda y: y * y + y.sin())(x.exp()), rnd(4))


def test_rounding_ops_pass_no_gradient_like_candle():
    x = lc.Var(np.array([1.3, -2.7, 0.5], np.float32))
    for f in (lambda t: t.floor(), lambda t: t.ceil(), lambda t: t.round(), lambda t: t.sign()):
        g = (f(x) * x).sum().backward()
        np.testing.assert_allclose(g[x].numpy(), f(x).numpy())     # only the direct path


# ---- GradStore semantics and errors -----------------------------------------------------
def test_gradstore_lookup_of_unrelated_tensor_is_none():
    x, z = lc.Var(np.ones(3)), lc.Var(np.ones(3))
    g = (x * 2.0).sum().backward()
    assert g[z] is None and g.get(z) is None and g.get(x) is not None
    pairs = dict((id(t), v) for t, v in g)
    assert id(x) in pairs and len(g) == len(list(g))


def test_backward_on_non_scalar_names_the_shape():
    x = lc.Var(np.ones((2, 3)))
    with pytest.raises(lc.Error, match=r"\(2, 3\)"):
        (x * 2.0).backward()


def test_integer_tensors_have_no_gradient():
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.Var(np.arange(3))
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.grad(lambda t: t.sum())(lc.tensor(np.arange(3)))
    x = lc.Var(np.array([1.0, 5.0, 2.0]))
    assert x.argmax(0).to_dtype("f64").sum().backward().get(x) is None


def test_no_grad_blocks_the_gradient():
    x = lc.Var(np.array([1.0, 2.0]))
    with lc.no_grad():
        c = x * 3.0
    g = (c * x).sum().backward()
    np.testing.assert_allclose(g[x].numpy(), [3.0, 6.0])


def test_nested_no_grad_spans_cover_the_outer_block():
    x = lc.Var(np.array([1.0, 2.0]))
    with lc.no_grad():
        with lc.no_grad():
            a = x * 2.0
        b = x * 3.0
    g = (a * x + b * x + x).sum().backward()
    np.testing.assert_allclose(g[x].numpy(), [6.0, 11.0])      # a + b + 1 with a, b constants


def test_upsample_rules():
    check_grad(lambda x: x.upsample_nearest2d(5, 3), rnd(1, 1, 2, 3))
    check_grad(lambda x: x.upsample_nearest1d(2), rnd(1, 2, 4))


def test_nan_propagates_like_the_forward():
    x = lc.Var(np.array([-1.0, 4.0]))
    g = x.sqrt().sum().backward()[x].numpy()
    assert np.isnan(g[0]) and g[1] == 0.25


def test_requires_grad_marks_a_tensor_trainable():
    x = lc.tensor(np.array([2.0, 3.0])).requires_grad_()
    np.testing.assert_allclose((x * x).sum().backward()[x].numpy(), [4.0, 6.0])


# ---- functional API under compile / jit --------------------------------------------------
def test_value_and_grad_compiles_into_one_program():
    w0 = RNG.standard_normal((4, 3))
    xs = RNG.standard_normal((5, 4))

    def step(w, x):
        loss, g = lc.value_and_grad(lambda w: (x.matmul(w).tanh()).sqr().mean_all())(w)
        return loss, w - g * 0.1

    loss, w1 = lc.jit(step)(w0, xs)
    ref_loss, ref_g = lc.value_and_grad(lambda w: (lc.tensor(xs).matmul(w).tanh()).sqr().mean_all())(lc.tensor(w0))
    np.testing.assert_allclose(loss, ref_loss.numpy())
    np.testing.assert_allclose(w1, w0 - 0.1 * ref_g.numpy())


# ---- optimizers ---------------------------------------------------------------------------
def test_sgd_with_momentum_matches_the_reference_update():
    w = lc.Var(np.array([1.0, -2.0]))
    opt = lc.optim.SGD([w], lr=0.1, momentum=0.9)
    ref, buf = np.array([1.0, -2.0]), None
    for _ in range(3):
        opt.backward_step((w * w).sum())
        g = 2 * ref
        buf = g if buf is None else 0.9 * buf + g
        ref = ref - 0.1 * buf
    np.testing.assert_allclose(w.numpy(), ref)


def test_adamw_matches_candle_nn_update():
    w = lc.Var(np.array([1.0, -2.0, 0.5]))
    opt = lc.optim.AdamW([w], lr=0.1, weight_decay=0.05)
    ref, m, v = np.array([1.0, -2.0, 0.5]), 0.0, 0.0
    for t in range(1, 4):
        opt.backward_step((w * w * w).sum())
        g = 3 * ref ** 2
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        ref = ref * (1 - 0.1 * 0.05) - 0.1 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    np.testing.assert_allclose(w.numpy(), ref)


def test_mlp_trains_to_98_percent_on_separable_data():
    rng = np.random.default_rng(1)
    n = 400
    xs = rng.standard_normal((n, 2)).astype(np.float32)
    ys = (xs[:, 0] + 0.5 * xs[:, 1] > 0).astype(np.int64)
    w1 = lc.Var(rng.standard_normal((2, 16)).astype(np.float32) * 0.5)
    b1 = lc.Var(np.zeros(16, np.float32))
    w2 = lc.Var(rng.standard_normal((16, 2)).astype(np.float32) * 0.5)
    b2 = lc.Var(np.zeros(2, np.float32))
    opt = lc.optim.AdamW([w1, b1, w2, b2], lr=0.05, weight_decay=0.0)
    x, onehot = lc.tensor(xs), lc.tensor(np.eye(2, dtype=np.float32)[ys])

    def logits():
        return (x.matmul(w1) + b1).relu().matmul(w2) + b2

    for _ in range(60):
        z = logits()
        zmax = z.max_keepdim(1)
        with lc.no_grad():
            zmax = zmax * 1.0
        lse = (z - zmax).exp().sum_keepdim(1).log() + zmax
        loss = ((lse - z) * onehot).sum_all() / n
        opt.backward_step(loss)
    acc = (logits().numpy().argmax(1) == ys).mean()
    assert acc >= 0.98


def test_nn_function_rules():
    check_grad(lambda x: lc.nn.softmax(x, 1), rnd(2, 4))
    check_grad(lambda x: lc.nn.log_softmax(x, -1), rnd(2, 4))
    check_grad(lambda x, a: lc.nn.rms_norm(x, a, 1e-5), rnd(2, 4), rnd(4))
    check_grad(lambda x, g, b: lc.nn.layer_norm(x, g, b, 1e-5), rnd(2, 4), rnd(4), rnd(4))
    check_grad(lambda x, w, b: lc.nn.linear(x, w, b), rnd(2, 3, 4), rnd(5, 4), rnd(5))


def test_model_op_rules():
    check_grad(lambda x: x.cumsum(1), rnd(2, 5))
    check_grad(lambda x: x.sort_last_dim()[0], rnd(2, 5))
    check_grad(lambda x: x.topk(2, dim=0)[0], rnd(4, 3))


def test_deep_graph_is_walked_iteratively():
    x = lc.Var(np.array([1.0, 2.0]))
    y = x
    for _ in range(3000):
        y = y + x * 0.001
    g = y.sum().backward()[x].numpy()
    np.testing.assert_allclose(g, [4.0, 4.0])


from hypothesis import given, settings, strategies as st  # noqa: E402

_IDS = lc.tensor(np.array([1, 1], np.int64))
_GRAPH_OPS = [   # each maps two (2, 2) tensors to one: elementwise, views, reductions, matmul, index, nn
    lambda a, b: a + b, lambda a, b: a * b, lambda a, b: a - b.tanh(),
    lambda a, b: a.sin() * b, lambda a, b: (a.sqr() + 1.0).sqrt() + b, lambda a, b: a.exp() * 0.1 + b.t().t(),
    lambda a, b: a.broadcast_mul(b.sum_keepdim(1)), lambda a, b: a.maximum(b * 0.5),
    lambda a, b: a.matmul(b) * 0.5, lambda a, b: a.t() @ b.flip(0), lambda a, b: lc.nn.softmax(a, 1) * b,
    lambda a, b: lc.cat([a.narrow(0, 1, 1), b.narrow(0, 0, 1)], 0), lambda a, b: a.index_select(_IDS, 0) + b,
    lambda a, b: a.log_softmax(1) + b.mean_keepdim(1), lambda a, b: a.cumsum(1) * b.sigmoid(),
    lambda a, b: lc.stack([a.sum(0), b.max(1)], 0), lambda a, b: (a * b).pad_with_zeros(1, 1, 0).narrow(1, 0, 2),
]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_GRAPH_OPS) - 1), st.integers(0, 10), st.integers(0, 10)),
                min_size=1, max_size=6))
def test_random_graphs_match_finite_differences(program):
    def fn(x, y):
        vals = [x, y]
        for op, i, j in program:
            vals.append(_GRAPH_OPS[op](vals[i % len(vals)], vals[j % len(vals)]))
        return vals[-1]
    check_grad(fn, rnd(2, 2, lo=-1, hi=1), rnd(2, 2, lo=-1, hi=1))



def test_strided_and_broadcast_arguments_get_their_own_gradient():
    base = lc.tensor(rnd(4, 3))
    g = lc.grad(lambda v: (v.narrow(0, 1, 2) * v.narrow(0, 0, 2)).sum())(base.t())
    want = np.zeros((3, 4))
    bt = base.numpy().T
    want[1:3] += bt[0:2]
    want[0:2] += bt[1:3]
    np.testing.assert_allclose(g.numpy(), want)
    bc = lc.tensor(np.array([1.0, 2.0])).broadcast_as((3, 2))
    g = lc.grad(lambda v: (v[0] * 2.0).sum())(bc)
    np.testing.assert_allclose(g.numpy(), [[2, 2], [0, 0], [0, 0]])


def test_backward_after_the_loss_was_realized():
    x = lc.Var(np.array([3.0, 1.0, 4.0]))
    y = (x * x + x * 5.0 + 4.0).sum()
    assert y.numpy() == 78.0
    np.testing.assert_allclose(y.backward()[x].numpy(), [11.0, 7.0, 13.0])


def test_optimizer_steps_do_not_keep_earlier_graphs():
    w = lc.Var(np.array([1.0, 2.0]))
    opt = lc.optim.AdamW([w], lr=0.1)
    for _ in range(3):
        opt.backward_step((w * w).sum())
    assert w._node.origin is None and all(t._node.origin is None for t in opt._state)


# ---- special values: the gradient is as defined as the forward ------------------------------
def test_prod_rule_handles_zeros_in_the_slice():
    x = np.array([[0.0, 2.0, 3.0], [0.0, 0.0, 4.0], [1.0, -2.0, 3.0]])
    check_grad(lambda t: t.prod(1), x)
    g = lc.grad(lambda t: t.prod_keepdim(1).sum())(lc.tensor(x)).numpy()
    np.testing.assert_array_equal(g, [[6.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-6.0, 3.0, -2.0]])


def test_pow_rules_at_zero_are_zero_not_nan_like_torch():
    gx, gy = lc.grad(lambda a, b: a.pow(b).sum(), (0, 1))(lc.tensor(np.array([0.0, 0.0, 2.0])),
                                                     lc.tensor(np.array([2.0, 0.0, 0.0])))
    np.testing.assert_array_equal(gx.numpy(), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(gy.numpy(), [0.0, 0.0, np.log(2.0)])
    g = lc.grad(lambda a: a.powf(0.0).sum())(lc.tensor([0.0, 3.0]))
    np.testing.assert_array_equal(g.numpy(), [0.0, 0.0])


def test_mod_rule_matches_finite_differences():
    check_grad(lambda a, b: a % b, rnd(3, 4, lo=0.3, hi=3), rnd(3, 4, lo=0.7, hi=2))


MASKED = {   # op, input: position 0 is one the forward's value does not depend on
    "relu": (lambda t: t.relu(), [-1.0, 2.0]),
    "clamp": (lambda t: t.clamp(-1.0, 1.0), [5.0, 0.5]),
    "maximum": (lambda t: t.maximum(lc.tensor(np.array([3.0, -3.0]))), [1.0, 2.0]),
    "max": (lambda t: t.max_keepdim(0).broadcast_as((2,)), [1.0, 2.0]),        # the max's gradient is inf
}


@pytest.mark.parametrize("name", sorted(MASKED))
def test_infinite_upstream_gradient_stays_out_of_masked_positions(name):
    fn, x = MASKED[name]
    w = lc.tensor(np.array([np.inf, 1.0]))
    g = lc.grad(lambda t: (fn(t) * w).sum())(lc.tensor(np.array(x))).numpy()
    assert g[0] == 0.0          # a multiply by a 0/1 mask would give inf * 0 = NaN


def test_inf_propagates_like_the_forward():
    x = lc.Var(np.array([0.0, 1.0]))
    g = x.log().sum().backward()[x].numpy()          # d log x = 1 / x: inf at 0, as the forward is -inf
    assert np.isposinf(g[0]) and g[1] == 1.0
    g = (x * np.inf).sum().backward()[x].numpy()
    assert np.isposinf(g).all()


def test_backward_of_an_integer_loss_raises():
    x = lc.Var(np.array([1.0, 5.0, 2.0]))
    with pytest.raises(lc.UnsupportedDTypeForOp, match="backward.*u32"):
        x.argmax(0).backward()


@pytest.mark.parametrize("low", ["f16", "bf16"])
def test_to_dtype_gradient_casts_back_to_the_source_dtype(low):
    x = lc.Var(np.array([0.5, -1.25, 3.0], np.float32))
    g = (x.to_dtype(low).sqr() * 3.0).sum().backward()[x]      # a low-precision loss
    assert g.dtype == lc.f32
    np.testing.assert_array_equal(g.numpy(), np.array([3.0, -7.5, 18.0], np.float32))
    g = (x.to_dtype(low) * 2.0).to_dtype("f64").sum().backward()[x]
    assert g.dtype == lc.f32 and g.numpy().tolist() == [2.0, 2.0, 2.0]


def test_realized_forward_keeps_its_graph_once_something_is_trainable_again():
    """With nothing trainable a realize stops asking whether to keep its graph (node.KEEP_ORIGIN
    off); a Var made afterwards turns it on again, so `loss.numpy()` before `backward` still
    differentiates -- also after the last Var died and a new one came."""
    from lazycandle.ir import node as node_mod
    for _ in range(2):
        import gc
        gc.collect()
        (lc.tensor(np.ones(3, np.float32)) * 2.0).numpy()
        assert node_mod.KEEP_ORIGIN is None
        x = lc.Var(np.array([1.0, -2.0, 3.0]))
        h = (x * x).exp()
        h.numpy()                                       # realized before the loss is built
        loss = (h * 0.5).sum()
        assert loss.numpy() == pytest.approx(0.5 * np.exp([1.0, 4.0, 9.0]).sum())
        g = loss.backward()[x].numpy()
        np.testing.assert_allclose(g, np.exp([1.0, 4.0, 9.0]) * np.array([1.0, -2.0, 3.0]), rtol=1e-12)
        del x, h, loss
