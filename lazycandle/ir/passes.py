"""Graph passes on a capture, run before scheduling (views are already folded into strides by
construction):
  * algebraic simplification that never changes a value: x*1, x/1, x-0, x+(-0) (floats) or
    x+0 (ints), neg(neg(x)), cast to the same dtype, copy of a computed node;
  * common-subexpression elimination (identical op, arg, dtype, shape and operands);
  * dead-code elimination (what no target needs).
Each pass keeps the capture's inputs, operand slots and scalar slots, so runtime bindings stay
valid, and records in `extra["origin"]` which node of the original capture each node stands for;
notes name nodes by their index in the original capture (the dump prints them as user-graph ids).

Scalars are runtime arguments, so a rewrite may only test a scalar's value through the value
class the capture keys plans on (ops.OpKind.keyed_scalars, ops.scalar_class).  The rewrites
that do, and so the only scalar values with a plan of their own:
  * x*1, 1*x, x/1       (mul, div: the value 1)
  * x+0, x-0 (ints), x+(-0.0), x-0.0 (floats)   (add: 0 and -0.0; sub: 0)
  * powf: the exponents 0, 1, 2, -1 and 0.5 get their own code, and other exponents build one
    kernel per class (finite?, integer?, odd integer?) -- ops.powf_exponent_class.
Any other scalar value (a*3.0 vs a*4.0) shares one plan and one kernel."""
from __future__ import annotations

from dataclasses import replace

from .graph import Capture, Operand
from ..layout import contiguous_strides


def _const_is(o: Operand, value) -> bool:
    """The scalar operand is `value` (only asked for values in the op's keyed_scalars)."""
    return o.kind == "const" and o.value == value and (
        value != 0 or str(o.value) == str(value) or not o.dtype.is_float)


def _is_identity_read(o: Operand, shape) -> bool:
    return o.kind != "const" and o.shape == shape and o.offset == 0 and all(
        d == 1 or s == c for d, s, c in zip(shape, o.strides, contiguous_strides(shape)))


def _forward(n, ops, nodes, operands) -> int | None:
    """If node n equals one of its operands element for element, that operand's node index
    (only computed nodes read contiguously are forwarded, so any later view of n stays valid)."""
    name = n.op.name
    cand = None
    if name in ("mul", "div") and _const_is(ops[1], 1):
        cand = ops[0]
    elif name == "mul" and _const_is(ops[0], 1):
        cand = ops[1]
    elif name in ("add", "sub") and ops[1].kind == "const" and ops[1].value == 0:
        if n.dtype.is_int or str(ops[1].value) == ("-0.0" if name == "add" else "0.0"):
            cand = ops[0]
    elif name == "neg" and ops[0].kind == "node" and _is_identity_read(ops[0], n.shape):
        inner = ops[0].index
        if nodes[inner].op.name == "neg" and nodes[inner].shape == n.shape:
            cand = operands[inner][0]
    if cand is not None and cand.kind == "node" and _is_identity_read(cand, n.shape) \
            and nodes[cand.index].dtype is n.dtype and nodes[cand.index].shape == n.shape:
        return cand.index
    return None


def optimize(cap: Capture) -> Capture:
    """Simplify, CSE and DCE; returns a new Capture (same inputs, slots and targets)."""
    nodes, operands, args, remap, seen, notes, origin = [], [], [], {}, {}, [], []
    for j, (n, ops) in enumerate(zip(cap.nodes, cap.operands)):
        new_ops = [replace(o, index=remap[o.index]) if o.kind == "node" else o for o in ops]
        fwd = _forward(n, new_ops, nodes, operands)
        if fwd is not None:
            remap[j] = fwd
            notes.append(f"n{j} ({n.op.name}) simplified to its operand n{origin[fwd]}")
            continue
        key = (n.op.name, cap.args[j], n.shape, n.dtype.name, tuple(o.key() for o in new_ops))
        if key in seen:
            remap[j] = seen[key]
            notes.append(f"n{j} ({n.op.name}) is a common subexpression: the same as n{origin[seen[key]]}")
            continue
        remap[j] = seen[key] = len(nodes)
        nodes.append(n)
        operands.append(new_ops)
        args.append(cap.args[j])
        origin.append(j)
    out = cap.derive(nodes, operands, [remap[t] for t in cap.targets], args)
    out.extra.update(notes=notes, origin=origin)
    return dce(out)


def dce(cap: Capture) -> Capture:
    """Drop nodes no target needs."""
    nodes, operands, targets = cap.nodes, cap.operands, cap.targets
    live = set(targets)
    for j in range(len(nodes) - 1, -1, -1):
        if j in live:
            live |= {o.index for o in operands[j] if o.kind == "node"}
    if len(live) == len(nodes):
        return cap
    order = [j for j in range(len(nodes)) if j in live]
    new_index = {j: i for i, j in enumerate(order)}
    out = cap.derive([nodes[j] for j in order],
                     [[replace(o, index=new_index[o.index]) if o.kind == "node" else o for o in operands[j]]
                      for j in order],
                     [new_index[t] for t in targets], [cap.args[j] for j in order])
    out.extra = dict(cap.extra)
    out.extra["origin"] = [_origin(cap)[j] for j in order]
    return out


def _origin(cap: Capture) -> list:
    """For each node of `cap`, the index of the node of the original capture it stands for."""
    return cap.extra.get("origin") or list(range(len(cap.nodes)))


RECOMPUTE_BUDGET = 48   # op cost units a reduction may recompute instead of reading a buffer
RECOMPUTE_READS = 3     # ... and full-size values it may read to do so (a residual stream,
                        # x + a0 + a1 + ..., is cheap in ops but reads one buffer per term: a
                        # 6-layer BERT's last layer_norm re-read 12 of them instead of 1)


def _full_reads(sub, nodes, operands) -> int:
    """Distinct values of their own shape that the nodes `sub` read from outside it (computed
    nodes and inputs; constants and broadcast reads are cheap)."""
    reads = set()
    for p in sub:
        for q in operands[p]:
            if q.kind == "const" or (q.kind == "node" and q.index in sub) or q.shape != nodes[p].shape:
                continue
            if all(s != 0 or d == 1 for d, s in zip(q.shape, q.strides)):
                reads.add(("in", q.src) if q.kind == "in" else ("node", q.index, q.strides, q.offset))
    return len(reads)


def _buffered_anyway(r, p, nodes, consumers) -> bool:
    """Whether node p, summed by reduction r over other dims than the last alone (a column sum:
    its kernel writes no full-size outputs), is written to a buffer whatever r does: it is read
    by a kernel taking its operands from memory (a matmul, an index op).  r then reads it once;
    recomputing it would read its inputs instead, at least as many bytes (the bias gradient of
    gelu(x @ w + b) @ w2 re-derived gelu' from the product: 3x the reads)."""
    from .ops import ELEMENTWISE, REDUCE
    if tuple(nodes[r].shape[:-1]) == tuple(nodes[p].shape[:-1]):
        return False                # a row reduction: a row kernel can write p as it goes
    return any(nodes[c].op.category not in (ELEMENTWISE, REDUCE) for c in consumers[p])


def recompute_into_reductions(cap: Capture) -> Capture:
    """A reduction whose elementwise producers are also used elsewhere would force them into a
    buffer (written once, read twice).  When they are cheap, give the reduction its own copy of
    them instead, so it fuses them and the intermediate never touches memory (softmax:
    exp(x - max) is recomputed by the sum and by the division; layer_norm: (x - mean)^2)."""
    from .ops import ELEMENTWISE, REDUCE
    nodes, operands = cap.nodes, cap.operands
    consumers = [set() for _ in nodes]
    for j, ops in enumerate(operands):
        for o in ops:
            if o.kind == "node":
                consumers[o.index].add(j)
    clones = {}          # reduce node index -> list of producer indices to clone (topological)
    for r, n in enumerate(nodes):
        if n.op.category != REDUCE:
            continue
        o = operands[r][0]
        if o.kind != "node" or nodes[o.index].op.category != ELEMENTWISE or nodes[o.index].shape != o.shape \
                or not _is_identity_read(o, o.shape) or _buffered_anyway(r, o.index, nodes, consumers):
            continue
        sub, stack, cost = set(), [o.index], 0
        while stack and cost <= RECOMPUTE_BUDGET:     # stop early: only a cheap cone is cloned
            p = stack.pop()
            if p in sub:
                continue
            sub.add(p)
            cost += nodes[p].op.cost
            for q in operands[p]:
                if q.kind == "node" and nodes[q.index].op.category == ELEMENTWISE and \
                        nodes[q.index].shape == nodes[p].shape and _is_identity_read(q, q.shape):
                    stack.append(q.index)
        if cost > RECOMPUTE_BUDGET or _full_reads(sub, nodes, operands) > RECOMPUTE_READS:
            continue
        private = not (sub & set(cap.targets)) and all(consumers[y] <= sub | {r} for y in sub)
        if private:
            continue
        clones[r] = sorted(sub)
    if not clones:
        return cap
    new_nodes, new_ops, new_args, where, origin, was = [], [], [], {}, [], _origin(cap)
    for j, (n, ops) in enumerate(zip(nodes, operands)):
        local = where
        if j in clones:
            local = dict(where)
            for p in clones[j]:
                local[p] = len(new_nodes)
                origin.append(was[p])
                new_nodes.append(nodes[p])
                new_ops.append([replace(q, index=local[q.index]) if q.kind == "node" else q for q in operands[p]])
                new_args.append(cap.args[p])
        where[j] = len(new_nodes)
        origin.append(was[j])
        new_nodes.append(n)
        new_ops.append([replace(q, index=local[q.index]) if q.kind == "node" else q for q in ops])
        new_args.append(cap.args[j])
    out = cap.derive(new_nodes, new_ops, [where[t] for t in cap.targets], new_args)
    out.extra["origin"] = origin
    out.extra["notes"] = cap.extra.get("notes", []) + [
        f"reduction n{was[r]} recomputes its producers ({', '.join(f'n{was[p]} {nodes[p].op.name}' for p in ps)})"
        for r, ps in clones.items()]
    return dce(out)
