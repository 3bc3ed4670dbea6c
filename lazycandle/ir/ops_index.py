"""Op kinds of the index / data-movement family, registered into the one op table.

Every one is category INDEX: a standalone kernel (a NodeStep in runtime/index_steps.py) whose
operands are read through their strides.  Node args are plain ints / tuples (they are part of
the structural cache key).

  index_select  srcs (t, ids)        arg dim   out[.., i, ..] = t[.., ids[i], ..]
  gather        srcs (t, ids)        arg dim   out[.., i, ..] = t[.., ids[.., i, ..], ..]
  scatter       srcs (t, ids, src)   arg dim   out = t; out[.., ids[.., i, ..], ..] = src[.., i, ..]
  scatter_add   srcs (t, ids, src)   arg dim   out = t; out[.., ids[.., i, ..], ..] += src[.., i, ..]
  index_add     srcs (t, ids, src)   arg dim   out = t; out[.., ids[i], ..] += src[.., i, ..]
  cat           srcs (t0, t1, ...)   arg dim   concatenation along dim
  nonzero       srcs (mask,)         arg None  out (n,) i64: flat ids of mask's nonzero elements (mask 1-D)
  im2col        srcs (x,)            arg (kh, kw, ph, pw, sh, sw, dh, dw)
                x (b, c, h, w) -> (b, c, kh, kw, oh, ow), zeros where the window is in the padding
"""
from __future__ import annotations

from .ops import _op, INDEX

ID_DTYPES = ("u8", "u32", "i64")

_op("index_select", INDEX, arity=2, doc="select slices of t along dim by a 1-D ids tensor")
_op("gather", INDEX, arity=2, doc="gather along dim by an ids tensor of the output's shape")
_op("scatter", INDEX, arity=3, doc="copy of t with src written at ids along dim")
_op("scatter_add", INDEX, arity=3, doc="copy of t with src added at ids along dim")
_op("index_add", INDEX, arity=3, doc="copy of t with slices of src added at 1-D ids along dim")
_op("cat", INDEX, arity=-1, doc="concatenation along dim (raw copies through strides)")
_op("nonzero", INDEX, arity=1, doc="ids of the nonzero elements of a 1-D mask (boolean-mask indexing)")
_op("im2col", INDEX, arity=1, doc="convolution patches (b, c, kh, kw, oh, ow) with zero padding")

# Model ops (kernels in codegen/sort.py and codegen/scan.py, steps in runtime/sort_steps.py):
#   argsort    srcs (t,)       arg (descending, ids dtype name)  ids of the stable sort of each last-dim row
#   sort_take  srcs (t, ids)   arg None   out[.., i] = t[.., ids[.., i]] (u32 ids straight from argsort)
#   cumsum     srcs (t,)       arg dim    inclusive running sum along dim
_op("argsort", INDEX, arity=1, out_dtype="u32", doc="stable per-row argsort along the last dim (NaN largest)")
_op("sort_take", INDEX, arity=2, doc="the sorted values: each last-dim row read at its argsort ids")
_op("cumsum", INDEX, arity=1, doc="inclusive scan along dim (ints wrap; f16/bf16/f8 in f32; f32 in f64)")

from . import ops_model  # noqa: E402,F401  (col2im, flash attention: the model ops' own kernels)
