"""Generating text from the command line: `lazycandle generate FOLDER --prompt TEXT ...` and
`python -m lazycandle.models.gpt2|llama --random-weights --config NAME` (seeded random weights
of a preset's shapes, no download), plus writing such a model as a Hugging Face folder (the
benchmarks and the tests of the loaders use it)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib

from ..dtype import as_dtype, f32
from ..nn_layers import VarBuilder, VarMap
from ..tensor import randn


class SeededVarMap(VarMap):
    """A VarMap of inference weights seeded per name: 1-D weights (norm gains) N(1, 0.1), every
    other tensor N(0, std) (GPT-2's initialisation scale), whatever the layer's own initialiser.
    They are plain tensors, not trainable Vars: while a Var lives, realized nodes keep their
    graph for backward, which a generator does not want."""

    def __init__(self, seed: int = 0, std: float = 0.02):
        super().__init__()
        self.seed, self.std = seed, std

    def get(self, shape, name, init=None, dtype=f32):
        if name not in self._vars:
            gain = len(tuple(shape)) == 1 and name.endswith(".weight")
            mean, std = (1.0, 0.1) if gain else (0.0, self.std)
            s = (zlib.crc32(name.encode()) + 7919 * self.seed) % 2**32
            self._vars[name] = randn(mean, std, tuple(shape), as_dtype(dtype), seed=s).realize()
        return super().get(shape, name, init, dtype)


def random_model(module, config: dict, seed: int = 0, dtype=f32, strict: bool = True):
    """(model, varmap): `module` (models.gpt2 / models.llama) built from the config.json
    contents `config` over seeded random weights."""
    from .hub import HFConfig
    vm = SeededVarMap(seed)
    model = module.from_config(HFConfig(dict(config), f"<{config.get('model_type')} config>", strict),
                               VarBuilder.from_varmap(vm, as_dtype(dtype)))
    return model, vm


def save_folder(varmap: VarMap, config: dict, folder) -> str:
    """Write config.json and model.safetensors (the VarMap's tensors, by their HF names)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    varmap.save(os.path.join(folder, "model.safetensors"))
    return os.fspath(folder)


# ---- the command lines ---------------------------------------------------------------------
def add_sampling_args(ap) -> None:
    ap.add_argument("--prompt", default="Hello, lazycandle!")
    ap.add_argument("--max-new-tokens", "--tokens", dest="max_new_tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("f32", "bf16", "f16"), default=None,
                    help="convert the weights (default: keep the checkpoint's)")


def add_generate(sub) -> None:
    """The `generate` subcommand of the `lazycandle` command line."""
    from ..qtensor import KINDS
    g = sub.add_parser("generate", help="generate text with a Hugging Face GPT-2 / Llama folder or a llama GGUF file")
    g.add_argument("folder", help="config.json, model.safetensors (or shards), tokenizer.json; or a .gguf file")
    g.add_argument("--quantize", choices=KINDS, default=None,
                   help="a folder's linear layers quantized to this GGML block format as they load")
    add_sampling_args(g)


def run_generate(args) -> int:
    """`lazycandle generate FOLDER|FILE.gguf`: load the model, stream the text to stdout, timings to
    stderr."""
    from ..errors import Error
    from .gguf_llama import from_gguf
    from .hub import from_pretrained
    try:
        if os.path.isfile(args.folder) and args.folder.endswith(".gguf"):
            model = from_gguf(args.folder, dtype=args.dtype)
        else:
            model = from_pretrained(args.folder, dtype=args.dtype, quantize=getattr(args, "quantize", None))
    except Error as e:
        print(f"lazycandle generate: {e}", file=sys.stderr)
        return 2
    return _generate(model, args)


def module_main(prog: str, module, argv=None) -> int:
    """`python -m lazycandle.models.gpt2|llama`: a preset with seeded random weights, or a folder."""
    ap = argparse.ArgumentParser(prog=prog, description=f"Generate text with {prog} on lazycandle.")
    ap.add_argument("--config", default="tiny", choices=sorted(module.PRESETS))
    ap.add_argument("--random-weights", action="store_true", help="seeded random weights (no download)")
    ap.add_argument("--folder", help="a Hugging Face model folder (config.json, model.safetensors)")
    add_sampling_args(ap)
    args = ap.parse_args(argv)
    if bool(args.random_weights) == bool(args.folder):
        ap.error("pass --random-weights or --folder FOLDER")
    if args.folder:
        return run_generate(args)
    model, _ = random_model(module, module.PRESETS[args.config], args.seed, args.dtype or f32)
    model.tokenizer = None
    return _generate(model, args)


def _generate(model, args) -> int:
    from .causal_lm import run
    from .sampling import Sampler
    try:
        sampler = Sampler(args.temperature, args.top_k, args.top_p, args.seed)
    except ValueError as e:
        print(f"lazycandle generate: {e}", file=sys.stderr)
        return 2
    tok = model.tokenizer
    if tok is None:
        print("note: no tokenizer.json: the prompt is UTF-8 bytes (token ids 0..255)", file=sys.stderr)
        prompt = list(args.prompt.encode("utf-8"))
    else:
        prompt = tok.encode(args.prompt)
    print(f"prompt tokens: {prompt}", file=sys.stderr)
    print("compiling and running the prompt (the first run of a model compiles its kernels; "
          "they are cached on disk for the next runs)...", file=sys.stderr, flush=True)
    shown, t0, first, tokens = [""], time.perf_counter(), [None], []

    def on_token(_seq, tok):
        tokens.append(tok)
        if first[0] is None:
            first[0] = time.perf_counter() - t0
            print(f"first token after {first[0]:.1f} s", file=sys.stderr, flush=True)
            print(args.prompt, end="", flush=True)
        text = _text(model, tokens)
        if text.startswith(shown[0]):
            print(text[len(shown[0]):], end="", flush=True)
            shown[0] = text

    gen = run(model, [prompt], args.max_new_tokens, sampler, on_token=on_token)
    text = _text(model, tokens)
    print(text[len(shown[0]):] if text.startswith(shown[0]) else "\n" + text)
    n = len(prompt)
    print(f"new tokens: {gen.tokens[0]}", file=sys.stderr)
    print(f"prefill: {gen.prefill_ms:.1f} ms for {n} tokens ({gen.prefill_ms / max(n, 1):.2f} ms/token)",
          file=sys.stderr)
    print(f"decode: {gen.decode_ms_per_token:.2f} ms/token (median of {len(gen.decode_ms)}), "
          f"kernels compiled after warm-up: {gen.kernels_after_warmup}", file=sys.stderr)
    return 0


def _text(model, tokens) -> str:
    if model.tokenizer is not None:
        return model.tokenizer.decode(tokens)
    return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")
