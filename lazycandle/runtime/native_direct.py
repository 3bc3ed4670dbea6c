"""The direct path of a named-dim program's size class: a new size is one generated function
and one native call.

The layered path binds a new size through the program binding, the symbolic plan binding,
Plan.bind_values (a Binding of Layouts, extents and costs) and a NativePlan (its words block
filled from that Binding).  Once a size class runs natively, `derive` writes those steps as
one straight-line function of the named-dim values: the upper layer's lines give the flat
quantities `q` (symbolic_plan.derive_direct), and NativeProgram.binding_source writes the
arena slots, every pointer and every call's sizes words from `q` directly (DirectSource) --
a small-m matmul's sizes by its Rebinder on shapes and strides, without Layouts.  The
function returns None wherever a layered step would decide again (a view out of bounds, a
size that leaves the class, a matmul leaving its bucket, a backend change, an arena above
DIRECT_ARENA_KEEP_BYTES); the caller then runs the layered path, which decides or raises.
DirectRunner runs the words on the program's native segments: the words block, the pointers
of feeds and outputs and the status words are written under the program's lock (runs of the
plan, at any binding, are serialised there), so threads at different sizes do not mix.  When the
binder is compiled and the outputs keep their shape at every size (a decode step), all of that
is one native call (codegen/binder_ir.run_module) behind one generated Python function."""
from __future__ import annotations

import ast
import ctypes
import struct
from math import prod

import numpy as np

from .. import config
from ..layout import Layout
from . import fold, native_pool
from .buffers import alloc
from .native_exec import block_type, split_outputs
from .native_program import ALIGN, DIRECT_ARENA_KEEP_BYTES, BindingSource, NotNative, _addressof, _fn_address, address


class DirectSource(BindingSource):
    """A binding's parts written as the flat quantities (Plan.q_positions), each a source token
    (`q`: per position, a literal or the local holding it)."""

    def __init__(self, plan, q, binding=None):
        self.steps, self.reads, self.numels = plan.q_positions()
        self.q, self.plan, self.binding = q, plan, binding

    def _tuple(self, at, n):
        return "(" + "".join(f"{self.q[at + c]}, " for c in range(n)) + ")"

    def numel(self, j):
        return self.q[self.numels[j]]

    def read(self, i, r):
        return self.q[self.reads[i][0] + r]

    def layout_offset(self, i, n):
        return self.q[self.steps[i][1][n][2]]

    def layouts(self, i, scope):
        scope["Layout"] = Layout
        return "[" + ", ".join(f"Layout({self._tuple(sh, r)}, {self._tuple(st, r)}, {self.q[off]})"
                               for sh, st, off, r in self.steps[i][1]) + "]"

    def kernel(self, i, scope):
        _, spec, at, count = self.steps[i]
        tokens = self._tokens(at, count)
        extent, cost = spec.extent_source(tokens), spec.cost_source(tokens)
        if extent is None:
            scope[f"extent{i}"], extent = spec.extent, f"extent{i}(s{i})"
        if cost is None:
            scope[f"cost{i}"], cost = spec.cost, f"cost{i}(s{i})"
        return [f"    s{i} = {self._tuple(at, count)}", f"    e{i} = {extent}", f"    c{i} = {cost} / (e{i} or 1)"]

    def sized_step(self, i, sized, scope):
        """A sized step's sizes written out from shape and stride tokens (SizedStep.sizes_source),
        so the binder compiles; else its function called on Layouts."""
        source = getattr(sized, "source", None)
        if source is not None:
            lays = [(self._tokens(sh, r), self._tokens(st, r)) for sh, st, _, r in self.steps[i][1]]
            lines = source(i, lays)
            if lines is not None:
                return lines
        return super().sized_step(i, sized, scope)

    def matmul(self, i, rebind):
        """The small-m kernel's sizes by its Rebinder, written out (Rebinder.source) or called."""
        a, b, *ep = [(self._tokens(sh, r), self._tokens(st, r)) for sh, st, _, r in self.steps[i][1]]
        lines = [f"    if setting != set{i}:\n        return None"]
        inline = rebind.source(i, a[0], a[1], b[0], b[1], ep)
        if inline is not None:
            return lines + inline

        def tup(part):
            return "(" + "".join(f"{x}, " for x in part) + ")"
        args = ", ".join(tup(part) for part in (*a, *b)) + ", (" + "".join(f"({tup(sh)}, {tup(st)}), " for sh, st in ep) + ")"
        return lines + [f"    g{i} = rb{i}.sized({args})", f"    if g{i} is None:\n        return None",
                        f"    s{i}, e{i}, c{i} = g{i}"]

    def matmul_words(self, i, sized):
        """A tiled or BLAS matmul's words written out (matmul_words.py), its regime checked."""
        a, b, *ep = [(self._tokens(sh, r), self._tokens(st, r)) for sh, st, _, r in self.steps[i][1]]
        from .matmul_words import Regime
        plan = self.plan.steps[i].plan_at(self.binding.steps[i])    # the binding the path is derived at
        regime = Regime(plan.g, plan.backend, sized.setting[0], plan.threads)
        return [f"    if setting != set{i}:\n        return None"] + sized.words.lines(i, a, b, ep, regime)

    def spread(self, i, n):
        return ", ".join(f"s{i}[{c}]" for c in range(n))

    def _tokens(self, at, n):
        return [self.q[at + c] for c in range(n)]


def derive(plan, prefix, q, results, inputs, n_sizes):
    """The DirectRunner of `plan` (running natively, no step in Python) for the size class
    whose upper-layer lines `prefix` (of `sizes`, the named-dim values) define the flat
    quantities (`q`: a source token per position) or return None; `results`: sources of the
    slot offsets, output shapes and output offsets; `inputs`: the capture's input nodes.  None
    when the plan has no such path.  The function is constant-folded (fold.py): it returns
    only the words that depend on the sizes; the others are written into the block once."""
    prog = plan.native_program
    if prog is None or prog.python_steps or not prog.sequence or prog.last_bound is None:
        return None
    prog.arena_cap = DIRECT_ARENA_KEEP_BYTES
    scope: dict = {"arena_at_least": prog.arena_at_least}
    src = DirectSource(plan, q, prog.last_bound.binding)
    slot_lines, fill_lines, words, outs = prog.binding_source(src, scope)
    numels = "(" + "".join(f"{src.numel(j)}, " for j in prog.targets) + ")"
    matmuls = any(k.startswith(("rb", "wf")) for k in scope)
    lines = (["def direct(sizes):"] + prefix + ["    setting = (backend(), threads())"] * matmuls
             + slot_lines
             + [f"    if top > {DIRECT_ARENA_KEEP_BYTES}:\n        return None", "    arena = arena_at_least(top)",
                "    base = arena[1]"] + fill_lines
             + [f"    return {words}, {outs}, {numels}, arena, {', '.join(results)}"])
    pure = {"max": max, "min": min, "len": len, "set": set, "list": list}
    pure.update((k, v) for k, v in scope.items() if k.startswith(("extent", "cost")))
    constants = {k: v for k, v in scope.items() if k[0] in "ks" and k[1:].isdigit() or k.startswith("set")}
    fn_ast = fold.fold("\n".join(lines) + "\n", pure, constants)
    ret = fn_ast.body[-1]
    fixed, written = [], {}         # the block's words at every size of the class; the others' expressions
    for pos, e in enumerate(ret.value.elts[0].elts):
        if isinstance(e, ast.Constant):
            fixed.append(e.value)
        elif isinstance(e, ast.Starred):
            return None             # sizes of unknown count: not written by the generators here
        else:
            fixed.append(0)
            written[pos] = e
    rest = ret.value.elts[1:]       # out_pos, numels, arena, slot offsets, out shapes, out offsets
    outputs = _constant([e for k, e in enumerate(rest) if k != 2])
    if outputs is not None:         # the same at every size: returned by the runner, not the function
        ret.value = rest[2]
    else:
        ret.value.elts = rest
    statements = fn_ast.body[:-1]
    fn_ast.body[-1:] = []
    source = ast.unparse(ast.fix_missing_locations(fn_ast)) + "\n"
    if written:                     # one pack of the span the sizes write (constants kept in it)
        lo, hi = min(written), max(written)
        scope["pack_words"] = struct.Struct(f"={hi - lo + 1}q").pack_into
        source += (f"    pack_words(w, {8 * lo}, " + ", ".join(ast.unparse(written[p]) if p in written else repr(fixed[p])
                                                        for p in range(lo, hi + 1)) + ")\n")
    source += f"    return {ast.unparse(ret.value)}\n"
    block = np.array(fixed, np.int64)
    scope["w"] = block
    exec(compile(source, "<direct binding>", "exec"), scope)
    python_fn = scope["direct"]
    results = None if outputs is not None else _results_fn([e for k, e in enumerate(rest) if k != 2], statements)
    fn = python_fn
    if outputs is not None or results is not None:
        fn = _native_binder(statements, written, prog, block, n_sizes, scope, results) or python_fn
    runner = DirectRunner(plan, prog, fn, source, inputs, block, outputs)
    runner.python_fn = python_fn    # the same words in Python (what the tests compare `fn` with)
    return runner


def _is_setting(stmt) -> bool:
    """The matmul setting read (`x = backend()` / `threads()`) or its check."""
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
        return isinstance(stmt.value.func, ast.Name) and stmt.value.func.id in ("backend", "threads")
    return isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) and isinstance(stmt.test.left, ast.Tuple)


def _results_fn(nodes, statements):
    """A Python function of the sizes tuple giving the output tables `nodes` (out_pos, numels,
    slot offsets, out shapes, out offsets) with only the assignments they read: what the
    compiled binder leaves to Python when the outputs vary with the sizes."""
    ret = ast.Tuple(list(nodes), ast.Load())
    needed = {n.id for n in ast.walk(ret) if isinstance(n, ast.Name)}
    kept = []
    for st in reversed(statements):
        if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name) and st.targets[0].id in needed:
            kept.append(st)
            needed |= {n.id for n in ast.walk(st.value) if isinstance(n, ast.Name)}
    fn = ast.FunctionDef("results", ast.arguments([], [ast.arg("sizes")], None, [], [], None, []),
                         kept[::-1] + [ast.Return(ret)], [], None)
    module = ast.fix_missing_locations(ast.Module([fn], []))
    scope = {"__builtins__": {}, "max": max, "min": min, "list": list}
    try:
        exec(compile(module, "<direct results>", "exec"), scope)
    except SyntaxError:
        return None
    return scope["results"]


def _native_binder(statements, written, prog, block, n_sizes, scope, results=None):
    """The direct function compiled (codegen/binder_ir.py): `bind(key)` returns what the Python
    function returns (the arena when the outputs are the same at every size, else with the
    output tables of `results(key)`) after one native call for the words (two when the arena
    grows); the setting check stays in Python.  None when the function has a form binder_ir
    does not compile."""
    from ..codegen import binder_ir, jit
    settings = [ast.unparse(st) for st in statements if _is_setting(st)]
    text = binder_ir.build([st for st in statements if not _is_setting(st)], written)
    if text is None:
        return None
    module = jit.link_ir(text, ["bind"])
    native = ctypes.CFUNCTYPE(ctypes.c_int64)(module.address("bind"))     # args premade: no conversions
    settings_ok = None
    if settings:
        src = "def settings_ok():\n" + "".join("    " + line.replace("\n", "\n    ") + "\n" for line in settings) \
            + "    return True\n"
        src = src.replace("return None", "return False")
        exec(compile(src, "<direct settings>", "exec"), scope)
        settings_ok = scope["settings_ok"]
    args = np.zeros(3 + n_sizes, np.int64)     # arena base, arena bytes, the bytes needed, sizes
    call_args = (ctypes.c_void_p(address(args)), ctypes.c_void_p(address(block)))
    pack = struct.Struct(f"={3 + n_sizes}q").pack_into

    def bind(key):
        if settings_ok is not None and not settings_ok():
            return None
        arena = prog.arena
        try:
            if arena is None:
                pack(args, 0, 0, 0, 0, *key)
            else:
                pack(args, 0, arena[1], arena[0].size, 0, *key)
        except struct.error:        # a size beyond i64
            return None
        rc = native(*call_args)
        if rc == binder_ir.GROW:
            arena = prog.arena_at_least(int(args[2]))
            args[0], args[1] = arena[1], arena[0].size
            rc = native(*call_args)
        if rc != binder_ir.OK:
            return None
        if results is None:
            return arena
        out_pos, numels, offsets, out_shapes, out_offsets = results(key)
        return out_pos, numels, arena, offsets, out_shapes, out_offsets
    bind.module = module            # kept alive with the function
    bind.parts = (native, settings_ok)     # for the one-call runner (DirectRunner._one_call_runner)
    return bind


def _constant(nodes):
    """The values of expression nodes that are displays of literals (list/tuple displays, and
    list() of one), or None when any depends on a name."""
    try:
        return [eval(compile(ast.Expression(n), "<literal>", "eval"), {"__builtins__": {}, "list": list})
                for n in nodes]
    except NameError:
        return None


class DirectRunner:
    """One size class of a named-dim program, run directly: `run(arrays, sizes, scalars)` gives
    the outputs, or None when these sizes are not this class's (the caller binds them the
    layered way).  Its generated function writes the words that depend on the sizes into the
    runner's block (under the program's lock, where the block is read) and returns the rest
    of the binding; the sizes run last are kept, so the same sizes again write only the feed
    and output pointers."""

    def __init__(self, plan, prog, fn, source, inputs, block, outputs=None):
        self.plan, self.program, self.fn, self.source = plan, prog, fn, source
        self.packer = prog.last_bound            # a NativePlan of the program: packs the scalars
        self.block = block
        self.block_addr = address(block)
        self.sizes_addr = self.block_addr + 8 * prog.n_refs
        self.inputs = [(n.arg if n.buffer is None else None, n.buffer) for n in inputs]
        self.used = sorted({plan.slots[s][0] for _, s in prog.slot_pos})
        self.feeds = [(pos, self.used.index(plan.slots[s][0]), plan.slots[s][0], s) for pos, s in prog.slot_pos]
        self.target_types = [(dt.numpy.itemsize, dt) for _, _, _, dt in prog.target_items]
        self.fns, self.returned = prog.fns, prog.returned
        self.epoch = config.matmul_epoch
        self.last = None            # (sizes key, arena, slot offsets, output tables, slices): what the block holds
        self.names = ()             # the named dims, in the order of a sizes key (feeds_runner)
        self._tables = None         # (key, output tables) of the last bound sizes
        self._constant_tail = None  # (slot offsets, output tables, slices) of size-independent outputs
        self.outputs = outputs      # (out_pos, numels, slot offsets, out shapes, out offsets) when
                                    # they are the same at every size: `fn` returns only the arena

    def clear(self) -> None:
        with self.program.lock:
            self.last = self._tables = None

    def bound_sizes(self):
        """The named-dim sizes the block holds (a dict), or None."""
        last = self.last
        return None if last is None else dict(zip(self.names, last[0]))

    def _bind(self, key):
        """Write the words of the named-dim values `key` (in `names` order) and return (key,
        arena, slot offsets, output tables, output slices), or None (not this class)."""
        try:
            got = self.fn(key)
        except NotNative:           # an index kernel of another form at these sizes
            return None
        if got is None:
            return None
        if self.outputs is not None:
            return (key, got) + self._constant_outputs()
        else:
            out_pos, numels, arena, offsets, out_shapes, out_offsets = got
        outputs = (out_pos, numels, out_shapes, out_offsets)
        tables = self._tables
        if tables is None or tables[0] != outputs:
            tables = self._tables = (outputs, self._output_tables(out_pos, numels, out_shapes, out_offsets),
                                     _slices(out_shapes, out_offsets))
        return (key, arena, offsets) + tables[1:]

    def _constant_outputs(self):
        """(slot offsets, output tables, output slices) of a class whose outputs are the same at
        every size (`outputs` given)."""
        if self._constant_tail is None:
            out_pos, numels, offsets, out_shapes, out_offsets = self.outputs
            self._constant_tail = (offsets, self._output_tables(out_pos, numels, out_shapes, out_offsets),
                                   _slices(out_shapes, out_offsets))
        return self._constant_tail

    def _output_tables(self, out_pos, numels, out_shapes, out_offsets):
        """(small-output block type, small outputs, large outputs, pointer fills of the small
        ones, pointer fills per large target, and per user output (shape, numpy dtype, byte
        offset in the block) when every output is small)."""
        small, top, large = split_outputs((t, n, itemsize, dt)
                                          for t, ((itemsize, dt), n) in enumerate(zip(self.target_types, numels)))
        small_at = {t: (off, npdt) for t, off, _, npdt in small}
        small_fill = [(pos, small_at[t][0] + off) for pos, t, off in out_pos if t in small_at]
        large_fill = {}
        for pos, t, off in out_pos:
            if t not in small_at:
                large_fill.setdefault(t, []).append((pos, off))
        carve = []
        if not large:
            for u, (shape, off) in enumerate(zip(out_shapes, out_offsets)):
                at, npdt = small_at[self.returned[u]]
                carve.append((shape, npdt, at + off * np.dtype(npdt).itemsize))
        return block_type(top + ALIGN), small, large, small_fill, large_fill, carve

    def feeds_runner(self, named, names, scalars):
        """Program.run's direct path as one prepared function `run(feeds) -> outputs | None`.
        `named`: per input (name, numpy dtype, rank, (dim, size) of its fixed sizes, (dim, name)
        of its named dims); `names`: the named dims in the order `fn` reads them.  `run` takes feeds that are all C-contiguous ndarrays of their
        input's dtype object and rank with sizes that agree with the specs and each other,
        binds the named-dim sizes when they are not the ones bound last, and makes the
        program's native calls.  None from `run`: nothing done (a feed the check does not take,
        sizes of another class, LAZYCANDLE_EXEC=python or profiling, a bad id): the caller
        takes the layered path, which converts, binds or raises."""
        self.names = tuple(names)
        one_call = self._one_call_runner(named, scalars)
        if one_call is not None:
            return one_call
        prog, block, packer = self.program, self.block, self.packer
        check = feed_checker(named, names)
        # per used input: its feed name (None: a realized node, read from its buffer), pointer
        # positions with their slots, and the node (for its buffer) -- the element offset of a
        # view's slot is the binding's, read per size
        where = {k: [] for k in range(len(self.used))}
        for pos, k, _, s in self.feeds:
            where[k].append((pos, s))
        used = [(self.inputs[i][0], self.inputs[i][1], where[k]) for k, i in enumerate(self.used)]
        fns = [f if getattr(f, "words_item", False) else ctypes.CFUNCTYPE(ctypes.c_int64)(_fn_address(f))
               for f in prog.sequence]      # segments (args as they are) and matmuls run from their words
        call_args = (ctypes.c_void_p(self.block_addr), ctypes.c_void_p(self.sizes_addr))
        thread_args = {}
        get_exec, get_profile = config._exec_env[0], config._profile_env[0]
        thread_arg, ndarray = native_pool.thread_arg, np.ndarray
        status = prog.status if prog.has_status else None
        returned = self.returned

        def run(feeds):
            if get_exec() is not None or get_profile() is not None:
                mode, profiling = config.exec_flags()
                if profiling or mode == "python":
                    return None
            key = check(feeds)
            if key is None:
                return None
            threads_arg = thread_arg(thread_args)
            with prog.lock:             # read per run: renewed in a forked child
                if config.matmul_epoch != self.epoch:
                    self.epoch, self.last = config.matmul_epoch, None
                b = self.last
                if b is None or b[0] != key:
                    self.last = None            # the block is rewritten from here
                    b = self._bind(key)
                    if b is None:
                        return None
                    self.last = b
                offsets, (block_type, small, large, small_fill, large_fill, carve) = b[2], b[3]
                for name, buf, at in used:
                    v = feeds[name] if name is not None else buf
                    addr = address(v)
                    for pos, s in at:
                        off = offsets[s]
                        block[pos] = addr + off * v.itemsize if off else addr
                outs = None
                if small:
                    blk = block_type()
                    addr = _addressof(blk)
                    skip = -addr % ALIGN
                    addr += skip
                    for pos, off in small_fill:
                        block[pos] = addr + off
                    if not large:
                        outs = [ndarray(shape, npdt, blk, skip + at) for shape, npdt, at in carve]
                    else:
                        small_outs = {t: np.frombuffer(blk, npdt, n, skip + off) for t, off, n, npdt in small}
                if large:
                    got = {}
                    for t, n, dt in large:
                        got[t] = o = alloc(n, dt)
                        addr = address(o)
                        for pos, off in large_fill.get(t, ()):
                            block[pos] = addr + off
                    if small:
                        got.update(small_outs)
                    outs = [_user_view(got[returned[u]], off, shape) for u, off, shape in b[4]]
                if status is not None:
                    status.fill(0)
                if prog.scalars is not scalars:
                    packer._pack(scalars)
                sc = ctypes.c_void_p(prog.packed[1])
                for fn in fns:
                    if fn(*call_args, sc, threads_arg):
                        return None     # a bad id: the layered path runs again and raises its error
            return outs
        return run

    def _one_call_runner(self, named, scalars):
        """feeds_runner's `run` as one native call (codegen/binder_ir.run_module: bind when the
        sizes are new, write the pointers, run the segments) behind one generated Python
        function: the feed check, the outputs, one pack of the call's arguments.  For a class
        whose binder is compiled and whose outputs are the same at every size; else None."""
        parts = getattr(self.fn, "parts", None)
        if self.program.words_items:
            return None             # a matmul runs from its words between segments: feeds_runner's loop
        scope = {"ndarray": np.ndarray}
        checked = _check_lines(named, self.names, scope) if parts is not None and self.outputs else None
        if checked is None:
            return None
        check_lines, key_source = checked
        from ..codegen import binder_ir, jit
        bind_fn, settings_ok = parts
        prog = self.program
        offsets, (block_type, small, large, small_fill, large_fill, _), slices = self._constant_outputs()
        feed_of = {name: k for k, (name, *_) in enumerate(named)}
        where = {k: [] for k in range(len(self.used))}
        for pos, k, _, s in self.feeds:
            where[k].append((pos, s))
        # args: [arena base, arena bytes, top, sizes..., rebind, the per-run addresses..., scalars,
        #        threads, the fixed addresses...]: the per-run span is packed at every call
        n_sizes = len(self.names)
        per_run, fixed, writes = [], [], []
        for k, i in enumerate(self.used):
            name, buf = self.inputs[i]
            itemsize = buf.itemsize if name is None else named[feed_of[name]][1].itemsize
            (fixed if name is None else per_run).append(
                (address(buf) if name is None else f"address(f{feed_of[name]})",
                 [(pos, offsets[s] * itemsize) for pos, s in where[k]]))
        if small:
            per_run.append(("o + skip", small_fill))
        for t, n, dt in large:
            scope[f"dt{t}"] = dt
            per_run.append((f"address(g{t})", large_fill.get(t, ())))
        status = prog.status if prog.has_status else None
        if status is not None:
            fixed.append((address(status), []))
        at = 4 + n_sizes
        rebind_at, scalars_at, threads_at = 3 + n_sizes, at + len(per_run), at + len(per_run) + 1
        for c, (_, fills) in enumerate(per_run):
            writes += [(pos, at + c, off) for pos, off in fills]
        for c, (_, fills) in enumerate(fixed):
            writes += [(pos, threads_at + 1 + c, off) for pos, off in fills]
        status_arg = None if status is None else (threads_at + len(fixed), status.size)
        fns = {f"seg{i}": _fn_address(f) for i, f in enumerate(self.fns)}
        text = binder_ir.run_module(rebind_at, writes, status_arg, len(fns), prog.n_refs, scalars_at, threads_at)
        module = jit.link_ir(text, ["run"], imports=dict(fns, bind=_fn_address(bind_fn)))
        args = np.zeros(threads_at + 1 + len(fixed), np.int64)
        args[threads_at + 1:] = [a for a, _ in fixed]
        outs = []
        small_at = {t: (off, npdt) for t, off, _, npdt in small}
        for u, off, shape in slices:
            t = self.returned[u]
            if t in small_at:
                at_byte, npdt = small_at[t]
                scope[f"odt{u}"] = npdt
                outs.append(f"ndarray({shape!r}, odt{u}, blk, skip + {at_byte + off * npdt.itemsize})")
            else:
                outs.append(f"user_view(g{t}, {off}, {shape!r})")
        lines = ["def run(feeds):",
                 "    if get_exec() is not None or get_profile() is not None:",
                 "        mode, profiling = exec_flags()",
                 "        if profiling or mode == 'python':",
                 "            return None"] + check_lines + [f"    key = {key_source}", "    n = threads()"]
        if small:
            lines += ["    blk = block_type()", "    o = addressof(blk)", f"    skip = -o % {ALIGN}"]
        lines += [f"    g{t} = alloc({n}, dt{t})" for t, n, _ in large]
        lines += [f"    outs = [{', '.join(outs)}]",
                  "    with prog.lock:          # read per run: renewed in a forked child",
                  "        if config.matmul_epoch != runner.epoch:",
                  "            runner.epoch, runner.last = config.matmul_epoch, None"]
        if settings_ok is not None:     # the matmuls' backend and thread count the class was bound for
            lines += ["        now = (runner.epoch, n)", "        if memo[0] != now:",
                      "            memo[:] = now, settings_ok()", "        if not memo[1]:", "            return None"]
        lines += ["        b = runner.last",
                  "        rebind = b is None or b[0] != key",
                  "        arena = prog.arena or prog.arena_at_least(0)",
                  "        if prog.scalars is not scalars:",
                  "            packer._pack(scalars)",
                  "        pack(args, 0, arena[1], arena[0].size, 0, *key, rebind, "
                  + "".join(f"{src}, " for src, _ in per_run) + "prog.packed[1], n)",
                  "        rc = call(*call_args)",
                  "        if rc == GROW:",
                  "            arena = prog.arena_at_least(int(args[2]))",
                  "            args[0], args[1] = arena[1], arena[0].size",
                  "            rc = call(*call_args)",
                  "        if rc:",
                  "            runner.last = None",
                  "            return None      # the layered path decides again (bails) or raises (a bad id)",
                  "        if rebind:",
                  "            runner.last = (key, arena) + tail",
                  "    return outs"]
        call = ctypes.CFUNCTYPE(ctypes.c_int64)(module.address("run"))    # args premade: no conversions
        scope.update(get_exec=config._exec_env[0], get_profile=config._profile_env[0], exec_flags=config.exec_flags,
                     threads=native_pool.threads, config=config, memo=[None, False], settings_ok=settings_ok,
                     block_type=block_type, addressof=_addressof, alloc=alloc, user_view=_user_view,
                     runner=self, prog=prog, scalars=scalars, packer=self.packer,
                     pack=struct.Struct(f"={threads_at + 1}q").pack_into, args=args, GROW=binder_ir.GROW,
                     call=call, call_args=(ctypes.c_void_p(address(args)), ctypes.c_void_p(self.block_addr)),
                     tail=self._constant_tail, address=address)
        source = "\n".join(lines) + "\n"
        exec(compile(source, "<direct run>", "exec"), scope)
        run = scope["run"]
        run.module, run.source = module, source      # the module kept alive with the function
        return run


def feed_checker(named, names):
    """`check(feeds)`: the named-dim values as a tuple in `names` order
    when every feed is a C-contiguous ndarray of its input's dtype object (`is`) and rank whose
    sizes agree with its spec and each other, else None -- written out as one generated
    function of the specs `named` (Program._named), a few comparisons per feed."""
    scope = {"ndarray": np.ndarray}
    lines = _check_lines(named, names, scope)
    if lines is None:
        return lambda feeds: None
    lines = ["def check(feeds):"] + lines[0] + [f"    return {lines[1]}"]
    exec(compile("\n".join(lines) + "\n", "<feed check>", "exec"), scope)
    return scope["check"]


def _check_lines(named, names, scope):
    """The body lines of feed_checker's function, binding the feed of input k to `f{k}`, and
    the source of the named-dim values' tuple; None when a named dim has no feed."""
    first, lines = {}, [f"    if len(feeds) != {len(named)}:\n        return None"]
    for k, (name, npdt, rank, fixed, dims) in enumerate(named):
        scope[f"t{k}"] = npdt
        lines += [f"    f{k} = feeds.get({name!r})",
                  f"    if f{k}.__class__ is not ndarray or f{k}.dtype is not t{k} or not f{k}.flags.c_contiguous:",
                  "        return None", f"    s{k} = f{k}.shape"]
        if not dims:
            lines += [f"    if s{k} != {tuple(size for _, size in fixed)!r}:", "        return None"]
            continue
        conds = [f"len(s{k}) != {rank}"] + [f"s{k}[{i}] != {size}" for i, size in fixed]
        for i, d in dims:
            if d in first:
                conds.append(f"s{k}[{i}] != {first[d]}")
            else:
                first[d] = f"s{k}[{i}]"
        lines += [f"    if {' or '.join(conds)}:", "        return None"]
    if any(d not in first for d in names):
        return None
    return lines, "(" + "".join(f"{first[d]}, " for d in names) + ")"


def _slices(out_shapes, out_offsets):
    """(user output, element offset, shape) per output."""
    return [(u, off, shape) for u, (shape, off) in enumerate(zip(out_shapes, out_offsets))]


def _user_view(buf, off, shape):
    """A user output of a target buffer: at its element offset, in its shape."""
    n = prod(shape)
    return buf if off == 0 and buf.size == n and buf.shape == shape else buf[off:off + n].reshape(shape)
