"""Matmul: `matmul` (equal batch dims), `broadcast_matmul` and `@` (NumPy batch broadcasting,
either side).  Both operands become views with identical batch shapes (a broadcast side has
stride 0), so the runtime sees one uniform problem; no data is copied here."""
from __future__ import annotations

from .errors import DTypeMismatchBinaryOp, ShapeMismatchBinaryOp, UnsupportedDTypeForOp
from .ir.node import Node
from .tensor_views import broadcast_shapes

MATMUL_DTYPES = ("f32", "f64", "f16", "bf16", "f8e4m3", "i32", "i64", "u32", "i16", "u8")


class MatmulMixin:
    __slots__ = ()

    def _check_mm(self, other, op):
        T = type(self)
        if not isinstance(other, T):
            raise TypeError(f"{op}: expected a Tensor, got {type(other).__name__}")
        if self.dtype is not other.dtype:
            raise DTypeMismatchBinaryOp(f"{op}: dtype mismatch lhs {self.dtype.name} rhs {other.dtype.name} "
                                        f"(shapes {self.shape} and {other.shape})")
        if self.dtype.name not in MATMUL_DTYPES:
            raise UnsupportedDTypeForOp(f"{op}: dtype {self.dtype.name} is not supported")
        if self.rank < 2 or other.rank < 2:
            raise ShapeMismatchBinaryOp(f"{op}: needs rank >= 2 operands, got lhs {self.shape} rhs {other.shape} "
                                        f"({self.dtype.name})")
        if self.shape[-1] != other.shape[-2]:
            raise ShapeMismatchBinaryOp(f"{op}: inner dims differ, lhs {self.shape} rhs {other.shape} "
                                        f"({self.dtype.name})")

    def _mm(self, other, batch):
        a = (self if self.shape[:-2] == batch else self.broadcast_as(batch + self.shape[-2:])).materializable()
        b = (other if other.shape[:-2] == batch else other.broadcast_as(batch + other.shape[-2:])).materializable()
        shape = batch + (self.shape[-2], other.shape[-1])
        return type(self)(Node("matmul", (a._node, b._node), None, shape, self.dtype))

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
        try:
            batch = broadcast_shapes(self.shape[:-2], other.shape[:-2], "broadcast_matmul")
        except Exception:
            raise ShapeMismatchBinaryOp(f"broadcast_matmul: batch dims of lhs {self.shape} and rhs {other.shape} "
                                        f"do not broadcast ({self.dtype.name})") from None
        return self._mm(other, batch)
