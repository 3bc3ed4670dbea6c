"""Kernels of their own: a node that is not fused (matmul, index and data-movement ops) runs as
one Step.  Each op kind registers a Step class here; the executor builds it once per plan and
calls `run_node` with the plan's buffers at run time.  A step never changes the scheduler's
Kernel: what the dump tool shows of it (reads, module, detail, backend) lives on the step."""
from __future__ import annotations

from dataclasses import replace

from .. import config
from ..layout import Layout

STEPS: dict = {}


def register(*op_names):
    def deco(cls):
        for n in op_names:
            STEPS[n] = cls
        return cls
    return deco


class NodeStep:
    """Base: resolves the node's operands to (buffer, Layout) at run time.  A step whose
    `binds_layouts` is true takes its operand Layouts from the plan's Binding at each run
    (`run_node(..., layouts)`), so one plan serves every size of its size class; the others
    bake their sizes into a kernel spec at setup."""

    binds_layouts = False

    def __init__(self, kernel, cap):
        j = kernel.nodes[0]
        node = cap.nodes[j]
        self.out, self.dtype, self.shape, self.arg = j, node.dtype, node.shape, node.arg
        self.operands = []
        for o in cap.operands[j]:
            if o.kind == "const":
                raise TypeError(f"{node.op.name}: constant operands must be materialised by the Tensor API")
            src_dtype = cap.inputs[o.src].dtype if o.kind == "in" else cap.nodes[o.index].dtype
            self.operands.append((o.kind, o.index, o.src, Layout(o.shape, o.strides, o.offset), src_dtype))
        self.kernel = kernel
        self.reads = self.module = self.detail = self.backend = None
        self.setup(cap)

    def setup(self, cap):
        """Compile what the step needs (called once per plan)."""

    def operand(self, i, in_bufs, offsets, bufs, layouts=None):
        kind, idx, src, lay, _ = self.operands[i]
        if layouts is not None:
            lay = layouts[i]
        if kind == "in":
            return in_bufs[src], replace(lay, offset=offsets[idx])
        return bufs[idx], lay

    def run_node(self, in_bufs, offsets, bufs):
        raise NotImplementedError


@register("matmul")
class MatmulStep(NodeStep):
    """BLAS or the tiled GEMM, chosen at run time by the backend setting."""

    binds_layouts = True

    def setup(self, cap):
        from .matmul import choose_backend, geometry
        la, lb = self.operands[0][3], self.operands[1][3]
        setting = config.get_matmul_backend()
        try:
            picked = choose_backend(geometry(la, lb, self.dtype), setting)
        except Exception:   # the runtime decides again at each call
            picked = setting
        self.backend = picked if setting != "auto" else f"auto -> {picked}"

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        from .matmul import matmul
        a, la = self.operand(0, in_bufs, offsets, bufs, layouts)
        b, lb = self.operand(1, in_bufs, offsets, bufs, layouts)
        setting = config.get_matmul_backend()
        used = matmul(a, la, b, lb, bufs[self.out], self.dtype, setting)
        self.backend = used if setting != "auto" else f"auto -> {used}"
