"""The fused flash-attention backward (codegen/attention_grad.py): gradients of q, k, v and an
additive mask against a NumPy float64 reference and the graph version, f32 and f64, causal /
additive / integer masks, odd lengths (1, 3, 17, 129), L != S, E != Ev, broadcast batch dims,
transposed operands, fully masked rows, zero sizes, central differences, torch when installed;
and that the gradient graph never holds an (L, S) tensor."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.compiler import optimize
from lazycandle.ir.graph import capture
from lazycandle.ir.schedule import schedule
from lazycandle.nn_attention import _graph_sdpa
from conftest import rng_for

sdpa = lc.nn.scaled_dot_product_attention
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def ref_grads(q, k, v, w, mask=None, causal=False, scale=None):
    """(dq, dk, dv, dmask) of sum(sdpa(q, k, v) * w) in float64, torch's semantics (a row with
    every key masked has output 0 and gradient 0); dmask at the full (..., L, S) shape."""
    q, k, v, w = (np.asarray(x, np.float64) for x in (q, k, v, w))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    L, S = s.shape[-2:]
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    if mask is not None:
        mask = np.asarray(mask)
        s = s + mask if mask.dtype.kind == "f" else np.where(mask != 0, s, -np.inf)
    top = s.max(-1, keepdims=True)
    dead = top == -np.inf
    with np.errstate(invalid="ignore"):
        p = np.exp(s - np.where(dead, 0.0, top))
        p = np.where(dead, 0.0, p / p.sum(-1, keepdims=True))
    dp = w @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = ds @ k * scale
    dk = np.swapaxes(ds, -1, -2) @ q * scale
    dv = np.swapaxes(p, -1, -2) @ w
    return dq, dk, dv, ds


def unbroadcast(g, shape):
    """Sum g over the dims it was broadcast along to reach it from `shape`."""
    while g.ndim > len(shape):
        g = g.sum(0)
    for i, n in enumerate(shape):
        if n == 1 and g.shape[i] != 1:
            g = g.sum(i, keepdims=True)
    return g


def lc_grads(q, k, v, w, mask=None, causal=False, scale=None, fn=sdpa):
    """lazycandle's gradients of sum(fn(q, k, v) * w) for q, k, v (and a float mask)."""
    vs = [lc.Var(x) for x in (q, k, v)]
    m = lc.tensor(mask) if mask is not None else None
    if m is not None and m.dtype.is_float:
        m = lc.Var(mask)
        vs.append(m)
    out = fn(vs[0], vs[1], vs[2], mask=m, is_causal=causal, scale=scale)
    grads = (out * lc.tensor(w)).sum().backward()
    return [grads[t].numpy() for t in vs], out


def check(got, want, dt):
    for g, r in zip(got, want):
        assert g.shape == r.shape
        np.testing.assert_allclose(np.asarray(g, np.float64), r, rtol=TOL[dt], atol=TOL[dt])


def run_case(dt, qs, ks, vs, mask=None, causal=False, scale=None, key=""):
    rng = rng_for("sdpa-bwd", key, qs, ks, dt.__name__)
    q, k, v = (rng.standard_normal(s).astype(dt) for s in (qs, ks, vs))
    batch = np.broadcast_shapes(qs[:-2], ks[:-2], vs[:-2])
    w = rng.standard_normal(batch + (qs[-2], vs[-1])).astype(dt)
    got, out = lc_grads(q, k, v, w, mask, causal, scale)
    dq, dk, dv, ds = ref_grads(q, k, v, w, mask, causal, scale)
    want = [unbroadcast(dq, qs), unbroadcast(dk, ks), unbroadcast(dv, vs)]
    if mask is not None and np.asarray(mask).dtype.kind == "f":
        want.append(unbroadcast(ds, np.shape(mask)))
    check(got, want, dt)
    return q, k, v, w, got


def grad_capture(q, k, v, mask=None, causal=False):
    vs = [lc.Var(x) for x in (q, k, v)]
    out = sdpa(*vs, mask=None if mask is None else lc.tensor(mask), is_causal=causal)
    grads = out.sqr().sum().backward()
    return capture([grads[t]._node for t in vs])


CASES = {   # name: (q shape, k shape, v shape, mask kind, causal)
    "full-17x129": ((2, 3, 17, 16), (2, 3, 129, 16), (2, 3, 129, 8), None, False),
    "causal-129x17": ((1, 2, 129, 16), (1, 2, 17, 16), (1, 2, 17, 8), None, True),
    "causal-3x1": ((2, 1, 3, 16), (2, 1, 1, 16), (2, 1, 1, 8), None, True),
    "u8-1x3": ((1, 2, 1, 16), (1, 2, 3, 16), (1, 2, 3, 8), "u8", False),
    "i64-17x3": ((2, 1, 17, 16), (2, 1, 3, 16), (2, 1, 3, 8), "i64", False),
    "add-17x33": ((2, 2, 17, 16), (2, 2, 33, 16), (2, 2, 33, 8), "add", False),
    # L == S and E == Ev: the (B, L, 3, H, E) output layout (attention_grad.interleaved)
    "self-causal-33": ((2, 3, 33, 16), (2, 3, 33, 16), (2, 3, 33, 16), None, True),
    "self-add-17": ((1, 2, 17, 8), (1, 2, 17, 8), (1, 2, 17, 8), "add", False),
}


def make_mask(kind, L, S, rng, dt):
    """A broadcast (L, S) mask with row 0 fully masked (when L > 1) and the others attending."""
    keep = rng.random((L, S)) > 0.4
    keep[:, -1] = True
    if L > 1:
        keep[0] = False
    if kind == "add":
        return np.where(keep, rng.standard_normal((L, S)), -np.inf).astype(dt)
    return keep.astype(np.uint8 if kind == "u8" else np.int64)


ONE_DTYPE = {"u8-1x3": np.float32, "i64-17x3": np.float64}    # integer masks: one dtype each (compile time)
RUNS = [(name, dt) for name in CASES for dt in (np.float32, np.float64) if ONE_DTYPE.get(name, dt) is dt]


@pytest.mark.parametrize("name, dt", RUNS, ids=[f"{n}-{dt.__name__}" for n, dt in RUNS])
def test_grads_vs_reference(name, dt):
    qs, ks, vs, kind, causal = CASES[name]
    mask = make_mask(kind, qs[-2], ks[-2], rng_for("mask", name), dt) if kind else None
    run_case(dt, qs, ks, vs, mask, causal, key=name)


def test_grads_match_the_graph_version():
    rng = rng_for("sdpa-bwd-graph")
    q, k, v = (rng.standard_normal((2, 2, n, 16)).astype(np.float32) for n in (17, 33, 33))
    v = v[..., :8].copy()
    w = rng.standard_normal((2, 2, 17, 8)).astype(np.float32)
    mask = make_mask("add", 17, 33, rng, np.float32)
    for m, causal in ((None, True), (mask, False)):
        fused, out = lc_grads(q, k, v, w, m, causal)
        assert any(n.op.name == "flash_attention" for n in capture([out._node]).nodes)
        graph, _ = lc_grads(q, k, v, w, m, causal, 0.25, lambda *a, mask, is_causal, scale: _graph_sdpa(
            *a, mask, is_causal, 0.25))
        fused, _ = lc_grads(q, k, v, w, m, causal, 0.25)
        check(fused, [np.asarray(g, np.float64) for g in graph], np.float32)


def test_head_dims_and_scale():
    run_case(np.float32, (1, 2, 33, 64), (1, 2, 65, 64), (1, 2, 65, 32), causal=True, key="e64")
    run_case(np.float64, (2, 1, 17, 3), (2, 1, 5, 3), (2, 1, 5, 5), scale=0.3, key="e3")


@pytest.mark.slow
def test_large_head_dims():
    run_case(np.float64, (1, 1, 40, 256), (1, 1, 70, 256), (1, 1, 70, 256), causal=True, key="e256")


def test_broadcast_batch():
    run_case(np.float64, (2, 3, 17, 16), (1, 3, 129, 16), (1, 3, 129, 8), key="kv-bcast")
    run_case(np.float64, (3, 17, 16), (2, 1, 3, 16), (2, 3, 3, 8), causal=True, key="rank3")


def test_transposed_operands():
    """q and k read through transposed views; the gradients come back in the views' shapes."""
    rng = rng_for("sdpa-bwd-T")
    qt = rng.standard_normal((2, 3, 16, 17)).astype(np.float32)       # (B, H, E, L)
    kt = rng.standard_normal((2, 29, 3, 16)).astype(np.float32)       # (B, S, H, E)
    v = rng.standard_normal((2, 3, 29, 8)).astype(np.float32)
    w = rng.standard_normal((2, 3, 17, 8)).astype(np.float32)
    vq, vk, vv = lc.Var(qt), lc.Var(kt), lc.Var(v)
    out = sdpa(vq.transpose(-1, -2), vk.transpose(1, 2), vv, is_causal=True)
    grads = (out * lc.tensor(w)).sum().backward()
    q, k = np.swapaxes(qt, -1, -2), np.swapaxes(kt, 1, 2)
    dq, dk, dv, _ = ref_grads(q, k, v, w, causal=True)
    check([grads[vq].numpy(), grads[vk].numpy(), grads[vv].numpy()],
          [np.swapaxes(dq, -1, -2), np.swapaxes(dk, 1, 2), dv], np.float32)


def test_fully_masked_rows_give_zero_gradients():
    rng = rng_for("sdpa-bwd-dead")
    mask = np.ones((5, 7), bool)
    mask[1] = mask[4] = False
    q, k, v, w, got = run_case(np.float64, (1, 2, 5, 16), (1, 2, 7, 16), (1, 2, 7, 8), mask, key="dead")
    assert np.all(got[0][:, :, [1, 4]] == 0) and all(np.isfinite(g).all() for g in got)
    every = np.zeros((5, 7), bool)
    _, _, _, _, got = run_case(np.float32, (1, 2, 5, 16), (1, 2, 7, 16), (1, 2, 7, 8), every, key="all-dead")
    assert all(np.all(g == 0) for g in got)
    del rng


@pytest.mark.parametrize("shape", [(1, 2, 0, 5), (0, 2, 4, 5)], ids=["L=0", "B=0"])
def test_zero_size(shape):
    B, H, L, S = shape
    q = np.zeros((B, H, L, 16), np.float32)
    k, v = np.ones((B, H, S, 16), np.float32), np.ones((B, H, S, 8), np.float32)
    got, _ = lc_grads(q, k, v, np.ones((B, H, L, 8), np.float32))
    assert [g.shape for g in got] == [q.shape, k.shape, v.shape]
    assert all(np.all(g == 0) for g in got)


def test_central_differences_f64():
    rng = rng_for("sdpa-bwd-fd")
    q, k, v = rng.standard_normal((1, 2, 3, 16)), rng.standard_normal((1, 2, 5, 16)), rng.standard_normal((1, 2, 5, 8))
    add = rng.standard_normal((3, 5))
    w = rng.standard_normal((1, 2, 3, 8))
    got, _ = lc_grads(q, k, v, w, add)
    def loss(*xs):
        out = sdpa(*(lc.tensor(x) for x in xs[:3]), mask=lc.tensor(xs[3]))
        return float((out * lc.tensor(w)).sum().numpy())
    arrays, eps = [q, k, v, add], 1e-6
    for i, g in enumerate(got):
        d = rng.standard_normal(arrays[i].shape)
        vals = []
        for step in (eps, -eps):
            xs = list(arrays)
            xs[i] = arrays[i] + step * d
            vals.append(loss(*xs))
        want = (vals[0] - vals[1]) / (2 * eps)
        assert abs(float((g * d).sum()) - want) <= 1e-7 * max(1.0, abs(want)), i


def test_backward_is_fused():
    """The gradient graph has one flash_attention_grad and no (L, S) tensor, and the
    forward's kernel writes the log-sum-exp the backward reads (one pass over the scores)."""
    rng = rng_for("sdpa-bwd-nodes")
    q, k, v = (rng.standard_normal((1, 2, n, 16)).astype(np.float32) for n in (17, 29, 29))
    for mask, causal in ((None, True), (np.ones((17, 29), np.uint8), False)):
        cap = grad_capture(q, k, v, mask, causal)
        nodes = cap.nodes
        assert sum(n.op.name == "flash_attention_grad" for n in nodes) == 1
        assert sum(n.op.name == "flash_attention_lse" for n in nodes) == 1
        assert not [n for n in nodes if n.op.name != "buffer" and tuple(n.shape[-2:]) == (17, 29)]
        opt = optimize(cap)
        ops = [sorted(opt.nodes[j].op.name for j in k.nodes) for k in schedule(opt)[0]]
        assert ["flash_attention", "flash_attention_lse"] in ops


@pytest.mark.parametrize("kind", [None, "causal", "u8", "add"])
def test_grads_match_torch(kind):
    torch = pytest.importorskip("torch")
    rng = rng_for("sdpa-bwd-torch", kind)
    q, k, v = (rng.standard_normal(s) for s in ((2, 2, 17, 16), (2, 2, 33, 16), (2, 2, 33, 8)))
    w = rng.standard_normal((2, 2, 17, 8))
    mask = make_mask(kind, 17, 33, rng, np.float64) if kind in ("u8", "add") else None
    got, _ = lc_grads(q, k, v, w, mask, kind == "causal")
    ts = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    tm = None
    if mask is not None:
        tm = torch.tensor(mask != 0) if kind == "u8" else torch.tensor(mask, requires_grad=True)
    out = torch.nn.functional.scaled_dot_product_attention(*ts, attn_mask=tm, is_causal=kind == "causal")
    (out * torch.tensor(w)).sum().backward()
    want = [t.grad.numpy() for t in ts] + ([tm.grad.numpy()] if kind == "add" else [])
    check(got, want, np.float64)


def test_thread_count_does_not_change_the_gradients():
    """Each unit owns one head's dq, dk and dv, so the sums never depend on the split."""
    rng = rng_for("sdpa-bwd-threads")
    q, k, v = (rng.standard_normal((2, 3, 33, 16)).astype(np.float32) for _ in range(3))
    v = v[..., :8].copy()
    w = rng.standard_normal((2, 3, 33, 8)).astype(np.float32)
    got = []
    for n in (1, 2):
        with lc.num_threads(n):
            got.append(lc_grads(q, k, v, w, causal=True)[0])
    for a, b in zip(*got):
        np.testing.assert_array_equal(a, b)


def test_compiled_training_step_reruns():
    """lc.grad on placeholders compiles forward, log-sum-exp and backward into one program
    (the forward's kernel writing the log-sum-exp); its later runs (the native path) on new
    data stay right."""
    shapes = {"q": (2, 2, 17, 16), "k": (2, 2, 29, 16), "v": (2, 2, 29, 8), "w": (2, 2, 17, 8)}
    ph = {n: lc.placeholder(n, s) for n, s in shapes.items()}
    loss = lambda q, k, v: (sdpa(q, k, v, is_causal=True) * ph["w"]).sum()
    prog = lc.compile(list(lc.grad(loss, (0, 1, 2))(ph["q"], ph["k"], ph["v"])))
    rng = rng_for("sdpa-bwd-program")
    for _ in range(3):
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
        got = prog.run(**feeds)
        check(got, ref_grads(feeds["q"], feeds["k"], feeds["v"], feeds["w"], causal=True)[:3], np.float32)
