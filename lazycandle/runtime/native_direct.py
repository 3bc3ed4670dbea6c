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
ARENA_KEEP_BYTES); the caller then runs the layered path, which decides or raises.
DirectRunner runs the words on the program's native segments: the words block, the pointers
of feeds and outputs and the status words are written under the program's lock (runs of the
plan, at any binding, are serialised there), so threads at different sizes do not mix."""
from __future__ import annotations

import ast
import ctypes
from math import prod

import numpy as np

from .. import config
from ..layout import Layout
from . import fold, native_pool
from .buffers import alloc
from .native_exec import split_outputs
from .native_program import ALIGN, ARENA_KEEP_BYTES, BindingSource, NotNative, address

_addressof = ctypes.addressof


class DirectSource(BindingSource):
    """A binding's parts written as the flat quantities (Plan.q_positions), each a source token
    (`q`: per position, a literal or the local holding it)."""

    def __init__(self, plan, q):
        self.steps, self.reads, self.numels = plan.q_positions()
        self.q = q

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
        scope[f"extent{i}"], scope[f"cost{i}"] = spec.extent, spec.cost
        return [f"    s{i} = {self._tuple(at, count)}", f"    e{i} = extent{i}(s{i})",
                f"    c{i} = cost{i}(s{i}) / (e{i} or 1)"]

    def matmul(self, i, rebind):
        """The small-m kernel's sizes by its Rebinder, written out (Rebinder.source) or called."""
        (ash, ast, _, ar), (bsh, bst, _, br) = self.steps[i][1][:2]
        a_shape, a_strides = self._tokens(ash, ar), self._tokens(ast, ar)
        b_shape, b_strides = self._tokens(bsh, br), self._tokens(bst, br)
        lines = [f"    if setting != set{i}:\n        return None"]
        inline = rebind.source(i, a_shape, a_strides, b_shape, b_strides)
        if inline is not None:
            return lines + inline
        args = ", ".join("(" + "".join(f"{x}, " for x in part) + ")"
                         for part in (a_shape, a_strides, b_shape, b_strides))
        return lines + [f"    g{i} = rb{i}.sized({args})", f"    if g{i} is None:\n        return None",
                        f"    s{i}, e{i}, c{i} = g{i}"]

    def spread(self, i, n):
        return ", ".join(f"s{i}[{c}]" for c in range(n))

    def _tokens(self, at, n):
        return [self.q[at + c] for c in range(n)]


def derive(plan, prefix, q, results, inputs):
    """The DirectRunner of `plan` (running natively, no step in Python) for the size class
    whose upper-layer lines `prefix` (of `sizes`, the named-dim values) define the flat
    quantities (`q`: a source token per position) or return None; `results`: sources of the
    slot offsets, output shapes and output offsets; `inputs`: the capture's input nodes.  None
    when the plan has no such path.  The function is constant-folded (fold.py): it returns
    only the words that depend on the sizes; the others are written into the block once."""
    prog = plan.native_program
    if prog is None or prog.python_steps or not prog.segments or prog.last_bound is None:
        return None
    scope: dict = {"arena_at_least": prog.arena_at_least}
    src = DirectSource(plan, q)
    slot_lines, fill_lines, words, outs = prog.binding_source(src, scope)
    numels = "(" + "".join(f"{src.numel(j)}, " for j in prog.targets) + ")"
    matmuls = any(k.startswith("rb") for k in scope)
    lines = (["def direct(sizes):"] + prefix + ["    setting = (backend(), threads())"] * matmuls
             + slot_lines
             + [f"    if top > {ARENA_KEEP_BYTES}:\n        return None", "    arena = arena_at_least(top)",
                "    base = arena[1]"] + fill_lines
             + [f"    return {words}, {outs}, {numels}, arena, {', '.join(results)}"])
    pure = {"max": max, "min": min, "len": len, "set": set, "list": list}
    pure.update((k, v) for k, v in scope.items() if k.startswith(("extent", "cost")))
    constants = {k: v for k, v in scope.items() if k[0] in "ks" and k[1:].isdigit() or k.startswith("set")}
    fn_ast = fold.fold("\n".join(lines) + "\n", pure, constants)
    ret = fn_ast.body[-1]
    fixed, writes = [], []          # the block's words at every size of the class; the others' writes
    for pos, e in enumerate(ret.value.elts[0].elts):
        if isinstance(e, ast.Constant):
            fixed.append(e.value)
        elif isinstance(e, ast.Starred):
            return None             # sizes of unknown count: not written by the generators here
        else:
            fixed.append(0)
            writes.append(ast.Assign([ast.Subscript(ast.Name("w", ast.Load()), ast.Constant(pos), ast.Store())], e))
    ret.value.elts = ret.value.elts[1:]
    fn_ast.body[-1:] = writes + [ret]
    source = ast.unparse(ast.fix_missing_locations(fn_ast)) + "\n"
    block = np.array(fixed, np.int64)
    scope["w"] = (ctypes.c_int64 * len(fixed)).from_buffer(block)
    exec(compile(source, "<direct binding>", "exec"), scope)
    return DirectRunner(plan, prog, scope["direct"], source, inputs, block)


class DirectRunner:
    """One size class of a named-dim program, run directly: `run(arrays, sizes, scalars)` gives
    the outputs, or None when these sizes are not this class's (the caller binds them the
    layered way).  Its generated function writes the words that depend on the sizes into the
    runner's block (under the program's lock, where the block is read) and returns the rest
    of the binding; the sizes run last are kept, so the same sizes again write only the feed
    and output pointers."""

    def __init__(self, plan, prog, fn, source, inputs, block):
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
        self.last = None            # (sizes, arena, slot offsets, output tables): what the block holds
        self._tables = None         # (key, output tables) of the last bound sizes

    def clear(self) -> None:
        with self.program.lock:
            self.last = self._tables = None

    def _bind(self, sizes):
        """Write the words of `sizes` and return what else they bind to, or None (not this class)."""
        try:
            got = self.fn(sizes)
        except NotNative:           # an index kernel of another form at these sizes
            return None
        if got is None:
            return None
        out_pos, numels, arena, offsets, out_shapes, out_offsets = got
        key = (out_pos, numels, out_shapes, out_offsets)
        tables = self._tables
        if tables is None or tables[0] != key:
            tables = self._tables = (key, self._output_tables(out_pos, numels, out_shapes, out_offsets))
        return (sizes, arena, offsets) + tables[1]

    def _output_tables(self, out_pos, numels, out_shapes, out_offsets):
        """(small-output block type, small outputs, large outputs, pointer fills, output slices)."""
        small, top, large = split_outputs((t, n, itemsize, dt)
                                          for t, ((itemsize, dt), n) in enumerate(zip(self.target_types, numels)))
        small_at = {t: off for t, off, _, _ in small}
        small_fill = [(pos, small_at[t] + off) for pos, t, off in out_pos if t in small_at]
        large_fill = [(pos, t, off) for pos, t, off in out_pos if t not in small_at]
        slices = [(off, prod(shape), shape) for shape, off in zip(out_shapes, out_offsets)]
        return ctypes.c_char * (top + ALIGN), small, large, small_fill, large_fill, slices

    def run(self, arrays, sizes, scalars):
        mode, profiling = config.exec_flags()
        if mode == "python" or profiling:
            return None
        in_bufs = [arrays[name] if name is not None else buf for name, buf in self.inputs]
        in_addr = [address(in_bufs[i]) for i in self.used]
        prog, block = self.program, self.block
        nthreads = native_pool.threads()
        with prog.lock:
            if config.matmul_epoch != self.epoch:
                self.epoch, self.last = config.matmul_epoch, None
            b = self.last
            if b is None or b[0] != sizes:
                self.last = None            # the block is rewritten from here
                b = self._bind(sizes)
                if b is None:
                    return None
                self.last = b
            _, _, offsets, block_type, small, large, small_fill, large_fill, slices = b
            outs = [None] * len(self.target_types)
            if small:
                blk = block_type()
                addr = _addressof(blk)
                skip = -addr % ALIGN
                for t, off, n, npdt in small:
                    outs[t] = np.frombuffer(blk, npdt, n, skip + off)
                addr += skip
                for pos, off in small_fill:
                    block[pos] = addr + off
            if large:
                at = {}
                for t, n, dt in large:
                    outs[t] = o = alloc(n, dt)
                    at[t] = address(o)
                for pos, t, off in large_fill:
                    block[pos] = at[t] + off
            for pos, k, i, s in self.feeds:
                off = offsets[s]
                block[pos] = in_addr[k] + off * in_bufs[i].itemsize if off else in_addr[k]
            if prog.has_status:
                prog.status.fill(0)
            _, sc = self.packer._pack(scalars)
            p, sz = self.block_addr, self.sizes_addr
            for fn in self.fns:
                if fn(p, sz, sc, nthreads):
                    return None         # a bad id: the layered path runs again and raises its error
        outs = [outs[t] for t in self.returned]
        return [o if o.shape == shape else (o if off == 0 and o.size == n else o[off:off + n]).reshape(shape)
                for o, (off, n, shape) in zip(outs, slices)]
