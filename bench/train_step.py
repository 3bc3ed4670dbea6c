"""One training step of an MLP (forward, cross-entropy, backward, AdamW) compiled into ONE
lazycandle program, against torch eager and JAX jit(value_and_grad) on the same step:

    PYTHONPATH=/work/peers python bench/train_step.py [--batch 256] [--sizes 784,512,512,10]
        [--threads 1,2] [--runs 15]

All implementations start from the same parameters and data and are timed in ONE loop, one
step each per round (bench/timing.py), each training on (its state carried from step to step);
prints the median ms per step, the ratio torch / lazycandle at each thread count, the number of
kernels in the step's program against the number of ops in its graph (fusion across forward,
backward and the update shows as kernels << ops), and the losses after the timed steps (they
must agree: the same step on the same data).  JAX runs at 2 threads only (XLA's pool is set when
jax starts, here by XLA_FLAGS).  torch / jax are benchmark peers only, imported here if present.
"""
from __future__ import annotations

import argparse
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import lazycandle as lc
from bench.timing import time_alternating

LR, B1, B2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 0.01


def mlp_loss(params, x, onehot):
    """Mean cross-entropy of the MLP's logits; params are (w, b) pairs in candle's (out, in) layout."""
    h = x
    for i in range(0, len(params), 2):
        h = lc.nn.linear(h, params[i], params[i + 1])
        if i + 2 < len(params):
            h = h.relu()
    return -(lc.nn.log_softmax(h, 1) * onehot).sum_all() * (1.0 / x.shape[0])


def train_step(opt, params, state, x, onehot):
    """Forward, backward and the optimizer update, traced: returns [loss, *params, *state]."""
    n = len(params)
    loss, grads = lc.value_and_grad(lambda *p: mlp_loss(list(p), x, onehot), tuple(range(n)))(*params)
    new_p, new_s = opt.update(params, grads, state)
    return [loss, *new_p, *new_s]


def param_shapes(sizes):
    shapes = []
    for i, o in zip(sizes, sizes[1:]):
        shapes += [(o, i), (o,)]
    return shapes


def build(sizes, batch):
    """The compiled step (placeholders p*, s*, x, y), the parameter shapes and the step's outputs."""
    shapes = param_shapes(sizes)
    opt = lc.optim.AdamW(lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
    params = [lc.placeholder(f"p{k}", s) for k, s in enumerate(shapes)]
    state = [lc.placeholder(f"s{k}", t.shape, t.dtype) for k, t in enumerate(opt.init(params))]
    x, onehot = lc.placeholder("x", (batch, sizes[0])), lc.placeholder("y", (batch, sizes[-1]))
    outs = train_step(opt, params, state, x, onehot)
    return lc.compile(outs), shapes, outs


def count_ops(outs) -> int:
    """Computing ops in the graph behind `outs` (sources and views are not work)."""
    seen, stack, n = set(), [t._node for t in outs], 0
    while stack:
        node = stack.pop()
        if node.id in seen:
            continue
        seen.add(node.id)
        n += node.op.category not in ("source", "view")
        stack.extend(node.srcs)
    return n


def init_data(sizes, batch, seed=0):
    rng = np.random.default_rng(seed)
    params = [(rng.standard_normal(s) / np.sqrt(s[-1])).astype(np.float32) for s in param_shapes(sizes)]
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    labels = rng.integers(0, sizes[-1], batch)
    return params, x, labels


class LcStep:
    """The compiled lazycandle step, its state carried from run to run."""

    def __init__(self, prog, params, x, labels, n_classes):
        self.prog, self.n = prog, len(params)
        opt = lc.optim.AdamW()
        self.feeds = {f"p{k}": p.copy() for k, p in enumerate(params)}
        self.feeds.update({f"s{k}": t.numpy() for k, t in enumerate(opt.init([lc.tensor(p) for p in params]))})
        self.feeds["x"], self.feeds["y"] = x, np.eye(n_classes, dtype=np.float32)[labels]
        self.loss = None

    def __call__(self):
        out = self.prog.run(**self.feeds)
        self.loss = float(out[0])
        for k in range(self.n):
            self.feeds[f"p{k}"] = out[1 + k]
        for k, s in enumerate(out[1 + self.n:]):
            self.feeds[f"s{k}"] = s


def torch_step(torch, params, x, labels):
    """torch eager: the same MLP, F.cross_entropy and torch.optim.AdamW (the same update)."""
    F = torch.nn.functional
    ps = [torch.tensor(p, requires_grad=True) for p in params]
    tx, ty = torch.from_numpy(x), torch.from_numpy(labels)
    opt = torch.optim.AdamW(ps, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
    box = {}

    def step():
        h = tx
        for i in range(0, len(ps), 2):
            h = F.linear(h, ps[i], ps[i + 1])
            if i + 2 < len(ps):
                h = h.relu()
        loss = F.cross_entropy(h, ty)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        box["loss"] = float(loss.detach())
    return step, box


def jax_step(jax, params, x, labels, n_classes):
    """JAX: jit of value_and_grad plus the same AdamW update, state carried between calls."""
    jnp = jax.numpy

    def loss_fn(ps, x, y):
        h = x
        for i in range(0, len(ps), 2):
            h = h @ ps[i].T + ps[i + 1]
            if i + 2 < len(ps):
                h = jax.nn.relu(h)
        return -(jax.nn.log_softmax(h, 1) * y).sum() / x.shape[0]

    @jax.jit
    def step(ps, ms, vs, t, x, y):
        loss, gs = jax.value_and_grad(loss_fn)(ps, x, y)
        t = t + 1.0
        ms = [m * B1 + g * (1 - B1) for m, g in zip(ms, gs)]
        vs = [v * B2 + g * g * (1 - B2) for v, g in zip(vs, gs)]
        lr_m, sv = LR / (1 - B1 ** t), 1 / (1 - B2 ** t)
        ps = [p * (1 - LR * WD) - m * lr_m / (jnp.sqrt(v * sv) + EPS) for p, m, v in zip(ps, ms, vs)]
        return loss, ps, ms, vs, t

    st = {"ps": [jnp.asarray(p) for p in params], "t": jnp.float32(0.0)}
    st["ms"] = [jnp.zeros_like(p) for p in st["ps"]]
    st["vs"] = [jnp.zeros_like(p) for p in st["ps"]]
    jx, jy = jnp.asarray(x), jnp.asarray(np.eye(n_classes, dtype=np.float32)[labels])
    box = {}

    def run():
        loss, st["ps"], st["ms"], st["vs"], st["t"] = step(st["ps"], st["ms"], st["vs"], st["t"], jx, jy)
        box["loss"] = float(loss.block_until_ready())
    return run, box


def _with_threads(fn, n, torch=None):
    def call():
        lc.set_num_threads(n)
        if torch is not None:
            torch.set_num_threads(n)
        fn()
    return call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sizes", default="784,512,512,10")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    threads = [int(t) for t in a.threads.split(",")]
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=2")
    prog, _, outs = build(sizes, a.batch)
    params, x, labels = init_data(sizes, a.batch)
    print(f"MLP {a.sizes} batch {a.batch}, forward + cross-entropy + backward + AdamW: "
          f"{len(prog._fixed.plan.kernels)} kernels per step, {count_ops(outs)} ops in the step's graph")
    fns, boxes = {}, {}
    for n in threads:
        step = LcStep(prog, params, x, labels, sizes[-1])
        fns[f"lazycandle {n}t"], boxes[f"lazycandle {n}t"] = _with_threads(step, n), step
    try:
        import torch
        for n in threads:
            step, box = torch_step(torch, params, x, labels)
            fns[f"torch eager {n}t"], boxes[f"torch eager {n}t"] = _with_threads(step, n, torch), box
    except ImportError as e:
        print(f"torch: not importable ({e}); run with PYTHONPATH=/work/peers")
    try:
        import jax
        jax.config.update("jax_platforms", "cpu")
        step, box = jax_step(jax, params, x, labels, sizes[-1])
        fns["jax jit 2t"], boxes["jax jit 2t"] = _with_threads(step, 2), box
    except ImportError as e:
        print(f"jax: not importable ({e}); run with PYTHONPATH=/work/peers")
    stats = time_alternating(fns, repeats=a.runs, warmup=2)
    for name, s in stats.items():
        box = boxes[name]
        loss = box.loss if isinstance(box, LcStep) else box.get("loss")
        print(f"{name:18s} median {s.median * 1e3:7.2f} ms  (min {s.min * 1e3:6.2f}, max {s.max * 1e3:6.2f}, "
              f"{s.n} runs; first {s.first * 1e3:8.1f} ms)  loss after {s.n + 2} steps {loss:.6f}")
    for n in threads:
        lc_s, t_s = stats.get(f"lazycandle {n}t"), stats.get(f"torch eager {n}t")
        if lc_s and t_s:
            print(f"{n} thread(s): torch eager / lazycandle = {t_s.median / lc_s.median:.2f}x")
    if "jax jit 2t" in stats and "lazycandle 2t" in stats:
        print(f"2 threads: jax jit / lazycandle = {stats['jax jit 2t'].median / stats['lazycandle 2t'].median:.2f}x")
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
