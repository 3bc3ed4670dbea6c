"""GPT-2 with Hugging Face's tensor names and layouts, generating with a KV cache.

Names: wte, wpe, h.N.ln_1.{weight,bias}, h.N.attn.c_attn.{weight,bias}, h.N.attn.c_proj,
h.N.ln_2, h.N.mlp.c_fc, h.N.mlp.c_proj, ln_f; a checkpoint may prefix them with
"transformer.".  The linear layers are Conv1D: weight (in, out), so y = x @ W + b.  The lm head
is tied to wte.  Pre-norm blocks, tanh-gelu MLP, layer norm eps 1e-5.

    python -m lazycandle.models.gpt2 --random-weights --config 124M --tokens 32
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from .. import nn
from .generation import KVCache, causal_attention, load_checkpoint, parse_args, random_weights, run_cli

EPS = 1e-5


@dataclass(frozen=True)
class GPT2Config:
    n_layer: int
    n_head: int
    n_embd: int
    vocab: int
    max_len: int       # n_positions

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


CONFIGS = {
    "124M": GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab=50257, max_len=1024),
    "tiny": GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab=320, max_len=128),
}


def param_shapes(cfg: GPT2Config) -> dict:
    """Every tensor of the model, by its Hugging Face name, with its shape."""
    d = cfg.n_embd
    shapes = {"wte.weight": (cfg.vocab, d), "wpe.weight": (cfg.max_len, d)}
    for i in range(cfg.n_layer):
        h = f"h.{i}."
        shapes.update({
            h + "ln_1.weight": (d,), h + "ln_1.bias": (d,),
            h + "attn.c_attn.weight": (d, 3 * d), h + "attn.c_attn.bias": (3 * d,),
            h + "attn.c_proj.weight": (d, d), h + "attn.c_proj.bias": (d,),
            h + "ln_2.weight": (d,), h + "ln_2.bias": (d,),
            h + "mlp.c_fc.weight": (d, 4 * d), h + "mlp.c_fc.bias": (4 * d,),
            h + "mlp.c_proj.weight": (4 * d, d), h + "mlp.c_proj.bias": (d,),
        })
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,)})
    return shapes


class GPT2:
    def __init__(self, config: GPT2Config, weights: dict):
        self.config = config
        self.w = weights

    @classmethod
    def random(cls, config: GPT2Config, seed: int = 0) -> "GPT2":
        """Seeded random weights (GPT-2's init scale); norm gains near 1."""
        return cls(config, random_weights(param_shapes(config), seed, gains=("ln_1.weight", "ln_2.weight",
                                                                              "ln_f.weight")))

    @classmethod
    def from_safetensors(cls, path, config: GPT2Config) -> "GPT2":
        """Load a checkpoint with HF GPT-2 names (with or without "transformer.")."""
        return cls(config, load_checkpoint(path, param_shapes(config), prefixes=("", "transformer.")))

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c = self.config
        return KVCache.zeros(c.n_layer, batch, c.n_head, min(max_len, c.max_len), c.head_dim)

    def forward(self, ids, cache: KVCache, pos, span=None):
        """Logits (batch, T, vocab) of tokens `ids` (batch, T) at positions pos..pos+T-1 (pos:
        an int, or a (1,) i64 tensor with T = 1 reading `span` cache slots)."""
        c, w = self.config, self.w
        b, t = ids.shape
        wpe = w["wpe.weight"]
        where = nn.embedding(pos, wpe) if hasattr(pos, "_node") else wpe.narrow(0, pos, t)
        x = nn.embedding(ids, w["wte.weight"]) + where
        for i in range(c.n_layer):
            h = f"h.{i}."
            a = nn.layer_norm(x, w[h + "ln_1.weight"], w[h + "ln_1.bias"], EPS)
            x = x + self._attention(i, a, cache, pos, span)
            m = nn.layer_norm(x, w[h + "ln_2.weight"], w[h + "ln_2.bias"], EPS)
            m = _conv1d(_conv1d(m, w, h + "mlp.c_fc").gelu(), w, h + "mlp.c_proj")
            x = x + m
        x = nn.layer_norm(x, w["ln_f.weight"], w["ln_f.bias"], EPS)
        return x @ w["wte.weight"].t()

    def _attention(self, i, x, cache, pos, span):
        c, w = self.config, self.w
        b, t, d = x.shape
        qkv = _conv1d(x, w, f"h.{i}.attn.c_attn")
        q, k, v = (z.reshape((b, t, c.n_head, c.head_dim)).transpose(1, 2) for z in qkv.chunk(3, -1))
        k, v = cache.update(i, k, v, pos, span)
        y = causal_attention(q, k, v, pos)
        return _conv1d(y.transpose(1, 2).reshape((b, t, d)), w, f"h.{i}.attn.c_proj")


def _conv1d(x, w, name):
    """HF's Conv1D: x @ weight (in, out) + bias."""
    return x @ w[name + ".weight"] + w[name + ".bias"]


def main(argv=None):
    args = parse_args("lazycandle.models.gpt2", CONFIGS, argv)
    cfg = CONFIGS[args.config]
    model = GPT2.random(cfg, args.seed) if args.random_weights else GPT2.from_safetensors(args.weights, cfg)
    run_cli(model, args)


if __name__ == "__main__":
    sys.exit(main())
