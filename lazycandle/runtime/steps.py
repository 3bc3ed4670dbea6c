"""Kernels of their own: a node that is not fused (matmul, index and data-movement ops) runs as
one Step.  Each op kind registers a Step class here; the executor builds it once per plan and
calls `run_node` with the plan's buffers at run time.  A step never changes the scheduler's
Kernel: what the dump tool shows of it (reads, module, detail, backend) lives on the step."""
from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np

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
    """Base: resolves the node's operands to (buffer, Layout) at run time.  A step with
    `takes_scalars` also gets the plan's packed scalars: run_node(..., scalars)."""
    takes_scalars = False

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
    """BLAS or the tiled GEMM, chosen at run time by the backend setting.  With an epilogue
    (the kernel's fused elementwise consumers, ir/epilogue.py) the tiled GEMM applies it as it
    stores; after a BLAS GEMM it runs as the consumers' elementwise kernel, in place."""
    takes_scalars = True

    def setup(self, cap):
        from .matmul import choose_backend, geometry
        la, lb = self.operands[0][3], self.operands[1][3]
        self.out = self.kernel.outputs[0]
        ep = self.kernel.epilogue
        self.ep_key, self.ep_layouts, self.ep_reads, self.ep_step = None, (), (), None
        if ep is not None:
            self.ep_key = (ep.spec, ep.mm_input)
            self.ep_layouts = tuple(Layout(o.shape, o.strides, o.offset) for o in ep.operands)
            self.ep_reads = tuple((o.kind, o.src if o.kind == "in" else o.index, o.index, o.offset)
                                  for o in ep.operands)
        setting = config.get_matmul_backend()
        try:
            picked = choose_backend(geometry(la, lb, self.dtype, self.ep_layouts), setting, config.get_num_threads())
        except Exception:   # the runtime decides again at each call
            picked = setting
        self._describe(picked, setting)
        self.plans = {}       # (backend setting, threads) -> runtime.matmul plan
        self.last_plan = None

    def _describe(self, used, setting):
        self.backend = used if setting != "auto" else f"auto -> {used}"
        ep = self.kernel.epilogue
        if ep is not None:
            where = "in the tiled GEMM's store" if used == "tiled" else "as an in-place pass after the BLAS GEMM"
            self.detail = f"epilogue {', '.join(ep.ops)} applied {where}"

    def _epilogue_step(self):
        """The consumers' elementwise kernel, compiled on the first BLAS run."""
        if self.ep_step is None:
            from ..codegen import elementwise as ew
            from .executor import _compiled_step
            k = self.kernel.epilogue.kernel
            self.ep_step = _compiled_step(k, ew, prod(k.loop_shape), ew.parallel_extent(k.spec, k.loop_shape),
                                          k.spec.rank == 1 and k.spec.tile is None)
        return self.ep_step

    def run_node(self, in_bufs, offsets, bufs, scalars=None):
        from .matmul import plan_for, run_plan
        (ka, ia, sa, la, _), (kb, ib, sb, lb, _) = self.operands
        key = (config.get_matmul_backend(), config.get_num_threads())
        plan = self.plans.get(key)
        if plan is None:      # the layouts' shapes and strides are fixed for the plan's life
            plan = self.plans[key] = plan_for(la, lb, self.dtype, *key, self.ep_key, self.ep_layouts)
        a, oa = (in_bufs[sa], offsets[ia]) if ka == "in" else (bufs[ia], la.offset)
        b, ob = (in_bufs[sb], offsets[ib]) if kb == "in" else (bufs[ib], lb.offset)
        out = bufs[self.out]
        if plan is not self.last_plan:
            self.last_plan = plan
            self._describe(plan.backend, key[0])
        if self.ep_key is None:
            run_plan(plan, a, oa, b, ob, out)
            return
        extras = []
        for kind, buf, slot, offset in self.ep_reads:
            arr = in_bufs[buf] if kind == "in" else bufs[buf]
            extras.append(arr.ctypes.data + (offsets[slot] if kind == "in" else offset) * arr.itemsize)
        ek = self.kernel.epilogue.kernel
        if plan.backend == "tiled":
            scal = scalars[np.array(ek.scalars, np.intp)] if ek.scalars else np.zeros(1, np.int64)
            run_plan(plan, a, oa, b, ob, out, extras, scal.ctypes.data)
            return
        run_plan(plan, a, oa, b, ob, out)
        step = self._epilogue_step()
        if step is not None:
            addrs = list(extras)
            addrs.insert(self.kernel.epilogue.mm_input, out.ctypes.data)
            step.run(addrs + [out.ctypes.data], scalars)
