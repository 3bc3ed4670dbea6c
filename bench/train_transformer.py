"""Training steps (forward, loss, backward, AdamW) of issue 42's must-show models, lazycandle's
whole step compiled into ONE program (value_and_grad + AdamW.update under lc.compile) against
torch eager and torch.compile (inductor: the loss compiled with its backward, the AdamW step
compiled too), same init and data:

    python bench/train_transformer.py [--cases block,gpt2,mlp] [--runs 11] [--threads 2] [--check 20] [--cpu]
                                      [--profile]

Cases: `block` a GPT-2 block (8, 128, 256), 4 heads, causal, mse loss against a fixed target;
`gpt2` a 4-layer GPT-2 (d 256, 4 heads, seq 128, batch 8, vocab 4096, tied head, cross-entropy);
`mlp` the MLP 784-512-512-10 at batch 256.  Attention is scaled_dot_product_attention with
is_causal on both sides (each library's fused kernel).  First `--check` steps of every
implementation from the same start: the largest loss difference against torch eager (must be
<= 1e-5) and the first step's time (lazycandle: compile + run; torch.compile: its compile).
Then the median of `--runs` steps after 2 warm-up steps, implementations alternating in one loop
(bench/timing.py), the ratios, kernels per step against ops per step, and the load; --cpu: one
thread everywhere and the CPU time of the calling thread, which a loaded machine disturbs less; --profile:
lazycandle's step time per kernel kind (matmul, attention, row, ...) from Program.profile.  torch runs
with OMP_WAIT_POLICY=PASSIVE unless the environment sets it (spinning OpenMP waits made its steps
5-10x slower on a shared host).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import lazycandle as lc
from bench.sdpa_backward import cpu_alternating
from bench.timing import Stats, time_alternating
from bench.train_step import count_ops

LR, BETAS, EPS, WD, LN_EPS = 1e-3, (0.9, 0.999), 1e-8, 0.01, 1e-5


# ---- the models, written once over a tiny "ops" namespace per library ----------------------
class LcOps:
    linear = staticmethod(lc.nn.linear)
    layer_norm = staticmethod(lambda x, g, b: lc.nn.layer_norm(x, g, b, LN_EPS))
    gelu = staticmethod(lambda x: x.gelu())
    relu = staticmethod(lambda x: x.relu())
    sdpa = staticmethod(lambda q, k, v: lc.nn.scaled_dot_product_attention(q, k, v, is_causal=True))
    heads = staticmethod(lambda z, b, t, h: z.reshape((b, t, h, z.shape[-1] // h)).transpose(1, 2))
    merge = staticmethod(lambda z, b, t: z.transpose(1, 2).reshape((b, t, z.shape[1] * z.shape[3])))
    embed = staticmethod(lambda ids, table: lc.nn.embedding(ids, table))
    cross_entropy = staticmethod(lambda logits, y: lc.nn.cross_entropy(logits, y))
    mse = staticmethod(lambda a, b: lc.nn.mse_loss(a, b))
    tied_head = staticmethod(lambda x, wte: lc.nn.linear(x, wte))


def torch_ops(torch):
    F = torch.nn.functional

    class T:
        linear = staticmethod(F.linear)
        layer_norm = staticmethod(lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b, LN_EPS))
        gelu = staticmethod(lambda x: F.gelu(x, approximate="tanh"))
        relu = staticmethod(F.relu)
        sdpa = staticmethod(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
        heads = staticmethod(lambda z, b, t, h: z.reshape(b, t, h, z.shape[-1] // h).transpose(1, 2))
        merge = staticmethod(lambda z, b, t: z.transpose(1, 2).reshape(b, t, z.shape[1] * z.shape[3]))
        embed = staticmethod(F.embedding)
        cross_entropy = staticmethod(lambda logits, y: F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                                       y.reshape(-1)))
        mse = staticmethod(F.mse_loss)
        tied_head = staticmethod(lambda x, wte: F.linear(x, wte))
    return T


def block(o, x, p, pre, n_head):
    b, t, _ = x.shape
    h = o.linear(o.layer_norm(x, p[pre + "ln1_g"], p[pre + "ln1_b"]), p[pre + "w_qkv"], p[pre + "b_qkv"])
    q, k, v = (o.heads(z, b, t, n_head) for z in h.chunk(3, -1))
    y = o.merge(o.sdpa(q, k, v), b, t)
    x = x + o.linear(y, p[pre + "w_proj"], p[pre + "b_proj"])
    h = o.gelu(o.linear(o.layer_norm(x, p[pre + "ln2_g"], p[pre + "ln2_b"]), p[pre + "w_fc"], p[pre + "b_fc"]))
    return x + o.linear(h, p[pre + "w_out"], p[pre + "b_out"])


def block_loss(o, p, d):
    return o.mse(block(o, d["x"], p, "", 4), d["target"])


def gpt2_loss(o, p, d):
    x = o.embed(d["ids"], p["wte"]) + p["wpe"]
    for i in range(4):
        x = block(o, x, p, f"h{i}.", 4)
    return o.cross_entropy(o.tied_head(o.layer_norm(x, p["lnf_g"], p["lnf_b"]), p["wte"]), d["y"])


def mlp_loss(o, p, d):
    h = d["x"]
    for i in range(3):
        h = o.linear(h, p[f"w{i}"], p[f"b{i}"])
        h = o.relu(h) if i < 2 else h
    return o.cross_entropy(h, d["y"])


# ---- parameters and data -------------------------------------------------------------------
def block_shapes(d, pre=""):
    return {pre + "ln1_g": (d,), pre + "ln1_b": (d,), pre + "w_qkv": (3 * d, d), pre + "b_qkv": (3 * d,),
            pre + "w_proj": (d, d), pre + "b_proj": (d,), pre + "ln2_g": (d,), pre + "ln2_b": (d,),
            pre + "w_fc": (4 * d, d), pre + "b_fc": (4 * d,), pre + "w_out": (d, 4 * d), pre + "b_out": (d,)}


def init(shapes, rng):
    out = {}
    for name, s in shapes.items():
        if name.endswith("_g"):
            out[name] = (1 + 0.1 * rng.standard_normal(s)).astype(np.float32)
        elif name[0] == "w" and len(s) == 2 and name not in ("wte", "wpe"):
            out[name] = (rng.standard_normal(s) / math.sqrt(s[1])).astype(np.float32)
        else:
            out[name] = (0.02 * rng.standard_normal(s)).astype(np.float32)
    return out


def case(name):
    """(loss fn, param arrays, data arrays, label)."""
    rng = np.random.default_rng(0)
    if name == "block":
        b, t, d = 8, 128, 256
        data = {"x": rng.standard_normal((b, t, d)).astype(np.float32),
                "target": rng.standard_normal((b, t, d)).astype(np.float32)}
        return block_loss, init(block_shapes(d), rng), data, "GPT-2 block (8, 128, 256), 4 heads, causal"
    if name == "gpt2":
        b, t, d, vocab = 8, 128, 256, 4096
        shapes = {"wte": (vocab, d), "wpe": (t, d), "lnf_g": (d,), "lnf_b": (d,)}
        for i in range(4):
            shapes.update(block_shapes(d, f"h{i}."))
        ids = rng.integers(0, vocab, (b, t + 1))
        data = {"ids": ids[:, :-1].astype(np.int64), "y": ids[:, 1:].astype(np.int64)}
        return gpt2_loss, init(shapes, rng), data, "GPT-2 4 layers, d 256, 4 heads, seq 128, batch 8, vocab 4096, tied"
    if name == "mlp":
        sizes = (784, 512, 512, 10)
        shapes = {}
        for i, (a, c) in enumerate(zip(sizes, sizes[1:])):
            shapes[f"w{i}"], shapes[f"b{i}"] = (c, a), (c,)
        data = {"x": rng.standard_normal((256, 784)).astype(np.float32),
                "y": rng.integers(0, 10, 256).astype(np.int64)}
        return mlp_loss, init(shapes, rng), data, "MLP 784-512-512-10, batch 256"
    raise ValueError(name)


# ---- the implementations -------------------------------------------------------------------
class LcTrainer:
    """The whole step as one compiled program; parameters and AdamW state carried run to run."""

    def __init__(self, loss_fn, params, data):
        names = list(params)
        opt = lc.optim.AdamW(lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        ps = [lc.placeholder(n, params[n].shape) for n in names]
        state0 = opt.init(ps)
        ss = [lc.placeholder(f"s{k}", t.shape, t.dtype) for k, t in enumerate(state0)]
        ds = {k: lc.placeholder(k, v.shape, lc.i64 if v.dtype == np.int64 else lc.f32)
              for k, v in data.items()}

        def loss(*p):
            return loss_fn(LcOps, dict(zip(names, p)), ds)
        val, grads = lc.value_and_grad(loss, tuple(range(len(names))))(*ps)
        new_p, new_s = opt.update(ps, grads, ss)
        self.outs = [val, *new_p, *new_s]
        self.names, self.n_state = names, len(ss)
        self.feeds = {n: params[n].copy() for n in names}
        self.feeds.update({f"s{k}": t.numpy() for k, t in enumerate(opt.init([lc.tensor(params[n]) for n in names]))})
        self.feeds.update(data)
        self.prog, self.loss = None, None

    def __call__(self):
        if self.prog is None:
            self.prog = lc.compile(self.outs)
        out = self.prog.run(**self.feeds)
        self.loss = float(out[0])
        for k, n in enumerate(self.names):
            self.feeds[n] = out[1 + k]
        for k in range(self.n_state):
            self.feeds[f"s{k}"] = out[1 + len(self.names) + k]


class TorchTrainer:
    """torch eager, or torch.compile'd loss (AOTAutograd compiles its backward) and AdamW step."""

    def __init__(self, torch, loss_fn, params, data, compiled):
        self.ps = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
        self.data = {k: torch.from_numpy(v) for k, v in data.items()}
        self.opt = torch.optim.AdamW(list(self.ps.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
        o = torch_ops(torch)
        fn = lambda p, d: loss_fn(o, p, d)   # noqa: E731
        self.fn = torch.compile(fn) if compiled else fn
        self.opt_step = torch.compile(self.opt.step) if compiled else self.opt.step
        self.loss = None

    def __call__(self):
        loss = self.fn(self.ps, self.data)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt_step()
        self.loss = float(loss.detach())


def kind_shares(prog, feeds, runs=3) -> str:
    """Where lazycandle's step goes, from Program.profile (kernels called one by one, after one
    profiled warm-up run: the first allocates the per-kernel buffers): time per kernel kind."""
    prog.profile(runs=1, **feeds)
    per, count = {}, {}
    for line in prog.profile(runs=runs, **feeds).splitlines():
        f = line.split()
        if len(f) > 3 and f[0].isdigit():
            kind = "attention" if "flash_attention" in f[-1] else f[1]
            per[kind] = per.get(kind, 0.0) + float(f[2]) * 1e-3
            count[kind] = count.get(kind, 0) + 1
    total = sum(per.values()) or 1e-12
    return f"profile {total:.1f} ms: " + ", ".join(
        f"{k} {v:.1f} ms ({v / total:.0%}, {count[k]} kernels)" for k, v in sorted(per.items(), key=lambda kv: -kv[1]))


def run_case(name, a, torch):
    loss_fn, params, data, label = case(name)
    impls = {"lazycandle": LcTrainer(loss_fn, params, data)}
    if torch is not None:
        impls["torch eager"] = TorchTrainer(torch, loss_fn, params, data, compiled=False)
        impls["torch.compile"] = TorchTrainer(torch, loss_fn, params, data, compiled=True)
    first, losses = {}, {}
    for k, impl in impls.items():           # the first `check` steps, one implementation at a time
        t0 = time.perf_counter()
        impl()
        first[k] = time.perf_counter() - t0
        losses[k] = [impl.loss]
        for _ in range(a.check - 1):
            impl()
            losses[k].append(impl.loss)
    ref = np.array(losses.get("torch eager", losses["lazycandle"]))
    lcp = impls["lazycandle"]
    print(f"\n{label}: {len(lcp.prog._fixed.plan.kernels)} kernels per step, {count_ops(lcp.outs)} ops "
          f"in the step's graph; load {os.getloadavg()[0]:.2f}")
    for k in impls:
        diff = np.abs(np.array(losses[k]) - ref).max()
        print(f"  {k:14s} first step {first[k] * 1e3:9.1f} ms; loss {losses[k][0]:.6f} -> {losses[k][-1]:.6f} "
              f"after {a.check} steps, max |diff| vs torch eager {diff:.2e}")
    if a.profile:
        print("  " + kind_shares(lcp.prog, lcp.feeds))
    if a.cpu:
        stats = {k: Stats(times=v) for k, v in cpu_alternating(impls, a.runs).items()}
    else:
        stats = time_alternating(impls, repeats=a.runs, warmup=2)
    what = "CPU time of the calling thread" if a.cpu else "wall time"
    for k, s in stats.items():
        print(f"  {k:14s} median {s.median * 1e3:8.2f} ms  (min {s.min * 1e3:7.2f}, max {s.max * 1e3:7.2f}, "
              f"n={s.n}; {what})")
    lc_s = stats["lazycandle"].median
    for k in stats:
        if k != "lazycandle":
            print(f"  {k} / lazycandle = {stats[k].median / lc_s:.2f}x")
    print(f"  load after: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    return stats


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="block,gpt2,mlp")
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--check", type=int, default=20)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="one thread, CPU time of the calling thread (what a "
                    "loaded machine disturbs least) instead of wall time")
    ap.add_argument("--profile", action="store_true", help="also lazycandle's step time per kernel kind "
                    "(Program.profile)")
    a = ap.parse_args(argv)
    if a.cpu:
        a.threads = 1
    lc.set_num_threads(a.threads)
    # torch's OpenMP threads spin while waiting by default: on a shared host (other processes on
    # the cores) that made its steps 5-10x slower and erratic; passive waiting is the fair setting
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch = None
    if not a.no_torch:
        try:
            import torch
            torch.set_num_threads(a.threads)
        except ImportError:
            print("torch: not importable (lazycandle only)")
    for name in a.cases.split(","):
        run_case(name, a, torch)


if __name__ == "__main__":
    main()
