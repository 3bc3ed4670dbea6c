"""What the generators share: the KV cache, the prefill + decode loop with its timings, weight
creation and checkpoint loading, byte-level tokens and the command line.

A model is an object with `config` (with max_len), `new_cache(batch, max_len)` and
`forward(ids, cache, pos, span=None)` -> lazy logits (batch, T, vocab) for tokens `ids`
(batch, T) at positions pos..pos+T-1, which also writes those positions' keys and values into
`cache`; pos is an int, or a (1,) i64 tensor (one token, attending over `span` cache slots)."""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

from .. import nn
from ..caches import cache_info
from ..dtype import DType, f32, i64
from ..graph_api import compile
from ..serialization import load_safetensors, take_tensors
from ..tensor import Tensor, arange, placeholder, randn, realize, tensor, zeros
from ..tensor_extras import triangle_mask


class KVCache:
    """Preallocated keys and values per layer, (batch, kv_heads, max_len, head_dim) each:
    lc tensors, placeholders (inside a compiled decode step) or the arrays such a step
    returned.  `update` writes new positions with slice_set (a fused copy of the cache: the
    engine does not yet write in place) and returns the filled part, narrowed, for
    attention to read."""

    def __init__(self, k: list, v: list):
        self.k, self.v = list(k), list(v)
        self.max_len = k[0].shape[2]

    @classmethod
    def zeros(cls, n_layer: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype=f32) -> "KVCache":
        shape = (batch, kv_heads, max_len, head_dim)
        return cls([zeros(shape, dtype).realize() for _ in range(n_layer)],
                   [zeros(shape, dtype).realize() for _ in range(n_layer)])

    def update(self, layer: int, k: Tensor, v: Tensor, pos, span: int | None = None):
        """Write k, v (batch, kv_heads, T, head_dim) at positions pos..pos+T-1; returns the
        cached keys and values of positions 0..pos+T-1, or, for a runtime `pos` (a tensor),
        of positions 0..span-1 (attention masks the ones after pos)."""
        n = pos + k.shape[2] if span is None else span
        self.k[layer] = self.k[layer].slice_set(k, 2, pos)
        self.v[layer] = self.v[layer].slice_set(v, 2, pos)
        return self.k[layer].narrow(2, 0, n), self.v[layer].narrow(2, 0, n)

    def tensors(self) -> list:
        return self.k + self.v


def causal_attention(q, k, v, pos):
    """Attention of queries q (b, heads, T, d) at positions pos.. over cached keys k, v
    (b, kv_heads, S, d); heads a multiple of kv_heads (grouped-query attention: each group of
    query heads is one batch of rows against its key head, so keys are never repeated).
    An int pos: one query needs no mask, otherwise query j sees keys up to pos + j.  A
    runtime pos (a (1,) i64 tensor, one query): keys up to pos."""
    b, heads, t, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    groups = heads // kv
    if hasattr(pos, "_node"):
        mask = (arange(0, s) <= pos.broadcast_as((s,))).reshape((1, s))
    elif t == 1:
        mask = None
    else:
        mask = triangle_mask(t, s, pos, True)
        mask = mask if groups == 1 else mask.repeat((groups, 1))
    if groups > 1:
        q = q.reshape((b, kv, groups * t, d))
    return nn.scaled_dot_product_attention(q, k, v, mask=mask).reshape((b, heads, t, d))


class Session:
    """One sequence being generated (batch 1): `prefill(tokens)` runs the prompt eagerly,
    `decode(token)` one new token.  Decode steps run a compiled Program (cached on the model,
    one per span of `span_block` cache positions): the position is fed as data, the caches go
    in and come back as the program's outputs, so a step builds no graph and compiles
    nothing.  `compiled=False` builds each decode step eagerly instead.  Both return the
    last position's logits, a realized (vocab,) tensor."""

    def __init__(self, model, max_len: int, compiled: bool = True, span_block: int = 128):
        self.model, self.compiled, self.span_block = model, compiled, span_block
        self.cache = model.new_cache(1, max_len)
        self.max_len, self.pos = self.cache.max_len, 0

    def _room(self, n: int):
        if self.pos + n > self.max_len:
            raise ValueError(f"generate: {self.pos + n} positions exceed the cache's max_len {self.max_len}")

    def prefill(self, tokens) -> Tensor:
        return self._eager(list(tokens))

    def decode(self, token: int) -> Tensor:
        if not self.compiled:
            return self._eager([token])
        self._room(1)
        span = min(self.max_len, -(-(self.pos + 1) // self.span_block) * self.span_block)
        prog = self._program(span)
        n = len(self.cache.k)
        feeds = {"ids": np.array([[token]], np.int64), "pos": np.array([self.pos], np.int64)}
        feeds.update({f"k{i}": a for i, a in enumerate(self.cache.k)})
        feeds.update({f"v{i}": a for i, a in enumerate(self.cache.v)})
        logits, *state = prog.run(**feeds)
        self.cache.k, self.cache.v = state[:n], state[n:]
        self.pos += 1
        return tensor(logits)

    def _eager(self, tokens) -> Tensor:
        self._room(len(tokens))
        if not hasattr(self.cache.k[0], "_node"):        # arrays after compiled steps
            self.cache = KVCache([tensor(a) for a in self.cache.k], [tensor(a) for a in self.cache.v])
        logits = self.model.forward(tensor(np.array([tokens], np.int64), i64), self.cache, self.pos)
        last = logits[0, -1]
        realize(last, *self.cache.tensors())
        self.pos += len(tokens)
        return last

    def _program(self, span: int):
        key = ("decode", self.max_len, span)
        progs = self.model.__dict__.setdefault("_programs", {})
        if key not in progs:
            like = self.cache.k[0]
            shape, dt = tuple(like.shape), DType.from_numpy(np.asarray(like).dtype)
            n = len(self.cache.k)
            cache = KVCache([placeholder(f"k{i}", shape, dt) for i in range(n)],
                            [placeholder(f"v{i}", shape, dt) for i in range(n)])
            pos = placeholder("pos", (1,), i64)
            logits = self.model.forward(placeholder("ids", (1, 1), i64), cache, pos, span)
            progs[key] = compile([logits[0, -1]] + cache.tensors())
        return progs[key]


@dataclass
class Generation:
    tokens: list            # the new tokens (batch 1)
    prefill_ms: float       # the whole prompt's forward pass
    decode_ms: list         # per generated token after the first
    kernels_after_warmup: int   # kernels compiled during decode after `warmup` steps

    @property
    def decode_ms_per_token(self) -> float:
        return float(np.median(self.decode_ms)) if self.decode_ms else float("nan")


def generate(model, prompt, n_tokens: int, sampler, warmup: int = 3, max_len: int | None = None,
             compiled: bool = True) -> Generation:
    """Prefill `prompt` (a list of ids), then decode `n_tokens` tokens one at a time with the
    KV cache, picking each with `sampler` (logits row -> id)."""
    prompt = list(prompt)
    if not prompt:
        raise ValueError("generate: the prompt needs at least one token")
    session = Session(model, max_len or min(model.config.max_len, len(prompt) + n_tokens), compiled)
    t0 = time.perf_counter()
    logits = session.prefill(prompt)
    prefill_ms = (time.perf_counter() - t0) * 1e3
    tokens, times, kernels_at = [sampler(logits)], [], None
    while len(tokens) < n_tokens:
        if len(times) == warmup:
            kernels_at = cache_info()["kernels"]
        t0 = time.perf_counter()
        tokens.append(sampler(session.decode(tokens[-1])))
        times.append((time.perf_counter() - t0) * 1e3)
    compiled_after = 0 if kernels_at is None else cache_info()["kernels"] - kernels_at
    return Generation(tokens, prefill_ms, times, compiled_after)


# ---- weights -------------------------------------------------------------------------------
def random_weights(shapes: dict, seed: int, std: float = 0.02, gains=()) -> dict:
    """Seeded N(0, std) weights for `shapes` (name -> shape); names ending in one of `gains`
    (norm weights) are N(1, 0.1) instead."""
    out = {}
    for i, (name, shape) in enumerate(shapes.items()):
        gain = name.endswith(tuple(gains))
        out[name] = randn(1.0 if gain else 0.0, 0.1 if gain else std, shape, f32, seed=seed * 100003 + i)
    return out


def load_checkpoint(path, shapes: dict, prefixes=("",)) -> dict:
    """The model's tensors from a safetensors file (SerializationError for a missing tensor or
    a wrong shape), as f32."""
    got = take_tensors(load_safetensors(path), shapes, path, prefixes)
    return {k: t if t.dtype is f32 else t.astype(f32).realize() for k, t in got.items()}


# ---- tokens and the command line ----------------------------------------------------------
def byte_tokens(text: str) -> list:
    """Byte-level tokens: the UTF-8 bytes of `text` (ids 0..255)."""
    return list(text.encode("utf-8"))


def parse_args(prog: str, configs, argv=None):
    ap = argparse.ArgumentParser(prog=prog, description=f"Generate text with {prog} on lazycandle "
                                 "(byte-level tokens: no tokenizer needed).")
    ap.add_argument("--config", default="tiny", choices=sorted(configs))
    ap.add_argument("--random-weights", action="store_true", help="seeded random weights (no download)")
    ap.add_argument("--weights", help="a safetensors checkpoint with Hugging Face tensor names")
    ap.add_argument("--prompt", default="Hello, lazycandle!", help="text, tokenized as UTF-8 bytes")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens to generate")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if not args.random_weights and not args.weights:
        ap.error("pass --random-weights or --weights FILE")
    if args.tokens < 1:
        ap.error("--tokens must be >= 1")
    return args


def run_cli(model, args) -> Generation:
    """Generate and print the tokens and the timings."""
    from .sampling import Sampler
    prompt = byte_tokens(args.prompt)
    gen = generate(model, prompt, args.tokens, Sampler(args.temperature, args.top_k, args.top_p, args.seed))
    print("prompt tokens:", prompt)
    print("new tokens:", gen.tokens)
    text = bytes(t for t in gen.tokens if t < 256).decode("utf-8", errors="replace")
    print("as bytes:", repr(text))
    print(f"prefill: {gen.prefill_ms:.1f} ms for {len(prompt)} tokens ({gen.prefill_ms / len(prompt):.2f} ms/token)")
    print(f"decode: {gen.decode_ms_per_token:.2f} ms/token (median of {len(gen.decode_ms)}), "
          f"kernels compiled after warm-up: {gen.kernels_after_warmup}")
    return gen
