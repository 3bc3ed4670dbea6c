"""The executor: turns a capture into a cached Plan (scheduled, compiled kernels with their
buffer bindings) and runs it.  Plans are cached by the capture's structural key, so rebuilding
the same computation on new data costs only the capture walk and the kernel calls."""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from .. import config
from ..errors import UnboundPlaceholder
from ..ir.graph import capture
from ..ir.node import Node
from ..ir.schedule import schedule
from . import pool

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


class Plan:
    """A compiled graph: kernels in order, which node buffers they use, what to return."""

    def __init__(self, cap):
        from ..codegen import elementwise as ew, reduce as red
        self.kernels, self.materialized, self.notes = schedule(cap)
        self.node_meta = [(n.shape, n.dtype) for n in cap.nodes]
        self.targets = list(cap.targets)
        self.steps = []
        for k in self.kernels:
            if k.kind == "elementwise":
                spec = k.spec
                if prod(spec.shape) == 0:
                    self.steps.append(None)
                    continue
                cm, name = ew.compile_spec(spec)
                fn = _KERNEL_FN(cm.address(name))
                k.compiled = cm
                extent = ew.parallel_extent(spec)
                cost = len(spec.instrs) * prod(spec.shape) / extent
                align = spec.width() if len(spec.shape) == 1 else 1
                self.steps.append(Step(k, fn, extent, align, cost))
            elif k.kind == "reduce":
                spec = k.spec
                if prod(spec.out_shape) == 0:
                    self.steps.append(None)
                    continue
                cm, name = red.compile_spec(spec)
                k.compiled = cm
                extent = spec.parallel_extent
                cost = len(spec.instrs) * prod(spec.shape) / extent
                self.steps.append(Step(k, _KERNEL_FN(cm.address(name)), extent, 1, cost))
            else:
                raise NotImplementedError(f"kernel kind {k.kind}")

    def run(self, in_bufs, offsets):
        """in_bufs: 1-D arrays per capture input; offsets: per operand slot.  Returns the target
        buffers in capture-target order."""
        from .buffers import alloc
        bufs = {}
        for j in sorted(self.materialized):
            shape, dt = self.node_meta[j]
            bufs[j] = alloc(prod(shape), dt)
        slots = self.slots
        for step, k in zip(self.steps, self.kernels):
            if step is None:
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


def get_plan(cap) -> Plan:
    plan = _plans.get(cap.key)
    if plan is None:
        plan = Plan(cap)
        plan.slots = list(cap.slots)
        _plans[cap.key] = plan
    return plan


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
        plan = get_plan(cap)
        outs = plan.run([n.buffer for n in cap.inputs], cap.offsets)
        for n, orig, buf in zip(work, finish, outs):
            n.set_buffer(buf)
            if orig is not None:
                orig.set_buffer(buf)
    for v in aliases:
        base, lay = v.base, v.layout
        v.set_buffer(base.buffer[lay.offset: lay.offset + prod(v.shape)])
