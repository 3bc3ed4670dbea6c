"""What the causal LMs share per forward pass: where the new tokens sit (`Step`: cache slot,
left padding, positions), the KV cache, and causal attention over cache + new rows.

A model's `forward(ids, cache, step, last=False)` gives the logits (b, t, vocab) of tokens `ids`
(b, t) placed at cache slots step.start.. (only the last position's with `last`), and hands
those slots' keys and values to `cache` (KVCache.update; KVCache.commit writes them once the
step is realized).  `cache` may be None: the tokens attend to each other only (a full sequence).

A batch of prompts of different lengths is left-padded to one length: sequence i's tokens start
at slot pad[i], its position ids are slot - pad[i] (0 at its first token, like transformers'
attention-mask cumsum), and its queries never see slots before pad[i]."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .. import nn, nn_attention
from ..autograd import no_grad
from ..dtype import f32, f64, i64
from ..tensor import Tensor, arange, tensor, zeros
from ..tensor_extras import triangle_mask


@dataclass(frozen=True)
class Step:
    """Where one forward pass's t new tokens per sequence go.  `start`: the cache slot of the
    first one: an int, or in a compiled decode step (t = 1) a Size, the cache's filled slots S
    (a named dim, bound by the length of `attend`).  `pad`: None, or a (b,) i64 tensor of each
    sequence's left padding.  `attend`: the compiled step's (b, S) u8 feed, nonzero where a
    cached slot holds one of the sequence's tokens (zero: its left padding); the attention
    reads those S slots of the cache, no more."""
    start: object
    t: int
    pad: Tensor | None = None
    attend: Tensor | None = None

    def positions(self):
        """Position ids (b, t) i64, or None when they are start..start+t-1 for every sequence
        (an int start, no padding: the tables are narrowed instead)."""
        if self.attend is not None:         # the new token's position: its sequence's cached tokens
            return self.attend.astype(i64).sum(-1, keepdim=True)
        if self.pad is None:
            return None
        slots = arange(self.start, self.start + self.t, dtype=i64).reshape((1, self.t))
        return slots.broadcast_sub(self.pad.reshape((-1, 1))).clip(0)

    def masks(self, groups: int):
        """(attended cached slots (b|1, 1, 1, S) or None, attended new keys (b|1, 1, groups*t,
        t) or None) as u8, nonzero = attend.  New rows see themselves and earlier new rows; a
        real row never sees a pad slot.  Pad rows see earlier pads, so every row keeps a key."""
        old = new = None
        s, t = self.start, self.t
        if self.attend is not None:
            old = self.attend.reshape((-1, 1, 1, s))
        elif self.pad is not None and s:
            old = arange(0, s, dtype=i64).reshape((1, 1, 1, s)).broadcast_ge(self.pad.reshape((-1, 1, 1, 1)))
        if t > 1:
            new = triangle_mask(t, t, 0, True).reshape((1, 1, t, t))
        if self.pad is not None and t > 1:
            at = arange(s, s + t, dtype=i64)
            pad = self.pad.reshape((-1, 1, 1, 1))
            key_pad = at.reshape((1, 1, 1, t)).broadcast_lt(pad)
            row_real = at.reshape((1, 1, t, 1)).broadcast_ge(pad)
            new = new.broadcast_mul(key_pad.broadcast_mul(row_real) == 0)
        if new is not None and groups > 1:
            new = new.repeat((1, 1, groups, 1))
        return old, new


class KVCache:
    """Preallocated keys and values per layer, (batch, kv_heads, max_len, head_dim) each, in
    the model's dtype: lc tensors that own their buffers (or placeholders, inside a compiled
    decode step).

    A step never copies the cache: `update` keeps the step's new keys and values aside
    (`pending`) and returns, for attention, the cached part written so far together with the
    new rows.  Once the step is realized, `commit` writes the new rows into the cache buffers
    with slice_set_ (buffer donation: O(new rows), in place while the cache is the buffers'
    only holder)."""

    def __init__(self, k: list, v: list):
        self.k, self.v = list(k), list(v)
        self.max_len = k[0].shape[2]
        self.pending = {}               # layer -> (new keys, new values) of the current step

    @classmethod
    def zeros(cls, n_layer: int, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype=f32) -> "KVCache":
        shape = (batch, kv_heads, max_len, head_dim)
        return cls([zeros(shape, dtype).realize() for _ in range(n_layer)],
                   [zeros(shape, dtype).realize() for _ in range(n_layer)])

    @property
    def dtype(self):
        return self.k[0].dtype

    def update(self, layer: int, k: Tensor, v: Tensor, step: Step):
        """(cached keys or None, k), (cached values or None, v) for attention of the new rows
        k, v (batch, kv_heads, t, head_dim) at `step` (in the cache's dtype); the rows are kept
        for `commit`."""
        if k.dtype is not self.dtype:
            k, v = k.astype(self.dtype), v.astype(self.dtype)
        self.pending[layer] = (k, v)
        n = step.start
        if n.__class__ is int and not n:
            return (None, k), (None, v)
        return (self.k[layer].narrow(2, 0, n), k), (self.v[layer].narrow(2, 0, n), v)

    def rows(self) -> list:
        """The current step's new keys then new values, layer by layer."""
        return [self.pending[i][0] for i in range(len(self.k))] + [self.pending[i][1] for i in range(len(self.k))]

    def commit(self, start: int, rows=None) -> None:
        """Write the step's new rows (realized tensors, or `rows` as `rows()` orders them,
        e.g. arrays a compiled step returned) into the cache at slot `start`, in place."""
        n = len(self.k)
        rows = self.rows() if rows is None else [r if hasattr(r, "_node") else tensor(r) for r in rows]
        self.pending = {}
        with no_grad():             # (a copy made while a Var lives would keep the old cache)
            for i in range(n):
                self.k[i].slice_set_(rows[i], 2, start)
                self.v[i].slice_set_(rows[n + i], 2, start)

    def tensors(self) -> list:
        return self.k + self.v


def update_or_pass(cache, layer, k, v, step):
    """cache.update(...), or the new rows alone when there is no cache."""
    return cache.update(layer, k, v, step) if cache is not None else ((None, k), (None, v))


def causal_attention(q, k, v, step: Step, scale: float | None = None):
    """Attention of queries q (b, heads, t, d) at `step` over k, v: pairs (cached (b, kv_heads,
    S, d) or None, new (b, kv_heads, t, d)) from KVCache.update.  heads is a multiple of
    kv_heads (grouped-query attention: each group of query heads is one batch of rows against
    its key head, so keys are never repeated).  The cached keys and the new ones are two fused
    attentions merged by their rows' log-sum-exp (one softmax over both, never concatenated).
    bf16 / f16 attend in f32 (scores, softmax and the weighted sum) and return q's dtype, as
    transformers' eager attention keeps its softmax in f32."""
    dt = q.dtype
    b, heads, t, d = q.shape
    (k_old, k_new), (v_old, v_new) = k, v
    if dt not in (f32, f64):
        q, k_new, v_new = q.astype(f32), k_new.astype(f32), v_new.astype(f32)
        k_old, v_old = (None, None) if k_old is None else (k_old.astype(f32), v_old.astype(f32))
    kv = k_new.shape[1]
    groups = heads // kv
    qg = q.reshape((b, kv, groups * t, d)) if groups > 1 else q
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    old_mask, new_mask = step.masks(groups)
    if k_old is None:
        y = nn.scaled_dot_product_attention(qg, k_new, v_new, mask=new_mask, scale=scale)
    else:
        y = _merge(_attend(qg, k_old, v_old, old_mask, scale), _attend(qg, k_new, v_new, new_mask, scale))
    y = y.reshape((b, heads, t, d))
    return y if y.dtype is dt else y.astype(dt)


def _attend(q, k, v, mask, scale):
    """(attention of q over k, v where `mask` is nonzero, each row's log-sum-exp (b, h, L, 1))
    by the fused kernel (nn.attention_with_lse), or by the graph of core ops when the shapes
    call for it (a head dim over the kernel's)."""
    fused = nn_attention.attention_with_lse(q, k, v, mask, scale)
    if fused is not None:
        return fused[0], fused[1].unsqueeze(-1)
    s = q.broadcast_matmul(k.transpose(-2, -1)) * scale
    if mask is not None:
        s = s.masked_fill(mask == 0, float("-inf"))
    top = s.max_keepdim(-1)
    top = top.masked_fill(top == float("-inf"), 0.0)       # (a fully masked row: p = 0, lse = -inf)
    p = s.broadcast_sub(top).exp()
    total = p.sum(-1, keepdim=True)
    y = p.broadcast_matmul(v).broadcast_div(total.masked_fill(total == 0, 1.0))
    return y, top + total.log()


def _merge(a, b):
    """One softmax over two parts of the keys from each part's (output, log-sum-exp): weights
    e^(lse - max); a fully masked part (lse +inf from the kernel, -inf from the graph) weighs 0
    (both: the row is 0, as a fully masked attention row)."""
    (ya, la), (yb, lb) = a, b
    la, lb = (x.masked_fill((x == float("inf")) + (x == float("-inf")), -1e30) for x in (la, lb))
    top = la.maximum(lb)
    wa, wb = (la - top).exp(), (lb - top).exp()
    return (ya.broadcast_mul(wa) + yb.broadcast_mul(wb)).broadcast_div(wa + wb)
