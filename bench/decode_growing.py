"""An attention decode step over a KV cache whose length L grows 1..N, compiled ONCE with a named
dim (issue 38), against the same step compiled for each fixed L:

    python bench/decode_growing.py [--max-len 1024] [--heads 12] [--head-dim 64] [--repeats 9]

The step: q = x @ Wq for one new token, attention of q over the cache (b=1, h heads, L, d),
then @ Wo.  Prints, per sampled L, the median us of the named-dim program at a bound L and of a program
compiled for that L (alternating in one loop, every call on freshly copied caches, as in the
walk), their ratio, the median step at a new L (target: <= 1.3x the fixed program's),
and how many kernels were compiled after L = 2 while the walk ran every L (target 0).  The table's
new-L column times a second named-dim program at lengths it has not seen (the nearest to L),
alternating with the named and fixed runs in one loop, so load disturbs them alike; the same
two columns follow in process CPU time (user + sys of every thread, resource.getrusage)."""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import time

import numpy as np

import lazycandle as lc
from lazycandle.codegen import jit


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def step_graph(h, d, length):
    e = h * d
    x = lc.placeholder("x", (1, e))
    wq = lc.placeholder("wq", (e, e))
    wo = lc.placeholder("wo", (e, e))
    k = lc.placeholder("k", (1, h, length, d))
    v = lc.placeholder("v", (1, h, length, d))
    q = (x @ wq).reshape((1, h, 1, d))
    a = lc.nn.scaled_dot_product_attention(q, k, v)
    return lc.compile([a.reshape((1, e)) @ wo])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args()
    h, d = a.heads, a.head_dim
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, h * d), np.float32),
             "wq": rng.standard_normal((h * d, h * d), np.float32) / 30,
             "wo": rng.standard_normal((h * d, h * d), np.float32) / 30}
    kc = rng.standard_normal((1, h, a.max_len, d), np.float32)
    vc = rng.standard_normal((1, h, a.max_len, d), np.float32)
    named = step_graph(h, d, "L")

    def at(n):      # fresh copies at every n (at max_len too: a view of the caches would stay hot for the next run)
        return dict(feeds, k=kc[:, :, :n].copy(), v=vc[:, :, :n].copy())
    t0 = time.perf_counter()
    named.run(**at(1))
    named.run(**at(2))
    first = time.perf_counter() - t0
    before = jit.stats["compiled"]
    t0 = time.perf_counter()
    walk = []
    for n in range(3, a.max_len + 1):
        f = at(n)
        t1 = time.perf_counter()
        named.run(**f)
        walk.append(time.perf_counter() - t1)
    grow = time.perf_counter() - t0
    compiled_after = jit.stats["compiled"] - before
    print(f"load {os.getloadavg()[0]:.2f}; lc {lc.__version__}; h={h} d={d}")
    slow = sorted(range(len(walk)), key=lambda i: -walk[i])[:5]
    print(f"L=1,2 first runs {first * 1e3:.1f} ms; L=3..{a.max_len} each run once: total {grow * 1e3:.1f} ms "
          f"(median {statistics.median(walk) * 1e6:.0f} us/step, mean {statistics.mean(walk) * 1e6:.0f}); "
          f"kernels compiled after L=2: {compiled_after}")
    print("slowest new-L steps: " + ", ".join(f"L={i + 3} {walk[i] * 1e3:.1f} ms" for i in slow))
    print(f"{'L':>6} {'named us':>10} {'fixed us':>10} {'ratio':>6} {'new-L us':>9} {'new/fixed':>10} "
          f"{'cpu: fixed us':>13} {'new-L us':>8} {'new/fixed':>10}  (max |diff|)")
    fresh = step_graph(h, d, "L")       # new-L steps for the table, timed beside the fixed program
    fresh.run(**at(a.max_len))
    fresh.run(**at(a.max_len - 1))
    seen = {a.max_len, a.max_len - 1}
    for n in [1, 2, 16, 100, 128, 255, 512, 1000, a.max_len]:
        if n > a.max_len:
            continue
        fixed = step_graph(h, d, n)
        f = at(n)
        got, want = named.run(**f)[0], fixed.run(**f)[0]
        diff = float(np.abs(np.asarray(got) - np.asarray(want)).max())
        new = [m for m in range(n, a.max_len + 1) if m not in seen][:a.repeats]
        new += [m for m in range(n - 1, 0, -1) if m not in seen][:a.repeats - len(new)]
        seen.update(new)
        tn, tf, tw, cf, cw = [], [], [], [], []
        for _ in range(3):
            named.run(**f), fixed.run(**f)
        for m in new:                       # fresh caches each call (copied untimed), the three alternating
            f = at(n)
            t1 = time.perf_counter(); named.run(**f); tn.append(time.perf_counter() - t1)
            f = at(n)
            c1, t1 = _cpu(), time.perf_counter(); fixed.run(**f); tf.append(time.perf_counter() - t1)
            cf.append(_cpu() - c1)
            f = at(m)
            c1, t1 = _cpu(), time.perf_counter(); fresh.run(**f); tw.append(time.perf_counter() - t1)
            cw.append(_cpu() - c1)
        mn, mf, mw = statistics.median(tn), statistics.median(tf), statistics.median(tw)
        mcf, mcw = statistics.median(cf), statistics.median(cw)
        print(f"{n:>6} {mn * 1e6:>10.1f} {mf * 1e6:>10.1f} {mn / mf:>6.2f} {mw * 1e6:>9.1f} {mw / mf:>10.2f} "
              f"{mcf * 1e6:>13.1f} {mcw * 1e6:>8.1f} {mcw / mcf:>10.2f}  ({diff:.1e})")


if __name__ == "__main__":
    main()
