"""Start-up costs, each the median of fresh processes:

  * `import lazycandle` (next to `import numpy, ml_dtypes`, the floor it cannot go below);
  * the first realize of a small chain, `(a * b + c).exp()` on 1,000 f32, in a new process
    whose LAZYCANDLE_CACHE_DIR is warm (a disk hit: no LLVM optimiser or code generator),
    split into loading LLVM (llvmlite.binding, target machine, LLJIT: paid once per process by
    whatever compiles first) and the rest.

Python's bytecode cache is on (in a temporary PYTHONPYCACHEPREFIX, warmed first), as in any
installed package, even when the calling shell sets PYTHONDONTWRITEBYTECODE.
Run from the repository root: `python bench/startup.py [--runs 5]`."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_IMPORT = """
import time
t, c = time.perf_counter(), time.process_time()
import {mods}
print(1000 * (time.perf_counter() - t), 1000 * (time.process_time() - c))
"""

_FIRST = """
import json, time
import numpy as np
import lazycandle as lc
from lazycandle.codegen import jit
x = np.linspace(0, 1, 1000, dtype=np.float32)
a, b, c = lc.tensor(x), lc.tensor(x), lc.tensor(x)
t0, c0 = time.perf_counter(), time.process_time()
jit._host()
t1, c1 = time.perf_counter(), time.process_time()
y = (a * b + c).exp().numpy()
t2, c2 = time.perf_counter(), time.process_time()
assert abs(float(y[-1]) - float(np.exp(np.float32(2)))) < 1e-5
print(json.dumps({"llvm_ms": 1000 * (t1 - t0), "realize_ms": 1000 * (t2 - t1), "total_ms": 1000 * (t2 - t0),
                  "llvm_cpu": 1000 * (c1 - c0), "realize_cpu": 1000 * (c2 - c1), "total_cpu": 1000 * (c2 - c0),
                  "disk_hits": jit.stats["disk_hits"]}))
"""


def _run(code: str, env: dict) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    pycache = tempfile.TemporaryDirectory()
    env = dict(os.environ, PYTHONPYCACHEPREFIX=pycache.name)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("LAZYCANDLE_CACHE_DIR", None)
    _run(_IMPORT.format(mods="lazycandle"), env)     # writes the bytecode cache
    floor = [_run(_IMPORT.format(mods="numpy, ml_dtypes"), env).split() for _ in range(args.runs)]
    imp = [_run(_IMPORT.format(mods="lazycandle"), env).split() for _ in range(args.runs)]

    def med(rows, i):
        return statistics.median(float(r[i]) for r in rows)

    def low(rows, i):
        return min(float(r[i]) for r in rows)
    print(f"times in ms: wall (process CPU), median of {args.runs} fresh processes [fastest wall, on a busy host]")
    print(f"import numpy, ml_dtypes: {med(floor, 0):7.1f} ({med(floor, 1):.1f}) [{low(floor, 0):.1f}]")
    print(f"import lazycandle:       {med(imp, 0):7.1f} ({med(imp, 1):.1f}) [{low(imp, 0):.1f}]   target <= 150")
    with tempfile.TemporaryDirectory() as d:
        env["LAZYCANDLE_CACHE_DIR"] = d
        _run(_FIRST, env)                       # warms the disk cache
        runs = [json.loads(_run(_FIRST, env)) for _ in range(args.runs)]
    assert all(r["disk_hits"] >= 1 for r in runs), runs
    m = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "disk_hits"}
    lo = {k: min(r[k] for r in runs) for k in runs[0] if k != "disk_hits"}
    print("first realize of (a * b + c).exp() on 1,000 f32, new process, warm disk cache:")
    for key, what in (("llvm", "loading LLVM (binding, target machine, LLJIT)"),
                      ("realize", "realize (capture .. disk hit .. link .. run) "), ("total", "both")):
        print(f"  {what:46s} {m[key + '_ms']:7.1f} ({m[key + '_cpu']:.1f}) [{lo[key + '_ms']:.1f}]"
              + ("   target <= 10" if key == "realize" else ""))
    pycache.cleanup()


if __name__ == "__main__":
    main()
