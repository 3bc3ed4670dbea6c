"""Rotary embeddings (candle-nn's rotary_emb layouts) and scaled dot-product attention
(torch's semantics), as graphs of core ops: views, elementwise chains, one cat, matmuls and a
softmax, so the scheduler fuses them with their neighbours."""
from __future__ import annotations

import math

from .errors import DTypeMismatchBinaryOp, ShapeMismatchBinaryOp, UnboundPlaceholder, UnsupportedDTypeForOp, names_op
from .named_dims import is_symbolic
from .sizes import decide_eq, has_size, is_one, same


def _rope_check(op, x, cos, sin, t_dim):
    """x 4-D of a float dtype with an even last dim d; cos / sin (T, d/2) or (b, T, d/2) of x's
    dtype with T at least x's sequence length t (candle-nn: a table precomputed for the longest
    sequence is passed whole and its first t rows are used)."""
    if x.rank != 4:
        raise ShapeMismatchBinaryOp(f"{op}: x must be 4-D, got shape {x.shape} ({x.dtype.name})")
    if not x.dtype.is_float or x.dtype.storage_only:
        raise UnsupportedDTypeForOp(f"{op}: needs a float dtype, got {x.dtype.name} (shape {x.shape})")
    d = x.shape[-1]
    if d % 2:
        raise ShapeMismatchBinaryOp(f"{op}: the last dim of x must be even, got shape {x.shape}")
    t = x.shape[t_dim]
    for name, c in (("cos", cos), ("sin", sin)):
        if c.dtype is not x.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: {name} dtype {c.dtype.name} differs from x's {x.dtype.name} "
                                        f"(shapes {x.shape} and {c.shape})")
        batch_ok = c.rank == 2 or (c.rank == 3 and c.shape[0] == x.shape[0])
        if not batch_ok or c.shape[-1] != d // 2 or not _covers(c.shape[-2], t):
            raise ShapeMismatchBinaryOp(f"{op}: {name} must have shape (T, {d // 2}) or ({x.shape[0]}, T, {d // 2}) "
                                        f"with T >= the sequence length {t}, got {c.shape} for x {x.shape}")


def _covers(rows, t) -> bool:
    """Whether a table of `rows` positions covers a sequence of t; a comparison that needs a
    symbolic size's value is left to the narrow's own check when the sizes are bound."""
    if rows == t:
        return True
    try:
        return bool(rows >= t)
    except TypeError:
        return True


def _per_position(c, x, t_dim):
    """cos / sin of shape (T, d/2) or (b, T, d/2): the first t rows, as a view broadcastable
    over x's halves."""
    t = x.shape[t_dim]
    if c.shape[-2] != t:
        c = c.narrow(-2, 0, t)
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


@names_op("rope")
def rope(x, cos, sin):
    """candle-nn rope: x (b, h, t, d) with the two halves of d rotated as pairs (x[i], x[i + d/2])
    by cos / sin (t, d/2): out = x * [cos, cos] + [-x2, x1] * [sin, sin]."""
    return _rotate_halves("rope", x, cos, sin, 2)


@names_op("rope_thd")
def rope_thd(x, cos, sin):
    """rope for x laid out (b, t, h, d)."""
    return _rotate_halves("rope_thd", x, cos, sin, 1)


@names_op("rope_i")
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


def _check_sdpa(op, q, k, v, mask, is_causal):
    from . import nn
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.rank < 2:
            raise ShapeMismatchBinaryOp(f"{op}: {name} must have rank >= 2, got {t.shape}")
        if t.dtype is not q.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: dtypes of q, k, v differ: {q.dtype.name}, {k.dtype.name}, "
                                        f"{v.dtype.name} (shapes {q.shape}, {k.shape}, {v.shape})")
    nn._float(op, q)
    if decide_eq(q.shape[-1], k.shape[-1]) is False or decide_eq(k.shape[-2], v.shape[-2]) is False:
        raise ShapeMismatchBinaryOp(f"{op}: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                                    f"(q and k share E, k and v share S) ({q.dtype.name})")
    if mask is not None and is_causal:
        raise ValueError(f"{op}: pass either mask or is_causal, not both (q {q.shape}, k {k.shape})")
    if mask is not None and mask.dtype.is_float and mask.dtype is not q.dtype:
        raise DTypeMismatchBinaryOp(f"{op}: float mask dtype {mask.dtype.name} differs from q's "
                                    f"{q.dtype.name} (mask {mask.shape}, q {q.shape})")


@names_op("scaled_dot_product_attention")
def scaled_dot_product_attention(q, k, v, mask=None, is_causal=False, scale=None):
    """torch.nn.functional.scaled_dot_product_attention: softmax(q @ k^T * scale + mask) @ v.
    q (..., L, E), k (..., S, E), v (..., S, Ev), batch dims broadcast.  A u8 / u32 / i64 mask
    (a bool array too) means attend where nonzero; a float mask is added to the scores;
    is_causal is the top-left lower triangle of (L, S); scale defaults to 1 / sqrt(E).

    f32 / f64 with at most two batch dims, head dims <= 256 and S >= 1 run as ONE fused
    flash-attention kernel (codegen/attention.py: online softmax, the scores are never
    written), and their gradient as the fused backward (codegen/attention_grad.py, the rule in
    autograd_rules.py); anything else is the graph of core ops below, which fuses with its
    neighbours, and its gradient is that graph's."""
    from .tensor import Tensor, tensor
    op = "scaled_dot_product_attention"
    if mask is not None and not isinstance(mask, Tensor):
        mask = tensor(mask)
    _check_sdpa(op, q, k, v, mask, is_causal)
    if scale is None and is_symbolic(q.shape[-1]):
        raise UnboundPlaceholder(f"{op}: the head dim of q {q.shape} is a size named at run, so the default "
                                 f"scale 1/sqrt(E) is not known before it; pass scale=")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    fused = _flash_attention(q, k, v, mask, bool(is_causal), scale)
    if fused is not None:
        return fused[0]
    return _graph_sdpa(q, k, v, mask, is_causal, scale)


@names_op("attention_with_lse")
def attention_with_lse(q, k, v, mask=None, scale=None):
    """(out, lse): scaled_dot_product_attention(q, k, v, mask, scale=scale) of 4-D q (b, h, L, E),
    k (b, h, S, E), v (b, h, S, Ev), and the (b, h, L) log-sum-exp of each row's scaled, masked
    scores (+inf for a row with every key masked), both written by one pass of the fused kernel
    (the scheduler pairs them), so two attentions over parts of the keys merge exactly (a KV
    cache and the new rows).  None when the shapes or dtypes call for the graph."""
    from .tensor import Tensor, tensor
    if mask is not None and not isinstance(mask, Tensor):
        mask = tensor(mask)
    _check_sdpa("attention_with_lse", q, k, v, mask, False)
    if q.rank != 4 or k.rank != 4 or v.rank != 4:
        raise ShapeMismatchBinaryOp(f"attention_with_lse: q, k, v must be 4-D, got {q.shape}, {k.shape}, {v.shape}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _flash_attention(q, k, v, mask, False, scale, lse=True)


def _graph_sdpa(q, k, v, mask, is_causal, scale):
    """The graph version: matmul, mask, softmax, matmul; a row with every key masked gives 0
    (torch's attention since 2.5), not the NaN of a softmax over -inf."""
    from . import nn
    L, S = q.shape[-2], k.shape[-2]
    scores = q.broadcast_matmul(k.transpose(-2, -1)) * scale
    if is_causal:
        from .tensor_extras import triangle_mask
        scores = scores.masked_fill(triangle_mask(L, S, 0, True) == 0, float("-inf"))
    elif mask is not None:
        if mask.dtype.is_float:
            scores = scores + mask
        else:
            scores = scores.masked_fill(mask == 0, float("-inf"))
    dead = scores.max_keepdim(-1) == float("-inf")      # rows with every key masked: 0, and no NaN
    p = nn.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)   # in their gradient
    return p.broadcast_matmul(v)


def _broadcast_batch(shapes):
    """The broadcast of the batch shapes (None when they do not broadcast; sizes of named dims
    that may differ are checked at run by the broadcast views built from it)."""
    if any(has_size(tuple(s)) for s in shapes):
        from .tensor_views import broadcast_shapes
        out = ()
        try:
            for s in shapes:
                out = broadcast_shapes(out, tuple(s), "scaled_dot_product_attention", checks=[])
        except ValueError:
            return None
        return out
    import numpy as np
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _as_4d(t, batch, tail):
    """t viewed as (b, h) + tail with missing and size-1 dims broadcast (views only)."""
    while t.rank < len(batch) + len(tail):
        t = t.unsqueeze(0)
    return t.broadcast_as(batch + tuple(tail))


def _flash_attention(q, k, v, mask, is_causal, scale, lse=False):
    """(the fused kernel's output, its rows' log-sum-exp (b, h, L) when `lse`, else None), or
    None when the shapes / dtypes call for the graph."""
    from .codegen.attention import FLOAT_DTYPES, MAX_HEAD_DIM
    from .ir import ops_index  # noqa: F401  (registers flash_attention)
    from .ir.node import Node
    L, E, S, EV = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    if E.__class__ is not int or EV.__class__ is not int:
        return None                 # (the kernel is compiled per head dim; other sizes are run time)
    if q.dtype.name not in FLOAT_DTYPES or not (1 <= E <= MAX_HEAD_DIM and 1 <= EV <= MAX_HEAD_DIM) \
            or (S.__class__ is int and S < 1):
        return None
    batch = _broadcast_batch([q.shape[:-2], k.shape[:-2], v.shape[:-2]])
    if batch is None or len(batch) > 2:
        return None
    b4 = (1,) * (2 - len(batch)) + batch
    if mask is not None and (mask.rank > 4 or not same(_broadcast_batch([mask.shape, b4 + (L, S)]) or (), b4 + (L, S))):
        return None                 # the graph broadcasts a bigger batch, or raises the shape error
    q4, k4 = _as_4d(q, b4, (L, E)), _as_4d(k, b4, (S, E))
    v4 = _as_4d(v, b4, (S, EV))
    if not is_one(v4._node.layout.strides[-1]) and EV > 1:     # the kernel loads vectors along v's and k's last dim
        v4 = v4.contiguous()
    if not is_one(k4._node.layout.strides[-1]) and E > 1:
        k4 = k4.contiguous()
    srcs = [q4.materializable(), k4.materializable(), v4.materializable()]
    kind = None
    if mask is not None:
        if mask.dtype.storage_only:
            return None
        kind = "add" if mask.dtype.is_float else mask.dtype.name
        srcs.append(_as_4d(mask, b4, (L, S)).materializable())
    T, nodes, arg = type(q), tuple(t._node for t in srcs), (is_causal, kind, scale)
    out = T(Node("flash_attention", nodes, arg, (b4[0], L, b4[1], EV), q.dtype,
                 label=f"flash_attention{' causal' if is_causal else ''}{f' mask {kind}' if kind else ''} "
                       f"scale={scale:.6g}"))
    out = out.transpose(1, 2).reshape(batch + (L, EV))     # written (B, L, H, Ev): merging heads is a view
    if not lse:
        return out, None
    rows = T(Node("flash_attention_lse", nodes, arg, (b4[0], b4[1], L), q.dtype, label="flash_attention log-sum-exp"))
    return out, rows.reshape(batch + (L,))
