"""Per-kernel timing of a Plan (Program.profile, env LAZYCANDLE_PROFILE=1).  A profiled run
takes the per-kernel path (executor.Plan.run_python) so each kernel is its own timed call; the
kernels are the same compiled functions the whole-program module calls.  Rows: kernel index,
kind, the ops it fuses, its output shape, the bytes it reads and writes, its flops (matmul)
and its time.  With LAZYCANDLE_PROFILE=1 every plan run is profiled and the totals are printed
to stderr at exit."""
from __future__ import annotations

import atexit
import sys
import threading
from math import prod

_lock = threading.Lock()
_totals: dict = {}          # id(plan) -> [plan, runs, [seconds per kernel]]


def kernel_rows(plan, seconds) -> list:
    """(index, kind, name, shape, bytes, flops, seconds) per kernel of `plan`."""
    desc = plan.opt_desc
    rows = []
    for i, (k, t) in enumerate(zip(plan.kernels, seconds)):
        name = "+".join(desc["nodes"][j][0] for j in k.groups()[0])
        if k.parts:
            name = f"{len(k.parts)} x ({name})"         # a horizontal kernel: per segment
        out = k.outputs[0] if k.outputs else k.nodes[-1]
        shape = desc["nodes"][out][2]
        nbytes = sum(prod(desc["nodes"][j][2]) * desc["nodes"][j][3].size_in_bytes for j in k.outputs)
        flops = 0
        for j in k.nodes:
            op, _, oshape, _, ops = desc["nodes"][j]
            for o in ops:
                if o.kind not in ("in", "node"):
                    continue
                dt = desc["inputs"][o.src][3] if o.kind == "in" else desc["nodes"][o.index][3]
                nbytes += prod(o.shape) * dt.size_in_bytes if (o.kind == "in" or o.index not in k.nodes) else 0
            if op == "matmul" and len(ops) == 2:
                flops += 2 * prod(oshape) * ops[0].shape[-1]
        rows.append((i, k.kind, name, shape, nbytes, flops, t))
    return rows


def table(plan, seconds, runs: int = 1) -> str:
    """The profile table of `plan`; `seconds` per kernel, summed over `runs` runs."""
    rows = kernel_rows(plan, [s / max(runs, 1) for s in seconds])
    total = sum(r[-1] for r in rows) or 1e-12
    head = f"{'#':>3} {'kind':<12} {'time us':>9} {'share':>6} {'bytes':>11} {'GFLOP/s':>8}  {'shape':<18} ops"
    lines = [head, "-" * len(head)]
    for i, kind, name, shape, nbytes, flops, t in rows:
        rate = f"{flops / t / 1e9:8.2f}" if flops and t > 0 else f"{'':>8}"
        lines.append(f"{i:>3} {kind:<12} {t * 1e6:9.1f} {t / total:6.1%} {nbytes:>11} {rate}  "
                     f"{str(tuple(shape)):<18} {name}")
    lines.append(f"    {'total':<12} {total * 1e6:9.1f} (per run, {runs} run(s), kernels called one by one)")
    return "\n".join(lines)


def record(plan, seconds) -> None:
    """LAZYCANDLE_PROFILE: add one profiled run of `plan` to the totals printed at exit."""
    with _lock:
        entry = _totals.get(id(plan))
        if entry is None:
            if not _totals:
                atexit.register(_print_totals)
            entry = _totals[id(plan)] = [plan, 0, [0.0] * len(seconds)]
        entry[1] += 1
        entry[2] = [a + b for a, b in zip(entry[2], seconds)]


def _print_totals():
    for n, (plan, runs, seconds) in enumerate(_totals.values()):
        print(f"==== lazycandle profile: plan {n} ({len(plan.kernels)} kernels, {runs} run(s); mean per run)",
              file=sys.stderr)
        print(table(plan, seconds, runs), file=sys.stderr)
