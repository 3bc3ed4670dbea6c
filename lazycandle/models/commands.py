"""The model commands of the `lazycandle` CLI: `lazycandle embed FOLDER TEXT... [--json]`."""
from __future__ import annotations

import json
import sys


def add_embed(sub) -> None:
    e = sub.add_parser("embed", help="sentence embeddings from a model folder (e.g. all-MiniLM-L6-v2)")
    e.add_argument("folder", help="Hugging Face folder: config.json, model.safetensors, tokenizer.json")
    e.add_argument("texts", nargs="+", metavar="TEXT")
    e.add_argument("--json", action="store_true", help="print {texts, embeddings} as JSON")
    e.add_argument("--no-normalize", action="store_true", help="do not scale the vectors to unit length")
    e.add_argument("--dtype", default=None, choices=("f32", "bf16", "f16"), help="convert the weights")


def run_embed(args) -> int:
    """One line per text of space-separated values (or JSON with --json)."""
    from ..errors import Error
    from .hub import from_pretrained
    try:
        model = from_pretrained(args.folder, dtype=args.dtype)
        if not hasattr(model, "embed"):
            print(f"lazycandle embed: {args.folder} holds a {model.hf_config.get('model_type')} model, "
                  f"which has no sentence embeddings", file=sys.stderr)
            return 2
        vecs = model.embed(args.texts, normalize=not args.no_normalize)
    except (Error, OSError, ValueError) as e:
        print(f"lazycandle embed: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if args.json:
        json.dump({"texts": args.texts, "embeddings": vecs.tolist()}, sys.stdout)
        print()
    else:
        for v in vecs:
            print(" ".join(f"{x:.7g}" for x in v))
    return 0
