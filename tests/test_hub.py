"""from_pretrained on folders the tests write (a tiny random BERT in Hugging Face's layout, a
tiny WordPiece tokenizer): shards, dtype, and every bad input naming its file and tensor/field."""
import json
import os
import warnings

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.models.hub import from_pretrained
from lazycandle.models.tokenizer import Tokenizer

pytest.importorskip("tokenizers")
from tokenizers import Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers, processors  # noqa: E402

CFG = {"model_type": "bert", "vocab_size": 16, "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
       "intermediate_size": 12, "hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": 10,
       "type_vocab_size": 2}
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "a", "dog", "##s", "ran", ".", "!", "hi"]


def bert_tensors(cfg=CFG, seed=0):
    rng = np.random.default_rng(seed)
    h, i = cfg["hidden_size"], cfg["intermediate_size"]

    def r(*s):
        return (rng.standard_normal(s) * 0.3).astype(np.float32)
    t = {"embeddings.word_embeddings.weight": r(cfg["vocab_size"], h),
         "embeddings.position_embeddings.weight": r(cfg["max_position_embeddings"], h),
         "embeddings.token_type_embeddings.weight": r(cfg["type_vocab_size"], h),
         "embeddings.LayerNorm.weight": 1 + r(h), "embeddings.LayerNorm.bias": r(h),
         "embeddings.position_ids": np.arange(cfg["max_position_embeddings"])[None]}
    for n in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{n}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            t[p + name + ".weight"], t[p + name + ".bias"] = r(h, h), r(h)
        t[p + "intermediate.dense.weight"], t[p + "intermediate.dense.bias"] = r(i, h), r(i)
        t[p + "output.dense.weight"], t[p + "output.dense.bias"] = r(h, i), r(h)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + ln + ".weight"], t[p + ln + ".bias"] = 1 + r(h), r(h)
    return t


def write_tokenizer(path):
    tk = HFTokenizer(models.WordPiece({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                      special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tk.decoder = decoders.WordPiece()
    tk.add_special_tokens(VOCAB[:4])
    tk.enable_padding(pad_id=0, pad_token="[PAD]", length=32)      # like all-MiniLM's file: plain encode ignores it
    tk.save(str(path))


def make_folder(tmp_path, tensors=None, cfg=CFG, shards=None, tokenizer=True):
    tmp_path.mkdir(parents=True, exist_ok=True)
    tensors = bert_tensors(cfg) if tensors is None else tensors
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if shards:
        names = sorted(tensors)
        parts = [names[k::shards] for k in range(shards)]
        wmap = {}
        for k, part in enumerate(parts):
            f = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            lc.save_safetensors({n: lc.tensor(tensors[n]) for n in part}, tmp_path / f)
            wmap.update({n: f for n in part})
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wmap}))
    else:
        lc.save_safetensors({n: lc.tensor(v) for n, v in tensors.items()}, tmp_path / "model.safetensors")
    if tokenizer:
        write_tokenizer(tmp_path / "tokenizer.json")
    return tmp_path


# ---- tokenizer ------------------------------------------------------------------------------
def test_tokenizer(tmp_path):
    write_tokenizer(tmp_path / "tokenizer.json")
    for src in (tmp_path, tmp_path / "tokenizer.json"):
        tok = Tokenizer.from_file(src)
        assert tok.encode("The cat sat!") == [2, 4, 5, 6, 14, 3]            # no padding to 32
        assert tok.encode("dogs", add_special_tokens=False) == [10, 11]
        assert tok.encode("") == [2, 3]
        assert tok.encode_batch(["hi", "a mat"]) == [[2, 15, 3], [2, 9, 8, 3]]
        assert tok.decode([2, 4, 5, 3]) == "the cat"
        assert tok.decode([2, 10, 11, 3], skip_special_tokens=False) == "[CLS] dogs [SEP]"
        assert tok.pad_token_id == 0 and tok.vocab_size == len(VOCAB)
    b = tok.batch(["hi", "the cat sat on a mat"], max_length=5)
    np.testing.assert_array_equal(b.input_ids, [[2, 15, 3, 0, 0], [2, 4, 5, 6, 3]])
    np.testing.assert_array_equal(b.attention_mask, [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert b.token_type_ids.shape == (2, 5) and not b.token_type_ids.any()
    assert tok.encode("the cat sat on a mat") == [2, 4, 5, 6, 7, 9, 8, 3]   # the batch's settings are gone
    with pytest.raises(TypeError):
        tok.encode(3)


def test_tokenizer_errors(tmp_path):
    with pytest.raises(lc.SerializationError, match="tokenizer.json"):
        Tokenizer.from_file(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(lc.SerializationError, match="tokenizer.json"):
        Tokenizer.from_file(tmp_path)


# ---- from_pretrained --------------------------------------------------------------------------
def test_loads_single_file_and_shards_alike(tmp_path):
    a = from_pretrained(make_folder(tmp_path / "one"))
    b = from_pretrained(make_folder(tmp_path / "sharded", shards=3))
    assert isinstance(a.tokenizer, Tokenizer)
    ids = [[2, 4, 5, 3]]
    np.testing.assert_array_equal(a(ids).numpy(), b(ids).numpy())
    assert a.hf_config["model_type"] == "bert"
    c = from_pretrained(make_folder(tmp_path / "bf16"), dtype=lc.bf16)
    assert c.layers[0].query.weight.dtype is lc.bf16 and c(ids).dtype is lc.bf16
    d = from_pretrained(make_folder(tmp_path / "notok", tokenizer=False))
    assert d.tokenizer is None


def test_missing_config_and_unknown_model_type(tmp_path):
    with pytest.raises(lc.SerializationError, match="config.json"):
        from_pretrained(tmp_path)
    make_folder(tmp_path, cfg=dict(CFG, model_type="t5"))
    with pytest.raises(lc.SerializationError, match="model_type.*t5"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(lc.SerializationError, match="config.json"):
        from_pretrained(tmp_path)


def test_missing_weights_and_missing_shard(tmp_path):
    make_folder(tmp_path)
    os.remove(tmp_path / "model.safetensors")
    with pytest.raises(lc.SerializationError, match="model.safetensors"):
        from_pretrained(tmp_path)
    f = make_folder(tmp_path / "s", shards=2)
    os.remove(f / "model-00002-of-00002.safetensors")
    with pytest.raises(lc.SerializationError, match="model-00002-of-00002.safetensors"):
        from_pretrained(f)


def test_missing_field_and_missing_or_misshaped_tensor(tmp_path):
    cfg = dict(CFG)
    del cfg["hidden_size"]
    make_folder(tmp_path / "a", cfg=cfg, tensors=bert_tensors())
    with pytest.raises(lc.SerializationError, match="hidden_size.*missing"):
        from_pretrained(tmp_path / "a")
    t = bert_tensors()
    del t["encoder.layer.1.output.dense.bias"]
    make_folder(tmp_path / "b", tensors=t)
    with pytest.raises(lc.SerializationError, match=r"model.safetensors.*encoder\.layer\.1\.output\.dense\.bias.*missing"):
        from_pretrained(tmp_path / "b")
    t = bert_tensors()
    t["encoder.layer.0.intermediate.dense.weight"] = t["encoder.layer.0.intermediate.dense.weight"].T.copy()
    make_folder(tmp_path / "c", tensors=t)
    with pytest.raises(lc.SerializationError, match=r"model.safetensors.*intermediate\.dense\.weight.*\(8, 12\)"):
        from_pretrained(tmp_path / "c")


def test_unused_tensor_strict_and_not(tmp_path):
    t = bert_tensors()
    t["cls.predictions.bias"] = np.zeros(16, np.float32)
    make_folder(tmp_path, tensors=t)
    with pytest.raises(lc.SerializationError, match=r"model.safetensors.*cls\.predictions\.bias"):
        from_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"cls\.predictions\.bias"):
        m = from_pretrained(tmp_path, strict=False)
    assert m([[2, 3]]).shape == (1, 2, 8)


def test_unsupported_config_value_strict_and_not(tmp_path):
    make_folder(tmp_path, cfg=dict(CFG, position_embedding_type="relative_key"))
    with pytest.raises(lc.SerializationError, match=r"config.json.*position_embedding_type.*relative_key"):
        from_pretrained(tmp_path)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        from_pretrained(tmp_path, strict=False)
    assert any("position_embedding_type" in str(x.message) for x in w)
    make_folder(tmp_path / "act", cfg=dict(CFG, hidden_act="swish_beta"))
    with pytest.raises(lc.SerializationError, match="hidden_act"):
        from_pretrained(tmp_path / "act")


def test_sequence_longer_than_positions(tmp_path):
    m = from_pretrained(make_folder(tmp_path))
    with pytest.raises(lc.IndexOutOfBounds, match=r"11.*max_position_embeddings 10"):
        m([[4] * 11])
    assert m([[4] * 10]).shape == (1, 10, 8)
