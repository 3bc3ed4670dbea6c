"""The compiler driver: capture -> passes -> schedule -> codegen + memory plan -> Plan, and the
plan cache in front of it.

One path for realize, lc.compile, the dump tool and the tests:
  * `optimize(cap)`            the value-preserving passes (simplify, CSE, DCE, recompute into
                               reductions);
  * `schedule_capture(cap)`    passes, then the scheduler: (kernels, materialized, notes);
  * `compile_capture(cap)`     all of it, returning a runtime Plan (kernels compiled through
                               the one kernel cache);
  * `get_plan(cap)`            the cached Plan of a capture's size class (bounded LRU), bound
                               to its sizes (symbolic_plan.py);
  * `realize_nodes(nodes)`     capture, get the plan, run it, attach the buffers; a single
                               node with a trace (ir/trace.py) skips the capture: its trace
                               key finds the bound plan (`eager plans`, filled by the first
                               realize of each key through the capture).

What the passes and the scheduler decide depends on a capture's structure and its size class
only (ir.graph.size_signature), so one Plan serves the class: a capture of the same class but
other sizes is bound by the plan's symbolic binder (symbolic_plan.py: its kernels' sizes,
layouts and buffer sizes from precomputed formulas of the class's sizes).  The plan keeps the
outcome of passes + scheduling as a `Template`, replayed for a capture the binder cannot
express -- the optimised graph rebuilt from the new capture's layouts, only the kernels'
sizes, strides and shape classes derived again -- instead of running the passes and the
scheduler again."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from . import caches, config
from .errors import UnboundPlaceholder
from .ir.graph import Capture, Operand, capture, size_signature
from .ir.node import Node
from .ir.ops import OPS
from .ir.trace import PENDING, patterns, trace_of
from .ir.passes import optimize as _simplify, recompute_into_reductions
from .ir.schedule import bind_kernels, schedule
from .layout import CONTIGUOUS_LAYOUTS
from .symbolic_plan import derive_binder


def optimize(cap: Capture) -> Capture:
    """The passes, in production order."""
    return recompute_into_reductions(_simplify(cap))


def schedule_capture(cap: Capture):
    """Passes then scheduling: (kernels, materialized node set, notes), on the optimised capture."""
    opt = optimize(cap)
    kernels, mat, notes = schedule(opt)
    return kernels, mat, opt.extra.get("notes", []) + notes


@dataclass(frozen=True)
class Template:
    """The size-independent outcome of passes + scheduling for one size class."""
    sources: tuple          # per optimised node: the captured node it is (clones repeat one)
    node_reads: tuple       # per optimised node, per operand: the optimised node it reads, or None
    args: tuple             # per optimised node: its structural arg
    targets: tuple          # optimised node per capture target
    groups: tuple           # kernels: node index lists in execution order
    materialized: frozenset
    notes: tuple

    @classmethod
    def of(cls, cap: Capture, opt: Capture, kernels, mat, notes) -> "Template":
        where = {id(n): i for i, n in enumerate(cap.nodes)}
        return cls(tuple(where[id(n)] for n in opt.nodes),
                   tuple(tuple(o.index if o.kind == "node" else None for o in ops) for ops in opt.operands),
                   tuple(opt.args), tuple(opt.targets), tuple(tuple(g) for k in kernels for g in k.groups()),
                   frozenset(mat), tuple(notes))

    def replay(self, cap: Capture) -> Capture:
        """The optimised capture for `cap` (same size class): each operand keeps the new
        capture's layout and reads the node the template's passes chose."""
        nodes, operands = [], []
        for src, reads in zip(self.sources, self.node_reads):
            nodes.append(cap.nodes[src])
            operands.append([o if r is None else Operand("node", r, o.shape, o.strides, o.offset)
                             for o, r in zip(cap.operands[src], reads)])
        return cap.derive(nodes, operands, list(self.targets), list(self.args))


def compile_capture(cap: Capture, template: Template | None = None):
    """The runtime Plan for `cap`; with a template of its size class, passes and scheduling
    are replayed rather than run."""
    from .runtime.executor import Plan
    if template is None:
        opt = optimize(cap)
        kernels, mat, notes = schedule(opt)
        template = Template.of(cap, opt, kernels, mat, opt.extra.get("notes", []) + notes)
    else:
        opt = template.replay(cap)
        kernels = bind_kernels(opt, [list(g) for g in template.groups], template.materialized)
    return Plan(cap, opt, kernels, set(template.materialized), list(template.notes), template)


class BoundPlan:
    """A Plan with the Binding of one capture's sizes: `run` runs the plan at those sizes;
    every other attribute is the plan's (the dump tool reads kernels, steps, notes)."""

    def __init__(self, plan, binding):
        self.plan, self.binding = plan, binding
        self._fast = None       # (NativePlan, its buffers_runner or None, whether it was asked for one)

    def run(self, in_bufs, offsets, scalars):
        fast = self._fast
        if fast is not None and fast[1] is not None:
            outs = fast[1](in_bufs, offsets, scalars)
            if outs is not None:
                return outs
        outs = self.plan.run(in_bufs, offsets, scalars, self.binding)
        native = self.binding.native
        if native:
            if fast is None or fast[0] is not native:
                self._fast = (native, None, False)      # a binding run natively once (a decode step) pays nothing
            elif not fast[2]:
                self._fast = (native, native.buffers_runner(self.plan.slots), True)
        return outs

    def run_python(self, in_bufs, offsets, scalars, seconds=None):
        return self.plan.run_python(in_bufs, offsets, scalars, seconds, self.binding)

    def native_form(self):
        return self.plan.native_form(self.binding)

    @property
    def native(self):
        """The whole-program form at this binding (None until built, False if unsupported)."""
        return self.binding.native

    def __getattr__(self, name):
        return getattr(self.plan, name)


_plans = caches.register("plans", caches.LRU(config.plan_cache_size()))   # size-class key -> (Plan, binder)
_bound = caches.register("plan bindings", caches.LRU(config.plan_cache_size()))   # capture key -> BoundPlan


def get_plan(cap, targets=None) -> BoundPlan:
    """The compiled plan for a capture, bound to its sizes.  Plans are cached per size class
    (bounded LRU); a capture of a known class is bound by the class plan's SymbolicBinder (its
    sizes evaluated from formulas, nothing compiled or scheduled), or, when the binder cannot
    express it, gets a plan of its own replayed from the class template.  Bound plans are
    cached by capture key.  LAZYCANDLE_DUMP prints the requested stages at every compile."""
    bound = _bound.get(cap.key)
    if bound is not None:
        return bound
    key, dims, layout = size_signature(cap)
    entry = _plans.get(key)
    if entry is not None:
        plan, binder = entry
        if binder is _NOT_DERIVED:      # the class's second capture: derive its formulas now
            binder = derive_binder(cap, plan, dims)
            _plans.put(key, (plan, binder), replace=True)
        binding = binder(plan, dims, layout) if binder is not None else None
        if binding is None:
            plan = compile_capture(cap, plan.template)
            binding = plan.binding
            _dump(plan, targets)
    else:
        plan = compile_capture(cap)
        _plans.put(key, (plan, _NOT_DERIVED))
        binding = plan.binding
        _dump(plan, targets)
    return _bound.put(cap.key, BoundPlan(plan, binding))


_NOT_DERIVED = object()     # a class plan whose binder is derived when a second size meets it


def class_plan(cap):
    """(plan, SymbolicBinder or None) compiled for `cap`'s size class, or None."""
    key, dims, _ = size_signature(cap)
    entry = _plans.get(key)
    if entry is not None and entry[1] is _NOT_DERIVED:
        entry = (entry[0], derive_binder(cap, entry[0], dims))
        _plans.put(key, entry, replace=True)
    return entry


def _dump(plan, targets):
    if config.dump_stages():
        _dump_on_compile(plan, targets)


_dump_count = [0]
_dump_warned = [False]


def _dump_on_compile(plan, targets):
    """LAZYCANDLE_DUMP: print or write the requested stages.  A dump file that cannot be written
    warns once and is skipped: dumping never breaks the computation."""
    import os
    import sys
    import warnings
    from .ir.graph import views_graph
    from .ir.printer import render
    _dump_count[0] += 1
    built = views_graph(targets) if targets else None
    out_dir = config.dump_dir()
    for stage in config.dump_stages():
        try:
            text = render(stage, os.environ.get("LAZYCANDLE_DUMP_FORMAT", "text"), plan, built, targets)
        except ValueError as e:
            text = f"(dump: {e})"
        if not out_dir:
            print(f"==== lazycandle dump: graph {_dump_count[0]}, stage {stage}\n{text}", file=sys.stderr)
            continue
        path = os.path.join(out_dir, f"graph{_dump_count[0]:04d}.{stage}.txt")
        try:
            os.makedirs(out_dir, exist_ok=True)
            with open(path, "w") as f:
                f.write(text + "\n")
        except OSError as e:
            if not _dump_warned[0]:
                _dump_warned[0] = True
                warnings.warn(f"lazycandle: cannot write dump {path} (LAZYCANDLE_DUMP_DIR={out_dir!r}): "
                              f"{type(e).__name__}: {e}; dumps that fail are skipped", RuntimeWarning, stacklevel=2)


def _prepare_targets(nodes):
    """Map each requested node to the computed node whose buffer it will own, and list the
    views that simply alias a (to be) realized base buffer."""
    work, finish, aliases = [], [], []
    for n in dict.fromkeys(nodes):
        if n.realized:
            continue
        cat = n.op.category
        if n.op.name == "placeholder":
            raise UnboundPlaceholder(f"placeholder {n.arg!r} {n.shape} {n.dtype.name} realized outside a program "
                                     f"(use lc.compile([...]).run({n.arg}=...))")
        if cat == "view" and n.layout.is_contiguous() and n.base.op.name not in ("const", "placeholder"):
            aliases.append(n)
            if not n.base.realized:
                work.append(n.base)
                finish.append(None)
            continue
        if cat in ("view", "source"):
            c = Node("copy", (n,), None, n.shape, n.dtype)
            work.append(c)
            finish.append(n)
        else:
            work.append(n)
            finish.append(None)
    return work, finish, aliases


# trace key -> (BoundPlan, picks, big: its realize wakes the pool first)
_eager = caches.register("eager plans", caches.LRU(config.plan_cache_size()))


def trace_key(n):
    """The key a traced node's plan is filed under in `eager plans`: its sig and the patterns
    of its reads and scalars (None when it has no standing trace)."""
    tr = trace_of(n)
    if tr is None or any(m.buffer is not None for m in tr[3]):      # (tr[3]: the watched nodes)
        return None
    return (tr[0],) + patterns(tr)


WAKE_MIN_ELEMENTS = 1 << 17   # elements an eager realize reads from which it wakes parked workers first
_pool_rt = []                 # [runtime.native_pool] once a realize has woken it


def _big(cap) -> bool:
    """Whether a capture reads enough to run its kernels as parallel sections."""
    return sum(prod(i.shape) for i in cap.inputs) >= WAKE_MIN_ELEMENTS


def _wake_pool() -> None:
    """An eager realize about to run a parallel section: parked pool workers wake now, so
    their wake-up (tens of us on a VM) overlaps the Python work before the section.  Only
    above one thread, and not under LAZYCANDLE_EXEC=python (the reference path: one section
    per kernel, no wake-ahead)."""
    if config._num_threads <= 1 or config.exec_flags()[0] == "python":
        return
    if not _pool_rt:
        from .runtime import native_pool
        _pool_rt.append(native_pool)
    _pool_rt[0].wake()


def _realize_traced(n, tr) -> bool:
    """Realize computed node `n` from its trace `tr` (read once by the caller: another
    thread's realize of `n` may drop it meanwhile): the plan filed under its trace key runs on
    the trace's buffers, offsets and scalars picked in the plan's order.  The first realize of
    a key captures, as realize_nodes does, and files the plan with where the capture's inputs,
    slots and scalars sit among the trace's.  False (nothing done) when a node below `n` was
    realized since it was built (the capture then reads that node's buffer instead; the trace
    is dropped) or, as a safeguard, when the capture has an input, slot or scalar the trace
    does not (then no plan is filed and realize_nodes captures)."""
    for m in tr[3]:
        if m.buffer is not None:
            n.trace = None          # it cannot stand again: let go of the nodes it holds
            return False
    reads, scalars = tr[1], tr[2]
    # (patterns(tr) of one read and no scalar, without the call)
    key = (tr[0], (0, 0), ()) if len(reads) == 1 and not scalars else (tr[0],) + patterns(tr)
    entry = _eager.get(key)
    if entry is None:
        cap = capture([n])
        picks = _picks(cap, reads, scalars)
        if picks is None:
            return False
        entry = _eager.put(key, (get_plan(cap, [n]),) + picks + (_big(cap),))   # (the key fixes the shapes)
    plan, in_pick, slot_pick, scalar_pick, big = entry
    if big and config._num_threads > 1:
        _wake_pool()
    bufs, offsets, values = [], [], ()     # (no scalars: the same empty tuple every run, which the
    for i in in_pick:                       # native runner sees as already packed)
        bufs.append(reads[i][0].buffer)
    for i in slot_pick:
        offsets.append(reads[i][1])
    if scalar_pick:
        values = [scalars[i] for i in scalar_pick]
    out, = plan.run(bufs, offsets, values)
    n.set_buffer(out)
    return True


def _picks(cap, reads, scalars) -> tuple:
    """Per capture input, operand slot and scalar slot: the first of the trace's reads or
    scalars that is it (every capture of the same trace key has them at the same places);
    None when one is missing."""
    def first(pred, items):
        return next((i for i, item in enumerate(items) if pred(item)), None)
    inputs = tuple(first(lambda r: r[0] is inp, reads) for inp in cap.inputs)
    slots = tuple(first(lambda r: r[0] is cap.inputs[idx] and r[1] == off and r[2] == (shape, strides), reads)
                  for (idx, off), (_, shape, strides) in zip(cap.slots, cap.key[3]))
    values = tuple(first(lambda s: (s[1].name, repr(s[0])) == (dt.name, repr(v)), scalars)
                   for v, dt in cap.scalars)
    if None in inputs or None in slots or None in values:
        return None
    return inputs, slots, values


_MATMUL = OPS["matmul"]
_dump_env = config._env_reader("LAZYCANDLE_DUMP")[0]
_matmul_rt = []         # [runtime.matmul, runtime.buffers] once a lone matmul has run


def _realize_lone_matmul(n) -> bool:
    """Realize matmul node `n` whose operands read realized buffers by running its
    runtime.matmul plan (the GEMM plan a one-step Plan's MatmulStep would run, from the same
    plan cache) into a fresh buffer: the eager `(a @ b).numpy()` skips the Plan around its
    one step (at 256^2, Python beyond the bare GEMM: median 122 -> 85 us, old and new trees
    alternating, next to a ~250 us GEMM).  False (nothing done) when
    an operand is unrealized, or when profiling or a dump wants the compiled plan."""
    sa, sb = n.srcs
    ba, bb = sa._base or sa, sb._base or sb
    if ba.buffer is None or bb.buffer is None or _dump_env() is not None or config.exec_flags()[1]:
        return False
    if not _matmul_rt:
        from .runtime import buffers, matmul
        _matmul_rt[:] = matmul, buffers
    mm, buffers = _matmul_rt
    la, lb = sa.layout, sb.layout
    plan = mm.plan_for(la, lb, n.dtype, config._matmul_backend, config._num_threads)
    if 2 * prod(n.shape) * la.shape[-1] >= mm.PARALLEL_MIN_FLOPS:
        _wake_pool()            # (BLAS GEMM pieces are native pool tasks too)
    out = buffers.result(prod(n.shape), n.dtype)
    mm.run_plan(plan, ba.buffer, la.offset, bb.buffer, lb.offset, out)
    n.set_buffer(out)
    return True


def realize_nodes(nodes) -> None:
    """Compute and attach buffers to every node in `nodes` (one compiled graph for all)."""
    n = nodes[0] if len(nodes) == 1 else None
    if n is not None and n.buffer is None:
        if n.op is _MATMUL and _realize_lone_matmul(n):
            return
        # (trace_of and Layout.is_contiguous inline: frames cost when a kernel streamed the caches out)
        tr = n.trace
        if tr is PENDING:
            tr = trace_of(n)
        if tr is not None and _realize_traced(n, tr):
            return
        base = n._base
        if base is not None and (n.layout is CONTIGUOUS_LAYOUTS.get(n.shape) or n.layout.is_contiguous()):
            if base.op is _MATMUL:      # (the one op whose trace is left PENDING)
                done = _realize_lone_matmul(base) or ((tr := trace_of(base)) is not None and _realize_traced(base, tr))
            else:
                done = (tr := base.trace) is not None and _realize_traced(base, tr)
            if done:
                lay, buf, size = n.layout, base.buffer, prod(n.shape)   # a contiguous view of a computed
                if lay.offset or size != buf.size:                    # node: it aliases the node's buffer
                    buf = buf[lay.offset: lay.offset + size]
                n.set_buffer(buf)
                return
    if n is not None and n.buffer is None and n.op.category not in ("view", "source"):
        work, finish, aliases = nodes, (None,), ()      # one computed node: it is its own target
    else:
        work, finish, aliases = _prepare_targets(nodes)
    if work:
        cap = capture(work)
        for inp in cap.inputs:
            if inp.buffer is None:
                raise UnboundPlaceholder(f"placeholder {inp.arg!r} {inp.shape} {inp.dtype.name} is not bound: "
                                         f"realize it through lc.compile([...]).run({inp.arg}=...)")
        if _big(cap):
            _wake_pool()
        plan = get_plan(cap, work)
        outs = plan.run([n.buffer for n in cap.inputs], cap.offsets, cap.scalars)
        for n, orig, buf in zip(work, finish, outs):
            n.set_buffer(buf)
            if orig is not None:
                orig.set_buffer(buf)
    for v in aliases:
        base, lay = v.base, v.layout
        v.set_buffer(base.buffer[lay.offset: lay.offset + prod(v.shape)])
