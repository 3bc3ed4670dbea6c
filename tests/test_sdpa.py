"""lc.nn.scaled_dot_product_attention's fused flash-attention kernel against a NumPy float64
reference (causal, boolean / integer / additive masks, scale, odd lengths 1 / 7 / 65, L != S,
head dims up to 256, broadcast batch dims, strided operands), that it is ONE kernel, that a new
sequence length compiles nothing, thread-count independence, the graph fallback for other
dtypes / ranks, the gradients and the call-time errors."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.codegen import attention as A
from lazycandle.compiler import schedule_capture
from lazycandle.ir.graph import capture
from lazycandle.nn_attention import _graph_sdpa
from conftest import rng_for

sdpa = lc.nn.scaled_dot_product_attention


def ref_sdpa(q, k, v, mask=None, causal=False, scale=None):
    """torch's semantics in float64 (a fully masked row is 0, as torch >= 2.5 gives)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    L, S = s.shape[-2:]
    if causal:
        s = np.where(np.tril(np.ones((L, S), bool)), s, -np.inf)
    if mask is not None:
        mask = np.asarray(mask)
        s = s + mask if mask.dtype.kind == "f" else np.where(mask != 0, s, -np.inf)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - s.max(-1, keepdims=True))
        p = np.where(s.max(-1, keepdims=True) == -np.inf, 0.0, p / p.sum(-1, keepdims=True))
        return p @ v


def rand(rng, shape, dt):
    return rng.standard_normal(shape).astype(dt)


TOL = {np.float32: 2e-6, np.float64: 1e-13}


def close(got, want, dt):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=TOL[dt] * 10, atol=TOL[dt] * 10)


def kernels_of(t):
    kernels, _, _ = schedule_capture(capture([t._node]))
    return kernels


def flash_nodes(t):
    cap = capture([t._node])
    return [n for n in cap.nodes if n.op.name == "flash_attention"]


SHAPES = [  # (B, H, L, S, E, Ev)
    (1, 2, 7, 7, 16, 16), (2, 3, 65, 33, 64, 64), (1, 1, 1, 5, 8, 8), (1, 2, 40, 70, 5, 3),
    (1, 1, 65, 1, 32, 48), (2, 1, 7, 65, 128, 96), (1, 1, 3, 9, 256, 256), (1, 2, 1, 1, 1, 1),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_fused_sdpa_vs_reference(shape, dt, causal):
    B, H, L, S, E, EV = shape
    rng = rng_for("sdpa", shape, dt.__name__, causal)
    q, k, v = rand(rng, (B, H, L, E), dt), rand(rng, (B, H, S, E), dt), rand(rng, (B, H, S, EV), dt)
    out = sdpa(lc.tensor(q), lc.tensor(k), lc.tensor(v), is_causal=causal)
    assert len(flash_nodes(out)) == 1
    assert out.shape == (B, H, L, EV) and out.dtype.numpy == dt
    close(out.numpy(), ref_sdpa(q, k, v, causal=causal), dt)


def test_fused_sdpa_is_one_kernel():
    """The kernel writes (B, L, H, E) and sdpa returns its (B, H, L, E) transpose (as torch's CPU
    flash attention does), so merging the heads back, (B, L, H E), is that one kernel."""
    rng = rng_for("sdpa-one")
    arrays = {n: rand(rng, (2, 4, 33, 16), np.float32) for n in "qkv"}
    q, k, v = (lc.placeholder(n, (2, 4, 33, 16)) for n in "qkv")
    prog = lc.compile([sdpa(q, k, v, is_causal=True).transpose(1, 2).reshape((2, 33, 64))])
    assert [kn.kind for kn in prog._fixed.plan.kernels] == ["index"]
    want = sdpa(*(lc.tensor(arrays[n]) for n in "qkv"), is_causal=True).numpy()
    np.testing.assert_allclose(prog.run(**arrays)[0], want.transpose(0, 2, 1, 3).reshape(2, 33, 64), rtol=1e-6)


@pytest.mark.parametrize("L", [1, 3, 9, 16, 17], ids=["decode", "few-rows", "rows", "rows-16", "rows-17"])
@pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["f32", "f64"])
def test_fused_sdpa_masks_and_scale(dt, L):
    rng = rng_for("sdpa-mask", dt.__name__, L)
    B, H, S, E = 2, 3, 13, 8
    q, k, v = rand(rng, (B, H, L, E), dt), rand(rng, (B, H, S, E), dt), rand(rng, (B, H, S, E), dt)
    tq, tk, tv = lc.tensor(q), lc.tensor(k), lc.tensor(v)
    keep = rng.random((L, S)) > 0.4
    keep[:, 3] = True
    for m in (keep, keep.astype(np.uint8), keep.astype(np.int64), keep.astype(np.uint32)):
        out = sdpa(tq, tk, tv, mask=lc.tensor(m) if m.dtype != bool else m)
        assert len(flash_nodes(out)) == 1
        close(out.numpy(), ref_sdpa(q, k, v, keep), dt)
    for shape in ((L, S), (1, H, L, S), (B, 1, L, S), (B, H, L, S), (H, 1, S), (S,), (L, 1)):
        add = rand(rng, shape, dt)
        out = sdpa(tq, tk, tv, mask=lc.tensor(add), scale=0.3)
        assert len(flash_nodes(out)) == 1
        close(out.numpy(), ref_sdpa(q, k, v, add, scale=0.3), dt)
    close(sdpa(tq, tk, tv, is_causal=True, scale=2.5).numpy(), ref_sdpa(q, k, v, causal=True, scale=2.5), dt)


def test_fully_masked_rows_are_zero_like_torch_and_the_graph():
    rng = rng_for("sdpa-nan")
    q, k, v = (rand(rng, (1, 1, 4, 8), np.float64) for _ in range(3))
    keep = np.ones((4, 4), bool)
    keep[2] = False
    got = sdpa(lc.tensor(q), lc.tensor(k), lc.tensor(v), mask=keep).numpy()
    graph = _graph_sdpa(lc.tensor(q), lc.tensor(k), lc.tensor(v), lc.tensor(keep), False, 1 / np.sqrt(8)).numpy()
    assert (got[0, 0, 2] == 0).all() and (graph[0, 0, 2] == 0).all()
    close(got, ref_sdpa(q, k, v, keep), np.float64)
    additive = np.where(keep, 0.0, -np.inf)
    close(sdpa(lc.tensor(q), lc.tensor(k), lc.tensor(v), mask=additive).numpy(), ref_sdpa(q, k, v, keep), np.float64)
    q[0, 0, 1, 3] = np.nan
    got = sdpa(lc.tensor(q), lc.tensor(k), lc.tensor(v)).numpy()
    assert np.isnan(got[0, 0, 1]).all() and not np.isnan(np.delete(got, 1, axis=2)).any()
    torch = pytest.importorskip("torch")
    q[0, 0, 1, 3] = 0.5
    want = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(x) for x in (q, k, v)),
                                                           attn_mask=torch.from_numpy(keep)).numpy()
    close(sdpa(lc.tensor(q), lc.tensor(k), lc.tensor(v), mask=keep).numpy(), want, np.float64)


def test_fused_sdpa_strided_and_broadcast_operands():
    rng = rng_for("sdpa-strided")
    B, H, L, S, E = 2, 4, 10, 12, 16
    x = rand(rng, (B, L, H, E), np.float32)                        # (b, t, h, e) layout, viewed as (b, h, t, e)
    q_t, q = lc.tensor(x).transpose(1, 2), np.swapaxes(x, 1, 2)
    cache = rand(rng, (B, H, 20, E), np.float32)                   # a KV cache narrowed to its filled part
    k_t, k = lc.tensor(cache).narrow(2, 3, S), cache[:, :, 3:3 + S]
    vt = rand(rng, (B, H, E, S), np.float32)                       # v with a strided last dim: copied
    v_t, v = lc.tensor(vt).transpose(-1, -2), np.swapaxes(vt, -1, -2)
    close(sdpa(q_t, k_t, v_t, is_causal=True).numpy(), ref_sdpa(q, k, v, causal=True), np.float32)
    kt = rand(rng, (B, H, E, S), np.float32)                       # one decoding row, k with a strided last dim
    close(sdpa(q_t.narrow(2, 9, 1), lc.tensor(kt).transpose(-1, -2), v_t).numpy(),
          ref_sdpa(q[:, :, 9:10], np.swapaxes(kt, -1, -2), v), np.float32)
    k1, v1 = rand(rng, (1, H, S, E), np.float32), rand(rng, (B, 1, S, E), np.float32)   # broadcast batch dims
    out = sdpa(q_t, lc.tensor(k1), lc.tensor(v1))
    assert len(flash_nodes(out)) == 1
    close(out.numpy(), ref_sdpa(q, k1, v1), np.float32)
    q3, k2 = rand(rng, (H, L, E), np.float64), rand(rng, (S, E), np.float64)            # rank 3 and rank 2
    out = sdpa(lc.tensor(q3), lc.tensor(k2), lc.tensor(k2))
    assert out.shape == (H, L, E) and len(flash_nodes(out)) == 1
    close(out.numpy(), ref_sdpa(q3, k2, k2), np.float64)
    lazy = sdpa(lc.tensor(q) * 2.0, lc.tensor(k) + 1.0, lc.tensor(v).exp())                # computed operands
    close(lazy.numpy(), ref_sdpa(q * 2.0, k + 1.0, np.exp(v.astype(np.float64))), np.float32)


def test_new_lengths_compile_no_new_attention_kernel():
    rng = rng_for("sdpa-compile")
    E = 24

    def run(L, S):
        q, k, v = rand(rng, (1, 2, L, E), np.float32), rand(rng, (1, 2, S, E), np.float32), rand(rng, (1, 2, S, E), np.float32)
        close(sdpa(lc.tensor(q), lc.tensor(k), lc.tensor(v), is_causal=True).numpy(),
              ref_sdpa(q, k, v, causal=True), np.float32)

    for L in (1, 3, 70):              # one kernel per mode: decoding, a few rows, vectors over rows
        run(L, 5)
    before = len(A._kernels)
    for L, S in ((1, 6), (1, 7), (1, 65), (2, 9), (40, 9), (70, 70)):    # a decode loop's growing cache ...
        run(L, S)
    assert len(A._kernels) == before


def test_fused_sdpa_threads_agree_bitwise():
    rng = rng_for("sdpa-threads")
    q, k, v = (lc.tensor(rand(rng, (2, 6, 130, 32), np.float32)) for _ in range(3))
    outs = []
    for n in (1, 2):
        with lc.num_threads(n):
            outs.append(sdpa(q, k, v, is_causal=True).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("case", ["f16", "bf16", "rank5", "head-dim-300"])
def test_graph_fallback_outside_the_kernel(case):
    rng = rng_for("sdpa-fallback", case)
    shape, E, dt = (1, 2, 5), 8, lc.f32
    if case in ("f16", "bf16"):
        dt = lc.f16 if case == "f16" else lc.bf16
    elif case == "rank5":
        shape = (2, 1, 2, 5)
    else:
        E = 300
    q, k, v = (rng.standard_normal(shape + (E,)) for _ in range(3))
    out = sdpa(*(lc.tensor(x).to_dtype(dt) for x in (q, k, v)), is_causal=True)
    assert not flash_nodes(out)
    tol = 2e-2 if dt is not lc.f32 else 1e-5
    to64 = [lc.tensor(x).to_dtype(dt).to_dtype(lc.f64).numpy() for x in (q, k, v)]
    np.testing.assert_allclose(out.to_dtype(lc.f64).numpy(), ref_sdpa(*to64, causal=True), rtol=tol, atol=tol)


def _directional(fn, arrays, rng, eps=1e-6):
    out = fn(*[lc.tensor(a) for a in arrays])
    w = rng.standard_normal(out.shape)
    loss = lambda *ts: (fn(*ts) * lc.tensor(w)).sum()
    grads = lc.grad(loss, tuple(range(len(arrays))))(*[lc.tensor(a) for a in arrays])
    for i, g in enumerate(grads):
        d = rng.standard_normal(arrays[i].shape)
        vals = []
        for step in (eps, -eps):
            xs = list(arrays)
            xs[i] = arrays[i] + step * d
            vals.append(float(loss(*[lc.tensor(a) for a in xs]).numpy()))
        want = (vals[0] - vals[1]) / (2 * eps)
        got = float((g.numpy() * d).sum())
        assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), f"argument {i}: {got} vs {want}"


def test_fused_sdpa_gradients():
    rng = rng_for("sdpa-grad")
    q, k, v = rng.standard_normal((1, 2, 7, 4)), rng.standard_normal((1, 2, 9, 4)), rng.standard_normal((1, 2, 9, 3))
    _directional(lambda a, b, c: sdpa(a, b, c, is_causal=True), [q, k, v], rng)
    add = rng.standard_normal((7, 9))
    _directional(lambda a, b, c, m: sdpa(a, b, c, mask=m, scale=0.7), [q, k, v, add], rng)
    keep = rng.random((7, 9)) > 0.3
    keep[:, 0] = True
    _directional(lambda a, b, c: sdpa(a, b, c, mask=keep), [q, k, v], rng)


def test_sdpa_errors():
    q, k = lc.ones((1, 2, 4, 8)), lc.ones((1, 2, 6, 8))
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        sdpa(q, lc.ones((1, 2, 6, 4)), k)
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        sdpa(q, k, lc.ones((1, 2, 5, 8)))
    with pytest.raises(lc.DTypeMismatchBinaryOp):
        sdpa(q, k.to_dtype(lc.f64), k)
    with pytest.raises(lc.DTypeMismatchBinaryOp):
        sdpa(q, k, k, mask=lc.zeros((4, 6), dtype=lc.f64))
    with pytest.raises(lc.UnsupportedDTypeForOp):
        sdpa(q.to_dtype(lc.i32), k.to_dtype(lc.i32), k.to_dtype(lc.i32))
    with pytest.raises(ValueError):
        sdpa(q, k, k, mask=lc.zeros((4, 6)), is_causal=True)
    with pytest.raises(lc.Error):
        sdpa(q, k, k, mask=lc.zeros((3, 6))).numpy()


@pytest.mark.parametrize("additive", [False, True])
def test_gradients_with_a_fully_masked_row_match_torch(additive):
    """The masked row's 0 output has 0 gradient, and no NaN leaks into dk / dv through it."""
    torch = pytest.importorskip("torch")
    rng = rng_for("sdpa-dead-grad")
    q, k, v = (rand(rng, (1, 2, 4, 8), np.float64) for _ in range(3))
    keep = np.ones((4, 4), bool)
    keep[2] = False
    mask = np.where(keep, 0.0, -np.inf) if additive else keep
    vs = [lc.Var(x) for x in (q, k, v)]
    grads = sdpa(*vs, mask=lc.tensor(mask)).sqr().sum().backward()
    ts = [torch.tensor(x, requires_grad=True) for x in (q, k, v)]
    torch.nn.functional.scaled_dot_product_attention(*ts, attn_mask=torch.from_numpy(mask)).square().sum().backward()
    for var, t in zip(vs, ts):
        close(grads[var].numpy(), t.grad.numpy(), np.float64)


def test_one_plan_across_query_length_regimes_runs_natively_at_both():
    """A plan compiled at L = 4 (vectors over keys) and bound at L = 24 (vectors over query rows)
    launches another attention kernel there: the binding gets a native program of its own
    (before, it fell back to the per-kernel path: 61 us against 40 for a 12-head layer)."""
    rng = rng_for("sdpa-regimes")
    for L in (4, 24):
        ps = [lc.placeholder(n, (1, 2, L, 32), lc.f32) for n in "qkv"]
        prog = lc.compile([sdpa(*ps)])
        feeds = {n: rand(rng, (1, 2, L, 32), np.float32) for n in "qkv"}
        for _ in range(2):          # (a plan runs natively from its second run)
            (got,) = prog.run(**feeds)
        close(got, ref_sdpa(feeds["q"], feeds["k"], feeds["v"]), np.float32)
        assert prog._fixed.plan.binding.native, L


def test_query_rows_per_unit_follow_the_query_length():
    """Vectors over keys up to W / 2 rows; one row vector (W rows a unit) up to W; then 2 W."""
    f32 = lc.f32
    w = A.attention_spec(f32, 32, 32, False, None, 64).width
    modes = {L: (s.mode, s.bq) for L in (1, w // 2, w // 2 + 1, w, w + 1)
             for s in [A.attention_spec(f32, 32, 32, False, None, L)]}
    assert modes == {1: ("keys", 1), w // 2: ("keys", A.RB_MAX), w // 2 + 1: ("rows", w), w: ("rows", w),
                     w + 1: ("rows", 2 * w)}
