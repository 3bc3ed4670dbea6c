"""Matmul epilogue fusion (a scheduler pass): a matmul joins the elementwise kernel that
consumes it, so bias, activation and residual are applied as the tiled GEMM stores each output
tile (codegen/gemm_epilogue.py) and `(x @ w + b).gelu()` is one kernel, one pass over the output.

A matmul M fuses with the elementwise group G that reads it when
  * M is no target and every read of M is G's, element for element (same shape, contiguous,
    all by the same strides: size-1 dims may have any), or all by one contiguous reshape of M
    (nn.linear's merged rows read back as (b, t, n)): G's other operands are then restrided
    over M's shape (when strides can say it),
  * G writes one buffer (its last value), of M's dtype: the GEMM accumulates its partial sums
    in that buffer, so M's own value never needs one,
  * G reads at most MAX_INPUTS other operands (row vectors, broadcasts, a same-shape residual,
    any strides) and has at most MAX_EPILOGUE_OPS ops.
The merge cannot close a cycle: M's only consumer is G, so no path leaves M but through G.
When the BLAS path runs instead (runtime/steps.MatmulStep), the epilogue is the same fused
elementwise kernel, run in place over the output after the GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from ..layout import Layout
from .kernels import EwSpec
from .ops import ELEMENTWISE, MATMUL

MAX_INPUTS = 4             # operands besides the product (each takes 3 GEMM parameter slots)
MAX_EPILOGUE_OPS = 32      # epilogue code is emitted twice per micro-kernel (full tile, edge)


@dataclass(frozen=True)
class MatmulEpilogue:
    """What a matmul kernel applies to its product: `kernel` is the consumers' elementwise
    Kernel (its input `mm_input` reads the product); `operands` are the capture operands of its
    other inputs, in input order, with their layouts over the output."""
    kernel: object
    mm_input: int
    operands: tuple

    @property
    def spec(self) -> EwSpec:
        return self.kernel.spec

    @property
    def ops(self) -> list:
        return [ins[0] for ins in self.kernel.spec.instrs]


def _reads_identity(o, shape) -> bool:
    from .schedule import _identity_read
    return o.shape == shape and _identity_read(o, shape)


def _reads_in_order(o, shape) -> bool:
    """A read of the whole product in its own element order: the product itself, or a
    contiguous reshape of it (nn.linear's (b*t, n) product read as (b, t, n) by a residual add)."""
    if o.shape == shape:
        return _reads_identity(o, shape)
    return all(d.__class__ is int for d in o.shape + tuple(shape)) and prod(o.shape) == prod(shape) \
        and _reads_identity(o, o.shape)


def _over_product(o, shape):
    """Operand o (read over the consumers' shape) as an Operand over the product's shape: the
    same elements in the same order, restrided (None when strides cannot say it)."""
    if o.shape == shape:
        return o
    lay = Layout(o.shape, o.strides, o.offset).reshape(shape)
    return None if lay is None else replace(o, shape=tuple(lay.shape), strides=tuple(lay.strides), offset=lay.offset)


def fuse_epilogues(gr, nodes, operands, consumers, targets, notes) -> None:
    """Merge each matmul's group with its consumers' elementwise group where allowed."""
    for j, n in enumerate(nodes):
        if n.op.category != MATMUL or j in targets or not consumers[j]:
            continue
        groups = {gr.of[c] for c in consumers[j]}
        g = next(iter(groups))
        why = None
        if len(groups) > 1:
            why = "it is read by more than one kernel"
        elif any(nodes[y].op.category != ELEMENTWISE for y in gr.members[g]):
            why = "its consumer is not elementwise"
        elif not all(_reads_in_order(o, n.shape) for c in consumers[j] for o in operands[c]
                     if o.kind == "node" and o.index == j) \
                or len({(o.shape, o.strides) for c in consumers[j] for o in operands[c]
                        if o.kind == "node" and o.index == j}) > 1:
            why = "a consumer reads it through a view"      # (or by two strides of one walk: size-1 dims)
        else:
            members = set(gr.members[g])
            outs = [y for y in members if y in targets or any(gr.of[c] != g for c in consumers[y])]
            extra = {(o.kind, o.index, o.strides, o.offset) for y in members for o in operands[y]
                     if o.kind == "in" or (o.kind == "node" and o.index != j and o.index not in members)}
            if len(outs) != 1 or nodes[outs[0]].dtype is not n.dtype:
                why = "the consumers write more than one buffer, or another dtype"
            elif len(extra) > MAX_INPUTS:
                why = f"the consumers read more than {MAX_INPUTS} other operands"
            elif len(members) > MAX_EPILOGUE_OPS:
                why = f"the consumers have more than {MAX_EPILOGUE_OPS} ops"
            elif any(_over_product(o, n.shape) is None for y in members for o in operands[y]
                     if o.kind == "in" or (o.kind == "node" and o.index != j and o.index not in members)):
                why = "an operand of the consumers has no strides over the product's shape"
        if why:
            notes.append(f"n{j} (matmul) keeps its own kernel: {why}")
            continue
        g = gr.merge([gr.of[j], g], len(consumers[j]))
        notes.append(f"n{j} (matmul) fuses its consumers as an epilogue ({len(gr.members[g]) - 1} ops)")


def epilogue_kernel(cap, j, group, mat, fused_kernel, kernel_cls):
    """The Kernel of the group of matmul j and its epilogue (the other members, which may be
    older than j when they read only inputs): it reads the matmul's two operands and the
    epilogue's other inputs, and writes the epilogue's output."""
    rest = [y for y in group if y != j]
    ew = fused_kernel(cap, rest, mat)
    members, seen, order = set(rest), set(), []
    for y in rest:                      # the capture operand behind each input, in ew's order
        for o in cap.operands[y]:
            if o.kind == "const" or (o.kind == "node" and o.index in members and _reads_identity(o, cap.nodes[o.index].shape)):
                continue
            key = (("slot", o.index) if o.kind == "in" else ("node", o.index, o.offset), o.strides)
            if key not in seen:
                seen.add(key)
                order.append(o)
    mm_input = next(k for k, o in enumerate(order) if o.kind == "node" and o.index == j)
    extras = tuple(_over_product(o, cap.nodes[j].shape) for k, o in enumerate(order) if k != mm_input)
    reads = [("slot", o.index) if o.kind == "in" else ("node", o.index, o.offset)
             for o in cap.operands[j] if o.kind != "const"]
    kernel = kernel_cls("matmul", [j] + rest, list(ew.outputs),
                        reads + [b for k, b in enumerate(ew.inputs) if k != mm_input])
    kernel.epilogue = MatmulEpilogue(ew, mm_input, extras)
    return kernel
