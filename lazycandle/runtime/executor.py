"""The executor: turns a capture into a cached Plan (scheduled, compiled kernels with their
buffer bindings) and runs it.  Plans are cached by the capture's structural key, so rebuilding
the same computation on new data costs only the capture walk and the kernel calls."""
from __future__ import annotations

import ctypes
from math import prod

from .. import config
from ..errors import UnboundPlaceholder
from ..ir.graph import capture
from ..ir.node import Node
from ..ir.schedule import schedule
from . import pool
from .steps import STEPS, NodeStep

_KERNEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


class Step:
    """One compiled kernel call: which buffers it reads/writes and how to split it."""

    def __init__(self, kernel, fn, extent, align, cost):
        self.kernel, self.fn, self.extent, self.align, self.cost = kernel, fn, extent, align, cost

    def run(self, addrs):
        arr = (ctypes.c_void_p * len(addrs))(*addrs)
        base = ctypes.addressof(arr)
        fn = self.fn
        pool.parallel_for(lambda a, b: fn(base, a, b), 0, self.extent,
                          cost_per_item=self.cost, align=self.align)


def _compiled_step(k, codegen, size, extent, align):
    """Compile kernel k's spec with `codegen` (elementwise or reduce); None when it has no work."""
    if size == 0:
        return None
    cm, name = codegen.compile_spec(k.spec)
    k.compiled = cm
    cost = len(k.spec.instrs) * prod(k.spec.shape) / extent
    return Step(k, _KERNEL_FN(cm.address(name)), extent, align, cost)


def describe(cap):
    """Node-free description of a capture: inputs, nodes (op, arg, shape, dtype, operands), targets."""
    ins = [("placeholder" if n.op.name == "placeholder" else "buffer", n.arg if n.op.name == "placeholder" else None,
            n.shape, n.dtype) for n in cap.inputs]
    nodes = [(n.op.name, n.arg, n.shape, n.dtype, ops) for n, ops in zip(cap.nodes, cap.operands)]
    return {"inputs": ins, "nodes": nodes, "targets": list(cap.targets), "slots": list(cap.slots)}


class Plan:
    """A compiled graph: kernels in order, which node buffers they use, what to return."""

    def __init__(self, cap):
        from ..codegen import elementwise as ew, reduce as red
        from ..ir.passes import optimize, recompute_into_reductions
        src_desc = describe(cap)
        cap = recompute_into_reductions(optimize(cap))
        self.kernels, self.materialized, self.notes = schedule(cap)
        self.notes = cap.extra.get("notes", []) + self.notes
        # descriptions for the dump tool; the plan is cached, so it must not pin Nodes/buffers
        self.graph_desc, self.opt_desc = src_desc, describe(cap)
        self.node_meta = [(n.shape, n.dtype) for n in cap.nodes]
        self.targets = list(cap.targets)
        self.steps = []
        for k in self.kernels:
            if k.kind == "elementwise":
                spec = k.spec
                self.steps.append(_compiled_step(k, ew, prod(spec.shape), ew.parallel_extent(spec),
                                                 spec.width() if len(spec.shape) == 1 else 1))
            elif k.kind == "reduce":
                spec = k.spec
                self.steps.append(_compiled_step(k, red, prod(spec.out_shape), spec.parallel_extent, 1))
            elif cap.nodes[k.nodes[0]].op.name in STEPS:
                self.steps.append(STEPS[cap.nodes[k.nodes[0]].op.name](k, cap))
            else:
                raise NotImplementedError(f"kernel kind {k.kind}")
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

    def run(self, in_bufs, offsets):
        """in_bufs: 1-D arrays per capture input; offsets: per operand slot.  Returns the target
        buffers in capture-target order."""
        from .buffers import alloc
        bufs = {}
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
            step.run(addrs)
        return [bufs[t] for t in self.targets]


_plans: dict = {}


def get_plan(cap, targets=None) -> Plan:
    """The compiled plan for a capture's structure (compiling on a miss; LAZYCANDLE_DUMP prints
    the requested stages at every compile)."""
    plan = _plans.get(cap.key)
    if plan is None:
        plan = Plan(cap)
        plan.slots = list(cap.slots)
        _plans[cap.key] = plan
        if config.dump_stages():
            _dump_on_compile(plan, targets)
    return plan


_dump_count = [0]


def _dump_on_compile(plan, targets):
    import os
    import sys
    from ..ir.graph import views_graph
    from ..ir.printer import render
    _dump_count[0] += 1
    built = views_graph(targets) if targets else None
    out_dir = config.dump_dir()
    for stage in config.dump_stages():
        try:
            text = render(stage, os.environ.get("LAZYCANDLE_DUMP_FORMAT", "text"), plan, built)
        except ValueError as e:
            text = f"(dump: {e})"
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            with open(os.path.join(out_dir, f"graph{_dump_count[0]:04d}.{stage}.txt"), "w") as f:
                f.write(text + "\n")
        else:
            print(f"==== lazycandle dump: graph {_dump_count[0]}, stage {stage}\n{text}", file=sys.stderr)


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
        outs = plan.run([n.buffer for n in cap.inputs], cap.offsets)
        for n, orig, buf in zip(work, finish, outs):
            n.set_buffer(buf)
            if orig is not None:
                orig.set_buffer(buf)
    for v in aliases:
        base, lay = v.base, v.layout
        v.set_buffer(base.buffer[lay.offset: lay.offset + prod(v.shape)])
