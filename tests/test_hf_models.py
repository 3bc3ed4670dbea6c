"""GPT-2 and Llama from Hugging Face folders (lc.models.from_pretrained): small random
checkpoints written here with the `safetensors` package under the names transformers saves
(GPT-2's Conv1D (in, out) weights with and without "transformer.", tied heads absent from the
file, old causal-mask buffers, shards with model.safetensors.index.json; Llama with q/k/v/o and
MLP biases, head_dim != hidden / heads, grouped-query attention, llama3 and linear rope scaling
in both config spellings).  Oracle: float64 NumPy forward passes written here.  Also batched
generation (left padding) against per-sequence generation, EOS and stop strings, returned
logits, bf16 end to end, bad input, the command line, and transformers itself when installed."""
from __future__ import annotations

import json
import math
import os

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import lazycandle as lc
from lazycandle.models import PromptTooLong, Sampler, Session, from_pretrained

RTOL, ATOL = 2e-4, 2e-4

GPT2_CFG = {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 32, "n_positions": 40, "vocab_size": 97,
            "n_inner": 48, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new",
            "bos_token_id": 96, "eos_token_id": 96}
LLAMA_CFG = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "hidden_size": 32, "head_dim": 12, "intermediate_size": 40, "vocab_size": 101,
             "max_position_embeddings": 48, "rms_norm_eps": 1e-5, "rope_theta": 500.0,
             "attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False,
             "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
             "bos_token_id": 1, "eos_token_id": 2}


# ---- checkpoints in transformers' layout -----------------------------------------------------
def _rand(rng, shape, gain=False):
    return ((1 + 0.1 * rng.standard_normal(shape)) if gain else 0.08 * rng.standard_normal(shape)).astype(np.float32)


def gpt2_weights(cfg, seed):
    """HF GPT-2 tensors (unprefixed names, Conv1D weights (in, out)); lm_head when untied."""
    rng = np.random.default_rng(seed)
    d, f = cfg["n_embd"], cfg["n_inner"]
    w = {"wte.weight": _rand(rng, (cfg["vocab_size"], d)), "wpe.weight": _rand(rng, (cfg["n_positions"], d))}
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        for name, shape, gain in (("ln_1.weight", (d,), True), ("ln_1.bias", (d,), False),
                                  ("attn.c_attn.weight", (d, 3 * d), False), ("attn.c_attn.bias", (3 * d,), False),
                                  ("attn.c_proj.weight", (d, d), False), ("attn.c_proj.bias", (d,), False),
                                  ("ln_2.weight", (d,), True), ("ln_2.bias", (d,), False),
                                  ("mlp.c_fc.weight", (d, f), False), ("mlp.c_fc.bias", (f,), False),
                                  ("mlp.c_proj.weight", (f, d), False), ("mlp.c_proj.bias", (d,), False)):
            w[h + name] = _rand(rng, shape, gain)
    w["ln_f.weight"], w["ln_f.bias"] = _rand(rng, (d,), True), _rand(rng, (d,))
    if not cfg.get("tie_word_embeddings", True):
        w["lm_head.weight"] = _rand(rng, (cfg["vocab_size"], d))
    return w


def llama_weights(cfg, seed):
    rng = np.random.default_rng(seed)
    d, hd, f, v = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    w = {"model.embed_tokens.weight": _rand(rng, (v, d)), "model.norm.weight": _rand(rng, (d,), True)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = _rand(rng, (d,), True)
        w[p + "post_attention_layernorm.weight"] = _rand(rng, (d,), True)
        for name, (o, n) in (("q", (q, d)), ("k", (kv, d)), ("v", (kv, d)), ("o", (d, q))):
            w[p + f"self_attn.{name}_proj.weight"] = _rand(rng, (o, n))
            if cfg.get("attention_bias"):
                w[p + f"self_attn.{name}_proj.bias"] = _rand(rng, (o,))
        for name, (o, n) in (("gate", (f, d)), ("up", (f, d)), ("down", (d, f))):
            w[p + f"mlp.{name}_proj.weight"] = _rand(rng, (o, n))
            if cfg.get("mlp_bias"):
                w[p + f"mlp.{name}_proj.bias"] = _rand(rng, (o,))
    if not cfg.get("tie_word_embeddings", False):
        w["lm_head.weight"] = _rand(rng, (v, d))
    return w


def write_folder(path, cfg, tensors, shards=1, dtype=np.float32):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    tensors = {k: v.astype(dtype) for k, v in tensors.items()}
    if shards == 1:
        save_file(tensors, os.path.join(path, "model.safetensors"))
        return str(path)
    names, wmap = list(tensors), {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, os.path.join(path, file))
        wmap.update({n: file for n in part})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": wmap}, f)
    return str(path)


def write_tokenizer(path, vocab_size):
    """A word-level tokenizer.json: token "wN" is id N, text is the tokens joined by spaces."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers
    tk = tokenizers.Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.save(os.path.join(path, "tokenizer.json"))


# ---- float64 references ------------------------------------------------------------------------
def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attend(q, k, v, scale):
    """q, k, v (h, T, d): causal attention."""
    t = q.shape[1]
    s = q @ k.transpose(0, 2, 1) * scale + np.triu(np.full((t, t), -np.inf), 1)
    return _softmax(s) @ v


def ref_gpt2(w, cfg, tokens):
    """Logits (T, vocab) of the sequence `tokens`."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, nh = len(tokens), cfg["n_head"]
    hd = cfg["n_embd"] // nh

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + cfg["layer_norm_epsilon"]) * w[p + ".weight"] + w[p + ".bias"]

    def conv1d(x, p):
        return x @ w[p + ".weight"] + w[p + ".bias"]
    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    for i in range(cfg["n_layer"]):
        h = f"h.{i}."
        qkv = np.split(conv1d(ln(x, h + "ln_1"), h + "attn.c_attn"), 3, -1)
        q, k, v = (z.reshape(t, nh, hd).transpose(1, 0, 2) for z in qkv)
        x = x + conv1d(_attend(q, k, v, hd ** -0.5).transpose(1, 0, 2).reshape(t, -1), h + "attn.c_proj")
        m = conv1d(ln(x, h + "ln_2"), h + "mlp.c_fc")
        m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
        x = x + conv1d(m, h + "mlp.c_proj")
    head = w.get("lm_head.weight", w["wte.weight"])
    return ln(x, "ln_f") @ head.T


def ref_inv_freq(cfg):
    """transformers' inverse frequencies (default, linear, llama3), in float64."""
    hd = cfg["head_dim"]
    p = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = p.get("rope_theta", cfg.get("rope_theta", 10000.0))
    inv = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
    kind = p.get("rope_type", p.get("type", "default"))
    if kind == "linear":
        return inv / p["factor"]
    if kind == "llama3":
        factor, lo, hi, old = p["factor"], p["low_freq_factor"], p["high_freq_factor"], \
            p["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        out = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        mid = (wavelen >= old / hi) & (wavelen <= old / lo)
        return np.where(mid, (1 - smooth) * out / factor + smooth * out, out)
    return inv


def ref_llama(w, cfg, tokens):
    w = {k: v.astype(np.float64) for k, v in w.items()}
    t, hd = len(tokens), cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def lin(x, p):
        y = x @ w[p + ".weight"].T
        return y + w[p + ".bias"] if p + ".bias" in w else y

    def rms(x, p):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg["rms_norm_eps"]) * w[p]
    ang = np.arange(t)[:, None] * ref_inv_freq(cfg)[None, :]
    cos, sin = np.concatenate([np.cos(ang)] * 2, -1), np.concatenate([np.sin(ang)] * 2, -1)

    def rope(z):
        return z * cos + np.concatenate([-z[..., hd // 2:], z[..., :hd // 2]], -1) * sin

    def heads(z, n):
        return z.reshape(t, n, hd).transpose(1, 0, 2)
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(x, p + "input_layernorm.weight")
        q = rope(heads(lin(a, p + "self_attn.q_proj"), nh))
        k = np.repeat(rope(heads(lin(a, p + "self_attn.k_proj"), nkv)), nh // nkv, 0)
        v = np.repeat(heads(lin(a, p + "self_attn.v_proj"), nkv), nh // nkv, 0)
        x = x + lin(_attend(q, k, v, hd ** -0.5).transpose(1, 0, 2).reshape(t, -1), p + "self_attn.o_proj")
        m = rms(x, p + "post_attention_layernorm.weight")
        g = lin(m, p + "mlp.gate_proj")
        x = x + lin((g / (1 + np.exp(-g))) * lin(m, p + "mlp.up_proj"), p + "mlp.down_proj")
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rms(x, "model.norm.weight") @ head.T


# ---- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    """Prefixed names (GPT2LMHeadModel.save_pretrained), tied head absent, a tokenizer."""
    w = gpt2_weights(GPT2_CFG, 1)
    path = tmp_path_factory.mktemp("gpt2")
    write_folder(path, GPT2_CFG, {"transformer." + k: v for k, v in w.items()})
    write_tokenizer(path, GPT2_CFG["vocab_size"])
    return str(path), w


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    w = llama_weights(LLAMA_CFG, 2)
    return write_folder(tmp_path_factory.mktemp("llama"), LLAMA_CFG, w), w


@pytest.fixture(scope="module")
def gpt2_model(gpt2_folder):
    return from_pretrained(gpt2_folder[0])


@pytest.fixture(scope="module")
def llama_model(llama_folder):
    return from_pretrained(llama_folder[0])


PROMPT = [72, 10, 18, 44, 31, 33, 7]
NEXT = [20, 3, 77, 28, 9]


def _close(got, want, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * max(1.0, np.abs(want).max()))


# ---- logits of full sequences and of cached decode steps ------------------------------------------
def test_gpt2_folder_logits_match_numpy(gpt2_folder, gpt2_model):
    _, w = gpt2_folder
    logits = gpt2_model([PROMPT, PROMPT[::-1]])
    assert logits.shape == (2, len(PROMPT), 97) and logits.dtype is lc.f32
    got = logits.numpy()
    _close(got[0], ref_gpt2(w, GPT2_CFG, PROMPT))
    _close(got[1], ref_gpt2(w, GPT2_CFG, PROMPT[::-1]))


def test_llama_folder_with_biases_head_dim_gqa_and_llama3_rope_matches_numpy(llama_folder, llama_model):
    _, w = llama_folder
    _close(llama_model(PROMPT).numpy()[0], ref_llama(w, LLAMA_CFG, PROMPT))


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-decode", "eager-decode"])
@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_prefill_and_decode_steps_match_numpy(which, compiled, request):
    model = request.getfixturevalue(f"{which}_model")
    _, w = request.getfixturevalue(f"{which}_folder")
    ref = ref_gpt2 if which == "gpt2" else ref_llama
    full = ref(w, GPT2_CFG if which == "gpt2" else LLAMA_CFG, PROMPT + NEXT)
    session = Session(model, 1, 16, compiled=compiled)
    _close(session.prefill([PROMPT])[0], full[len(PROMPT) - 1])
    for j, tok in enumerate(NEXT):        # a new filled length each step (slots 7..11)
        _close(session.decode([tok])[0], full[len(PROMPT) + j])


def test_gpt2_unprefixed_sharded_untied_with_mask_buffers(tmp_path):
    cfg = dict(GPT2_CFG, tie_word_embeddings=False, activation_function="gelu_pytorch_tanh")
    w = gpt2_weights(cfg, 3)
    extra = {f"h.{i}.attn.bias": np.tril(np.ones((1, 1, 40, 40), np.float32)) for i in range(2)}
    write_folder(tmp_path, cfg, {**w, **extra}, shards=3)
    model = from_pretrained(tmp_path)
    _close(model(PROMPT).numpy()[0], ref_gpt2(w, cfg, PROMPT))


def test_llama_tied_head_absent_and_linear_rope_in_rope_parameters(tmp_path):
    cfg = {k: v for k, v in LLAMA_CFG.items() if k not in ("rope_scaling", "rope_theta")}
    cfg.update(tie_word_embeddings=True, attention_bias=False, mlp_bias=False, num_key_value_heads=4,
               rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 300.0})
    w = llama_weights(cfg, 4)
    assert "lm_head.weight" not in w
    model = from_pretrained(write_folder(tmp_path, cfg, w))
    _close(model(PROMPT).numpy()[0], ref_llama(w, cfg, PROMPT))


# ---- generate ----------------------------------------------------------------------------------------
PROMPTS = [[5, 9, 14, 3, 60, 22, 8], [41], [17, 2, 90, 33]]


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_batched_generate_equals_per_sequence_generate_and_the_reference(which, request):
    model = request.getfixturevalue(f"{which}_model")
    _, w = request.getfixturevalue(f"{which}_folder")
    cfg, ref = (GPT2_CFG, ref_gpt2) if which == "gpt2" else (LLAMA_CFG, ref_llama)
    toks, logits = model.generate(PROMPTS, 6, eos_token_id=[], return_logits=True)
    assert [len(t) for t in toks] == [6, 6, 6] and [lg.shape for lg in logits] == [(6, cfg["vocab_size"])] * 3
    for p, got, lg in zip(PROMPTS, toks, logits):
        one, one_logits = model.generate(p, 6, eos_token_id=[], return_logits=True)
        assert one == got
        _close(one_logits, lg)
        seq = list(p)
        for j, tok in enumerate(got):       # each token is the argmax of the reference logits
            want = ref(w, cfg, seq)[-1]
            _close(lg[j], want)
            assert tok == int(np.argmax(want))
            seq.append(tok)


def test_generate_stops_at_eos_and_keeps_it(gpt2_model):
    free = gpt2_model.generate(PROMPT, 6, eos_token_id=[])
    eos = free[2]
    assert gpt2_model.generate(PROMPT, 6, eos_token_id=eos) == free[:free.index(eos) + 1]
    both = gpt2_model.generate([PROMPT, PROMPTS[0]], 6, eos_token_id=eos)
    assert both[0] == free[:free.index(eos) + 1] and len(both[1]) <= 6


def test_generate_stops_at_a_stop_string(gpt2_model):
    free = gpt2_model.generate(PROMPT, 6, eos_token_id=[])
    stop = f"w{free[2]} w{free[3]}"                          # spans two tokens of the text
    got = gpt2_model.generate(PROMPT, 6, eos_token_id=[], stop=[stop, "never"])
    first = next(n for n in range(1, 7) if stop in gpt2_model.tokenizer.decode(free[:n]))
    assert got == free[:first] and first <= 4
    assert gpt2_model.tokenizer.decode(got).endswith(stop)


def test_empty_prompt_and_zero_new_tokens(gpt2_model, llama_model):
    assert gpt2_model.generate(PROMPT, 0) == []
    toks, logits = gpt2_model.generate([PROMPT, []], 0, return_logits=True)
    assert toks == [[], []] and [lg.shape for lg in logits] == [(0, 97), (0, 97)]
    bos = gpt2_model.generate([96], 3, eos_token_id=[])
    assert gpt2_model.generate([], 3, eos_token_id=[]) == bos           # starts from bos
    assert gpt2_model.generate(np.array([PROMPT, PROMPT]), 2, eos_token_id=[]) == \
        [gpt2_model.generate(PROMPT, 2, eos_token_id=[])] * 2          # arrays work too
    llama_model.bos_token_id = None
    try:
        assert llama_model.generate([[], [4, 5]], 2, eos_token_id=[])[0] == []
    finally:
        llama_model.bos_token_id = 1


def test_eos_from_generation_config(tmp_path, llama_folder, llama_model):
    path, w = llama_folder
    free = llama_model.generate(PROMPT, 5, eos_token_id=[])
    write_folder(tmp_path, LLAMA_CFG, w)
    with open(tmp_path / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": [free[1], 100]}, f)
    model = from_pretrained(tmp_path)
    assert model.eos_token_id == [free[1], 100]
    assert model.generate(PROMPT, 5) == free[:free.index(free[1]) + 1]


def test_seeded_sampling_repeats_and_stays_in_the_vocabulary(llama_model):
    a = llama_model.generate(PROMPTS, 5, Sampler(temperature=0.9, top_k=20, seed=3), eos_token_id=[])
    b = llama_model.generate(PROMPTS, 5, Sampler(temperature=0.9, top_k=20, seed=3), eos_token_id=[])
    assert a == b and all(0 <= t < 101 for seq in a for t in seq)


def test_long_prompts_and_bad_ids_raise_typed_errors(gpt2_model):
    with pytest.raises(PromptTooLong, match=r"41.*max_position_embeddings 40"):
        gpt2_model.generate([1] * 41, 2)
    with pytest.raises(ValueError, match=r"41.*40"):
        gpt2_model([1] * 41)
    with pytest.raises(lc.ShapeMismatch, match="one length"):
        gpt2_model([[1, 2], [3]])
    with pytest.raises(lc.IndexOutOfBounds, match="97"):
        gpt2_model.generate([1, 97], 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        gpt2_model.generate([1], -1)
    with pytest.warns(UserWarning, match="generating 2"):
        assert len(gpt2_model.generate([1] * 38, 5, eos_token_id=[])) == 2


def test_decode_compiles_nothing_after_warmup(gpt2_model):
    from lazycandle.models.causal_lm import run
    gen = run(gpt2_model, PROMPTS, 10, eos_token_id=[], warmup=3)
    assert [len(t) for t in gen.tokens] == [10, 10, 10] and gen.kernels_after_warmup == 0
    programs = set(gpt2_model._programs)
    for batch in (PROMPTS[:2], PROMPTS[1:2], PROMPTS * 2):      # other batch sizes bind the same program
        assert run(gpt2_model, batch, 5, eos_token_id=[], warmup=1).kernels_after_warmup == 0
    assert set(gpt2_model._programs) == programs


# ---- dtypes ----------------------------------------------------------------------------------------
def test_bf16_folder_stays_bf16_with_a_bf16_cache_and_f32_logits(tmp_path, llama_folder):
    _, w = llama_folder
    model = from_pretrained(write_folder(tmp_path, LLAMA_CFG, w, dtype=ml_dtypes.bfloat16))
    assert model.embed_tokens.weight.dtype is lc.bf16 and model.layers[0].q_proj.weight.dtype is lc.bf16
    assert model.new_cache(1, 8).dtype is lc.bf16 and model.new_cache(1, 8, lc.f32).dtype is lc.f32
    w16 = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in w.items()}
    logits = model(PROMPT)
    assert logits.dtype is lc.f32
    _close(logits.numpy()[0], ref_llama(w16, LLAMA_CFG, PROMPT), rtol=3e-2, atol=3e-2)
    toks, lg = model.generate(PROMPTS[:2], 3, eos_token_id=[], return_logits=True)
    assert lg[0].dtype == np.float32 and len(toks[1]) == 3
    one, want = model.generate(PROMPT, 2, eos_token_id=[], return_logits=True)
    session = Session(model, 1, 16)
    session.cache = model.new_cache(1, 16, lc.f32)                  # an f32 cache under bf16 weights
    _close(session.prefill([PROMPT]), want[:1])
    _close(session.decode([one[0]]), want[1:], rtol=3e-2, atol=3e-2)
    f32 = from_pretrained(tmp_path, dtype=lc.f32)
    assert f32.embed_tokens.weight.dtype is lc.f32


# ---- strictness ----------------------------------------------------------------------------------
def test_unused_tensor_and_unsupported_config_values_are_errors_when_strict(tmp_path, llama_folder):
    _, w = llama_folder
    write_folder(tmp_path / "extra", LLAMA_CFG, {**w, "model.layers.0.self_attn.extra.weight": np.zeros(3, np.float32)})
    with pytest.raises(lc.SerializationError, match=r"self_attn\.extra\.weight"):
        from_pretrained(tmp_path / "extra")
    with pytest.warns(UserWarning, match=r"self_attn\.extra\.weight"):
        from_pretrained(tmp_path / "extra", strict=False)
    yarn = dict(LLAMA_CFG, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    write_folder(tmp_path / "yarn", yarn, w)
    with pytest.raises(lc.SerializationError, match=r"rope_scaling.*yarn"):
        from_pretrained(tmp_path / "yarn")
    act = dict(GPT2_CFG, activation_function="mish")
    write_folder(tmp_path / "act", act, gpt2_weights(GPT2_CFG, 1))
    with pytest.raises(lc.SerializationError, match="activation_function"):
        from_pretrained(tmp_path / "act")
    nob = dict(LLAMA_CFG, attention_bias=False)                     # the file has biases the config denies
    write_folder(tmp_path / "nob", nob, w)
    with pytest.raises(lc.SerializationError, match=r"self_attn\.[qkvo]_proj\.bias"):
        from_pretrained(tmp_path / "nob")


def test_missing_and_misshaped_tensors_name_the_tensor(tmp_path):
    w = gpt2_weights(GPT2_CFG, 1)
    broken = {k: v for k, v in w.items() if k != "h.1.mlp.c_fc.bias"}
    write_folder(tmp_path / "missing", GPT2_CFG, broken)
    with pytest.raises(lc.SerializationError, match=r"h\.1\.mlp\.c_fc\.bias.*missing"):
        from_pretrained(tmp_path / "missing")
    w["h.0.attn.c_attn.weight"] = w["h.0.attn.c_attn.weight"].T.copy()    # (out, in): not Conv1D's layout
    write_folder(tmp_path / "shape", GPT2_CFG, w)
    with pytest.raises(lc.SerializationError, match=r"c_attn\.weight.*\(96, 32\)"):
        from_pretrained(tmp_path / "shape")


# ---- command line ------------------------------------------------------------------------------------
def test_generate_command_streams_text_and_reports_timings(gpt2_folder, capsys):
    from lazycandle.cli import main
    assert main(["generate", gpt2_folder[0], "--prompt", "w5 w9 w14", "--max-new-tokens", "4"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("w5 w9 w14") and len(out.split()) >= 4
    assert "compiling" in err and "prefill:" in err and "ms/token" in err
    assert main(["generate", gpt2_folder[0] + "-absent", "--prompt", "x"]) == 2


# ---- transformers itself, when installed --------------------------------------------------------------
@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_matches_transformers(which, request):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path, _ = request.getfixturevalue(f"{which}_folder")
    model = request.getfixturevalue(f"{which}_model")
    cls = transformers.GPT2LMHeadModel if which == "gpt2" else transformers.LlamaForCausalLM
    hf = cls.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        want = hf(torch.tensor([PROMPT])).logits[0].numpy()
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=6, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    got = model(PROMPT).numpy()[0]
    assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()
    assert model.generate(PROMPT, 6, eos_token_id=[]) == out[0, len(PROMPT):].tolist()
