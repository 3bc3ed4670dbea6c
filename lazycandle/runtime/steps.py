"""Kernels of their own: a node that is not fused (matmul, index and data-movement ops) runs as
one Step.  Each op kind registers a Step class here; the executor builds it once per plan and
calls `run_node` with the plan's buffers at run time.  A step never changes the scheduler's
Kernel: what the dump tool shows of it (reads, module, detail, backend) lives on the step."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import config
from ..layout import Layout
from .buffers import address

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
    (`run_node(..., layouts=)`), so one plan serves every size of its size class; the others
    bake their sizes into a kernel spec at setup.  A step with `takes_scalars` also gets the
    plan's packed scalars (`run_node(..., scalars=)`); `run_step` passes each what it takes."""

    binds_layouts = False
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

    def operand(self, i, in_bufs, offsets, bufs, layouts=None):
        kind, idx, src, lay, _ = self.operands[i]
        if layouts is not None:
            lay = layouts[i]
        if kind == "in":
            return in_bufs[src], replace(lay, offset=offsets[idx])
        return bufs[idx], lay

    def run_node(self, in_bufs, offsets, bufs):
        raise NotImplementedError


FUSED_BACKENDS = ("tiled", "skinny")     # matmul kernels that apply the epilogue as they store
MATMUL_PLANS_KEPT = 16      # a step's matmul plans (one per backend, threads and bound shape)


def run_step(step, in_bufs, offsets, bufs, layouts, scalars) -> None:
    """Run node step `step` with what it takes: the binding's layouts, the packed scalars."""
    kw = {}
    if step.binds_layouts:
        kw["layouts"] = layouts
    if step.takes_scalars:
        kw["scalars"] = scalars
    step.run_node(in_bufs, offsets, bufs, **kw)


@register("matmul")
class MatmulStep(NodeStep):
    """BLAS, the tiled GEMM or the small-m GEMM, chosen at run time by the backend setting.
    With an epilogue (the kernel's fused elementwise consumers, ir/epilogue.py) the tiled and
    small-m GEMMs apply it as they store; after a BLAS GEMM it runs as the consumers' elementwise kernel, in place."""
    takes_scalars = True

    def setup(self, cap):
        from . import matmul     # (lazily: it loads the GEMM codegen; kept for run_node, where an
        self.mm = matmul         # import statement costs importlib calls at every run)
        backend_for, geometry = matmul.backend_for, matmul.geometry
        la, lb = self.operands[0][3], self.operands[1][3]
        self.out = self.kernel.outputs[0]
        ep = self.kernel.epilogue
        self.binds_layouts = ep is None       # an epilogue's operand layouts are baked at setup
        self.ep_key, self.ep_layouts, self.ep_reads, self.ep_step = None, (), (), None
        if ep is not None:
            self.ep_key = (ep.spec, ep.mm_input)
            self.ep_layouts = tuple(Layout(o.shape, o.strides, o.offset) for o in ep.operands)
            self.ep_reads = tuple((o.kind, o.src if o.kind == "in" else o.index, o.index, o.offset)
                                  for o in ep.operands)
        setting = config.get_matmul_backend()
        try:
            picked = backend_for(geometry(la, lb, self.dtype, self.ep_layouts), setting, config.get_num_threads())
        except Exception:   # the runtime decides again at each call
            picked = setting
        self._describe(picked, setting)
        self.plans = {}       # (backend setting, threads) -> runtime.matmul plan
        self.last_plan = None

    def _describe(self, used, setting):
        self.backend = used if setting != "auto" else f"auto -> {used}"
        ep = self.kernel.epilogue
        if ep is not None:
            where = (f"in the {used} GEMM's store" if used in FUSED_BACKENDS
                     else "as an in-place pass after the BLAS GEMM")
            self.detail = f"epilogue {', '.join(ep.ops)} applied {where}"

    def _epilogue_step(self):
        """The consumers' elementwise kernel, compiled on the first BLAS run."""
        if self.ep_step is None:
            from .executor import Step
            k = self.kernel.epilogue.kernel
            sizes = tuple(k.sizes)
            extent = k.spec.extent(sizes)
            self.ep_step = (Step(k, k.spec.rank == 1 and k.spec.tile is None),
                            (sizes, extent, k.spec.cost(sizes) / (extent or 1)))
        return self.ep_step

    def _plan(self, la, lb):
        key = (config._matmul_backend, config._num_threads, la.shape, la.strides, lb.shape, lb.strides)
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= MATMUL_PLANS_KEPT:
                self.plans.clear()
            plan = self.plans[key] = self.mm.plan_for(la, lb, self.dtype, key[0], key[1], self.ep_key,
                                                      self.ep_layouts)
        return plan

    def native_plan(self, layouts):
        """The small-m plan this step runs at a binding's operand layouts, or None: that kernel
        takes the standard kernel arguments, so the native program can call it in a phase."""
        la, lb = (layouts[0], layouts[1]) if self.binds_layouts else (self.operands[0][3], self.operands[1][3])
        plan = self._plan(la, lb)
        return plan if plan.backend == "skinny" else None

    def run_node(self, in_bufs, offsets, bufs, layouts=None, scalars=None):
        run_plan = self.mm.run_plan
        (ka, ia, sa, la, _), (kb, ib, sb, lb, _) = self.operands
        if layouts is not None:             # this run's sizes (a plan bound to another size)
            la, lb = layouts[0], layouts[1]
        plan = self._plan(la, lb)
        a, oa = (in_bufs[sa], offsets[ia]) if ka == "in" else (bufs[ia], la.offset)
        b, ob = (in_bufs[sb], offsets[ib]) if kb == "in" else (bufs[ib], lb.offset)
        out = bufs[self.out]
        if plan is not self.last_plan:
            self.last_plan = plan
            self._describe(plan.backend, config.get_matmul_backend())
        if self.ep_key is None:
            run_plan(plan, a, oa, b, ob, out)
            return
        extras = []
        for kind, buf, slot, offset in self.ep_reads:
            arr = in_bufs[buf] if kind == "in" else bufs[buf]
            extras.append(address(arr) + (offsets[slot] if kind == "in" else offset) * arr.itemsize)
        ek = self.kernel.epilogue.kernel
        if plan.backend in FUSED_BACKENDS:
            scal = scalars[np.array(ek.scalars, np.intp)] if ek.scalars else np.zeros(1, np.int64)
            run_plan(plan, a, oa, b, ob, out, extras, address(scal))
            return
        run_plan(plan, a, oa, b, ob, out)
        step, sized = self._epilogue_step()
        if sized[1]:
            addrs = list(extras)
            addrs.insert(self.kernel.epilogue.mm_input, address(out))
            step.run(addrs + [address(out)], scalars, sized)
