"""The first result of a new process: the first realize of a GPT-2-block-shaped forward
(bench/gpt2_block.py's model: pre-norm, causal attention, tanh-gelu MLP), with an empty disk
kernel cache (every kernel compiled) and with a warm one (every kernel loaded), each the median
of fresh processes.  The same program realized a second time in the process is shown as the
steady state it starts from.  Python's bytecode cache is on (a temporary
PYTHONPYCACHEPREFIX, warmed first), as for an installed package.

    python bench/first_run.py [--runs 5] [--seq 64] [--dim 768] [--heads 12] [--blocks 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import json, sys, time
t0 = time.perf_counter()
import numpy as np
import lazycandle as lc
from lazycandle.codegen import jit
sys.path.insert(0, {root!r})
from bench.gpt2_block import init_params, causal_mask, stack
t1 = time.perf_counter()
seq, dim, heads, n = {seq}, {dim}, {heads}, {blocks}
blocks = [{{k: lc.tensor(v) for k, v in b.items()}} for b in init_params(dim, n)]
x = lc.tensor(np.random.default_rng(1).standard_normal((1, seq, dim)).astype(np.float32))
mask = lc.tensor(causal_mask(seq))
t2 = time.perf_counter()
y = stack(x, blocks, mask, heads).numpy()
t3 = time.perf_counter()
stack(x, blocks, mask, heads).numpy()
t4 = time.perf_counter()
assert np.isfinite(y).all()
print(json.dumps({{"import_s": t1 - t0, "build_s": t2 - t1, "first_s": t3 - t2, "second_s": t4 - t3,
                  "compiled": jit.stats["compiled"], "disk_hits": jit.stats["disk_hits"]}}))
"""


def _run(code: str, cache: str, pycache: str) -> dict:
    env = dict(os.environ, LAZYCANDLE_CACHE_DIR=cache, LAZYCANDLE_PROGRESS="0", PYTHONPYCACHEPREFIX=pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _row(name: str, runs: list) -> str:
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return (f"{name:11s} import {med['import_s']:6.2f} s  build {med['build_s']:5.2f} s  first realize "
            f"{med['first_s']:6.2f} s  second {1000 * med['second_s']:7.1f} ms  kernels {med['compiled']:.0f} "
            f"(from disk {med['disk_hits']:.0f})  [first: {min(r['first_s'] for r in runs):.2f}-"
            f"{max(r['first_s'] for r in runs):.2f} s]")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--blocks", type=int, default=1)
    a = ap.parse_args(argv)
    code = PROBE.format(root=ROOT, seq=a.seq, dim=a.dim, heads=a.heads, blocks=a.blocks)
    pycache = tempfile.TemporaryDirectory(prefix="lc-first-run-pyc-")
    cold = []
    for _ in range(a.runs + 1):                             # the first run writes the bytecode cache
        with tempfile.TemporaryDirectory(prefix="lc-first-run-") as d:
            cold.append(_run(code, d, pycache.name))
    cold = cold[1:]
    with tempfile.TemporaryDirectory(prefix="lc-first-run-") as d:
        _run(code, d, pycache.name)                         # fills the kernel cache
        warm = [_run(code, d, pycache.name) for _ in range(a.runs)]
    pycache.cleanup()
    assert all(r["disk_hits"] == 0 for r in cold) and all(r["disk_hits"] > 0 for r in warm)
    print(f"GPT-2 block forward, (1, {a.seq}, {a.dim}), {a.heads} heads, {a.blocks} block(s); "
          f"median of {a.runs} fresh processes, {os.environ.get('LAZYCANDLE_NUM_THREADS', 'all')} threads")
    print(_row("cold cache", cold))
    print(_row("warm cache", warm))


if __name__ == "__main__":
    main()
