"""The auto backend's no-measure rule (runtime/matmul_auto.py ruled): BLAS / tiled time of f32
GEMMs inside the rule's region (m >= RULE_M, n, k >= RULE_NK: marked "rule") and near it, each timed by the auto backend's own measurement (alternating
rounds, medians) three times, the median ratio shown with its range; > 1 means the tiled GEMM,
the rule's pick, is faster.  Both forms of B: contiguous (NN) and transposed (NT, a Linear's
weight).

    python -m bench.auto_rule [--threads 2]"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile

os.environ.setdefault("LAZYCANDLE_CACHE_DIR", tempfile.mkdtemp(prefix="lc-auto-rule-"))

from lazycandle.dtype import f32  # noqa: E402
from lazycandle.layout import Layout  # noqa: E402
from lazycandle.runtime import matmul, matmul_auto  # noqa: E402

SHAPES = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 384, 384),
          (4096, 1536, 384), (4096, 384, 1536), (512, 768, 768), (512, 3072, 768), (512, 768, 3072),
          (256, 2304, 768), (300, 300, 300), (1000, 257, 999), (257, 4000, 300), (2000, 2000, 256),
          (1024, 384, 384), (1100, 500, 700), (3000, 1000, 400), (1536, 768, 3072)]


def ratio(m: int, n: int, k: int, form: str, threads: int) -> list:
    """BLAS / tiled median time of m x k @ k x n, three measurements."""
    a = Layout((m, k), (k, 1))
    b = Layout((k, n), (n, 1)) if form == "NN" else Layout((k, n), (1, k))
    g = matmul.geometry(a, b, f32)
    got = []
    for _ in range(3):
        t = matmul_auto.measure(g, threads, lambda p: matmul._candidates(p, threads, True))
        got.append(t["blas"] / t["tiled"])
    return got


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    rows = []
    for m, n, k in SHAPES:
        for form in ("NN", "NT"):
            got = ratio(m, n, k, form, a.threads)
            ruled = m >= matmul_auto.RULE_M and min(n, k) >= matmul_auto.RULE_NK
            rows.append((statistics.median(got), ruled))
            print(f"{m:5d} x {n:5d} x {k:5d} {form}: BLAS / tiled {rows[-1][0]:5.2f} [{min(got):.2f}-{max(got):.2f}]"
                  f"{'  rule' if ruled else '      '}  load {os.getloadavg()[0]:.1f}", flush=True)
    for ruled in (True, False):
        got = [r for r, inside in rows if inside == ruled]
        print(f"{a.threads} threads, {'inside' if ruled else 'outside'} the rule: the tiled GEMM slower (median "
              f"ratio < 0.98) in {sum(r < 0.98 for r in got)} of {len(got)}, worst {min(got):.2f}")


if __name__ == "__main__":
    main()
