"""`lc.models.from_gguf(path)`: a llama-architecture GGUF file (llama.cpp's format) run as the
Hugging Face Llama of models/llama.py.

The config comes from the metadata keys llama.cpp writes (`llama.embedding_length`,
`llama.block_count`, `llama.attention.head_count[_kv]`, ...), the tensors are renamed to the HF
names (`blk.N.attn_q` -> `model.layers.N.self_attn.q_proj`, ...), and the rows of attn_q /
attn_k are put back in HF order: llama.cpp's converter interleaves each head's two rotary
halves for GGML's rope (`w.reshape(heads, 2, hd/2, in).swapaxes(1, 2)`), and lc's rope is
transformers' rotate-half.  Quantized linear weights stay in blocks (lc.nn.QLinear, run by
lc.qmatmul); a quantized token embedding is dequantized for the lookup, and when the file has
no `output` head the (still quantized) token embedding is the head, as in llama.cpp."""
from __future__ import annotations

import os

import numpy as np

from ..dtype import as_dtype, f32
from ..errors import SerializationError
from ..gguf import load_gguf
from ..nn_layers import VarBuilder, quantize_linears
from ..qtensor import QTensor
from ..tensor import tensor
from .hub import HFConfig, report
from .llama import Llama, read_config

ARCHITECTURES = ("llama",)
_LAYER_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}


class _Tensors:
    """GGUF tensors under their HF names, as a VarBuilder source (the interface of
    nn_layers._Files: where / used / describe, and per file shape / tensor / path)."""

    def __init__(self, path, named: dict):
        self.path, self.named, self.used = path, named, set()
        self.where = {n: self for n in named}

    def describe(self) -> str:
        return f"{self.path} (its tensors under their Hugging Face names)"

    def shape(self, name) -> tuple:
        return tuple(self.named[name].shape)

    def tensor(self, name):
        return self.named[name]


def from_gguf(path, strict: bool = True, dtype=None):
    """The Llama of GGUF file `path` with `model.tokenizer` from its `tokenizer.ggml.*` keys
    (None when absent).  Float tensors (f16 / bf16 / f32 in the file) are converted to `dtype`
    (default f32, where llama.cpp computes); quantized ones stay in blocks.  A file of another
    architecture, a missing or mis-shaped tensor, or (strict) a tensor the model does not use:
    lc.SerializationError naming it."""
    path = os.fspath(path)
    tensors, meta = load_gguf(path)
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise SerializationError(f"from_gguf: {path}: general.architecture {arch!r} is not supported "
                                 f"(known: {', '.join(ARCHITECTURES)})")
    cfg = HFConfig(hf_config(meta, tensors, path), path, strict)
    c = read_config(cfg)
    want = f32 if dtype is None else as_dtype(dtype)
    src = _Tensors(path, {n: _float_as(t, want) for n, t in hf_tensors(tensors, c, path).items()})
    model = Llama(c, VarBuilder(src))
    for name in sorted(set(src.where) - src.used):
        report(strict, f"from_gguf: {path}: tensor {name!r}: in the file but not used by the llama model")
    quantize_linears(model)
    model.bos_token_id, model.eos_token_id = cfg.data["bos_token_id"], cfg.data["eos_token_id"]
    from .gguf_tokenizer import tokenizer_from_gguf
    model.tokenizer = tokenizer_from_gguf(meta, path)
    model.hf_config, model.gguf_metadata = cfg.data, meta
    return model


def _float_as(t, dtype):
    """A float Tensor converted to `dtype`; QTensors and integer tensors as they are."""
    if isinstance(t, QTensor) or not t.dtype.is_float or t.dtype is dtype:
        return t
    return t.to_dtype(dtype).realize()


def _key(meta, key, path, default=None):
    v = meta.get(key, default)
    if v is None:
        raise SerializationError(f"from_gguf: {path}: metadata key {key!r} is missing")
    return v.item() if isinstance(v, np.generic) else v


def _opt_int(v):
    return None if v is None else int(v)


def hf_config(meta, tensors, path) -> dict:
    """config.json fields of the llama.* metadata (llama.cpp's keys, its defaults)."""
    heads = int(_key(meta, "llama.attention.head_count", path))
    dim = int(_key(meta, "llama.embedding_length", path))
    head_dim = int(_key(meta, "llama.attention.key_length", path, dim // heads))
    emb = tensors.get("token_embd.weight")
    if emb is None:
        raise SerializationError(f"from_gguf: {path}: tensor 'token_embd.weight' is missing")
    cfg = {"model_type": "llama", "hidden_size": dim, "num_hidden_layers": int(_key(meta, "llama.block_count", path)),
           "num_attention_heads": heads,
           "num_key_value_heads": int(_key(meta, "llama.attention.head_count_kv", path, heads)),
           "intermediate_size": int(_key(meta, "llama.feed_forward_length", path)),
           "rms_norm_eps": float(_key(meta, "llama.attention.layer_norm_rms_epsilon", path, 1e-5)),
           "rope_theta": float(_key(meta, "llama.rope.freq_base", path, 10000.0)),
           "max_position_embeddings": int(_key(meta, "llama.context_length", path, 2048)),
           "vocab_size": int(_key(meta, "llama.vocab_size", path, emb.shape[0])),
           "head_dim": head_dim, "tie_word_embeddings": False,
           "attention_bias": "blk.0.attn_q.bias" in tensors,
           "bos_token_id": _opt_int(meta.get("tokenizer.ggml.bos_token_id")),
           "eos_token_id": _opt_int(meta.get("tokenizer.ggml.eos_token_id"))}
    rot = int(_key(meta, "llama.rope.dimension_count", path, head_dim))
    if rot != head_dim:
        cfg["partial_rotary_factor"] = rot / head_dim
    kind = _key(meta, "llama.rope.scaling.type", path, "none")
    if kind not in ("none", ""):
        cfg["rope_scaling"] = {"type": kind, "factor": float(_key(meta, "llama.rope.scaling.factor", path, 1.0))}
    return cfg


def hf_tensors(tensors, c, path) -> dict:
    """{HF name: tensor} of the GGUF tensors: attn_q / attn_k rows back in HF order, the token
    embedding dequantized for the lookup (and, when `output` is absent, the head)."""
    out = {}
    for name, t in tensors.items():
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) >= 4 and parts[2] in _LAYER_NAMES:
            layer, what, kind = parts[1], parts[2], ".".join(parts[3:])
            if what in ("attn_q", "attn_k"):
                t = _unpermute(t, c.n_head if what == "attn_q" else c.n_kv_head, name, path)
            out[f"model.layers.{layer}.{_LAYER_NAMES[what]}.{kind}"] = t
        elif name == "token_embd.weight":
            out["model.embed_tokens.weight"] = t.dequantize() if isinstance(t, QTensor) else t
            if "output.weight" not in tensors:
                out["lm_head.weight"] = t
        elif name == "output_norm.weight":
            out["model.norm.weight"] = t
        elif name == "output.weight":
            out["lm_head.weight"] = t
        else:
            out[name] = t               # not a llama tensor: reported as unused
    return out


def _unpermute(t, heads: int, name, path):
    """Rows of a GGUF attn_q / attn_k weight (or bias) in HF order: HF row h*hd + s*hd/2 + j is
    GGUF row h*hd + 2j + s."""
    n = t.shape[0]
    if heads <= 0 or n % (2 * heads):
        raise SerializationError(f"from_gguf: {path}: tensor {name!r}: {n} rows are not {heads} heads of an "
                                 f"even size")
    half = n // heads // 2
    ids = np.arange(n, dtype=np.int64).reshape(heads, half, 2).transpose(0, 2, 1).reshape(-1)
    if isinstance(t, QTensor):
        return t.take_rows(ids)
    return t.index_select(tensor(ids), 0).realize()
