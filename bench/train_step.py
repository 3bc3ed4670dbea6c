"""One training step of an MLP (forward, cross-entropy, backward, AdamW) compiled into ONE
lazycandle program, and its timing:

    python bench/train_step.py [--batch 256] [--sizes 784,512,512,10] [--threads 1,2] [--runs 20]

prints the median ms per step for each thread count, the number of kernels in the step's
program and the number of ops in its graph (fusion across forward and backward shows as
kernels << ops).  torch eager / JAX jit(value_and_grad) on the same step: not written yet
(neither is installed here); the script says so.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import lazycandle as lc

B1, B2, EPS, WD = 0.9, 0.999, 1e-8, 0.01


def mlp_loss(params, x, onehot):
    h = x
    for i in range(0, len(params), 2):
        h = lc.nn.linear(h, params[i], params[i + 1])
        if i + 2 < len(params):
            h = h.relu()
    z = h
    zmax = z.max_keepdim(1)
    with lc.no_grad():
        zmax = zmax * 1.0
    lse = z.broadcast_sub(zmax).exp().sum_keepdim(1).log() + zmax
    return (lse.broadcast_sub(z) * onehot).sum_all() * (1.0 / x.shape[0])


def train_step(params, ms, vs, x, onehot, lr, t):
    """Functional AdamW step (candle-nn's update) on gradients from lc.value_and_grad."""
    loss, grads = lc.value_and_grad(lambda *p: mlp_loss(list(p), x, onehot), tuple(range(len(params))))(*params)
    out_p, out_m, out_v = [], [], []
    sm, sv = 1 / (1 - B1 ** t), 1 / (1 - B2 ** t)
    for p, m, v, g in zip(params, ms, vs, grads):
        m = m * B1 + g * (1 - B1)
        v = v * B2 + g.sqr() * (1 - B2)
        out_p.append(p * (1 - lr * WD) - (m * sm) * lr / ((v * sv).sqrt() + EPS))
        out_m.append(m)
        out_v.append(v)
    return [loss] + out_p + out_m + out_v


def build(sizes, batch):
    shapes = []
    for i, o in zip(sizes, sizes[1:]):
        shapes += [(o, i), (o,)]
    ph = lambda pre: [lc.placeholder(f"{pre}{k}", s) for k, s in enumerate(shapes)]  # noqa: E731
    params, ms, vs = ph("p"), ph("m"), ph("v")
    x, onehot = lc.placeholder("x", (batch, sizes[0])), lc.placeholder("y", (batch, sizes[-1]))
    outs = train_step(params, ms, vs, x, onehot, lr=1e-3, t=1)
    return lc.compile(outs), shapes, outs


def count_ops(outs) -> int:
    seen, stack, n = set(), [t._node for t in outs], 0
    while stack:
        node = stack.pop()
        if node.id in seen:
            continue
        seen.add(node.id)
        n += node.op.category not in ("source", "view")
        stack.extend(node.srcs)
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sizes", default="784,512,512,10")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    prog, shapes, outs = build(sizes, a.batch)
    rng = np.random.default_rng(0)
    feeds = {f"p{k}": (rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32) for k, s in enumerate(shapes)}
    feeds.update({f"{pre}{k}": np.zeros(s, np.float32) for pre in "mv" for k, s in enumerate(shapes)})
    feeds["x"] = rng.standard_normal((a.batch, sizes[0])).astype(np.float32)
    feeds["y"] = np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], a.batch)]
    print(f"MLP {a.sizes} batch {a.batch}: {len(prog._fixed.plan.kernels)} kernels per step, "
          f"{count_ops(outs)} ops in the step's graph")
    for nt in (int(t) for t in a.threads.split(",")):
        lc.set_num_threads(nt)
        prog.run(**feeds)
        times = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            prog.run(**feeds)
            times.append(time.perf_counter() - t0)
        print(f"lazycandle compiled step, {nt} thread(s): median {statistics.median(times) * 1e3:.2f} ms "
              f"(min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}, {a.runs} runs)")
    for peer in ("torch", "jax"):
        if importlib.util.find_spec(peer) is None:
            print(f"{peer}: not importable here (no comparison)")
        else:
            print(f"{peer}: importable, but its step is not written yet")


if __name__ == "__main__":
    main()
