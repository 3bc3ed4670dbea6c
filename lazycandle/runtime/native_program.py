"""A Plan's NativeProgram, built once per plan (at its second run) and independent of sizes:
the segments -- runs of consecutive generated kernels (and index kernels, whose bad-id status
word is checked after their phase), split by the steps that run between them: a 2-D tiled or
BLAS matmul run from its words (runtime/matmul_words.py: its sizes are words of the binding like
a kernel's) or a step that needs Python -- grouped in phases of independent kernels (one
barrier per phase), each call's positions in `ptrs` and `sizes`, the arena slots (buffers whose
lifetimes do not overlap share a slot) and the linked module (codegen/program.py).  One per
combination of matmul forms and sized-step kernels (kernel_forms).  runtime/native_exec.py binds it to sizes
(NativePlan) and runs it on the native worker pool (native_pool.py)."""
from __future__ import annotations

import ctypes
import os
import threading
import weakref

import numpy as np

from .. import config
from . import native_pool
from .buffers import address, alloc
from ..codegen.program import PARALLEL, SERIAL, segment_names
from .arena import ALIGN, slots as arena_slots
from .steps import MatmulStep, NodeStep

ARENA_KEEP_BYTES = 256 << 10      # a plan keeps its arena up to this size (512 cached plans: <= 128 MiB)
DIRECT_ARENA_KEEP_BYTES = 8 << 20  # ... a program with a direct path (a named-dim Program run at many sizes:
                                   # its larger sizes bind by one native call too; runtime/native_direct.py)
MIN_PARALLEL_COST = native_pool.MIN_COST        # smaller kernels run on the calling thread
SEGMENT_FN = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

def _fn_address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


_addressof = ctypes.addressof


class NotNative(Exception):
    """A binding of the plan cannot run on the plan's native program (the plan runs it on the
    per-kernel path)."""


def supports(plan) -> bool:
    from .sort_steps import SortTakeStep
    return not any(isinstance(s, SortTakeStep) for s in plan.steps)


_build_lock = threading.Lock()


def program_of(plan, binding=None) -> "NativeProgram":
    """The plan's NativeProgram for `binding`'s kernel forms (default: the plan's own binding):
    one per combination of small-m kernels its matmul steps run -- a row count that crosses
    the small-m rule turns a step from a native call into a Python item -- and of kernels its
    sized steps pick by size (attention's query-length regime), built and linked on first use.
    `plan.native_program` is the one used last."""
    binding = binding or plan.binding
    key = kernel_forms(plan, binding)
    prog = plan.native_programs.get(key)
    if prog is None:
        with _build_lock:
            prog = plan.native_programs.get(key)
            if prog is None:
                prog = plan.native_programs[key] = NativeProgram(plan, binding)
    plan.native_program = prog
    return prog


def kernel_forms(plan, binding) -> tuple:
    """Per matmul step, the address of the small-m kernel it runs at `binding` and the thread
    count its Rebinder is written for, or the key of a plan of its words form
    (matmul_words.form_key), None for one that runs in Python between segments; per sized step,
    the kernel it launches at `binding` (a BERT embedding 6 tokens long, attention's "keys"
    regime, and then 16 long: the one program of the 6 ran the 16 per kernel, ~15 % slower)."""
    from .matmul_words import form_key
    from .steps import SizedStep
    forms, setting = [], config.get_matmul_backend()
    for i, step in enumerate(plan.steps):
        if isinstance(step, MatmulStep):
            got = step.plan_at(binding.steps[i])
            forms.append((_fn_address(got.fn), got.threads) if got.backend == "skinny" else form_key(got, setting))
        elif isinstance(step, SizedStep) and step.kernel_buffers is not None:
            fn = step.launch_of(step.prepare(binding.steps[i])).fn
            forms.append(None if fn is None else _fn_address(fn))
    return tuple(forms)


class BindingSource:
    """How NativeProgram.binding_source writes the parts of a Binding: here from a NativePlan's
    arguments (`st`: Binding.steps, `rd`: read offsets, `nm`: buffer element counts); the
    direct path (native_direct.py) writes them as the symbolic binder's quantities."""

    def numel(self, j):
        return f"nm[{j}]"

    def read(self, i, r):
        return f"rd[{i}][{r}]"

    def layout_offset(self, i, n):
        return f"st[{i}][{n}].offset"

    def layouts(self, i, scope):
        return f"st[{i}]"

    def kernel(self, i, scope):
        return [f"    s{i}, e{i}, c{i} = st[{i}]"]

    def spread(self, i, n):
        """Call i's `n` sizes words in the words list."""
        return f"*s{i}"

    def matmul(self, i, rebind):
        """A small-m matmul's sizes: re-bound while the backend setting holds, else decided again."""
        return [f"    l{i} = st[{i}]\n    g{i} = rb{i}(*l{i}) if (backend(), threads()) == set{i} "
                f"else None\n    s{i}, e{i}, c{i} = g{i} or dc{i}(l{i})"]


    def sized_step(self, i, sized, scope):
        """A sized step's (sizes, extent, cost): its `sized` function of the binding's layouts."""
        scope[f"f{i}"] = sized
        return [f"    s{i}, e{i}, c{i} = f{i}({self.layouts(i, scope)})"]

    def matmul_words(self, i, sized):
        """A tiled or BLAS matmul's words (matmul_words.py), from the binding's layouts."""
        return [f"    s{i}, e{i}, c{i} = wf{i}(st[{i}])"]


class WordsItem:
    """A tiled or BLAS matmul step of a native program between its segments: its words'
    position and the function running it from them (matmul_words.TiledWords.item)."""
    status_at = None

    def __init__(self, word_at, sizes_at, label, run):
        self.word_at, self.sizes_at, self.label, self.run = word_at, sizes_at, label, run


class NativeProgram:
    """The size-independent part of a plan's whole-program form, built once per plan (one size
    class): which steps run natively and in which segment, each call's pointer and size
    positions, the arena slots, the phases and the linked module.  Nothing in it depends on a
    binding's sizes: a call reads its extent and parallel flag from the sizes array, phases
    are decided on slot identity (two buffers of one slot always clash).  A NativePlan binds
    it to one Binding (pointers, sizes, extents, arena offsets)."""

    def __init__(self, plan, binding):
        from ..codegen import jit, program
        self.plan, self.binding = plan, binding     # (the binding whose matmul forms it calls)
        self.slots = arena_slots(plan)
        self.targets = list(dict.fromkeys(plan.targets))      # one buffer per node, even when
        self.target_index = {j: t for t, j in enumerate(self.targets)}     # several targets share it
        self.returned = [self.target_index[j] for j in plan.targets]
        self.steps_of = {}                 # call label -> plan step (to raise its error)
        self.kept_plans = []               # small-m matmul plans the program calls (keep their kernels)
        self.linked_fns = {}               # symbol -> the kernel the module imports by address (_import)
        # refs: per ptrs position ("slot", s) | ("node", j, element offset) | ("status", n); an
        # element offset is an int, (step, read) into the binding's read_offsets or
        # ("layout", step, operand): the offset of a node step's operand layout at the binding
        refs, self.calls_sized = [], []    # per native call: (word position, sizes position, what its sizes are, step)
        items, imports, names = [], {}, {}     # items: ("native", [(call, regions)]) | ("python", step index)
        n_words = 0
        status_words = 0
        for i, (step, k) in enumerate(zip(plan.steps, plan.kernels)):
            if not isinstance(step, NodeStep) and not binding.steps[i][1]:
                continue                    # a zero-size dim: nothing to compute at any size of the class
            got = self._call_of(i, step, k, refs, n_words, imports, names, status_words)
            if got is None:
                items.append(("python", i))
                continue
            call, sized, n_sizes = got
            self.calls_sized.append((call.word_at, call.sizes_at, sized, i))
            n_words = call.word_at + 2 + n_sizes
            status_words += call.status_at is not None
            self.steps_of[call.label] = step
            if call.__class__ is WordsItem:
                items.append(("words", call))
                continue
            if not items or items[-1][0] != "native":
                items.append(("native", []))
            items[-1][1].append((call, self._regions(step, k)))
        self.segments = [_phases(calls) for kind, calls in items if kind == "native"]
        self.items = items
        self.refs = refs
        self.status = np.zeros(2 * max(status_words, 1), np.int64)     # shared: runs are serialised
        # what a binding fills in: ptrs then sizes, one int64 block
        self.n_refs = len(refs)
        self.words = [0] * max(self.n_refs + n_words, 1)
        self.slot_pos, self.out_refs, self.arena_refs = [], [], []   # (pos, target | slot, element offset, itemsize)
        for pos, r in enumerate(refs):
            if r[0] == "slot":
                self.slot_pos.append((pos, r[1]))
            elif r[0] == "status":
                self.words[pos] = address(self.status) + 16 * r[1]
            elif r[0] == "fixed":
                self.words[pos] = r[1]
            else:
                j, size = r[1], plan.dtypes[r[1]].numpy.itemsize
                if j in self.target_index:
                    self.out_refs.append((pos, self.target_index[j], r[2], size))
                else:
                    self.arena_refs.append((pos, self.slots[0][j], r[2], size))
        self.calls_sized = [(self.n_refs + w, None if at is None else self.n_refs + at, sized, i)
                            for w, at, sized, i in self.calls_sized]
        self.slot_items = [(j, s, plan.dtypes[j].numpy.itemsize) for j, s in self.slots[0].items()]
        self.target_items = [(t, j, plan.dtypes[j].numpy.itemsize, plan.dtypes[j]) for t, j in enumerate(self.targets)]
        self.python_steps = any(kind == "python" for kind, _ in items)
        self.module, self.fns = None, []
        if self.segments:
            imports["lc_pool_run"] = native_pool.address("lc_pool_run")
            seg_names = segment_names(len(self.segments))
            self.module = jit.link_ir(program.build(self.segments), seg_names, imports, optimize=False)
            self.fns = [SEGMENT_FN(self.module.address(n)) for n in seg_names]
        self.call_steps = [[c for phase in seg for c in phase] for seg in self.segments]
        fns = iter(self.fns)            # segment functions and words items, in order (the direct path)
        self.sequence = [next(fns) if kind == "native" else what.run for kind, what in items if kind != "python"]
        self.words_items = any(kind == "words" for kind, _ in items)
        self.has_status = status_words > 0
        self.lock = threading.Lock()       # serialises the runs of every binding (they may share an arena)
        self.arena = None                  # (kept arena, address), grown for the largest binding so far
        self.arena_cap = ARENA_KEEP_BYTES  # ... up to this (a program with a direct path: DIRECT_ARENA_KEEP_BYTES)
        self.scalars, self.packed = None, None      # the last scalar list run and its packed form
        self.scalar_struct = None          # the struct.Struct packing the plan's scalar slots (fixed dtypes)
        self.slot_fn, self.fill_fn = self._generated_binders()
        self.run_tables = None             # (slots, feed tables, call sequence): NativePlan._run_tables
        self.last_bound = None             # the NativePlan built last (a new binding copies its fixed part)
        _live.add(self)

    def _generated_binders(self):
        """What a NativePlan works out per binding, as two straight-line functions generated once
        per program (a decode loop binds a new length at every token):
          slots(numels) -> (byte offset per arena slot, arena bytes): each slot as large as its
              largest buffer, 64-byte aligned (arena.layout);
          fill(steps, reads, at, base) -> (words, out refs): the ptrs + sizes block -- every arena
              pointer at `base` (0: offsets, for an arena taken per run), every call's extent,
              SERIAL | PARALLEL and sizes -- and (position, target, byte offset) per output pointer.
        Feed and output pointers are left 0: each run writes them."""
        scope: dict = {}
        src = BindingSource()
        slot_lines, fill_lines, words, outs = self.binding_source(src, scope)
        exec(compile("\n".join(["def slots(nm):"] + slot_lines + ["    return at, top"]) + "\n",
                     "<native slots>", "exec"), scope)
        exec(compile("\n".join(["def fill(st, rd, at, base):"] + fill_lines + [f"    return {words}, {outs}"])
                     + "\n", "<native binding>", "exec"), scope)
        return scope["slots"], scope["fill"]

    def binding_source(self, src, scope):
        """The source of a binding's native words, with each part of the binding as `src`
        (a BindingSource) writes it: (slot lines -- `at`: byte offset per arena slot, `top`:
        arena bytes --, fill lines -- each call's s<i>, e<i>, c<i>: sizes, extent, cost per
        unit --, the words list expression (arena pointers at `base`), the output refs list
        expression: (position, target, byte offset) per output pointer).  `scope` gets the
        names the lines use."""
        def element(e):
            if e.__class__ is int:
                return str(e)
            return src.read(e[0], e[1]) if len(e) == 2 else src.layout_offset(e[1], e[2])
        per_slot = [[] for _ in range(self.slots[1])]
        for j, slot, itemsize in self.slot_items:
            per_slot[slot].append(f"({src.numel(j)} * {itemsize} + {ALIGN - 1}) & -{ALIGN}")
        lines = []
        for slot, sizes in enumerate(per_slot):
            lines.append(f"    z{slot} = max({ALIGN}, {', '.join(sizes)})" if sizes else f"    z{slot} = {ALIGN}")
        starts = ["0"] + [" + ".join(f"z{k}" for k in range(slot + 1)) for slot in range(self.slots[1])]
        lines.append(f"    at, top = [{', '.join(starts[:-1])}], {starts[-1]}")
        scope.update(backend=config.get_matmul_backend, threads=config.get_num_threads)
        words, outs = [], []
        arena_at = {pos: (slot, e, size) for pos, slot, e, size in self.arena_refs}
        for pos in range(self.n_refs):
            if pos in arena_at:
                slot, e, size = arena_at[pos]
                words.append(f"base + at[{slot}] + {element(e)} * {size}")
            else:
                words.append(str(self.words[pos]))
        for pos, t, e, size in self.out_refs:
            outs.append(f"({pos}, {t}, {element(e)} * {size})")
        body = []
        ends = [w for w, _, _, _ in self.calls_sized[1:]] + [len(self.words)]
        at = self.n_refs
        for (word_at, sizes_at, sized, i), end in zip(self.calls_sized, ends):
            if word_at != at:
                raise AssertionError("native program: the calls' words are not back to back")
            if sized.__class__ is int:
                body += src.kernel(i, scope)
            elif sized.__class__ is tuple:
                scope[f"k{i}"] = sized
                body.append(f"    s{i}, e{i}, c{i} = k{i}")
            elif getattr(sized, "words", None) is not None:         # a tiled or BLAS matmul: _matmul_words
                scope[f"wf{i}"], scope[f"set{i}"] = sized, sized.setting
                body += src.matmul_words(i, sized)
            elif getattr(sized, "rebind", None) is not None:        # a small-m matmul: _matmul_call's sized
                scope[f"rb{i}"], scope[f"set{i}"], scope[f"dc{i}"] = sized.rebind, sized.setting, sized.decide
                body += src.matmul(i, sized.rebind)
            else:
                body += src.sized_step(i, sized, scope)
            words += [f"e{i}", f"({PARALLEL} if e{i} * c{i} >= {MIN_PARALLEL_COST!r} and e{i} > 1 else {SERIAL})"]
            if sizes_at is not None:
                words.append(src.spread(i, end - sizes_at))
            at = end
        if not self.calls_sized:
            words += ["0"] * (len(self.words) - len(words))
        return lines, body, f"[{', '.join(words)}]", f"[{', '.join(outs)}]"

    def _ref_of_bind(self, bind, read):
        """The pointer ref of a kernel operand: a feed slot, or node bind[1] at element `read`."""
        if bind[0] == "slot":
            return ("slot", bind[1])
        return ("node", bind[1], read)

    def _call_of(self, i, step, k, refs, word_at, imports, names, status_no):
        """(program.Call, what its sizes are, size count) of plan step i, appending its pointer
        refs; None for a step that runs in Python.  `word_at`: where its [extent, parts] words
        go in the sizes array (its own sizes follow them); what its sizes are: the step index
        (the binding's (sizes, extent, cost) of that step), a constant (sizes, extent, cost),
        or a function of the binding's entry for the step giving them (a node step's layouts).
        The size count and every ref are the same at every binding of the plan."""
        from ..codegen.program import Call
        from .steps import SizedStep
        bufs_at = len(refs)
        if isinstance(step, SizedStep) and step.kernel_buffers is not None:
            own = step.launch_of(step.prepare(self.binding.steps[i]))
            if own.fn is None:
                return None
            status_at = self._sized_refs(step, i, refs, status_no)
            fn, n_sizes, align, slots = own.fn, len(own.sizes), 1, ()

            def sized(layouts):
                got = step.launch_of(step.prepare(layouts))
                if got.fn is not own.fn or len(got.sizes) != n_sizes:
                    raise NotNative(f"step {i}: the kernel at this binding is not the program's kernel")
                return got.sizes, got.units, got.unit_cost
            sized.source = lambda i, lays: step.sizes_source(i, lays, own)     # the direct path's inline form
        elif isinstance(step, MatmulStep):
            return self._matmul_call(i, step, refs, word_at, imports, names)
        elif isinstance(step, NodeStep):
            return None
        else:
            reads = iter(range(sum(1 for b in k.inputs if b[0] == "node")))
            refs += [self._ref_of_bind(bind, (i, next(reads)) if bind[0] == "node" else 0) for bind in k.inputs]
            refs += [self._ref_of_bind(("node", j), 0) for j in k.outputs]
            n_sizes = len(self.binding.steps[i][0])
            fn, align, slots, sized = step.fn, step.align, tuple(k.scalars), i
            status_at = None
        sym = self._import(fn, imports, names)
        call = Call(sym, word_at, int(align), bufs_at, word_at + 2 if n_sizes else None, slots, status_at,
                    label=f"#{i} {k.kind}")
        return call, sized, n_sizes

    def _import(self, fn, imports, names) -> str:
        """The symbol the linked module calls kernel `fn` (a ctypes function) by.  The link binds
        its raw address, which LLVM does not track: the program keeps `fn`, and so its code."""
        addr = _fn_address(fn)
        sym = names.setdefault(addr, f"kernel{len(names)}")
        imports[sym] = addr
        self.linked_fns[sym] = fn
        return sym

    def _matmul_call(self, i, step, refs, word_at, imports, names):
        """(Call, sizes function, size count) of a matmul step whose plan at the plan's own
        binding is the small-m kernel (it takes the standard kernel arguments: a, b, out,
        epilogue operands), else _matmul_words' item (a 2-D tiled or BLAS plan, run between
        segments from its words) or None (a step run in Python between segments).
        At another binding the step must run the same kernel with as many sizes, else that
        binding runs on the per-kernel path (NotNative)."""
        from ..codegen.program import Call
        from . import matmul_skinny
        own = step.native_plan(self.binding.steps[i])
        if own is None:
            return self._matmul_words(i, step, refs, word_at)
        self.kept_plans.append(own)             # keeps its compiled kernel alive
        bufs_at = self._matmul_refs(i, step, refs)
        n_sizes = len(own.sizes_list)
        rebind = matmul_skinny.Rebinder(own)
        setting = (config.get_matmul_backend(), own.threads)

        def decide(layouts):
            got = step.native_plan(layouts)
            if got is None or got.fn is not own.fn or len(got.sizes_list) != n_sizes:
                raise NotNative(f"step {i}: the matmul plan at this binding is not the program's kernel")
            return got.sizes_list, got.extent, got.cost

        def sized(layouts):
            """The kernel's (sizes, extent, cost) at a binding: by arithmetic while the backend
            setting and the decision's bucket hold (matmul_skinny.Rebinder), else decided again."""
            if (config.get_matmul_backend(), config.get_num_threads()) == setting:
                got = rebind(*layouts)
                if got is not None:
                    return got
            return decide(layouts)
        sized.rebind, sized.setting, sized.decide = rebind, setting, decide     # inlined by _generated_binders
        sym = self._import(own.fn, imports, names)
        slots = tuple(step.kernel.epilogue.kernel.scalars) if step.ep_key else ()
        call = Call(sym, word_at, 1, bufs_at, word_at + 2 if n_sizes else None, slots, None,
                    label=f"#{i} matmul (small-m)")
        return call, sized, n_sizes

    def _matmul_refs(self, i, step, refs) -> int:
        """Append a matmul step's pointer refs (a, b, the output, the epilogue operands, unused
        epilogue slots 0); returns the position of the first."""
        from ..codegen.gemm_skinny import MAX_EPILOGUE_INPUTS
        bufs_at = len(refs)
        for n in (0, 1):
            kind, idx, _, lay, _ = step.operands[n]
            off = ("layout", i, n) if step.binds_layouts else lay.offset
            refs.append(("slot", idx) if kind == "in" else self._ref_of_bind(("node", idx), off))
        refs.append(self._ref_of_bind(("node", step.out), 0))
        for e, (kind, buf, slot) in enumerate(step.ep_reads):
            refs.append(("slot", slot) if kind == "in" else self._ref_of_bind(("node", buf), ("layout", i, 2 + e)))
        refs += [("fixed", 0)] * (bufs_at + 3 + MAX_EPILOGUE_INPUTS - len(refs))     # unused epilogue slots
        return bufs_at

    def _matmul_words(self, i, step, refs, word_at):
        """(WordsItem, sizes function, size count) of a matmul step whose plan at the program's
        binding has a words form (matmul_words.py: 2-D tiled or BLAS), else None."""
        from . import matmul_words
        plan = step.plan_at(self.binding.steps[i])
        setting = config.get_matmul_backend()
        form = matmul_words.form_of(plan)
        if form is None:
            return None
        self.kept_plans.append(plan)
        n_extras = len(step.ep_reads)
        bufs_at = self._matmul_refs(i, step, refs)
        words = matmul_words.layered(form, [len(lay.shape) for lay in self.binding.steps[i]])

        def sized(layouts):
            got = words(layouts)
            if got is None:
                raise NotNative(f"step {i}: the {plan.backend} matmul at this binding is not the program's form")
            return got
        sized.words, sized.setting = form, (setting, plan.threads)
        if plan.backend == "tiled":
            scal = tuple(step.kernel.epilogue.kernel.scalars) if step.ep_key else ()
            run = form.item(bufs_at, word_at + 2, n_extras, scal)
        else:
            ep = matmul_words.blas_epilogue(step, n_extras, lambda: self.packed[0]) if step.ep_key else None
            run = form.item(bufs_at, word_at + 2, ep)
        return WordsItem(word_at, word_at + 2, f"#{i} matmul ({plan.backend})", run), sized, form.n_words

    def _sized_refs(self, step, i, refs, status_no):
        """Append the pointers of a single-call sized step's kernel (steps.SizedStep's
        kernel_buffers: node operands at each binding's layout offsets); the position of its
        status word, or None."""
        status_at = None
        for item in step.kernel_buffers:
            if item[0] == "node":
                refs.append(self._ref_of_bind(item, 0))
            elif item[0] == "operand":
                kind, idx = step.operands[item[1]][:2]
                refs.append(("slot", idx) if kind == "in" else self._ref_of_bind(("node", idx), ("layout", i, item[1])))
            else:
                status_at = len(refs)
                refs.append(("status", status_no))
        return status_at

    def _regions(self, step, k):
        """(reads, writes) of a step as memory regions: ("out", t) or ("slot", s); buffers of
        one slot are one region at every size."""
        slot_of = self.slots[0]

        def region(j):
            return ("out", self.target_index[j]) if j in self.target_index else ("slot", slot_of[j])
        if isinstance(step, NodeStep):
            reads = [region(idx) for kind, idx, *_ in step.operands if kind == "node"]
            reads += [region(idx) for kind, idx, *_ in getattr(step, "ep_reads", ()) if kind == "node"]
            return reads, [region(step.out)] + [region(j) for j in k.outputs if j != step.out]   # (+ attention's lse)
        reads = [region(b[1]) for b in k.inputs if b[0] == "node"]
        return reads, [region(j) for j in k.outputs]

    def arena_at_least(self, nbytes):
        """(arena, its address): the program's kept arena, grown to at least `nbytes` (a
        binding keeps the arena it was bound to: a grown one serves later bindings).  Read and
        replaced as one tuple, so a binding built on another thread never mixes two arenas."""
        got = self.arena
        if got is None or got[0].size < nbytes:
            grow = 0 if got is None else got[0].size * 2
            arena = alloc(min(max(nbytes, grow), max(nbytes, self.arena_cap)), np.uint8)
            got = self.arena = (arena, address(arena))
        return got


_live = weakref.WeakSet()         # every NativeProgram, for the fork handler


def _renew_locks_after_fork():
    """A forked child has only the forking thread: a run another thread was in holds its
    program's lock forever."""
    for native in list(_live):
        native.lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_locks_after_fork)


def _phases(calls):
    """Group consecutive calls into phases of independent calls: a call joins the current
    phase unless it reads what a member writes or writes what a member reads or writes."""
    phases, members = [], []
    for call, (reads, writes) in calls:
        clash = any(w == x for _, (r2, w2) in members for w in writes for x in r2 + w2) or \
            any(r == w for _, (_, w2) in members for r in reads for w in w2)
        if clash or not members:
            if members:
                phases.append([c for c, _ in members])
            members = []
        members.append((call, (reads, writes)))
    if members:
        phases.append([c for c, _ in members])
    return phases
