"""The executor: turns a capture into a cached Plan (scheduled, compiled kernels with their
buffer bindings) and runs it.  Plans are cached by the capture's structural key, so rebuilding
the same computation on new data costs only the capture walk and the kernel calls."""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from .. import caches, config
from ..errors import UnboundPlaceholder
from ..ir.graph import capture, size_class_key
from ..ir.node import Node
from . import pool
from .steps import STEPS, NodeStep


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
    """One compiled kernel call: which buffers it reads/writes, which of the plan's scalars it
    takes, and how to split it."""

    def __init__(self, kernel, fn, extent, lanes, align, cost):
        self.kernel, self.fn, self.extent, self.lanes, self.align, self.cost = kernel, fn, extent, lanes, align, cost
        self.module = fn._module      # for the dump tool's llvm / asm stages
        self.scalar_index = np.array(kernel.scalars, np.intp) if kernel.scalars else None
        self.sizes = np.array(kernel.sizes, np.int64)

    def run(self, addrs, packed_scalars):
        arr = (ctypes.c_void_p * len(addrs))(*addrs)
        base = ctypes.addressof(arr)
        scal = packed_scalars[self.scalar_index] if self.scalar_index is not None else None
        scal_ptr = scal.ctypes.data if scal is not None else None
        fn = self.fn
        sizes_ptr = self.sizes.ctypes.data
        pool.parallel_for(lambda a, b: fn(base, sizes_ptr, scal_ptr, a, b), 0, self.extent,
                          cost_per_item=self.cost, align=self.align)


def _compiled_step(k, codegen, size, extent, vector_units):
    """Compile kernel k's spec with `codegen` (elementwise or reduce); None when it has no work.
    `vector_units`: its units are single elements, so chunks split on vector boundaries."""
    if size == 0:
        return None
    fn = codegen.get_kernel(k.spec)
    lanes = codegen.lanes(k.spec)
    cost = len(k.spec.instrs) * prod(k.loop_shape) / extent
    return Step(k, fn, extent, lanes, lanes if vector_units else 1, cost)


def _node_step(op_name, kind):
    """The NodeStep class running op `op_name`.  The index, conv, sort and scan steps register
    on the first plan that needs one (their kernel modules are not part of `import lazycandle`)."""
    from . import index_steps, sort_steps  # noqa: F401  (register the steps)
    if op_name not in STEPS:
        raise NotImplementedError(f"kernel kind {kind} ({op_name})")
    return STEPS[op_name]


def describe(cap):
    """Node-free description of a capture: inputs, nodes (op, arg, shape, dtype, operands), targets."""
    ins = [("placeholder" if n.op.name == "placeholder" else "buffer", n.arg if n.op.name == "placeholder" else None,
            n.shape, n.dtype) for n in cap.inputs]
    nodes = [(n.op.name, n.arg, n.shape, n.dtype, ops) for n, ops in zip(cap.nodes, cap.operands)]
    return {"inputs": ins, "nodes": nodes, "targets": list(cap.targets), "slots": list(cap.slots)}


class Plan:
    """A compiled graph: kernels in order, which node buffers they use, what to return.  Built
    by the compiler driver (lazycandle/compiler.py) from the captured and the optimised
    capture and the scheduled kernels; `template` lets captures of the same size class skip
    the passes and the scheduler."""

    def __init__(self, src_cap, cap, kernels, materialized, notes, template=None):
        from ..codegen import elementwise as ew, reduce as red
        src_desc = describe(src_cap)
        self.kernels, self.materialized, self.notes, self.template = kernels, materialized, notes, template
        # descriptions for the dump tool; the plan is cached, so it must not pin Nodes/buffers
        self.graph_desc, self.opt_desc = src_desc, describe(cap)
        self.node_meta = [(n.shape, n.dtype) for n in cap.nodes]
        self.targets = list(cap.targets)
        self.steps = []
        for k in self.kernels:
            if k.kind == "elementwise":
                spec = k.spec
                self.steps.append(_compiled_step(k, ew, prod(k.loop_shape), ew.parallel_extent(spec, k.loop_shape),
                                                 spec.rank == 1 and spec.tile is None))
            elif k.kind == "reduce":
                spec = k.spec
                self.steps.append(_compiled_step(k, red, prod(spec.out_shape(k.loop_shape)),
                                                 spec.parallel_extent(k.loop_shape), False))
            else:
                self.steps.append(_node_step(cap.nodes[k.nodes[0]].op.name, k.kind)(k, cap))
        self._plan_memory()

    def _plan_memory(self):
        """Liveness: allocate each buffer right before the kernel that writes it and release
        intermediates after their last reader, so later kernels reuse the blocks (buffers.py)."""
        first_write, last_read = {}, {}
        for i, k in enumerate(self.kernels):
            for j in k.outputs:
                first_write.setdefault(j, i)
            for bind in k.inputs:
                if bind[0] == "node":
                    last_read[bind[1]] = i
        keep = set(self.targets)
        self.alloc_at = [[] for _ in self.kernels]          # bucketed in one pass: linear in graph size
        for j in sorted(self.materialized):
            self.alloc_at[first_write.get(j, 0)].append(j)
        self.free_after = [[] for _ in self.kernels]
        for j, r in last_read.items():
            if j not in keep:
                self.free_after[r].append(j)

    def run(self, in_bufs, offsets, scalars):
        """in_bufs: 1-D arrays per capture input; offsets: per operand slot; scalars: the
        capture's scalar slots [(value, DType)].  Returns the target buffers in capture-target
        order."""
        from .buffers import alloc
        bufs = {}
        packed = pack_scalars(scalars)
        slots = self.slots
        for i, (step, k) in enumerate(zip(self.steps, self.kernels)):
            if i > 0:
                for j in self.free_after[i - 1]:
                    bufs.pop(j, None)
            for j in self.alloc_at[i]:
                shape, dt = self.node_meta[j]
                bufs[j] = alloc(prod(shape), dt)
            if step is None:
                continue
            if isinstance(step, NodeStep):
                step.run_node(in_bufs, offsets, bufs)
                continue
            addrs = []
            for bind in k.inputs:
                if bind[0] == "slot":
                    i, _ = slots[bind[1]]
                    buf = in_bufs[i]
                    addrs.append(buf.ctypes.data + offsets[bind[1]] * buf.itemsize)
                else:
                    buf = bufs[bind[1]]
                    addrs.append(buf.ctypes.data + bind[2] * buf.itemsize)
            for j in k.outputs:
                addrs.append(bufs[j].ctypes.data)
            step.run(addrs, packed)
        return [bufs[t] for t in self.targets]


_plans = caches.register("plans", caches.LRU(config.plan_cache_size()))
_templates = caches.register("plan templates", caches.LRU(config.plan_cache_size()))   # size-class key -> Template


def get_plan(cap, targets=None) -> Plan:
    """The compiled plan for a capture's structure, from a bounded LRU cache (compiling on a
    miss; LAZYCANDLE_DUMP prints the requested stages at every compile).  A new size of a known
    structure replays that structure's template, and its kernels come from the kernel cache
    (one per shape class)."""
    plan = _plans.get(cap.key)
    if plan is None:
        from ..compiler import compile_capture    # the driver sits above runtime
        size_key = size_class_key(cap)
        plan = compile_capture(cap, _templates.get(size_key))
        _templates.put(size_key, plan.template)
        plan.slots = list(cap.slots)
        plan = _plans.put(cap.key, plan)
        if config.dump_stages():
            _dump_on_compile(plan, targets)
    return plan


_dump_count = [0]
_dump_warned = [False]


def _dump_on_compile(plan, targets):
    """LAZYCANDLE_DUMP: print or write the requested stages.  A dump file that cannot be written
    warns once and is skipped: dumping never breaks the computation."""
    import os
    import sys
    import warnings
    from ..ir.graph import views_graph
    from ..ir.printer import render
    _dump_count[0] += 1
    built = views_graph(targets) if targets else None
    out_dir = config.dump_dir()
    for stage in config.dump_stages():
        try:
            text = render(stage, os.environ.get("LAZYCANDLE_DUMP_FORMAT", "text"), plan, built, targets)
        except ValueError as e:
            text = f"(dump: {e})"
        if not out_dir:
            print(f"==== lazycandle dump: graph {_dump_count[0]}, stage {stage}\n{text}", file=sys.stderr)
            continue
        path = os.path.join(out_dir, f"graph{_dump_count[0]:04d}.{stage}.txt")
        try:
            os.makedirs(out_dir, exist_ok=True)
            with open(path, "w") as f:
                f.write(text + "\n")
        except OSError as e:
            if not _dump_warned[0]:
                _dump_warned[0] = True
                warnings.warn(f"lazycandle: cannot write dump {path} (LAZYCANDLE_DUMP_DIR={out_dir!r}): "
                              f"{type(e).__name__}: {e}; dumps that fail are skipped", RuntimeWarning, stacklevel=2)


def _prepare_targets(nodes):
    """Map each requested node to the computed node whose buffer it will own, and list the
    views that simply alias a (to be) realized base buffer."""
    work, finish, aliases = [], [], []
    for n in dict.fromkeys(nodes):
        if n.realized:
            continue
        cat = n.op.category
        if n.op.name == "placeholder":
            raise UnboundPlaceholder(f"placeholder {n.arg!r} {n.shape} {n.dtype.name} realized outside a program "
                                     f"(use lc.compile([...]).run({n.arg}=...))")
        if cat == "view" and n.layout.is_contiguous() and n.base.op.name not in ("const", "placeholder"):
            aliases.append(n)
            if not n.base.realized:
                work.append(n.base)
                finish.append(None)
            continue
        if cat in ("view", "source"):
            c = Node("copy", (n,), None, n.shape, n.dtype)
            work.append(c)
            finish.append(n)
        else:
            work.append(n)
            finish.append(None)
    return work, finish, aliases


def realize_nodes(nodes) -> None:
    """Compute and attach buffers to every node in `nodes` (one compiled graph for all)."""
    work, finish, aliases = _prepare_targets(nodes)
    if work:
        cap = capture(work)
        for inp in cap.inputs:
            if not inp.realized:
                raise UnboundPlaceholder(f"placeholder {inp.arg!r} {inp.shape} {inp.dtype.name} is not bound: "
                                         f"realize it through lc.compile([...]).run({inp.arg}=...)")
        plan = get_plan(cap, work)
        outs = plan.run([n.buffer for n in cap.inputs], cap.offsets, cap.scalars)
        for n, orig, buf in zip(work, finish, outs):
            n.set_buffer(buf)
            if orig is not None:
                orig.set_buffer(buf)
    for v in aliases:
        base, lay = v.base, v.layout
        v.set_buffer(base.buffer[lay.offset: lay.offset + prod(v.shape)])
