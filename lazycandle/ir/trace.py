"""Each computed node's structural trace, built ONCE when the node is built, so an eager realize
of a small expression finds its compiled plan without walking the graph (compiler.py
`_realize_traced`).

A trace is `(sig, reads, scalars, watch, inner)`:
  * sig      an interned int standing for the node's whole expression tree: per node its op,
             structural arg, shape and dtype, and per source read how it is read -- a constant
             by (dtype, broadcast shape, the value class a rewrite tests: `ops.scalar_class`), a
             realized buffer by (its shape, dtype, the read's shape and strides), a computed node
             by (its sig, the read's shape, strides and offset).  What graph.capture's key holds,
             in tree form; never data, scalar values or input offsets (those are runtime).
  * reads    per read of a realized buffer, in tree order: (buffer node, element offset,
             (read shape, strides));
  * scalars  per scalar operand (constants and the scalar args of affine, clamp, ...), in tree
             order: (value, DType);
  * watch    every node below that was unrealized when `n` was built -- computed nodes, views,
             constants: the trace stands only while none of them is realized (a realized one
             is an input of the capture instead);
  * inner    the computed nodes below, each once, in a fixed order of the structure.
A computed node shared by two sources (`y * y`, layer_norm's centred x) is one node of `inner`,
and the sig says which of a source's nodes are an earlier source's; its reads and scalars are
listed once per use.  Which reads are of the same buffer, the same operand slot, and which
scalars are equal is left to the realize (`patterns`), with the capture's rules, so the sig
plus those patterns determine the capture key.  A node that reads a placeholder or grows past
the bounds below gets no trace (None): it realizes through the capture walk."""
from __future__ import annotations

import itertools

from .. import caches
from .ops import OPS, SOURCE, scalar_class

MAX_INNER = 32          # computed nodes below a traced node
MAX_WATCH = 96          # nodes whose realize would change the capture (computed, views, constants)
MAX_READS = 16          # buffer reads
MAX_SCALARS = 16
MAX_SIGS = 1 << 16      # interned sigs kept before the table starts afresh
MAX_MEMO = 16           # traces kept on one realized node (ops built on it; then it starts afresh)

# structural tuple -> sig; ids are never reused, so a sig names one structure even after the
# table is cleared (the same structure built again gets a new sig: its first realize captures)
_sigs = caches.register("trace sigs", {})
_sig_ids = itertools.count()


def _intern(key) -> int:
    sig = _sigs.get(key)
    if sig is None:
        if len(_sigs) >= MAX_SIGS:
            _sigs.clear()
        sig = _sigs.setdefault(key, next(_sig_ids))
    return sig


def argkey(a):
    """A node arg as a key holds it (the trace's and graph.capture's): dtypes by name, tuples
    element by element."""
    if isinstance(a, tuple):
        return tuple(argkey(x) for x in a)
    if hasattr(a, "size_in_bytes"):
        return ("dtype", a.name)
    return a


PENDING = ("pending",)   # a node's trace not built yet (a matmul: realized apart from it, usually)


def trace_of(n):
    """`n.trace`, built now if it was left PENDING."""
    t = n.trace
    if t is PENDING:
        t = n.trace = node_trace(n)
    return t


def node_trace(n):
    """The trace of computed node `n` (its sources already built), or None.  An op on one
    realized node (`x.sum(-1)`, `x.exp()` on a weight or an input) reads it the same way every
    time it is built: its trace is kept on that node per (op, arg, shape, dtype), and found
    again by one small lookup instead of rebuilding and interning the structural key."""
    srcs = n.srcs
    if len(srcs) == 1:
        s = srcs[0]
        if s.buffer is not None:
            memo = s.traces
            key = (n.op, n.arg, n.shape, n.dtype)
            try:
                got = memo.get(key) if memo is not None else None
            except TypeError:           # an arg that is not hashable
                return _trace(n)
            if got is None:
                tr = _trace(n)
                if memo is None or len(memo) >= MAX_MEMO:
                    memo = s.traces = {}
                # kept without the node itself (no reference cycle keeps its buffer alive); the
                # one read is of `s`, nothing watched or inner (else it is not kept)
                if tr is None or (len(tr[1]) == 1 and not tr[3] and not tr[4]):
                    memo[key] = (tr[0], tr[1][0][1:], tr[2]) if tr is not None else False
                return tr
            return (got[0], ((s,) + got[1],), got[2], (), ()) if got else None
    return _trace(n)


def _trace(n):
    kind = n.op
    descs, reads, scalars, watch, inner = [], (), (), (), ()
    for s in n.srcs:
        b = s._base or s
        lay = s.layout
        if b.buffer is not None:
            descs.append(("i", b.shape, b.dtype.name, lay.shape, lay.strides))
            reads += ((b, lay.offset, (lay.shape, lay.strides)),)
            if s is not b:
                watch += (s,)               # a view realized later is an input of its own
        elif b.op.category is SOURCE:
            if b.op is not _CONST:
                return None                 # a placeholder: realized only through a Program
            v = b.arg
            descs.append(("c", b.dtype.name, lay.shape, scalar_class(kind, v) if kind.keyed_scalars else None))
            scalars += ((v, b.dtype),)
            watch += (b, s) if s is not b else (b,)
        else:
            t = b.trace
            if t is PENDING:
                t = trace_of(b)
            if t is None:
                return None
            descs.append(("n", t[0], lay.shape, lay.strides, lay.offset))
            below = t[4] + (b,)
            if inner:
                seen = {id(m): k for k, m in enumerate(inner)}
                if any(id(m) in seen for m in below):
                    # a computed node shared with an earlier source: the key says which of this
                    # source's nodes are which earlier ones, as the capture walk dedups them
                    descs.append(("shared", tuple(seen.get(id(m), -1) for m in below)))
                    below = tuple(m for m in below if id(m) not in seen)
                inner += below
            else:
                inner = below
            watch += t[3] + ((b, s) if s is not b else (b,))
            reads += t[1]
            scalars += t[2]
    arg = n.arg
    if kind.scalar_args:
        values = arg if arg.__class__ is tuple else (arg,)
        for v in values:
            descs.append(("c", n.dtype.name, (), None))
            scalars += ((v, n.dtype),)
        arg = kind.arg_class(values, n.dtype) if kind.arg_class else None
    elif not (arg is None or arg.__class__ in _PLAIN_ARGS or
              (arg.__class__ is tuple and _INT.issuperset(map(type, arg)))):   # (dims: already a key)
        arg = argkey(arg)
    if len(inner) > MAX_INNER or len(watch) > MAX_WATCH or len(reads) > MAX_READS or len(scalars) > MAX_SCALARS:
        return None
    key = (kind.name, arg, n.shape, n.dtype.name, tuple(descs))
    try:
        sig = _sigs.get(key)
    except TypeError:                       # an arg that is not hashable: no key to file it under
        return None
    if sig is None:
        sig = _intern(key)
    return (sig, reads, scalars, watch, inner)


_PLAIN_ARGS = frozenset((int, float, str))
_INT = frozenset((int,))
_CONST = OPS["const"]


def patterns(trace) -> tuple:
    """The runtime identity pattern of a trace's reads and scalars, by the capture's rules:
    per read, which distinct buffer (by identity) and which operand slot (buffer, read shape,
    strides, offset) it is; per scalar, which slot (dtype, repr of the value)."""
    reads, scalars = trace[1], trace[2]
    if len(reads) == 1:
        rp = (0, 0)
    else:
        leaves, slots, rp = {}, {}, []
        for leaf, off, rc in reads:
            rp.append(leaves.setdefault(id(leaf), len(leaves)))
            rp.append(slots.setdefault((id(leaf), rc, off), len(slots)))
        rp = tuple(rp)
    sc, cp = {}, []
    for v, dt in scalars:
        cp.append(sc.setdefault((dt.name, repr(v)), len(sc)))
    return rp, tuple(cp)
