"""The executor: a Plan (the driver's scheduled, compiled kernels with their buffer bindings
and memory plan) and how it runs.  The driver (lazycandle/compiler.py) builds and caches Plans;
the runtime only executes them."""
from __future__ import annotations

import ctypes
from math import prod
from time import perf_counter

import numpy as np

from .. import config
from ..layout import Layout
from . import arena, native_pool
from .buffers import address, alloc
from .steps import STEPS, NodeStep, run_step


def pack_scalars(scalars) -> np.ndarray:
    """The capture's scalar slots [(value, DType)] as the kernels read them: 8-byte slots, f64
    bits for float scalars (exact: the value is already rounded to its dtype), i64 for ints."""
    packed = np.empty(len(scalars), np.int64)
    as_f64 = packed.view(np.float64)
    for k, (v, dt) in enumerate(scalars):
        if dt.is_float:
            as_f64[k] = v
        else:
            packed[k] = v if v < 1 << 63 else v - (1 << 64)
    return packed


class Step:
    """One compiled kernel call: which of the plan's scalars it takes and how to split it.  Its
    sizes, extent and cost come from the Binding it runs with; the kernel is compiled on first
    use (a plan bound only to empty sizes compiles nothing)."""

    def __init__(self, kernel, vector_units):
        self.kernel, self.spec = kernel, kernel.spec
        self.lanes = kernel.spec.lanes()
        self.align = self.lanes if vector_units else 1
        self.scalar_index = np.array(kernel.scalars, np.intp) if kernel.scalars else None
        self._fn = self._fn_addr = None

    @property
    def fn(self):
        if self._fn is None:
            self._fn = self.spec.compiled()
            self._fn_addr = native_pool.fn_address(self._fn)
        return self._fn

    @property
    def module(self):
        """The compiled module (for the dump tool's llvm / asm stages)."""
        return self.fn._module

    def run(self, addrs, packed_scalars, sized):
        sizes, extent, cost = sized
        arr = (ctypes.c_void_p * len(addrs))(*addrs)
        base = ctypes.addressof(arr)
        scal = packed_scalars[self.scalar_index] if self.scalar_index is not None else None
        scal_ptr = address(scal) if scal is not None else None
        fn = self.fn
        sizes = np.array(sizes, np.int64)
        native_pool.launch(fn, self._fn_addr, base, address(sizes), scal_ptr, 0, extent, cost, self.align)


_native_exec = None      # runtime/native_exec, imported at the first native run (not at import lazycandle)


def _import_native_exec():
    """Import native_exec once: an import statement per new binding costs more than binding it."""
    global _native_exec
    from . import native_exec
    _native_exec = native_exec
    return native_exec


class Binding:
    """The size-dependent part of a Plan for one capture's sizes: per step, (sizes tuple,
    extent, cost per unit) of a fused kernel or the operand Layouts of a node step; per
    kernel, the element offsets of its node reads; per node buffer, its element count.  A
    Plan builds its own from its kernels, and `Plan.bind_values` one from the flat
    `quantities` a symbolic binder evaluates for other sizes of the plan's size class."""
    __slots__ = ("steps", "read_offsets", "numels", "native")

    def __init__(self, steps, read_offsets, numels):
        self.steps, self.read_offsets, self.numels = steps, read_offsets, numels
        self.native = None       # its whole-program form (native_exec.NativePlan), once the plan runs natively


def _node_step(op_name, kind):
    """The NodeStep class running op `op_name`.  The index, conv, sort and scan steps register
    on the first plan that needs one (their kernel modules are not part of `import lazycandle`)."""
    from . import attention_steps, conv_steps, index_steps, sort_steps  # noqa: F401  (register the steps)
    if op_name not in STEPS:
        raise NotImplementedError(f"kernel kind {kind} ({op_name})")
    return STEPS[op_name]


def bound_operands(k, cap) -> list:
    """The operands whose Layouts a node step of kernel `k` takes from a Binding, in order: its
    node's non-constant operands, then (a matmul with an epilogue) the epilogue's other inputs."""
    ops = [o for o in cap.operands[k.nodes[0]] if o.kind != "const"]
    return ops + list(k.epilogue.operands) if k.epilogue is not None else ops


def describe(cap):
    """Node-free description of a capture: inputs, nodes (op, arg, shape, dtype, operands), targets."""
    ins = [("placeholder" if n.op.name == "placeholder" else "buffer", n.arg if n.op.name == "placeholder" else None,
            n.shape, n.dtype) for n in cap.inputs]
    nodes = [(n.op.name, n.arg, n.shape, n.dtype, ops) for n, ops in zip(cap.nodes, cap.operands)]
    return {"inputs": ins, "nodes": nodes, "targets": list(cap.targets), "slots": list(cap.slots)}


def _ahead(kernels, cap):
    """What the plan's kernels compile, in the order the plan needs them: first what each node
    step lists ahead of its setup (steps.NodeStep.ahead: setups compile their kernels, or time
    them, while the plan is built), then the fused kernels that run at the plan's own sizes
    (an empty one never does), in plan order."""
    for k in kernels:
        if k.spec is None:
            yield from _node_step(cap.nodes[k.nodes[0]].op.name, k.kind).ahead(k, cap)
    for k in kernels:
        if k.spec is None:
            continue
        try:
            if not k.spec.extent(tuple(k.sizes)):
                continue
        except (TypeError, ValueError):     # sizes that are not plain ints: it may run
            pass
        yield k.spec


class Plan:
    """A compiled graph: kernels in order, which node buffers they use, what to return.  Built
    by the compiler driver (lazycandle/compiler.py) from the captured and the optimised
    capture and the scheduled kernels; `template` lets captures of the same size class skip
    the passes and the scheduler.  The plan runs with a Binding (its own by default): the
    sizes, offsets and buffer sizes of one capture of its size class."""

    def __init__(self, src_cap, cap, kernels, materialized, notes, template=None):
        from ..codegen import compile_pool, fused  # noqa: F401  (fused registers the fused kernels)
        compile_pool.prefetch(_ahead(kernels, cap))    # their kernels compile while the steps are set up
        src_desc = describe(src_cap)
        self.kernels, self.materialized, self.notes, self.template = kernels, materialized, notes, template
        # descriptions for the dump tool; the plan is cached, so it must not pin Nodes/buffers
        self.graph_desc, self.opt_desc = src_desc, describe(cap)
        self.node_meta = [(n.shape, n.dtype) for n in cap.nodes]
        self.dtypes = [n.dtype for n in cap.nodes]
        self.targets = list(cap.targets)
        self.slots = list(cap.slots)
        self.steps = []
        for k in self.kernels:
            if k.spec is not None:
                self.steps.append(Step(k, k.kind == "elementwise" and k.spec.rank == 1 and k.spec.tile is None))
            else:
                self.steps.append(_node_step(cap.nodes[k.nodes[0]].op.name, k.kind)(k, cap))
        # node steps that bake their sizes into a kernel spec need a plan per size
        self.binds_sizes = all(not isinstance(s, NodeStep) or s.binds_layouts for s in self.steps)
        self.arena_slots = None         # ({node: slot}, count): runtime/arena.slots, decided once
        # how bind_values reads the flat quantities: per kernel (spec, sizes count | operand
        # ranks, node-read count), then one element count per buffer node
        self._recipe = [(k.spec, len(k.sizes), sum(1 for b in k.inputs if b[0] == "node")) if k.spec is not None
                        else (None, [len(o.shape) for o in bound_operands(k, cap)],
                              sum(1 for b in k.inputs if b[0] == "node"))
                        for k in kernels]
        self._buffer_nodes = sorted(materialized)
        self.runs = 0                   # runs so far at any binding (the native switch)
        self.native_programs = {}       # matmul forms -> native_program.NativeProgram (program_of)
        self.native_program = None      # the one used last: built at the plan's 2nd run
        self.native_ok = None           # whether the plan can run natively (native_exec.supports)
        self._bind_fn = None            # generated by the plan's second binding
        self.binding = self._bind_walk(self.quantities(kernels, cap))

    def quantities(self, kernels, cap) -> list:
        """Every size-dependent int of this plan, flat, for `kernels` scheduled on `cap`: this
        plan's own, or the same schedule over lc.Size symbols (symbolic_plan.derive_binder)."""
        out = []
        for k in kernels:
            if k.spec is not None:
                out.extend(k.sizes)
            else:
                for o in bound_operands(k, cap):
                    out.extend(o.shape)
                    out.extend(o.strides)
                    out.append(o.offset if o.kind == "node" else 0)
            out.extend(b[2] for b in k.inputs if b[0] == "node")
        out.extend(prod(cap.nodes[j].shape) for j in sorted(self.materialized))
        return out

    def bind_values(self, q) -> Binding:
        """The Binding of flat quantities `q` (in the order of `quantities`).  The plan's own
        binding walks the recipe; later ones (a symbolic binder binding other sizes of the
        class: every new length of a decode loop) run a function generated from it."""
        fn = self._bind_fn
        if fn is None:
            self._bind_fn = fn = self._generated_binder()
        return fn(q)

    def q_positions(self):
        """Where bind_values finds each part of a Binding in the flat quantities: per step,
        ("kernel", spec, first position, count) of a fused kernel's sizes or ("layouts",
        [(shape position, strides position, offset position, rank)]) of a node step's
        operands, and (first position, count) of its node reads; then {buffer node: position
        of its element count}."""
        steps, reads, at = [], [], 0
        for spec, counts, n_reads in self._recipe:
            if spec is not None:
                steps.append(("kernel", spec, at, counts))
                at += counts
            else:
                lays = []
                for r in counts:
                    lays.append((at, at + r, at + 2 * r, r))
                    at += 2 * r + 1
                steps.append(("layouts", lays))
            reads.append((at, n_reads))
            at += n_reads
        return steps, reads, {j: at + k for k, j in enumerate(self._buffer_nodes)}

    def _generated_binder(self):
        """bind_values as straight-line code: q's positions, the Layouts, the extent and cost
        calls written out (no loop over the recipe, no slicing)."""
        def tup(at, n):
            return "(" + "".join(f"q[{at + c}], " for c in range(n)) + ")"
        scope = {"Layout": Layout, "Binding": Binding}
        body, steps = [], []
        positions, read_at, numel_at = self.q_positions()
        for i, got in enumerate(positions):
            if got[0] == "kernel":
                _, spec, at, count = got
                scope[f"extent{i}"], scope[f"cost{i}"] = spec.extent, spec.cost
                body.append(f"    s{i} = {tup(at, count)}\n    e{i} = extent{i}(s{i})")
                steps.append(f"(s{i}, e{i}, cost{i}(s{i}) / (e{i} or 1))")
            else:
                steps.append("[" + ", ".join(f"Layout({tup(sh, r)}, {tup(st, r)}, q[{off}])"
                                             for sh, st, off, r in got[1]) + "]")
        reads = [tup(at, n) for at, n in read_at]
        numels = "{" + "".join(f"{j}: q[{at}], " for j, at in numel_at.items()) + "}"
        source = ("def bind(q):\n" + "".join(line + "\n" for line in body) +
                  f"    return Binding([{', '.join(steps)}], [{', '.join(reads)}], {numels})\n")
        exec(compile(source, "<plan binding>", "exec"), scope)
        return scope["bind"]

    def _bind_walk(self, q) -> Binding:
        at, steps, reads = 0, [], []
        for spec, counts, n_reads in self._recipe:
            if spec is not None:
                sizes = tuple(q[at:at + counts])
                at += counts
                extent = spec.extent(sizes)
                steps.append((sizes, extent, spec.cost(sizes) / (extent or 1)))
            else:
                lays = []
                for r in counts:
                    lays.append(Layout(tuple(q[at:at + r]), tuple(q[at + r:at + 2 * r]), q[at + 2 * r]))
                    at += 2 * r + 1
                steps.append(lays)
            reads.append(tuple(q[at:at + n_reads]))
            at += n_reads
        return Binding(steps, reads, dict(zip(self._buffer_nodes, q[at:])))

    def run(self, in_bufs, offsets, scalars, binding=None):
        """in_bufs: 1-D arrays per capture input; offsets: per operand slot; scalars: the
        capture's scalar slots [(value, DType)]; binding: the sizes to run at (default: the
        plan's own).  Returns the target buffers in capture-target order.  Runs the
        whole-program native form (one native call per segment) unless LAZYCANDLE_EXEC=python.
        The program module is built once per plan, at the plan's second run at any binding
        (LAZYCANDLE_EXEC=native: at its first), so a graph realized once never pays for it; from
        then on every binding, a new one included, runs natively at its first run."""
        b = binding or self.binding
        mode, profiling = config.exec_flags()
        if profiling:
            from . import profile
            seconds = [0.0] * len(self.kernels)
            outs = self.run_python(in_bufs, offsets, scalars, seconds, b)
            profile.record(self, seconds)
            return outs
        if mode != "python":
            native = b.native
            if native is None:
                self.runs += 1
                if self.runs >= 2 or mode == "native":
                    native = self.native_form(b)
            elif native and native.matmul_epoch != config.matmul_epoch:
                b.native = None                     # set_matmul_backend since: decide its matmuls again
                native = self.native_form(b)
            if native:
                return native.run(in_bufs, offsets, scalars, self.slots)
        return self.run_python(in_bufs, offsets, scalars, None, b)

    def native_form(self, binding=None):
        """The NativePlan of this plan at `binding` (default: its own), built once per binding
        over the plan's one NativeProgram (False when the plan cannot run natively: a sort step
        hands its values over between steps by replacing a buffer)."""
        b = binding or self.binding
        if b.native is None:
            native_exec = _native_exec or _import_native_exec()
            if self.native_ok is None:
                self.native_ok = native_exec.supports(self)
            try:
                b.native = native_exec.NativePlan(self, b) if self.native_ok else False
            except native_exec.NotNative:
                b.native = False
        return b.native

    def run_python(self, in_bufs, offsets, scalars, seconds=None, binding=None):
        """The per-kernel path: one ctypes call per kernel over the native pool.  `seconds`
        (a list, one entry per kernel) adds each kernel's wall time to it (the profiler)."""
        b = binding or self.binding
        packed = pack_scalars(scalars)
        dtypes, numels = self.dtypes, b.numels
        offsets_at, nbytes = arena.layout(self, numels)
        bufs = arena.views(alloc(nbytes, np.uint8), offsets_at, numels, dtypes)
        for j in self.targets:
            if j not in bufs:
                bufs[j] = alloc(numels[j], dtypes[j])
        for i, (step, k, sized, read_offsets) in enumerate(zip(self.steps, self.kernels, b.steps, b.read_offsets)):
            t0 = perf_counter() if seconds is not None else 0.0
            if isinstance(step, NodeStep):
                run_step(step, in_bufs, offsets, bufs, sized, packed)
            elif sized[1]:
                step.run(self._kernel_addrs(k, in_bufs, offsets, bufs, read_offsets), packed, sized)
            if seconds is not None:
                seconds[i] += perf_counter() - t0
        return [bufs[t] for t in self.targets]

    def _kernel_addrs(self, k, in_bufs, offsets, bufs, read_offsets) -> list:
        """Kernel k's buffer pointers: its inputs (with their offsets), then its outputs."""
        addrs, r = [], 0
        for bind in k.inputs:
            if bind[0] == "slot":
                buf = in_bufs[self.slots[bind[1]][0]]
                addrs.append(address(buf) + offsets[bind[1]] * buf.itemsize)
            else:
                buf = bufs[bind[1]]
                addrs.append(address(buf) + read_offsets[r] * buf.itemsize)
                r += 1
        for j in k.outputs:
            addrs.append(address(bufs[j]))
        return addrs
