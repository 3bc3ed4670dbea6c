"""Quantized models: from_pretrained(quantize=...) against the f32 model, and llama GGUF files
written by the `gguf` package (with llama.cpp's converter's q/k row permutation) run by
from_gguf against the same weights dequantized and loaded from a Hugging Face folder."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

import lazycandle as lc
from lazycandle.models import from_gguf, from_pretrained

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType

CFG = {"model_type": "llama", "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "intermediate_size": 256, "vocab_size": 1024, "max_position_embeddings": 64,
       "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 1,
       "eos_token_id": None}
PROMPT = [5, 17, 42, 99, 3, 250, 7, 640, 12, 1000]


def hf_weights(seed=0) -> dict:
    """Random HF-named Llama weights: linears N(0, 0.02), embedding N(0, 1), norms 1 + N(0, 0.1)."""
    rng = np.random.default_rng(seed)
    c = CFG
    d, hd, f = c["hidden_size"], c["hidden_size"] // c["num_attention_heads"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * hd

    def lin(o, i):
        return (rng.standard_normal((o, i)) * 0.02).astype(np.float32)

    def norm():
        return (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    w = {"model.embed_tokens.weight": rng.standard_normal((c["vocab_size"], d)).astype(np.float32),
         "model.norm.weight": norm()}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
                  p + "self_attn.q_proj.weight": lin(d, d), p + "self_attn.k_proj.weight": lin(kv, d),
                  p + "self_attn.v_proj.weight": lin(kv, d), p + "self_attn.o_proj.weight": lin(d, d),
                  p + "mlp.gate_proj.weight": lin(f, d), p + "mlp.up_proj.weight": lin(f, d),
                  p + "mlp.down_proj.weight": lin(d, f)})
    return w


def write_folder(path, weights, cfg=CFG):
    os.makedirs(path, exist_ok=True)
    save_file(weights, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


def converter_permute(w, heads):
    """llama.cpp convert_hf_to_gguf's LlamaModel.permute (rows of q / k for GGML's rope)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# GGUF name and type of each HF tensor (a mix of q8_0, q4_0 and f32, as a llama.cpp file has)
def gguf_layout(n_layers):
    names = {"model.embed_tokens.weight": ("token_embd.weight", Q.Q4_0),
             "model.norm.weight": ("output_norm.weight", Q.F32)}
    for i in range(n_layers):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        names.update({p + "input_layernorm.weight": (g + "attn_norm.weight", Q.F32),
                      p + "post_attention_layernorm.weight": (g + "ffn_norm.weight", Q.F32),
                      p + "self_attn.q_proj.weight": (g + "attn_q.weight", Q.Q8_0 if i == 0 else Q.F32),
                      p + "self_attn.k_proj.weight": (g + "attn_k.weight", Q.Q8_0 if i == 0 else Q.F32),
                      p + "self_attn.v_proj.weight": (g + "attn_v.weight", Q.Q8_0 if i == 0 else Q.F16),
                      p + "self_attn.o_proj.weight": (g + "attn_output.weight", Q.Q8_0),
                      p + "mlp.gate_proj.weight": (g + "ffn_gate.weight", Q.Q4_0),
                      p + "mlp.up_proj.weight": (g + "ffn_up.weight", Q.Q4_0),
                      p + "mlp.down_proj.weight": (g + "ffn_down.weight", Q.Q8_0)})
    return names


def write_gguf(path, weights, arch="llama", tokenizer=None, skip=()):
    """`weights` (HF names) as a llama.cpp-style GGUF file; returns the HF weights the file's
    values equal (quantized tensors dequantized by the gguf package)."""
    c = CFG
    heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(c["rope_theta"])
    w.add_rope_dimension_count(c["hidden_size"] // heads)
    if tokenizer is not None:
        tokenizer(w)
    exact = {}
    for hf, (name, qtype) in gguf_layout(c["num_hidden_layers"]).items():
        if name in skip:
            continue
        t = weights[hf]
        if name.endswith("attn_q.weight"):
            t = converter_permute(t, heads)
        elif name.endswith("attn_k.weight"):
            t = converter_permute(t, kv_heads)
        if qtype in (Q.F32, Q.F16):
            dt = np.float32 if qtype == Q.F32 else np.float16
            w.add_tensor(name, t.astype(dt))
            exact[hf] = weights[hf].astype(dt).astype(np.float32)
        else:
            w.add_tensor(name, gguf.quants.quantize(t, qtype), raw_dtype=qtype)
            exact[hf] = gguf.quants.dequantize(gguf.quants.quantize(weights[hf], qtype), qtype).astype(np.float32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return exact


def rel_err(got, want) -> float:
    """max over positions of max |got - want| / max |want| (the logits' relative error)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want).max(-1) / np.abs(want).max(-1)))


@pytest.fixture(scope="module")
def weights():
    return hf_weights()


@pytest.fixture(scope="module")
def f32_folder(tmp_path_factory, weights):
    return write_folder(str(tmp_path_factory.mktemp("f32")), weights)


@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory, weights):
    """(GGUF file, HF folder of the same values in f32)."""
    d = tmp_path_factory.mktemp("gguf")
    exact = write_gguf(str(d / "m.gguf"), weights)
    return str(d / "m.gguf"), write_folder(str(d / "hf"), exact)


@pytest.mark.parametrize("kind,tol", [("q8_0", 0.01), ("q4_0", 0.05)])
def test_from_pretrained_quantized_logits_close_to_f32(f32_folder, kind, tol):
    ref = from_pretrained(f32_folder)([PROMPT]).numpy()[0]
    model = from_pretrained(f32_folder, quantize=kind)
    q = [m for m in (model.layers[0].q_proj, model.layers[1].down_proj, model.lm_head)]
    assert all(isinstance(m, lc.nn.QLinear) and m.qweight.kind == kind for m in q)
    assert isinstance(model.embed_tokens, lc.nn.Embedding) and model.norm.weight.dtype is lc.f32
    got = model([PROMPT]).numpy()[0]
    err = rel_err(got, ref)
    assert err < tol, (kind, err)
    assert err > 0          # the weights really are quantized


def test_from_pretrained_quantized_batched_decode_matches_full_forward(f32_folder):
    model = from_pretrained(f32_folder, quantize="q8_0")
    prompts = [PROMPT[:4], PROMPT[:7]]
    toks, logits = model.generate(prompts, 5, return_logits=True)
    for p, t, lg in zip(prompts, toks, logits):
        full = model([p + t[:-1]]).numpy()[0][len(p) - 1:]
        np.testing.assert_allclose(lg, full, rtol=1e-3, atol=1e-3)
        assert t == model.generate(p, 5)


def test_unknown_quantize_kind_is_an_error(f32_folder):
    with pytest.raises(ValueError, match="q3_z"):
        from_pretrained(f32_folder, quantize="q3_z")


def test_gguf_generates_the_dequantized_models_tokens(gguf_pair):
    path, folder = gguf_pair
    ref = from_pretrained(folder)
    model = from_gguf(path)
    assert isinstance(model.layers[0].q_proj, lc.nn.QLinear) and model.layers[0].q_proj.qweight.kind == "q8_0"
    assert isinstance(model.layers[1].q_proj, lc.nn.Linear)         # f32 in the file: a float Linear
    assert model.layers[1].v_proj.weight.dtype is lc.f32             # f16 in the file, computed in f32
    assert isinstance(model.lm_head, lc.nn.QLinear) and model.lm_head.qweight.kind == "q4_0"  # tied, quantized
    want = ref([PROMPT]).numpy()[0]
    assert rel_err(model([PROMPT]).numpy()[0], want) < 2e-2          # int8 activations
    from lazycandle.qtensor import get_qmatmul_path, set_qmatmul_path
    old = get_qmatmul_path()
    set_qmatmul_path("f32")         # exact f32 products: the same model up to rounding
    try:
        model = from_gguf(path)
        assert rel_err(model([PROMPT]).numpy()[0], want) < 1e-4
        assert model.generate([PROMPT, PROMPT[:3]], 12) == ref.generate([PROMPT, PROMPT[:3]], 12)
    finally:
        set_qmatmul_path(old)


def test_truncated_gguf_and_unknown_architecture_are_serialization_errors(gguf_pair, tmp_path, weights):
    path, _ = gguf_pair
    data = open(path, "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])
    with pytest.raises(lc.SerializationError, match="truncated"):
        from_gguf(str(cut))
    other = tmp_path / "other.gguf"
    w = gguf.GGUFWriter(str(other), "mamba")
    w.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(lc.SerializationError, match="mamba"):
        from_gguf(str(other))


def test_gguf_tensor_the_model_does_not_use_is_named(tmp_path, weights):
    path = str(tmp_path / "m.gguf")

    def extra(w):
        w.add_tensor("rope_freqs.weight", np.ones(8, np.float32))
    write_gguf(path, weights, tokenizer=extra)
    with pytest.raises(lc.SerializationError, match="rope_freqs.weight"):
        from_gguf(path)
    with pytest.warns(UserWarning, match="rope_freqs.weight"):
        from_gguf(path, strict=False)


def _write_with_tokenizer(path, weights, add):
    write_gguf(path, weights, tokenizer=add)
    return from_gguf(path).tokenizer


TEXT = "the quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs 42 times!"


def test_gguf_gpt2_tokenizer_encodes_like_the_byte_level_bpe_it_came_from(tmp_path, weights):
    tokenizers = pytest.importorskip("tokenizers")
    trained = tokenizers.ByteLevelBPETokenizer()
    trained.train_from_iterator([TEXT] * 20, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    model = json.loads(trained._tokenizer.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    eot = model["vocab"]["<|endoftext|>"]

    def add(w):
        w.add_tokenizer_model("gpt2")
        w.add_token_list([t for t, _ in vocab])
        w.add_token_merges(merges)
        w.add_token_types([3 if i == eot else 1 for _, i in vocab])
        w.add_bos_token_id(eot)
        w.add_eos_token_id(eot)
        w.add_add_bos_token(False)
    tok = _write_with_tokenizer(str(tmp_path / "t.gguf"), weights, add)
    for text in (TEXT, "a lazy fox, 123 dogs\n  jump!", "ünïcode"):
        assert tok.encode(text) == trained.encode(text).ids
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode([eot]) == "" and tok.decode([eot], skip_special_tokens=False) == "<|endoftext|>"


def test_gguf_llama_tokenizer_merges_by_score_with_byte_fallback(tmp_path, weights):
    pytest.importorskip("tokenizers")
    pieces = {"▁": -1.0, "h": -2.0, "e": -2.0, "l": -2.0, "o": -2.0, "w": -2.0, "r": -2.0, "d": -2.0,
              "he": -3.0, "ll": -3.5, "llo": -4.0, "hello": -5.0, "▁hello": -6.0, "▁w": -7.0, "or": -7.5,
              "▁wor": -8.0, "▁world": -20.0, "ld": -9.0}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(pieces)
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0] * 259 + list(pieces.values())

    def add(w):
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    tok = _write_with_tokenizer(str(tmp_path / "t.gguf"), weights, add)
    ids = {t: i for i, t in enumerate(tokens)}

    def no_prefix(w):
        add(w)
        w.add_add_space_prefix(False)
        w.add_add_bos_token(False)
    bare = _write_with_tokenizer(str(tmp_path / "bare.gguf"), weights, no_prefix)
    assert bare.encode("hello world") == [ids["hello"], ids["▁world"]]
    assert bare.decode(bare.encode(" hello")) == " hello"
    # llama.cpp's order: ▁w, or, ▁wor, ld, then ▁wor + ld (a low score, but the only pair left)
    assert tok.encode("hello world") == [1, ids["▁hello"], ids["▁world"]]
    assert tok.encode("low") == [1, ids["▁"], ids["l"], ids["o"], ids["w"]]
    assert tok.encode("hé") == [1, ids["▁"], ids["h"], 3 + 0xC3, 3 + 0xA9]
    assert tok.decode(tok.encode("hello héllo world")) == "hello héllo world"


@pytest.mark.parametrize("kind", ["q4_0", "q6_k"])
def test_qlinear_over_a_named_batch_binds_any_row_count(kind):
    """One compiled program over a named batch dim (as batch-generic decode programs are) runs
    batches of 1 (m = 1's tile) and of 5 rows."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((40, 256)) * 0.02).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    layer = lc.nn.QLinear(lc.quantize(lc.tensor(w), kind), lc.tensor(b))
    prog = lc.compile([layer(lc.placeholder("x", ("b", 1, 256), lc.f32))])
    deq = layer.qweight.dequantize().numpy()
    for n in (1, 5, 1):
        x = rng.standard_normal((n, 1, 256)).astype(np.float32)
        (got,) = prog.run(x=x)
        want = x @ deq.T + b
        assert got.shape == (n, 1, 40)
        assert np.abs(np.asarray(got) - want).max() / np.abs(want).max() < 2e-2


def _count(module, cls) -> int:
    n = 0
    for v in vars(module).values():
        for m in v if isinstance(v, (list, tuple)) else [v]:
            n += isinstance(m, cls) + (_count(m, cls) if isinstance(m, lc.nn.Module) else 0)
    return n


def test_from_pretrained_quantizes_gpt2_linears_too(tmp_path):
    from lazycandle.models import gpt2
    from lazycandle.models.textgen import random_model, save_folder
    cfg = dict(gpt2.PRESETS["tiny"])
    ref, vm = random_model(gpt2, cfg)
    folder = save_folder(vm, cfg, tmp_path / "gpt2")
    model = from_pretrained(folder, quantize="q8_0")
    assert _count(model, lc.nn.QLinear) == 9 and _count(model, lc.nn.Linear) == 0   # 4 per layer, the head
    ids = [[1, 5, 9, 22, 7]]
    assert 0 < rel_err(model(ids).numpy()[0], ref(ids).numpy()[0]) < 2e-2


def test_generate_cli_runs_a_gguf_file_and_a_quantized_folder(gguf_pair, f32_folder, capsys):
    from lazycandle.cli import main
    path, _ = gguf_pair
    assert main(["generate", path, "--prompt", "hi", "--max-new-tokens", "3"]) == 0
    assert "new tokens: [" in capsys.readouterr().err
    assert main(["generate", f32_folder, "--quantize", "q4_0", "--prompt", "hi", "--max-new-tokens", "3"]) == 0
    assert "new tokens: [" in capsys.readouterr().err


def test_gguf_missing_tensor_is_named(tmp_path, weights):
    path = str(tmp_path / "m.gguf")
    write_gguf(path, weights, skip=("blk.1.ffn_up.weight",))
    with pytest.raises(lc.SerializationError, match=r"layers\.1\.mlp\.up_proj"):
        from_gguf(path)
