"""Rendering the rows: the markdown report, the JSON file and the PNG plot of the ratios."""
from __future__ import annotations

import json
import math

from .machine import nominal_gflops

# candle 0.11.0 on an Apple M2 Max (8 performance cores), from the seed (shared/seed/README.md)
SEED_CANDLE = {
    "f32 matmul 256": ("0.032 ms (1042 GFLOP/s)", "0.174 ms (193 GFLOP/s)"),
    "f32 matmul 1024": ("0.867 ms (2477 GFLOP/s)", "3.256 ms (659 GFLOP/s)"),
    "f32 matmul 2048": ("7.843 ms (2190 GFLOP/s)", "28.961 ms (593 GFLOP/s)"),
    "f16 matmul 1024": ("error", "1.603 ms"),
    "bf16 matmul 1024": ("error (bf16 matmul unsupported on CPU)", "error"),
    "exp, 4,194,304 f32": ("1.765 ms", "6.408 ms"),
    "add, 4,194,304 f32": ("0.733 ms", "0.580 ms"),
    "mul, 4,194,304 f32": ("0.624 ms", "0.570 ms"),
}
SEED_SCALING = ("candle's thread scaling (seed): gemm matmul 1024: 1 thread 21.8 ms, 4 → 8.1 ms, "
                "8 → 3.3–4.5 ms, 12 → 3.6–4.3 ms; `exp` 6.50 ms at 1 thread and 6.51 ms at 8 "
                "(single-threaded).")


def _ms(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _impl_cell(row: dict, name: str, spread: bool = False) -> str:
    s = row["impls"].get(name)
    if s is None:
        return "—"
    cell = _ms(s["median_ms"])
    if spread:
        cell += f" ({_ms(s['min_ms'])}–{_ms(s['max_ms'])})"
    if s["n"] < row.get("repeats", 9):
        cell += f" n={s['n']}"
    return cell


def _rate(row: dict) -> str:
    unit = "GFLOP/s" if row["metric"] == "flops" else "GB/s"
    return f"{row['rate']:.1f} {unit}"


def _pct(row: dict, peaks) -> str:
    p = peaks.peak(row["metric"], row["threads"]) if peaks is not None else float("nan")
    if math.isnan(p) or p <= 0:
        return "—"
    return f"{100 * row['rate'] / p:.0f}%"


def _lc_cell(row: dict, spread: bool = True) -> str:
    if row["status"] != "ok":
        return f"**{row['status']}**"
    return _impl_cell(row, "lazycandle", spread)


def seed_table(rows: list, threads: list) -> list:
    """The seed's cpu_bench table: candle's figures beside lazycandle's (each thread count) and
    NumPy's on this machine."""
    by = {(r["name"], r["threads"]): r for r in rows if r["group"] == "seed"}
    names = list(dict.fromkeys(r["name"] for r in rows if r["group"] == "seed"))
    if not names:
        return []
    head = ["item (this run's size)", "candle + Accelerate (M2 Max)", "candle + gemm (M2 Max)"]
    head += [f"lazycandle {t} thr" for t in threads] + [f"NumPy {t} thr" for t in threads]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        any_row = next(r for (n, _), r in by.items() if n == name)
        label = any_row.get("seed_label") or any_row["title"]
        acc, gemm = SEED_CANDLE.get(label, ("", ""))
        cells = [any_row["title"] if label == any_row["title"] else f"{label} ({any_row['title']})", acc, gemm]
        for t in threads:
            r = by.get((name, t))
            if r is None:
                cells.append("—")
            elif r["status"] != "ok":
                cells.append(f"**{r['status']}**")
            else:
                c = _ms(r["impls"]["lazycandle"]["median_ms"]) + " ms"
                if r["metric"] == "flops":
                    c += f" ({r['rate']:.0f} GFLOP/s)"
                cells.append(c)
        for t in threads:
            r = by.get((name, t))
            cells.append(_impl_cell(r, "numpy") + " ms" if r is not None and r["status"] == "ok" else "—")
        out.append("| " + " | ".join(cells) + " |")
    return out


def full_table(rows: list, peer_names: list, peaks) -> list:
    """Every case at every thread count, lazycandle beside NumPy and each peer."""
    head = ["case", "thr", "lazycandle ms median (min–max)", "1st call ms", "NumPy ms"]
    head += [f"{p} ms" for p in peer_names]
    head += ["× NumPy", "× best peer", "lazycandle rate", "% peak", "load"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["status"] != "ok":
            cells = [r["title"], str(r["threads"]), f"**{r['status']}**", "", ""] + [""] * len(peer_names) \
                + ["", "", "", "", ""]
        else:
            cells = [r["title"], str(r["threads"]), _lc_cell(r), _ms(r["impls"]["lazycandle"]["first_ms"]),
                     _impl_cell(r, "numpy")]
            cells += [_impl_cell(r, p) for p in peer_names]
            cells += [f"**{r['x_numpy']:.2f}×**", f"{r['x_best_peer']:.2f}× ({r['best_peer']})", _rate(r),
                      _pct(r, peaks), f"{r['loadavg']:.1f}" if "loadavg" in r else "—"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def scaling_notes(rows: list, factor: float = 1.5) -> list:
    """Flag implementations that got markedly slower with more threads than with fewer: on a
    shared machine that usually means the extra threads found no free core (a spinning BLAS
    thread pool suffers most), so those ratios deserve suspicion."""
    out = []
    by_name: dict = {}
    for r in rows:
        if r["status"] == "ok":
            by_name.setdefault(r["name"], []).append(r)
    for name, rs in by_name.items():
        rs = sorted(rs, key=lambda r: r["threads"])
        lo = rs[0]
        for hi in rs[1:]:
            slow = [f"{impl} {_ms(lo['impls'][impl]['median_ms'])} → {_ms(st['median_ms'])} ms"
                    for impl, st in hi["impls"].items()
                    if impl in lo["impls"] and st["median_ms"] > factor * lo["impls"][impl]["median_ms"]]
            if slow:
                out.append(f"{name}: slower with {hi['threads']} threads than with {lo['threads']}: "
                           + ", ".join(slow) + " (a busy machine? read this row's ratios with care)")
    return out


def markdown(header: dict, rows: list, peaks, threads: list, peer_names: list, notes: list,
             repeats: int) -> str:
    """The whole report as markdown."""
    L = [f"# lazycandle bench — {header['date']}", "",
         f"- command: `{header['command']}`",
         f"- CPU: {header['cpu']} (LLVM: {header['llvm_cpu']}, {header['vector_bits']}-bit vectors"
         f"{', FMA' if header['fma'] else ''}), {header['cpus']} CPUs in the affinity set, "
         f"{header['mhz']:.0f} MHz reported; 1-minute load average {header['loadavg_start']:.1f} at start"
         + (f", {header['loadavg_end']:.1f} at end" if "loadavg_end" in header else ""),
         f"- lazycandle {header['lazycandle']}, matmul backend `{header['matmul_backend']}`, "
         f"its BLAS: {header['lc_blas']}",
         f"- NumPy's BLAS: {header['numpy_blas']}",
         f"- Python {header['python']}; " + ", ".join(f"{k} {v}" for k, v in header.get("versions", {}).items()),
         "- BLAS environment: " + (", ".join(f"{k}={v}" for k, v in header["env"].items())
                                   if header["env"] else "none of OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE / "
                                   "OPENBLAS_NUM_THREADS / OMP_NUM_THREADS is set"),
         ""]
    if "OPENBLAS_CORETYPE" in header["env"] or "OPENBLAS_L2_SIZE" in header["env"]:
        L += ["> OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set: they can make NumPy's OpenBLAS pick a "
              "slower kernel; the NumPy matmul figures below are measured under them.", ""]
    if peaks is not None:
        L += ["## This machine's peaks (lazycandle kernels)", "",
              "| threads | bandwidth GB/s (`a + b`) | FMA GFLOP/s (L1 FMA chains) | nominal GFLOP/s |", "|---|---|---|---|"]
        for t in threads:
            L.append(f"| {t} | {peaks.bw.get(t, float('nan')):.1f} | {peaks.fma.get(t, float('nan')):.1f} | "
                     f"{nominal_gflops(header, t):.0f} |")
        L += [""] + [f"- {e}" for e in peaks.errors] + ([""] if peaks.errors else [])
    seed = seed_table(rows, threads)
    if seed:
        L += ["## The seed's cpu_bench table, reproduced", "", *seed, "", SEED_SCALING, ""]
    L += ["## All cases: lazycandle vs NumPy and peers", "",
          "× NumPy = NumPy time / lazycandle time (> 1 means lazycandle is faster); "
          "× best peer: against the fastest of NumPy and the installed peers.", "",
          *full_table(rows, peer_names, peaks), ""]
    case_notes = []
    for r in rows:
        for n in ([r["error"]] if r["status"] != "ok" else []) + r["notes"]:
            item = f"- {r['name']}: {n}"
            if item not in case_notes:
                case_notes.append(item)
    case_notes += [f"- {n}" for n in scaling_notes(rows)]
    if case_notes or notes:
        L += ["## Notes", "", *[f"- {n}" for n in notes], *case_notes, ""]
    if peaks is not None:
        L += ["## Method", "", peaks.method(repeats)]
    return "\n".join(L).rstrip() + "\n"


def write_json(path: str, header: dict, rows: list, peaks, notes: list) -> None:
    """All rows and the header as JSON."""
    data = {"header": header, "notes": notes, "rows": rows,
            "peaks": None if peaks is None else {"bandwidth_gbs": peaks.bw, "fma_gflops": peaks.fma,
                                                  "errors": peaks.errors}}
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=str)


def plot(path: str, rows: list, threads: list) -> str:
    """Bar chart of "× NumPy" and "× best peer" per case and thread count (log scale).  Returns
    a note: where it was written, or why not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "plot skipped: matplotlib is not installed (pip install matplotlib)"
    ok = [r for r in rows if r["status"] == "ok"]
    names = list(dict.fromkeys(r["name"] for r in ok))
    if not names:
        return "plot skipped: no timed case"
    by = {(r["name"], r["threads"]): r for r in ok}
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.7 * len(names) + 3), 8), sharex=True)
    width = 0.8 / max(1, len(threads))
    for ax, key, label in ((axes[0], "x_numpy", "× faster than NumPy"),
                           (axes[1], "x_best_peer", "× faster than the best peer")):
        for j, t in enumerate(threads):
            xs = [i + (j - (len(threads) - 1) / 2) * width for i in range(len(names))]
            vals = [by[(n, t)][key] if (n, t) in by else float("nan") for n in names]
            bars = ax.bar(xs, vals, width, label=f"{t} thread{'s' if t > 1 else ''}")
            ax.bar_label(bars, labels=[f"{v:.2g}" if v == v else "" for v in vals], fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    axes[1].set_xticks(range(len(names)))
    axes[1].set_xticklabels(names, rotation=40, ha="right")
    axes[0].set_title("lazycandle speed-up (median time ratio; > 1 = lazycandle faster)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot written to {path}"
