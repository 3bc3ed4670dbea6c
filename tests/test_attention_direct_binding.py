"""The flash-attention step's sizes in the direct binder (runtime/attention_steps.py
sizes_source): written as arithmetic of the shape and stride tokens, so a named-dim program
with attention binds a new size in one native call (codegen/binder_ir.py), with the same words
as the step's make, and leaves to the layered path every binding make would give another
kernel (a query length of another regime, other head dims) or refuse."""
import numpy as np
import pytest

import lazycandle as lc
from lazycandle import dtype as D
from lazycandle.codegen import attention as A, jit
from lazycandle.layout import Layout
from lazycandle.runtime.attention_steps import FlashAttentionStep


def _sdpa_program(h, d, q_len):
    e = h * d
    x, wq = lc.placeholder("x", (q_len, e)), lc.placeholder("wq", (e, e))
    k, v = lc.placeholder("k", (1, h, "L", d)), lc.placeholder("v", (1, h, "L", d))
    q = (x @ wq).reshape((1, q_len, h, d)).permute((0, 2, 1, 3))
    return lc.compile([lc.nn.scaled_dot_product_attention(q, k, v)])


def _feeds(L, h, d, q_len, seed=0):
    rng = np.random.default_rng(seed + L)
    return {"x": rng.standard_normal((q_len, h * d), np.float32),
            "wq": rng.standard_normal((h * d, h * d), np.float32) / 8,
            "k": rng.standard_normal((1, h, L, d), np.float32), "v": rng.standard_normal((1, h, L, d), np.float32)}


def _numpy(f, h, d, q_len):
    q = (f["x"].astype(np.float64) @ f["wq"]).reshape(1, q_len, h, d).transpose(0, 2, 1, 3)
    s = q @ np.swapaxes(f["k"], -1, -2).astype(np.float64) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ f["v"]


@pytest.mark.parametrize("dt", [D.f32, D.f64])
def test_query_regime_bounds_the_lengths_of_one_attention_spec(dt):
    width = jit.vector_bits() // (8 * dt.size_in_bytes)
    assert A.query_regime(dt, 0) is None
    for L in range(1, 3 * width + 3):
        lo, hi = A.query_regime(dt, L)
        spec = A.attention_spec(dt, 32, 32, False, None, L)
        assert lo <= L and (hi is None or L <= hi)
        assert A.attention_spec(dt, 32, 32, False, None, lo) == spec
        assert A.attention_spec(dt, 32, 32, False, None, hi if hi is not None else 10 * L) == spec
        assert lo == 1 or A.attention_spec(dt, 32, 32, False, None, lo - 1) != spec
        assert hi is None or A.attention_spec(dt, 32, 32, False, None, hi + 1) != spec


def _attention_step(plan):
    return next(s for s in plan.steps if isinstance(s, FlashAttentionStep))


def _layouts(B, H, L, S, E):
    q = Layout((B, H, L, E), (L * H * E, E, H * E, 1), 0)       # (b, l, h, e) storage, as the program's q
    kv = Layout((B, H, S, E), (H * S * E, S * E, E, 1), 0)
    return [q, kv, kv]


def _from_source(step, layouts, own):
    toks = [(list(lay.shape), list(lay.strides)) for lay in layouts]
    lines = step.sizes_source(7, toks, own)
    scope = {"max": max}
    exec("def f():\n" + "\n".join(lines) + "\n    return s7, e7, c7\n", scope)
    return scope["f"]()


@pytest.mark.parametrize("q_len", [1, 3, 12])
def test_sizes_source_writes_makes_words_or_leaves_the_binding_to_make(q_len):
    h, d = 2, 16
    prog = _sdpa_program(h, d, q_len)
    for L in (2, 3, 4, 5, 6):
        prog.run(**_feeds(L, h, d, q_len))
    step = _attention_step(prog._traced.binders[0].plan)
    own = step.make(_layouts(1, h, q_len, 5, d))
    for B, H, L, S, E in [(1, h, q_len, 1, d), (1, h, q_len, 900, d), (2, 3, q_len, 7, d),
                          (1, h, 2 * q_len + 9, 7, d), (1, h, q_len, 7, 2 * d), (0, h, q_len, 7, d)]:
        lays = _layouts(B, H, L, S, E)
        got = _from_source(step, lays, own)
        made = step.make(lays) if B * H and E == d else None    # (make keeps its spec per query length only)
        if made is None or made.fn is not own.fn:
            assert got is None, (B, H, L, S, E)
        else:
            assert got == (tuple(int(w) for w in made.sizes), made.units, made.unit_cost), (B, H, L, S, E)
    lays = _layouts(1, h, q_len, 7, d)
    lays[1] = Layout(lays[1].shape, lays[1].strides[:3] + (2,), 0)        # k's last dim strided: make refuses
    assert _from_source(step, lays, own) is None


@pytest.mark.parametrize("q_len", [1, 5])
def test_a_decode_programs_direct_binder_is_native_and_new_lengths_agree_with_numpy(q_len, monkeypatch):
    h, d = 3, 8
    prog = _sdpa_program(h, d, q_len)
    for L in (1, 2, 3, 4, 5, 6):
        prog.run(**_feeds(L, h, d, q_len))
    runner = prog._traced.direct[0]
    assert getattr(runner.fn, "parts", None) is not None       # compiled: no Python step in the binder
    compiled = jit.stats["compiled"]
    for L in (7, 9, 17, 64, 130, 8):
        f = _feeds(L, h, d, q_len)
        np.testing.assert_allclose(prog.run(**f)[0], _numpy(f, h, d, q_len), rtol=1e-4, atol=1e-5)
        assert prog._last_direct is runner
    assert jit.stats["compiled"] == compiled


def test_self_attention_with_a_mask_over_query_lengths_of_every_regime_agrees_with_numpy():
    """Query length = key length = L: the direct binder of one regime's class declines the
    lengths of another (the layered path binds them), the mask's strides are written per L."""
    h, d = 2, 8
    q, k, v = (lc.placeholder(n, (1, h, "L", d)) for n in "qkv")
    mask = lc.placeholder("mask", (1, 1, "L", "L"))
    prog = lc.compile([lc.nn.scaled_dot_product_attention(q, k, v, mask=mask)])
    width = jit.vector_bits() // 32
    rng = np.random.default_rng(5)
    for L in [2, 3, 4, 5, width // 2, width // 2 + 1, width, width + 1, 3 * width, 2, width + 2, width // 2 + 2, 7]:
        f = {n: rng.standard_normal((1, h, L, d), np.float32) for n in "qkv"}
        f["mask"] = np.where(rng.random((1, 1, L, L)) < 0.2, -1e4, 0).astype(np.float32)
        s = f["q"].astype(np.float64) @ np.swapaxes(f["k"], -1, -2) / np.sqrt(d) + f["mask"]
        p = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(prog.run(**f)[0], (p / p.sum(-1, keepdims=True)) @ f["v"], rtol=1e-4, atol=1e-5)
