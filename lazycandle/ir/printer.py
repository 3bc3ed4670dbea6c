"""Printers for the IR dump tool: the graph as built, the optimised graph, the schedule (which
ops each kernel fused, its buffers, its loop nest), each kernel's LLVM IR and native assembly;
text, Graphviz dot or Mermaid."""
from __future__ import annotations

import copy
import re


STAGES = ("graph", "optimized", "schedule", "llvm", "asm")
FORMATS = ("text", "dot", "mermaid")


class Names:
    """How a dump names values, the same in every stage.  Given the targets being dumped, nodes
    are named by the user-graph ids of the `graph` stage (`%17`): the optimized and schedule
    stages name each node by the node it came from (a copy a pass made for a reduction gets a
    prime: `%17'`), and fusion notes are rewritten to those names.  Without targets (or when the
    graph changed since the plan was built) they are the plan's indices: `in0`, `n3`."""

    def __init__(self, plan, targets=None):
        desc = plan.opt_desc
        self.inputs = [f"in{i}" for i in range(len(desc["inputs"]))]
        self.nodes = [f"n{j}" for j in range(len(desc["nodes"]))]
        self.built = [f"n{j}" for j in range(len(plan.graph_desc["nodes"]))]
        self._pass_notes = None          # how many leading notes (the graph passes') name built nodes
        if targets:
            from .graph import capture
            from .passes import optimize, recompute_into_reductions
            cap = capture(targets)
            opt = recompute_into_reductions(optimize(cap))
            if len(cap.inputs) == len(self.inputs) and len(opt.nodes) == len(self.nodes) \
                    and len(cap.nodes) == len(self.built):
                self.inputs = [f"%{n.id}" for n in cap.inputs]
                self.built = [f"%{n.id}" for n in cap.nodes]
                copies: dict = {}
                self.nodes = []
                for n in opt.nodes:
                    k = copies[n.id] = copies.get(n.id, -1) + 1
                    self.nodes.append(f"%{n.id}" + "'" * k)
                self._pass_notes = len(opt.extra.get("notes", []))

    def of_built_graph(self) -> "Names":
        """The same naming for the plan's graph before the passes (`plan.graph_desc`)."""
        view = copy.copy(self)
        view.nodes = self.built
        return view

    def note(self, i: int, text: str) -> str:
        """Note i of a plan with its node references (`n5`) in this naming."""
        if self._pass_notes is None:
            return text
        table = self.built if i < self._pass_notes else self.nodes
        return re.sub(r"\bn(\d+)\b", lambda m: table[int(m.group(1))] if int(m.group(1)) < len(table)
                      else m.group(0), text)


def _key(name: str) -> str:
    """A dot / mermaid node key for a dump name (`%17'` -> `v17_1`)."""
    return name.replace("%", "v").replace("'", "_")


def _arg(a):
    if a is None:
        return ""
    if hasattr(a, "size_in_bytes"):
        return a.name
    return repr(a)


def _input_name(desc, names, i):
    name = desc["inputs"][i][1]
    return names.inputs[i] + (f"({name})" if name else "")


def _operand(o, desc, names):
    if o.kind == "const":
        return f"const {o.value!r}:{o.dtype.name}"
    lay = f"{o.shape} strides {o.strides}"
    if o.kind == "in":
        return f"{_input_name(desc, names, o.src)} view {lay} offset@slot{o.index}"
    extra = f" +{o.offset}" if o.offset else ""
    return f"{names.nodes[o.index]} view {lay}{extra}"


def graph_text(g) -> str:
    """`graph` stage: nodes as the user built them, views included (networkx DiGraph)."""
    lines = []
    import networkx as nx
    for n in nx.topological_sort(g):
        a = g.nodes[n]
        srcs = ", ".join(f"%{p}" for p in g.predecessors(n))
        what = a["label"] if a.get("view") and a.get("label") else a["op"]
        state = " (realized)" if a.get("realized") else ""
        arg = f" {_arg(a['arg'])}" if a["arg"] is not None and not a.get("view") else ""
        lines.append(f"%{n} = {what}{arg}({srcs}) : {a['shape']} {a['dtype'].name}{state}")
    return "\n".join(lines)


def optimized_text(desc, names) -> str:
    lines = []
    for i, (kind, name, shape, dt) in enumerate(desc["inputs"]):
        lines.append(f"{names.inputs[i]} = {kind}{'(' + repr(name) + ')' if name else ''} : {shape} {dt.name}")
    for j, (op, arg, shape, dt, ops) in enumerate(desc["nodes"]):
        a = f"[{_arg(arg)}]" if arg is not None else ""
        tgt = "   <- output" if j in desc["targets"] else ""
        lines.append(f"{names.nodes[j]} = {op}{a}({'; '.join(_operand(o, desc, names) for o in ops)}) : "
                     f"{shape} {dt.name}{tgt}")
    return "\n".join(lines)


def kernel_text(i, k, desc, names, step=None, extent=None) -> list:
    """Lines for kernel k (the scheduler's) as its plan step runs it (`step`: backend, reads,
    detail of kernels of their own; `extent`: its parallel extent at the plan's sizes); nodes
    are named by `names` (user-graph ids)."""
    spec = k.spec if k.spec is not None else getattr(step, "reads", None)
    backend = getattr(step, "backend", None)
    fused = ", ".join(f"{names.nodes[j]} {desc['nodes'][j][0]}" for j in k.nodes)
    lines = [f"kernel {i}: {k.kind}" + (f" [{backend}]" if backend else "") + f"  fuses {fused}"]
    node_ops = desc["nodes"][k.nodes[0]][4] if spec is None else None
    if node_ops is not None and getattr(k, "epilogue", None) is not None:
        node_ops = list(node_ops) + list(k.epilogue.operands)      # a matmul's epilogue reads
    for pos, bind in enumerate(k.inputs):
        if spec is not None:
            cls = getattr(spec, "ew", spec).inputs      # (a horizontal kernel: per segment)
            strides, dt = k.loop_strides[pos] if k.loop_strides else cls[pos][1], cls[pos % len(cls)][0]
        else:
            o = node_ops[pos]
            strides = f"{o.strides} shape {o.shape}"
            dt = (desc["inputs"][o.src][3] if o.kind == "in" else desc["nodes"][o.index][3]).name
        if bind[0] == "slot":
            src = _input_name(desc, names, desc["slots"][bind[1]][0])
        else:
            src = names.nodes[bind[1]] + (f" +{bind[2]}" if bind[2] else "")
        lines.append(f"    reads  {src}: {dt} strides {strides}")
    for j in k.outputs:
        lines.append(f"    writes {names.nodes[j]}: {desc['nodes'][j][2]} {desc['nodes'][j][3].name}")
    if k.parts:
        lines.append(f"    horizontal: {len(k.parts)} segments of one kernel ({spec.ew.describe()}), lengths "
                     f"{list(k.sizes[1:])}; parallel over {extent} elements of them all")
    if spec is not None and k.loop_shape and step is not None:
        shape, W = k.loop_shape, step.lanes
        if k.kind == "elementwise":
            t = spec.tile
            nest = f"loop {shape}, vector width {W} + scalar tail"
            if t is not None:
                nest += f", tiled {W}x{W} over dims ({t}, {len(shape) - 1}) with register transpose"
            lines.append(f"    {nest}; parallel over {extent} units")
        elif k.kind == "reduce":
            lines.append(f"    loop {shape} reducing dims {[d for d, r in enumerate(spec.red) if r]} "
                         f"({'inner-reduce' if spec.inner_reduce else 'inner-output'}), {spec.kind}, vector width "
                         f"{W}; parallel over {extent} units")
        elif k.kind == "row":
            lines.append(f"    {row_nest(spec, shape)}, vector width {W}; parallel over {extent} rows")
        lines.append(f"    compiled for shape class: rank {spec.rank}, strides "
                     f"{[c for _, c in spec.inputs]} (sizes {k.sizes} at run time)")
    if getattr(step, "detail", None):
        lines.append(f"    {step.detail}")
    return lines


def row_nest(spec, shape) -> str:
    """What a row kernel does per row: its passes over the row and what each computes."""
    passes = [" + ".join(spec.instrs[j][0] for j in reds) for reds in spec.stages() if reds]
    per_row = [spec.instrs[j][0] for j, lv in enumerate(spec.levels) if lv == "r" and not spec.is_reduction(j)]
    full = any(spec.levels[j] == "e" for j, _ in spec.outputs)
    steps = [f"pass {i + 1}: {p}" for i, p in enumerate(passes)] + (["write the row"] if full else [])
    extra = f"; per-row ops {', '.join(per_row)}" if per_row else ""
    return f"row kernel over {shape} (rows of {shape[-1]}): {'; '.join(steps)}{extra}"


def schedule_text(plan, names) -> str:
    lines = []
    for i, k in enumerate(plan.kernels):
        lines += kernel_text(i, k, plan.opt_desc, names, plan.steps[i], plan.binding.steps[i][1] if k.spec else None)
    for i, n in enumerate(plan.notes):
        lines.append(f"note: {names.note(i, n)}")
    native = _native_form(plan)
    if native:
        lines += native.schedule_lines()
    return "\n".join(lines)


def _native_form(plan):
    """The plan's whole-program form (segments, phases, its module), or None when it runs
    kernel by kernel (LAZYCANDLE_EXEC=python, or a plan that cannot run natively)."""
    import os
    if os.environ.get("LAZYCANDLE_EXEC", "") == "python" or not hasattr(plan, "native_form"):
        return None
    return plan.native_form() or None


def llvm_text(plan, stage) -> str:
    out = []
    for i, (k, step) in enumerate(zip(plan.kernels, plan.steps)):
        cm = getattr(step, "module", None)
        if cm is None:
            out.append(f"; kernel {i}: {k.kind} (no generated code: {getattr(step, 'backend', None) or 'nothing to run'})")
            continue
        out.append(f"; ==== kernel {i}: {k.kind}")
        out.append(cm.ir_text if stage == "llvm" else cm.asm())
    native = _native_form(plan)
    if native and native.module is not None:
        out.append("; ==== whole-program module: one entry per native segment, calling the kernels above")
        out.append(native.module.ir_text if stage == "llvm" else native.module.asm())
    return "\n".join(out)


def _graph_edges_opt(desc, names):
    nodes = [(_key(names.inputs[i]), f"{names.inputs[i]} {kind} {shape} {dt.name}")
             for i, (kind, name, shape, dt) in enumerate(desc["inputs"])]
    nodes += [(_key(names.nodes[j]), f"{names.nodes[j]} {op} {shape} {dt.name}")
              for j, (op, arg, shape, dt, ops) in enumerate(desc["nodes"])]
    edges = []
    for j, (_, _, _, _, ops) in enumerate(desc["nodes"]):
        for o in ops:
            if o.kind == "in":
                edges.append((_key(names.inputs[o.src]), _key(names.nodes[j])))
            elif o.kind == "node":
                edges.append((_key(names.nodes[o.index]), _key(names.nodes[j])))
    return nodes, edges, {}


def _graph_edges_built(g):
    nodes = [(_key(f"%{n}"), f"%{n} {a['label'] if a.get('view') and a.get('label') else a['op']} {a['shape']} "
                             f"{a['dtype'].name}") for n, a in g.nodes(data=True)]
    return nodes, [(_key(f"%{u}"), _key(f"%{v}")) for u, v in g.edges()], {}


def _schedule_edges(plan, names):
    nodes, edges, clusters = _graph_edges_opt(plan.opt_desc, names)
    for i, k in enumerate(plan.kernels):
        clusters[f"kernel {i}: {k.kind}"] = [_key(names.nodes[j]) for j in k.nodes]
    return nodes, edges, clusters


def to_dot(nodes, edges, clusters) -> str:
    lines = ["digraph lazycandle {", "  node [shape=box, fontname=monospace];"]
    in_cluster = {n for ms in clusters.values() for n in ms}
    for i, (name, members) in enumerate(clusters.items()):
        lines.append(f'  subgraph cluster_{i} {{ label="{name}"; style=rounded;')
        for n, label in nodes:
            if n in members:
                lines.append(f'    {n} [label="{label}"];')
        lines.append("  }")
    for n, label in nodes:
        if n not in in_cluster:
            lines.append(f'  {n} [label="{label}"];')
    lines += [f"  {u} -> {v};" for u, v in edges]
    lines.append("}")
    return "\n".join(lines)


def to_mermaid(nodes, edges, clusters) -> str:
    lines = ["flowchart TD"]
    in_cluster = {n for ms in clusters.values() for n in ms}
    for i, (name, members) in enumerate(clusters.items()):
        lines.append(f'  subgraph k{i}["{name}"]')
        for n, label in nodes:
            if n in members:
                lines.append(f'    {n}["{label}"]')
        lines.append("  end")
    for n, label in nodes:
        if n not in in_cluster:
            lines.append(f'  {n}["{label}"]')
    lines += [f"  {u} --> {v}" for u, v in edges]
    return "\n".join(lines)


def render(stage: str, fmt: str, plan, built_graph=None, targets=None) -> str:
    """Text of one dump stage for a compiled plan.  `built_graph`: the views graph (for `graph`);
    `targets`: the nodes the plan was captured from, so every stage names nodes by their
    user-graph ids (see Names)."""
    if stage not in STAGES:
        raise ValueError(f"dump: unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    if fmt not in FORMATS:
        raise ValueError(f"dump: unknown format {fmt!r}; formats: {', '.join(FORMATS)}")
    if stage in ("llvm", "asm"):
        return llvm_text(plan, stage)
    names = Names(plan, targets)
    built_names = names.of_built_graph()
    if fmt == "text":
        if stage == "graph":
            return graph_text(built_graph) if built_graph is not None else optimized_text(plan.graph_desc, built_names)
        if stage == "optimized":
            return optimized_text(plan.opt_desc, names)
        return schedule_text(plan, names)
    if stage == "graph":
        parts = _graph_edges_built(built_graph) if built_graph is not None \
            else _graph_edges_opt(plan.graph_desc, built_names)
    elif stage == "optimized":
        parts = _graph_edges_opt(plan.opt_desc, names)
    else:
        parts = _schedule_edges(plan, names)
    return to_dot(*parts) if fmt == "dot" else to_mermaid(*parts)
