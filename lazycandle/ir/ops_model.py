"""Op kinds of the model ops with generated kernels of their own (category INDEX: standalone
steps), registered into the one op table.

  col2im   srcs (cols,)   arg (oh, ow, kh, kw, ph, pw, sh, sw, dh, dw)
           cols (b, c, kh, kw, ih, iw) -> (b, c, oh, ow): each column element added at its image
           position (the adjoint of im2col; conv_transpose's second half).  Kernel in
           codegen/conv_transpose.py, step in runtime/conv_steps.py.
  flash_attention  srcs (q, k, v) or (q, k, v, mask), each (b, h, ., .)   arg (causal, mask kind, scale)
           -> (b, L, h, Ev) (nn_attention returns it transposed to (b, h, L, Ev): merging heads is a view):
           softmax(q k^T scale + mask) v by an online softmax, one unit per (b, h, query block),
           never writing the scores.  mask kind: None | "add" | the integer mask's dtype name.
           Kernel in codegen/attention.py, step in runtime/attention_steps.py.
  flash_attention_lse   srcs and arg as flash_attention -> (b, h, L): each query row's
           log-sum-exp of its scaled, masked scores (+inf for a row with every key masked);
           the scheduler puts it in its forward's kernel when both are in one capture.
  flash_attention_grad  srcs (q, k, v, dO, lse, O) or (..., mask)   arg as flash_attention + (interleaved output,)
           -> dq, dk, dv in one flat buffer (attention_grad.output_strides): the backward, scores
           recomputed per block (FlashAttention-2).
           Kernel in codegen/attention_grad.py, step in runtime/attention_steps.py.
  qmatmul_act  srcs (x,)   arg (K,)
           x (..., K) f32 contiguous -> (..., K + K / 4) u8: its rows quantized per 32 values to
           int8 blocks for qmatmul's "int8" path (codegen/qmatmul.act_bytes gives the layout).
  qmatmul  srcs (a, w)   arg (kind, N, K, path, isa, mt, nt, one): (mt, nt) the tile, `one` the tile
           when the rows (a named size) bind to 1
           a: x (..., K) f32 contiguous (path "f32") or its qmatmul_act blocks (path "int8"),
           times the transposed GGML-block weight (N, K) whose bytes are the u8 buffer w
           -> (..., N) f32.  Kernels in codegen/qmatmul.py, steps in runtime/qsteps.py.
"""
from __future__ import annotations

from .ops import _op, INDEX

_op("col2im", INDEX, arity=1, doc="sum of convolution columns (b, c, kh, kw, ih, iw) into an image (b, c, oh, ow)")
_op("flash_attention", INDEX, arity=-1, cost=4, doc="fused scaled dot-product attention (online softmax)")
_op("flash_attention_lse", INDEX, arity=-1, cost=4, doc="flash attention's per-row log-sum-exp")
_op("flash_attention_grad", INDEX, arity=-1, cost=4, doc="fused flash-attention backward (dq, dk, dv packed)")
_op("qmatmul_act", INDEX, arity=1, doc="activation rows quantized per 32 values to int8 blocks (qmatmul)")
_op("qmatmul", INDEX, arity=2, cost=2, doc="x @ W.T with W in GGML blocks (quantized weights)")
