"""SPEC 0.3 "Training conveniences": lc.nn.cross_entropy (ignore_index, label_smoothing,
reduction, (..., C) logits), lc.optim.Adam, lc.optim.clip_grad_norm, and a learning rate that
is a runtime scalar of a compiled step -- against NumPy formulas, and against torch when it is
installed."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle.codegen import jit

try:
    import torch
except ImportError:          # pragma: no cover - torch is optional
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


# ---- cross_entropy ---------------------------------------------------------------------------
def ce_ref(logits, targets, ignore_index=-100, eps=0.0, reduction="mean"):
    """torch's cross_entropy with class ids on the last dim, in float64."""
    x = logits.astype(np.float64)
    c = x.shape[-1]
    m = x.max(-1, keepdims=True) if x.size else x
    logp = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True)) if x.size else x
    keep = targets != ignore_index
    safe = np.where(keep, targets, 0)
    picked = np.take_along_axis(logp, safe[..., None], -1)[..., 0] if x.size else np.zeros(targets.shape)
    loss = -(1 - eps) * picked - eps * logp.sum(-1) / c
    loss = np.where(keep, loss, 0.0)
    if reduction == "none":
        return loss
    with np.errstate(invalid="ignore"):
        return loss.sum() if reduction == "sum" else loss.sum() / keep.sum()


def _case(shape, seed, ignore_frac=0.3, ignore_index=-100):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(shape) * 2).astype(np.float64)
    targets = rng.integers(0, shape[-1], shape[:-1])
    targets = np.where(rng.random(shape[:-1]) < ignore_frac, ignore_index, targets)
    return logits, np.asarray(targets, np.int64)


SHAPES = [(7, 5), (2, 3, 6), (5,), (0, 4), (3, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.15])
@pytest.mark.parametrize("dt", [lc.f32, lc.f64], ids=lambda d: d.name)
def test_cross_entropy_matches_formula(shape, reduction, eps, dt):
    logits, targets = _case(shape, sum(map(ord, f"{shape}{reduction}{eps}")))
    x = logits.astype(dt.numpy)
    got = lc.nn.cross_entropy(lc.tensor(x), lc.tensor(targets), label_smoothing=eps, reduction=reduction)
    want = ce_ref(x, targets, eps=eps, reduction=reduction)
    assert got.dtype is dt and got.shape == np.shape(want)
    tol = 1e-12 if dt is lc.f64 else 2e-6
    np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)


def test_cross_entropy_ignore_index_in_range_and_target_dtypes():
    logits, targets = _case((9, 4), 3, ignore_frac=0.0)
    for dt in (np.uint8, np.uint32, np.int32, np.int16, np.int64):
        got = lc.nn.cross_entropy(lc.tensor(logits), lc.tensor(targets.astype(dt)), ignore_index=2)
        np.testing.assert_allclose(got.numpy(), ce_ref(logits, targets, ignore_index=2), rtol=1e-12)
    got = lc.nn.cross_entropy(lc.tensor(logits), targets.tolist(), reduction="none")     # a list of ids
    np.testing.assert_allclose(got.numpy(), ce_ref(logits, targets, reduction="none"), rtol=1e-12)


def test_all_ignored_batch():
    logits = np.random.default_rng(0).standard_normal((3, 5))
    targets = lc.tensor(np.full(3, -100, np.int64))
    assert np.isnan(lc.nn.cross_entropy(lc.tensor(logits), targets).item())
    assert lc.nn.cross_entropy(lc.tensor(logits), targets, reduction="sum").item() == 0.0
    assert (lc.nn.cross_entropy(lc.tensor(logits), targets, reduction="none").numpy() == 0).all()
    assert np.isnan(lc.nn.cross_entropy(lc.tensor(np.zeros((0, 5))), lc.tensor(np.zeros(0, np.int64))).item())


@pytest.mark.parametrize("bad", [5, 7, -1, -99])
def test_target_out_of_range_raises_at_run(bad):
    logits = lc.tensor(np.zeros((2, 3, 5), np.float32))
    targets = np.array([[0, 1, -100], [bad, 2, 3]])
    loss = lc.nn.cross_entropy(logits, lc.tensor(targets))     # built without complaint ...
    with pytest.raises(lc.IndexOutOfBounds, match=str(bad)):
        loss.numpy()                                            # ... and refused when it runs


def test_cross_entropy_bad_arguments():
    x = lc.tensor(np.zeros((4, 3), np.float32))
    t = lc.tensor(np.zeros(4, np.int64))
    with pytest.raises(lc.UnsupportedDTypeForOp, match=r"cross_entropy.*f32"):
        lc.nn.cross_entropy(x, lc.tensor(np.zeros(4, np.float32)))
    with pytest.raises(lc.UnsupportedDTypeForOp, match="cross_entropy"):
        lc.nn.cross_entropy(lc.tensor(np.zeros((4, 3), np.int64)), t)
    with pytest.raises(lc.ShapeMismatchBinaryOp, match=r"cross_entropy.*\(4, 3\).*\(3,\)"):
        lc.nn.cross_entropy(x, lc.tensor(np.zeros(3, np.int64)))
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        lc.nn.cross_entropy(x, lc.tensor(np.zeros((4, 3), np.int64)))
    with pytest.raises(ValueError, match="reduction"):
        lc.nn.cross_entropy(x, t, reduction="avg")
    with pytest.raises(ValueError, match="label_smoothing"):
        lc.nn.cross_entropy(x, t, label_smoothing=1.5)


@needs_torch
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_value_and_gradient_match_torch(reduction, eps):
    logits, targets = _case((3, 4, 7), 11)
    logits = logits.astype(np.float32)
    x = lc.Var(logits)
    loss = lc.nn.cross_entropy(x, lc.tensor(targets), label_smoothing=eps, reduction=reduction)
    seed = np.random.default_rng(1).standard_normal(loss.shape).astype(np.float32)
    dx = lc.grad(lambda v: (lc.nn.cross_entropy(v, lc.tensor(targets), label_smoothing=eps,
                                                   reduction=reduction) * lc.tensor(seed)).sum_all())(x)
    tx = torch.tensor(logits, requires_grad=True)
    tl = torch.nn.functional.cross_entropy(tx.reshape(-1, 7), torch.tensor(targets).reshape(-1),
                                           label_smoothing=eps, reduction=reduction)
    (tl.reshape(loss.shape) * torch.tensor(seed)).sum().backward()
    np.testing.assert_allclose(loss.numpy(), tl.detach().numpy().reshape(loss.shape), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(dx.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


# ---- Adam ------------------------------------------------------------------------------------
def adam_ref(p, grad_fn, steps, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """torch.optim.Adam (L2 weight decay added to the gradient) in float64; lr: a number or a
    function of the step index."""
    p = p.astype(np.float64).copy()
    m, v = np.zeros_like(p), np.zeros_like(p)
    b1, b2 = betas
    for t in range(1, steps + 1):
        g = grad_fn(p) + weight_decay * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        rate = lr(t - 1) if callable(lr) else lr
        p = p - rate / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
    return p


A = np.random.default_rng(5).standard_normal((6, 4))
Y = np.random.default_rng(6).standard_normal((6, 3))


def _loss(w):
    return ((lc.tensor(A) @ w - lc.tensor(Y)).sqr()).sum_all()


def _grad_np(w):
    return 2 * A.T @ (A @ w - Y)


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.3, 0.9)])
def test_adam_matches_torch_formula_f64(weight_decay, betas):
    w0 = np.random.default_rng(7).standard_normal((4, 3))
    w = lc.Var(w0)
    opt = lc.optim.Adam([w], lr=0.05, betas=betas, weight_decay=weight_decay)
    for _ in range(6):
        opt.backward_step(_loss(w))
    want = adam_ref(w0, _grad_np, 6, 0.05, betas=betas, weight_decay=weight_decay)
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-11, atol=1e-13)


def test_adam_defaults_and_is_not_adamw():
    opt = lc.optim.Adam([lc.Var(np.zeros(2))])
    assert (opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay) == (1e-3, 0.9, 0.999, 1e-8, 0.0)
    w0 = np.ones(3)
    a, b = lc.Var(w0), lc.Var(w0)
    lc.optim.Adam([a], lr=0.1, weight_decay=0.5).backward_step((a * 0.0).sum_all())     # zero gradient:
    lc.optim.AdamW([b], lr=0.1, weight_decay=0.5).backward_step((b * 0.0).sum_all())
    np.testing.assert_allclose(a.numpy(), w0 - 0.1, rtol=1e-7)          # L2 grad 0.5 -> a full Adam step
    np.testing.assert_allclose(b.numpy(), w0 * (1 - 0.05), rtol=1e-12)  # decoupled: shrink only


def test_lr_set_between_eager_steps():
    w0 = np.random.default_rng(8).standard_normal((4, 3))
    schedule = [0.1, 0.1, 0.02, 0.3, 0.005]
    for cls in (lc.optim.Adam, lc.optim.AdamW, lc.optim.SGD):
        w = lc.Var(w0)
        opt = cls([w], lr=schedule[0])
        for rate in schedule:
            opt.lr = rate
            opt.backward_step(_loss(w))
        assert opt.lr == schedule[-1] and opt.learning_rate() == schedule[-1]
        if cls is lc.optim.Adam:
            want = adam_ref(w0, _grad_np, len(schedule), lambda t: schedule[t])
            np.testing.assert_allclose(w.numpy(), want, rtol=1e-11, atol=1e-13)
        if cls is lc.optim.SGD:
            want = w0.copy()
            for rate in schedule:
                want = want - rate * _grad_np(want)
            np.testing.assert_allclose(w.numpy(), want, rtol=1e-12)


def test_lr_in_a_compiled_step_is_a_runtime_scalar():
    """opt.update under lc.jit: a new opt.lr is used at the next call, with no retrace and no
    kernel compiled."""
    w0 = np.random.default_rng(9).standard_normal((4, 3))
    opt = lc.optim.Adam([], lr=0.1)
    traces = []

    @lc.jit
    def step(w, m, v, b1t, b2t):
        traces.append(1)
        (g,) = lc.grad(lambda p: _loss(p), argnums=(0,))(w)
        (nw,), state = opt.update((w,), (g,), (m, v, b1t, b2t))
        return (nw,) + tuple(state)

    state = [s.numpy() for s in opt.init([lc.tensor(w0)])]
    w = w0
    schedule = [0.1, 0.05, 1.0, 0.0, 0.2]        # (1 and 0 are values a rewrite would fold for a scalar)
    compiled = None
    for i, rate in enumerate(schedule):
        opt.lr = rate
        w, *state = step(w, *state)
        if i == 1:
            compiled = jit.stats["compiled"]
    assert len(traces) == 1
    assert jit.stats["compiled"] == compiled, "a new learning rate compiled a kernel"
    want = adam_ref(w0, _grad_np, len(schedule), lambda t: schedule[t])
    np.testing.assert_allclose(w, want, rtol=1e-11, atol=1e-13)


def test_lr_in_lc_compile_program():
    p = lc.placeholder("p", (5,), lc.f32)
    g = lc.placeholder("g", (5,), lc.f32)
    opt = lc.optim.SGD([], lr=0.5)
    (new_p,), _ = opt.update((p,), (g,), ())
    prog = lc.compile([new_p])
    ps, gs = np.ones(5, np.float32), np.arange(5, dtype=np.float32)
    np.testing.assert_allclose(prog(p=ps, g=gs)[0], ps - 0.5 * gs, rtol=1e-7)
    opt.lr = 0.125
    np.testing.assert_allclose(prog(p=ps, g=gs)[0], ps - 0.125 * gs, rtol=1e-7)


@needs_torch
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_adam_matches_torch_f32(weight_decay):
    rng = np.random.default_rng(12)
    w1, w2 = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 3)).astype(np.float32)
    x, y = rng.standard_normal((10, 8)).astype(np.float32), rng.integers(0, 3, 10)
    a, b = lc.Var(w1), lc.Var(w2)
    ta, tb = (torch.tensor(v, requires_grad=True) for v in (w1, w2))
    opt = lc.optim.Adam([a, b], lr=0.01, weight_decay=weight_decay)
    topt = torch.optim.Adam([ta, tb], lr=0.01, weight_decay=weight_decay)
    for i in range(8):
        if i == 4:
            opt.lr = 0.003
            topt.param_groups[0]["lr"] = 0.003
        loss = lc.nn.cross_entropy((lc.tensor(x) @ a).tanh() @ b, lc.tensor(y), label_smoothing=0.1)
        tloss = torch.nn.functional.cross_entropy(torch.tanh(torch.tensor(x) @ ta) @ tb, torch.tensor(y),
                                                  label_smoothing=0.1)
        np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-5)
        opt.backward_step(loss)
        topt.zero_grad()
        tloss.backward()
        topt.step()
    np.testing.assert_allclose(a.numpy(), ta.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-5, atol=1e-6)


# ---- clip_grad_norm ----------------------------------------------------------------------------
def _grads(seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(s) * scale).astype(np.float32) for s in ((5,), (3, 4), (2, 1, 3))]


@pytest.mark.parametrize("max_norm, scale", [(1.0, 1.0), (100.0, 1.0), (0.5, 3.0), (float("inf"), 2.0)])
def test_clip_grad_norm_list(max_norm, scale):
    arrays = _grads(1, scale)
    grads = [lc.tensor(a) for a in arrays]
    total = lc.optim.clip_grad_norm(grads, max_norm)
    want = np.sqrt(sum((a.astype(np.float64) ** 2).sum() for a in arrays))
    assert total.shape == () and total.dtype is lc.f32
    np.testing.assert_allclose(total.item(), want, rtol=1e-6)
    coef = min(1.0, max_norm / (want + 1e-6))
    for g, a in zip(grads, arrays):
        np.testing.assert_allclose(g.numpy(), a * coef, rtol=2e-6, atol=1e-7)


def test_clip_grad_norm_gradstore_clips_the_trainable_tensors_only():
    w, b = lc.Var(np.ones((3, 2))), lc.Var(np.zeros(2))
    x = lc.tensor(np.arange(12.0).reshape(4, 3))
    h = x @ w + b
    grads = (h.sqr()).sum_all().backward()               # keeps h's gradient too (keep_all)
    gw, gb, gh = grads[w].numpy(), grads[b].numpy(), grads[h].numpy()
    total = lc.optim.clip_grad_norm(grads, 1.0)
    want = np.sqrt((gw ** 2).sum() + (gb ** 2).sum())
    np.testing.assert_allclose(total.item(), want, rtol=1e-12)
    np.testing.assert_allclose(grads[w].numpy(), gw / (want + 1e-6), rtol=1e-12)
    np.testing.assert_allclose(grads[b].numpy(), gb / (want + 1e-6), rtol=1e-12)
    np.testing.assert_array_equal(grads[h].numpy(), gh)


def test_clip_grad_norm_edge_cases_follow_torch():
    arrays = _grads(2)
    grads = [lc.tensor(a) for a in arrays]
    lc.optim.clip_grad_norm(grads, 0.0)                    # 0: every gradient becomes 0
    assert all((g.numpy() == 0).all() for g in grads)
    grads = [lc.tensor(a) for a in arrays]
    total = lc.optim.clip_grad_norm(grads, -1.0).item()    # negative: flipped and scaled, no error
    np.testing.assert_allclose(grads[1].numpy(), -arrays[1] / (total + 1e-6), rtol=2e-6)
    bad = [a.copy() for a in arrays]
    bad[0][2] = np.nan
    grads = [lc.tensor(a) for a in bad]
    assert np.isnan(lc.optim.clip_grad_norm(grads, 1.0).item())
    assert all(np.isnan(g.numpy()).all() for g in grads)  # NaN everywhere, as torch
    assert lc.optim.clip_grad_norm([], 1.0).item() == 0.0
    with pytest.raises(TypeError, match="list"):
        lc.optim.clip_grad_norm(tuple(lc.tensor(a) for a in arrays), 1.0)


@needs_torch
@pytest.mark.parametrize("max_norm", [0.7, 50.0, 0.0, -2.0])
@pytest.mark.parametrize("with_nan", [False, True])
def test_clip_grad_norm_matches_torch(max_norm, with_nan):
    arrays = _grads(4, 2.0)
    if with_nan:
        arrays[1][0, 0] = np.nan
    grads = [lc.tensor(a) for a in arrays]
    params = [torch.zeros(a.shape, requires_grad=True) for a in arrays]
    for p, a in zip(params, arrays):
        p.grad = torch.tensor(a)
    total = lc.optim.clip_grad_norm(grads, max_norm)
    ttotal = torch.nn.utils.clip_grad_norm_(params, max_norm)
    np.testing.assert_allclose(total.item(), ttotal.item(), rtol=1e-6)
    for g, p in zip(grads, params):
        np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=2e-6, atol=1e-7)
