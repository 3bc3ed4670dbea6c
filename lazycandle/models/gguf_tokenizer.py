"""A GGUF file's tokenizer (`tokenizer.ggml.*` keys) as an lc.models.Tokenizer, built with the
`tokenizers` package.

- model "gpt2": byte-level BPE from `tokens` + `merges` (GPT-2's pre-tokenizer regex, or
  Llama 3's for `tokenizer.ggml.pre` "llama-bpe" / "llama3").
- model "llama": SentencePiece BPE from `tokens` + `scores`: llama.cpp merges the adjacent pair
  whose joined piece has the highest score, which is BPE with one merge per vocabulary piece
  ranked by that piece's score (how transformers converts these files too); `<0xXX>` byte
  pieces are the fallback for text the vocabulary lacks; "▁" stands for a space, one is
  prepended unless `add_space_prefix` is false.
Control tokens (token_type 3) are special; `add_bos_token` (default: true for "llama") puts the
bos token first when encoding."""
from __future__ import annotations

import numpy as np

from ..errors import SerializationError
from .tokenizer import Tokenizer

_CONTROL, _BYTE = 3, 6
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def tokenizer_from_gguf(meta: dict, path):
    """The Tokenizer of a GGUF file's metadata, or None when it has no tokenizer.ggml.model."""
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        return None
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise SerializationError(f"from_gguf: {path}: metadata key 'tokenizer.ggml.tokens' is missing or empty")
    types = np.asarray(meta.get("tokenizer.ggml.token_type", np.ones(len(tokens))), np.int64)
    if kind == "gpt2":
        tk = _byte_level(meta, tokens, path)
    elif kind == "llama":
        tk = _sentencepiece(meta, tokens, types, path)
    else:
        raise SerializationError(f"from_gguf: {path}: tokenizer.ggml.model {kind!r} is not supported "
                                 f"(known: gpt2, llama)")
    from tokenizers import AddedToken
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                           for i in np.flatnonzero(types == _CONTROL)])
    _bos_template(tk, meta, tokens, default=kind == "llama")
    return Tokenizer(tk, f"{path} (tokenizer.ggml)")


def _byte_level(meta, tokens, path):
    from tokenizers import Regex
    from tokenizers import Tokenizer as Tk
    from tokenizers import decoders, models, pre_tokenizers
    merges = meta.get("tokenizer.ggml.merges")
    if not isinstance(merges, list):
        raise SerializationError(f"from_gguf: {path}: a gpt2 tokenizer needs 'tokenizer.ggml.merges'")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tk(models.BPE({t: i for i, t in enumerate(tokens)}, pairs, ignore_merges=False))
    if meta.get("tokenizer.ggml.pre") in ("llama-bpe", "llama3"):
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return tk


def _sentencepiece(meta, tokens, types, path):
    from tokenizers import Tokenizer as Tk
    from tokenizers import decoders, models, normalizers
    scores = meta.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise SerializationError(f"from_gguf: {path}: a llama tokenizer needs one 'tokenizer.ggml.scores' "
                                 f"value per token")
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for i, t in enumerate(tokens):
        if types[i] in (_CONTROL, _BYTE) or len(t) < 2:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in vocab and b in vocab:
                ranked.append((-float(scores[i]), i, a, b))
    ranked.sort()
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tk = Tk(models.BPE(vocab, [(a, b) for _, _, a, b in ranked], byte_fallback=True, fuse_unk=True,
                       unk_token=None if unk is None else tokens[int(unk)]))
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁")] * prefix + [normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
                                   + [decoders.Strip(" ", 1, 0)] * prefix)
    return tk


def _bos_template(tk, meta, tokens, default: bool):
    from tokenizers import processors
    bos = meta.get("tokenizer.ggml.bos_token_id")
    if bos is None or not bool(meta.get("tokenizer.ggml.add_bos_token", default)):
        return
    b = tokens[int(bos)]
    tk.post_processor = processors.TemplateProcessing(single=f"{b} $A", pair=f"{b} $A $B",
                                                      special_tokens=[(b, int(bos))])
