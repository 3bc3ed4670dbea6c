"""A Program's graph as a plain, picklable description, and the dim analysis that decides how
it can be cut into chunks.

`describe(prog)` walks the user graph (views included) into records that name no Python object
of the engine, so a task can carry them to any worker.  `analyse(desc)` gives every dim of every
record, of every operand read and of every output a *class*: dims that must be chunked alike
(union-find over elementwise, broadcast, reduce and matmul dim correspondences).  A class is
"whole" (one chunk) when an op or a view gives no per-dim correspondence (index ops, reshapes
that merge dims, narrows) or when one array carries it twice; every other class may be chunked.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.ops import ELEMENTWISE, MATMUL, REDUCE, SOURCE
from ..layout import contiguous_strides

ONE, BCAST = -2, -1      # view_map entries: a size-1 dim, a stride-0 broadcast dim


@dataclass(frozen=True)
class Src:
    """One operand read: record `rec` through a view of `shape`, `strides`, `offset`."""
    rec: int
    shape: tuple
    strides: tuple
    offset: int


@dataclass(frozen=True)
class Rec:
    kind: str            # "ph" (placeholder), "buf" (program constant, fed like a placeholder),
    #                      "const" (scalar), "op"
    shape: tuple
    dtype: str
    op: str = ""         # op name ("op"), feed name ("ph", "buf")
    arg: object = None   # op arg with dtypes as ("dtype", name); scalar value for "const"
    srcs: tuple = ()     # Src per operand
    category: str = ""


@dataclass
class Desc:
    recs: list
    outputs: list                 # Src per program output (a contiguous full view for plain nodes)
    buffers: dict = field(default_factory=dict)   # feed name -> ndarray of each "buf" record

    def key(self):
        return (tuple(self.recs), tuple(self.outputs))


def _enc_arg(a):
    if isinstance(a, tuple):
        return tuple(_enc_arg(x) for x in a)
    if hasattr(a, "size_in_bytes"):
        return ("dtype", a.name)
    return a


def describe(prog) -> Desc:
    """Records of the graph behind `prog`'s outputs, in topological order."""
    recs, index, buffers = [], {}, {}

    def src_of(s):
        b = s.base
        return Src(index[id(b)], s.layout.shape, s.layout.strides, s.layout.offset)

    for root in prog._user_nodes:
        stack = [(root.base, False)]
        while stack:
            n, expanded = stack.pop()
            if id(n) in index:
                continue
            if n.buffer is not None or n.op.category == SOURCE:
                if n.buffer is not None:
                    name = f"__const{len(buffers)}"
                    buffers[name] = n.buffer.reshape(n.shape)
                    rec = Rec("buf", n.shape, n.dtype.name, op=name)
                elif n.op.name == "placeholder":
                    rec = Rec("ph", n.shape, n.dtype.name, op=n.arg)
                else:
                    rec = Rec("const", n.shape, n.dtype.name, arg=n.arg)
                index[id(n)] = len(recs)
                recs.append(rec)
                continue
            if not expanded:
                stack.append((n, True))
                stack.extend((s.base, False) for s in reversed(n.srcs) if id(s.base) not in index)
                continue
            index[id(n)] = len(recs)
            recs.append(Rec("op", n.shape, n.dtype.name, op=n.op.name, arg=_enc_arg(n.arg),
                            srcs=tuple(src_of(s) for s in n.srcs), category=n.op.category))
    outputs = [src_of(n) for n in prog._user_nodes]
    return Desc(recs, outputs, buffers)


def view_map(src: Src, base_shape):
    """Per view dim: the base dim it reads whole, BCAST or ONE; None when the view is not a
    permutation / broadcast / unsqueeze of the whole base (a reshape merging dims, a narrow)."""
    if src.offset != 0:
        return None
    bstr = contiguous_strides(base_shape)
    used, out = set(), []
    for size, stride in zip(src.shape, src.strides):
        if size == 1:
            out.append(ONE)
        elif stride == 0:
            out.append(BCAST)
        else:
            ks = [k for k, (bs, st) in enumerate(zip(base_shape, bstr)) if bs == size and st == stride and k not in used]
            if not ks:
                return None
            used.add(ks[0])
            out.append(ks[0])
    if any(bs > 1 and k not in used for k, bs in enumerate(base_shape)):
        return None
    return out


class Analysis:
    """Dim classes of a Desc.  Slots: ("r", rec, dim), ("s", rec, operand, dim), ("o", out, dim)."""

    def __init__(self, desc: Desc):
        self.desc = desc
        self.parent, self.size, self.whole = {}, {}, {}
        self.maps = {}            # (rec, operand) or ("o", i) -> view_map or None
        for r, rec in enumerate(desc.recs):
            for d, s in enumerate(rec.shape):
                self._add(("r", r, d), s)
            for p, src in enumerate(rec.srcs):
                for d, s in enumerate(src.shape):
                    self._add(("s", r, p, d), s)
                self._link_view((r, p), ("s", r, p), src, rec.op)
            if rec.kind == "op":
                self._link_op(r, rec)
        for i, src in enumerate(desc.outputs):
            for d, s in enumerate(src.shape):
                self._add(("o", i, d), s)
            self._link_view(("o", i), ("o", i), src, "output view")
        for r, rec in enumerate(desc.recs):
            self._no_repeats([("r", r, d) for d in range(len(rec.shape))], rec.op or rec.kind)
            for p, src in enumerate(rec.srcs):
                self._no_repeats([("s", r, p, d) for d in range(len(src.shape))], rec.op)

    # ---- union-find ------------------------------------------------------------------
    def _add(self, slot, size):
        if size > 1:
            self.parent[slot] = slot
            self.size[slot] = size

    def cls(self, slot):
        """The class of a slot (None for a size-1 dim)."""
        if slot not in self.parent:
            return None
        while self.parent[slot] != slot:
            self.parent[slot] = self.parent[self.parent[slot]]
            slot = self.parent[slot]
        return slot

    def _union(self, a, b):
        ca, cb = self.cls(a), self.cls(b)
        if ca is None or cb is None or ca == cb:
            return
        self.parent[cb] = ca
        if cb in self.whole:
            self.whole.setdefault(ca, self.whole.pop(cb))

    def _make_whole(self, slot, why):
        c = self.cls(slot)
        if c is not None:
            self.whole.setdefault(c, why)

    # ---- correspondences ----------------------------------------------------------------
    def _link_view(self, key, prefix, src, who):
        base = self.desc.recs[src.rec]
        m = view_map(src, base.shape)
        self.maps[key] = m
        if m is None:
            why = f"{who} reads its input {base.shape} through a view {src.shape} strides {src.strides} " \
                  f"offset {src.offset} that is not a permutation/broadcast of it"
            for d in range(len(src.shape)):
                self._make_whole(prefix + (d,), why)
            for d in range(len(base.shape)):
                self._make_whole(("r", src.rec, d), why)
            return
        for d, k in enumerate(m):
            if k >= 0:
                self._union(prefix + (d,), ("r", src.rec, k))

    def _link_op(self, r, rec):
        rank = len(rec.shape)
        if rec.category == ELEMENTWISE:
            for p in range(len(rec.srcs)):
                for d in range(rank):
                    self._union(("r", r, d), ("s", r, p, d))
        elif rec.category == REDUCE:
            for d in range(rank):
                if d not in rec.arg:
                    self._union(("r", r, d), ("s", r, 0, d))
        elif rec.category == MATMUL:
            for d in range(rank - 1):
                self._union(("r", r, d), ("s", r, 0, d))
            for d in range(rank - 2):
                self._union(("r", r, d), ("s", r, 1, d))
            self._union(("r", r, rank - 1), ("s", r, 1, rank - 1))
            self._union(("s", r, 0, rank - 1), ("s", r, 1, rank - 2))
        else:
            why = f"{rec.op} ({rec.category}) has no per-chunk form along its dims"
            for d in range(rank):
                self._make_whole(("r", r, d), why)
            for p, src in enumerate(rec.srcs):
                for d in range(len(src.shape)):
                    self._make_whole(("s", r, p, d), why)

    def _no_repeats(self, slots, who):
        seen = {}
        for s in slots:
            c = self.cls(s)
            if c is None:
                continue
            if c in seen:
                self._make_whole(s, f"{who} joins two of its own dims ({seen[c][-1]} and {s[-1]})")
            seen[c] = s
