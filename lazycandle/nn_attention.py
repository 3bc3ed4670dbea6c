"""Rotary embeddings (candle-nn's rotary_emb layouts) and scaled dot-product attention
(torch's semantics), as graphs of core ops: views, elementwise chains, one cat, matmuls and a
softmax, so the scheduler fuses them with their neighbours."""
from __future__ import annotations

import math

from .errors import DTypeMismatchBinaryOp, ShapeMismatchBinaryOp, UnsupportedDTypeForOp


def _rope_check(op, x, cos, sin, t_dim):
    if x.rank != 4:
        raise ShapeMismatchBinaryOp(f"{op}: x must be 4-D, got shape {x.shape} ({x.dtype.name})")
    if not x.dtype.is_float or x.dtype.storage_only:
        raise UnsupportedDTypeForOp(f"{op}: needs a float dtype, got {x.dtype.name} (shape {x.shape})")
    d = x.shape[-1]
    if d % 2:
        raise ShapeMismatchBinaryOp(f"{op}: the last dim of x must be even, got shape {x.shape}")
    want = (x.shape[t_dim], d // 2)
    for name, c in (("cos", cos), ("sin", sin)):
        if c.dtype is not x.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: {name} dtype {c.dtype.name} differs from x's {x.dtype.name} "
                                        f"(shapes {x.shape} and {c.shape})")
        if c.shape != want and c.shape != (x.shape[0],) + want:
            raise ShapeMismatchBinaryOp(f"{op}: {name} must have shape {want} (or (b, t, d/2)), got {c.shape} "
                                        f"for x {x.shape}")


def _per_position(c, x, t_dim):
    """cos / sin of shape (t, d/2) or (b, t, d/2) as a view broadcastable over x's halves."""
    if c.rank == 2:
        c = c.unsqueeze(0)
    return c.unsqueeze(1) if t_dim == 2 else c.unsqueeze(2)   # the head dim where x has it


def _rotate_halves(op, x, cos, sin, t_dim):
    _rope_check(op, x, cos, sin, t_dim)
    h = x.shape[-1] // 2
    c, s = _per_position(cos, x, t_dim), _per_position(sin, x, t_dim)
    x1, x2 = x.narrow(-1, 0, h), x.narrow(-1, h, h)
    from .tensor_index import cat
    return cat([x1.broadcast_mul(c) - x2.broadcast_mul(s), x2.broadcast_mul(c) + x1.broadcast_mul(s)], -1)


def rope(x, cos, sin):
    """candle-nn rope: x (b, h, t, d) with the two halves of d rotated as pairs (x[i], x[i + d/2])
    by cos / sin (t, d/2): out = x * [cos, cos] + [-x2, x1] * [sin, sin]."""
    return _rotate_halves("rope", x, cos, sin, 2)


def rope_thd(x, cos, sin):
    """rope for x laid out (b, t, h, d)."""
    return _rotate_halves("rope_thd", x, cos, sin, 1)


def rope_i(x, cos, sin):
    """candle-nn rope_i: x (b, h, t, d) with interleaved pairs (x[2i], x[2i+1]) rotated by
    cos[t, i] / sin[t, i]."""
    op = "rope_i"
    _rope_check(op, x, cos, sin, 2)
    h = x.shape[-1] // 2
    pairs = x.reshape(x.shape[:-1] + (h, 2))
    even, odd = pairs.narrow(-1, 0, 1), pairs.narrow(-1, 1, 1)
    c, s = _per_position(cos, x, 2).unsqueeze(-1), _per_position(sin, x, 2).unsqueeze(-1)
    from .tensor_index import cat
    out = cat([even.broadcast_mul(c) - odd.broadcast_mul(s), even.broadcast_mul(s) + odd.broadcast_mul(c)], -1)
    return out.reshape(x.shape)


def scaled_dot_product_attention(q, k, v, mask=None, is_causal=False, scale=None):
    """torch.nn.functional.scaled_dot_product_attention: softmax(q @ k^T * scale + mask) @ v.
    q (..., L, E), k (..., S, E), v (..., S, Ev), batch dims broadcast.  A u8 / u32 / i64 mask
    (a bool array too) means attend where nonzero; a float mask is added to the scores;
    is_causal is the top-left lower triangle of (L, S); scale defaults to 1 / sqrt(E)."""
    from . import nn
    from .tensor import Tensor, tensor
    op = "scaled_dot_product_attention"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank < 2:
            raise ShapeMismatchBinaryOp(f"{op}: {name} must have rank >= 2, got {t.shape}")
        if t.dtype is not q.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: dtypes of q, k, v differ: {q.dtype.name}, {k.dtype.name}, "
                                        f"{v.dtype.name} (shapes {q.shape}, {k.shape}, {v.shape})")
    nn._float(op, q)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShapeMismatchBinaryOp(f"{op}: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                                    f"(q and k share E, k and v share S) ({q.dtype.name})")
    if mask is not None and is_causal:
        raise ValueError(f"{op}: pass either mask or is_causal, not both (q {q.shape}, k {k.shape})")
    L, S = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = q.broadcast_matmul(k.transpose(-2, -1)) * scale
    if is_causal:
        from .tensor_extras import triangle_mask
        scores = scores.masked_fill(triangle_mask(L, S, 0, True) == 0, float("-inf"))
    elif mask is not None:
        if not isinstance(mask, Tensor):
            mask = tensor(mask)
        if mask.dtype.is_float:
            if mask.dtype is not scores.dtype:
                raise DTypeMismatchBinaryOp(f"{op}: float mask dtype {mask.dtype.name} differs from q's "
                                            f"{q.dtype.name} (mask {mask.shape}, scores {scores.shape})")
            scores = scores + mask
        else:
            scores = scores.masked_fill(mask == 0, float("-inf"))
    return nn.softmax(scores, -1).broadcast_matmul(v)
