"""GPT-2 124M from a Hugging Face folder: lazycandle's `from_pretrained` + `generate` against
transformers' eager `generate` on the same folder (seeded random weights saved in HF layout, no
download), 2 threads.

    PYTHONPATH=/path/to/torch+transformers python bench/hf_generate.py [--prompt 32] [--tokens 64]

Prefill = the wall time of generate(max_new_tokens=1); decode = (generate(N) - generate(1)) / (N - 1)
per token, measured the same way for both (greedy, no EOS), median of --rounds, the two libraries
alternating; the same in process CPU time (user + sys of all threads: both libraries run in this
process, one at a time) for a loaded machine.  Then a batch of --batch prompts of different lengths (left padding, one compiled
decode step for the batch) against batch 1, as decode tokens/s; then bf16 weights against f32:
bytes of the loaded parameters and decode tokens/s.  Prints the machine's load."""
from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import tempfile
import time

if __package__ in (None, ""):          # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.peers import fair_env_missing  # noqa: E402

os.environ.update(fair_env_missing())    # before NumPy / torch load: idle peer threads sleep, not spin

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from lazycandle.models import from_pretrained, gpt2  # noqa: E402
from lazycandle.models.causal_lm import run  # noqa: E402
from lazycandle.models.textgen import random_model, save_folder  # noqa: E402


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _time(fn, cpu=None) -> float:
    t0, c0 = time.perf_counter(), _cpu()
    fn()
    if cpu is not None:
        cpu.append(_cpu() - c0)
    return time.perf_counter() - t0


def _param_bytes(model) -> int:
    seen, total = set(), 0
    for _, p in model.named_parameters():
        key = id(p._node.base)
        if key not in seen:
            seen.add(key)
            total += math.prod(p.shape) * p.dtype.size_in_bytes
    return total


def _lc_runner(model, prompt):
    return lambda n: model.generate(prompt, n, eos_token_id=[])


def _hf_runner(torch, hf, prompt):
    ids = torch.tensor([prompt])

    def gen(n):
        with torch.no_grad():
            return hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None,
                               pad_token_id=0, attention_mask=torch.ones_like(ids))
    return gen


def _prefill_decode(runners, n, rounds):
    """{name: (prefill s, decode s/token, prefill CPU s, decode CPU s/token)}: medians, the
    runners alternating."""
    first, full = {k: [] for k in runners}, {k: [] for k in runners}
    cfirst, cfull = {k: [] for k in runners}, {k: [] for k in runners}
    for r in range(rounds):
        names = list(runners)[r % len(runners):] + list(runners)[:r % len(runners)]
        for k in names:
            first[k].append(_time(lambda: runners[k](1), cfirst[k]))
            full[k].append(_time(lambda: runners[k](n), cfull[k]))
    med = statistics.median
    return {k: (med(first[k]), (med(full[k]) - med(first[k])) / (n - 1), med(cfirst[k]),
                (med(cfull[k]) - med(cfirst[k])) / (n - 1)) for k in runners}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    lc.set_num_threads(a.threads)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 50000, a.prompt).tolist()
    folder = tempfile.mkdtemp(prefix="lc-gpt2-124M-")
    model, vm = random_model(gpt2, gpt2.PRESETS["124M"], seed=0)
    save_folder(vm, gpt2.PRESETS["124M"], folder)
    del model, vm
    print(f"GPT-2 124M, random weights in HF layout ({folder}), prompt {a.prompt}, {a.tokens} new tokens, "
          f"{a.threads} threads")
    model = from_pretrained(folder)
    t0 = time.perf_counter()
    model.generate(prompt, 4, eos_token_id=[])                  # compiles prefill + decode
    print(f"lazycandle first generate (compiling or loading kernels): {time.perf_counter() - t0:.1f} s")
    runners = {"lazycandle": _lc_runner(model, prompt)}
    try:
        import torch
        import transformers
        torch.set_num_threads(a.threads)
        hf = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
        runners["transformers"] = _hf_runner(torch, hf, prompt)
        want = runners["transformers"](a.tokens)[0, a.prompt:].tolist()
        same = runners["lazycandle"](a.tokens) == want
        print(f"transformers {transformers.__version__}, torch {torch.__version__}: same greedy tokens: {same}")
    except ImportError as e:
        print(f"note: transformers not importable ({e}); lazycandle alone")
    res = _prefill_decode(runners, a.tokens, a.rounds)
    lc_pre, lc_dec, lc_cpre, lc_cdec = res["lazycandle"]
    print(f"{'':14s} {'prefill ms':>11s} {'decode ms/token':>16s} {'prefill x':>10s} {'decode x':>9s}   "
          f"{'CPU: prefill ms':>15s} {'decode ms/token':>16s} {'prefill x':>10s} {'decode x':>9s}")
    for k, (pre, dec, cpre, cdec) in res.items():
        print(f"{k:14s} {pre * 1e3:11.1f} {dec * 1e3:16.2f} {pre / lc_pre:9.2f}x {dec / lc_dec:8.2f}x   "
              f"{cpre * 1e3:15.1f} {cdec * 1e3:16.2f} {cpre / lc_cpre:9.2f}x {cdec / lc_cdec:8.2f}x")

    lengths = [max(1, a.prompt - 3 * i) for i in range(a.batch)]
    prompts = [rng.integers(0, 50000, n).tolist() for n in lengths]
    run(model, prompts, 4, eos_token_id=[])                       # compiles the batch's decode step
    ones, manys = [], []
    for _ in range(a.rounds):                                     # alternating: load disturbs both alike
        ones.append(run(model, [prompts[0]], a.tokens, eos_token_id=[]))
        manys.append(run(model, prompts, a.tokens, eos_token_id=[]))
    tps1 = 1e3 / statistics.median(g.decode_ms_per_token for g in ones)
    tpsb = a.batch * 1e3 / statistics.median(g.decode_ms_per_token for g in manys)
    print(f"batch {a.batch} (prompt lengths {lengths[-1]}..{lengths[0]}): {tpsb:.1f} tokens/s decode vs batch 1 "
          f"{tps1:.1f} tokens/s: {tpsb / tps1:.2f}x (median of {a.rounds} alternating runs; kernels compiled after "
          f"warm-up: {max(g.kernels_after_warmup for g in manys)})")

    bf = from_pretrained(folder, dtype=lc.bf16)
    bf.generate(prompt, 4, eos_token_id=[])
    m32, m16 = [], []
    for _ in range(a.rounds):
        m32.append(run(model, [prompt], a.tokens, eos_token_id=[]).decode_ms_per_token)
        m16.append(run(bf, [prompt], a.tokens, eos_token_id=[]).decode_ms_per_token)
    d32, d16 = statistics.median(m32), statistics.median(m16)
    b32, b16 = _param_bytes(model), _param_bytes(bf)
    print(f"bf16: parameters {b16 / 2**20:.1f} MiB vs f32 {b32 / 2**20:.1f} MiB ({b16 / b32:.2f}x); decode "
          f"{1e3 / d16:.1f} tokens/s vs f32 {1e3 / d32:.1f} ({d32 / d16:.2f}x; median of {a.rounds} alternating runs)")
    print("load:", " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
