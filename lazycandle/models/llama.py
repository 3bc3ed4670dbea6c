"""Llama with Hugging Face's tensor names, generating with a KV cache: RMSNorm, rotary
embeddings (lc.nn.rope: the rotate-half layout HF uses), SwiGLU MLP and grouped-query
attention (n_kv_head key/value heads shared by groups of query heads).

Names: model.embed_tokens.weight, model.layers.N.input_layernorm.weight,
model.layers.N.self_attn.{q,k,v,o}_proj.weight, model.layers.N.post_attention_layernorm.weight,
model.layers.N.mlp.{gate,up,down}_proj.weight, model.norm.weight, lm_head.weight.  Linear
weights are (out, in): y = x @ W.T.

    python -m lazycandle.models.llama --random-weights --config tiny --tokens 32
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from .. import nn
from ..dtype import f32
from ..tensor import arange, realize
from .generation import KVCache, causal_attention, load_checkpoint, parse_args, random_weights, run_cli


@dataclass(frozen=True)
class LlamaConfig:
    n_layer: int
    n_head: int
    n_kv_head: int
    dim: int
    hidden: int          # the MLP's intermediate size
    vocab: int
    max_len: int
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head


CONFIGS = {
    "tiny": LlamaConfig(n_layer=2, n_head=4, n_kv_head=2, dim=64, hidden=176, vocab=320, max_len=128),
}


def param_shapes(cfg: LlamaConfig) -> dict:
    """Every tensor of the model, by its Hugging Face name, with its shape."""
    d, kv = cfg.dim, cfg.n_kv_head * cfg.head_dim
    shapes = {"model.embed_tokens.weight": (cfg.vocab, d)}
    for i in range(cfg.n_layer):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
            p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
            p + "post_attention_layernorm.weight": (d,),
            p + "mlp.gate_proj.weight": (cfg.hidden, d), p + "mlp.up_proj.weight": (cfg.hidden, d),
            p + "mlp.down_proj.weight": (d, cfg.hidden),
        })
    shapes.update({"model.norm.weight": (d,), "lm_head.weight": (cfg.vocab, d)})
    return shapes


def rope_tables(cfg: LlamaConfig):
    """cos and sin (max_len, head_dim / 2) of position * theta^(-2i / head_dim), realized once."""
    half = cfg.head_dim // 2
    inv = (arange(0, half, dtype=f32) * (-2.0 * math.log(cfg.rope_theta) / cfg.head_dim)).exp()
    angles = arange(0, cfg.max_len, dtype=f32).reshape((cfg.max_len, 1)).broadcast_mul(inv.reshape((1, half)))
    return realize(angles.cos(), angles.sin())


class Llama:
    def __init__(self, config: LlamaConfig, weights: dict):
        self.config = config
        self.w = weights
        self.cos, self.sin = rope_tables(config)

    @classmethod
    def random(cls, config: LlamaConfig, seed: int = 0) -> "Llama":
        """Seeded random weights; norm gains near 1."""
        return cls(config, random_weights(param_shapes(config), seed, gains=("layernorm.weight", "norm.weight")))

    @classmethod
    def from_safetensors(cls, path, config: LlamaConfig) -> "Llama":
        return cls(config, load_checkpoint(path, param_shapes(config)))

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c = self.config
        return KVCache.zeros(c.n_layer, batch, c.n_kv_head, min(max_len, c.max_len), c.head_dim)

    def forward(self, ids, cache: KVCache, pos, span=None):
        """Logits (batch, T, vocab) of tokens `ids` (batch, T) at positions pos..pos+T-1 (pos:
        an int, or a (1,) i64 tensor with T = 1 reading `span` cache slots)."""
        c, w = self.config, self.w
        t = ids.shape[1]
        if hasattr(pos, "_node"):
            cos, sin = nn.embedding(pos, self.cos), nn.embedding(pos, self.sin)
        else:
            cos, sin = self.cos.narrow(0, pos, t), self.sin.narrow(0, pos, t)
        x = nn.embedding(ids, w["model.embed_tokens.weight"])
        for i in range(c.n_layer):
            p = f"model.layers.{i}."
            a = nn.rms_norm(x, w[p + "input_layernorm.weight"], c.eps)
            x = x + self._attention(p, i, a, cache, pos, span, cos, sin)
            m = nn.rms_norm(x, w[p + "post_attention_layernorm.weight"], c.eps)
            gate = nn.silu(nn.linear(m, w[p + "mlp.gate_proj.weight"]))
            x = x + nn.linear(gate * nn.linear(m, w[p + "mlp.up_proj.weight"]), w[p + "mlp.down_proj.weight"])
        x = nn.rms_norm(x, w["model.norm.weight"], c.eps)
        return nn.linear(x, w["lm_head.weight"])

    def _attention(self, p, i, x, cache, pos, span, cos, sin):
        c, w = self.config, self.w
        b, t, d = x.shape

        def heads(name, n):
            return nn.linear(x, w[p + f"self_attn.{name}_proj.weight"]).reshape((b, t, n, c.head_dim)).transpose(1, 2)
        q = nn.rope(heads("q", c.n_head), cos, sin)
        k = nn.rope(heads("k", c.n_kv_head), cos, sin)
        k, v = cache.update(i, k, heads("v", c.n_kv_head), pos, span)
        y = causal_attention(q, k, v, pos)
        return nn.linear(y.transpose(1, 2).reshape((b, t, d)), w[p + "self_attn.o_proj.weight"])


def main(argv=None):
    args = parse_args("lazycandle.models.llama", CONFIGS, argv)
    cfg = CONFIGS[args.config]
    model = Llama.random(cfg, args.seed) if args.random_weights else Llama.from_safetensors(args.weights, cfg)
    run_cli(model, args)


if __name__ == "__main__":
    sys.exit(main())
