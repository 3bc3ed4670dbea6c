"""BERT encoders (Hugging Face's BertModel names and layout) and sentence embeddings with the
folder's sentence-transformers pooling, e.g. all-MiniLM-L6-v2:

    model = lc.models.from_pretrained("all-MiniLM-L6-v2")
    vectors = model.embed(["A sentence.", "Another one."])     # (2, 384) f32, unit length

Post-norm blocks: x = LN(x + attn(x)); x = LN(x + W2 act(W1 x)).  Attention ignores padded keys
(the attention mask), so a padded sequence gives the hidden states of the unpadded one."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from .. import nn
from ..dtype import f32, i64, u8, u32
from ..errors import ShapeMismatch, UnsupportedDTypeForOp
from ..nn_layers import Embedding, LayerNorm, Linear, Module
from ..graph_api import jit
from ..tensor import Tensor, arange, tensor
from ..tensor_index import cat
from .hub import HFConfig, check_length, report

ACTIVATIONS = {"gelu": lambda x: nn.gelu(x), "gelu_new": lambda x: nn.gelu(x, "tanh"),
               "gelu_pytorch_tanh": lambda x: nn.gelu(x, "tanh"), "relu": nn.relu, "silu": nn.silu}
POOLING_MODES = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens")   # sentence-transformers' order


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    hidden_act: str = "gelu"
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class BertLayer(Module):
    def __init__(self, cfg: BertConfig, vb):
        h, a = cfg.hidden_size, vb.pp("attention")
        self.cfg, self.act = cfg, ACTIVATIONS[cfg.hidden_act]
        self.query = Linear(h, h, vb=a.pp("self.query"))
        self.key = Linear(h, h, vb=a.pp("self.key"))
        self.value = Linear(h, h, vb=a.pp("self.value"))
        self.attn_out = Linear(h, h, vb=a.pp("output.dense"))
        self.attn_norm = LayerNorm(h, cfg.layer_norm_eps, vb=a.pp("output.LayerNorm"))
        self.intermediate = Linear(h, cfg.intermediate_size, vb=vb.pp("intermediate.dense"))
        self.output = Linear(cfg.intermediate_size, h, vb=vb.pp("output.dense"))
        self.out_norm = LayerNorm(h, cfg.layer_norm_eps, vb=vb.pp("output.LayerNorm"))

    def forward(self, x, mask, b, t):
        """x: the (b * t, hidden) token rows.  2-D throughout, so each Linear is one GEMM whose
        epilogue takes the bias, the activation and the residual."""
        h = x.shape[-1]
        heads = self.cfg.num_attention_heads

        def split(y):
            return y.reshape((b, t, heads, h // heads)).transpose(1, 2)
        a = nn.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)), mask)
        x = self.attn_norm(self.attn_out(a.transpose(1, 2).reshape((b * t, h))) + x)
        return self.out_norm(self.output(self.act(self.intermediate(x))) + x)


class Bert(Module):
    """`model(ids, attention_mask=None, token_type_ids=None)` -> last hidden state (b, t, hidden);
    `model.embed(texts)` -> pooled sentence vectors."""

    def __init__(self, cfg: BertConfig, vb, pooling=("mean_tokens",), max_seq_length=None):
        e, h = vb.pp("embeddings"), cfg.hidden_size
        self.config, self.pooling = cfg, tuple(pooling)
        self.max_seq_length = min(max_seq_length or cfg.max_position_embeddings, cfg.max_position_embeddings)
        self.word_embeddings = Embedding(cfg.vocab_size, h, vb=e.pp("word_embeddings"))
        self.position_embeddings = Embedding(cfg.max_position_embeddings, h, vb=e.pp("position_embeddings"))
        self.token_type_embeddings = Embedding(cfg.type_vocab_size, h, vb=e.pp("token_type_embeddings"))
        self.embed_norm = LayerNorm(h, cfg.layer_norm_eps, vb=e.pp("LayerNorm"))
        self.layers = [BertLayer(cfg, vb.pp(f"encoder.layer.{i}")) for i in range(cfg.num_hidden_layers)]
        self.pooler = Linear(h, h, vb=vb.pp("pooler.dense")) if vb.contains("pooler.dense.weight") else None
        self.tokenizer = None
        self._embed_program = jit(self._embed_graph)

    def forward(self, ids, attention_mask=None, token_type_ids=None) -> Tensor:
        ids = _ids("ids", ids)
        if ids.rank == 1:
            ids = ids.unsqueeze(0)
        b, t = ids.shape
        positions = arange(t)
        check_length(t, self.config.max_position_embeddings, "Bert: sequence", positions)
        x = self.word_embeddings(ids) + self.position_embeddings(positions)
        types = self.token_type_embeddings.weight.narrow(0, 0, 1) if token_type_ids is None else \
            self.token_type_embeddings(_ids("token_type_ids", token_type_ids, (b, t)))
        x = self.embed_norm(x + types)
        mask = None if attention_mask is None else \
            _ids("attention_mask", attention_mask, (b, t)).ne(0).reshape((b, 1, 1, t))
        x = x.reshape((b * t, x.shape[-1]))
        for layer in self.layers:
            x = layer(x, mask, b, t)
        return x.reshape((b, t, x.shape[-1]))

    def pooled_output(self, hidden: Tensor) -> Tensor:
        """BertModel's pooler_output: tanh(dense(hidden[:, 0]))."""
        if self.pooler is None:
            raise ValueError("Bert.pooled_output: the checkpoint has no pooler.dense weights")
        return self.pooler(hidden.narrow(1, 0, 1).squeeze(1)).tanh()

    def embed(self, texts, normalize: bool = True, batch_size: int = 32) -> np.ndarray:
        """(len(texts), pooled dim) f32 sentence vectors (unit length when `normalize`)."""
        if self.tokenizer is None:
            raise ValueError("Bert.embed: the model has no tokenizer (load a folder with tokenizer.json)")
        texts = [texts] if isinstance(texts, str) else list(texts)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))   # like sentence-transformers
        out = [None] * len(texts)
        for s in range(0, len(texts), batch_size):
            chunk = order[s:s + batch_size]
            enc = self.tokenizer.batch([texts[i] for i in chunk], self.max_seq_length)
            check_length(enc.input_ids.shape[1], self.config.max_position_embeddings, "Bert: sequence")
            rows = self._embed_program(enc.input_ids, enc.attention_mask, enc.token_type_ids, bool(normalize))
            for j, i in enumerate(chunk):
                out[i] = rows[j]
        return np.stack(out) if out else np.zeros((0, self.pooled_dim), np.float32)

    def _embed_graph(self, ids, mask, types, normalize):
        """Pooled (and normalised) f32 vectors of a tokenized batch: traced once per batch
        shape by lc.jit (self._embed_program), so a call only runs the compiled program."""
        vec = self._pool(self.forward(ids, mask, types), mask)
        if normalize:
            vec = vec.broadcast_div(vec.sqr().sum_keepdim(-1).sqrt().maximum(1e-12))
        return vec.to_dtype(f32)

    @property
    def pooled_dim(self) -> int:
        return self.config.hidden_size * len(self.pooling)

    def _pool(self, hidden: Tensor, mask: Tensor) -> Tensor:
        m = mask.to_dtype(hidden.dtype).unsqueeze(-1)                   # (b, t, 1)
        count = m.sum(1).maximum(1e-9)
        parts = []
        for mode in self.pooling:
            if mode == "cls_token":
                parts.append(hidden.narrow(1, 0, 1).squeeze(1))
            elif mode == "max_tokens":
                parts.append(hidden.masked_fill(m.broadcast_as(hidden.shape) == 0, -1e9).max(1))
            elif mode == "mean_tokens":
                parts.append(hidden.broadcast_mul(m).sum(1).broadcast_div(count))
            else:
                parts.append(hidden.broadcast_mul(m).sum(1).broadcast_div(count.sqrt()))
        return parts[0] if len(parts) == 1 else cat(parts, -1)


def _ids(name, x, shape=None) -> Tensor:
    t = x if isinstance(x, Tensor) else tensor(np.asarray(x, np.int64))
    if t.dtype not in (i64, u8, u32):
        raise UnsupportedDTypeForOp(f"Bert: {name} must be u8, u32 or i64 ids, got {t.dtype.name} (shape {t.shape})")
    if shape is not None and tuple(t.shape) != shape:
        t = t.unsqueeze(0) if t.rank == 1 else t
        if tuple(t.shape) != shape:
            raise ShapeMismatch(f"Bert: {name} has shape {tuple(t.shape)}, the ids {shape}")
    return t


# ---- loading --------------------------------------------------------------------------------
def from_config(cfg: HFConfig, vb):
    """A Bert from a folder's config (the hub's builder contract)."""
    c = BertConfig(**{f: cfg.get(f) for f in ("vocab_size", "hidden_size", "num_hidden_layers",
                                              "num_attention_heads", "intermediate_size")},
                   hidden_act=cfg.get("hidden_act", "gelu"), layer_norm_eps=cfg.get("layer_norm_eps", 1e-12),
                   max_position_embeddings=cfg.get("max_position_embeddings", 512),
                   type_vocab_size=cfg.get("type_vocab_size", 2))
    if c.hidden_act not in ACTIVATIONS:
        cfg.unsupported("hidden_act", f"supported: {', '.join(ACTIVATIONS)}")
    if c.hidden_size % c.num_attention_heads:
        cfg.unsupported("num_attention_heads", f"does not divide hidden_size {c.hidden_size}")
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        cfg.unsupported("position_embedding_type", "only 'absolute' is implemented")
    for flag in ("is_decoder", "add_cross_attention"):
        if cfg.get(flag, False):
            cfg.unsupported(flag, "only the encoder is implemented")
    if vb.contains("bert.embeddings.word_embeddings.weight"):      # BertFor... checkpoints
        vb = vb.pp("bert")
    vb.mark_used("embeddings.position_ids")                        # a buffer: arange(max positions)
    folder = os.path.dirname(cfg.path)
    return Bert(c, vb, _pooling(folder, cfg.strict), _max_seq_length(folder))


def _json(path):
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _pooling(folder: str, strict: bool) -> tuple:
    """The pooling modes of the folder's sentence-transformers Pooling module (mean if none);
    modules other than Transformer / Pooling / Normalize are reported (strict: an error)."""
    modules = _json(os.path.join(folder, "modules.json")) or []
    pool_dir = "1_Pooling"
    for m in modules:
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind == "Pooling":
            pool_dir = m.get("path") or pool_dir
        elif kind not in ("Transformer", "Normalize"):
            report(strict, f"{os.path.join(folder, 'modules.json')}: module {m.get('type')!r} is not implemented")
    path = os.path.join(folder, pool_dir, "config.json")
    pc = _json(path)
    if pc is None:
        return ("mean_tokens",)
    for key, on in pc.items():
        if key.startswith("pooling_mode_") and on and key[len("pooling_mode_"):] not in POOLING_MODES:
            report(strict, f"{path}: {key} is not implemented (supported: {', '.join(POOLING_MODES)})")
    modes = tuple(m for m in POOLING_MODES if pc.get("pooling_mode_" + m))
    return modes or ("mean_tokens",)


def _max_seq_length(folder: str):
    sb = _json(os.path.join(folder, "sentence_bert_config.json")) or {}
    return sb.get("max_seq_length")
