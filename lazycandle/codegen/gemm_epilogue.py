"""Epilogue of the tiled GEMM: the elementwise consumers of a matmul (bias add, activation,
residual add, ...) evaluated on each output tile as the micro-kernel stores it after the last KC
block, so `(x @ w + b).gelu()` writes its output once and never reads the product back.

The epilogue is an instruction DAG of the fused elementwise kernels (ir/kernels.EwSpec), emitted
with codegen/elementwise's `_emit_instrs`: one of its inputs is the matmul result (the rounded
storage value, so fusing never changes a value), the others are operands read at the tile's
(row, col) through their own strides: a row stride passed at run time and a column stride whose
class (0 broadcast, 1 unit, or a runtime stride) the kernel is compiled for.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import llvmlite.ir as ir

from .. import dtype as D
from ..ir.epilogue import MAX_INPUTS
from ..ir.kernels import RUNTIME, EwSpec
from .elementwise import _emit_instrs, load_scalars
from .gemm_ir import I64, i64, load, mul, add, storage_type, vload
from .llvmutil import splat

@dataclass(frozen=True)
class Epilogue:
    """ew: the DAG (rank 2 over (m, n), one output of the matmul's dtype); mm_input: which of
    its inputs is the matmul result; cols: each input's column stride class (the matmul
    result's entry is unused)."""
    ew: EwSpec
    mm_input: int
    cols: tuple

    @property
    def extras(self) -> list:
        """Input indices other than the matmul result, in parameter order."""
        return [k for k in range(len(self.ew.inputs)) if k != self.mm_input]

    @property
    def key(self) -> str:
        return "ep" + hashlib.sha1(repr(self).encode()).hexdigest()[:12]


def arg_types(ep: Epilogue) -> list:
    """The micro-kernel's extra arguments: the scalars (i64*), then per extra input its tile
    pointer, row stride and column stride."""
    out = [I64.as_pointer()]
    for k in ep.extras:
        out += [storage_type(D.DType.from_name(ep.ew.inputs[k][0])).as_pointer(), I64, I64]
    return out


class Emitter:
    """Emits the epilogue inside the micro-kernel: `args` are its extra arguments (arg_types)."""

    def __init__(self, b: ir.IRBuilder, ep: Epilogue, args):
        self.b, self.ep = b, ep
        self.scalars = load_scalars(b, args[0], ep.ew.scalars)
        self.inputs = {k: tuple(args[1 + 3 * i: 4 + 3 * i]) for i, k in enumerate(ep.extras)}

    def _scalar(self, k, w):
        # splatted where used, not cached: the uses sit in branches that do not dominate each other
        return splat(self.b, self.scalars[k], w)

    def _load(self, k, row, col, w):
        """Raw storage value(s) of extra input k at tile element (row, col ...col + w)."""
        b = self.b
        ptr, rs, cs = self.inputs[k]
        eb = D.DType.from_name(self.ep.ew.inputs[k][0]).size_in_bytes
        cls = self.ep.cols[k]
        if cls == 0 or w == 1:
            off = mul(b, row, rs) if cls == 0 else add(b, mul(b, row, rs), mul(b, col, cs))
            return splat(b, load(b, ptr, off, eb), w)
        if cls == 1:
            return vload(b, ptr, add(b, mul(b, row, rs), col), w, eb)
        v = ir.Constant(ir.VectorType(ptr.type.pointee, w), ir.Undefined)
        base = add(b, mul(b, row, rs), mul(b, col, cs))
        for lane in range(w):
            v = b.insert_element(v, load(b, ptr, add(b, base, mul(b, i64(lane), cs)), eb), i64(lane))
        return v

    def apply(self, value, row, col, w):
        """The epilogue's output (storage representation) for the matmul's stored value(s)
        `value` at tile element (row, col), w lanes along the row."""
        def load_input(k):
            return value if k == self.ep.mm_input else self._load(k, row, col, w)
        return _emit_instrs(self.b, self.ep.ew, load_input, w, self._scalar)[0]


def col_class(stride: int):
    return stride if stride in (0, 1) else RUNTIME
