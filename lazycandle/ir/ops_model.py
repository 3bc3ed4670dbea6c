"""Op kinds of the model ops with generated kernels of their own (category INDEX: standalone
steps), registered into the one op table.

  col2im   srcs (cols,)   arg (oh, ow, kh, kw, ph, pw, sh, sw, dh, dw)
           cols (b, c, kh, kw, ih, iw) -> (b, c, oh, ow): each column element added at its image
           position (the adjoint of im2col; conv_transpose's second half).  Kernel in
           codegen/conv_transpose.py, step in runtime/conv_steps.py.
  flash_attention  srcs (q, k, v) or (q, k, v, mask), each (b, h, ., .)   arg (causal, mask kind, scale)
           softmax(q k^T scale + mask) v by an online softmax, one unit per (b, h, query block),
           never writing the scores.  mask kind: None | "add" | the integer mask's dtype name.
           Kernel in codegen/attention.py, step in runtime/attention_steps.py.
"""
from __future__ import annotations

from .ops import _op, INDEX

_op("col2im", INDEX, arity=1, doc="sum of convolution columns (b, c, kh, kw, ih, iw) into an image (b, c, oh, ow)")
_op("flash_attention", INDEX, arity=-1, cost=4, doc="fused scaled dot-product attention (online softmax)")
