"""The generators of lazycandle/models: tiny random GPT-2 and Llama checkpoints written with the
`safetensors` package load by their Hugging Face names, and their logits (the prefill's and
those of KV-cache decode steps, compiled and eager) match float64 NumPy reference
implementations of the same architectures written here; greedy generation is deterministic;
top-k / top-p sampling only picks allowed tokens; a checkpoint missing a tensor or with a
wrong shape raises SerializationError naming it; decode compiles nothing after warm-up."""
from __future__ import annotations

import math

import numpy as np
import pytest
from safetensors.numpy import save_file

import lazycandle as lc
from lazycandle.models import Sampler, generate
from lazycandle.models import gpt2, llama
from lazycandle.models.generation import Session
from lazycandle.models.sampling import candidates

RTOL, ATOL = 2e-4, 2e-4


def _random_checkpoint(shapes, seed, gains):
    rng = np.random.default_rng(seed)
    return {k: ((1 + 0.1 * rng.standard_normal(s)) if k.endswith(gains) else 0.05 * rng.standard_normal(s))
            .astype(np.float32) for k, s in shapes.items()}


# ---- float64 references ------------------------------------------------------------------
def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attend(q, k, v):
    """q (h, T, d) at the last T of S positions, k/v (h, S, d): causal attention."""
    t, s = q.shape[1], k.shape[1]
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    scores = scores + np.triu(np.full((t, s), -np.inf), s - t + 1)
    return _softmax(scores) @ v


def ref_gpt2(w, cfg, tokens):
    """Logits (T, vocab) of the whole sequence `tokens` (no cache: recomputed from scratch)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, hd = len(tokens), cfg.n_embd // cfg.n_head

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w[p + ".weight"] + w[p + ".bias"]

    def conv1d(x, p):
        return x @ w[p + ".weight"] + w[p + ".bias"]
    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        q, k, v = (z.reshape(t, cfg.n_head, hd).transpose(1, 0, 2) for z in np.split(conv1d(ln(x, h + "ln_1"), h + "attn.c_attn"), 3, -1))
        x = x + conv1d(_attend(q, k, v).transpose(1, 0, 2).reshape(t, -1), h + "attn.c_proj")
        m = conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc")
        m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
        x = x + conv1d(m, h + "mlp.c_proj")
    return ln(x, "ln_f") @ w["wte.weight"].T


def ref_llama(w, cfg, tokens):
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, hd = len(tokens), cfg.head_dim
    groups = cfg.n_head // cfg.n_kv_head

    def rms(x, p):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.eps) * w[p]
    inv = cfg.rope_theta ** (-np.arange(hd // 2) * 2 / hd)
    ang = np.arange(t)[:, None] * inv[None, :]
    cos, sin = np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1)

    def rope(z):          # (h, t, hd): HF's rotate_half
        rot = np.concatenate([-z[..., hd // 2:], z[..., :hd // 2]], -1)
        return z * cos + rot * sin

    def heads(z, n):
        return z.reshape(t, n, hd).transpose(1, 0, 2)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        a = rms(x, p + "input_layernorm.weight")
        q = rope(heads(a @ w[p + "self_attn.q_proj.weight"].T, cfg.n_head))
        k = np.repeat(rope(heads(a @ w[p + "self_attn.k_proj.weight"].T, cfg.n_kv_head)), groups, 0)
        v = np.repeat(heads(a @ w[p + "self_attn.v_proj.weight"].T, cfg.n_kv_head), groups, 0)
        x = x + _attend(q, k, v).transpose(1, 0, 2).reshape(t, -1) @ w[p + "self_attn.o_proj.weight"].T
        m = rms(x, p + "post_attention_layernorm.weight")
        g = m @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, "model.norm.weight") @ w["lm_head.weight"].T


# ---- fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_ckpt(tmp_path_factory):
    cfg = gpt2.CONFIGS["tiny"]
    w = _random_checkpoint(gpt2.param_shapes(cfg), 1, ("ln_1.weight", "ln_2.weight", "ln_f.weight"))
    path = tmp_path_factory.mktemp("gpt2") / "model.safetensors"
    save_file({"transformer." + k: v for k, v in w.items()}, str(path))      # HF's prefixed names
    return cfg, w, path


@pytest.fixture(scope="module")
def llama_ckpt(tmp_path_factory):
    cfg = llama.CONFIGS["tiny"]
    w = _random_checkpoint(llama.param_shapes(cfg), 2, ("layernorm.weight", "norm.weight"))
    path = tmp_path_factory.mktemp("llama") / "model.safetensors"
    save_file(w, str(path))
    return cfg, w, path


PROMPT = [72, 101, 108, 108, 111, 33, 7]
NEXT = [200, 3, 77, 128, 9]


def _check_against_reference(model, ref, compiled):
    session = Session(model, 32, compiled=compiled, span_block=8)
    full = ref(PROMPT + NEXT)
    np.testing.assert_allclose(session.prefill(PROMPT).numpy(), full[len(PROMPT) - 1], rtol=RTOL, atol=ATOL)
    for j, tok in enumerate(NEXT):           # crosses a span_block boundary (positions 7..11)
        got = session.decode(tok).numpy()
        np.testing.assert_allclose(got, full[len(PROMPT) + j], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-decode", "eager-decode"])
def test_gpt2_checkpoint_logits_match_numpy_prefill_and_decode(gpt2_ckpt, compiled):
    cfg, w, path = gpt2_ckpt
    model = gpt2.GPT2.from_safetensors(path, cfg)
    _check_against_reference(model, lambda toks: ref_gpt2(w, cfg, toks), compiled)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-decode", "eager-decode"])
def test_llama_checkpoint_logits_match_numpy_prefill_and_decode(llama_ckpt, compiled):
    cfg, w, path = llama_ckpt
    model = llama.Llama.from_safetensors(path, cfg)
    _check_against_reference(model, lambda toks: ref_llama(w, cfg, toks), compiled)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-decode", "eager-decode"])
def test_kv_cache_steps_write_new_rows_into_the_same_buffers(gpt2_ckpt, compiled):
    cfg, w, path = gpt2_ckpt
    session = Session(gpt2.GPT2.from_safetensors(path, cfg), 32, compiled=compiled, span_block=8)
    cache = session.cache
    addrs = [t._node.buffer.ctypes.data for t in cache.tensors()]
    session.prefill(PROMPT)
    for tok in NEXT:
        session.decode(tok)
    assert [t._node.buffer.ctypes.data for t in cache.tensors()] == addrs
    n = len(PROMPT) + len(NEXT)
    ref = gpt2.GPT2.from_safetensors(path, cfg)
    full = ref.new_cache(1, 32)
    ref.forward(lc.tensor(np.array([PROMPT + NEXT], np.int64)), full, 0)
    full.commit(0)
    for got, want in zip(cache.tensors(), full.tensors()):
        np.testing.assert_allclose(got.numpy()[:, :, :n], want.numpy()[:, :, :n], rtol=RTOL, atol=ATOL)
        assert not got.numpy()[:, :, n:].any()


def test_gpt2_prefill_logits_of_every_position_match_numpy(gpt2_ckpt):
    cfg, w, path = gpt2_ckpt
    model = gpt2.GPT2.from_safetensors(path, cfg)
    ids = lc.tensor(np.array([PROMPT], np.int64))
    got = model.forward(ids, model.new_cache(1, 16), 0).numpy()[0]
    np.testing.assert_allclose(got, ref_gpt2(w, cfg, PROMPT), rtol=RTOL, atol=ATOL)


def test_greedy_generation_is_deterministic_and_compiles_nothing_after_warmup(gpt2_ckpt):
    cfg, w, path = gpt2_ckpt
    model = gpt2.GPT2.from_safetensors(path, cfg)
    first = generate(model, PROMPT, 12, Sampler(), warmup=3)
    again = generate(gpt2.GPT2.from_safetensors(path, cfg), PROMPT, 12, Sampler(), warmup=3)
    assert first.tokens == again.tokens and len(first.tokens) == 12
    assert first.kernels_after_warmup == 0 and again.kernels_after_warmup == 0
    # the greedy picks are the reference's argmaxes
    seq = list(PROMPT)
    for tok in first.tokens[:4]:
        assert tok == int(np.argmax(ref_gpt2(w, cfg, seq)[-1]))
        seq.append(tok)


def test_llama_random_weights_generate_and_decode_compiles_nothing_after_warmup():
    model = llama.Llama.random(llama.CONFIGS["tiny"], seed=3)
    gen = generate(model, PROMPT, 10, Sampler(temperature=0.8, top_k=20, seed=1), warmup=3)
    assert len(gen.tokens) == 10 and all(0 <= t < model.config.vocab for t in gen.tokens)
    assert gen.kernels_after_warmup == 0


def test_seeded_sampling_repeats():
    model = gpt2.GPT2.random(gpt2.CONFIGS["tiny"], seed=4)
    a = generate(model, PROMPT, 6, Sampler(temperature=1.0, top_p=0.9, seed=7)).tokens
    b = generate(model, PROMPT, 6, Sampler(temperature=1.0, top_p=0.9, seed=7)).tokens
    assert a == b


# ---- sampling ------------------------------------------------------------------------------
LOGITS = np.array([0.5, 3.0, -1.0, 2.5, 0.0, 2.9, -3.0, 1.0], np.float32)


def test_top_k_only_picks_the_k_largest():
    s = Sampler(temperature=1.5, top_k=3, seed=0)
    picks = {s(lc.tensor(LOGITS)) for _ in range(60)}
    assert picks <= {1, 3, 5} and len(picks) > 1


def test_top_p_only_picks_the_smallest_set_reaching_p():
    p = np.exp(LOGITS - LOGITS.max()) / np.exp(LOGITS - LOGITS.max()).sum()
    order = np.argsort(-p)
    before = np.cumsum(p[order]) - p[order]
    allowed = set(order[before < 0.6].tolist())
    s = Sampler(temperature=1.0, top_p=0.6, seed=1)
    picks = {s(lc.tensor(LOGITS)) for _ in range(60)}
    assert picks <= allowed and len(picks) > 1


def test_candidates_keep_sorted_probabilities_and_zero_outside_top_p():
    probs, ids = candidates(lc.tensor(LOGITS), 1.0, top_k=0, top_p=0.6)
    probs, ids = probs.numpy(), ids.numpy()
    assert ids.tolist() == np.argsort(-LOGITS, kind="stable").tolist()
    kept = probs > 0
    assert kept[0] and not kept[-1] and (np.diff(kept.astype(int)) <= 0).all()


def test_greedy_is_argmax_and_bad_sampler_settings_raise():
    assert Sampler()(lc.tensor(LOGITS)) == 1
    with pytest.raises(ValueError):
        Sampler(top_p=0.0)
    with pytest.raises(ValueError):
        Sampler(temperature=-1.0)


# ---- checkpoint errors ----------------------------------------------------------------------
def test_checkpoint_missing_tensor_raises_serialization_error_naming_it(gpt2_ckpt, tmp_path):
    cfg, w, _ = gpt2_ckpt
    broken = dict(w)
    del broken["h.1.mlp.c_fc.bias"]
    path = tmp_path / "missing.safetensors"
    save_file(broken, str(path))
    with pytest.raises(lc.SerializationError, match=r"h\.1\.mlp\.c_fc\.bias.*missing"):
        gpt2.GPT2.from_safetensors(path, cfg)


def test_checkpoint_wrong_shape_raises_serialization_error_naming_it(llama_ckpt, tmp_path):
    cfg, w, _ = llama_ckpt
    broken = dict(w)
    broken["model.layers.0.self_attn.k_proj.weight"] = np.zeros((cfg.dim, cfg.dim), np.float32)
    path = tmp_path / "shape.safetensors"
    save_file(broken, str(path))
    with pytest.raises(lc.SerializationError, match=r"k_proj\.weight.*\(64, 64\).*\(32, 64\)"):
        llama.Llama.from_safetensors(path, cfg)


# ---- slice_set with a runtime start (the compiled decode step's cache update) ------------------
@pytest.mark.parametrize("n", [1, 3])
def test_slice_set_with_a_tensor_start_matches_numpy(n):
    a = np.arange(2 * 7 * 3, dtype=np.float32).reshape(2, 7, 3)
    src = -np.arange(2 * n * 3, dtype=np.float32).reshape(2, n, 3) - 1
    x, p = lc.placeholder("x", a.shape), lc.placeholder("p", (1,), lc.i64)
    prog = lc.compile([x.slice_set(lc.tensor(src), 1, p)])
    for start in range(0, 8 - n):
        ref = a.copy()
        ref[:, start:start + n] = src
        np.testing.assert_array_equal(prog.run(x=a, p=np.array([start]))[0], ref)
        np.testing.assert_array_equal(lc.tensor(a).slice_set(lc.tensor(src), 1, lc.tensor([start])).numpy(), ref)


def test_slice_set_one_position_reuses_its_kernels_for_new_starts():
    cache = lc.zeros((1, 2, 16, 4)).realize()
    row = lc.ones((1, 2, 1, 4))
    cache.slice_set(row, 2, 0).realize()
    before = lc.cache_info()["kernels"]
    for start in range(1, 16):
        got = cache.slice_set(row, 2, start).numpy()
        assert got[0, :, start].min() == 1 and got.sum() == 8
    assert lc.cache_info()["kernels"] == before


def test_slice_set_bad_tensor_start_is_a_type_error():
    with pytest.raises(TypeError):
        lc.zeros((4, 3)).slice_set(lc.ones((1, 3)), 0, lc.tensor([1.0]))
    with pytest.raises(lc.NarrowInvalidArgs):
        lc.zeros((2, 3)).slice_set(lc.ones((3, 3)), 0, lc.tensor([0]))


# ---- bad input and the command line --------------------------------------------------------------
def test_token_ids_out_of_range_raise_index_out_of_bounds_in_prefill_and_compiled_decode():
    model = gpt2.GPT2.random(gpt2.CONFIGS["tiny"], seed=5)
    vocab = model.config.vocab
    with pytest.raises(lc.IndexOutOfBounds):
        Session(model, 16).prefill([1, vocab])
    session = Session(model, 16)
    session.prefill([1, 2])
    with pytest.raises(lc.IndexOutOfBounds):
        session.decode(vocab + 3)


def test_generation_past_the_cache_raises_value_error():
    model = gpt2.GPT2.random(gpt2.CONFIGS["tiny"], seed=5)
    session = Session(model, 3)
    session.prefill([1, 2, 3])
    with pytest.raises(ValueError, match="max_len"):
        session.decode(4)


@pytest.mark.parametrize("module", [gpt2, llama], ids=["gpt2", "llama"])
def test_command_line_prints_tokens_and_ms_per_token(module, capsys):
    module.main(["--random-weights", "--config", "tiny", "--tokens", "5", "--prompt", "hi"])
    out = capsys.readouterr().out
    assert "prompt tokens: [104, 105]" in out and "new tokens:" in out
    assert "ms/token" in out and "prefill:" in out and "decode:" in out
