"""Llama from a Hugging Face folder (model_type "llama"), written with lc.nn layers: RMSNorm,
rotary embeddings (lc.nn.rope: the rotate-half layout transformers uses) with transformers'
`linear` and `llama3` frequency scaling, SwiGLU MLP, grouped-query attention (key/value heads
shared by groups of query heads), optional biases (attention_bias on q/k/v/o, mlp_bias on the
MLP), head_dim independent of hidden_size / heads, and a head tied to the embedding or not.

Names: model.embed_tokens, model.layers.N.input_layernorm, model.layers.N.self_attn.{q,k,v,o}_proj,
model.layers.N.post_attention_layernorm, model.layers.N.mlp.{gate,up,down}_proj, model.norm,
lm_head (absent when tied).

    python -m lazycandle.models.llama --random-weights --config tiny --tokens 32
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from .. import nn
from ..dtype import f32
from ..nn_layers import Embedding, Linear, Module, RmsNorm
from ..tensor import arange, full, realize
from .causal_lm import CausalLM, set_special_ids
from .generation import KVCache, causal_attention, update_or_pass

PRESETS = {
    "tiny": {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "hidden_size": 64, "intermediate_size": 176, "vocab_size": 320, "max_position_embeddings": 128,
             "rms_norm_eps": 1e-5, "bos_token_id": None, "eos_token_id": None},
}


@dataclass(frozen=True)
class LlamaConfig:
    n_layer: int
    n_head: int
    n_kv_head: int
    dim: int                 # hidden_size
    hidden: int              # the MLP's intermediate size
    vocab: int
    max_len: int             # max_position_embeddings
    head_dim: int
    rope_theta: float = 10000.0
    rope: tuple = ("default",)      # ("linear", factor) or ("llama3", factor, low, high, original_max)
    eps: float = 1e-6
    attention_bias: bool = False
    mlp_bias: bool = False
    tied: bool = False


def read_config(cfg) -> LlamaConfig:
    """The LlamaConfig of an hub.HFConfig (transformers' defaults for absent fields)."""
    d, heads = cfg.get("hidden_size", 4096), cfg.get("num_attention_heads", 32)
    if cfg.get("hidden_act", "silu") != "silu":
        cfg.unsupported("hidden_act", "only silu (SwiGLU) is implemented")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        cfg.unsupported("partial_rotary_factor", "rotary embeddings over part of the head are not implemented")
    theta, rope = _read_rope(cfg)
    c = LlamaConfig(n_layer=cfg.get("num_hidden_layers", 32), n_head=heads,
                    n_kv_head=cfg.get("num_key_value_heads", heads), dim=d,
                    hidden=cfg.get("intermediate_size", 11008), vocab=cfg.get("vocab_size", 32000),
                    max_len=cfg.get("max_position_embeddings", 2048), head_dim=cfg.get("head_dim", d // heads),
                    rope_theta=theta, rope=rope, eps=cfg.get("rms_norm_eps", 1e-6),
                    attention_bias=cfg.get("attention_bias", False), mlp_bias=cfg.get("mlp_bias", False),
                    tied=cfg.get("tie_word_embeddings", False))
    if heads % c.n_kv_head:
        cfg.unsupported("num_key_value_heads", f"num_attention_heads {heads} is not a multiple of it")
    if c.head_dim % 2:
        cfg.unsupported("head_dim", "rotary embeddings need an even head_dim")
    return c


def _read_rope(cfg):
    """(rope_theta, rope tuple) from rope_scaling (transformers 4) or rope_parameters (5)."""
    field = "rope_parameters" if cfg.get("rope_parameters", None) else "rope_scaling"
    p = cfg.get(field, None) or {}
    theta = float(p.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    kind = p.get("rope_type", p.get("type", "default"))
    if kind == "default":
        return theta, ("default",)
    if kind == "linear":
        return theta, ("linear", float(p["factor"]))
    if kind == "llama3":
        try:
            return theta, ("llama3", float(p["factor"]), float(p["low_freq_factor"]), float(p["high_freq_factor"]),
                           float(p.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 2048))))
        except KeyError as e:
            cfg.unsupported(field, f"llama3 rope scaling needs {e.args[0]!r}")
            return theta, ("default",)
    cfg.unsupported(field, f"rope type {kind!r} is not implemented (default, linear and llama3 are)")
    return theta, ("default",)


def inv_frequencies(c: LlamaConfig):
    """theta^(-2i / head_dim), scaled as transformers' rope init functions do (in f32)."""
    half = c.head_dim // 2
    inv = 1.0 / (full(c.rope_theta, (half,), f32) ** (arange(0, c.head_dim, 2, dtype=f32) / c.head_dim))
    kind = c.rope[0]
    if kind == "linear":
        return inv / c.rope[1]
    if kind == "llama3":
        factor, low, high, old_len = c.rope[1:]
        wavelen = (2 * math.pi) / inv
        scaled = (wavelen > old_len / low).where_cond(inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) * (wavelen <= old_len / low)
        return medium.where_cond(smoothed, scaled)
    return inv


def rope_tables(c: LlamaConfig, dtype):
    """cos and sin (max_len, head_dim / 2) of position * inverse frequency, in `dtype`."""
    inv = inv_frequencies(c)
    half = c.head_dim // 2
    angles = arange(0, c.max_len, dtype=f32).reshape((c.max_len, 1)).broadcast_mul(inv.reshape((1, half)))
    cos, sin = angles.cos(), angles.sin()
    return realize(cos.astype(dtype), sin.astype(dtype)) if dtype is not f32 else realize(cos, sin)


class Layer(Module):
    def __init__(self, c: LlamaConfig, vb, i: int):
        self.i, self.c = i, c
        q, kv = c.n_head * c.head_dim, c.n_kv_head * c.head_dim
        a, m, ab, mb = vb.pp("self_attn"), vb.pp("mlp"), c.attention_bias, c.mlp_bias
        self.input_layernorm = RmsNorm(c.dim, c.eps, vb=vb.pp("input_layernorm"))
        self.q_proj = Linear(c.dim, q, ab, vb=a.pp("q_proj"))
        self.k_proj = Linear(c.dim, kv, ab, vb=a.pp("k_proj"))
        self.v_proj = Linear(c.dim, kv, ab, vb=a.pp("v_proj"))
        self.o_proj = Linear(q, c.dim, ab, vb=a.pp("o_proj"))
        self.post_attention_layernorm = RmsNorm(c.dim, c.eps, vb=vb.pp("post_attention_layernorm"))
        self.gate_proj = Linear(c.dim, c.hidden, mb, vb=m.pp("gate_proj"))
        self.up_proj = Linear(c.dim, c.hidden, mb, vb=m.pp("up_proj"))
        self.down_proj = Linear(c.hidden, c.dim, mb, vb=m.pp("down_proj"))
        if a.contains("rotary_emb.inv_freq"):            # a buffer older checkpoints saved
            a.mark_used("rotary_emb.inv_freq")

    def forward(self, x, cache, step, cos, sin):
        x = x + self._attention(self.input_layernorm(x), cache, step, cos, sin)
        m = self.post_attention_layernorm(x)
        return x + self.down_proj(nn.silu(self.gate_proj(m)) * self.up_proj(m))

    def _attention(self, x, cache, step, cos, sin):
        c = self.c
        b, t, _ = x.shape

        def heads(proj, n):
            return proj(x).reshape((b, t, n, c.head_dim)).transpose(1, 2)
        q = nn.rope(heads(self.q_proj, c.n_head), cos, sin)
        k = nn.rope(heads(self.k_proj, c.n_kv_head), cos, sin)
        k, v = update_or_pass(cache, self.i, k, heads(self.v_proj, c.n_kv_head), step)
        y = causal_attention(q, k, v, step)
        return self.o_proj(y.transpose(1, 2).reshape((b, t, c.n_head * c.head_dim)))


class Llama(CausalLM):
    def __init__(self, config: LlamaConfig, vb):
        self.config = c = config
        base = vb.pp("model")
        self.embed_tokens = Embedding(c.vocab, c.dim, vb=base.pp("embed_tokens"))
        self.layers = [Layer(c, base.pp(f"layers.{i}"), i) for i in range(c.n_layer)]
        self.norm = RmsNorm(c.dim, c.eps, vb=base.pp("norm"))
        if c.tied:
            if vb.contains("lm_head.weight"):
                vb.mark_used("lm_head.weight")      # saved beside the embedding it equals
            self.lm_head = Linear.from_weights(self.embed_tokens.weight)
        else:
            self.lm_head = Linear(c.dim, c.vocab, bias=False, vb=vb.pp("lm_head"))
        self.cos, self.sin = rope_tables(c, self.dtype)

    @property
    def dtype(self):
        return self.embed_tokens.weight.dtype

    def new_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        """Zeroed keys and values for `batch` sequences, max_len cache slots each, in the
        model's dtype unless `dtype` says otherwise."""
        c = self.config
        return KVCache.zeros(c.n_layer, batch, c.n_kv_head, max_len, c.head_dim, dtype or self.dtype)

    def forward(self, ids, cache, step, last: bool = False):
        """Logits (b, t, vocab) f32 of tokens `ids` (b, t) at `step` (generation.py); only the
        last position's (b, 1, vocab) with `last`."""
        t = ids.shape[1]
        pos = step.positions()
        if pos is None:
            cos, sin = self.cos.narrow(0, step.start, t), self.sin.narrow(0, step.start, t)
        else:
            cos, sin = nn.embedding(pos, self.cos), nn.embedding(pos, self.sin)    # (b, t, d/2)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cache, step, cos, sin)
        if last and t > 1:
            x = x.narrow(1, t - 1, 1)
        logits = self.lm_head(self.norm(x))
        return logits if logits.dtype is f32 else logits.astype(f32)


def from_config(cfg, vb) -> Llama:
    """hub.py's builder: the model of a llama folder."""
    model = Llama(read_config(cfg), vb)
    set_special_ids(model, cfg)
    return model


def main(argv=None):
    from .textgen import module_main
    return module_main("lazycandle.models.llama", sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
