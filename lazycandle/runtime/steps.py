"""Kernels of their own: a node that is not fused (matmul, index and data-movement ops) runs as
one Step.  Each op kind registers a Step class here; the executor builds it once per plan and
calls `run_node` with the plan's buffers at run time.  A step never changes the scheduler's
Kernel: what the dump tool shows of it (reads, module, detail, backend) lives on the step."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

import ctypes

from .. import caches, config
from ..layout import Layout
from . import native_pool
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

    @classmethod
    def ahead(cls, kernel, cap):
        """(kernel cache, spec) pairs of what the step of `kernel` will compile, listed before
        the plan's steps are set up so the compile threads take them beside the fused kernels
        (codegen/compile_pool.prefetch); a guess that misses only costs a compile."""
        return ()

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


def operand_address(buf, lay) -> int:
    return address(buf) + lay.offset * buf.itemsize


class Reads:
    """What the dump tool's schedule stage lists for a kernel's inputs: (dtype, strides) each."""

    def __init__(self, operands):
        self.inputs = tuple((dt.name, lay.strides) for _, _, _, lay, dt in operands)


class Modules:
    """Several compiled modules shown as one by the dump tool (`llvm` / `asm` stages)."""

    def __init__(self, cms):
        self.cms = cms
        self.ir_text = "\n".join(cm.ir_text for cm in cms)

    def asm(self):
        return "\n".join(cm.asm() for cm in self.cms)


class Launch:
    """One kernel call at one binding's sizes: the compiled function (None: nothing to run),
    its sizes array, units and cost per unit.  The kernel takes the standard arguments
    (pointers, sizes, no scalars, unit range), so the native program can call it too."""
    __slots__ = ("spec", "fn", "fn_addr", "sizes", "units", "unit_cost", "module")

    def __init__(self, spec, sizes, units, unit_cost, fn):
        self.spec, self.units, self.unit_cost, self.fn = spec, units, unit_cost, fn
        self.sizes = np.array(sizes or (0,), np.int64)
        self.module = fn._module if fn is not None else None
        self.fn_addr = native_pool.fn_address(fn) if fn is not None else 0

    @classmethod
    def of_spec(cls, spec, sizes, runs=True):
        """The launch of a spec that knows its extent, unit cost and compiled function."""
        units = spec.extent(sizes) if runs else 0
        return cls(spec, sizes, units, spec.unit_cost(sizes) if units else 0.0,
                   spec.compiled() if units > 0 else None)

    def run(self, addrs) -> None:
        if self.fn is None:
            return
        arr = (ctypes.c_void_p * len(addrs))(*addrs)
        native_pool.launch(self.fn, self.fn_addr, ctypes.addressof(arr), address(self.sizes), None, 0, self.units,
                           self.unit_cost)
        del arr


class KeptByLayouts:
    """`make(layouts)` kept per the layouts' shapes and strides: what one binding's sizes need,
    made once per size (at most KEPT; a full cache starts over)."""
    KEPT = 16

    def __init__(self, make):
        self.make, self.got = make, {}

    def __call__(self, layouts):
        key = tuple((lay.shape, lay.strides) for lay in layouts)
        got = self.got.get(key)
        if got is None:
            if len(self.got) >= self.KEPT:
                self.got.clear()
            got = self.got[key] = self.make(layouts)
        return got


class SizedStep(NodeStep):
    """A node step whose kernels take their sizes at run time: `prepare(layouts)` makes (and
    keeps, per operand shapes and strides) what one binding's sizes need, so one plan serves
    every size of its size class (binds_layouts).  A step of one kernel call says what its
    pointers are in `kernel_buffers` -- ("node", j): node j's buffer, ("operand", n): operand
    n at its offset, ("status",): a status word [flag, value] -- and `launch_of(prepared)`
    gives its Launch; the native program then calls that kernel in a segment, and `run_node`
    here is its per-kernel form.  Steps of several calls leave kernel_buffers None."""
    binds_layouts = True
    kernel_buffers = None

    def setup(self, cap):
        self.reads = Reads(self.operands)
        self.prepare = KeptByLayouts(self.make)     # prepare(layouts): make's result, per size
        first = self.prepare(self.layouts())
        launches = self.launches(first)
        self.spec = launches[0].spec if len(launches) == 1 else None     # at the plan's own sizes
        mods = [ln.module for ln in launches if ln.module is not None]
        self.module = mods[0] if len(mods) == 1 else (Modules(mods) if mods else None)
        self.detail = self.describe(first)

    def layouts(self, layouts=None):
        return layouts if layouts is not None else [o[3] for o in self.operands]

    def launches(self, prepared):
        return [self.launch_of(prepared)]

    def launch_of(self, prepared) -> Launch:
        return prepared

    def make(self, layouts):
        raise NotImplementedError

    def sizes_source(self, i, layouts, own):
        """Lines setting s<i>, e<i>, c<i> (sizes tuple, units, cost per unit) from `layouts`'
        (shape tokens, stride tokens), returning None where the binding needs another kernel
        than `own` (the program's Launch) or make would raise; None: no such form (the direct
        binder calls prepare on Layouts)."""
        return None

    def describe(self, prepared) -> str:
        return ""

    def raise_status(self, value: int, layouts=None):
        """The typed error of a kernel that set its status word, with `value` from it."""
        raise AssertionError(f"{type(self).__name__}: its kernel set a status word it does not explain")

    def run_node(self, in_bufs, offsets, bufs, layouts=None):
        layouts = self.layouts(layouts)
        launch = self.launch_of(self.prepare(layouts))
        if launch.fn is None:
            return
        status, addrs = None, []
        for item in self.kernel_buffers:
            if item[0] == "node":
                addrs.append(address(bufs[item[1]]))
            elif item[0] == "operand":
                addrs.append(operand_address(*self.operand(item[1], in_bufs, offsets, bufs, layouts)))
            else:
                status = np.zeros(2, np.int64)
                addrs.append(address(status))
        launch.run(addrs)
        if status is not None and status[0]:
            self.raise_status(int(status[1]), layouts)


def _matmul_kernels(dtype, la, lb, epilogue, ep_layouts) -> tuple:
    """MatmulStep.ahead's kernels for one problem (a tuple: kept in _AHEAD)."""
    from . import matmul, matmul_skinny
    from ..codegen import gemm, gemm_epilogue
    g = matmul.geometry(la, lb, dtype, ep_layouts)
    setting = config.get_matmul_backend()
    if setting == "blas" and matmul.blas_ok(g):
        return ()
    f = matmul_skinny._fold_batch(g)
    skinny = setting == "auto" and matmul_skinny.layout_of(f) is not None     # by rule, or measured
    got = [matmul_skinny.spec_of(f)] if skinny else []
    if not skinny or f.m > matmul_skinny.RULE_M:
        got.append((gemm.get_kernel, gemm.tiled_spec(dtype)))
    if epilogue is not None:
        got.append((gemm_epilogue.get_kernel, matmul.epilogue_spec(epilogue, g)))
    return tuple(got)


_AHEAD: dict = caches.register("matmul kernels listed ahead", {})   # by problem (a program's layers repeat theirs)
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

    @classmethod
    def ahead(cls, kernel, cap):
        """The GEMM kernels the step measures or runs and its epilogue: the small-m kernel where
        it takes the shape by rule or is measured, the tiled GEMM (its module holds the shared-B
        packer) where that is not by rule; nothing when BLAS is set.  (A remembered auto choice
        of BLAS is not asked for: the tiled GEMM it was measured against is then on disk
        already, and prefetch skips it.)"""
        node, ep = cap.nodes[kernel.nodes[0]], kernel.epilogue
        try:
            la, lb = (Layout(o.shape, o.strides, o.offset) for o in cap.operands[kernel.nodes[0]])
            ep_layouts = tuple(Layout(o.shape, o.strides, o.offset) for o in ep.operands) if ep else ()
            key = (node.dtype, la.shape, la.strides, lb.shape, lb.strides, (ep.spec, ep.mm_input) if ep else None,
                   tuple((e.shape, e.strides) for e in ep_layouts), config._matmul_backend, config._num_threads)
            got = _AHEAD.get(key)
            if got is None:
                if len(_AHEAD) >= 256:
                    _AHEAD.clear()
                got = _AHEAD[key] = _matmul_kernels(node.dtype, la, lb, key[5], ep_layouts)
            return got
        except Exception:   # noqa: BLE001  (the step's setup raises what is wrong)
            return ()

    def setup(self, cap):
        from . import matmul     # (lazily: it loads the GEMM codegen; kept for run_node, where an
        self.mm = matmul         # import statement costs importlib calls at every run)
        backend_for, geometry = matmul.backend_for, matmul.geometry
        la, lb = self.operands[0][3], self.operands[1][3]
        self.out = self.kernel.outputs[0]
        ep = self.kernel.epilogue
        self.binds_layouts = True       # a binding's layouts: a, b, then the epilogue's operands
        self.ep_key, self.ep_layouts, self.ep_reads, self.ep_steps = None, (), (), {}
        if ep is not None:
            self.ep_key = (ep.spec, ep.mm_input)
            self.ep_layouts = tuple(Layout(o.shape, o.strides, o.offset) for o in ep.operands)
            self.ep_reads = tuple((o.kind, o.src if o.kind == "in" else o.index, o.index)
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

    def _epilogue_step(self, out_shape, ep_layouts):
        """The consumers' elementwise kernel at this binding (the Step and its sizes), run over
        the output after a BLAS GEMM; compiled on the first BLAS run of its merged form."""
        from ..ir.kernels import rebound_ew
        from ..layout import contiguous_strides
        ep = self.kernel.epilogue
        strides = [lay.strides for lay in ep_layouts]
        strides.insert(ep.mm_input, contiguous_strides(out_shape))
        spec, sizes = rebound_ew(ep.spec, out_shape, strides)
        got = self.ep_steps.get(spec)
        if got is None:
            from dataclasses import replace as with_spec
            from .executor import Step
            k = with_spec(ep.kernel, spec=spec)
            got = self.ep_steps[spec] = Step(k, spec.rank == 1 and spec.tile is None)
        extent = spec.extent(sizes)
        return got, (sizes, extent, spec.cost(sizes) / (extent or 1))

    def _plan(self, la, lb, ep_layouts=()):
        key = (config._matmul_backend, config._num_threads, la.shape, la.strides, lb.shape, lb.strides,
               tuple((e.shape, e.strides) for e in ep_layouts))
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= MATMUL_PLANS_KEPT:
                self.plans.clear()
            plan = self.plans[key] = self.mm.plan_for(la, lb, self.dtype, key[0], key[1], self.ep_key, ep_layouts)
        return plan

    def plan_at(self, layouts):
        """The runtime.matmul plan this step runs at a binding's operand layouts."""
        return self._plan(layouts[0], layouts[1], tuple(layouts[2:]))

    def native_plan(self, layouts):
        """The small-m plan this step runs at a binding's operand layouts, or None: that kernel
        takes the standard kernel arguments, so the native program can call it in a phase."""
        plan = self._plan(layouts[0], layouts[1], tuple(layouts[2:]))
        return plan if plan.backend == "skinny" else None

    def run_node(self, in_bufs, offsets, bufs, layouts=None, scalars=None):
        run_plan = self.mm.run_plan
        (ka, ia, sa, la, _), (kb, ib, sb, lb, _) = self.operands
        ep_layouts = self.ep_layouts
        if layouts is not None:             # this run's sizes (a plan bound to another size)
            la, lb, ep_layouts = layouts[0], layouts[1], tuple(layouts[2:])
        plan = self._plan(la, lb, ep_layouts)
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
        for (kind, buf, slot), lay in zip(self.ep_reads, ep_layouts):
            arr = in_bufs[buf] if kind == "in" else bufs[buf]
            extras.append(address(arr) + (offsets[slot] if kind == "in" else lay.offset) * arr.itemsize)
        ek = self.kernel.epilogue.kernel
        if plan.backend in FUSED_BACKENDS:
            scal = scalars[np.array(ek.scalars, np.intp)] if ek.scalars else np.zeros(1, np.int64)
            run_plan(plan, a, oa, b, ob, out, extras, address(scal))
            return
        run_plan(plan, a, oa, b, ob, out)
        step, sized = self._epilogue_step(plan_out_shape(la, lb), ep_layouts)
        if sized[1]:
            addrs = list(extras)
            addrs.insert(self.kernel.epilogue.mm_input, address(out))
            step.run(addrs + [address(out)], scalars, sized)


def plan_out_shape(la, lb) -> tuple:
    """The shape of la @ lb."""
    return tuple(la.shape[:-1]) + (lb.shape[-1],)
