"""The executor: a Plan (the driver's scheduled, compiled kernels with their buffer bindings
and memory plan) and how it runs.  The driver (lazycandle/compiler.py) builds and caches Plans;
the runtime only executes them."""
from __future__ import annotations

import ctypes
from math import prod

import numpy as np

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
                if step.takes_scalars:
                    step.run_node(in_bufs, offsets, bufs, packed)
                else:
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
