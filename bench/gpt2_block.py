"""A GPT-2-small-shaped stack written the natural way (pre-norm residual blocks, causal
self-attention with 12 heads, tanh-gelu MLP), in lazycandle and in NumPy, and its timing:

    python bench/gpt2_block.py [--batch 1] [--seq 128] [--dim 768] [--heads 12] [--blocks 4]

prints the median ms of one forward pass for lazycandle eager (the graph rebuilt from realized
inputs each call), lazycandle compiled (`lc.compile` with placeholders, `Program.run`), NumPy
(float32) and torch (when importable), after a warm-up, the implementations rotating in one loop
(bench/timing.py), plus the machine's load.  tests/test_gpt2_stack.py runs the same model code
at small dims against a float64 NumPy reference.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

if __package__ in (None, ""):          # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import lazycandle as lc

PARAM_SHAPES = {  # per block, candle/torch layouts: linear weights are (out_features, in_features)
    "ln1_g": lambda d: (d,), "ln1_b": lambda d: (d,),
    "w_qkv": lambda d: (3 * d, d), "b_qkv": lambda d: (3 * d,),
    "w_proj": lambda d: (d, d), "b_proj": lambda d: (d,),
    "ln2_g": lambda d: (d,), "ln2_b": lambda d: (d,),
    "w_fc": lambda d: (4 * d, d), "b_fc": lambda d: (4 * d,),
    "w_out": lambda d: (d, 4 * d), "b_out": lambda d: (d,),
}
EPS = 1e-5


def init_params(d, n_blocks, seed=0):
    """One dict of float32 arrays per block (GPT-2's init scale: N(0, 0.02), gains near 1)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for _ in range(n_blocks):
        p = {}
        for name, shape in PARAM_SHAPES.items():
            s = shape(d)
            if name.endswith("_g"):
                p[name] = (1 + 0.1 * rng.standard_normal(s)).astype(np.float32)
            else:
                p[name] = (0.02 * rng.standard_normal(s)).astype(np.float32)
        blocks.append(p)
    return blocks


def causal_mask(seq):
    """Additive mask: 0 on and below the diagonal, -inf above."""
    return np.triu(np.full((seq, seq), -np.inf, np.float32), 1)


# ---- lazycandle ----------------------------------------------------------------------------
def attention(x, p, mask, n_head):
    b, t, d = x.shape
    hd = d // n_head
    q, k, v = lc.nn.linear(x, p["w_qkv"], p["b_qkv"]).chunk(3, -1)
    q, k, v = (z.reshape((b, t, n_head, hd)).transpose(1, 2) for z in (q, k, v))
    att = lc.nn.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + mask, -1)
    y = (att @ v).transpose(1, 2).reshape((b, t, d))
    return lc.nn.linear(y, p["w_proj"], p["b_proj"])


def mlp(x, p):
    return lc.nn.linear(lc.nn.linear(x, p["w_fc"], p["b_fc"]).gelu(), p["w_out"], p["b_out"])


def block(x, p, mask, n_head):
    x = x + attention(lc.nn.layer_norm(x, p["ln1_g"], p["ln1_b"], EPS), p, mask, n_head)
    return x + mlp(lc.nn.layer_norm(x, p["ln2_g"], p["ln2_b"], EPS), p)


def stack(x, blocks, mask, n_head):
    """The whole stack on lazycandle tensors (params: dicts of tensors, mask: (T, T) tensor)."""
    for p in blocks:
        x = block(x, p, mask, n_head)
    return x


def as_tensors(blocks):
    return [{k: lc.tensor(v) for k, v in p.items()} for p in blocks]


def as_placeholders(blocks):
    """Placeholders named `b{i}.{param}` (the feed names of `feeds`)."""
    return [{k: lc.placeholder(f"b{i}.{k}", v.shape, lc.f32) for k, v in p.items()} for i, p in enumerate(blocks)]


def feeds(blocks):
    return {f"b{i}.{k}": v for i, p in enumerate(blocks) for k, v in p.items()}


def block_program(seq, n_blocks=1, d=768, n_head=12):
    """(program, feeds) of the stack compiled on placeholders for x of (1, seq, d): the block
    program the dispatch, small-m GEMM and before/after benches time."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, seq, d)).astype(np.float32)
    blocks = init_params(d, n_blocks)
    xp = lc.placeholder("x", x.shape, lc.f32)
    prog = lc.compile([stack(xp, as_placeholders(blocks), lc.tensor(causal_mask(seq)), n_head)])
    return prog, dict(feeds(blocks), x=x)


# ---- NumPy ---------------------------------------------------------------------------------
def _np_layer_norm(x, g, b):
    mu = x.mean(-1, keepdims=True)
    xc = x - mu
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + EPS) * g + b


def _np_gelu(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def _np_softmax(x):
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def np_stack(x, blocks, mask, n_head):
    """The same stack in NumPy, in the dtype of x (float64 for the reference)."""
    b, t, d = x.shape
    hd = d // n_head
    for p in blocks:
        p = {k: v.astype(x.dtype) for k, v in p.items()}
        h = _np_layer_norm(x, p["ln1_g"], p["ln1_b"]) @ p["w_qkv"].T + p["b_qkv"]
        # contiguous heads: NumPy's stacked matmul uses BLAS only for (transposed-)contiguous operands
        q, k, v = (np.ascontiguousarray(z.reshape(b, t, n_head, hd).transpose(0, 2, 1, 3)) for z in np.split(h, 3, -1))
        att = _np_softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + mask.astype(x.dtype))
        y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + y @ p["w_proj"].T + p["b_proj"]
        h = _np_gelu(_np_layer_norm(x, p["ln2_g"], p["ln2_b"]) @ p["w_fc"].T + p["b_fc"])
        x = x + h @ p["w_out"].T + p["b_out"]
    return x


# ---- timing --------------------------------------------------------------------------------
def main(argv=None):
    from bench.timing import time_alternating
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=9)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((a.batch, a.seq, a.dim)).astype(np.float32)
    blocks, mask = init_params(a.dim, a.blocks), causal_mask(a.seq)

    params_t, mask_t = as_tensors(blocks), lc.tensor(mask)
    xp = lc.placeholder("x", x.shape, lc.f32)
    prog = lc.compile([stack(xp, as_placeholders(blocks), lc.tensor(mask), a.heads)])
    all_feeds = dict(feeds(blocks), x=x)
    fns = {
        "lazycandle eager": lambda: stack(lc.tensor(x), params_t, mask_t, a.heads).numpy(),
        "lazycandle compiled": lambda: prog.run(**all_feeds)[0],
        "numpy f32": lambda: np_stack(x, blocks, mask, a.heads),
    }
    try:
        import torch
        tx, tm = torch.from_numpy(x), torch.from_numpy(mask)
        tp = [{k: torch.from_numpy(v) for k, v in p.items()} for p in blocks]
        torch.set_num_threads(lc.get_num_threads())
        fns["torch"] = lambda: _torch_stack(torch, tx, tp, tm, a.heads)
    except ImportError:
        print("torch: not installed (skipped)")

    ref = np_stack(x.astype(np.float64), blocks, mask, a.heads)
    for name, fn in fns.items():
        got = np.asarray(fn(), np.float64)
        err = np.abs(got - ref).max() / np.abs(ref).max()
        print(f"{name:22s} max error relative to max |ref|: {err:.1e}")
    stats = time_alternating(fns, repeats=a.repeats)
    print(f"GPT-2 stack ({a.batch}, {a.seq}, {a.dim}) x {a.blocks} blocks, {a.heads} heads, "
          f"{lc.get_num_threads()} threads; load average {os.getloadavg()[0]:.2f}")
    for name, s in stats.items():
        print(f"  {name:22s} median {s.median * 1e3:9.2f} ms  (min {s.min * 1e3:.2f}, max {s.max * 1e3:.2f}, "
              f"n={s.n}; first call {s.first * 1e3:.0f} ms)")


def _torch_stack(torch, x, blocks, mask, n_head):
    F = torch.nn.functional
    b, t, d = x.shape
    hd = d // n_head
    with torch.no_grad():
        for p in blocks:
            h = F.linear(F.layer_norm(x, (d,), p["ln1_g"], p["ln1_b"], EPS), p["w_qkv"], p["b_qkv"])
            q, k, v = (z.reshape(b, t, n_head, hd).transpose(1, 2) for z in h.chunk(3, -1))
            att = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd) + mask, -1)
            x = x + F.linear((att @ v).transpose(1, 2).reshape(b, t, d), p["w_proj"], p["b_proj"])
            h = F.gelu(F.linear(F.layer_norm(x, (d,), p["ln2_g"], p["ln2_b"], EPS), p["w_fc"], p["b_fc"]),
                       approximate="tanh")
            x = x + F.linear(h, p["w_out"], p["b_out"])
    return x.numpy()


if __name__ == "__main__":
    main()
