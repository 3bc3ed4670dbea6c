"""Matmul: `matmul` (equal batch dims), `broadcast_matmul` and `@` (NumPy batch broadcasting,
either side).  Both operands become views with identical batch shapes (a broadcast side has
stride 0), so the runtime sees one uniform problem; no data is copied here."""
from __future__ import annotations

from .errors import DTypeMismatchBinaryOp, ShapeMismatchBinaryOp, UnsupportedDTypeForOp
from .ir.node import Node
from .ir.ops import OPS
from .named_dims import require, require_eq
from .sizes import has_size, same
from .tensor_views import broadcast_shapes

MATMUL_DTYPES = ("f32", "f64", "f16", "bf16", "f8e4m3", "i32", "i64", "u32", "i16", "u8")
_MATMUL, _COPY, _CONST = OPS["matmul"], OPS["copy"], OPS["const"]


class MatmulMixin:
    __slots__ = ()

    def _check_mm(self, other, op):
        # (node attributes, not the Tensor properties: an eager matmul often follows a kernel
        # that streamed the caches out, where each Python call costs misses)
        if not isinstance(other, type(self)):
            raise TypeError(f"{op}: expected a Tensor, got {type(other).__name__}")
        na, nb = self._node, other._node
        dt, sa, sb = na.dtype, na.shape, nb.shape
        if dt is not nb.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: dtype mismatch lhs {dt.name} rhs {nb.dtype.name} "
                                        f"(shapes {sa} and {sb})")
        if dt.name not in MATMUL_DTYPES:
            raise UnsupportedDTypeForOp(f"{op}: dtype {dt.name} is not supported")
        if len(sa) < 2 or len(sb) < 2:
            raise ShapeMismatchBinaryOp(f"{op}: needs rank >= 2 operands, got lhs {sa} rhs {sb} ({dt.name})")
        ka, kb = sa[-1], sb[-2]
        if ka.__class__ is int and kb.__class__ is int:
            if ka != kb:
                raise ShapeMismatchBinaryOp(f"{op}: inner dims differ, lhs {sa} rhs {sb} ({dt.name})")
            return None
        checks = []         # sizes of named dims: checked when they are bound
        require_eq(checks, ka, kb, ShapeMismatchBinaryOp, f"{op}: inner dims differ, lhs {sa} rhs {sb} ({dt.name})")
        return checks

    def _mm(self, other, batch, checks=None):
        na, nb = self._node, other._node
        if not same(na.shape[:-2], batch):
            na = self.broadcast_as(batch + na.shape[-2:])._node
        if not same(nb.shape[:-2], batch):
            nb = other.broadcast_as(batch + nb.shape[-2:])._node
        if (na._base or na).op is _CONST:       # (materializable() without the calls)
            na = Node(_COPY, (na,), None, na.shape, na.dtype)
        if (nb._base or nb).op is _CONST:
            nb = Node(_COPY, (nb,), None, nb.shape, nb.dtype)
        out = Node(_MATMUL, (na, nb), None, batch + (na.shape[-2], nb.shape[-1]), na.dtype)
        if checks:
            require(out, checks)
        return type(self)(out)

    def matmul(self, other):
        """Batched matmul; batch dims must be equal."""
        checks = self._check_mm(other, "matmul")
        message = (f"matmul: batch dims differ, lhs {self.shape} rhs {other.shape} "
                   f"({self.dtype.name}); use broadcast_matmul")
        ba, bb = self.shape[:-2], other.shape[:-2]
        if has_size(ba + bb) and len(ba) == len(bb):
            checks = checks or []
            for x, y in zip(ba, bb):
                require_eq(checks, x, y, ShapeMismatchBinaryOp, message)
        elif ba != bb:
            raise ShapeMismatchBinaryOp(message)
        return self._mm(other, ba, checks)

    def broadcast_matmul(self, other):
        """Matmul with NumPy broadcasting of the batch dims (either side)."""
        checks = self._check_mm(other, "broadcast_matmul")
        ba, bb = self._node.shape[:-2], other._node.shape[:-2]
        if same(ba, bb):
            return self._mm(other, ba, checks)
        checks = checks or []
        try:
            batch = broadcast_shapes(ba, bb, "broadcast_matmul", checks=checks)
        except Exception:
            raise ShapeMismatchBinaryOp(f"broadcast_matmul: batch dims of lhs {self.shape} and rhs {other.shape} "
                                        f"do not broadcast ({self.dtype.name})") from None
        return self._mm(other, batch, checks)
