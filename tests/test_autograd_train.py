"""Training steps as ONE compiled program: forward, cross-entropy, backward and the optimizer's
functional update (opt.init / opt.update) traced by lc.jit / lc.compile, against the eager
optimizers (candle-nn semantics) and on a small separable data set."""
import numpy as np
import pytest

import lazycandle as lc


def _mlp_data(seed=1, n=400):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((n, 2)).astype(np.float32)
    ys = (xs[:, 0] + 0.5 * xs[:, 1] > 0).astype(np.int64)
    params = [rng.standard_normal((16, 2)).astype(np.float32) * 0.5, np.zeros(16, np.float32),
              rng.standard_normal((2, 16)).astype(np.float32) * 0.5, np.zeros(2, np.float32)]
    return xs, ys, params


def _logits(ps, x):
    return lc.nn.linear(lc.nn.linear(x, ps[0], ps[1]).relu(), ps[2], ps[3])


def _loss(ps, x, ids):
    return lc.nn.cross_entropy(_logits(ps, x), ids)


def _jit_step(opt, n_params):
    """A jitted step over flat arguments: params, optimizer state, x, ids."""
    def step(*flat):
        params, state, (x, ids) = flat[:n_params], flat[n_params:-2], flat[-2:]
        loss, grads = lc.value_and_grad(lambda *p: _loss(p, x, ids), tuple(range(n_params)))(*params)
        new_p, new_s = opt.update(params, grads, state)
        return (loss, *new_p, *new_s)
    return lc.jit(step)


def test_compiled_training_step_reaches_98_percent_on_separable_data():
    xs, ys, params = _mlp_data()
    opt = lc.optim.AdamW(lr=0.05, weight_decay=0.0)
    state = [t.numpy() for t in opt.init([lc.tensor(p) for p in params])]
    step = _jit_step(opt, len(params))
    for _ in range(60):
        out = step(*params, *state, xs, ys)
        params, state = list(out[1:1 + len(params)]), list(out[1 + len(params):])
    acc = (_logits([lc.tensor(p) for p in params], lc.tensor(xs)).numpy().argmax(1) == ys).mean()
    assert acc >= 0.98


def test_compiled_step_compiles_once_and_matches_the_eager_optimizer():
    xs, ys, params = _mlp_data(seed=2, n=64)
    eager = [lc.Var(p) for p in params]
    eager_opt = lc.optim.AdamW(eager, lr=0.01, weight_decay=0.1)
    opt = lc.optim.AdamW(lr=0.01, weight_decay=0.1)
    state = [t.numpy() for t in opt.init([lc.tensor(p) for p in params])]
    step = _jit_step(opt, len(params))
    x, ids = lc.tensor(xs), lc.tensor(ys)
    for i in range(4):
        plans = lc.cache_info()["plans"]
        out = step(*params, *state, xs, ys)
        assert i == 0 or lc.cache_info()["plans"] == plans      # later steps reuse the one program
        eager_loss = _loss(eager, x, ids)
        np.testing.assert_allclose(out[0], eager_loss.numpy(), rtol=1e-5)
        eager_opt.backward_step(eager_loss)
        params, state = list(out[1:1 + len(params)]), list(out[1 + len(params):])
    for p, v in zip(params, eager):
        np.testing.assert_allclose(p, v.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_functional_sgd_matches_the_eager_sgd(momentum):
    w0 = np.array([1.0, -2.0, 0.5])
    w = lc.Var(w0)
    eager = lc.optim.SGD([w], lr=0.1, momentum=momentum)
    opt = lc.optim.SGD([], lr=0.1, momentum=momentum)
    p, state = lc.tensor(w0), opt.init([lc.tensor(w0)])
    for _ in range(3):
        eager.backward_step((w * w * w).sum())
        g = lc.grad(lambda t: (t * t * t).sum())(p)
        (p,), state = opt.update([p], [g], state)
        p, state = p.realize(), tuple(s.realize() for s in state)
    np.testing.assert_allclose(p.numpy(), w.numpy(), rtol=1e-12)


def test_the_update_of_all_parameters_is_one_kernel_writing_params_and_moments():
    """One horizontal kernel (ir/horizontal.py): a segment per parameter writes it and its moments."""
    from bench.train_step import build
    from lazycandle.ir.horizontal import HSpec
    prog, shapes, _ = build([6, 5, 3], 4)
    plan = prog._fixed.plan
    updates = [k for k in plan.kernels if isinstance(k.spec, HSpec) and len(k.outputs) == 3 * len(k.parts)]
    assert [len(k.parts) for k in updates] == [len(shapes)]


def test_fused_training_step_has_fewer_kernels_than_ops():
    from bench.train_step import build, count_ops
    prog, _, outs = build([6, 5, 3], 4)
    assert len(prog._fixed.plan.kernels) < count_ops(outs) / 3


def test_functional_update_checks_its_argument_counts():
    opt = lc.optim.AdamW()
    p = lc.tensor(np.ones(3))
    with pytest.raises(lc.ShapeMismatch, match="AdamW.update"):
        opt.update([p], [p], opt.init([p])[:-1])


def test_eager_step_skips_variables_without_a_gradient():
    a, b = lc.Var(np.array([1.0, 2.0])), lc.Var(np.array([3.0]))
    opt = lc.optim.AdamW([a, b], lr=0.1)
    opt.backward_step((a * a).sum())
    np.testing.assert_array_equal(b.numpy(), [3.0])
    assert not np.allclose(a.numpy(), [1.0, 2.0])
    a_before = a.numpy().copy()
    opt.backward_step((a * b).sum())           # b's moments start now; the step count is shared
    np.testing.assert_allclose(opt._state[1].numpy(), 0.1 * a_before.sum())       # m_b = (1 - b1) g
    np.testing.assert_allclose(opt._state[4].numpy(), 0.9 ** 2)                    # beta1^t after 2 steps
