"""The scheduler: groups captured nodes into kernels.

Elementwise fusion is maximal: every elementwise node joins the groups of its elementwise
producers that it reads element-for-element (same shape, contiguous, offset 0), so any DAG of
elementwise ops over inputs of any layout becomes ONE kernel (up to MAX_FUSED_NODES ops).  A
node is materialised (written to a buffer) when it is a target or when a node of another kernel
reads it; inside its own kernel it stays a register value.  Non-elementwise nodes (reduce,
matmul, index ops) are kernels of their own; a reduction also absorbs its elementwise producers
when nothing else reads them.

Kernels must form a DAG.  Node j may join a producer group G only if G reaches none of j's
other operand groups (a path G -> X -> j through a kernel X outside the merge would make the
merged kernel both feed and wait for X: the residual `x + f(x @ w)`).  Reachability is asked of
the *group* graph by a backward search from j's other operands, which only visits groups whose
newest node is newer than G's oldest (no path from G can pass through an older group), with a
work budget: when the budget runs out the merge is refused, which is always legal, so the
scheduler stays linear-ish in the graph size and never needs per-node ancestor sets.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from ..errors import SchedulerError
from ..layout import contiguous_strides
from . import rows
from .graph import Capture
from .horizontal import fuse_horizontal
from .epilogue import _reads_in_order, epilogue_kernel, fuse_epilogues
from .kernels import EwSpec, RedSpec, ew_classes, ew_loop, runtime_sizes, tile_dim
from .ops import ELEMENTWISE, MATMUL, REDUCE

# Ops fused into one kernel at most.  LLVM's optimiser is superlinear in the size of one
# function (one kernel of 256 / 1,024 / 4,096 cheap ops: 0.25 / 1.4 / 18 s in compile_ir), while a
# buffer write every few hundred ops costs nothing measurable.  A cut never changes a value: each
# op rounds its own result in every dtype (f32/f64 only lose an optional FMA contraction).
MAX_FUSED_NODES = 256
# Groups a reachability search may expand before the merge it guards is refused.
REACH_BUDGET = 512


@dataclass
class Kernel:
    kind: str                       # "elementwise", ...
    nodes: list                     # captured node indices fused in, topological
    outputs: list                   # node indices written to buffers, in output order
    inputs: list = field(default_factory=list)   # ("slot", s) | ("node", j, offset): what each kernel input reads
    spec: object = None             # codegen spec (its structure is the compile cache key)
    scalars: list = field(default_factory=list)  # capture scalar slot of each kernel scalar slot
    loop_shape: tuple = ()          # fused kernels: the merged iteration shape
    loop_strides: tuple = ()        # fused kernels: each input's strides over loop_shape
    sizes: tuple = ()               # fused kernels: the runtime `sizes` argument
    why: list = field(default_factory=list)      # notes on fusion decisions (for the dump)
    epilogue: object = None         # matmul kernels: the fused consumers (ir/epilogue.py)
    parts: list = None              # horizontal kernels: the node group of each segment (ir/horizontal.py)

    def groups(self) -> list:
        """The scheduler's node groups this kernel runs (a template replays them)."""
        return self.parts or [self.nodes]


def _identity_read(o, shape) -> bool:
    return o.kind == "node" and o.shape == shape and o.offset == 0 and \
        all(d == 1 or s == c for d, s, c in zip(shape, o.strides, contiguous_strides(shape)))


class _Groups:
    """Disjoint groups of node indices and the group graph's edges.  A group's id is one of its
    members; a merge relabels the smaller groups, so all merges together cost O(n log n)."""

    def __init__(self, n_nodes, prune=True):
        self.prune = prune                      # reaches() skips groups older than its source
        self.of = list(range(n_nodes))          # node -> group id
        self.members = {}                       # group id -> member nodes
        self.preds = {}                         # group id -> nodes outside it that its members read
        self.lo, self.hi = {}, {}               # oldest / newest member
        self.uses = {}                          # (member, consumer) read pairs, consumer anywhere
        self.inner = {}                         # ... of them with the consumer inside the group
        self.target = {}                        # holds a target

    def add(self, j, operand_nodes, n_consumers, is_target):
        self.members[j], self.preds[j] = [j], set(operand_nodes)
        self.lo[j] = self.hi[j] = j
        self.uses[j], self.inner[j], self.target[j] = n_consumers, 0, is_target

    def outside_uses(self, g) -> int:
        return self.uses[g] - self.inner[g]

    def merge(self, parts, new_inner) -> int:
        """Merge the groups `parts` (which read each other only through `new_inner` (member,
        consumer) pairs) into one; returns its id."""
        g = max(parts, key=lambda h: len(self.members[h]))
        for h in parts:
            if h == g:
                continue
            moved = self.members.pop(h)
            for y in moved:
                self.of[y] = g
            self.members[g].extend(moved)
            self.preds[g].difference_update(moved)
            self.preds[g].update(x for x in self.preds.pop(h) if self.of[x] != g)
            self.lo[g], self.hi[g] = min(self.lo[g], self.lo.pop(h)), max(self.hi[g], self.hi.pop(h))
            self.uses[g] += self.uses.pop(h)
            self.inner[g] += self.inner.pop(h)
            self.target[g] = self.target[g] or self.target.pop(h)
        self.inner[g] += new_inner
        return g

    def reaches(self, src, dsts) -> bool:
        """Whether group `src` has a path to a group in `dsts`.  True also when the search runs
        over budget: the caller then refuses a merge, which is always safe.  With `prune`, a
        group whose members are all older than src's is not searched: no path of nodes leads
        from src to it, but one of groups can, through a group that holds an old node and a
        node reading src (group_nodes then groups again without the pruning)."""
        lo, of, hi, preds = self.lo[src] if self.prune else -1, self.of, self.hi, self.preds
        stack = [g for g in dsts if hi[g] >= lo]
        seen = set(stack)
        work = 0
        while stack:
            g = stack.pop()
            if g == src:
                return True
            work += 1 + len(preds[g]) // 64
            if work > REACH_BUDGET:
                return True
            for x in preds[g]:
                h = of[x]
                if h not in seen and hi[h] >= lo:    # an older group cannot lie on a path from src
                    seen.add(h)
                    stack.append(h)
        return False


def _register_read(nodes, o) -> bool:
    """Whether operand o reads an elementwise node element for element (a value the consumer
    can take from a register when both are in one kernel)."""
    return o.kind == "node" and nodes[o.index].op.category == ELEMENTWISE and _identity_read(o, nodes[o.index].shape)


def group_nodes(cap: Capture):
    """Assign every captured node to a kernel group.  Returns (groups in execution order,
    node -> group id, notes)."""
    nodes, operands = cap.nodes, cap.operands
    consumers = [set() for _ in nodes]
    for j, ops in enumerate(operands):
        for o in ops:
            if o.kind == "node":
                consumers[o.index].add(j)
    targets = set(cap.targets)
    try:
        return _group(cap, consumers, targets, prune=True)
    except SchedulerError:      # (rare) the pruned reach test let two groups wait for each other
        return _group(cap, consumers, targets, prune=False)


def _group(cap, consumers, targets, prune):
    """group_nodes' grouping, with reach tests pruned by node age or not (_Groups.reaches)."""
    nodes, operands = cap.nodes, cap.operands
    gr, notes = _Groups(len(nodes), prune), []
    for j, (n, ops) in enumerate(zip(nodes, operands)):
        node_ops = [o.index for o in ops if o.kind == "node"]
        gr.add(j, node_ops, len(consumers[j]), j in targets)
        if n.op.category == REDUCE:
            _absorb_producers(gr, nodes, j, ops[0], notes)
        elif n.op.category == ELEMENTWISE:
            if _defers_to_consumers(nodes, j, ops, consumers):
                notes.append(f"n{j} ({n.op.name}) left to its consumers' kernel: it reads one value a matmul "
                             f"reads from memory anyway")
                continue
            _fuse_elementwise(gr, nodes, j, ops, notes)
    _pair_attention_lse(gr, nodes, operands, notes)
    fuse_epilogues(gr, nodes, operands, consumers, targets, notes)
    groups = {g: sorted(m) for g, m in gr.members.items()}
    order = _order_groups(cap, groups, gr.of)
    row_groups = rows.fuse_rows(cap, groups, order, gr.of, notes)
    if row_groups:
        order = _order_groups(cap, groups, gr.of, row_groups)
    return [groups[g] for g in order], gr.of, notes


def _pair_attention_lse(gr, nodes, operands, notes):
    """A flash_attention_lse node (the backward's) joins the forward of the same operands and
    arg: one pass of the attention kernel writes the output and the rows' log-sum-exp
    (runtime/attention_steps.py) instead of a second pass over the scores."""
    forwards = {}
    for j, n in enumerate(nodes):
        if n.op.name == "flash_attention":
            forwards.setdefault((n.arg, tuple(o.key() for o in operands[j])), j)
    for j, n in enumerate(nodes):
        if forwards and n.op.name == "flash_attention_lse":
            f = forwards.pop((n.arg, tuple(o.key() for o in operands[j])), None)
            if f is not None:
                gr.merge([f, j], 0)
                notes.append(f"n{j} (flash_attention_lse) is written by n{f}'s kernel (flash_attention)")


def _absorb_producers(gr, nodes, j, o, notes):
    """A reduction takes in the elementwise group it reads element for element when nothing
    else reads that group (it then never touches memory).  The reduction's only input is in
    that group, so the merge cannot close a cycle."""
    if not (_register_read(nodes, o) and o.shape == nodes[o.index].shape):
        return
    g = gr.of[o.index]
    if gr.target[g] or gr.outside_uses(g) != 1:
        notes.append(f"n{j} ({nodes[j].op.name}) reads n{o.index} from a buffer: its producers are used elsewhere")
    elif len(gr.members[g]) >= MAX_FUSED_NODES:
        notes.append(f"n{j} ({nodes[j].op.name}) reads n{o.index} from a buffer: its producers fill a kernel")
    else:
        gr.merge([j, g], 1)


def _defers_to_consumers(nodes, j, ops, consumers) -> bool:
    """Whether elementwise node j is a cheap op of one value that a matmul reads from memory
    anyway (relu's output, read by the next layer, and by its backward mask `out > 0`), with
    only elementwise consumers.  Kept out of that value's kernel it fuses into its consumers'
    (they read the value, not a mask written for them), and the value's kernel keeps the one
    output that lets it be the producing matmul's epilogue."""
    reads = {o.index for o in ops if o.kind == "node"}
    if len(reads) != 1 or nodes[j].op.cost > 1 or not consumers[j]:
        return False
    p = next(iter(reads))
    return all(nodes[c].op.category == ELEMENTWISE for c in consumers[j]) and \
        any(nodes[c].op.category == MATMUL for c in consumers[p])


def _fuse_elementwise(gr, nodes, j, ops, notes):
    """An elementwise node joins every producer group it reads element for element that
    reaches none of its other operands' groups (see the module docstring)."""
    shape = nodes[j].shape
    direct, viewed = {}, set()
    for o in ops:
        if o.kind != "node":
            continue
        if _register_read(nodes, o) and nodes[o.index].shape == shape:
            direct.setdefault(gr.of[o.index], set()).add(o.index)
        else:
            viewed.add(gr.of[o.index])
    operand_groups = set(direct) | viewed
    accepted, size = [], 1
    for g in sorted(direct, key=lambda h: gr.hi[h]):
        if g in viewed:
            notes.append(f"n{j} not fused with group of n{gr.lo[g]}: it also reads that group through a view")
        elif size + len(gr.members[g]) > MAX_FUSED_NODES:
            notes.append(f"n{j} not fused with group of n{gr.lo[g]}: the kernel would exceed {MAX_FUSED_NODES} ops")
        elif gr.reaches(g, operand_groups - {g}):
            notes.append(f"n{j} not fused with group of n{gr.lo[g]}: that group also feeds another operand "
                         f"of n{j} through another kernel")
        else:
            accepted.append(g)
            size += len(gr.members[g])
    if accepted:
        gr.merge([j] + accepted, sum(len(direct[g]) for g in accepted))


def _order_groups(cap: Capture, groups, group_of, row_groups=()):
    """Group ids in execution order (each group as soon as its producers ran, oldest newest-node
    first), after checking that the kernels form a DAG and that every value read inside a kernel
    is a register value of that kernel.  A violation is a scheduler bug: SchedulerError."""
    nodes, operands = cap.nodes, cap.operands
    succs = {g: set() for g in groups}
    indeg = dict.fromkeys(groups, 0)
    for j, ops in enumerate(operands):
        g = group_of[j]
        for o in ops:
            if o.kind != "node":
                continue
            h = group_of[o.index]
            if h == g and g in row_groups:      # rows.py admits only register reads
                continue
            if h == g:
                cat = nodes[j].op.category
                fusable = cat == ELEMENTWISE or (cat == REDUCE and j == groups[g][-1])
                epilogue = nodes[o.index].op.category == MATMUL and _reads_in_order(o, nodes[o.index].shape)
                if not (fusable and (_register_read(nodes, o) or epilogue)):
                    raise SchedulerError(f"scheduler put n{j} ({nodes[j].op.name}) in one kernel with n{o.index} "
                                         f"({nodes[o.index].op.name}), which it reads through a buffer; kernel: "
                                         f"{_describe(nodes, groups[g])}")
            elif g not in succs[h]:
                succs[h].add(g)
                indeg[g] += 1
    heap = [(groups[g][-1], g) for g, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    order = []
    while heap:
        _, g = heapq.heappop(heap)
        order.append(g)
        for s in succs[g]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (groups[s][-1], s))
    if len(order) != len(groups):
        raise SchedulerError("scheduler produced kernels that wait for each other: "
                             + " -> ".join(_describe(nodes, groups[g]) for g in _a_cycle(succs, indeg)))
    return order


def _a_cycle(succs, indeg):
    """One cycle among the groups Kahn's algorithm could not order (each has a pending producer)."""
    left = {g for g, d in indeg.items() if d > 0}
    preds = {g: [h for h in left if g in succs[h]] for g in left}
    path, at, g = [], {}, next(iter(sorted(left)))
    while g not in at:
        at[g] = len(path)
        path.append(g)
        g = preds[g][0]
    cycle = path[at[g]:][::-1]
    return cycle + [cycle[0]]


def _describe(nodes, members, limit=6):
    names = [f"n{j} {nodes[j].op.name}{list(nodes[j].shape)}" for j in members[:limit]]
    more = f", +{len(members) - limit} more" if len(members) > limit else ""
    return "[" + ", ".join(names) + more + "]"


def materialized(cap: Capture, group_of) -> set:
    """Nodes that need a buffer: targets and nodes read by another kernel."""
    out = set(cap.targets)
    for j, ops in enumerate(cap.operands):
        for o in ops:
            if o.kind == "node" and group_of[o.index] != group_of[j]:
                out.add(o.index)
    return out


def schedule(cap: Capture):
    """Kernels in execution order, plus the set of materialised nodes and fusion notes."""
    groups, group_of, notes = group_nodes(cap)
    mat = materialized(cap, group_of)
    return bind_kernels(cap, groups, mat), mat, notes


def bind_kernels(cap: Capture, groups, mat) -> list:
    """The kernels of `groups` (node index lists, in execution order) over this capture's
    concrete layouts: fused kernels get their spec (shape class) and runtime sizes; then
    independent ones of one structure merge horizontally (ir/horizontal.py)."""
    kernels = []
    for g in groups:
        kind = cap.nodes[g[-1]].op.category
        mm = [j for j in g if cap.nodes[j].op.category == MATMUL]
        if mm and len(g) > 1:
            kernels.append(epilogue_kernel(cap, mm[0], g, mat, _fused_kernel, Kernel))
        elif kind in (ELEMENTWISE, REDUCE) and rows.is_row_group(cap, g):
            kernels.append(rows.row_kernel(cap, g, mat))
        elif kind in (ELEMENTWISE, REDUCE):
            kernels.append(_fused_kernel(cap, g, mat))
        else:
            reads = [("slot", o.index) if o.kind == "in" else ("node", o.index, o.offset)
                     for o in cap.operands[g[0]] if o.kind != "const"]
            kernels.append(Kernel(kind, g, [j for j in g if j in mat], reads))
    return fuse_horizontal(cap, kernels, Kernel)


def _merge_classed(shape, strides_list, red):
    """merge_dims for a reduction: only dims of the same class (kept / reduced) merge, and at
    least one reduced dim survives."""
    dims = [(d, r, [s[i] for s in strides_list]) for i, (d, r) in enumerate(zip(shape, red)) if d != 1]
    if not any(r for _, r, _ in dims):
        dims.append((1, True, [0] * len(strides_list)))
    out = [list(dims[0][:2]) + [list(dims[0][2])]]
    for d, r, st in dims[1:]:
        prev = out[-1]
        if prev[1] == r and all(ps == s * d for ps, s in zip(prev[2], st)):
            prev[0] *= d
            prev[2] = list(st)
        else:
            out.append([d, r, list(st)])
    return (tuple(x[0] for x in out), tuple(x[1] for x in out),
            [tuple(x[2][k] for x in out) for k in range(len(strides_list))])


def _fused_kernel(cap: Capture, group, mat) -> Kernel:
    """An elementwise group, or a reduction with its private elementwise producers."""
    sink = cap.nodes[group[-1]]
    red_node = group[-1] if sink.op.category == REDUCE else None
    members = set(group) - {red_node}
    shape = cap.operands[red_node][0].shape if red_node is not None else cap.nodes[group[0]].shape
    in_keys, in_strides, in_dtypes, inputs = {}, [], [], []
    instr_of, instrs, scalar_of, scalars = {}, [], {}, []

    def ref(o):
        if o.kind == "const":
            k = scalar_of.get(o.index)
            if k is None:
                k = scalar_of[o.index] = len(scalars)
                scalars.append(o.index)
            return ("s", k, o.dtype.name)
        if o.kind == "node" and o.index in members and cap.nodes[o.index].shape == shape and _identity_read(o, shape):
            return ("v", instr_of[o.index])
        if o.kind == "in":
            key = ("slot", o.index, o.strides)
            dt = cap.inputs[o.src].dtype
            bind = ("slot", o.index)
        else:
            key = ("node", o.index, o.strides, o.offset)
            dt = cap.nodes[o.index].dtype
            bind = ("node", o.index, o.offset)
        k = in_keys.get(key)
        if k is None:
            k = in_keys[key] = len(inputs)
            inputs.append(bind)
            in_strides.append(o.strides)
            in_dtypes.append(dt)
        return ("i", k)

    def dtype_of(o):
        if o.kind == "const":
            return o.dtype
        if o.kind == "in":
            return cap.inputs[o.src].dtype
        return cap.nodes[o.index].dtype

    for j in group:
        n, ops = cap.nodes[j], cap.operands[j]
        refs = tuple(ref(o) for o in ops)
        instr_of[j] = len(instrs)
        if j == red_node:
            dt = dtype_of(ops[0])
            instrs.append(("copy", None, dt.name, dt.name, refs))
        else:
            instrs.append((n.op.name, cap.args[j], dtype_of(ops[n.op.arity - 1]).name, n.dtype.name, refs))
    scalar_dtypes = tuple(cap.scalars[k][1].name for k in scalars)
    if red_node is not None:
        red = tuple(i in sink.arg for i in range(len(shape)))
        mshape, mred, mstrides = _merge_classed(shape, in_strides, red)
        spec = RedSpec(mred, ew_classes([dt.name for dt in in_dtypes], mstrides), tuple(instrs), sink.op.name, ((len(instrs) - 1, sink.dtype.name),),
                       scalar_dtypes)
        return Kernel(REDUCE, list(group), [red_node], inputs, spec, scalars=scalars, loop_shape=mshape,
                      loop_strides=tuple(mstrides), sizes=runtime_sizes(mshape, mstrides))
    outputs = [j for j in group if j in mat]
    mshape, mstrides = ew_loop(shape, in_strides)
    cls = ew_classes([dt.name for dt in in_dtypes], mstrides)
    spec = EwSpec(len(mshape), cls, tuple(instrs), tuple((instr_of[j], cap.nodes[j].dtype.name) for j in outputs),
                  scalar_dtypes, tile_dim([c for _, c in cls]))
    return Kernel(ELEMENTWISE, list(group), outputs, inputs, spec, scalars=scalars, loop_shape=mshape,
                  loop_strides=tuple(mstrides), sizes=runtime_sizes(mshape, mstrides))
