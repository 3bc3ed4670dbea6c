"""The same GGUF file decoded by lazycandle (`lc.models.from_gguf`) and by llama.cpp (through
`llama-cpp-python`, when importable): a ~1B random Llama (bench/quant_decode.py's "1b" shapes)
written as a llama.cpp-style GGUF with every linear weight, the token embedding and the head in
one block format (q4_0 by default), q/k rows permuted as llama.cpp's converter does, and a
placeholder SentencePiece vocabulary (llama.cpp needs one to load; ids are fed directly).

    python bench/gguf_decode.py [--kind q4_0] [--config 1b] [--prompt 16] [--tokens 16] [--threads 2] [--rounds 3]
                                [--file /tmp/lc_bench_1b_q4_0.gguf]

Decode = median ms of a one-token step after the prompt, batch 1, greedy ids fed back; lazycandle
through models.causal_lm.run (compiled decode program), llama.cpp through Llama.eval([token]);
the two alternate, `--rounds` prompt + decode runs each (the first steps of round 1 not counted).
The file is written once and reused when present.  Prints the load."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.peers import fair_env_missing  # noqa: E402

os.environ.update(fair_env_missing())

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from bench.quant_decode import CONFIGS  # noqa: E402
from lazycandle.models import llama  # noqa: E402
from lazycandle.models.textgen import random_model  # noqa: E402

_GGUF = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    return w.reshape(heads, 2, w.shape[0] // heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf.split(".", 3)
    mod, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{_GGUF[mod]}.{kind}"


def write_file(path: str, cfg: dict, kind: str) -> None:
    """The random model of `cfg` as a GGUF file at `path` (2-D weights in `kind` blocks)."""
    _, vm = random_model(llama, cfg, seed=0)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tensors = {}
    for hf, t in vm.data().items():
        a = t.numpy()
        if hf.endswith("q_proj.weight"):
            a = _permute(a, heads)
        elif hf.endswith("k_proj.weight"):
            a = _permute(a, kv)
        tensors[_gguf_name(hf)] = lc.quantize(lc.tensor(np.ascontiguousarray(a)), kind) if a.ndim == 2 else t
    del vm
    n = cfg["vocab_size"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"▁t{i}" for i in range(n - len(tokens))]
    types = np.array([2, 3, 3] + [6] * 256 + [1] * (n - 259), np.int32)
    d = cfg["hidden_size"]
    meta = {"general.architecture": "llama", "general.name": "lazycandle random 1b",
            "llama.context_length": np.uint32(cfg["max_position_embeddings"]),
            "llama.embedding_length": np.uint32(d), "llama.block_count": np.uint32(cfg["num_hidden_layers"]),
            "llama.feed_forward_length": np.uint32(cfg["intermediate_size"]),
            "llama.attention.head_count": np.uint32(heads), "llama.attention.head_count_kv": np.uint32(kv),
            "llama.rope.dimension_count": np.uint32(d // heads), "llama.rope.freq_base": np.float32(10000.0),
            "llama.attention.layer_norm_rms_epsilon": np.float32(cfg["rms_norm_eps"]),
            "llama.vocab_size": np.uint32(n),
            "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.scores": -np.arange(n, dtype=np.float32), "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.bos_token_id": np.uint32(1), "tokenizer.ggml.eos_token_id": np.uint32(2),
            "tokenizer.ggml.unknown_token_id": np.uint32(0)}
    lc.save_gguf(path, tensors, meta)


class Ours:
    """lazycandle's model from the file; `decode(n)` -> (per-step ms, the prompt's last logits)."""

    def __init__(self, path):
        self.model = lc.models.from_gguf(path)

    def decode(self, prompt, n):
        from lazycandle.models.causal_lm import run
        gen = run(self.model, [prompt], n, eos_token_id=[], keep_logits=True)
        return list(gen.decode_ms), gen.logits[0][0]


class Theirs:
    """llama.cpp (llama-cpp-python) on the same file, greedy ids fed back one eval per token."""

    def __init__(self, path, threads):
        from llama_cpp import Llama
        self.llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=256, verbose=False,
                         logits_all=True)        # (else llama-cpp-python 0.3 keeps no scores)

    def decode(self, prompt, n):
        llm = self.llm
        llm.reset()
        llm.eval(prompt)
        first = np.array(llm.scores[llm.n_tokens - 1], np.float32)
        tok, times = int(np.argmax(first)), []
        for _ in range(n):
            t0 = time.perf_counter()
            llm.eval([tok])
            times.append((time.perf_counter() - t0) * 1e3)
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        return times, first


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="q4_0", choices=("q8_0", "q4_0", "q4_1", "q5_0"))
    ap.add_argument("--config", choices=tuple(CONFIGS), default="1b")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--file", default=None)
    a = ap.parse_args(argv)
    lc.set_num_threads(a.threads)
    cfg = CONFIGS[a.config]
    path = a.file or f"/tmp/lc_bench_{a.config}_{a.kind}.gguf"
    if not os.path.isfile(path):
        t0 = time.perf_counter()
        write_file(path, cfg, a.kind)
        print(f"wrote {path} ({os.path.getsize(path) / 2**30:.2f} GiB) in {time.perf_counter() - t0:.0f} s")
    prompt = [int(i) for i in np.random.default_rng(1).integers(259, cfg["vocab_size"], a.prompt)]
    print(f"threads {a.threads}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)
    impls = {"lazycandle": Ours(path)}
    try:
        impls["llama.cpp"] = Theirs(path, a.threads)
    except ImportError:
        print("llama-cpp-python is not importable: no llama.cpp figure")
    times, logits = {k: [] for k in impls}, {}
    for r in range(a.rounds):                   # the implementations alternate, a prompt + decode each
        for name, impl in impls.items():
            got, logits[name] = impl.decode(prompt, a.tokens)
            times[name] += got[2:] if r == 0 else got       # (the first round's first steps warm up)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k} {a.kind}: decode {v:.1f} ms/token (median of {len(times[k])} steps)")
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if "llama.cpp" in med:
        ours, theirs = logits["lazycandle"], logits["llama.cpp"]
        err = np.abs(ours - theirs).max() / np.abs(theirs).max()
        print(f"lazycandle / llama.cpp = {med['lazycandle'] / med['llama.cpp']:.2f}; prompt logits: "
              f"max |diff| / max |llama.cpp| = {err:.2e}, same argmax: {int(np.argmax(ours)) == int(np.argmax(theirs))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
