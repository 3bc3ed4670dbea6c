"""What the generators share: the KV cache, the prefill + decode loop with its timings, weight
creation and checkpoint loading, byte-level tokens and the command line.

A model is an object with `config` (with max_len), `new_cache(batch, max_len)` and
`forward(ids, cache, pos, span=None)` -> lazy logits (batch, T, vocab) for tokens `ids`
(batch, T) at positions pos..pos+T-1, which also hands those positions' keys and values to
`cache` (KVCache.update; KVCache.commit writes them once the step is realized); pos is an
int, or a (1,) i64 tensor (one token, attending over `span` cache slots)."""
from __future__ import annotations

import argparse
import math
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
    """Preallocated keys and values per layer, (batch, kv_heads, max_len, head_dim) each: lc
    tensors that own their buffers (or placeholders, inside a compiled decode step).

    A step never copies the cache: `update` keeps the step's new keys and values aside
    (`pending`) and returns, for attention, the cached part written so far together with the
    new rows (`causal_attention` attends over both).  Once the step is realized, `commit`
    writes the new rows into the cache buffers with slice_set_ (buffer donation: O(new rows),
    in place while the cache is the buffers' only holder)."""

    def __init__(self, k: list, v: list):
        self.k, self.v = list(k), list(v)
        self.max_len = k[0].shape[2]
        self.pending = {}               # layer -> (new keys, new values) of the current step

    @classmethod
    def zeros(cls, n_layer: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype=f32) -> "KVCache":
        shape = (batch, kv_heads, max_len, head_dim)
        return cls([zeros(shape, dtype).realize() for _ in range(n_layer)],
                   [zeros(shape, dtype).realize() for _ in range(n_layer)])

    def update(self, layer: int, k: Tensor, v: Tensor, pos, span: int | None = None):
        """Keys and values for attention of new rows k, v (batch, kv_heads, T, head_dim) at
        positions pos..pos+T-1: ((cached keys, k), (cached values, v)), the cached part being
        positions 0..pos-1, or, for a runtime `pos` (a tensor, T = 1), slots 0..span-1 (attention
        masks the ones from pos on).  The rows are kept for `commit`."""
        self.pending[layer] = (k, v)
        n = pos if span is None else span
        return (self.k[layer].narrow(2, 0, n), k), (self.v[layer].narrow(2, 0, n), v)

    def rows(self) -> list:
        """The current step's new keys then new values, layer by layer."""
        return [self.pending[i][0] for i in range(len(self.k))] + [self.pending[i][1] for i in range(len(self.k))]

    def commit(self, pos: int, rows=None) -> None:
        """Write the step's new rows (realized tensors, or `rows` as `rows()` orders them,
        e.g. arrays a compiled step returned) into the cache at `pos`, in place."""
        n = len(self.k)
        rows = self.rows() if rows is None else [r if hasattr(r, "_node") else tensor(r) for r in rows]
        self.pending = {}
        for i in range(n):
            self.k[i].slice_set_(rows[i], 2, pos)
            self.v[i].slice_set_(rows[n + i], 2, pos)

    def tensors(self) -> list:
        return self.k + self.v


def causal_attention(q, k, v, pos):
    """Attention of queries q (b, heads, T, d) at positions pos.. over keys k, v: each a pair
    (cached (b, kv_heads, S, d), new (b, kv_heads, T, d)) from KVCache.update, or a plain
    tensor.  heads is a multiple of kv_heads (grouped-query attention: each group of query
    heads is one batch of rows against its key head, so keys are never repeated).  New rows
    see the cached ones (for a runtime pos, a (1,) i64 tensor: the slots before pos) and the
    new ones up to their own position."""
    b, heads, t, d = q.shape
    if isinstance(k, tuple) and k[0].shape[2] == 0:
        k, v = k[1], v[1]
    if not isinstance(k, tuple):
        return _attention_over(q, k, v, pos)
    (k_old, k_new), (v_old, v_new) = k, v
    kv, s = k_old.shape[1], k_old.shape[2]
    groups = heads // kv
    qg = q.reshape((b, kv, groups * t, d)) if groups > 1 else q
    scale = 1.0 / math.sqrt(d)
    old = qg.broadcast_matmul(k_old.transpose(-2, -1)) * scale
    if hasattr(pos, "_node"):
        old = old.masked_fill((arange(0, s) >= pos.broadcast_as((s,))).reshape((1, s)), float("-inf"))
    new = qg.broadcast_matmul(k_new.transpose(-2, -1)) * scale
    if t > 1:
        mask = triangle_mask(t, t, 0, True) == 0
        new = new.masked_fill(mask if groups == 1 else mask.repeat((groups, 1)), float("-inf"))
    top = old.max(-1, keepdim=True).maximum(new.max(-1, keepdim=True))
    p_old, p_new = (old - top).exp(), (new - top).exp()
    y = (p_old.broadcast_matmul(v_old) + p_new.broadcast_matmul(v_new)) / \
        (p_old.sum(-1, keepdim=True) + p_new.sum(-1, keepdim=True))
    return y.reshape((b, heads, t, d))


def _attention_over(q, k, v, pos):
    """Attention over plain cached keys k, v (b, kv_heads, S, d) of queries at pos.. (an int)."""
    b, heads, t, d = q.shape
    kv, s = k.shape[1], k.shape[2]
    groups = heads // kv
    mask = None if t == 1 else triangle_mask(t, s, pos, True)
    if mask is not None and groups > 1:
        mask = mask.repeat((groups, 1))
    if groups > 1:
        q = q.reshape((b, kv, groups * t, d))
    return nn.scaled_dot_product_attention(q, k, v, mask=mask).reshape((b, heads, t, d))


class Session:
    """One sequence being generated (batch 1): `prefill(tokens)` runs the prompt eagerly,
    `decode(token)` one new token.  Decode steps run a compiled Program (cached on the model,
    one per span of `span_block` cache positions): the position is fed as data, the caches go
    in (read in place) and only the step's new keys and values come back, written into the
    caches by KVCache.commit, so a step builds no graph, compiles nothing and writes O(new
    rows) of cache.  `compiled=False` builds each decode step eagerly instead.  Both return the
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
        logits, *rows = prog.run(**feeds)
        del feeds                       # the caches' only holder is the cache again (donation)
        self.cache.commit(self.pos, rows)
        self.pos += 1
        return tensor(logits)

    def _eager(self, tokens) -> Tensor:
        self._room(len(tokens))
        logits = self.model.forward(tensor(np.array([tokens], np.int64), i64), self.cache, self.pos)
        last = logits[0, -1]
        del logits                      # the graph reads the caches: drop it before commit
        rows = self.cache.rows()
        realize(last, *rows)
        self.cache.commit(self.pos, rows)
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
            progs[key] = compile([logits[0, -1]] + cache.rows())
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
