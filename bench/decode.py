"""GPT-2 generation speed: ms per token for the prefill and for KV-cache decode steps,
lazycandle (lazycandle/models/gpt2.py, compiled decode steps) against torch eager running the
same weights (when importable: PYTHONPATH=/work/peers) and NumPy (float32), 2 threads.

    PYTHONPATH=/work/peers python bench/decode.py [--config 124M] [--prompt 32] [--tokens 64]

Every implementation runs the same token sequence; each decode step is timed with the
implementations rotating inside one loop (bench/timing.py's method), so load disturbs all
alike; the medians over the steps are printed with the machine's load.  The logits of the
last step are compared across implementations as a sanity check."""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

if __package__ in (None, ""):          # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

import lazycandle as lc
from bench.peers import load_peers, threads
from lazycandle.models import Session, gpt2
from lazycandle.models.textgen import random_model


# ---- NumPy (float32, preallocated cache) ----------------------------------------------------
class NumpyGPT2:
    def __init__(self, cfg, w, max_len):
        self.cfg, self.w = cfg, w
        shape = (cfg.n_head, max_len, cfg.head_dim)
        self.k = [np.zeros(shape, np.float32) for _ in range(cfg.n_layer)]
        self.v = [np.zeros(shape, np.float32) for _ in range(cfg.n_layer)]
        self.pos = 0

    def step(self, tokens):
        c, w, t = self.cfg, self.w, len(tokens)
        p0, p1 = self.pos, self.pos + t
        x = w["wte.weight"][tokens] + w["wpe.weight"][p0:p1]
        for i in range(c.n_layer):
            h = f"h.{i}."
            a = _np_ln(x, w[h + "ln_1.weight"], w[h + "ln_1.bias"])
            qkv = a @ w[h + "attn.c_attn.weight"] + w[h + "attn.c_attn.bias"]
            q, k, v = (z.reshape(t, c.n_head, c.head_dim).transpose(1, 0, 2) for z in np.split(qkv, 3, -1))
            self.k[i][:, p0:p1], self.v[i][:, p0:p1] = k, v
            s = q @ self.k[i][:, :p1].transpose(0, 2, 1) / math.sqrt(c.head_dim)
            s = s + np.triu(np.full((t, p1), -np.inf, np.float32), p0 + 1)
            s = np.exp(s - s.max(-1, keepdims=True))
            y = (s / s.sum(-1, keepdims=True)) @ self.v[i][:, :p1]
            y = y.transpose(1, 0, 2).reshape(t, c.n_embd)
            x = x + y @ w[h + "attn.c_proj.weight"] + w[h + "attn.c_proj.bias"]
            m = _np_ln(x, w[h + "ln_2.weight"], w[h + "ln_2.bias"]) @ w[h + "mlp.c_fc.weight"] + w[h + "mlp.c_fc.bias"]
            m = 0.5 * m * (1 + np.tanh(np.float32(math.sqrt(2 / math.pi)) * (m + np.float32(0.044715) * m ** 3)))
            x = x + m @ w[h + "mlp.c_proj.weight"] + w[h + "mlp.c_proj.bias"]
        x = _np_ln(x[-1:], w["ln_f.weight"], w["ln_f.bias"])
        self.pos = p1
        return (x @ w["wte.weight"].T)[0]


def _np_ln(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


# ---- torch eager (preallocated cache, index_copy_) -------------------------------------------
class TorchGPT2:
    def __init__(self, torch, cfg, w, max_len):
        self.torch, self.cfg = torch, cfg
        self.w = {k: torch.from_numpy(np.array(v)) for k, v in w.items()}
        shape = (1, cfg.n_head, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape) for _ in range(cfg.n_layer)]
        self.pos = 0

    def step(self, tokens):
        torch, c, w = self.torch, self.cfg, self.w
        F = torch.nn.functional
        with torch.no_grad():
            t = len(tokens)
            p0, p1 = self.pos, self.pos + t
            x = F.embedding(torch.tensor([tokens]), w["wte.weight"]) + w["wpe.weight"][p0:p1]
            for i in range(c.n_layer):
                h = f"h.{i}."
                a = F.layer_norm(x, (c.n_embd,), w[h + "ln_1.weight"], w[h + "ln_1.bias"], 1e-5)
                qkv = torch.addmm(w[h + "attn.c_attn.bias"], a[0], w[h + "attn.c_attn.weight"])
                q, k, v = (z.reshape(1, t, c.n_head, c.head_dim).transpose(1, 2) for z in qkv.split(c.n_embd, -1))
                self.k[i][:, :, p0:p1] = k
                self.v[i][:, :, p0:p1] = v
                y = F.scaled_dot_product_attention(q, self.k[i][:, :, :p1], self.v[i][:, :, :p1],
                                                   is_causal=(t > 1 and p0 == 0))
                y = y.transpose(1, 2).reshape(t, c.n_embd)
                x = x + torch.addmm(w[h + "attn.c_proj.bias"], y, w[h + "attn.c_proj.weight"])
                m = F.layer_norm(x, (c.n_embd,), w[h + "ln_2.weight"], w[h + "ln_2.bias"], 1e-5)
                m = F.gelu(torch.addmm(w[h + "mlp.c_fc.bias"], m[0], w[h + "mlp.c_fc.weight"]), approximate="tanh")
                x = x + torch.addmm(w[h + "mlp.c_proj.bias"], m, w[h + "mlp.c_proj.weight"])
            x = F.layer_norm(x[:, -1], (c.n_embd,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
            self.pos = p1
            return (x @ w["wte.weight"].T)[0].numpy()


# ---- lazycandle ---------------------------------------------------------------------------
class LcGPT2:
    def __init__(self, model, max_len):
        self.session = Session(model, 1, max_len)

    def step(self, tokens):
        s = self.session
        return (s.prefill([tokens]) if s.pos == 0 else s.decode(tokens))[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="124M", choices=sorted(gpt2.PRESETS))
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="prefill timings per implementation")
    a = ap.parse_args(argv)
    max_len = a.prompt + a.tokens
    model, varmap = random_model(gpt2, gpt2.PRESETS[a.config], seed=0)
    cfg = model.config
    weights = {k: t.numpy() for k, t in varmap.data().items()}
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, min(cfg.vocab, 256), a.prompt).tolist()
    tokens = rng.integers(0, cfg.vocab, a.tokens).tolist()
    mods, notes = load_peers(("torch",))
    makers = {"lazycandle": lambda: LcGPT2(model, max_len), "numpy": lambda: NumpyGPT2(cfg, weights, max_len)}
    if "torch" in mods:
        makers["torch"] = lambda: TorchGPT2(mods["torch"], cfg, weights, max_len)
    print(f"GPT-2 {a.config}, random weights, prompt {a.prompt}, {a.tokens} new tokens, {a.threads} threads")
    for n in notes:
        print("note:", n)
    with threads(a.threads, mods):
        t0 = time.perf_counter()
        warm = makers["lazycandle"]()                 # compiles the prefill and the decode program
        warm.step(prompt)
        for tok in tokens[:3]:
            warm.step([tok])
        print(f"lazycandle warm-up (compiling): {time.perf_counter() - t0:.1f} s")
        kernels0 = lc.cache_info()["kernels"]
        prefill = {k: [] for k in makers}
        decode = {k: [] for k in makers}
        last = {}
        for r in range(a.rounds):
            runs = {k: make() for k, make in makers.items()}
            names = list(runs)
            names = names[r % len(names):] + names[:r % len(names)]
            for k in names:
                t0 = time.perf_counter()
                runs[k].step(prompt)
                prefill[k].append(time.perf_counter() - t0)
            for i, tok in enumerate(tokens):
                for k in names[i % len(names):] + names[:i % len(names)]:
                    t0 = time.perf_counter()
                    out = runs[k].step([tok])
                    decode[k].append(time.perf_counter() - t0)
                    last[k] = out
        compiled = lc.cache_info()["kernels"] - kernels0
    ref = last["numpy"]
    print(f"{'':12s} {'prefill ms/token':>17s} {'decode ms/token':>16s} {'lc speedup':>13s}  max |logit - numpy|")
    lc_dec = statistics.median(decode["lazycandle"])
    for k in makers:
        pre = statistics.median(prefill[k]) / a.prompt * 1e3
        dec = statistics.median(decode[k])
        print(f"{k:12s} {pre:17.2f} {dec * 1e3:16.2f} {dec / lc_dec:12.2f}x  {np.abs(last[k] - ref).max():.2e}")
    print(f"decode: median of {len(decode['lazycandle'])} steps each; kernels compiled after warm-up: {compiled}")
    print("load:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
