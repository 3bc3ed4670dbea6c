"""What an eager call costs beyond its kernel, with warm caches and right after a large kernel.

The bench's 1-thread rows of about 0.3 ms (sum(-1), sum(0)) run each call after another
library's call that streamed 16-32 MB through the caches, so the Python of an eager call runs
on cold caches.  This times small calls (an (8, 1024) f32 input: the kernel is a few us) of
lazycandle, torch and NumPy, each either right after the same call (warm) or right after an `a + b` over
32 MB arrays (cold), in one rotating loop, 1 thread:

    python -m bench.eager_overhead

"building the node" is `x.sum(-1)` without realizing it; "compiled program" is the same sum as
an lc.compile'd Program's run."""
from __future__ import annotations

import os
import time

from bench.peers import fair_env_missing

os.environ.update(fair_env_missing())

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402


def main(repeats: int = 41) -> None:
    lc.set_num_threads(1)
    big, big2 = np.ones(1 << 23, np.float32), np.ones(1 << 23, np.float32)
    out = np.empty_like(big)
    x = np.ones((8, 1024), np.float32)
    lx = lc.from_dlpack(x)
    prog = lc.compile([lc.placeholder("x", x.shape).sum(-1)])
    fns = {"lazycandle x.sum(-1).numpy()": lambda: lx.sum(-1).numpy(),
           "building the node": lambda: lx.sum(-1),
           "compiled program": lambda: prog.run(x=x),
           "numpy x.sum(-1)": lambda: x.sum(-1)}
    try:
        import torch
        torch.set_num_threads(1)
        tx = torch.from_numpy(x)
        fns["torch x.sum(-1)"] = lambda: tx.sum(-1)
    except ImportError:
        pass
    times = {(k, mode): [] for k in fns for mode in ("warm", "cold")}
    for f in fns.values():
        f()
    for _ in range(repeats):
        for mode in ("warm", "cold"):
            for k, f in fns.items():
                if mode == "cold":
                    np.add(big, big2, out=out)
                else:
                    f()                     # the same call just before: its caches are warm
                t0 = time.perf_counter()
                f()
                times[k, mode].append(time.perf_counter() - t0)
    print(f"eager call costs, (8, 1024) f32, 1 thread, median of {repeats}, load {os.getloadavg()[0]:.1f}")
    for k in fns:
        warm, cold = (np.median(times[k, m]) * 1e6 for m in ("warm", "cold"))
        print(f"  {k:30s} warm {warm:7.1f} us   after 96 MB streamed {cold:7.1f} us")


if __name__ == "__main__":
    main()
