"""The compiler driver: capture -> passes -> schedule -> codegen + memory plan -> Plan.

One path for the executor (realize, lc.compile), the dump tool and the tests:
  * `optimize(cap)`            the value-preserving passes (simplify, CSE, DCE, recompute into
                               reductions);
  * `schedule_capture(cap)`    passes, then the scheduler: (kernels, materialized, notes);
  * `compile_capture(cap)`     all of it, returning a runtime Plan (kernels compiled through
                               the one kernel cache).

What the passes and the scheduler decide depends on a capture's structure and its size class
only (ir.graph.size_class_key), so it is kept as a `Template`: a capture of the same size class
but other sizes replays the template -- the optimised graph is rebuilt from the new capture's
layouts and only the kernels' sizes, strides and shape classes are derived again -- instead of
running the passes and the scheduler again."""
from __future__ import annotations

from dataclasses import dataclass

from .ir.graph import Capture, Operand
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
