"""Row kernels: a reduction over the last dim fused with the kernels that consume its result.

After grouping (schedule.group_nodes), a reduce group over the last dim of a full shape F =
(..., n) takes in, transitively, the groups that read the values of the growing cluster:
  * elementwise groups over F that read its per-row values broadcast along the row
    (x - max, e / sum, xc / rstd * gamma + beta),
  * elementwise groups over R = (..., 1): small per-row kernels (the `add, sqrt` of layer_norm,
    the `log` of log_softmax),
  * further reduce groups over the last dim of F (the sum of softmax, the variance of layer_norm).
The merged group is ONE row kernel (codegen/row.py): per row, one pass over the row for each
stage of reductions, then one pass writing the full-row outputs, re-reading the row while it is
in cache and recomputing cheap per-element producers rather than storing them.

A group joins only when every read between it and the cluster is a register read (element for
element over F or R, or an R value broadcast along the row), the merged kernel stays within
MAX_FUSED_NODES ops and MAX_ROW_REDUCTIONS reductions, no pass recomputes more than RECOMPUTE_BUDGET of
per-element producers, and the merge closes no cycle through a kernel outside the cluster.  Each refusal is noted for the schedule dump.
"""
from __future__ import annotations

from ..errors import SchedulerError
from ..layout import contiguous_strides, merge_dims
from .kernels import RowSpec, runtime_sizes, stride_class
from .ops import ELEMENTWISE, REDUCE, reduction
from .passes import RECOMPUTE_BUDGET    # op cost a reduction pass may recompute of another group

REACH_BUDGET = 512      # groups a cycle search may visit before the merge is refused
MAX_ROW_REDUCTIONS = 8  # a pass per reduction: softmax and the norms need 2; longer chains of
                        # passes cost compile time (each pass unrolls its cone) for no run-time gain


def _row_reduce(cap, j):
    """(F, R) when node j is a reduction over exactly the last dim of a row longer than 1."""
    n = cap.nodes[j]
    if n.op.category != REDUCE or reduction(n.op.name).finish == "index":
        return None
    o = cap.operands[j][0]
    f = o.shape
    if not f or cap.args[j] != (len(f) - 1,) or f[-1] in (0, 1):
        return None
    return f, f[:-1] + (1,)


def _level(cap, j, f, r):
    n = cap.nodes[j]
    if n.op.category == REDUCE:
        return "r" if _row_reduce(cap, j) == (f, r) else None
    if n.op.category != ELEMENTWISE:
        return None
    return "e" if n.shape == f else "r" if n.shape == r else None


def _contiguous(o, shape) -> bool:
    return o.shape == shape and o.offset == 0 and \
        all(d == 1 or s == c for d, s, c in zip(shape, o.strides, contiguous_strides(shape)))


def register_read(cap, o, f, r, levels) -> bool:
    """Whether operand o (of a node in a row group whose nodes have `levels`) reads a value of
    the group from a register: element for element at its level, or an R value broadcast."""
    if levels[o.index] == "e":
        return _contiguous(o, f)
    cr = contiguous_strides(r)
    return _contiguous(o, r) or (o.shape == f and o.offset == 0 and o.strides[-1] == 0 and
                                 all(d == 1 or s == c for d, s, c in zip(f[:-1], o.strides, cr)))


class _Cluster:
    def __init__(self, cap, gid, members, f, r):
        self.cap, self.f, self.r = cap, f, r
        self.gids = {gid}
        self.levels = {j: _level(cap, j, f, r) for j in members}


def fuse_rows(cap, groups, order, group_of, notes) -> set:
    """Merge row clusters in `groups` (group id -> sorted members; `order`: ids in execution
    order; `group_of`: node -> group id, updated).  Returns the ids of the row groups."""
    nodes, operands = cap.nodes, cap.operands
    pos = {g: i for i, g in enumerate(order)}
    succs = {g: set() for g in groups}
    for j, ops in enumerate(operands):
        for o in ops:
            if o.kind == "node" and group_of[o.index] != group_of[j]:
                succs[group_of[o.index]].add(group_of[j])
    taken, row_groups = set(), set()
    for g in order:
        if g in taken or _row_reduce(cap, groups[g][-1]) is None:
            continue
        f, r = _row_reduce(cap, groups[g][-1])
        cl = _Cluster(cap, g, groups[g], f, r)
        refused = {}
        grown = True
        while grown:
            grown = False
            for h in sorted({s for c in cl.gids for s in succs[c]} - cl.gids - taken, key=pos.get):
                why = _refusal(cl, h, groups, group_of, succs, pos)
                if why is None:
                    cl.gids.add(h)
                    cl.levels.update((j, _level(cap, j, f, r)) for j in groups[h])
                    refused.pop(h, None)
                    grown = True
                else:
                    refused[h] = why
        for h, why in refused.items():
            if why:
                notes.append(f"n{groups[h][-1]} ({nodes[groups[h][-1]].op.name}) not fused into the row kernel of "
                             f"n{groups[g][-1]} ({nodes[groups[g][-1]].op.name}): {why}")
        if len(cl.gids) < 2:
            continue
        taken |= cl.gids
        merged = sorted(j for h in cl.gids for j in groups[h])
        for h in cl.gids - {g}:
            del groups[h]
            succs[g] |= succs.pop(h)
        succs[g] -= cl.gids
        for h in succs.values():
            if h & cl.gids:
                h -= cl.gids
                h.add(g)
        for j in merged:
            group_of[j] = g
        groups[g] = merged
        row_groups.add(g)
        pos = _positions(succs)
    return row_groups


def _positions(succs) -> dict:
    """A topological position of every group of the (merged) group graph."""
    indeg = dict.fromkeys(succs, 0)
    for ss in succs.values():
        for s in ss:
            indeg[s] += 1
    ready = [g for g, d in indeg.items() if d == 0]
    pos = {}
    while ready:
        g = ready.pop()
        pos[g] = len(pos)
        for s in succs[g]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if len(pos) != len(succs):
        raise SchedulerError("row fusion closed a cycle among kernels")
    return pos


def _refusal(cl, h, groups, group_of, succs, pos):
    """Why group h cannot join cluster `cl` ("" for a kind that never joins), or None."""
    cap, f, r = cl.cap, cl.f, cl.r
    members = groups[h]
    lv = {j: _level(cap, j, f, r) for j in members}
    if any(v is None for v in lv.values()):
        return "" if any(cap.nodes[j].op.category not in (ELEMENTWISE, REDUCE) for j in members) else \
            f"its shape {cap.nodes[members[-1]].shape} is neither the row shape {f} nor {r}"
    from .schedule import MAX_FUSED_NODES
    if len(members) + len(cl.levels) > MAX_FUSED_NODES:
        return f"the kernel would exceed {MAX_FUSED_NODES} ops"
    levels = {**cl.levels, **lv}
    reductions = sum(cap.nodes[j].op.category == REDUCE for j in levels)
    if reductions > MAX_ROW_REDUCTIONS:
        return f"the kernel would make more than {MAX_ROW_REDUCTIONS} reductions of a row"
    mine = set(members)
    for j in levels:
        inside = j in mine
        for o in cap.operands[j]:
            if o.kind != "node" or o.index not in levels or (o.index in mine) == inside:
                continue
            if not register_read(cap, o, f, r, levels):
                return f"n{j} reads n{o.index} through a view {o.shape} strides {o.strides}"
            if cap.nodes[j].op.category == REDUCE and levels[o.index] == "e":
                cost = _pass_cost(cap, o.index, levels)
                if cost > RECOMPUTE_BUDGET:
                    return f"n{j} would recompute n{o.index}'s producers (cost {cost}) in an earlier pass"
    if _closes_cycle(cl.gids | {h}, succs, pos):
        return "a kernel outside it reads the cluster and feeds it"
    return None


def _pass_cost(cap, j, levels) -> int:
    """Op cost of the per-element values a reduction pass over node j's value recomputes: j's
    row-long producers in the cluster, each once (a chain of row reductions, each reading the
    one before, would otherwise recompute ever longer cones, quadratic code in the chain's
    length).  Stops counting past RECOMPUTE_BUDGET, so a check costs O(budget)."""
    seen, stack, cost = set(), [j], 0
    while stack and cost <= RECOMPUTE_BUDGET:
        x = stack.pop()
        if x in seen or levels.get(x) != "e":
            continue
        seen.add(x)
        cost += cap.nodes[x].op.cost
        stack += [o.index for o in cap.operands[x] if o.kind == "node"]
    return cost


def _closes_cycle(cluster, succs, pos) -> bool:
    """Whether a path leaves `cluster` and re-enters it (True also when over budget)."""
    top = max(pos[g] for g in cluster)
    stack = [s for g in cluster for s in succs[g] if s not in cluster and pos[s] < top]
    seen, work = set(stack), 0
    while stack:
        g = stack.pop()
        work += 1
        if work > REACH_BUDGET:
            return True
        for s in succs[g]:
            if s in cluster:
                return True
            if s not in seen and pos[s] < top:
                seen.add(s)
                stack.append(s)
    return False


def is_row_group(cap, group) -> bool:
    """A merged row group: more than one reduction, or a reduction that is not the last node."""
    reds = [j for j in group if cap.nodes[j].op.category == REDUCE]
    return len(reds) > 1 or (bool(reds) and reds[-1] != group[-1])


def row_kernel(cap, group, mat):
    """The Kernel of row group `group` over this capture's layouts."""
    from .schedule import Kernel
    red = next(j for j in group if cap.nodes[j].op.category == REDUCE)
    f, r = _row_reduce(cap, red)
    levels = {j: _level(cap, j, f, r) for j in group}
    in_keys, inputs, in_strides, in_dtypes = {}, [], [], []
    instr_of, instrs, scalar_of, scalars = {}, [], {}, []

    def ref(j, o):
        if o.kind == "const":
            k = scalar_of.setdefault(o.index, len(scalars))
            if k == len(scalars):
                scalars.append(o.index)
            return ("s", k, o.dtype.name)
        if o.kind == "node" and o.index in levels:
            if not register_read(cap, o, f, r, levels):
                raise SchedulerError(f"row kernel: n{j} reads n{o.index} of its own kernel through a view "
                                     f"{o.shape} strides {o.strides}")
            return ("v", instr_of[o.index])
        strides = o.strides if o.shape == f else o.strides[:-1] + (0,)
        if o.kind == "in":
            key, dt, bind = ("slot", o.index, strides), cap.inputs[o.src].dtype, ("slot", o.index)
        else:
            key, dt, bind = ("node", o.index, strides, o.offset), cap.nodes[o.index].dtype, ("node", o.index, o.offset)
        k = in_keys.get(key)
        if k is None:
            k = in_keys[key] = len(inputs)
            inputs.append(bind)
            in_strides.append(strides)
            in_dtypes.append(dt)
        return ("i", k)

    def dtype_of(o):
        if o.kind == "const":
            return o.dtype
        return cap.inputs[o.src].dtype if o.kind == "in" else cap.nodes[o.index].dtype

    for j in group:
        n, ops = cap.nodes[j], cap.operands[j]
        refs = tuple(ref(j, o) for o in ops)
        instr_of[j] = len(instrs)
        instrs.append((n.op.name, cap.args[j] if n.op.category != REDUCE else None,
                       dtype_of(ops[n.op.arity - 1]).name, n.dtype.name, refs))
    outputs = [j for j in group if j in mat]
    outer, n_row = f[:-1], f[-1]
    mshape, mstrides = merge_dims(outer, [s[:-1] for s in in_strides] + [contiguous_strides(outer)])
    mstrides = [ms + (s[-1],) for ms, s in zip(mstrides[:-1], in_strides)]
    mshape = mshape + (n_row,)
    classes = tuple((dt.name, tuple(stride_class(x) for x in st)) for dt, st in zip(in_dtypes, mstrides))
    spec = RowSpec(len(mshape), classes, tuple(instrs), tuple(levels[j] for j in group),
                   tuple((instr_of[j], cap.nodes[j].dtype.name) for j in outputs),
                   tuple(cap.scalars[k][1].name for k in scalars))
    return Kernel("row", list(group), outputs, inputs, spec, scalars=scalars, loop_shape=mshape,
                  loop_strides=tuple(mstrides), sizes=runtime_sizes(mshape, mstrides))
