"""The GPT-2-style block program (bench/gpt2_block.py) timed under two lazycandle checkouts, the
processes alternating, for issue 11's "faster than before this change":

    python bench/block_vs_commit.py BEFORE_DIR [AFTER_DIR] [--seq 8] [--threads 1,2] [--rounds 5]

Each round starts one process per checkout (PYTHONPATH=<dir>); a process warms the program up
and prints the median of 15 `Program.run` calls.  Printed: per checkout and thread count the
median over rounds, and after/before.  BEFORE_DIR is a worktree of an older commit, e.g.
`git worktree add --detach ../before e658e67` (main before the native program)."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import os, sys, time, statistics
sys.path.insert(0, {bench!r})
import lazycandle as lc
import gpt2_block as G
seq, threads = {seq}, {threads}
prog, feeds = G.block_program(seq)
with lc.num_threads(threads):
    for _ in range(5):
        prog.run(**feeds)
    ts = []
    for _ in range(15):
        t0 = time.perf_counter(); prog.run(**feeds); ts.append(time.perf_counter() - t0)
print(statistics.median(ts) * 1e3)
"""


def _one(checkout, seq, threads) -> float:
    env = dict(os.environ, PYTHONPATH=checkout)
    code = CHILD.format(bench=os.path.join(ROOT, "bench"), seq=seq, threads=threads)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd="/")
    return float(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after", nargs="?", default=ROOT)
    ap.add_argument("--seq", type=int, default=8)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}; block (1, {a.seq}, 768); before {a.before}, after {a.after}")
    for threads in (int(t) for t in a.threads.split(",")):
        got = {"before": [], "after": []}
        for _ in range(a.rounds):
            for name in ("before", "after"):
                got[name].append(_one(getattr(a, name), a.seq, threads))
        b, f = statistics.median(got["before"]), statistics.median(got["after"])
        print(f"  {threads} thread(s): before {b:.2f} ms, after {f:.2f} ms -> {b / f:.2f}x faster "
              f"(per-round medians before {[round(v, 2) for v in got['before']]}, after {[round(v, 2) for v in got['after']]})")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
