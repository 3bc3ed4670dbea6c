"""Perplexity-style sanity of the quantized formats (issue 44) on a TRAINED Llama checkpoint, and
where the error of each format comes from:

    python bench/quant_sanity.py [--steps 600] [--kinds bf16,q8_0,q4_0] [--threads 2] [--folder DIR]

No trained Llama is reachable from this machine (PyPI only), and a random-weight model measures
noise, not a model: its logits are sums of independent roundings with nothing above them (see
`--random`).  So the script trains one: a small Llama-architecture model (transformers'
LlamaForCausalLM in torch, 4 layers, hidden 256, GQA 8/4, FFN 704, byte vocabulary) on this
Python's own standard-library sources, seeded, saved in Hugging Face's layout (config.json +
model.safetensors) into `--folder` (default: a cache folder; a later run reuses it).  lazycandle
then loads it as a user would, `lc.models.from_pretrained(folder, dtype=..., quantize=...)`.

On held-out text (sources the training never read), per kind against lazycandle's f32 model:
  * logits relative error, max over the prompt's positions of max |diff| / max |f32| (the
    issue's measure), and of the 2-norm ratio;
  * top-1 agreement and the perplexity of the held-out text (f32 / kind);
  * for the GGML kinds, the same error of an f32 model whose weights are the kind's exact
    dequantization (the format's own error: exact arithmetic on the rounded weights), and of
    lazycandle's quantized model against that model (what lazycandle's kernels add: the int8
    activation blocks llama.cpp also uses).
`--random CONFIG` runs the same comparison on bench/quant_decode.py's random-weight model instead."""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
          "hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 704,
          "vocab_size": 256, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
          "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
          "torch_dtype": "float32"}
SEQ, BATCH, LR = 128, 16, 3e-3


def corpus() -> tuple:
    """(training bytes, held-out bytes): this Python's stdlib sources, sorted; every 10th file held out."""
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "*.py")))
    train, held = [], []
    for i, f in enumerate(files):
        with open(f, "rb") as fh:
            (held if i % 10 == 0 else train).append(fh.read())
    return b"".join(train), b"".join(held)


def train(folder: str, steps: int, threads: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    data = np.frombuffer(corpus()[0], np.uint8)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "architectures"}))
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, LR, total_steps=steps, pct_start=0.1)
    rng = np.random.default_rng(0)
    for step in range(steps):
        at = rng.integers(0, len(data) - SEQ - 1, BATCH)
        ids = torch.from_numpy(np.stack([data[a:a + SEQ + 1] for a in at]).astype(np.int64))
        loss = model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"  train step {step:4d}: loss {loss.item():.3f} nats/byte", flush=True)
    model.save_pretrained(folder, safe_serialization=True)


def default_folder(steps: int) -> str:
    key = hashlib.sha256(json.dumps([CONFIG, SEQ, BATCH, LR, steps], sort_keys=True).encode()).hexdigest()[:12]
    base = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return os.path.join(base, "lazycandle-bench", f"trained-llama-{key}")


def dequantized_copy(module, kind: str) -> None:
    """Every Linear a QLinear would take gets its weight's exact dequantization, in place."""
    for val in list(vars(module).values()):
        for m in (val if isinstance(val, (list, tuple)) else [val]):
            if isinstance(m, lc.nn.Linear) and m.weight.shape[1] % 32 == 0:
                m.weight = lc.quantize(m.weight, kind).dequantize().realize()
            elif isinstance(m, lc.nn.Module):
                dequantized_copy(m, kind)


def errors(got, want, prompts) -> str:
    """`got`, `want`: per prompt, (positions, vocab) logits."""
    ppl = ""
    if prompts is not None:
        ppl = f"   perplexity {mean_perplexity(got, prompts):.4f} (f32 {mean_perplexity(want, prompts):.4f})"
    got, want = np.concatenate(got).astype(np.float64), np.concatenate(want).astype(np.float64)
    rel = np.max(np.abs(got - want).max(-1) / np.abs(want).max(-1))
    l2 = np.max(np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1))
    agree = np.mean(got.argmax(-1) == want.argmax(-1))
    return (f"max|diff|/max|f32| {100 * rel:6.2f} %   2-norm {100 * l2:6.2f} %   "
            f"top-1 agree {100 * agree:5.1f} %{ppl}")


def mean_perplexity(logits, prompts) -> float:
    """exp of the mean next-byte negative log-likelihood over every prompt."""
    nll = []
    for z, ids in zip(logits, prompts):
        z = np.asarray(z[:-1], np.float64)
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        nll.append(-logp[np.arange(len(ids) - 1), np.asarray(ids[1:])])
    return float(np.exp(np.concatenate(nll).mean()))


def logits_of(model, prompts) -> list:
    return [model([p]).to_dtype(lc.f32).numpy()[0] for p in prompts]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--kinds", default="bf16,q8_0,q4_0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--folder", default=None)
    ap.add_argument("--prompts", type=int, default=4, help="held-out prompts of 256 bytes")
    ap.add_argument("--random", choices=("small", "1b"), default=None)
    a = ap.parse_args(argv)
    lc.set_num_threads(a.threads)
    print(f"load average at start: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if a.random:
        from bench.quant_decode import CONFIGS
        from lazycandle.models import llama
        from lazycandle.models.textgen import random_model
        cfg = CONFIGS[a.random]
        prompts = [[int(i) for i in np.random.default_rng(1).integers(0, cfg["vocab_size"], 16)]]

        def load(dtype=None, quantize=None):
            model = random_model(llama, cfg, seed=0, dtype=dtype or lc.f32)[0]
            if quantize:
                lc.nn.quantize_linears(model, quantize)
            return model
        scored = None
    else:
        folder = a.folder or default_folder(a.steps)
        if not os.path.isfile(os.path.join(folder, "model.safetensors")):
            print(f"training a Llama ({a.steps} steps) into {folder}")
            train(folder, a.steps, a.threads)
        held = np.frombuffer(corpus()[1], np.uint8)
        step = len(held) // a.prompts
        prompts = [[int(b) for b in held[i * step:i * step + 256]] for i in range(a.prompts)]
        scored = prompts

        def load(dtype=None, quantize=None):
            return lc.models.from_pretrained(folder, dtype=dtype, quantize=quantize)

    ref = logits_of(load(), prompts)
    for kind in a.kinds.split(","):
        if kind == "bf16":
            print(f"bf16  weights and activations        {errors(logits_of(load(dtype=lc.bf16), prompts), ref, scored)}")
            continue
        got = logits_of(load(quantize=kind), prompts)
        exact = load()
        dequantized_copy(exact, kind)
        exact = logits_of(exact, prompts)
        print(f"{kind:5s} lazycandle vs f32                  {errors(got, ref, scored)}")
        print(f"{kind:5s} the format alone (dequantized f32) {errors(exact, ref, scored)}")
        print(f"{kind:5s} lazycandle vs dequantized f32      {errors(got, exact, None)}", flush=True)
    print(f"load average at end: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
