"""`python -m lazycandle.demo`: build a fused graph, check it against NumPy, print the schedule."""
from __future__ import annotations

import time

import numpy as np

import lazycandle as lc


def main() -> int:
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal((512, 1024), dtype=np.float32) for _ in range(3))
    ta, tb, tc = lc.tensor(a), lc.tensor(b), lc.tensor(c)
    y = ((ta * tb + tc).exp() - ta.t().t()).relu()   # five elementwise ops, one kernel
    print("graph as built:\n" + lc.dump(y, stage="graph"))
    print("\nschedule:\n" + lc.dump(y, stage="schedule"))
    t0 = time.perf_counter()
    got = y.numpy()
    dt = (time.perf_counter() - t0) * 1e3
    want = np.maximum(np.exp(a * b + c) - a, 0)
    ok = np.allclose(got, want, rtol=1e-5, atol=1e-5)
    print(f"\nrealized {got.shape} {y.dtype.name} in {dt:.2f} ms; matches NumPy: {ok}")
    s = lc.nn.softmax_last_dim(lc.tensor(a))
    e = np.exp(a - a.max(-1, keepdims=True))
    ok2 = np.allclose(s.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    print(f"softmax over the last dim matches NumPy: {ok2}")
    return 0 if ok and ok2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
