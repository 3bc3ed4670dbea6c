"""Decode speed of a ~1B-parameter Llama (16 layers, hidden 2048, GQA 32/8, FFN 8192, vocab
32000) with seeded random weights built in memory (models.textgen.random_model: no checkpoint
on disk), in f32, bf16 and with its linear layers quantized (q8_0, q4_0: lc.nn.QLinear through
lc.qmatmul), at 2 threads.

    python bench/quant_decode.py [--kinds f32,bf16,q8_0,q4_0] [--prompt 16] [--tokens 24] [--threads 2]
                                 [--config 1b|small]

Per kind: the weights' bytes, decode ms/token (median over the steps of one greedy generate, the
first steps included: the median ignores them), the weight bytes read per second, and that as a %
of this machine's 2-thread read stream (bench/bandwidth.py, 256 MiB) -- decode of a batch of one
reads every weight once per token, so that stream is its ceiling.  Also the prompt's logits'
relative error against f32 (max over positions of max |diff| / max |f32|).  Prints the load."""
from __future__ import annotations

import argparse
import gc
import math
import os
import sys

if __package__ in (None, ""):          # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.peers import fair_env_missing  # noqa: E402

os.environ.update(fair_env_missing())    # before NumPy loads: idle peer threads sleep, not spin

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from lazycandle.models import llama  # noqa: E402
from lazycandle.models.causal_lm import run  # noqa: E402
from lazycandle.models.textgen import random_model  # noqa: E402

CONFIGS = {
    "1b": {"model_type": "llama", "num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 32000,
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "bos_token_id": None, "eos_token_id": None},
    "small": {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
              "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1024,
              "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "bos_token_id": None, "eos_token_id": None},
}


def weight_bytes(model) -> int:
    """Bytes of the float parameters plus the QLinear blocks (each buffer once)."""
    seen, total = set(), 0
    for _, p in model.named_parameters():
        if id(p._node.base) not in seen:
            seen.add(id(p._node.base))
            total += math.prod(p.shape) * p.dtype.size_in_bytes

    def walk(m):
        nonlocal total
        for v in vars(m).values():
            for s in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(s, lc.nn.QLinear):
                    total += s.qweight.nbytes
                elif isinstance(s, lc.nn.Module):
                    walk(s)
    walk(model)
    return total


def build(config: dict, kind: str):
    model, vm = random_model(llama, config, seed=0, dtype=lc.bf16 if kind == "bf16" else lc.f32)
    if kind not in ("f32", "bf16"):
        lc.nn.quantize_linears(model, kind)
    del vm
    gc.collect()
    return model


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want).max(-1) / np.abs(want).max(-1)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="f32,bf16,q8_0,q4_0")
    ap.add_argument("--config", choices=tuple(CONFIGS), default="1b")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    lc.set_num_threads(a.threads)
    from bench.bandwidth import measure
    from bench.machine import _lscpu_model
    peak = measure(256, threads=(a.threads,))[a.threads]["read"]
    cfg = CONFIGS[a.config]
    prompt = [int(i) for i in np.random.default_rng(1).integers(0, cfg["vocab_size"], a.prompt)]
    print(f"cpu: {_lscpu_model()}; threads: {a.threads}; read stream {peak:.1f} GB/s; "
          f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    ref = None
    for kind in a.kinds.split(","):
        model = build(cfg, kind)
        nbytes = weight_bytes(model)
        logits = model([prompt]).numpy()[0]
        if kind == "f32":
            ref = logits
        gen = run(model, [prompt], a.tokens, eos_token_id=[])
        ms = gen.decode_ms_per_token
        gbs = nbytes / ms / 1e6
        pct = f"{100 * gbs / peak:3.0f}% of the stream"
        err = f"logits rel err vs f32 {rel_err(logits, ref):.4f}" if ref is not None and kind != "f32" else ""
        print(f"{kind:5s} weights {nbytes / 2**30:6.2f} GiB  decode {ms:8.1f} ms/token  {gbs:6.1f} GB/s {pct}  "
              f"{err}  (load {os.getloadavg()[0]:.2f})", flush=True)
        del model, gen
        gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
