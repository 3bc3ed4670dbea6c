"""Whole-program execution of a Plan: its generated kernels run from one native call per
segment (codegen/program.py) on the native worker pool (native_pool.py).

Built once per plan binding (Binding.native: one capture's sizes), it holds
  * the memory plan as offsets into ONE arena: each intermediate buffer lives from the kernel
    that first writes it to its last reader, and buffers whose lifetimes do not overlap share
    bytes.  A small arena is kept by the plan; a large one is taken from buffers.alloc (which
    recycles blocks) at each run.  Outputs are fresh arrays each run (the caller keeps them).
  * `ptrs`: every kernel's buffer pointers back to back, `sizes`: every kernel's sizes;
  * segments: runs of consecutive generated kernels (and index kernels, whose bad-id status
    word is checked after their phase), split by the steps that need Python (BLAS matmul,
    sort, ...).  A segment's kernels are grouped in phases of independent kernels, one
    barrier per phase.
Runs of one plan are serialised (its ptrs and arena are shared); runs of different plans
queue on the pool's entry mutex."""
from __future__ import annotations

import ctypes
import os
import threading
import weakref
from math import prod

import numpy as np

from . import native_pool
from .buffers import alloc
from ..codegen.program import segment_names
from .steps import NodeStep, run_step

ARENA_KEEP_BYTES = 256 << 10      # a plan keeps its arena up to this size (512 cached plans: <= 128 MiB)
MIN_PARALLEL_COST = 65536.0       # as runtime/pool.py: smaller kernels run on the calling thread
ALIGN = 64
SMALL_OUTPUT_BYTES = 1 << 16      # outputs below this share one allocation per run
SEGMENT_FN = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def _fn_address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


def plan_arena(plan, numels):
    """{node: byte offset} for the plan's intermediate buffers and the arena's size.  A buffer
    is live from its first writer to its last reader (inclusive), and takes the lowest offset
    that overlaps no live buffer (first fit, in order of first write)."""
    n_k = len(plan.kernels)
    first, last = {}, {}
    for i, k in enumerate(plan.kernels):
        for bind in k.inputs:
            if bind[0] == "node":
                last[bind[1]] = i
        for j in k.outputs:
            first.setdefault(j, i)
    for i, step in enumerate(plan.steps):
        if isinstance(step, NodeStep):
            for kind, idx, *_ in step.operands:
                if kind == "node":
                    last[idx] = max(last.get(idx, i), i)
    targets = set(plan.targets)
    live = []                       # (start, end, offset, nbytes)
    where, top = {}, 0
    for j in sorted(plan.materialized - targets, key=lambda j: (first.get(j, 0), j)):
        dt = plan.dtypes[j]
        nbytes = -(-max(numels[j] * dt.numpy.itemsize, 1) // ALIGN) * ALIGN
        start = first.get(j, 0)
        end = max(last.get(j, start), start)
        if j not in first:
            start, end = 0, n_k
        busy = sorted((o, o + s) for a, e, o, s in live if not (e < start or a > end))
        off = 0
        for lo, hi in busy:
            if off + nbytes <= lo:
                break
            off = max(off, hi)
        live.append((start, end, off, nbytes))
        where[j] = off
        top = max(top, off + nbytes)
    return where, top


def supports(plan) -> bool:
    from .sort_steps import SortTakeStep
    return not any(isinstance(s, SortTakeStep) for s in plan.steps)


class NativePlan:
    def __init__(self, plan, binding):
        from ..codegen import jit, program
        self.plan, self.binding, self.numels = plan, binding, binding.numels
        self.offsets, self.arena_bytes = plan_arena(plan, binding.numels)
        self.keep_arena = self.arena_bytes <= ARENA_KEEP_BYTES
        self.targets = list(dict.fromkeys(plan.targets))      # one buffer per node, even when
        self.target_index = {j: t for t, j in enumerate(self.targets)}     # several targets share it
        self.returned = [self.target_index[j] for j in plan.targets]
        self.lock = threading.Lock()
        _live.add(self)
        self.steps_of = {}                 # call label -> plan step (to raise its error)
        refs, sizes, items = [], [], []    # items: ("native", [(call, regions)]) | ("python", (step, its binding layouts))
        imports, names = {}, {}
        status_words = 0
        for i, (step, k) in enumerate(zip(plan.steps, plan.kernels)):
            sized = binding.steps[i]
            if not isinstance(step, NodeStep) and not sized[1]:
                continue                    # nothing to compute at these sizes
            call = self._call_of(i, step, k, refs, sizes, imports, names, status_words)
            if call is None:
                items.append(("python", (step, sized)))
                continue
            status_words += call.status_at is not None
            self.steps_of[call.label] = step
            if not items or items[-1][0] != "native":
                items.append(("native", []))
            items[-1][1].append((call, self._regions(step, k)))
        segments = [_phases(calls) for kind, calls in items if kind == "native"]
        self.status = np.zeros(2 * max(status_words, 1), np.int64)
        for pos, ref in enumerate(refs):
            if ref[0] == "status":
                refs[pos] = ("fixed", self.status.ctypes.data + 16 * ref[1])
        self.segments = segments
        self.refs = refs
        self.sizes = np.array(sizes or [0], np.int64)
        self.ptrs = np.zeros(max(len(refs), 1), np.int64)
        self.items = items
        self.module = None
        self.fns = []
        if segments:
            imports["lc_pool_run"] = native_pool.address("lc_pool_run")
            seg_names = segment_names(len(segments))
            self.module = jit.link_ir(program.build(segments), seg_names, imports, optimize=False)
            self.fns = [SEGMENT_FN(self.module.address(n)) for n in seg_names]
        self.call_steps = [[c for phase in seg for c in phase] for seg in segments]
        self.has_status = status_words > 0
        self._fixed_bufs = None
        self._by_pos = self._positions()
        self.sizes_addr, self.ptrs_addr = self.sizes.ctypes.data, self.ptrs.ctypes.data
        self._scalars, self._packed = None, None
        self._plan_outputs()
        self.arena = alloc(self.arena_bytes, np.uint8) if self.keep_arena else None
        if self.keep_arena:
            self._fill_arena(self.arena.ctypes.data)

    # ---- building ---------------------------------------------------------------------
    def _ref_of_bind(self, bind, plan, offset):
        """The pointer ref of a kernel operand: a feed slot, or node bind[1] at element `offset`."""
        if bind[0] == "slot":
            return ("slot", bind[1])
        j, off = bind[1], offset * plan.dtypes[bind[1]].numpy.itemsize
        if j in self.target_index:
            return ("out", self.target_index[j], off)
        return ("arena", self.offsets[j] + off)

    def _call_of(self, i, step, k, refs, sizes, imports, names, status_no):
        """The program.Call of plan step i (appending its pointer refs and sizes), or None for
        a step that runs in Python."""
        from ..codegen.program import Call, PARALLEL, SERIAL
        from .index_steps import IndexStep
        plan = self.plan
        bufs_at = len(refs)
        if isinstance(step, IndexStep):
            layouts = self.binding.steps[i]
            launch = step.prepare(layouts)[0]
            if launch.fn is None:
                return None
            refs += self._index_refs(step, layouts, status_no)
            fn, sizes_at, extent, align, cost, slots = launch.fn, len(sizes), launch.units, 1, launch.unit_cost, ()
            sizes += [int(s) for s in launch.sizes]
            status_at = bufs_at + 3
        elif isinstance(step, NodeStep):
            return None
        else:
            step_sizes, extent, cost = self.binding.steps[i]
            reads = iter(self.binding.read_offsets[i])
            refs += [self._ref_of_bind(bind, plan, next(reads) if bind[0] == "node" else 0) for bind in k.inputs]
            refs += [self._ref_of_bind(("node", j), plan, 0) for j in k.outputs]
            sizes_at = len(sizes) if len(step_sizes) else None
            sizes += [int(s) for s in step_sizes]
            fn, align, slots = step.fn, step.align, tuple(k.scalars)
            status_at = None
        addr = _fn_address(fn)
        sym = names.setdefault(addr, f"kernel{len(names)}")
        imports[sym] = addr
        parts = PARALLEL if extent * cost >= MIN_PARALLEL_COST and extent > 1 else SERIAL
        return Call(sym, int(extent), int(align), parts, bufs_at, sizes_at, slots, status_at,
                    label=f"#{i} {k.kind}")

    def _index_refs(self, step, layouts, status_no):
        """The index kernel's pointers as index_steps.IndexStep.run_node passes them (node
        operands at this binding's offsets)."""
        def operand(n):
            kind, idx, _, _, _ = step.operands[n]
            if kind == "in":
                return ("slot", idx)
            return self._ref_of_bind(("node", idx), self.plan, layouts[n].offset)
        out = self._ref_of_bind(("node", step.out), self.plan, 0)
        data, ids, *base = (operand(n) for n in step.kernel_operands)
        return [out, data, ids, ("status", status_no)] + base

    def _regions(self, step, k):
        """(reads, writes) of a step as memory regions: ("out", t), ("arena", lo, hi)."""
        plan = self.plan

        def region(j):
            if j in self.target_index:
                return ("out", self.target_index[j])
            lo = self.offsets[j]
            return ("arena", lo, lo + max(self.numels[j] * plan.dtypes[j].numpy.itemsize, 1))
        if isinstance(step, NodeStep):
            reads = [region(idx) for kind, idx, *_ in step.operands if kind == "node"]
            return reads, [region(step.out)]
        reads = [region(b[1]) for b in k.inputs if b[0] == "node"]
        return reads, [region(j) for j in k.outputs]

    def _positions(self):
        slot_pos, out_pos, arena_pos = [], [], []
        for pos, ref in enumerate(self.refs):
            if ref[0] == "slot":
                slot_pos.append((pos, ref[1]))
            elif ref[0] == "out":
                out_pos.append((pos, ref[1], ref[2]))
            elif ref[0] == "arena":
                arena_pos.append((pos, ref[1]))
            else:
                self.ptrs[pos] = ref[1]
        return slot_pos, out_pos, arena_pos

    def _fill_arena(self, base):
        for pos, off in self._by_pos[2]:
            self.ptrs[pos] = base + off

    # ---- running ------------------------------------------------------------------------
    def _plan_outputs(self):
        """Small outputs are carved from one block per run (one allocation, one address
        lookup); large ones come from buffers.alloc (recycled huge-page blocks)."""
        small, top = [], 0
        for t, j in enumerate(self.targets):
            n, dt = self.numels[j], self.plan.dtypes[j]
            if n * dt.numpy.itemsize < SMALL_OUTPUT_BYTES:
                small.append((t, top, n, dt.numpy))
                top += -(-max(n * dt.numpy.itemsize, 1) // ALIGN) * ALIGN
        self.small_outputs, self.small_bytes = small, top
        taken = {t for t, *_ in small}
        self.large_outputs = [(t, self.numels[j], self.plan.dtypes[j])
                              for t, j in enumerate(self.targets) if t not in taken]

    def _outputs(self):
        outs = [None] * len(self.targets)
        addrs = [0] * len(self.targets)
        if self.small_outputs:
            raw = np.empty(self.small_bytes + ALIGN, np.uint8)
            addr = raw.ctypes.data
            skip = (-addr) % ALIGN
            addr += skip
            for t, off, n, npdt in self.small_outputs:
                outs[t] = raw[skip + off: skip + off + n * npdt.itemsize].view(npdt)
                addrs[t] = addr + off
        for t, n, dt in self.large_outputs:
            o = outs[t] = alloc(n, dt)
            addrs[t] = o.ctypes.data
        return outs, addrs

    def _pack(self, scalars):
        """The scalar slots packed as the kernels read them (kept while the same capture's
        list comes back: a Program's instance passes one list every run)."""
        if scalars is not self._scalars:
            from .executor import pack_scalars
            packed = pack_scalars(scalars)
            self._scalars, self._packed = scalars, (packed, packed.ctypes.data)
        return self._packed

    def run(self, in_bufs, offsets, scalars, slots):
        """Run the plan; returns the target buffers (as Plan.run)."""
        outs, out_addr = self._outputs()
        in_addr = [b.ctypes.data for b in in_bufs] if len(in_bufs) != 1 else (in_bufs[0].ctypes.data,)
        nthreads = native_pool.threads()
        with self.lock:
            arena = self.arena
            if arena is None:
                arena = alloc(self.arena_bytes, np.uint8)
                self._fill_arena(arena.ctypes.data)
            ptrs = self.ptrs
            slot_pos, out_pos, _ = self._by_pos
            for pos, s in slot_pos:
                i = slots[s][0]
                ptrs[pos] = in_addr[i] + offsets[s] * in_bufs[i].itemsize
            for pos, t, off in out_pos:
                ptrs[pos] = out_addr[t] + off
            if self.has_status:
                self.status[:] = 0
            packed, sc = self._pack(scalars)
            p, sz = self.ptrs_addr, self.sizes_addr
            seg = 0
            bufs = None
            for kind, what in self.items:
                if kind == "native":
                    rc = self.fns[seg](p, sz, sc, nthreads)
                    if rc:
                        self._raise_status(seg, rc - 1)
                    seg += 1
                else:
                    if bufs is None:
                        bufs = self._node_buffers(arena, outs)
                    run_step(what[0], in_bufs, offsets, bufs, what[1], packed)
        return [outs[t] for t in self.returned]

    def _node_buffers(self, arena, outs):
        """The plan's buffers as arrays, for the steps that run in Python."""
        if self._fixed_bufs is not None:
            bufs = dict(self._fixed_bufs)
        else:
            bufs = self._arena_views(arena)
            if self.keep_arena:
                self._fixed_bufs = dict(bufs)
        for j, o in zip(self.targets, outs):
            bufs[j] = o
        return bufs

    def _arena_views(self, arena):
        plan = self.plan
        bufs = {}
        for j, off in self.offsets.items():
            n, dt = self.numels[j], plan.dtypes[j]
            bufs[j] = arena[off:off + n * dt.numpy.itemsize].view(dt.numpy)
        return bufs

    def _raise_status(self, seg, call_no):
        """A kernel of segment `seg` reported a bad id: raise the error its step raises."""
        call = self.call_steps[seg][call_no]
        step = self.steps_of[call.label]
        status = np.frombuffer((ctypes.c_int64 * 2).from_address(int(self.ptrs[call.status_at])), np.int64)
        step.raise_bad_id(int(status[1]), self.binding.steps[self.plan.steps.index(step)])

    # ---- dump -------------------------------------------------------------------------
    def schedule_lines(self) -> list:
        """Segments, phases and barriers, for the schedule dump."""
        lines = ["native program (one call per segment; | = barrier between phases):"]
        seg = 0
        for kind, what in self.items:
            if kind == "python":
                lines.append(f"  python step: {type(what[0]).__name__}")
                continue
            name = segment_names(len(self.segments))[seg]
            lines.append(f"  segment {name}: {len(self.segments[seg])} phase(s)")
            for p, phase in enumerate(self.segments[seg]):
                how = "calling thread" if all(c.parts == 1 for c in phase) else "pool"
                calls = ", ".join(f"{c.label} [0, {c.extent})" for c in phase)
                lines.append(f"    phase {p} ({how}): {calls}" + ("  | barrier" if how == "pool" else ""))
            seg += 1
        lines.append(f"  arena: {self.arena_bytes} bytes for {len(self.offsets)} intermediate buffer(s)"
                     + ("" if self.keep_arena else " (taken per run)"))
        return lines


_live = weakref.WeakSet()         # every NativePlan, for the fork handler


def _renew_locks_after_fork():
    """A forked child has only the forking thread: a run another thread was in holds its
    plan's lock forever."""
    for native in list(_live):
        native.lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_locks_after_fork)


def _overlap(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "arena":
        return a[1] < b[2] and b[1] < a[2]
    return a == b


def _phases(calls):
    """Group consecutive calls into phases of independent calls: a call joins the current
    phase unless it reads what a member writes or writes what a member reads or writes."""
    phases, members = [], []
    for call, (reads, writes) in calls:
        clash = any(_overlap(w, x) for _, (r2, w2) in members for w in writes for x in r2 + w2) or \
            any(_overlap(r, w) for _, (_, w2) in members for r in reads for w in w2)
        if clash or not members:
            if members:
                phases.append([c for c, _ in members])
            members = []
        members.append((call, (reads, writes)))
    if members:
        phases.append([c for c, _ in members])
    return phases
