"""The compiled decode step of lc.models' causal LMs (models/causal_lm.py): ONE program for every
filled length, cache length and batch size, that binds each new size by formula (no rebuild of
the graph, nothing compiled), its attention over the filled cache slots as two fused attentions
merged by their rows' log-sum-exp (nn_attention.attention_with_lse, checked against NumPy
float64), and the same logits as eager decode steps on every path (the graph's attention, a
binding per step)."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle import named_dims, nn_attention
from lazycandle.errors import ShapeMismatchBinaryOp
from lazycandle.models import Session, gpt2, llama
from lazycandle.models import causal_lm
from lazycandle.models.causal_lm import run
from lazycandle.models.textgen import random_model

PROMPTS = [[5, 9, 14, 3, 60, 22, 8], [41], [17, 2, 90, 33]]


@pytest.fixture(scope="module")
def tiny_gpt2():
    return random_model(gpt2, gpt2.PRESETS["tiny"], seed=2)[0]


@pytest.fixture(scope="module")
def tiny_llama():
    return random_model(llama, llama.PRESETS["tiny"], seed=2)[0]


def _ref(q, k, v, mask, scale):
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64) * scale
    s = np.where(mask != 0, s, -np.inf)
    top = s.max(-1, keepdims=True)
    dead = ~np.isfinite(top)
    p = np.exp(s - np.where(dead, 0, top))
    total = p.sum(-1, keepdims=True)
    out = np.where(dead, 0, (p @ v.astype(np.float64)) / np.where(dead, 1, total))
    with np.errstate(divide="ignore"):
        lse = np.where(dead[..., 0], np.inf, (top + np.log(total))[..., 0])
    return out, lse


def test_attention_with_lse_matches_numpy_and_a_fully_masked_row():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 2, 16), (2, 3, 9, 16), (2, 3, 9, 16)))
    mask = (rng.random((2, 1, 1, 9)) > 0.3).astype(np.uint8)
    mask[1, 0, 0, :] = 0                                # batch 1: every key masked
    out, lse = nn_attention.attention_with_lse(lc.tensor(q), lc.tensor(k), lc.tensor(v), lc.tensor(mask), 0.3)
    want_out, want_lse = _ref(q, k, v, mask, 0.3)
    np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse.numpy(), want_lse, rtol=1e-5, atol=1e-6)
    assert np.isposinf(lse.numpy()[1]).all() and not out.numpy()[1].any()
    with pytest.raises(ShapeMismatchBinaryOp, match="4-D"):
        nn_attention.attention_with_lse(lc.tensor(q[0]), lc.tensor(k[0]), lc.tensor(v[0]))


def _decode_logits(model, prompts, steps, compiled):
    session = Session(model, len(prompts), max(len(p) for p in prompts) + steps + 1, compiled=compiled)
    out = [session.prefill(prompts)]
    for j in range(steps):
        out.append(session.decode([(7 * j + i) % 50 for i in range(len(prompts))]))
    return np.stack(out)


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_compiled_decode_equals_eager_with_fused_or_graph_attention_and_any_bind_block(which, request, monkeypatch):
    model = request.getfixturevalue(f"tiny_{which}")
    want = _decode_logits(model, PROMPTS, 20, compiled=False)
    np.testing.assert_allclose(_decode_logits(model, PROMPTS, 20, True), want, rtol=2e-4, atol=2e-4)
    monkeypatch.setattr(causal_lm, "BIND_BLOCK", 1)         # a binding per filled length
    np.testing.assert_allclose(_decode_logits(model, PROMPTS[:2], 20, True), want[:, :2], rtol=2e-4, atol=2e-4)
    monkeypatch.setattr(nn_attention, "attention_with_lse", lambda *a: None)      # the graph's attention
    np.testing.assert_allclose(_decode_logits(model, PROMPTS, 6, False), want[:7], rtol=2e-4, atol=2e-4)


def test_the_decode_program_is_built_after_the_first_token(tiny_gpt2, monkeypatch):
    """The first token comes from the prefill alone (building the decode program first cost a
    warm GPT-2 124M process ~50 ms before it); a program whose size class excludes the cache's
    first length moves the prefilled cache at the first step, and the logits stay the eager ones."""
    tiny_gpt2.__dict__.pop("_programs", None)
    seen = []
    run(tiny_gpt2, PROMPTS[:2], 3, eos_token_id=[], on_token=lambda i, t: seen.append(dict(tiny_gpt2.__dict__.get("_programs", {}))))
    assert seen[0] == {} and tiny_gpt2._programs
    want = _decode_logits(tiny_gpt2, PROMPTS, 5, compiled=False)
    monkeypatch.setattr(causal_lm, "first_cache_len", lambda least: 64)      # n_embd: not in the class
    session = Session(tiny_gpt2, len(PROMPTS), 13)
    got = [session.prefill(PROMPTS)]
    assert session.cache.max_len == 64
    got += [session.decode([(7 * j + i) % 50 for i in range(len(PROMPTS))]) for j in range(5)]
    assert session.cache.max_len == 65
    np.testing.assert_allclose(np.stack(got), want, rtol=2e-4, atol=2e-4)


def test_one_program_binds_every_length_and_batch_by_formula(tiny_gpt2, monkeypatch):
    """Filled lengths 8..~60 walk over the tiny model's own sizes (4 heads, head dim 16, n_embd
    64): no step rebuilds the graph (named_dims.bind), none compiles a kernel once each batch
    size ran (a batch's GEMM row class has its small-m kernel: log-many, by the host's vector
    width), and batch sizes 2, 3 and 6 share one program (batch 1 has its own)."""
    monkeypatch.setattr(causal_lm, "BIND_BLOCK", 1)
    tiny_gpt2.__dict__.pop("_programs", None)
    for prompts in ([PROMPTS[0]], PROMPTS[:2], PROMPTS, PROMPTS * 2):    # (each batch's small-m row class compiles once)
        run(tiny_gpt2, prompts, 3, eos_token_id=[])
    calls = []
    real = named_dims.bind
    monkeypatch.setattr(named_dims, "bind", lambda *a: calls.append(a[1]) or real(*a))
    kernels = lc.cache_info()["kernels"]
    for prompts, n in ((PROMPTS[:1], 55), (PROMPTS[:2], 40), (PROMPTS, 30), (PROMPTS * 2, 12)):
        gen = run(tiny_gpt2, prompts, n, eos_token_id=[])
        assert [len(t) for t in gen.tokens] == [n] * len(prompts)
    assert calls == [] and lc.cache_info()["kernels"] == kernels
    assert sorted(k for k in tiny_gpt2._programs if k != "named batch") == [("decode", "f32"), ("decode", "f32", 1)]


def test_attended_slots_and_cache_length_avoid_the_graphs_own_sizes(tiny_gpt2):
    session = Session(tiny_gpt2, 4, 60)                     # batch 4 = the model's 4 heads: a batch-4 program
    prog = session._decoder()
    assert ("decode", "f32", 4) in tiny_gpt2._programs and 4 in prog.sizes
    m = session.cache.max_len
    assert m > 60 and m not in prog.sizes
    for filled in range(1, 60):
        n = prog.attended(4, filled, m)
        assert filled <= n <= m and n not in prog.sizes and n != m and n >= 2


def test_a_kernel_reading_only_the_attention_lse_waits_for_it():
    """The fused attention writes its output and its rows' log-sum-exp: a kernel that reads only
    the log-sum-exp runs in a later phase of the native program, not beside the attention (a
    race that made decode steps wrong now and then)."""
    from lazycandle.runtime.attention_steps import FlashAttentionStep
    q = lc.placeholder("q", (1, 4, 1, 16))
    k, v = lc.placeholder("k", (1, 4, "S", 16)), lc.placeholder("v", (1, 4, "S", 16))
    y, lse = nn_attention.attention_with_lse(q, k, v)
    w = (lse - 1.0).exp()
    prog = lc.compile([y.broadcast_mul(w.unsqueeze(-1)), w])
    rng = np.random.default_rng(0)
    f = {n: rng.standard_normal(s).astype(np.float32) for n, s in (("q", (1, 4, 1, 16)), ("k", (1, 4, 9, 16)),
                                                                    ("v", (1, 4, 9, 16)))}
    for _ in range(3):                  # (the native program is built at a plan's second run)
        got_y, got_w = prog.run(**f)
    want_y, want_lse = _ref(f["q"], f["k"], f["v"], np.ones((1, 1, 1, 9)), 0.25)
    np.testing.assert_allclose(got_w, np.exp(want_lse - 1.0), rtol=1e-5)
    np.testing.assert_allclose(got_y, want_y * np.exp(want_lse - 1.0)[..., None], rtol=1e-5, atol=1e-6)
    plan = prog._last.plan.plan
    native = plan.native_program
    (step, kern), = [(s, kk) for s, kk in zip(plan.steps, plan.kernels) if isinstance(s, FlashAttentionStep)]
    assert step.lse_out is not None
    writes = native._regions(step, kern)[1]
    assert len(writes) == 2 and writes[1] == ("slot", native.slots[0][step.lse_out])
