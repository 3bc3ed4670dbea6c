"""GPT-2 from a Hugging Face folder (model_type "gpt2"), written with lc.nn layers.

Tensor names: wte, wpe, h.N.ln_1, h.N.attn.c_attn, h.N.attn.c_proj, h.N.ln_2, h.N.mlp.c_fc,
h.N.mlp.c_proj, ln_f, optionally prefixed "transformer." (what GPT2LMHeadModel saves), and
lm_head.weight when the head is not tied to wte.  The projections are HF Conv1D: weight (in,
out), transposed at load into a Linear.  Pre-norm blocks, causal attention
with a KV cache (generation.py), MLP with the config's activation.

    python -m lazycandle.models.gpt2 --random-weights --config 124M --tokens 32
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from .. import nn
from ..dtype import f32
from ..nn_layers import Embedding, LayerNorm, Linear, Module
from .causal_lm import CausalLM, set_special_ids
from .generation import KVCache, causal_attention, update_or_pass

ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh", "gelu": "none",
               "relu": "relu", "silu": "silu", "swish": "silu"}

PRESETS = {      # config.json contents of the shapes the command line and the benchmarks build
    "124M": {"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024,
             "vocab_size": 50257, "bos_token_id": 50256, "eos_token_id": 50256},
    "tiny": {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128,
             "vocab_size": 320},
}


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int
    n_head: int
    n_embd: int
    vocab: int
    max_len: int                # n_positions
    n_inner: int
    eps: float = 1e-5
    activation: str = "tanh"    # a gelu approximation, or "relu" / "silu"
    tied: bool = True
    scale_attn_weights: bool = True
    scale_by_layer: bool = False    # scale_attn_by_inverse_layer_idx

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def read_config(cfg) -> GPT2Config:
    """The GPT2Config of an hub.HFConfig (transformers' defaults for absent fields)."""
    d = cfg.get("n_embd", 768)
    act = cfg.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        cfg.unsupported("activation_function", f"not one of {', '.join(ACTIVATIONS)}")
    if cfg.get("add_cross_attention", False):
        cfg.unsupported("add_cross_attention", "cross-attention (an encoder-decoder GPT-2) is not implemented")
    c = GPT2Config(n_layer=cfg.get("n_layer", 12), n_head=cfg.get("n_head", 12), n_embd=d,
                   vocab=cfg.get("vocab_size", 50257), max_len=cfg.get("n_positions", 1024),
                   n_inner=cfg.get("n_inner", None) or 4 * d, eps=cfg.get("layer_norm_epsilon", 1e-5),
                   activation=ACTIVATIONS.get(act, "tanh"), tied=cfg.get("tie_word_embeddings", True),
                   scale_attn_weights=cfg.get("scale_attn_weights", True),
                   scale_by_layer=cfg.get("scale_attn_by_inverse_layer_idx", False))
    if d % c.n_head:
        cfg.unsupported("n_head", f"n_embd {d} is not a multiple of it")
    return c


def conv1d(vb, n_in: int, n_out: int) -> Linear:
    """HF's Conv1D (weight (in, out), bias) as a Linear: the weight is transposed once at load
    into Linear's (out, in) rows, as a one-row decode step reads (out, in) rows ~10x faster
    than the columns of (in, out) here (one weight at a time: the mapped file is not copied whole)."""
    w = vb.get((n_in, n_out), "weight")
    return Linear.from_weights(w.t().contiguous().realize(), vb.get((n_out,), "bias"))


class Block(Module):
    def __init__(self, c: GPT2Config, vb, i: int):
        d = c.n_embd
        self.i, self.c = i, c
        self.ln_1 = LayerNorm(d, c.eps, vb=vb.pp("ln_1"))
        self.c_attn = conv1d(vb.pp("attn.c_attn"), d, 3 * d)
        self.c_proj = conv1d(vb.pp("attn.c_proj"), d, d)
        self.ln_2 = LayerNorm(d, c.eps, vb=vb.pp("ln_2"))
        self.c_fc = conv1d(vb.pp("mlp.c_fc"), d, c.n_inner)
        self.mlp_proj = conv1d(vb.pp("mlp.c_proj"), c.n_inner, d)
        for buf in ("attn.bias", "attn.masked_bias"):       # old checkpoints' causal-mask buffers
            if vb.contains(buf):
                vb.mark_used(buf)

    def forward(self, x, cache, step):
        x = x + self._attention(self.ln_1(x), cache, step)
        m = self.c_fc(self.ln_2(x))
        act = self.c.activation
        m = nn.relu(m) if act == "relu" else nn.silu(m) if act == "silu" else nn.gelu(m, approximate=act)
        return x + self.mlp_proj(m)

    def _attention(self, x, cache, step):
        c = self.c
        b, t, d = x.shape
        q, k, v = (z.reshape((b, t, c.n_head, c.head_dim)).transpose(1, 2) for z in self.c_attn(x).chunk(3, -1))
        k, v = update_or_pass(cache, self.i, k, v, step)
        scale = (c.head_dim ** -0.5 if c.scale_attn_weights else 1.0) / (self.i + 1 if c.scale_by_layer else 1)
        y = causal_attention(q, k, v, step, scale)
        return self.c_proj(y.transpose(1, 2).reshape((b, t, d)))


class GPT2(CausalLM):
    def __init__(self, config: GPT2Config, vb):
        self.config = c = config
        base = vb.pp("transformer") if vb.contains("transformer.wte.weight") else vb
        self.wte = Embedding(c.vocab, c.n_embd, vb=base.pp("wte"))
        self.wpe = Embedding(c.max_len, c.n_embd, vb=base.pp("wpe"))
        self.h = [Block(c, base.pp(f"h.{i}"), i) for i in range(c.n_layer)]
        self.ln_f = LayerNorm(c.n_embd, c.eps, vb=base.pp("ln_f"))
        if c.tied:
            if vb.contains("lm_head.weight"):
                vb.mark_used("lm_head.weight")      # saved beside the embedding it equals
            self.lm_head = Linear.from_weights(self.wte.weight)
        else:
            self.lm_head = Linear(c.n_embd, c.vocab, bias=False, vb=vb.pp("lm_head"))

    @property
    def dtype(self):
        return self.wte.weight.dtype

    def new_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        """Zeroed keys and values for `batch` sequences, max_len cache slots each, in the
        model's dtype unless `dtype` says otherwise."""
        c = self.config
        return KVCache.zeros(c.n_layer, batch, c.n_head, max_len, c.head_dim, dtype or self.dtype)

    def forward(self, ids, cache, step, last: bool = False):
        """Logits (b, t, vocab) f32 of tokens `ids` (b, t) at `step` (generation.py); only the
        last position's (b, 1, vocab) with `last`."""
        t = ids.shape[1]
        pos = step.positions()
        where = self.wpe.weight.narrow(0, step.start, t) if pos is None else self.wpe(pos)
        x = self.wte(ids) + where
        for block in self.h:
            x = block(x, cache, step)
        if last and t > 1:
            x = x.narrow(1, t - 1, 1)
        logits = self.lm_head(self.ln_f(x))
        return logits if logits.dtype is f32 else logits.astype(f32)


def from_config(cfg, vb) -> GPT2:
    """hub.py's builder: the model of a gpt2 folder."""
    model = GPT2(read_config(cfg), vb)
    set_special_ids(model, cfg, 50256, 50256)
    return model


def main(argv=None):
    from .textgen import module_main
    return module_main("lazycandle.models.gpt2", sys.modules[__name__], argv)


if __name__ == "__main__":
    sys.exit(main())
