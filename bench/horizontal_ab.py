"""Horizontal fusion on vs off (ir/horizontal.py), in one process, alternating: issue 42's
training steps (bench/train_transformer.py's lazycandle trainer) and their AdamW update alone,
each compiled twice, once with ENABLED and once without:

    python bench/horizontal_ab.py [--cases block,gpt2,mlp] [--what step,update] [--runs 21] [--threads 2]

(LAZYCANDLE_EXEC=python: the per-kernel path, one ctypes call per kernel.)

Prints kernels per step and the median and min wall time of each, with the load."""
from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import lazycandle as lc
from lazycandle.ir import horizontal as H
from bench.timing import time_alternating
from bench.train_transformer import BETAS, EPS, LR, WD, LcTrainer, case


class UpdateOnly:
    """AdamW.update alone over the case's parameters (gradients are inputs)."""

    def __init__(self, params):
        opt = lc.optim.AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        ps = [lc.placeholder(n, v.shape) for n, v in params.items()]
        gs = [lc.placeholder("g_" + n, v.shape) for n, v in params.items()]
        ss = [lc.placeholder(f"s{k}", t.shape, t.dtype) for k, t in enumerate(opt.init(ps))]
        new_p, new_s = opt.update(ps, gs, ss)
        self.outs = [*new_p, *new_s]
        rng = np.random.default_rng(0)
        self.feeds = {n: v.copy() for n, v in params.items()}
        self.feeds.update({"g_" + n: rng.standard_normal(v.shape).astype(np.float32) for n, v in params.items()})
        self.feeds.update({f"s{k}": t.numpy() for k, t in enumerate(opt.init([lc.tensor(v) for v in params.values()]))})
        self.prog = None

    def __call__(self):
        if self.prog is None:
            self.prog = lc.compile(self.outs)
        self.prog.run(**self.feeds)


def _forget_plans():
    """Drop the cached plans (not the kernels: lc.clear_caches() between two compiles of the
    GPT-2 step makes the first one's matmul step crash at its next run, on main too)."""
    from lazycandle import caches
    for name in ("plans", "plan bindings", "eager plans"):
        caches._loaded_registry()[name][0].clear()


def built(make, enabled):
    """make() compiled (and run twice: the native program builds at the second run) with
    horizontal fusion `enabled`."""
    _forget_plans()
    H.ENABLED = enabled
    impl = make()
    impl()
    impl()
    H.ENABLED = True
    return impl


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="block,gpt2,mlp")
    ap.add_argument("--what", default="step,update")
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    lc.set_num_threads(a.threads)
    for name in a.cases.split(","):
        loss_fn, params, data, label = case(name)
        makers = {"step": lambda: LcTrainer(loss_fn, params, data), "update": lambda: UpdateOnly(params)}
        for what in a.what.split(","):
            make = makers[what]
            impls = {"horizontal": built(make, True), "per-kernel": built(make, False)}
            kernels = {k: len(v.prog._fixed.plan.kernels) for k, v in impls.items()}
            stats = time_alternating(impls, repeats=a.runs, warmup=2)
            print(f"{label} {what}: load {os.getloadavg()[0]:.2f}")
            for k, s in stats.items():
                print(f"  {k:11s} {kernels[k]:4d} kernels  median {s.median * 1e3:8.3f} ms (min {s.min * 1e3:8.3f})")
            print(f"  per-kernel / horizontal = {stats['per-kernel'].median / stats['horizontal'].median:.2f}x wall")


if __name__ == "__main__":
    main()
