"""Whole-program execution of a Plan: its generated kernels run from one native call per
segment (codegen/program.py) on the native worker pool (native_pool.py).

Two parts, so that a new binding of a size class runs natively at once:
  * NativeProgram (native_program.py), built once per plan: segments, phases, positions,
    arena slots and the linked module, none of it depending on sizes.
  * NativePlan, here, one per plan Binding (one capture's sizes), plain Python over those
    positions: `ptrs` (every kernel's buffer pointers back to back), `sizes` (per call its
    extent, SERIAL / PARALLEL and its own sizes) and the memory plan as offsets into ONE
    arena, each slot as large as its largest buffer at the binding's sizes.  A small arena is
    kept by the program (shared by its bindings); a large one is taken from buffers.alloc
    (which recycles blocks) at each run.  Outputs are fresh arrays each run (the caller keeps
    them).
Runs of one plan, at any binding, are serialised (its arena is shared); runs of different
plans queue on the pool's entry mutex."""
from __future__ import annotations

import ctypes
import struct

import numpy as np

from .. import config
from . import launch, native_pool
from .arena import views as arena_views
from .buffers import DATA_AT, alloc, read_word, result
from ..codegen.program import SERIAL, segment_names
from .native_program import ALIGN, ARENA_KEEP_BYTES, _addressof, _fn_address, address, program_of
from .native_program import NotNative, supports  # noqa: F401  (what executor.Plan asks of this module)
from .steps import run_step

SMALL_OUTPUT_BYTES = 1 << 16      # outputs below this share one allocation per run
LAUNCH = True         # eager runs of one output go through the launcher (False: ctypes; benches compare)
_SCALAR_CODES = {"f": "d", "i": "q", "u": "Q"}     # struct code of a scalar slot by dtype kind


def _native_flags() -> bool:
    """Whether LAZYCANDLE_EXEC / LAZYCANDLE_PROFILE, when set, still let a run go natively."""
    mode, profiling = config.exec_flags()
    return not profiling and mode != "python"


def split_outputs(targets):
    """(small, bytes of their block, large) for `targets` (target number, element count, item
    size, DType): small outputs are carved from one ALIGN-ed block per run, (t, byte offset,
    count, numpy dtype) each; large ones, (t, count, DType), come from buffers.alloc."""
    small, large, top = [], [], 0
    for t, n, itemsize, dt in targets:
        nbytes = n * itemsize
        if nbytes < SMALL_OUTPUT_BYTES:
            small.append((t, top, n, dt.numpy))
            top += -(-max(nbytes, 1) // ALIGN) * ALIGN
        else:
            large.append((t, n, dt))
    return small, top, large


_block_types: dict = {}


def block_type(nbytes: int):
    """The ctypes type of a run's small-output block of at least `nbytes`: sizes rounded up to
    a power of two, so a new binding reuses a type (making a ctypes array type costs ~30 us)."""
    size = 1 << max(nbytes - 1, 63).bit_length()
    got = _block_types.get(size)
    if got is None:
        got = _block_types[size] = ctypes.c_char * size
    return got


class NativePlan:
    """A NativeProgram bound to one Binding: the pointer and sizes arrays its segments read, the
    arena offsets and the output layout at those sizes.  Plain Python over the program's
    precomputed positions (a new binding costs a few microseconds): it runs natively at once,
    nothing is compiled."""

    def __init__(self, plan, binding):
        prog = program_of(plan, binding)
        like = prog.last_bound          # the previous binding's NativePlan: its size-independent part
        if like is not None:
            self.__dict__.update(like.__dict__)
        else:
            self.program = prog
            self.targets, self.target_index, self.returned = prog.targets, prog.target_index, prog.returned
            self.steps_of, self.segments, self.module, self.fns = prog.steps_of, prog.segments, prog.module, prog.fns
            self.call_steps, self.has_status, self.status = prog.call_steps, prog.has_status, prog.status
        self.plan, self.binding = plan, binding
        self.matmul_epoch = config.matmul_epoch      # the backend setting its matmul calls were chosen under
        numels = self.numels = binding.numels
        self.slot_at, self.arena_bytes = slot_at, arena_bytes = prog.slot_fn(numels)
        self.keep_arena = keep = arena_bytes <= ARENA_KEEP_BYTES
        self.items = prog.items if not prog.python_steps else \
            [("python", (plan.steps[what], binding.steps[what])) if kind == "python" else (kind, what)
             for kind, what in prog.items]
        self.arena, base = prog.arena_at_least(arena_bytes) if keep else (None, 0)
        words, out_pos = prog.fill_fn(binding.steps, binding.read_offsets, slot_at, base)
        # an arena taken per run: the words hold the offsets, each run adds its address
        arena_pos = [] if keep else [(pos, words[pos]) for pos, _, _, _ in prog.arena_refs]
        block = np.array(words, np.int64)
        n_refs = prog.n_refs
        self.ptrs, self.sizes = block[:max(n_refs, 1)], block[n_refs:]
        self.ptrs_addr = address(block)
        self.sizes_addr = self.ptrs_addr + 8 * n_refs
        self._by_pos = (prog.slot_pos, out_pos, arena_pos)
        self._fixed_bufs = None
        self._plan_outputs()
        if like is not None and (prog.python_steps or out_pos != like._by_pos[1]
                                 or self.small_outputs != like.small_outputs):
            self._tables = None         # the run tables (_run_tables) differ from the previous binding's
        prog.last_bound = self

    @property
    def lock(self):
        """The program's lock: every binding of a plan shares its kept arena."""
        return self.program.lock

    @property
    def offsets(self) -> dict:
        """{node: byte offset in the arena} of the intermediate buffers at this binding."""
        return {j: self.slot_at[s] for j, s, _ in self.program.slot_items}

    def _fill_arena(self, base):
        for pos, off in self._by_pos[2]:
            self.ptrs[pos] = base + off

    # ---- running ------------------------------------------------------------------------
    def _plan_outputs(self):
        """Small outputs are carved from one block per run (one allocation, one address
        lookup); large ones come from buffers.alloc (recycled huge-page blocks)."""
        numels = self.numels
        self.small_outputs, self.small_bytes, self.large_outputs = split_outputs(
            (t, numels[j], itemsize, dt) for t, j, itemsize, dt in self.program.target_items)

    def _run_tables(self, slots):
        """What every run fills, worked out at the first: (pointer position, feed number,
        operand slot) per feed pointer and the inputs those feeds are; per small output, its
        slice of the run's block and the pointers into it; per large output, its pointers;
        the call sequence (a segment function, or a Python step with its sizes)."""
        slot_pos, out_pos, _ = self._by_pos
        prog = self.program
        fixed = prog.run_tables          # the size-independent part, once per program
        if fixed is None or fixed[0] is not slots:
            used = sorted({slots[s][0] for _, s in slot_pos})
            feeds = [(pos, used.index(slots[s][0]), slots[s][0], s) for pos, s in slot_pos]
            fixed = prog.run_tables = (slots, used, feeds, None if prog.python_steps else self._call_sequence())
        _, used, feeds, seq = fixed
        small_at = {t: off for t, off, _, _ in self.small_outputs}
        views = [(npdt, n, off) for _, off, n, npdt in self.small_outputs]
        small_fill = [(pos, small_at[t] + off) for pos, t, off in out_pos if t in small_at]
        large_fill = [(pos, t, off) for pos, t, off in out_pos if t not in small_at]
        seq = seq or self._call_sequence()
        self._block = block_type(self.small_bytes + ALIGN)
        self._tables = (used, feeds, views, small_fill, large_fill, seq)
        return self._tables

    _tables = None          # built by _run_tables at the first run

    def _call_sequence(self) -> list:
        """Per item, (segment function, segment number, None), (words item's run, -1, None) or
        (None, Python step, its sizes)."""
        seq, seg = [], 0
        for kind, what in self.items:
            if kind == "native":
                seq.append((self.fns[seg], seg, None))
                seg += 1
            elif kind == "words":           # a tiled / BLAS matmul run from its words (never fails)
                seq.append((what.run, -1, None))
            else:
                seq.append((None, what[0], what[1]))
        return seq

    def _outputs(self, views, small_fill, large_fill):
        """This run's fresh output arrays by target (small ones carved from one 64-byte
        aligned ctypes block: one allocation whose address costs no buffer export) and
        (pointer position, address) of every output pointer."""
        small, fill = [], []
        if views:
            block = self._block()
            addr = _addressof(block)
            skip = -addr % ALIGN
            small = [np.frombuffer(block, npdt, n, skip + off) for npdt, n, off in views]
            addr += skip
            fill = [(pos, addr + off) for pos, off in small_fill]
        if not large_fill and not self.large_outputs:
            return small, fill              # every output is small: `small` is in target order
        outs = [None] * len(self.targets)
        for (t, *_), o in zip(self.small_outputs, small):
            outs[t] = o
        large = {}
        for t, n, dt in self.large_outputs:
            outs[t] = o = alloc(n, dt)
            large[t] = address(o)
        fill += [(pos, large[t] + off) for pos, t, off in large_fill]
        return outs, fill

    def _pack(self, scalars):
        """The scalar slots packed as the kernels read them (executor.pack_scalars' layout:
        f64 bits for floats, i64 / u64 for ints), into one array per program, kept by the
        program while the same capture's list comes back (a Program passes one list every run,
        at every binding).  Called under the program's lock."""
        prog = self.program
        if scalars is not prog.scalars:
            packer = prog.scalar_struct
            if packer is None:
                packer = struct.Struct("=" + "".join(_SCALAR_CODES[dt.kind] for _, dt in scalars))
                packed = np.zeros(max(len(scalars), 1), np.int64)
                prog.scalar_struct, prog.packed = packer, (packed, address(packed))
            try:
                packer.pack_into(prog.packed[0], 0, *[v for v, _ in scalars])
            except struct.error:        # a value its slot's code does not take as it is
                from .executor import pack_scalars
                prog.packed[0][:len(scalars)] = pack_scalars(scalars)
            prog.scalars = scalars
        return prog.packed

    def run(self, in_bufs, offsets, scalars, slots):
        """Run the plan; returns the target buffers (as Plan.run)."""
        used, feeds, views, small_fill, large_fill, seq = self._tables or self._run_tables(slots)
        in_addr = [address(in_bufs[i]) for i in used]
        outs, out_fill = self._outputs(views, small_fill, large_fill)
        nthreads = native_pool.threads()
        with self.lock:
            arena = self.arena
            if arena is None:
                arena = alloc(self.arena_bytes, np.uint8)
                self._fill_arena(address(arena))
            ptrs = self.ptrs
            for pos, k, i, s in feeds:
                off = offsets[s]
                ptrs[pos] = in_addr[k] + off * in_bufs[i].itemsize if off else in_addr[k]
            for pos, addr in out_fill:
                ptrs[pos] = addr
            if self.has_status:
                self.status.fill(0)
            packed, sc = self._pack(scalars)
            p, sz = self.ptrs_addr, self.sizes_addr
            bufs = None
            for fn, seg, sized in seq:
                if fn is not None:
                    rc = fn(p, sz, sc, nthreads)
                    if rc:
                        self._raise_status(seg, rc - 1)
                else:
                    if bufs is None:
                        bufs = self._node_buffers(arena, outs)
                    run_step(seg, in_bufs, offsets, bufs, sized, packed)
        return [outs[t] for t in self.returned]

    def _tables_of(self, slots):
        return self._tables or self._run_tables(slots)

    def _one_call(self, slots, scalars=None, large=False):
        """What both prepared runners share, for the common case only (one native segment,
        small outputs unless `large`, a kept arena; else None): the run tables and `call(fill, scalars)`,
        which under the program's lock writes (position, address) of `fill` into the
        pointers, packs `scalars` unless they are the last packed, and makes the one native
        call (raising the status word's error after it) -- or returns False, doing nothing,
        when a setting read per run (LAZYCANDLE_EXEC=python, LAZYCANDLE_PROFILE, a new matmul
        backend) or a rebuilt native form means the full path must run.  (One closure: an
        eager call usually runs on caches a kernel streamed out, where each frame costs.)"""
        tables = self._tables_of(slots)
        seq = tables[5]
        if len(seq) != 1 or seq[0][0] is None or seq[0][1] < 0 or not self.keep_arena \
                or (tables[4] or self.large_outputs) and not large:     # (seg -1: a matmul run from its words)
            return None
        prog, binding, status = self.program, self.binding, self.status if self.has_status else None
        fn = ctypes.CFUNCTYPE(ctypes.c_int64)(_fn_address(seq[0][0]))    # no argtypes: ctypes args as they are
        with prog.lock:
            packed = self._pack(scalars) if scalars is not None else prog.packed    # (set by every native run)
        if packed is None:
            return None
        call_args = (ctypes.c_void_p(self.ptrs_addr), ctypes.c_void_p(self.sizes_addr), ctypes.c_void_p(packed[1]))
        thread_args = {}
        get_exec, get_profile = config._exec_env[0], config._profile_env[0]
        ptrs, thread_arg = self.ptrs, native_pool.thread_arg

        def call(fill, scalars):
            if (get_exec() is not None or get_profile() is not None) and not _native_flags():
                return False
            if binding.native is not self or self.matmul_epoch != config.matmul_epoch:
                return False
            threads_arg = thread_arg(thread_args)
            with prog.lock:             # read per run: renewed in a forked child
                for pos, addr in fill:
                    ptrs[pos] = addr
                if status is not None:
                    status.fill(0)
                if prog.scalars is not scalars:
                    self._pack(scalars)
                rc = fn(*call_args, threads_arg)
                if rc:
                    self._raise_status(0, rc - 1)
            return True
        return tables, call

    def buffers_runner(self, slots):
        """NativePlan.run as one prepared function `run(in_bufs, offsets, scalars) -> target
        buffers | None` (compiler.BoundPlan.run), for `_one_call`'s common case or one large
        output (else None); None from `run`: nothing done, the caller takes the full path.  A
        lone output is made per run (buffers.result when small: kept and given out again;
        buffers.alloc when large) and, from the second run, filled by the eager launcher
        (runtime/launch.py) when its checks pass."""
        one_large = not self._tables_of(slots)[2] and len(self.large_outputs) == 1
        got = self._one_call(slots, large=one_large)
        if got is None:
            return None
        (used, feeds, views, small_fill, large_fill, _), call = got
        block_type, returned, frombuffer = self._block, self.returned, np.frombuffer
        if one_large:
            _, n_out, out_dt = self.large_outputs[0]
            out_fill = [(pos, off) for pos, _, off in large_fill]
        elif len(views) == 1:
            out_dt, n_out, base_off = views[0]
            out_fill = [(pos, off - base_off) for pos, off in small_fill]
        else:
            out_fill = None
        make = alloc if one_large else result
        ndarray, word, data_at = np.ndarray, read_word, DATA_AT
        launch = [None if out_fill is not None and list(returned) == [0] else False]   # (built at the first run)
        prog, binding = self.program, self.binding
        get_exec, get_profile, threads = config._exec_env[0], config._profile_env[0], native_pool.threads

        def run(in_bufs, offsets, scalars):
            go = launch[0]
            if go and binding.native is self and self.matmul_epoch == config.matmul_epoch and LAUNCH \
                    and (get_exec() is None and get_profile() is None or _native_flags()):
                o = make(n_out, out_dt)
                rc = go(threads(), o, in_bufs, offsets, prog.lock, scalars)
                if rc == 0:
                    return [o]
                if rc > 0:
                    self._raise_status(0, rc - 1)
            elif go is None:
                launch[0] = self._launcher(in_bufs, feeds, out_fill, scalars) or False
            fill = []
            for pos, k, i, s in feeds:
                buf = in_bufs[i]
                addr = word(id(buf) + data_at).value if buf.__class__ is ndarray and data_at else address(buf)
                fill.append((pos, addr + offsets[s] * buf.itemsize))
            if out_fill is not None:
                o = make(n_out, out_dt)
                outs = [o]
                base = word(id(o) + data_at).value if data_at else address(o)
                for pos, off in out_fill:
                    fill.append((pos, base + off))
            else:
                block = block_type()
                base = _addressof(block)
                skip = -base % ALIGN
                base += skip
                outs = [frombuffer(block, npdt, n, skip + off) for npdt, n, off in views]
                for pos, off in small_fill:
                    fill.append((pos, base + off))
            if not call(fill, scalars):
                return None
            return [outs[t] for t in returned]
        return run

    def _launcher(self, in_bufs, feeds, out_fill, scalars):
        """The eager launcher (runtime/launch.py) of this binding's one native call, with the
        item sizes of this run's buffers and the dtype kinds of its scalars (a plan's inputs
        and scalar slots keep their dtypes), or None."""
        return launch.launcher(_fn_address(self._tables[5][0][0]), self.ptrs_addr, self.sizes_addr,
                               self.status if self.has_status else None,
                               [(pos, i, s, in_bufs[i].itemsize) for pos, _, i, s in feeds], out_fill,
                               [dt.kind for _, dt in scalars])

    def program_runner(self, inputs, offsets, scalars, slots, outputs):
        """A Program.run of this binding as one prepared function `run(feeds) -> arrays | None`
        (graph_api._Instance.fast_runner), for `_one_call`'s common case (else None).
        `inputs`: the capture's input nodes (a placeholder is fed by its name, a realized node
        reads its buffer); `outputs`: per user output (target number, element offset, shape).
        `run` returns None -- nothing done, the caller takes the full path -- when `call`
        declines, or unless `feeds` holds exactly the placeholders as C-contiguous ndarrays of
        their dtype objects and shapes."""
        got = self._one_call(slots, scalars)
        if got is None:
            return None
        (used, feeds, _, small_fill, _, _), call = got
        ptr_of_input = {k: [] for k in range(len(used))}
        for pos, k, i, s in feeds:
            ptr_of_input[k].append((pos, offsets[s] * inputs[i].dtype.numpy.itemsize))
        # (name, numpy dtype, shape, pointer positions) per fed input; (node, [(its buffer, address)],
        # pointer positions) per realized one: the memo is replaced whole (threads read it unlocked)
        fed, kept = [], []
        for k, i in enumerate(used):
            n = inputs[i]
            if n.buffer is None:
                fed.append((n.arg, np.dtype(n.dtype.numpy), n.shape, ptr_of_input[k]))
            else:
                kept.append((n, [(n.buffer, address(n.buffer))], ptr_of_input[k]))
        n_feeds = sum(1 for n in inputs if n.buffer is None)
        block_type = self._block
        small_at = {t: (off, npdt) for t, off, _, npdt in self.small_outputs}
        carve = [(shape, small_at[t][1], small_at[t][0] + off * np.dtype(small_at[t][1]).itemsize)
                 for t, off, shape in outputs]
        ndarray = np.ndarray

        def run(feeds):
            if len(feeds) != n_feeds:
                return None
            fill = []
            for name, npdt, shape, where in fed:
                v = feeds.get(name)
                if v.__class__ is not ndarray or v.dtype is not npdt or v.shape != shape or not v.flags.c_contiguous:
                    return None
                addr = address(v)
                for pos, off in where:
                    fill.append((pos, addr + off))
            for n, memo, where in kept:
                buf, addr = memo[0]
                if n.buffer is not buf:         # an in-place op gave the node a new buffer
                    buf = n.buffer
                    addr = address(buf)
                    memo[0] = (buf, addr)
                for pos, off in where:
                    fill.append((pos, addr + off))
            block = block_type()
            base = _addressof(block)
            skip = -base % ALIGN
            base += skip
            outs = [ndarray(shape, npdt, block, skip + at) for shape, npdt, at in carve]
            for pos, off in small_fill:
                fill.append((pos, base + off))
            return outs if call(fill, scalars) else None
        return run

    def _node_buffers(self, arena, outs):
        """The plan's buffers as arrays, for the steps that run in Python."""
        if self._fixed_bufs is not None:
            bufs = dict(self._fixed_bufs)
        else:
            bufs = arena_views(arena, self.offsets, self.numels, self.plan.dtypes)
            if self.keep_arena:
                self._fixed_bufs = dict(bufs)
        for j, o in zip(self.targets, outs):
            bufs[j] = o
        return bufs


    def _raise_status(self, seg, call_no):
        """A kernel of segment `seg` reported a bad id: raise the error its step raises."""
        call = self.call_steps[seg][call_no]
        step = self.steps_of[call.label]
        status = np.frombuffer((ctypes.c_int64 * 2).from_address(int(self.ptrs[call.status_at])), np.int64)
        step.raise_status(int(status[1]), self.binding.steps[self.plan.steps.index(step)])

    # ---- dump -------------------------------------------------------------------------
    def schedule_lines(self) -> list:
        """Segments, phases and barriers, for the schedule dump."""
        lines = ["native program (one call per segment; | = barrier between phases):"]
        seg = 0
        for kind, what in self.items:
            if kind == "python":
                lines.append(f"  python step: {type(what[0]).__name__}")
                continue
            if kind == "words":
                lines.append(f"  between segments: {what.label}")
                continue
            name = segment_names(len(self.segments))[seg]
            lines.append(f"  segment {name}: {len(self.segments[seg])} phase(s)")
            for p, phase in enumerate(self.segments[seg]):
                how = "calling thread" if all(self.sizes[c.word_at + 1] == SERIAL for c in phase) else "pool"
                calls = ", ".join(f"{c.label} [0, {self.sizes[c.word_at]})" for c in phase)
                lines.append(f"    phase {p} ({how}): {calls}" + ("  | barrier" if how == "pool" else ""))
            seg += 1
        lines.append(f"  arena: {self.arena_bytes} bytes for {len(self.offsets)} intermediate buffer(s)"
                     + ("" if self.keep_arena else " (taken per run)"))
        return lines
