"""Op kinds of the model ops with generated kernels of their own (category INDEX: standalone
steps), registered into the one op table.

  col2im   srcs (cols,)   arg (oh, ow, kh, kw, ph, pw, sh, sw, dh, dw)
           cols (b, c, kh, kw, ih, iw) -> (b, c, oh, ow): each column element added at its image
           position (the adjoint of im2col; conv_transpose's second half).  Kernel in
           codegen/conv_transpose.py, step in runtime/conv_steps.py.
"""
from __future__ import annotations

from .ops import _op, INDEX

_op("col2im", INDEX, arity=1, doc="sum of convolution columns (b, c, kh, kw, ih, iw) into an image (b, c, oh, ow)")
