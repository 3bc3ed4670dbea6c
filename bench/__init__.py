"""lazycandle's benchmark suite: `lazycandle bench` (or `python -m bench` from the repo root).

    lazycandle bench [--quick] [--only NAME[,NAME]] [--threads 1,2] [--json FILE] [--plot FILE.png]
                     [--md FILE] [--repeats N] [--peers numexpr,torch,jax|none] [--no-peaks] [--extra]

It reproduces the seed's cpu_bench table (candle's f32/f16/bf16 matmul and exp/add/mul figures,
at each thread count) and times the fusion cases, each against NumPy and the installed peers in
the same loop, after checking lazycandle's result against NumPy.  The markdown report goes to
stdout, one progress line per case to stderr.  Modules: `cases` (what is measured), `runner`
(check + time one case), `timing`, `machine` (header, bandwidth and FMA peaks), `peers`,
`report` (markdown / JSON / plot), `backbone` (issue 2's must-show figures).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["main", "run_cli"]

DEFAULT_REPEATS = {"full": 9, "quick": 5, "tiny": 2}
EXTRA_SUITES = ("bench_vmath", "bench_matmul")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lazycandle bench", description=__doc__.split("\n\n")[0],
                                epilog="Ratios are NumPy time / lazycandle time (> 1: lazycandle is faster).")
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats (under a minute)")
    p.add_argument("--only", default="", metavar="NAME",
                   help="comma-separated case names, globs or substrings (e.g. matmul,softmax); "
                        "--list shows the names")
    p.add_argument("--threads", default=None, metavar="1,2",
                   help="thread counts to run at (default: 1 and all CPUs; --quick: all CPUs)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write all rows as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="also plot the ratios (needs matplotlib)")
    p.add_argument("--md", default=None, metavar="FILE", help="also write the markdown report to FILE")
    p.add_argument("--repeats", type=int, default=None, help="timed runs per case (default 9; --quick 5)")
    p.add_argument("--peers", default="numexpr,torch,jax",
                   help="peers to compare with when installed (comma list, or 'none')")
    p.add_argument("--no-peaks", action="store_true", help="skip measuring bandwidth and FMA peaks")
    p.add_argument("--extra", action="store_true",
                   help="also run the colleagues' suites bench/bench_vmath.py and bench/bench_matmul.py if present")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)   # CI: tiny sizes
    return p


def _thread_counts(spec, mode: str) -> list:
    cpus = len(os.sched_getaffinity(0))
    if spec:
        counts = [int(x) for x in spec.split(",") if x.strip()]
        if not counts or min(counts) < 1:
            raise ValueError(f"--threads: expected positive integers, got {spec!r}")
        return list(dict.fromkeys(counts))
    if mode == "full":
        return list(dict.fromkeys([1, cpus]))
    return [1] if mode == "tiny" else [cpus]


def _extra_suites(quick: bool) -> tuple[list, list]:
    """Rows of the colleagues' suites (module.run(quick=...)), rendered as generic tables."""
    import importlib
    lines, notes = [], []
    for mod_name in EXTRA_SUITES:
        try:
            mod = importlib.import_module(f"{__name__}.{mod_name}")
        except ImportError as e:
            notes.append(f"--extra: bench/{mod_name}.py not available ({e})")
            continue
        if not hasattr(mod, "run"):
            notes.append(f"--extra: bench/{mod_name}.py has no run()")
            continue
        try:
            rows = list(mod.run(quick=quick))
        except Exception as e:
            notes.append(f"--extra: bench/{mod_name}.run failed: {type(e).__name__}: {e}")
            continue
        keys = list(dict.fromkeys(k for r in rows for k in r))
        lines += [f"## {mod_name}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        for r in rows:
            lines.append("| " + " | ".join(f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k, ""))
                                           for k in keys) + " |")
        lines.append("")
    return lines, notes


def run_cli(argv) -> int:
    """The command line's entry: first make the peers' idle threads yield (peers.fair_env_reexec
    restarts the process with the right environment if needed), then `main`."""
    from .peers import fair_env_reexec
    fair_env_reexec(list(argv))
    return main(argv)


def main(argv=None, cases=None, sizes=None, lc_impls=None) -> int:
    """Run the suite; returns the exit code (1 if any lazycandle result was WRONG, 2 on bad
    arguments).  For tests: `cases` replaces the case list, `sizes` maps case names to sizes,
    `lc_impls` maps case names to replacement lazycandle implementations."""
    from . import cases as C
    from .machine import Peaks, describe
    from .peers import PEER_NAMES, load_peers, numpy_blas_info, thread_notes, threads, versions
    from .report import markdown, plot, write_json
    from .runner import progress, run_case

    args = _parser().parse_args(argv)
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    all_cases = list(cases) if cases is not None else C.ALL_CASES
    if args.list:
        for c in all_cases:
            print(f"{c.name:<18} {c.group:<7} {c.title(c.sizes['full'])}")
        return 0
    selected = C.select(all_cases, args.only)
    if not selected:
        print(f"lazycandle bench: no case matches --only {args.only!r} (see --list)", file=sys.stderr)
        return 2
    try:
        counts = _thread_counts(args.threads, mode)
    except ValueError as e:
        print(f"lazycandle bench: {e}", file=sys.stderr)
        return 2
    repeats = args.repeats or DEFAULT_REPEATS[mode]
    t_start = time.perf_counter()

    wanted = () if args.peers.strip().lower() in ("", "none") else [p.strip() for p in args.peers.split(",") if p.strip()]
    mods, notes = load_peers(wanted)
    header = describe(argv)
    header["versions"] = versions(mods)
    notes += thread_notes(mods, numpy_blas_info()[1])
    peaks = None if args.no_peaks else Peaks(mode)

    def measure_peaks():
        for n in counts:
            with threads(n, mods):
                print(f"measuring bandwidth and FMA peaks at {n} thread(s) ...", file=sys.stderr, flush=True)
                peaks.measure(n)

    if peaks is not None:
        measure_peaks()
    # each case at every thread count back to back, so the thread-scaling figures of a case see
    # the same machine conditions (the load of a shared machine drifts over minutes)
    rows, total = [], len(selected) * len(counts)
    for case in selected:
        size = C.size_of(case, mode, sizes)
        for n in counts:
            with threads(n, mods):
                rows.append(run_case(case, size, n, mods, repeats, lc_impl=(lc_impls or {}).get(case.name)))
            progress(rows[-1], len(rows), total)
    if peaks is not None:
        measure_peaks()

    extra_lines = []
    if args.extra:
        extra_lines, extra_notes = _extra_suites(mode != "full")
        notes += extra_notes
    peer_names = [p for p in PEER_NAMES if p in mods]
    header["loadavg_end"] = os.getloadavg()[0]
    if args.plot:
        notes.append(plot(args.plot, rows, counts))
        print(notes[-1], file=sys.stderr)
    notes.append(f"suite wall time: {time.perf_counter() - t_start:.0f} s")
    text = markdown(header, rows, peaks, counts, peer_names, notes, repeats)
    if extra_lines:
        text += "\n" + "\n".join(extra_lines)
    sys.stdout.write(text)
    sys.stdout.flush()
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    if args.json:
        write_json(args.json, header, rows, peaks, notes)
    return 1 if any(r["status"] == "WRONG" for r in rows) else 0
