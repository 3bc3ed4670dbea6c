"""Build-then-run graphs: placeholders -> lc.compile -> Program.run, lc.jit, and the IR dump
tool (lc.dump / Program.dump / LAZYCANDLE_DUMP)."""
from __future__ import annotations

import numpy as np

from .dtype import DType
from .errors import FeedError
from .ir.graph import capture, views_graph
from .ir.printer import render
from .runtime import executor


def _targets(ts):
    """The computed nodes standing for the tensors `ts`: a contiguous view of a computed node
    reads that node's buffer (returned as (node, element offset)); other views, constants and
    realized tensors get a copy node."""
    from .ir.node import Node
    out = []
    for t in ts:
        n = t._node
        if n.op.category == "view" and n.layout.is_contiguous() and not n.base.realized \
                and n.base.op.category not in ("source",):
            out.append((n.base, n.layout.offset))
        elif n.op.category in ("view", "source") or n.realized:
            out.append((Node("copy", (n,), None, n.shape, n.dtype), 0))
        else:
            out.append((n, 0))
    return out


class Program:
    """A compiled graph with named placeholder inputs.  `run(**feeds)` (or calling it) returns
    one numpy array per output."""

    def __init__(self, outputs):
        from .tensor import Tensor
        outputs = list(outputs)
        if not outputs or not all(isinstance(t, Tensor) for t in outputs):
            raise TypeError("compile: expected a non-empty list of lc.Tensor outputs")
        self._user_nodes = [t._node for t in outputs]
        targets = _targets(outputs)
        self._targets = [n for n, _ in targets]
        self._out_offsets = [off for _, off in targets]
        cap = capture(self._targets)
        self._cap_inputs = cap.inputs
        self._offsets = cap.offsets
        self._scalars = cap.scalars
        self._plan = executor.get_plan(cap, self._targets)
        self.inputs = [(n.arg, n.shape, n.dtype) for n in cap.inputs if not n.realized]
        names = [n for n, _, _ in self.inputs]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise FeedError(f"compile: placeholder name(s) {sorted(dup)} used for more than one input")
        self._consts = [n.buffer for n in cap.inputs]

    def _bind(self, feeds):
        expected = {n: (s, d) for n, s, d in self.inputs}
        unknown = set(feeds) - set(expected)
        if unknown:
            raise FeedError(f"run: unknown input(s) {sorted(unknown)}; expected {sorted(expected)}")
        missing = set(expected) - set(feeds)
        if missing:
            raise FeedError(f"run: missing input(s) {sorted(missing)}: expected "
                            + ", ".join(f"{n} {expected[n][0]} {expected[n][1].name}" for n in sorted(missing)))
        bufs = []
        for node, const in zip(self._cap_inputs, self._consts):
            if node.realized:
                bufs.append(const)
                continue
            name, shape, dt = node.arg, node.shape, node.dtype
            v = feeds[name]
            if hasattr(v, "_node"):
                v = v.numpy()
            if not isinstance(v, np.ndarray):
                v = np.asarray(v)
            if not v.dtype.isnative and v.dtype.newbyteorder("=") == dt.numpy:
                v = v.astype(dt.numpy)          # big-endian data: byteswapped to native
            if v.dtype != dt.numpy:
                raise FeedError(f"run: input {name!r} expects dtype {dt.name} ({dt.numpy}), given {v.dtype}")
            if tuple(v.shape) != shape:
                raise FeedError(f"run: input {name!r} expects shape {shape}, given {tuple(v.shape)}")
            bufs.append(np.ascontiguousarray(v).reshape(-1))
        return bufs

    def run(self, **feeds) -> list:
        outs = self._plan.run(self._bind(feeds), self._offsets, self._scalars)
        res = []
        for o, n, off in zip(outs, self._user_nodes, self._out_offsets):
            size = int(np.prod(n.shape))
            res.append(o[off:off + size].reshape(n.shape))
        return res

    __call__ = run

    def dump(self, stage="schedule", fmt="text") -> str:
        return render(stage, fmt, self._plan, views_graph(self._user_nodes), self._targets)

    def __repr__(self):
        return f"Program(inputs={self.inputs}, kernels={len(self._plan.kernels)})"

    def __reduce__(self):
        """Pickles the output graph; unpickling compiles it again (usually a cache hit)."""
        from .graph_pickle import graph_state, rebuild_program
        return rebuild_program, (graph_state(self._user_nodes),)


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
    targets = [n for n, _ in _targets(ts)]
    plan = executor.get_plan(capture(targets), targets)
    return render(stage, fmt, plan, views_graph([t._node for t in ts]), targets)


def jit(fn):
    """Trace `fn` on placeholders of its arguments' shapes and dtypes, compile once per
    signature, and return numpy arrays (a tuple when fn returns several tensors)."""
    from .tensor import Tensor, placeholder
    cache = {}

    def wrapper(*args):
        arrays = [a.numpy() if isinstance(a, Tensor) else np.asarray(a) for a in args]
        sig = tuple((a.shape, DType.from_numpy(a.dtype).name) for a in arrays)
        entry = cache.get(sig)
        if entry is None:
            phs = [placeholder(f"arg{i}", a.shape, DType.from_numpy(a.dtype)) for i, a in enumerate(arrays)]
            out = fn(*phs)
            single = isinstance(out, Tensor)
            entry = cache[sig] = (compile([out] if single else list(out)), single)
        prog, single = entry
        res = prog.run(**{f"arg{i}": a for i, a in enumerate(arrays)})
        return res[0] if single else tuple(res)

    wrapper.__wrapped__ = fn
    return wrapper
