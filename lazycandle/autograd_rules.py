"""Reverse-mode rules (VJPs), attached to the op table entries by name (ir.ops.set_vjp).

A rule is `rule(node, g, xs, out) -> tuple` with one gradient (a lazy Tensor, or None for no
gradient) per input in `xs`: the node's sources, except that a view's one input is its base
buffer (views are folded into strides, so the gradient maps back through the view's layout).
`g` is the adjoint of the node's output, `out` the node's output as a Tensor.  Ops without a
rule (sign, ceil, floor, round, comparisons, argmax/argmin, argsort, nonzero) pass no gradient,
like candle's backprop, which skips them; floordiv is piecewise constant and passes none either.
Masked gradients use `where`, not a multiply by a 0/1 mask, so an infinite or NaN upstream
gradient stays out of the positions the forward did not depend on (as in torch).  Rules only
build Tensors, so the adjoint graph is lazy and fuses like the forward."""
from __future__ import annotations

import math
from math import prod

import numpy as np

from .errors import SymbolicSizeError
from .ir.ops import set_vjp
from .sizes import decide_eq, decide_ge0, growth_key, has_size, is_one


def _mask(cond, like):
    """A u8 comparison result as 0/1 in `like`'s dtype."""
    return cond.to_dtype(like.dtype)


def _only(cond, g):
    """g where cond holds, 0 elsewhere (even where g is inf or NaN)."""
    return cond.where_cond(g, 0.0)


def _scalar(arg, i=0) -> float:
    """Scalar operand i of a runtime-scalar op (one scalar may be stored bare)."""
    return float(arg[i] if isinstance(arg, (tuple, list)) else arg)


def _rule(*names):
    def attach(fn):
        for n in names:
            set_vjp(n, fn)
        return fn
    return attach


# ---- elementwise ------------------------------------------------------------------------
_rule("add")(lambda n, g, xs, out: (g, g))
_rule("sub")(lambda n, g, xs, out: (g, -g))
_rule("mul")(lambda n, g, xs, out: (g * xs[1], g * xs[0]))
_rule("div")(lambda n, g, xs, out: (g / xs[1], -(g * out) / xs[1]))
_rule("neg")(lambda n, g, xs, out: (-g,))
_rule("exp")(lambda n, g, xs, out: (g * out,))
_rule("log")(lambda n, g, xs, out: (g / xs[0],))
_rule("sin")(lambda n, g, xs, out: (g * xs[0].cos(),))
_rule("cos")(lambda n, g, xs, out: (-(g * xs[0].sin()),))
_rule("tanh")(lambda n, g, xs, out: (g * (1.0 - out.sqr()),))
_rule("sqrt")(lambda n, g, xs, out: (g * 0.5 / out,))
_rule("recip")(lambda n, g, xs, out: (-(g * out.sqr()),))
_rule("sqr")(lambda n, g, xs, out: (g * xs[0] * 2.0,))
_rule("abs")(lambda n, g, xs, out: (g * xs[0].sign(),))
_rule("relu")(lambda n, g, xs, out: ((out > 0).where_cond(g, 0.0),))   # out: reuses the forward's buffer
_rule("sigmoid")(lambda n, g, xs, out: (g * out * (1.0 - out),))
_rule("copy")(lambda n, g, xs, out: (g,))
_rule("affine")(lambda n, g, xs, out: (g * _scalar(n.arg),))
_rule("erf")(lambda n, g, xs, out: (g * (xs[0].sqr() * -1.0).exp() * (2.0 / math.sqrt(math.pi)),))


@_rule("silu")
def _silu(n, g, xs, out):
    s = xs[0].sigmoid()
    return (g * s * (1.0 + xs[0] * (1.0 - s)),)


@_rule("gelu")
def _gelu(n, g, xs, out):
    """The tanh approximation gelu(x) = x s, s = (1 + tanh(c (x + k x^3))) / 2, so
    gelu'(x) = s + x s (1 - s) 2c (1 + 3k x^2) (1 - tanh^2 = 4 s (1 - s)).  s is read back from
    the forward's output as out / x (exact as its rounding; 1/2 at x = 0): no tanh a second
    time, the derivative is a few multiplies next to the forward gelu."""
    x = xs[0]
    c2 = 2.0 * math.sqrt(2.0 / math.pi)
    s = x.eq(0.0).where_cond(0.5, out / x)
    d = s + x * s * (1.0 - s) * c2 * (1.0 + x.sqr() * (3 * 0.044715))
    return (g * d,)


@_rule("gelu_erf")
def _gelu_erf(n, g, xs, out):
    x = xs[0]
    cdf = ((x * (1.0 / math.sqrt(2.0))).erf() + 1.0) * 0.5
    pdf = (x.sqr() * -0.5).exp() * (1.0 / math.sqrt(2.0 * math.pi))
    return (g * (cdf + x * pdf),)


@_rule("powf")
def _powf(n, g, xs, out):
    """e * x^(e-1); exactly 0 for e = 0 (x^-1 would make 0 * inf = NaN at x = 0)."""
    e = _scalar(n.arg)
    if e == 0.0:
        return (g * 0.0,)
    return (g * xs[0].powf(e - 1.0) * e,)


@_rule("pow")
def _pow(n, g, xs, out):
    """Like torch: d/dx is 0 where y = 0, d/dy is 0 where x = 0 and y >= 0 (not 0 * log 0)."""
    x, y = xs
    dx = y.eq(0.0).where_cond(0.0, g * y * x.pow(y - 1.0))
    dy = (x.eq(0.0) * (y >= 0.0)).where_cond(0.0, g * out * x.log())
    return (dx, dy)


@_rule("mod")
def _mod(n, g, xs, out):
    """a - floor(a / b) * b: 1 for a, -floor(a / b) for b (like torch's remainder)."""
    a, b = xs
    return (g, -(g * (a // b))) if a.dtype.is_float else (None, None)


@_rule("elu")
def _elu(n, g, xs, out):
    alpha = _scalar(n.arg)
    return ((xs[0] > 0).where_cond(g, g * (out + alpha)),)


@_rule("clamp")
def _clamp(n, g, xs, out):
    lo, hi = _scalar(n.arg, 0), _scalar(n.arg, 1)
    return (_only((xs[0] >= lo) * (xs[0] <= hi), g),)


@_rule("maximum", "minimum")
def _max_min(n, g, xs, out):
    """candle's rule: the gradient goes to the operand equal to the result, halved on ties."""
    a, b = xs
    ea, eb = out.eq(a), out.eq(b)
    ma, mb = _mask(ea, g), _mask(eb, g)
    return (_only(ea, g / (mb + 1.0)), _only(eb, g / (ma + 1.0)))


@_rule("where")
def _where(n, g, xs, out):
    keep = xs[0].ne(0)
    return (None, keep.where_cond(g, 0.0), keep.where_cond(0.0, g))


@_rule("cast")
def _cast(n, g, xs, out):
    src = xs[0].dtype
    return (g.to_dtype(src) if src.is_float else None,)


# ---- reductions (the node keeps reduced dims as size 1) ---------------------------------
_rule("sum")(lambda n, g, xs, out: (g.broadcast_as(xs[0].shape),))


@_rule("mean")
def _mean(n, g, xs, out):
    count = prod(xs[0].shape[d] for d in n.arg)
    if count.__class__ is not int:      # a size of named dims: a runtime scalar (g is empty at 0)
        return ((g / count).broadcast_as(xs[0].shape),)
    return ((g * (1.0 / count) if count else g).broadcast_as(xs[0].shape),)


@_rule("prod")
def _prod(n, g, xs, out):
    """The product of the other elements: out / x without zeros; with one zero in the slice,
    that position gets the product of the nonzero ones and the rest 0; with more, all 0."""
    x = xs[0]
    zero = x.eq(0.0)
    zeros = _mask(zero, x).sum_keepdim(n.arg).broadcast_as(x.shape)
    others_nonzero = zero.where_cond(1.0, x).prod_keepdim(n.arg).broadcast_as(x.shape)
    gb = g.broadcast_as(x.shape)
    lone_zero = zero.where_cond(gb * others_nonzero, 0.0)
    return (zeros.eq(0.0).where_cond(gb * out.broadcast_as(x.shape) / x, zeros.eq(1.0).where_cond(lone_zero, 0.0)),)


@_rule("max", "min")
def _extreme(n, g, xs, out):
    """Ties share the gradient equally (torch's rule)."""
    x = xs[0]
    hit = x.eq(out.broadcast_as(x.shape))
    count = _mask(hit, g).sum_keepdim(n.arg)
    return (_only(hit, (g / count).broadcast_as(x.shape)),)


# ---- matmul -------------------------------------------------------------------------------
def _transposed(t) -> bool:
    """Whether t's last two dims are provably swapped in memory (a linear layer's `w.t()`).  A
    stride that is a named size may or may not be 1: no, then (either form is the same product;
    this only picks the gradient's layout)."""
    st = t._node.layout.strides
    return t.rank >= 2 and decide_eq(st[-2], 1) is True and decide_eq(st[-1], 1) is False


def _matmul_as(lhs, rhs, like):
    """lhs @ rhs, computed as (rhs^T @ lhs^T)^T when `like` (the input this gradient flows to)
    is a transposed view: the gradient then lands in the base's own layout, so what reads it
    (the view rule, an optimizer update) reads it contiguously instead of through a transpose."""
    if _transposed(like):
        return rhs.transpose(-2, -1).matmul(lhs.transpose(-2, -1)).transpose(-2, -1)
    return lhs.matmul(rhs)


@_rule("matmul")
def _matmul(n, g, xs, out):
    a, b = xs
    return (_matmul_as(g, b.transpose(-2, -1), a), _matmul_as(a.transpose(-2, -1), g, b))


# ---- index ops ------------------------------------------------------------------------------
def _zeros(t):
    from .tensor import zeros
    return zeros(t.shape, t.dtype)


@_rule("index_select")
def _index_select(n, g, xs, out):
    return (_zeros(xs[0]).index_add(xs[1], g, n.arg), None)


@_rule("gather")
def _gather(n, g, xs, out):
    """scatter_add of g into zeros; with one id per row along the dim (cross-entropy's pick of
    the target's log-probability) that is g where the position equals the id, an elementwise
    select that fuses into its consumer instead of a full-size zero fill and scatter."""
    x, ids, dim = xs[0], xs[1], n.arg
    one_per_row = is_one(ids.shape[dim]) and all(
        decide_eq(a, b) is True for d, (a, b) in enumerate(zip(ids.shape, x.shape)) if d != dim)
    if not one_per_row or x.shape[dim].__class__ is not int:
        return (_zeros(x).scatter_add(ids, g, dim), None)
    from .tensor import arange
    it = "i32" if x.shape[dim] < 2 ** 31 else "i64"     # (i32: as many lanes as f32; the ids are in range)
    pos = arange(x.shape[dim], dtype=it).reshape(tuple(x.shape[dim] if d == dim else 1 for d in range(x.rank)))
    hit = pos.broadcast_as(x.shape).eq(ids.to_dtype(it).broadcast_as(x.shape))
    return (hit.where_cond(g.broadcast_as(x.shape), 0.0), None)


@_rule("scatter_add")
def _scatter_add(n, g, xs, out):
    return (g, None, g.gather(xs[1], n.arg))


@_rule("index_add")
def _index_add(n, g, xs, out):
    return (g, None, g.index_select(xs[1], n.arg))


@_rule("scatter")
def _scatter(n, g, xs, out):
    return (g.scatter(xs[1], _zeros(xs[2]), n.arg), None, g.gather(xs[1], n.arg))


@_rule("cat")
def _cat(n, g, xs, out):
    grads, start = [], 0
    for x in xs:
        size = x.shape[n.arg]
        grads.append(g.narrow(n.arg, start, size))
        start += size
    return tuple(grads)


@_rule("cumsum")
def _cumsum(n, g, xs, out):
    return (g.flip(n.arg).cumsum(n.arg).flip(n.arg),)


@_rule("sort_take")
def _sort_take(n, g, xs, out):
    return (_zeros(xs[0]).scatter_add(xs[1].to_dtype("i64"), g, xs[0].rank - 1), None)


@_rule("im2col")
def _im2col(n, g, xs, out):
    """Each patch element added back at its input position: col2im with the same geometry."""
    from .tensor_conv_transpose import col2im
    kh, kw, ph, pw, sh, sw, dh, dw = n.arg
    h, w = xs[0].shape[2], xs[0].shape[3]
    return (col2im(g, h, w, ph, pw, sh, sw, dh, dw),)


# ---- views ----------------------------------------------------------------------------------
@_rule("view")
def _view(n, g, xs, out):
    """Scatter the view's gradient back into its base's (contiguous) shape."""
    base = xs[0]
    lay = n.layout
    if decide_eq(g.elem_count, 0) is True or decide_eq(base.elem_count, 0) is True:
        return (_zeros(base),)
    narrowed = _as_narrow(g, lay, base.shape)
    if narrowed is not None:
        return (narrowed,)
    shape, strides, offset = list(lay.shape), list(lay.strides), lay.offset
    bdims = tuple(i for i, (d, s) in enumerate(zip(shape, strides)) if decide_eq(s, 0) is True and _above_one(d))
    if bdims:                                     # broadcast dims: sum back
        g = g.sum_keepdim(bdims)
        for i in bdims:
            shape[i] = 1
    flips = [i for i, s in enumerate(strides) if decide_ge0(s) is False and _above_one(shape[i])]
    if flips:
        g = g.flip(flips)
        for i in flips:
            offset += (shape[i] - 1) * strides[i]
            strides[i] = -strides[i]
    keep = [i for i, d in enumerate(shape) if _above_one(d)]
    shape, strides = [shape[i] for i in keep], [strides[i] for i in keep]
    g = g.reshape(tuple(shape))
    order = sorted(range(len(shape)), key=lambda i: -growth_key(strides[i]))
    if order != list(range(len(shape))):
        g = g.permute(*order)
        shape, strides = [shape[i] for i in order], [strides[i] for i in order]
    boxed = _as_box(g, shape, strides, offset, base.elem_count)
    if boxed is not None:
        return (boxed.reshape(base.shape),)
    return (_scatter_flat(g, shape, strides, offset, base),)


def _as_narrow(g, lay, base_shape):
    """The gradient of a view that narrows its base along one dim (narrow, chunk, a slice with
    step 1): `g` padded with zeros along that dim; None for any other view.  Decided on the
    layout as it is, so it holds for named sizes the general box (which splits the offset in
    the base's mixed radix) cannot take apart (a chunk of a (b, n, 3 e) tensor)."""
    from .layout import contiguous_strides
    if len(lay.shape) != len(base_shape) or not base_shape:
        return None
    want = contiguous_strides(tuple(base_shape))
    if any(decide_eq(st, w) is not True for d, st, w in zip(lay.shape, lay.strides, want) if not is_one(d)):
        return None
    dims = [k for k, (d, b) in enumerate(zip(lay.shape, base_shape)) if decide_eq(d, b) is not True]
    if len(dims) > 1:
        return None
    k = dims[0] if dims else len(base_shape) - 1
    start = lay.offset // want[k]
    if decide_eq(start * want[k], lay.offset) is not True or decide_ge0(start) is False \
            or decide_ge0(base_shape[k] - start - lay.shape[k]) is False:
        return None             # (undecided bounds hold: the view was checked inside its base)
    return g.pad_with_zeros(k, start, base_shape[k] - start - lay.shape[k])


def _as_box(g, shape, strides, offset, numel):
    """The view as a box inside the base reshaped to (numel / s0, s0 / s1, ..., 1): the gradient
    is `g` padded with zeros to that box (narrow, strided slices, reshape, permute).  None when the
    strides overlap or do not nest."""
    if not strides or not is_one(strides[-1]):
        g, shape, strides = g.unsqueeze(g.rank), shape + [1], strides + [1]
    outer = [numel] + strides[:-1]
    if any(decide_eq(o % s, 0) is not True for o, s in zip(outer, strides)):
        return None                 # (sizes of named dims: unless the nesting is exact at every size)
    sizes = [o // s for o, s in zip(outer, strides)]
    starts, rest = [], offset
    for s, c in zip(strides, sizes):
        starts.append(rest // s)
        rest -= starts[-1] * s
    if decide_eq(rest, 0) is not True or any(decide_ge0(c - p - d) is not True for p, d, c in zip(starts, shape, sizes)):
        return None
    for dim, (p, d, c) in enumerate(zip(starts, shape, sizes)):
        g = g.pad_with_zeros(dim, p, c - p - d)
    return g


def _zero_source(n) -> bool:
    """Whether cat source `n` is the zeros pad_with_zeros builds (a copy of a broadcast 0)."""
    if n.op.name == "copy" and not n.realized:
        n = n.srcs[0]
    return n.op.category == "view" and n.base.op.name == "const" and n.base.arg == 0


def _padded_pieces(t):
    """(cat node, [(start, node)]) of the non-zero pieces of an unrealized cat with int sizes
    along its dim (a view's gradient padded with zeros), seen through a contiguous reshape of
    it (what `_view` returns), else None."""
    n = t._node
    if n.op.category == "view" and n.layout.is_contiguous() and decide_eq(n.layout.offset, 0) is True:
        n = n.base
    if n.op.name != "cat" or n.realized:
        return None
    pieces, at = [], 0
    for s in n.srcs:
        size = s.shape[n.arg]
        if size.__class__ is not int:
            return None
        if not _zero_source(s):
            pieces.append((at, s))
        at += size
    return n, pieces


def accumulate(prev, g):
    """prev + g, where two zero-padded cats along one dim whose non-zero pieces do not overlap
    (the gradients of q, k, v = h.chunk(3, -1)) become ONE cat of their pieces: the pieces are
    written once, not padded with zeros into full-size buffers that an add then sums."""
    a, b = _padded_pieces(prev), _padded_pieces(g)
    if a is None or b is None or a[0].arg != b[0].arg or a[0].shape != b[0].shape \
            or prev.shape != g.shape or prev.dtype is not g.dtype:
        return prev + g
    from .tensor import Tensor, zeros
    from .tensor_index import cat
    dim, shape, pieces = a[0].arg, a[0].shape, sorted(a[1] + b[1], key=lambda p: p[0])
    base = _tiled_base(pieces, dim, shape, g.dtype)
    if base is not None:
        return Tensor(base).reshape(g.shape)
    parts, at = [], 0
    for start, node in pieces + [(shape[dim], None)]:
        if start < at:
            return prev + g             # overlapping pieces: they add
        if start > at:
            parts.append(zeros(shape[:dim] + (start - at,) + shape[dim + 1:], g.dtype))
        if node is not None:
            parts.append(Tensor(node))
            at = start + node.shape[dim]
    return cat(parts, dim).reshape(g.shape)


def _tiled_base(pieces, dim, shape, dtype):
    """The node whose whole buffer the pieces are, side by side along `dim` at the contiguous
    strides of `shape` (dq, dk, dv as views of the attention backward's (B, L, 3, H, E) output),
    else None: their cat is then that buffer, no copy."""
    from .layout import contiguous_strides
    base = pieces[0][1].base
    if base.op.category == "view" or base.dtype is not dtype or base.shape.__class__ is not tuple \
            or not all(d.__class__ is int for d in base.shape + tuple(shape)) or prod(base.shape) != prod(shape):
        return None
    want, at = contiguous_strides(tuple(shape)), 0
    for start, node in pieces:
        lay = node.layout
        if node.base is not base or node.op.category != "view" or start != at or lay.offset != start * want[dim] \
                or any(n != 1 and st != w for n, st, w in zip(lay.shape, lay.strides, want)):
            return None
        at += node.shape[dim]
    return base if at == shape[dim] else None


def _above_one(d) -> bool:
    """Whether a view dim counts as longer than 1 (a size of named dims does: bound to 1, what
    is done for it is a no-op)."""
    return d.__class__ is not int or d > 1


def _scatter_flat(g, shape, strides, offset, base):
    """The general case (overlapping windows): add every element at its flat base position."""
    from .tensor import tensor, zeros
    if has_size(tuple(shape) + tuple(strides) + (offset,)):
        raise SymbolicSizeError(f"the gradient of a view of shape {tuple(shape)}, strides {tuple(strides)} over "
                                f"sizes of named dims is not supported (overlapping or non-nesting strides)")
    flat = np.full((), offset, np.int64)
    for d, s in zip(shape, strides):
        flat = flat[..., None] + np.arange(d, dtype=np.int64) * s
    ids = tensor(flat.reshape(-1), "i64")
    acc = zeros((base.elem_count,), g.dtype).index_add(ids, g.flatten_all(), 0)
    return acc.reshape(base.shape)


# ---- col2im (conv_transpose) --------------------------------------------------------------
@_rule("col2im")
def _col2im(n, g, xs, out):
    """The adjoint of col2im is im2col with the same geometry, cut to the columns' extent."""
    from .tensor_conv_transpose import im2col
    oh, ow, kh, kw, ph, pw, sh, sw, dh, dw = n.arg
    ih, iw = xs[0].shape[4], xs[0].shape[5]
    cols = im2col(g, kh, kw, ph, pw, sh, sw, dh, dw)
    if cols.shape[4] != ih:
        cols = cols.narrow(4, 0, ih)
    if cols.shape[5] != iw:
        cols = cols.narrow(5, 0, iw)
    return (cols,)


# ---- flash_attention ------------------------------------------------------------------------
@_rule("flash_attention")
def _flash_attention(n, g, xs, out):
    """The fused backward (codegen/attention_grad.py): per block, the scores are recomputed from
    q, k, the mask and the rows' log-sum-exp, with the forward's output O.  The log-sum-exp is a
    node of its own (flash_attention_lse), so the forward's output stays as it is for callers
    that never take a gradient; when forward and backward realize together the scheduler has
    the forward's kernel write it (ir/schedule.py), else it is a pass of its own.  One flat
    buffer, dq, dk, dv views of it (attention_grad.output_strides; the layout rides in the node's
    arg, decided here once); an additive mask's gradient, dS itself, is the graph of the same
    formulas."""
    from .codegen import attention_grad as AG
    from .ir.node import Node
    causal, kind, scale = n.arg
    q, k, v = xs[:3]
    g, out = g.transpose(1, 2), out.transpose(1, 2)      # (the node is (B, L, H, Ev))
    B, H, L, E = q.shape
    S, EV = k.shape[2], v.shape[3]
    T = type(q)
    lse = T(Node("flash_attention_lse", tuple(x._node for x in xs), n.arg, (B, H, L), q.dtype,
                 label="flash_attention log-sum-exp"))
    do, qc, oc = _last_contiguous(g.materializable()), _last_contiguous(q), _last_contiguous(out)
    srcs = (qc, k, v, do, lse, oc) + tuple(xs[3:])
    sizes = (B * H * L * E, B * H * S * E, B * H * S * EV)
    inter = AG.interleaved(L, S, E, EV)
    flat = T(Node("flash_attention_grad", tuple(x._node for x in srcs), n.arg + (inter,), (sum(sizes),), q.dtype,
                  label=f"flash_attention backward{' causal' if causal else ''}{f' mask {kind}' if kind else ''}"))
    if inter:                                # (B, L, 3, H, E)
        both = flat.reshape((B, L, 3, H, E))
        grads = [both.narrow(2, i, 1).squeeze(2).transpose(1, 2) for i in range(3)]
    else:
        grads, at = [], 0
        for size, shape in zip(sizes, ((B, H, L, E), (B, H, S, E), (B, H, S, EV))):
            grads.append(flat.narrow(0, at, size).reshape(shape))
            at += size
    if kind is None:
        return tuple(grads)
    if kind != "add":
        return tuple(grads) + (None,)
    p = (q.matmul(k.transpose(-2, -1)) * scale + xs[3] - lse.unsqueeze(-1)).exp()
    dd = (g * out).sum_keepdim(-1)
    return tuple(grads) + (p * (g.matmul(v.transpose(-2, -1)) - dd),)


def _last_contiguous(t):
    """t, or a copy when its last dim (of size > 1) is strided: the backward loads vectors along it."""
    return t.contiguous() if t.shape[-1] > 1 and t._node.layout.strides[-1] != 1 else t
