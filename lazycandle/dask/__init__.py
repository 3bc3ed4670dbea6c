"""lc.dask: run a compiled Program chunk by chunk on Dask (threads, processes or a cluster).

`run(prog, **feeds)` analyses the program's graph (see graph.py): dims that only flow through
elementwise ops, broadcasts, permutations and the free dims of reductions and matmuls are cut
blockwise; a reduction or matmul whose reduced / contracted dim is chunked becomes a *cut*: a
per-block partial (the same compiled reduction over the block, argmax with the block's offset
added, a partial product per k block), then a tree of lazycandle combine programs.  A cut's
value is fed, as a placeholder, to every later stage, so a row op with its row dim chunked
(softmax, layer_norm) runs as several passes instead of failing.  Every chunk computes in a
compiled lazycandle program; NumPy only holds and slices the blocks.
"""
from __future__ import annotations

try:
    import dask
    import dask.array as da
except ImportError as e:   # pragma: no cover - depends on the environment
    raise ImportError("lazycandle.dask needs the optional extra: pip install 'lazycandle[dask]'") from e

import numpy as np

from .. import named_dims
from ..dtype import DType
from ..errors import Error, FeedError
from ..graph_api import check_feed_names, named_sizes
from .graph import Analysis, describe
from .kernels import Dims
from .stages import Planner

AUTO_RECHUNK_BYTES = 64 << 20   # a dim that must be one chunk is merged automatically below this block size


def run(prog, **feeds) -> list:
    """One dask array per output of `prog`, computed chunk by chunk by its compiled kernels."""
    from ..graph_api import Program
    if not isinstance(prog, Program):
        raise TypeError(f"lc.dask.run: expected an lc.Program, got {type(prog).__name__}")
    prog = _bound(prog, feeds)
    desc = describe(prog)
    an = Analysis(desc)
    arrays = _check_feeds(prog, feeds)
    arrays.update({name: da.from_array(buf, chunks=-1, name=f"lazycandle-const-{dask.base.tokenize(buf)}")
                   for name, buf in desc.buffers.items()})
    dims = _dims(an)
    chunks, arrays = _plan_chunks(desc, an, dims, arrays)
    return Planner(desc, dims, chunks, arrays).outputs()


def _bound(prog, feeds):
    """`prog` with its named dims bound to the feeds' sizes, as a program of fixed shapes (the
    chunk plan needs every size); `prog` itself when it has none."""
    from ..graph_api import Program
    from ..tensor import Tensor
    if not any(isinstance(d, str) for _, spec, _ in prog.inputs for d in spec):
        return prog
    check_feed_names("lc.dask.run", prog.inputs, feeds)
    sizes = named_sizes("lc.dask.run", prog.inputs, {name: np.shape(v) for name, v in feeds.items()})
    return Program([Tensor(n) for n in named_dims.bind(prog._user_nodes, sizes)])


def _check_feeds(prog, feeds) -> dict:
    """Dask arrays by feed name, checked against the program's placeholders like Program.run."""
    check_feed_names("lc.dask.run", prog.inputs, feeds)
    expected = {n: (s, d) for n, s, d in prog.inputs}
    out = {}
    for name, v in feeds.items():
        shape, dt = expected[name]
        if hasattr(v, "_node"):
            v = v.numpy()
        if not isinstance(v, da.Array):
            v = np.asarray(v)
        if v.dtype != dt.numpy:
            raise FeedError(f"lc.dask.run: input {name!r} expects dtype {dt.name} ({dt.numpy}), given {v.dtype}")
        if tuple(v.shape) != tuple(shape):
            raise FeedError(f"lc.dask.run: input {name!r} expects shape {shape}, given {tuple(v.shape)}")
        out[name] = v if isinstance(v, da.Array) else da.from_array(v, chunks="auto")
    return out


def _dims(an: Analysis) -> Dims:
    """The analysis as small picklable ints."""
    ids = {}

    def cid(slot):
        c = an.cls(slot)
        return None if c is None else ids.setdefault(c, len(ids))

    recs = an.desc.recs
    rec = tuple(tuple(cid(("r", r, d)) for d in range(len(x.shape))) for r, x in enumerate(recs))
    src = {(r, p): tuple(cid(("s", r, p, d)) for d in range(len(s.shape)))
           for r, x in enumerate(recs) for p, s in enumerate(x.srcs)}
    out = tuple(tuple(cid(("o", i, d)) for d in range(len(s.shape))) for i, s in enumerate(an.desc.outputs))
    full = {i: an.size[c] for c, i in ids.items()}
    reduced = {r: [cid(("s", r, 0, d)) for d in x.arg] if x.category == "reduce"
               else [cid(("s", r, 0, len(x.shape) - 1))]
               for r, x in enumerate(recs) if x.category in ("reduce", "matmul")}
    whole = {ids[c]: why for c, why in an.whole.items() if c in ids}
    return Dims(rec, src, out, dict(an.maps), full, whole, reduced)


def _plan_chunks(desc, an, dims, arrays):
    """Chunks per chunkable class (the common refinement of the feeds' chunks), and the feeds
    rechunked to them.  A chunked dim of a class that must be whole is merged when the merged
    block stays small, else it is an lc.Error that says which op needs it whole."""
    feed_rec = {rec.op: r for r, rec in enumerate(desc.recs) if rec.kind in ("ph", "buf")}
    bounds = {}
    for name, arr in arrays.items():
        cls = dims.rec[feed_rec[name]]
        for d, c in enumerate(cls):
            if c is None or len(arr.chunks[d]) == 1:
                continue
            why = dims.whole_reason.get(c)
            if why is not None:
                merged = arr.dtype.itemsize * np.prod([arr.shape[k] if k == d else max(arr.chunks[k])
                                                       for k in range(arr.ndim)])
                if merged > AUTO_RECHUNK_BYTES:
                    raise Error(f"lc.dask.run: dim {d} of input {name!r} (shape {arr.shape}, chunks "
                                f"{arr.chunks[d]}) must be one chunk: {why}; rechunk it first with "
                                f"{name}.rechunk({{{d}: -1}})")
                continue
            edges = set(np.cumsum((0,) + arr.chunks[d]).tolist())
            bounds[c] = bounds.get(c, set()) | edges
    chunks = {c: tuple(np.diff(sorted(b)).tolist()) for c, b in bounds.items()}
    out = {}
    for name, arr in arrays.items():
        want = tuple(chunks.get(c, (arr.shape[d],)) if c is not None else (arr.shape[d],)
                     for d, c in enumerate(dims.rec[feed_rec[name]]))
        out[name] = arr if want == arr.chunks else arr.rechunk(want)
    return chunks, out


def from_tensor(t, chunks="auto"):
    """A dask array of a (realized) lc.Tensor's data, cut into `chunks`."""
    return da.from_array(t.numpy(), chunks=chunks)


def to_tensor(x):
    """An lc.Tensor of a dask array's computed value (or of an ndarray)."""
    from ..tensor import from_numpy
    v = x.compute() if isinstance(x, da.Array) else np.asarray(x)
    return from_numpy(np.ascontiguousarray(v), DType.from_numpy(v.dtype))


__all__ = ["run", "from_tensor", "to_tensor", "AUTO_RECHUNK_BYTES"]
