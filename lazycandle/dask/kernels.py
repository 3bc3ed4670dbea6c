"""What runs inside a Dask task: rebuild a stage of the described graph at one block's shapes,
compile it once per process and block shape, and run it on the block with a thread setting
that does not oversubscribe the worker.

Tasks carry only picklable values (a graph Desc, dim classes, a stage spec); compiled Programs
live in a per-process dict keyed by the graph's token, the stage and the block's sizes.  With
LAZYCANDLE_CACHE_DIR shared, a worker that has never seen a kernel still loads it from disk.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from .. import config
from ..dtype import DType, u32
from ..layout import Layout, contiguous_strides

_programs: dict = {}           # (graph token, stage, block sizes) -> Program, oldest first
MAX_PROGRAMS = 512
_compile_lock = threading.Lock()


@dataclass
class Dims:
    """Dim classes as small ints: per record, per operand read, per output; class sizes."""
    rec: tuple          # rec -> tuple of class id or None per dim
    src: dict           # (rec, operand) -> tuple of class id or None per operand dim
    out: tuple          # output -> tuple of class id or None
    maps: dict          # (rec, operand) | ("o", i) -> view_map or None
    full: dict          # class id -> size
    whole_reason: dict = field(default_factory=dict)   # class id -> why it must be one chunk
    reduced: dict = field(default_factory=dict)        # reduce/matmul rec -> classes it reduces


def _dec_arg(a):
    if isinstance(a, tuple):
        if len(a) == 2 and a[0] == "dtype" and isinstance(a[1], str):
            return DType.from_name(a[1])
        return tuple(_dec_arg(x) for x in a)
    return a


class _Rebuild:
    """Nodes of the described graph at block sizes `sizes` (class id -> size; other classes
    whole); records in `frozen` become placeholders `__cut<rec>` (a value an earlier stage made)."""

    def __init__(self, desc, dims, sizes, frozen):
        self.desc, self.dims, self.sizes, self.frozen = desc, dims, sizes, frozen
        self.memo = {}

    def _size(self, c, orig):
        """A dim's size in this block: its class's block size, else its whole size."""
        return orig if c is None else self.sizes.get(c, self.dims.full[c])

    def shape(self, r):
        return tuple(self._size(c, s) for c, s in zip(self.dims.rec[r], self.desc.recs[r].shape))

    def node(self, r, op=None, dtype=None):
        """The node of record `r`; `op`/`dtype` rebuild it as another op of the same operands."""
        from ..ir.node import Node
        if op is None and r in self.memo:
            return self.memo[r]
        rec = self.desc.recs[r]
        dt = DType.from_name(dtype or rec.dtype)
        if r in self.frozen and op is None:
            n = Node("placeholder", (), f"__cut{r}", self.shape(r), dt)
        elif rec.kind in ("ph", "buf"):
            n = Node("placeholder", (), rec.op, self.shape(r), dt)
        elif rec.kind == "const":
            n = Node("const", (), rec.arg, rec.shape, dt)
        else:
            srcs = [self.view(rec.srcs[p], (r, p), self.dims.src[(r, p)]) for p in range(len(rec.srcs))]
            n = Node(op or rec.op, srcs, _dec_arg(rec.arg), self.shape(r), dt)
        if op is None:
            self.memo[r] = n
        return n

    def view(self, src, key, classes):
        from ..ir.node import Node
        base = self.node(src.rec)
        m = self.dims.maps[key]
        if m is None:
            lay = Layout(src.shape, src.strides, src.offset)
        else:
            bstr = contiguous_strides(base.shape)
            shape = tuple(base.shape[k] if k >= 0 else self._size(c, s) for k, c, s in zip(m, classes, src.shape))
            lay = Layout(shape, tuple(bstr[k] if k >= 0 else 0 for k in m), 0)
        if lay.shape == base.shape and lay.is_contiguous() and lay.offset == 0:
            return base
        return Node("view", (base,), None, lay.shape, base.dtype, layout=lay)


@dataclass(frozen=True)
class Stage:
    """One blockwise call: `kind` "out" (program output `index`) or "part" (the per-block
    partial of cut record `index`)."""
    kind: str
    index: int


class StageFn:
    """The function of a stage's blockwise task: blocks in, one ndarray out (for an argmax /
    argmin partial: the tuple (best values, their indices with the block's offset added))."""

    def __init__(self, token, desc, dims, stage, frozen, inputs):
        self.token, self.desc, self.dims, self.stage = token, desc, dims, stage
        self.frozen = frozenset(frozen)
        self.inputs = inputs          # [(feed name, classes chunked in this stage per dim)]

    def __call__(self, *blocks):
        blocks = [_single(b) for b in blocks]
        sizes = {}
        for (_, classes), b in zip(self.inputs, blocks):
            for c, s in zip(classes, b.shape):
                if c is not None:
                    sizes[c] = s
        feeds = {name: b for (name, _), b in zip(self.inputs, blocks)}
        if "__arange" in feeds:          # the block's offset along an argmax / argmin dim
            feeds["__off"] = np.asarray(feeds.pop("__arange")[0], np.uint32)
        key = (self.token, self.stage, tuple(sorted(sizes.items())))
        prog = _program(key, lambda: self._compile(sizes))
        with task_threads():
            outs = prog.run(**feeds)
        if self.stage.kind == "part":
            rec = self.desc.recs[self.stage.index]
            if rec.category == "matmul":
                return outs[0][None]     # the k-block axis the tree sums over
            if rec.op in ("argmax", "argmin"):
                return tuple(outs)
        return outs[0]

    def _compile(self, sizes):
        from ..graph_api import compile as lc_compile
        from ..tensor import Tensor, placeholder
        rb = _Rebuild(self.desc, self.dims, sizes, self.frozen)
        st = self.stage
        if st.kind == "out":
            src = self.desc.outputs[st.index]
            return lc_compile([Tensor(rb.view(src, ("o", st.index), self.dims.out[st.index]))])
        rec = self.desc.recs[st.index]
        if rec.op == "mean":
            return lc_compile([Tensor(rb.node(st.index, op="sum"))])
        if rec.op in ("argmax", "argmin"):
            val_dtype = self.desc.recs[rec.srcs[0].rec].dtype
            val = Tensor(rb.node(st.index, op=rec.op[3:], dtype=val_dtype))
            idx = Tensor(rb.node(st.index))
            return lc_compile([val, idx.broadcast_add(placeholder("__off", (), u32))])
        return lc_compile([Tensor(rb.node(st.index))])


def _single(block):
    """The one block behind blockwise's nesting of a dim the output lacks (it is one chunk)."""
    while isinstance(block, list):
        (block,) = block
    return block


def pick(block, i):
    """Item `i` of a tuple-valued partial block (a slice of the task's result, no compute)."""
    return block[i]


class CombineFn:
    """One tree level over blocks stacked along `axis`: "sum", "max", "min", "scale" (times
    `arg`), "argidx" (the partial index at the arg-best partial value; `arg` "argmax"/"argmin")."""

    def __init__(self, kind, axis, arg=None):
        self.kind, self.axis, self.arg = kind, axis, arg

    def __call__(self, *blocks):
        key = ("combine", self.kind, self.axis, self.arg, tuple((b.shape, b.dtype.str) for b in blocks))
        prog = _program(key, lambda: self._compile(blocks))
        with task_threads():
            return prog.run(**{f"p{i}": b for i, b in enumerate(blocks)})[0]

    def _compile(self, blocks):
        from ..graph_api import compile as lc_compile
        from ..tensor import placeholder
        ps = [placeholder(f"p{i}", b.shape, DType.from_numpy(b.dtype)) for i, b in enumerate(blocks)]
        p, ax = ps[0], self.axis
        if self.kind == "scale":
            return lc_compile([p * self.arg])
        if self.kind == "argidx":
            return lc_compile([ps[1].gather(getattr(p, f"{self.arg}_keepdim")(ax), ax)])
        return lc_compile([getattr(p, f"{self.kind}_keepdim")(ax)])


def _program(key, build):
    prog = _programs.get(key)
    if prog is None:
        with _compile_lock:
            prog = _programs.get(key)
            if prog is None:
                prog = _programs[key] = build()
                if len(_programs) > MAX_PROGRAMS:
                    del _programs[next(iter(_programs))]
    return prog


# ---- threads -------------------------------------------------------------------------------
_scope = {"depth": 0, "saved": None}
_scope_lock = threading.Lock()


def threads_for_task():
    """Kernel threads for one task, or None to keep the process setting.  On a distributed
    worker: its thread count shared by the tasks it is executing; on a thread of Dask's local
    pool: 1 (the pool already runs a task per core); on the synchronous scheduler: None."""
    try:
        from distributed import get_worker
        w = get_worker()
    except (ImportError, ValueError):
        w = None
    if w is not None:
        return max(1, w.state.nthreads // max(1, len(w.state.executing)))
    return None if threading.current_thread() is threading.main_thread() else 1


@contextmanager
def task_threads():
    """Set the thread count for the tasks running now in this process, restore it after the last."""
    n = threads_for_task()
    if n is None:
        yield
        return
    with _scope_lock:
        if _scope["depth"] == 0:
            _scope["saved"] = config.get_num_threads()
            if _scope["saved"] != n:
                config.set_num_threads(n)
        _scope["depth"] += 1
    try:
        yield
    finally:
        with _scope_lock:
            _scope["depth"] -= 1
            if _scope["depth"] == 0 and config.get_num_threads() != _scope["saved"]:
                config.set_num_threads(_scope["saved"])
