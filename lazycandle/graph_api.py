"""Build-then-run graphs: placeholders -> lc.compile -> Program.run, lc.jit, and the IR dump
tool (lc.dump / Program.dump / LAZYCANDLE_DUMP)."""
from __future__ import annotations

import functools
import threading
import weakref
from math import prod

import numpy as np

from . import caches, named_dims
from .dtype import DType
from .errors import FeedError
from .ir.graph import capture, views_graph
from .ir.printer import render
from . import compiler


def _targets(nodes):
    """The computed nodes standing for the output nodes: a contiguous view of a computed node
    reads that node's buffer (returned as (node, element offset)); other views, constants and
    realized tensors get a copy node."""
    from .ir.node import Node
    out = []
    for n in nodes:
        if n.op.category == "view" and n.layout.is_contiguous() and not n.base.realized \
                and n.base.op.category not in ("source",):
            out.append((n.base, n.layout.offset))
        elif n.op.category in ("view", "source") or n.realized:
            out.append((Node("copy", (n,), None, n.shape, n.dtype), 0))
        else:
            out.append((n, 0))
    return out


class _Instance:
    """A Program's graph compiled for concrete sizes: its targets, capture inputs and plan."""

    def __init__(self, user_nodes):
        targets = _targets(user_nodes)
        self.user_nodes = user_nodes
        self.targets = [n for n, _ in targets]
        self.out_offsets = [off for _, off in targets]
        self.cap = cap = capture(self.targets)
        self.inputs, self.offsets, self.scalars = cap.inputs, cap.offsets, cap.scalars
        self.plan = compiler.get_plan(cap, self.targets)
        self.out_shapes = [n.shape for n in user_nodes]
        self.outputs = _output_slices(self.out_shapes, self.out_offsets)
        self._runner = (None, None)     # (NativePlan, its program_runner) once the plan runs natively

    def fast_runner(self):
        """The prepared one-call run of this instance's native form (NativePlan.program_runner),
        or None while the plan has none (or the fast path does not cover it); built again when
        the plan's native form is replaced (a new matmul backend setting)."""
        native = self.plan.binding.native
        if not native:
            return None
        if self._runner[0] is not native:
            returned = native.program.returned          # per user output: its target buffer
            outputs = [(returned[u], off, shape) for u, (off, _, shape) in enumerate(self.outputs)]
            self._runner = (native, native.program_runner(self.inputs, self.offsets, self.scalars,
                                                          self.plan.slots, outputs))
        return self._runner[1]

    def run(self, arrays: dict, seconds=None) -> list:
        """arrays: flat contiguous array per placeholder name.  `seconds`: profile instead (the
        per-kernel path, each kernel's time added to its entry)."""
        bufs = [arrays[n.arg] if n.buffer is None else n.buffer for n in self.inputs]
        if seconds is None:
            outs = self.plan.run(bufs, self.offsets, self.scalars)
        else:
            outs = self.plan.run_python(bufs, self.offsets, self.scalars, seconds)
        return [o if o.shape == shape else (o if off == 0 and o.size == n else o[off:off + n]).reshape(shape)
                for o, (off, n, shape) in zip(outs, self.outputs)]


def _output_slices(shapes, offsets) -> list:
    """(offset, element count, shape) per output: where each lies in its target buffer."""
    return [(off, prod(shape), shape) for shape, off in zip(shapes, offsets)]


class _BoundInstance(_Instance):
    """A named-dim Program at one binding, bound by a ProgramBinder of its traced graph
    (symbolic_plan.py): nothing rebuilt, captured or scheduled."""

    def __init__(self, traced, binder, bound, sizes):
        binding, self.offsets, self.out_shapes, self.out_offsets = bound
        self.binder = binder
        self.outputs = _output_slices(self.out_shapes, self.out_offsets)
        self.user_nodes, self.targets, self.inputs, self.scalars = traced.user_nodes, traced.targets, \
            traced.cap.inputs, traced.cap.scalars
        if binder.scalars is not None:          # scalar operands that are sizes: their bound values
            self.scalars = binder.scalars(sizes)
        self.plan = compiler.BoundPlan(binder.plan, binding)


class _Traced:
    """What a named-dim Program binds from: its traced targets and capture (sizes are lc.Size
    expressions of the names), its view nodes (for the bound checks) and the ProgramBinders
    derived so far (one per size class met), with the direct paths of those that run natively
    (runtime/native_direct.py: a new size of the class costs one generated function and one
    native call)."""

    def __init__(self, user_nodes, names):
        targets = _targets(user_nodes)
        self.user_nodes, self.names = user_nodes, names
        self.targets = [n for n, _ in targets]
        self.out_offsets = [off for _, off in targets]
        self.cap = capture(self.targets)
        graph = _unrealized(user_nodes)
        self.views = [n for n in graph if n.op.category == "view"]
        self.checks = [c for n in graph for c in named_dims.checks_of(n)]
        self.binders = []
        self.direct = []            # DirectRunners, one per size class that has one
        self.direct_runs = []       # (DirectRunner, its prepared Program.run: feeds_runner)

    def bind(self, sizes):
        for pb in list(self.binders):
            got = pb(sizes)
            if got is not None:
                return _BoundInstance(self, pb, got, sizes)
        return None

    DIRECT_KEPT = 8         # direct runners per program
    DIRECT_PER_NATIVE = 3   # ... and per native program (each derived at a binding its last ones did not take)

    def learn_direct(self, pb, named, native=None) -> None:
        """Derive the direct path of ProgramBinder `pb`'s class at the native program its plan
        ran last (one per combination of matmul forms: a row count crossing a small-m class or
        a backend's decision runs another), once its plan runs natively (`named`: the
        Program's feed specs, Program._named); again at a binding `native` (its NativePlan)
        that the runners derived so far did not take (a tiled / BLAS step's size buckets
        around another binding), when it keeps its arena (a larger one never runs directly)."""
        prog = pb.plan.native_program
        if prog is None or not self._wants_direct(pb, prog, native):
            return                  # not run natively yet: the plan builds its program at its 2nd run
        from .symbolic_plan import derive_direct
        with _derive_lock:          # one derivation at a time (CPython's ast conversions are not thread-safe)
            if not self._wants_direct(pb, prog, native):
                return
            runner = derive_direct(pb, self.names, self.cap.inputs) if len(self.direct) < self.DIRECT_KEPT else None
            pb.direct.setdefault(prog, []).append(runner or False)
            if runner is not None:
                self.direct.append(runner)
                self.direct_runs = self.direct_runs + [(runner, runner.feeds_runner(named, self.names,
                                                                                    self.cap.scalars))]

    def _wants_direct(self, pb, prog, native) -> bool:
        got = pb.direct.get(prog)
        return got is None or not (False in got or len(got) >= self.DIRECT_PER_NATIVE or not native
                                   or not native.keep_arena or prog.last_bound is not native)

    def learn(self, inst: _Instance, sizes) -> None:
        """Derive the ProgramBinder of the size class `inst` (compiled at `sizes`) is in."""
        from .symbolic_plan import derive_program_binder
        entry = compiler.class_plan(inst.cap)
        if entry is None or len(self.binders) >= 8:
            return
        pb = derive_program_binder(self.cap, self.views, self.user_nodes, self.out_offsets, self.names,
                                   inst.cap, entry[0], entry[1], sizes, self.checks)
        if pb is not None:
            self.binders.append(pb)


_derive_lock = threading.Lock()


def _unrealized(roots) -> list:
    """The unrealized nodes of the graph behind `roots`, each once."""
    out, seen, stack = [], set(), list(roots)
    while stack:
        n = stack.pop()
        if id(n) in seen or n.realized:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(n.srcs)
    return out


def named_sizes(op: str, inputs, shapes) -> dict:
    """The size of each named dim given by the feeds' `shapes` (by input name) for `inputs`
    ((name, shape spec, dtype) triples, as Program.inputs); FeedError for a rank or fixed size
    that differs, or a name given two sizes."""
    sizes, where = {}, {}
    for name, spec, _ in inputs:
        shape = tuple(shapes[name])
        if len(shape) != len(spec) or any(isinstance(d, int) and d != g for d, g in zip(spec, shape)):
            raise FeedError(f"{op}: input {name!r} expects shape {spec}, given {shape}")
        for d, g in zip(spec, shape):
            if isinstance(d, str):
                if d in sizes and sizes[d] != g:
                    other, other_shape = where[d]
                    raise FeedError(f"{op}: named dim {d!r} is {sizes[d]} in input {other!r} (shape {other_shape}) "
                                    f"but {g} in input {name!r} (shape {shape})")
                sizes[d], where[d] = g, (name, shape)
    return sizes


def check_feed_names(op: str, inputs, feeds) -> None:
    """FeedError when `feeds` (by name) has a name no input has, or lacks one of `inputs`
    ((name, shape, dtype) triples, as Program.inputs)."""
    expected = {n: (s, d) for n, s, d in inputs}
    unknown = set(feeds) - set(expected)
    if unknown:
        raise FeedError(f"{op}: unknown input(s) {sorted(unknown)}; expected {sorted(expected)}")
    missing = set(expected) - set(feeds)
    if missing:
        raise FeedError(f"{op}: missing input(s) {sorted(missing)}: expected "
                        + ", ".join(f"{n} {expected[n][0]} {expected[n][1].name}" for n in sorted(missing)))


class Program:
    """A compiled graph with named placeholder inputs.  `run(**feeds)` (or calling it) returns
    one numpy array per output.  A program whose placeholders have named dims compiles once
    per binding of those names (kept in a small per-program LRU)."""

    BINDINGS_KEPT = 32

    def __init__(self, outputs):
        from .tensor import Tensor
        outputs = list(outputs)
        if not outputs or not all(isinstance(t, Tensor) for t in outputs):
            raise TypeError("compile: expected a non-empty list of lc.Tensor outputs")
        self._user_nodes = [t._node for t in outputs]
        cap = capture([n for n, _ in _targets(self._user_nodes)])
        placeholders = [n for n in cap.inputs if not n.realized]
        self.inputs = [(n.arg, named_dims.shape_spec(n.shape), n.dtype) for n in placeholders]
        names = [n for n, _, _ in self.inputs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise FeedError(f"compile: placeholder name(s) {sorted(dup)} used for more than one input")
        used = named_dims.names_used(cap)
        self._symbolic = bool(used)
        self._fixed = None if self._symbolic else _Instance(self._user_nodes)
        self._traced = None
        if self._symbolic:
            dims = {d for _, spec, _ in self.inputs for d in spec if isinstance(d, str)}
            if used - dims:
                raise FeedError(f"compile: the outputs use named dim(s) {sorted(used - dims)}, which no input of "
                                f"the program has (inputs: {self.inputs}); a size is bound from the feeds")
            self._traced = _Traced(self._user_nodes, sorted(dims))
        self._bound = caches.LRU(self.BINDINGS_KEPT)
        self._last, self._recent = self._fixed, None
        self._last_sizes = None         # the named-dim sizes run last (what dump shows)
        self._last_direct = None        # the DirectRunner that ran last, when the direct path did
        self._fast = None       # the fixed instance's one-call run (_Instance.fast_runner), once native
        if self._symbolic:
            _programs.add(self)
        # name -> (numpy dtype, shape, rank 1) of each input, for the exact-feed fast path
        self._exact = {name: (dt.numpy, spec, len(spec) == 1) for name, spec, dt in self.inputs} \
            if not self._symbolic else None
        # per input: (name, numpy dtype, rank, (dim, size) of its sizes, (dim, name) of its named dims)
        self._named = [(name, np.dtype(dt.numpy), len(spec), [(i, d) for i, d in enumerate(spec) if d.__class__ is int],
                        [(i, d) for i, d in enumerate(spec) if d.__class__ is str])
                       for name, spec, dt in self.inputs] if self._symbolic else None

    def _exact_feeds(self, feeds):
        """The flat feeds when every one is already a C-contiguous ndarray of exactly its
        input's dtype and shape (the common case, checked without conversions); else None."""
        exact = self._exact
        if len(feeds) != len(exact):
            return None
        flatten = []
        for name, v in feeds.items():
            want = exact.get(name)
            if want is None or v.__class__ is not np.ndarray or v.dtype != want[0] or v.shape != want[1] \
                    or not v.flags.c_contiguous:
                return None             # `feeds` untouched: the checked path reads it as given
            if not want[2]:
                flatten.append(name)
        for name in flatten:
            feeds[name] = feeds[name].reshape(-1)
        return feeds

    def _named_feeds(self, feeds):
        """The named dim sizes when every feed is a C-contiguous ndarray of its input's dtype
        and rank whose sizes agree with the input's spec and each other (the common case of a
        named-dim program, checked without conversions: the direct path reads `feeds` as they
        are); else None, and _check_feeds converts or raises."""
        named = self._named
        if named is None or len(feeds) != len(named):
            return None
        sizes = {}
        for name, npdt, rank, fixed, dims in named:
            v = feeds.get(name)
            if v.__class__ is not np.ndarray or v.dtype != npdt or v.ndim != rank or not v.flags.c_contiguous:
                return None
            shape = v.shape
            for i, size in fixed:
                if shape[i] != size:
                    return None
            for i, d in dims:
                if sizes.setdefault(d, shape[i]) != shape[i]:
                    return None
        return sizes

    def _check_feeds(self, feeds):
        """Flat arrays by input name, and the sizes of the named dims (FeedError on any mismatch)."""
        check_feed_names("run", self.inputs, feeds)
        arrays = {}
        for name, spec, dt in self.inputs:
            v = _feed_array(feeds[name], dt)
            if v.dtype != dt.numpy:
                raise FeedError(f"run: input {name!r} expects dtype {dt.name} ({dt.numpy}), given {v.dtype}")
            arrays[name] = v
        sizes = named_sizes("run", self.inputs, {name: v.shape for name, v in arrays.items()})
        return {name: np.ascontiguousarray(v).reshape(-1) for name, v in arrays.items()}, sizes

    def _instance(self, sizes) -> _Instance:
        if self._fixed is not None:
            return self._fixed
        recent = self._recent
        if recent is not None and sizes == recent[0]:     # the sizes of the last run (a loop at one size)
            return recent[1]
        key = tuple(sorted(sizes.items()))
        inst = self._bound.get(key)
        if inst is None:
            inst = self._traced.bind(sizes)
            if inst is None:
                inst = _Instance(named_dims.bind(self._user_nodes, sizes))
                self._traced.learn(inst, sizes)
            inst = self._bound.put(key, inst)
        self._last, self._recent = inst, (sizes, inst)      # one tuple: read whole by other threads
        return inst

    def run(self, **feeds) -> list:
        fast = self._fast
        if fast is not None:
            outs = fast(feeds)
            if outs is not None:
                return outs
        if self._exact is not None:
            arrays = self._exact_feeds(feeds)
            if arrays is not None:
                outs = self._fixed.run(arrays)
                self._fast = self._fixed.fast_runner()
                return outs
        traced = self._traced
        if traced is not None:
            runs = traced.direct_runs
            for k, (runner, direct) in enumerate(runs):     # a size class's direct path
                out = direct(feeds)
                if out is not None:
                    if k:           # the one that took these sizes is tried first next time (replaced whole)
                        traced.direct_runs = [runs[k]] + runs[:k] + runs[k + 1:]
                    self._last_direct = runner
                    return out
        self._last_direct = None
        sizes = self._named_feeds(feeds)
        if sizes is not None:
            arrays = {name: v.reshape(-1) for name, v in feeds.items()}
        else:
            arrays, sizes = self._check_feeds(feeds)
        self._last_sizes = sizes
        inst = self._instance(sizes)
        out = inst.run(arrays)
        if inst.__class__ is _BoundInstance:        # the layered path ran: no direct path took these sizes
            self._traced.learn_direct(inst.binder, self._named, inst.plan.binding.native)
        return out

    __call__ = run

    def profile(self, runs: int = 1, **feeds) -> str:
        """Run the program `runs` times kernel by kernel and return a table of each kernel's
        mean time, kind, fused ops, output shape, bytes moved and (matmul) GFLOP/s."""
        from .runtime import profile
        arrays, sizes = self._check_feeds(feeds)
        inst = self._instance(sizes)
        seconds = [0.0] * len(inst.plan.kernels)
        for _ in range(max(1, runs)):
            inst.run(arrays, seconds)
        return profile.table(inst.plan, seconds, max(1, runs))

    def dump(self, stage="schedule", fmt="text") -> str:
        """A dump stage of the compiled program (with named dims: of the last binding run)."""
        runner = self._last_direct
        sizes = runner.bound_sizes() if runner is not None else None
        sizes = self._last_sizes if sizes is None else sizes
        inst = self._last if sizes is None else self._instance(sizes)
        if inst is None:
            raise ValueError("dump: this program has named dims and is compiled per binding; run it once first")
        return render(stage, fmt, inst.plan, views_graph(inst.user_nodes), inst.targets)

    def __repr__(self):
        kernels = f"kernels={len(self._fixed.plan.kernels)}" if self._fixed else f"bindings={len(self._bound)}"
        return f"Program(inputs={self.inputs}, {kernels})"

    def __reduce__(self):
        """Pickles the output graph (a named dim by its name); unpickling compiles it again
        (usually a cache hit)."""
        from .graph_pickle import graph_state, rebuild_program
        return rebuild_program, (graph_state(self._user_nodes),)


class _ProgramBindings:
    """The bindings every live named-dim Program keeps (each a bounded LRU of BINDINGS_KEPT), as
    one registered cache: lc.clear_caches() drops them (a program binds again from its size
    class's formulas, nothing recompiled) and what their direct paths keep of the sizes run
    last, lc.cache_info() counts them."""

    def __init__(self):
        self.programs = weakref.WeakSet()

    def add(self, program) -> None:
        self.programs.add(program)

    def clear(self) -> None:
        for p in list(self.programs):
            p._bound.clear()
            p._recent = None
            for runner in p._traced.direct:
                runner.clear()

    def __len__(self):
        return sum(len(p._bound) + sum(r.last is not None for r in p._traced.direct) for p in list(self.programs))


_programs = caches.register("program bindings", _ProgramBindings())


def _feed_array(v, dt) -> np.ndarray:
    """A feed as an ndarray, read in place when it already is one (a Tensor is realized, not
    copied); a bool array feeds a u8 input (dt u8, or None: any) as its bytes, since SPEC makes
    bool data u8; big-endian data is byteswapped to native."""
    if hasattr(v, "_node"):
        v = v.numpy()
    if not isinstance(v, np.ndarray):
        v = np.asarray(v)
    if v.dtype == np.bool_ and (dt is None or dt.numpy == np.uint8):
        v = v.view(np.uint8)
    elif not v.dtype.isnative:
        v = v.astype(v.dtype.newbyteorder("="))      # big-endian data: byteswapped to native
    return v


def compile(outputs) -> Program:
    """Compile the graph behind `outputs` (a tensor or a list); inputs are its placeholders."""
    from .tensor import Tensor
    if isinstance(outputs, Tensor):
        outputs = [outputs]
    return Program(outputs)


def dump(*ts, stage="graph", fmt="text") -> str:
    """Text of a dump stage for the graph behind tensors `ts` (compiles it, runs nothing)."""
    from .tensor import Tensor
    if len(ts) == 1 and isinstance(ts[0], (list, tuple)):
        ts = ts[0]
    if not all(isinstance(t, Tensor) for t in ts):
        raise TypeError("dump: expected tensors")
    targets = [n for n, _ in _targets([t._node for t in ts])]
    cap = capture(targets)
    if named_dims.names_used(cap):
        raise ValueError("dump: the graph has named dims, so it compiles per binding: use "
                         "lc.compile(...).dump() after running the program")
    plan = compiler.get_plan(cap, targets)
    return render(stage, fmt, plan, views_graph([t._node for t in ts]), targets)


_CONSTANTS = (type(None), bool, int, float, complex, str)


def _signature_part(pname, value, dynamic, names):
    """How one argument enters a jit signature: ("t", shape, dtype) for an array (shape with
    named dims under dynamic=True), ("c", value) for a Python constant."""
    from .tensor import Tensor
    if isinstance(value, (Tensor, np.ndarray, np.generic)):
        arr = _feed_array(value, None)
        dt = DType.from_numpy(np.dtype(np.uint8) if arr.dtype == np.bool_ else arr.dtype)
        shape = tuple(arr.shape)
        if dynamic:
            shape = tuple(g if g in (0, 1) else names.setdefault(g, f"{pname}_d{j}") for j, g in enumerate(shape))
        return ("t", shape, dt), arr
    const = _constant(value)
    if const is None:
        raise TypeError(f"jit: argument {pname} is a {type(value).__name__}; expected a tensor, an array "
                        f"or a Python constant (number, str, None, or a tuple / list of them)")
    return ("c", const), None


def _constant(value):
    """value as a hashable signature constant (lists become tuples), or None if it is none."""
    if isinstance(value, _CONSTANTS):
        # repr tells -0.0 from 0.0 and makes NaN equal to itself
        return (type(value).__name__, repr(value) if isinstance(value, (float, complex)) else value)
    if isinstance(value, (tuple, list)):
        parts = [_constant(v) for v in value]
        return None if any(p is None for p in parts) else (type(value).__name__, tuple(parts))
    return None


def jit(fn=None, *, dynamic: bool = False):
    """Trace `fn` on placeholders of its array arguments' shapes and dtypes, compile once per
    signature, and return numpy arrays (a tuple when fn returns several tensors).

    The signature holds each array's shape and dtype (a bool array is u8 data) and the value
    of every other argument, positional or keyword: Python numbers, strings, None and tuples
    of them are passed to `fn` as they are (a Python number in an op takes the other
    operand's dtype), so a new value traces again.  With `dynamic=True` sizes are named dims
    (`a0_d1`: dim 1 of positional argument 0; `kw_x_d0`: dim 0 of keyword argument x); sizes
    0 and 1 stay fixed and dims of equal size share the first one's name, so calls with new
    sizes reuse one Program, compiled per binding of those sizes.  Arrays are read in place,
    not copied."""
    if fn is None:
        return functools.partial(jit, dynamic=dynamic)
    from .tensor import Tensor, placeholder
    programs = caches.LRU(64)

    def wrapper(*args, **kwargs):
        params = [(f"a{i}", v) for i, v in enumerate(args)] + [(f"kw_{k}", kwargs[k]) for k in sorted(kwargs)]
        names, sig, feeds = {}, [], {}
        for pname, value in params:
            part, arr = _signature_part(pname, value, dynamic, names)
            sig.append((pname, part))
            if arr is not None:
                feeds[pname] = arr
        sig = tuple(sig)
        entry = programs.get(sig)
        if entry is None:
            traced = {pname: placeholder(pname, part[1], part[2]) if part[0] == "t" else value
                      for (pname, part), (_, value) in zip(sig, params)}
            out = fn(*(traced[f"a{i}"] for i in range(len(args))), **{k: traced[f"kw_{k}"] for k in kwargs})
            single = isinstance(out, Tensor)
            outs = [out] if single else list(out) if isinstance(out, (tuple, list)) else None
            if not outs or not all(isinstance(t, Tensor) for t in outs):
                raise TypeError(f"jit: {getattr(fn, '__name__', fn)} must return an lc.Tensor or a tuple / list "
                                f"of them, got {type(out).__name__}")
            entry = programs.put(sig, (compile(outs), single))
        prog, single = entry
        res = prog.run(**feeds)
        return res[0] if single else tuple(res)

    functools.update_wrapper(wrapper, fn)
    return wrapper
