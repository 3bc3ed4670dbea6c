"""The compiler driver: capture -> passes -> schedule -> codegen + memory plan -> Plan, and the
plan cache in front of it.

One path for realize, lc.compile, the dump tool and the tests:
  * `optimize(cap)`            the value-preserving passes (simplify, CSE, DCE, recompute into
                               reductions);
  * `schedule_capture(cap)`    passes, then the scheduler: (kernels, materialized, notes);
  * `compile_capture(cap)`     all of it, returning a runtime Plan (kernels compiled through
                               the one kernel cache);
  * `get_plan(cap)`            the cached Plan of a capture's structure (bounded LRU);
  * `realize_nodes(nodes)`     capture, get the plan, run it, attach the buffers.

What the passes and the scheduler decide depends on a capture's structure and its size class
only (ir.graph.size_class_key), so it is kept as a `Template`: a capture of the same size class
but other sizes replays the template -- the optimised graph is rebuilt from the new capture's
layouts and only the kernels' sizes, strides and shape classes are derived again -- instead of
running the passes and the scheduler again."""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

from . import caches, config
from .errors import UnboundPlaceholder
from .ir.graph import Capture, Operand, capture, size_class_key
from .ir.node import Node
from .ir.passes import optimize as _simplify, recompute_into_reductions
from .ir.schedule import bind_kernels, schedule


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
                   tuple(opt.args), tuple(opt.targets), tuple(tuple(k.nodes) for k in kernels),
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


_plans = caches.register("plans", caches.LRU(config.plan_cache_size()))
_templates = caches.register("plan templates", caches.LRU(config.plan_cache_size()))   # size-class key -> Template


def get_plan(cap, targets=None):
    """The compiled plan for a capture's structure, from a bounded LRU cache (compiling on a
    miss; LAZYCANDLE_DUMP prints the requested stages at every compile).  A new size of a known
    structure replays that structure's template, and its kernels come from the kernel cache
    (one per shape class)."""
    plan = _plans.get(cap.key)
    if plan is None:
        size_key = size_class_key(cap)
        plan = compile_capture(cap, _templates.get(size_key))
        _templates.put(size_key, plan.template)
        plan.slots = list(cap.slots)
        plan = _plans.put(cap.key, plan)
        if config.dump_stages():
            _dump_on_compile(plan, targets)
    return plan


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


def realize_nodes(nodes) -> None:
    """Compute and attach buffers to every node in `nodes` (one compiled graph for all)."""
    work, finish, aliases = _prepare_targets(nodes)
    if work:
        cap = capture(work)
        for inp in cap.inputs:
            if not inp.realized:
                raise UnboundPlaceholder(f"placeholder {inp.arg!r} {inp.shape} {inp.dtype.name} is not bound: "
                                         f"realize it through lc.compile([...]).run({inp.arg}=...)")
        plan = get_plan(cap, work)
        outs = plan.run([n.buffer for n in cap.inputs], cap.offsets, cap.scalars)
        for n, orig, buf in zip(work, finish, outs):
            n.set_buffer(buf)
            if orig is not None:
                orig.set_buffer(buf)
    for v in aliases:
        base, lay = v.base, v.layout
        v.set_buffer(base.buffer[lay.offset: lay.offset + prod(v.shape)])
