"""Matmul: `matmul` (equal batch dims), `broadcast_matmul` and `@` (NumPy batch broadcasting,
either side).  Both operands become views with identical batch shapes (a broadcast side has
stride 0), so the runtime sees one uniform problem; no data is copied here."""
from __future__ import annotations

from .errors import DTypeMismatchBinaryOp, ShapeMismatchBinaryOp, UnsupportedDTypeForOp
from .ir.node import Node
from .ir.ops import OPS
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
        if sa[-1] != sb[-2]:
            raise ShapeMismatchBinaryOp(f"{op}: inner dims differ, lhs {sa} rhs {sb} ({dt.name})")

    def _mm(self, other, batch):
        na, nb = self._node, other._node
        if na.shape[:-2] != batch:
            na = self.broadcast_as(batch + na.shape[-2:])._node
        if nb.shape[:-2] != batch:
            nb = other.broadcast_as(batch + nb.shape[-2:])._node
        if (na._base or na).op is _CONST:       # (materializable() without the calls)
            na = Node(_COPY, (na,), None, na.shape, na.dtype)
        if (nb._base or nb).op is _CONST:
            nb = Node(_COPY, (nb,), None, nb.shape, nb.dtype)
        return type(self)(Node(_MATMUL, (na, nb), None, batch + (na.shape[-2], nb.shape[-1]), na.dtype))

    def matmul(self, other):
        """Batched matmul; batch dims must be equal."""
        self._check_mm(other, "matmul")
        if self.shape[:-2] != other.shape[:-2]:
            raise ShapeMismatchBinaryOp(f"matmul: batch dims differ, lhs {self.shape} rhs {other.shape} "
                                        f"({self.dtype.name}); use broadcast_matmul")
        return self._mm(other, self.shape[:-2])

    def broadcast_matmul(self, other):
        """Matmul with NumPy broadcasting of the batch dims (either side)."""
        self._check_mm(other, "broadcast_matmul")
        ba, bb = self._node.shape[:-2], other._node.shape[:-2]
        if ba == bb:
            return self._mm(other, ba)
        try:
            batch = broadcast_shapes(ba, bb, "broadcast_matmul")
        except Exception:
            raise ShapeMismatchBinaryOp(f"broadcast_matmul: batch dims of lhs {self.shape} and rhs {other.shape} "
                                        f"do not broadcast ({self.dtype.name})") from None
        return self._mm(other, batch)
