"""Attention backward benchmark: the gradients of sum(sdpa(q, k, v) * w) with respect to q, k, v
as one compiled lazycandle program (forward, log-sum-exp pass and the fused flash-attention
backward), against the same program through the graph version (`_graph_sdpa`: matmul, softmax,
matmul and their gradients, the (b, h, L, S) scores written), and torch's F.sdpa forward +
backward (when installed) and its backward alone (retain_graph).  f32, causal by default;
implementations alternate inside one loop (bench/timing.py), the median of >= 9 runs after a
warm-up; the load average is printed because the machine is shared.  --cpu times the CPU
seconds of the calling thread instead (one thread everywhere), which a loaded machine disturbs
far less than wall time.

    python -m bench.sdpa_backward [--shape 8 4 128 64] [--threads 2] [--no-causal] [--cpu]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import lazycandle as lc
from bench.peers import load_peers, threads
from bench.timing import round_orders, time_alternating
from lazycandle.nn_attention import _graph_sdpa


def lc_program(shape, causal, fused: bool):
    """The compiled gradient program of one sdpa version."""
    ph = [lc.placeholder(n, shape) for n in ("q", "k", "v", "w")]
    scale = 1.0 / np.sqrt(shape[-1])

    def loss(q, k, v):
        out = (lc.nn.scaled_dot_product_attention(q, k, v, is_causal=causal) if fused
               else _graph_sdpa(q, k, v, None, causal, scale))
        return (out * ph[3]).sum()
    return lc.compile(list(lc.grad(loss, (0, 1, 2))(*ph[:3])))


def cases(feeds, causal, mods) -> dict:
    shape = feeds["q"].shape
    fused, graph = lc_program(shape, causal, True), lc_program(shape, causal, False)
    fns = {"lc fused": lambda: fused.run(**feeds), "lc graph": lambda: graph.run(**feeds)}
    if "torch" in mods:
        torch = mods["torch"]
        sdpa = torch.nn.functional.scaled_dot_product_attention
        tw = torch.from_numpy(feeds["w"])

        def fwd():
            ts = [torch.tensor(feeds[n], requires_grad=True) for n in ("q", "k", "v")]
            return ts, (sdpa(*ts, is_causal=causal) * tw).sum()

        def torch_both():
            ts, loss = fwd()
            loss.backward()
            return [t.grad for t in ts]
        held = {}

        def torch_backward():
            if "loss" not in held:
                held["ts"], held["loss"] = fwd()
            for t in held["ts"]:
                t.grad = None
            held["loss"].backward(retain_graph=True)
        fns["torch fwd+bwd"] = torch_both
        fns["torch bwd only"] = torch_backward
    return fns


def check(feeds, causal, mods):
    """The fused gradients against the graph version's (and torch's)."""
    shape = feeds["q"].shape
    got = lc_program(shape, causal, True).run(**feeds)
    want = lc_program(shape, causal, False).run(**feeds)
    for g, w in zip(got, want):
        assert np.allclose(g, w, atol=1e-4), np.abs(g - w).max()
    if "torch" in mods:
        torch = mods["torch"]
        ts = [torch.tensor(feeds[n], requires_grad=True) for n in ("q", "k", "v")]
        out = torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=causal)
        (out * torch.from_numpy(feeds["w"])).sum().backward()
        for g, t in zip(got, ts):
            assert np.allclose(g, t.grad.numpy(), atol=1e-4), np.abs(g - t.grad.numpy()).max()


def cpu_alternating(fns: dict, repeats: int) -> dict:
    """name -> CPU seconds of the calling thread per call (after two warm-up rounds), the
    implementations interleaved in the orders bench/timing.round_orders gives."""
    names, times = list(fns), {k: [] for k in fns}
    for _ in range(2):
        for k in names:
            fns[k]()
    orders = round_orders(names)
    for r in range(repeats):
        for k in orders[r % len(orders)]:
            t = time.thread_time()
            fns[k]()
            times[k].append(time.thread_time() - t)
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=int, nargs=4, default=(8, 4, 128, 64), metavar=("B", "H", "L", "E"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="CPU time of the calling thread, one thread")
    args = ap.parse_args(argv)
    if args.cpu:
        args.threads = 1
    causal = not args.no_causal
    mods, notes = load_peers(("torch",))
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(tuple(args.shape)).astype(np.float32) for n in ("q", "k", "v", "w")}
    with threads(args.threads, mods):
        check(feeds, causal, mods)
        print(f"sdpa backward {tuple(args.shape)} f32{' causal' if causal else ''}, {args.threads} threads, "
              f"load average before {os.getloadavg()[0]:.2f}")
        for n in notes:
            print(f"  note: {n}")
        if args.cpu:
            times = cpu_alternating(cases(feeds, causal, mods), args.repeats)
        else:
            stats = time_alternating(cases(feeds, causal, mods), repeats=args.repeats, warmup=2)
    if args.cpu:
        mine = statistics.median(times["lc fused"])
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:16s} CPU median {med * 1e3:8.2f} ms  (min {min(ts) * 1e3:7.2f}, n {len(ts)})  "
                  f"this / lc fused = {med / mine:5.2f}x")
        print(f"load average after {os.getloadavg()[0]:.2f}")
        return
    mine = stats["lc fused"].median
    for name, s in stats.items():
        print(f"  {name:16s} median {s.median * 1e3:8.2f} ms  (min {s.min * 1e3:7.2f}, max {s.max * 1e3:7.2f}, "
              f"n {s.n})  this / lc fused = {s.median / mine:5.2f}x")
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
