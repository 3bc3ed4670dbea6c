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
    """Base: resolves the node's operands to (buffer, Layout) at run time."""

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

    def operand(self, i, in_bufs, offsets, bufs):
        kind, idx, src, lay, _ = self.operands[i]
        if kind == "in":
            return in_bufs[src], replace(lay, offset=offsets[idx])
        return bufs[idx], lay

    def run_node(self, in_bufs, offsets, bufs):
        raise NotImplementedError


@register("matmul")
class MatmulStep(NodeStep):
    """BLAS or the tiled GEMM, chosen at run time by the backend setting."""

    def setup(self, cap):
        from .matmul import choose_backend, geometry
        la, lb = self.operands[0][3], self.operands[1][3]
        setting = config.get_matmul_backend()
        try:
            picked = choose_backend(geometry(la, lb, self.dtype), setting)
        except Exception:   # the runtime decides again at each call
            picked = setting
        self.backend = picked if setting != "auto" else f"auto -> {picked}"
        self.plans = {}       # (backend setting, threads) -> runtime.matmul plan

    def run_node(self, in_bufs, offsets, bufs):
        from .matmul import plan_for, run_plan
        (ka, ia, sa, la, _), (kb, ib, sb, lb, _) = self.operands
        key = (config.get_matmul_backend(), config.get_num_threads())
        plan = self.plans.get(key)
        if plan is None:      # the layouts' shapes and strides are fixed for the plan's life
            plan = self.plans[key] = plan_for(la, lb, self.dtype, *key)
        a, oa = (in_bufs[sa], offsets[ia]) if ka == "in" else (bufs[ia], la.offset)
        b, ob = (in_bufs[sb], offsets[ib]) if kb == "in" else (bufs[ib], lb.offset)
        run_plan(plan, a, oa, b, ob, bufs[self.out])
        self.backend = plan.backend if key[0] != "auto" else f"auto -> {plan.backend}"
