"""Symbolic plan binding: one compiled Plan serves every capture of its size class.

A capture's size class (ir.graph.size_signature) abstracts each distinct size into a symbol
d0, d1, ...  When a plan is compiled for a class, `derive_binder` schedules the same template
once more over symbolic sizes (each symbol an lc.Size "#k", known >= 2, so every size the
scheduler derives is an expression of the symbols; a decision the scheduler makes on a size
that the symbols leave open gives no binder), and turns what the plan needs at run time
-- the kernels' `sizes`, node-step layouts, node-read offsets and buffer sizes
(Plan.quantities) -- into one generated Python function of the symbols.  Binding a new
capture of the class is then one call of that function plus Plan.bind_values: no replay, no
scheduling, no spec or step construction.

The strides and offsets of a capture's reads are not symbolic in the class key; the symbolic
capture expresses each through its base's contiguous strides (`_express`), and the binder
checks the capture's actual strides and offsets against those formulas before it binds
(`SymbolicBinder.__call__` returns None when they differ: the driver then compiles that
capture's own plan from the template).  Plans with node steps that bake their sizes into a
kernel spec (index, sort, scan, conv pieces) get no binder (Plan.binds_sizes)."""
from __future__ import annotations

from . import named_dims
from .errors import SymbolicSizeError
from .ir.graph import Capture, size_signature
from .ir.schedule import bind_kernels
from .layout import contiguous_strides
from .sizes import Size, decide_ge0


def _source(v, var: dict):
    """Python source of size `v` (an int or a Size over the names in `var`), or None when it
    uses a name `var` lacks."""
    if v.__class__ is not Size:
        return str(int(v))
    if not v.names() <= set(var):
        return None
    return v.source(var)

MAX_SYMBOLS = 32         # more distinct sizes than this: a plan per capture (a 12-layer decode step has ~12)


class _SymbolicNode:
    """A captured node with its shape in symbolic sizes (what the scheduler reads of a node)."""
    __slots__ = ("op", "arg", "shape", "dtype", "label")

    def __init__(self, node, shape):
        self.op, self.arg, self.dtype, self.label, self.shape = node.op, node.arg, node.dtype, node.label, shape


class SymbolicBinder:
    """`binder(plan, dims, layout)`: the plan's Binding for a capture of its size class with
    symbol values `dims`, or None when the capture's read strides / offsets (`layout`) are
    not the ones the binder's formulas give."""

    def __init__(self, fn, source, layout_parts, quantity_parts):
        self.fn, self.source = fn, source
        # the sources of the layout's and the quantities' elements in the symbols d0, d1, ...:
        # what a direct path composes (derive_direct)
        self.layout_parts, self.quantity_parts = layout_parts, quantity_parts

    def __call__(self, plan, dims, layout):
        lay, q = self.fn(*dims)
        if lay != layout:
            return None
        return plan.bind_values(q)


def derive_binder(cap: Capture, plan, dims):
    """The SymbolicBinder of `plan` (compiled for `cap`, whose size-class symbols are `dims`),
    or None when the plan's sizes cannot be bound symbolically."""
    if not plan.binds_sizes or len(dims) > MAX_SYMBOLS or plan.template is None:
        return None
    symbols = [Size.symbol(f"#{k}") for k in range(len(dims))]
    pcap = _symbolic_capture(cap, dict(zip(dims, symbols)))
    tpl = plan.template
    try:
        opt = tpl.replay(pcap)
        kernels = bind_kernels(opt, [list(g) for g in tpl.groups], tpl.materialized)
        if [(k.spec, len(k.inputs), len(k.sizes)) for k in kernels] != \
                [(k.spec, len(k.inputs), len(k.sizes)) for k in plan.kernels]:
            return None         # a size coincidence of `cap` shaped its kernels: no generic formula
        _, _, playout = size_signature(pcap)
        values = (playout, plan.quantities(kernels, opt))
    except Exception:           # (lc.SymbolicSizeError) a decision on a size the symbols leave open: the
        return None             # plan replays its template per capture instead
    names = {f"#{k}": f"d{k}" for k in range(len(dims))}
    parts = []
    for vals in values:
        src = [_source(v, names) for v in vals]
        if any(s is None for s in src):
            return None
        parts.append(src)
    args = ", ".join(f"d{k}" for k in range(len(dims)))
    source = f"def bind({args}):\n    return {_tuple_source(parts[0])}, {_tuple_source(parts[1])}\n"
    scope: dict = {}
    exec(compile(source, "<symbolic plan binding>", "exec"), scope)
    binder = SymbolicBinder(scope["bind"], source, parts[0], parts[1])
    return binder if binder(plan, dims, size_signature(cap)[2]) is not None else None


def _tuple_source(parts) -> str:
    return "(" + "".join(s + ", " for s in parts) + ")"


def _symbolic_capture(cap: Capture, symbol_of: dict) -> Capture:
    """`cap` with every size its symbol (symbol_of: size -> Size; 0 and 1 stay) and every read's
    strides and offset expressed through its base's contiguous strides."""
    symbol_of = {0: 0, 1: 1, **symbol_of}

    def sub(shape):
        return tuple(symbol_of[d] for d in shape)

    nodes = [_SymbolicNode(n, sub(n.shape)) for n in cap.nodes]
    # largest first: a stride is read as the largest size dividing it (64 as head_dim, not as
    # 32 * a sequence length that happens to be 2)
    sizes = sorted(((c, p) for c, p in symbol_of.items() if c > 1), key=lambda cp: -cp[0])
    raw = []
    for ops in cap._raw:
        out = []
        for r in ops:
            if r[0] == "c":
                out.append(r[:3] + (sub(r[3]),) + r[4:])
                continue
            base = cap.inputs[cap.slots[r[1]][0]].shape if r[0] == "i" else cap.nodes[r[1]].shape
            radix = _radix(base, sub(base))
            strides = tuple(_express(s, radix + sizes) for s in r[3])
            if r[0] == "i":
                out.append((r[0], r[1], sub(r[2]), strides))
            else:
                out.append((r[0], r[1], sub(r[2]), strides, _express_offset(r[4], radix, symbol_of)))
        raw.append(tuple(out))
    in_keys = tuple(k[:-2] + (sub(k[-2]), k[-1]) for k in cap.key[0])
    return Capture((in_keys, None, cap.key[2], None), cap.inputs, cap.slots, nodes, None, cap.targets,
                   raw, cap.scalars, cap.args)


def _radix(base, pbase):
    """(size, symbolic size) of the base's contiguous strides above 1, largest first: what a read's
    strides and offset are written in."""
    out = []
    for c, p in zip(contiguous_strides(base), contiguous_strides(pbase)):
        if c > 1 and all(c != x for x, _ in out):
            out.append((c, p))
    return out


def _express(s, cands):
    """Stride s as (a small multiple of) a base stride or a size; other strides stay constants (the
    binder's layout check then only accepts captures with that same stride)."""
    if s in (0, 1, -1):
        return s
    for c, p in cands:
        if s % c == 0 and abs(s // c) <= 64:
            return s // c * p
    return s


def _express_offset(off, radix, symbol_of):
    """Offset off in the mixed radix of the base's strides, each digit a size, a size - 1, or
    a constant."""
    if off <= 1:
        return off
    out = 0
    for c, p in radix:
        q, off = divmod(off, c)
        if q:
            digit = symbol_of.get(q, q) if q > 1 else q
            if digit.__class__ is int and q + 1 in symbol_of:
                digit = symbol_of[q + 1] - 1
            out += digit * p
    return out + off


class ProgramBinder:
    """A named-dim Program's binding without rebuilding its graph: `binder(sizes)` ({name:
    size}) gives (bound plan, slot offsets, output shapes, output offsets) for sizes whose
    capture has the size class this binder was derived for, else None.  Derived once per size
    class from the program's traced graph (sizes are lc.Size expressions of the names): one
    generated function evaluates the class's symbols, the reads' strides and offsets, and
    checks what named_dims.bind checks (every size of the class > 1, so no size is negative,
    and every view inside its base buffer).  Sizes of the class may coincide (a length equal to
    a head dim): the plan was scheduled over distinct symbols (derive_binder), where a decision
    resting on two of them being equal raises, so none does."""

    def __init__(self, fn, plan, binder, source, reads, dims, checks, results, scalars=None):
        self.fn, self.plan, self.binder, self.source = fn, plan, binder, source
        self.scalars = scalars      # sizes -> the scalar operands, when some are sizes (else None)
        # the generated function's parts, for derive_direct: the lines reading the sizes, the
        # sources of the symbols and of the view checks, and of what it returns (dims,
        # layout, slot offsets, output shapes, output offsets)
        self.reads, self.dims, self.checks, self.results = reads, dims, checks, results
        self.direct = {}            # native program -> its DirectRunners (native_direct.py); False: none

    def __call__(self, sizes: dict):
        got = self.fn(sizes)
        if got is None:
            return None
        dims, layout, offsets, out_shapes, out_offsets = got
        binding = self.binder(self.plan, dims, layout)
        return None if binding is None else (binding, offsets, out_shapes, out_offsets)


def _span_check(shape, strides, offset, numel, var):
    """Source of a condition that holds when a view (sizes: lc.Size expressions) reads inside
    its base of `numel` elements at the bound sizes -- what named_dims.bind checks -- written
    out per dim (a literal stride's sign is known; a zero stride or size drops out), or None
    when a size has no formula."""
    src = [_source(v, var) for v in (*shape, *strides, offset, numel)]
    if any(x is None for x in src):
        return None
    r = len(shape)
    sizes, steps, off, total = src[:r], src[r:2 * r], src[2 * r], src[2 * r + 1]
    lit = [_literal(x) for x in src]
    if 0 in lit[:r]:
        return "True"               # an empty view reads nothing
    lo, hi = [off], [off]
    lo_at, hi_at = offset, offset          # the bounds as sizes, while every stride is a literal
    for d, st, st_lit, size, stride in zip(sizes, steps, lit[r:2 * r], shape, strides):
        if st_lit == 0:
            continue
        term = f"({d} - 1) * {st}"
        if st_lit is None:
            lo.append(f"min(0, {term})")
            hi.append(f"max(0, {term})")
            lo_at = hi_at = None
        else:
            (hi if st_lit > 0 else lo).append(term)
            if lo_at is not None:
                if st_lit > 0:
                    hi_at += (size - 1) * stride
                else:
                    lo_at += (size - 1) * stride
    if lo_at is not None and _nonnegative(lo_at) and _nonnegative(numel - 1 - hi_at):
        return "True"               # inside at every size: the bounds' margins are constants
    inside = f"({' + '.join(lo)} >= 0 and {' + '.join(hi)} < {total})"
    if _always(inside):
        return "True"
    return "".join(f"{d} == 0 or " for d, d_lit in zip(sizes, lit) if d_lit is None) + inside


def _nonnegative(v) -> bool:
    """v (a size) is >= 0 at every binding of its names."""
    return decide_ge0(v) is True


def _always(check: str) -> bool:
    """A check without a size in it that holds (constant dims only: nothing to check per run)."""
    try:
        return eval(check, {"__builtins__": {"min": min, "max": max}}) is True
    except NameError:
        return False


def _literal(source: str):
    try:
        return int(source)
    except ValueError:
        return None


def derive_program_binder(traced_cap: Capture, view_nodes, user_nodes, out_offsets, names, cap: Capture,
                          plan, binder, sizes: dict, node_checks=()):
    """The ProgramBinder of a program whose traced capture is `traced_cap` (sizes: lc.Size
    expressions of `names`), given `cap`, its capture at `sizes`, compiled as `plan` with
    `binder` (None: no ProgramBinder).  `node_checks`: the ops' bind-time checks
    (named_dims.require); a binding failing one is left to named_dims.bind, which raises."""
    if binder is None or len(traced_cap.nodes) != len(cap.nodes) or len(traced_cap.slots) != len(cap.slots) \
            or len(traced_cap.scalars) != len(cap.scalars) \
            or [(n.op.name, n.arg) for n in traced_cap.inputs] != [(n.op.name, n.arg) for n in cap.inputs]:
        return None
    if any(_holds_size(a) for a in traced_cap.args):
        return None     # a node's arg holds a size (col2im's image size): its step bakes it at setup
    var = {n: f"v_{n}" for n in names}
    try:
        _, pdims, playout = size_signature(traced_cap)
    except SymbolicSizeError:       # the class key decides on a size the names leave open (an
        return None                 # offset that is 0 at some sizes): bind through named_dims

    def src(values):
        out = [_source(v, var) for v in values]
        return None if any(s is None for s in out) else "(" + "".join(s + ", " for s in out) + ")"

    views = []
    for n in view_nodes:
        lay = n.layout
        check = _span_check(lay.shape, lay.strides, lay.offset, _numel(n.srcs[0].base.shape), var)
        if check is None:
            return None
        if check != "True":
            views.append(check)
    for x, kind, _, _ in node_checks:
        x = _source(x, var)
        if x is None:
            return None
        views.append(f"{x} >= 0" if kind == "ge0" else f"{x} == 0")
    views = list(dict.fromkeys(views))      # views of one layout over one base: checked once
    dims_parts = [_source(v, var) for v in pdims]
    pieces = [src(pdims), src(playout), src(traced_cap.offsets), src(out_offsets)]
    shapes = [src(n.shape) for n in user_nodes]
    if None in pieces or None in shapes:
        return None
    reads = [f"    {var[n]} = sizes[{n!r}]" for n in names]
    lines = ["def bind(sizes):"] + reads + [f"    dims = {pieces[0]}"]
    if pdims:
        lines.append("    if min(dims) < 2:\n        return None")
    for check in views:
        lines.append(f"    if not ({check}):\n        return None")
    results = ("dims", pieces[1], f"list({pieces[2]})", f"({''.join(s + ', ' for s in shapes)})", pieces[3])
    source = "\n".join(lines + [f"    return {', '.join(results)}"]) + "\n"
    scope: dict = {}
    exec(compile(source, "<program binding>", "exec"), scope)
    scalar_fn = _scalar_binder(traced_cap.scalars, reads, var)
    if scalar_fn is False:
        return None
    pb = ProgramBinder(scope["bind"], plan, binder, source, reads, dims_parts, views, results, scalar_fn)
    got = pb.fn(sizes)
    want = size_signature(cap)
    if got is None or got[0] != want[1] or got[1] != want[2] or got[2] != list(cap.offsets):
        return None
    return pb


def _holds_size(arg) -> bool:
    """Whether a node's arg (nested tuples) holds an lc.Size of the named dims."""
    if arg.__class__ is Size:
        return True
    return isinstance(arg, (tuple, list)) and any(_holds_size(a) for a in arg)


def _scalar_binder(scalars, reads, var):
    """A function of the sizes giving the scalar operands ((value, DType) list) with every
    Size among them evaluated as its dtype holds it; None when none is a Size, False when one
    has no formula."""
    if not any(v.__class__ is Size for v, _ in scalars):
        return None
    parts = []
    for k, (v, _) in enumerate(scalars):
        if v.__class__ is Size:
            src = _source(v, var)
            if src is None:
                return False
            parts.append(f"_cv({src}, _sc[{k}][1])")
        else:
            parts.append(f"_sc[{k}][0]")
    source = "def scalars(sizes):\n" + "\n".join(reads) + f"\n    return [{', '.join(parts)}]\n"
    scope = {"_cv": named_dims.const_value, "_sc": list(scalars)}
    exec(compile(source, "<program scalars>", "exec"), scope)
    fn = scope["scalars"]
    return lambda sizes: [(v, dt) for v, (_, dt) in zip(fn(sizes), scalars)]


def derive_direct(pb: ProgramBinder, names, inputs):
    """The direct path of `pb`'s size class (runtime/native_direct.py): its program binding
    and its plan's symbolic binding written as the first lines of one generated function of
    the named-dim values `names`, each quantity a local (or a literal); the native words
    follow from there.  The symbolic binding's layout check is written out unless its formula
    equals the program binding's (_same_layouts).  None when the plan has no direct path."""
    from .runtime import native_direct
    if pb.scalars is not None:
        return None             # scalar operands bound from the sizes: not on the direct path
    sb = pb.binder
    at = {f"sizes[{n!r}]": f"sizes[{i}]" for i, n in enumerate(names)}     # the direct path passes a tuple
    prefix = [_indexed(line, at) for line in pb.reads] + [f"    d{k} = {d}" for k, d in enumerate(pb.dims)]
    for k in range(len(pb.dims)):       # the class: every symbol > 1 (as pb.fn checks)
        prefix.append(f"    if d{k} < 2:\n        return None")
    prefix += [f"    if not ({check}):\n        return None" for check in pb.checks]
    if not _same_layouts(pb, names):
        prefix += [f"    if {_tuple_source(sb.layout_parts)} != {pb.results[1]}:", "        return None"]
    tokens, local = [], {}
    for part in sb.quantity_parts:
        if _literal(part) is not None:
            tokens.append(part)
            continue
        if part not in local:
            local[part] = f"q{len(local)}"
            prefix.append(f"    {local[part]} = {part}")
        tokens.append(local[part])
    return native_direct.derive(pb.plan, prefix, tokens, pb.results[2:], inputs, len(names))


def _indexed(line: str, at: dict) -> str:
    """A read line of a ProgramBinder (`v = sizes['n']`) reading a tuple of the sizes instead."""
    for key, pos in at.items():
        line = line.replace(key, pos)
    return line


def _same_layouts(pb: ProgramBinder, names) -> bool:
    """Whether the symbolic binding's layout formula, composed with the program binding's
    symbols, is the program binding's layout formula: equal at five sets of large random
    sizes (expressions of low degree with small coefficients that agree there are equal)."""
    import random
    rng = random.Random(0)
    points = [{n: rng.randrange(1000, 1 << 20) for n in names} for _ in range(5)]
    for sizes in points:
        got = pb.fn(sizes)
        if got is None or pb.binder.fn(*got[0])[0] != got[1]:
            return False
    return True


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
