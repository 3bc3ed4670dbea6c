"""Row kernels (issue 10 item 1): softmax, log_softmax, layer_norm and rms_norm over the last dim
of a (4096, 1024) f32 array, lazycandle (one row kernel each) against NumPy and, when
importable (PYTHONPATH=/work/peers), torch, at 1 and 2 threads.

    PYTHONPATH=/work/peers python -m bench.row_kernels [--rows 4096] [--cols 1024] [--repeats 9]

Every implementation of a case is timed in the same rotating loop (bench/timing.py), median of
`repeats` after a warm-up; the load average is printed with each thread count.  Like `lazycandle
bench`, it runs with the peers' idle threads set to sleep (bench/peers.py FAIR_ENV, set before
NumPy or torch load), so that an idle peer thread cannot hold a core the next timed call needs and
the figures compare with that table's."""
from __future__ import annotations

import argparse
import os

from bench.peers import fair_env_missing

os.environ.update(fair_env_missing())

import numpy as np  # noqa: E402  (after the environment: OpenBLAS and OpenMP read it on load)

import lazycandle as lc  # noqa: E402
from bench.timing import time_alternating  # noqa: E402

EPS = 1e-5


def _numpy_cases(x, g, b):
    def softmax():
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def log_softmax():
        s = x - x.max(-1, keepdims=True)
        return s - np.log(np.exp(s).sum(-1, keepdims=True))

    def layer_norm():
        xc = x - x.mean(-1, keepdims=True)
        return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + EPS) * g + b

    def rms_norm():
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g
    return {"softmax": softmax, "log_softmax": log_softmax, "layer_norm": layer_norm, "rms_norm": rms_norm}


def _lc_cases(x, g, b):
    t, tg, tb = lc.tensor(x), lc.tensor(g), lc.tensor(b)
    return {"softmax": lambda: lc.nn.softmax(t, -1).numpy(),
            "log_softmax": lambda: lc.nn.log_softmax(t, -1).numpy(),
            "layer_norm": lambda: lc.nn.layer_norm(t, tg, tb, EPS).numpy(),
            "rms_norm": lambda: lc.nn.rms_norm(t, tg, EPS).numpy()}


def _torch_cases(x, g, b):
    try:
        import torch
    except ImportError:
        return None, {}
    t, tg, tb = torch.from_numpy(x), torch.from_numpy(g), torch.from_numpy(b)
    F = torch.nn.functional
    n = x.shape[-1]
    return torch, {"softmax": lambda: F.softmax(t, -1),
                   "log_softmax": lambda: F.log_softmax(t, -1),
                   "layer_norm": lambda: F.layer_norm(t, (n,), tg, tb, EPS),
                   "rms_norm": lambda: F.rms_norm(t, (n,), tg, EPS)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.rows, a.cols)).astype(np.float32)
    g = rng.uniform(0.5, 1.5, a.cols).astype(np.float32)
    b = rng.standard_normal(a.cols).astype(np.float32)
    impls = {"lazycandle": _lc_cases(x, g, b), "numpy": _numpy_cases(x, g, b)}
    torch, tc = _torch_cases(x, g, b)
    if tc:
        impls["torch"] = tc
    names = list(impls)
    print(f"row kernels, ({a.rows}, {a.cols}) f32, median of {a.repeats} ms (min-max); "
          f"x best peer = best peer time / lazycandle time")
    print(f"{'case':<12} {'thr':>3} " + " ".join(f"{n:>22}" for n in names) + "  x best peer")
    for threads in (1, 2):
        lc.set_num_threads(threads)
        if torch is not None:
            torch.set_num_threads(threads)
        print(f"-- {threads} thread(s), load average {os.getloadavg()[0]:.2f}")
        for case in impls["lazycandle"]:
            stats = time_alternating({n: impls[n][case] for n in names}, repeats=a.repeats)
            cells = [f"{s.median * 1e3:7.3f} ({s.min * 1e3:.2f}-{s.max * 1e3:.2f})" for s in stats.values()]
            best = min(stats[n].median for n in names if n != "lazycandle")
            print(f"{case:<12} {threads:>3} " + " ".join(f"{c:>22}" for c in cells) +
                  f"  {best / stats['lazycandle'].median:.2f}x")


if __name__ == "__main__":
    main()
