"""Transposed convolution and bilinear upsampling of the Tensor API.

  conv_transpose1d / 2d  the GEMM `kernel^T @ input` per group (broadcast_matmul: BLAS or the
                         tiled kernel) gives the columns (b, c_out, kh, kw, ih, iw); the col2im
                         kernel (codegen/conv_transpose.py) sums them into the image.  Kernel
                         layout (c_in, c_out/groups, k...) like candle / torch.  Low-precision
                         dtypes run both in f32 and round each output once, as torch does.
  upsample_bilinear2d    per spatial dim, two index_selects (the neighbours) blended by weights
                         computed from torch's source-index rule; f16 / bf16 / f8 blend in f32 and
                         round once.
Their gradients come from the same pieces: col2im's VJP is im2col (autograd_rules.py), so the
input gradient of a transposed convolution is a convolution; index_select's is index_add.
Shape, dtype and argument errors are raised here, at the call.
"""
from __future__ import annotations

from . import dtype as D
from .errors import ShapeMismatch, ShapeMismatchBinaryOp, UnsupportedDTypeForOp
from .ir import ops_index  # noqa: F401  (registers col2im)
from .ir.node import Node
from .named_dims import require, require_ge0
from .sizes import decide_eq, decide_ge0
from .tensor_index import _int_arg, _pair
from .tensor_views import shape_desc


def im2col(x, kh, kw, ph, pw, sh, sw, dh, dw):
    """x (b, c, h, w) -> its convolution patches (b, c, kh, kw, oh, ow) (zeros in the padding)."""
    b, c, h, w = x.shape
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    x = x.materializable()
    return type(x)(Node("im2col", (x._node,), (kh, kw, ph, pw, sh, sw, dh, dw), (b, c, kh, kw, oh, ow), x.dtype,
                        label=f"im2col k=({kh}, {kw}) p=({ph}, {pw}) s=({sh}, {sw}) d=({dh}, {dw})"))


def col2im(cols, oh, ow, ph, pw, sh, sw, dh, dw):
    """cols (b, c, kh, kw, ih, iw) -> the image (b, c, oh, ow) with each column element added at
    row iy*sh + ki*dh - ph, column ix*sw + kj*dw - pw (the adjoint of im2col)."""
    b, c, kh, kw, _, _ = cols.shape
    cols = cols.materializable()
    return type(cols)(Node("col2im", (cols._node,), (oh, ow, kh, kw, ph, pw, sh, sw, dh, dw), (b, c, oh, ow),
                           cols.dtype, label=f"col2im -> ({oh}, {ow}) k=({kh}, {kw}) p=({ph}, {pw}) "
                                             f"s=({sh}, {sw}) d=({dh}, {dw})"))


def _conv_transpose(op, x, kernel, padding, out_padding, stride, dilation, groups, shapes, checked=False):
    """conv_transpose2d on (b, c_in, h, w) x (c_in, c_out/groups, kh, kw) with pairs for the parameters."""
    groups = _int_arg(op, "groups", groups, 1)
    b, ci, ih, iw = x.shape
    kci, cog, kh, kw = kernel.shape
    xs, ks = shapes
    if kci != ci or ci % groups or kh < 1 or kw < 1:
        raise ShapeMismatchBinaryOp(f"{op}: input {xs} and kernel {ks} do not match with groups={groups} "
                                    f"(need kernel.shape[0] = c_in, divisible by groups) ({x.dtype.name})")
    (ph, pw), (oph, opw), (sh, sw), (dh, dw) = padding, out_padding, stride, dilation
    if oph >= max(sh, dh) or opw >= max(sw, dw):
        raise ShapeMismatchBinaryOp(f"{op}: output_padding {out_padding} must be smaller than the stride "
                                    f"{stride} or the dilation {dilation} (input {xs}, kernel {ks}, {x.dtype.name})")
    oh = (ih - 1) * sh - 2 * ph + dh * (kh - 1) + oph + 1
    ow = (iw - 1) * sw - 2 * pw + dw * (kw - 1) + opw + 1
    checks = []         # (sizes of named dims: checked when they are bound)
    for v in () if checked else (ih, iw, oh, ow):
        require_ge0(checks, v - 1, ShapeMismatchBinaryOp, f"{op}: input {xs} with kernel {ks}, padding {padding}, "
                    f"dilation {dilation} gives an empty output ({oh}, {ow}) ({x.dtype.name})")
    if checks:
        y = _conv_transpose(op, x, kernel, padding, out_padding, stride, dilation, groups, shapes, checked=True)
        require(y._node, checks, first=True)
        return y
    if x.dtype.codec:      # f16 / bf16 / f8: the GEMM and the overlap sum in f32, one rounding
        y = _conv_transpose(op, x.to_dtype(D.f32), kernel.to_dtype(D.f32), padding, out_padding, stride,
                            dilation, groups, shapes)
        return y.to_dtype(x.dtype)
    G, cig, co = groups, ci // groups, cog * groups
    w = kernel.reshape((G, cig, cog * kh * kw)).transpose(-2, -1)          # (G, cog*kh*kw, cig)
    cols = w.broadcast_matmul(x.reshape((b, G, cig, ih * iw)))           # (b, G, cog*kh*kw, ih*iw)
    if kh == kw == 1 and sh == sw == 1 and ph == pw == 0 and oph == opw == 0:
        return cols.reshape((b, co, ih, iw))
    return col2im(cols.reshape((b, co, kh, kw, ih, iw)), oh, ow, ph, pw, sh, sw, dh, dw)


def _bilinear_taps(src, dst, align_corners):
    """torch's rule, as lazy f64 ops on the destination indices: the two source indices and
    the two weights of every destination index."""
    from .tensor import arange
    i = arange(0, dst, dtype=D.f64)
    if src.__class__ is not int or dst.__class__ is not int:     # sizes of named dims: runtime scalars
        if align_corners:
            pos = i * (src - 1) / (dst - 1) if decide_ge0(dst - 2) is True else i * 0.0
        else:
            pos = ((i + 0.5) * src / dst - 0.5).maximum(0.0)
    elif align_corners:
        pos = i * ((src - 1) / (dst - 1)) if dst > 1 else i * 0.0
    else:
        pos = ((i + 0.5) * (src / dst) - 0.5).maximum(0.0)
    i0 = pos.floor().to_dtype(D.i64).minimum(src - 1)
    i1 = (i0 + 1).minimum(src - 1)
    frac = pos - i0.to_dtype(D.f64)
    return i0, i1, 1.0 - frac, frac


class ConvTransposeMixin:
    __slots__ = ()

    def conv_transpose1d(self, kernel, padding=0, output_padding=0, stride=1, dilation=1, groups=1):
        """Transposed 1-D convolution: input (b, c_in, l), kernel (c_in, c_out/groups, k) ->
        (b, c_out, (l - 1) stride - 2 padding + dilation (k - 1) + output_padding + 1)."""
        op = "conv_transpose1d"
        kernel = self._conv_check(op, kernel, 3)
        p = _int_arg(op, "padding", padding, 0)
        q = _int_arg(op, "output_padding", output_padding, 0)
        s = _int_arg(op, "stride", stride, 1)
        d = _int_arg(op, "dilation", dilation, 1)
        y = _conv_transpose(op, self.unsqueeze(2), kernel.unsqueeze(2), (0, p), (0, q), (1, s), (1, d), groups,
                            (self.shape, kernel.shape))
        return y.squeeze(2)

    def conv_transpose2d(self, kernel, padding=0, output_padding=0, stride=1, dilation=1, groups=1):
        """Transposed 2-D convolution: input (b, c_in, h, w), kernel (c_in, c_out/groups, kh, kw)
        -> (b, c_out, oh, ow), oh = (h - 1) stride - 2 padding + dilation (kh - 1) + output_padding
        + 1.  padding, output_padding, stride and dilation are ints or (h, w) pairs."""
        op = "conv_transpose2d"
        kernel = self._conv_check(op, kernel, 4)
        return _conv_transpose(op, self, kernel, _pair(op, "padding", padding, 0),
                               _pair(op, "output_padding", output_padding, 0), _pair(op, "stride", stride, 1),
                               _pair(op, "dilation", dilation, 1), groups, (self.shape, kernel.shape))

    def upsample_bilinear2d(self, h, w, align_corners=False):
        """(b, c, h0, w0) -> (b, c, h, w) by bilinear interpolation with torch's values
        (F.interpolate(mode="bilinear", size=(h, w), align_corners=...)); float dtypes."""
        op = "upsample_bilinear2d"
        if self.rank != 4:
            raise ShapeMismatch(f"{op}: expected a (b, c, h, w) tensor, got shape {self.shape} ({self.dtype.name})")
        if not self.dtype.is_float or self.dtype.storage_only:
            raise UnsupportedDTypeForOp(f"{op}: needs a float dtype with arithmetic, got {self.dtype.name} "
                                        f"(shape {self.shape})")
        size = (_int_arg(op, "h", h, 0), _int_arg(op, "w", w, 0))
        x = self.to_dtype(D.f32) if self.dtype.codec else self
        for dim, dst in zip((2, 3), size):
            x = _bilinear_dim(op, x, dim, dst, bool(align_corners), self.dtype)
        return x.to_dtype(self.dtype) if self.dtype.codec else x


def _bilinear_dim(op, x, dim, dst, align_corners, dtype):
    """Resize `dim` of x to `dst` (`dtype`: the caller's, for the error message; x may be its f32 copy)."""
    src = x.shape[dim]
    if decide_eq(dst, src) is True:
        return x
    # (a named dim bound to 0: index_select's bounds check, at run)
    if decide_eq(src, 0) is True or decide_eq(dst, 0) is True:
        if decide_eq(src, 0) is True:
            raise ShapeMismatch(f"{op}: cannot upsample an empty dim {dim} ({shape_desc(x.shape, dtype)}) to {dst}")
        return x.narrow(dim, 0, 0)
    i0, i1, w0, w1 = _bilinear_taps(src, dst, align_corners)
    at = (1,) * dim + (dst,) + (1,) * (x.rank - dim - 1)
    w0 = w0.reshape(at).to_dtype(x.dtype)
    w1 = w1.reshape(at).to_dtype(x.dtype)
    a = x.index_select(i0, dim)
    b = x.index_select(i1, dim)
    return a.broadcast_mul(w0) + b.broadcast_mul(w1)


__all__ = ["ConvTransposeMixin", "im2col", "col2im"]
