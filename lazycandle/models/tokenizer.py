"""`lc.models.Tokenizer`: a Hugging Face tokenizer.json through the `tokenizers` package.

Like transformers, plain encoding neither pads nor truncates, whatever the file's own
"padding" / "truncation" sections say (all-MiniLM's file pads everything to 128); `batch` pads
a batch to its longest sequence and truncates at `max_length`, giving the arrays an encoder
needs (ids, attention mask, token type ids)."""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import SerializationError

_PAD_NAMES = ("[PAD]", "<pad>", "<|pad|>", "<|padding|>")


@dataclass
class Batch:
    """A padded batch: (n, L) i64 arrays.  attention_mask is 1 on real tokens, 0 on padding."""
    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray


class Tokenizer:
    def __init__(self, tk, path: str = "<tokenizer>"):
        padding = tk.padding
        self._tk, self.path = tk, path
        self._pad_id = padding["pad_id"] if padding else next(
            (i for i in map(tk.token_to_id, _PAD_NAMES) if i is not None), 0)
        tk.no_padding()
        tk.no_truncation()
        self._lock = threading.Lock()       # batch() sets the padding and truncation for one call

    @classmethod
    def from_file(cls, path) -> "Tokenizer":
        """From a tokenizer.json, or a folder holding one (missing or unreadable:
        SerializationError naming the file)."""
        from tokenizers import Tokenizer as _Tk
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(path):
            raise SerializationError(f"{path}: missing (no tokenizer.json)")
        try:
            tk = _Tk.from_file(path)
        except Exception as e:      # the package raises its own Exception type for bad files
            raise SerializationError(f"{path}: not a tokenizer.json the tokenizers package can read: {e}") from None
        return cls(tk, path)

    @property
    def vocab_size(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    @property
    def pad_token_id(self) -> int:
        return self._pad_id

    def token_to_id(self, token: str):
        return self._tk.token_to_id(token)

    def id_to_token(self, i: int):
        return self._tk.id_to_token(i)

    def encode(self, text: str, add_special_tokens: bool = True) -> list:
        return self._tk.encode(_text("encode", text), add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts, add_special_tokens: bool = True) -> list:
        texts = [_text("encode_batch", t) for t in texts]
        return [e.ids for e in self._tk.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self._tk.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def decode_batch(self, seqs, skip_special_tokens: bool = True) -> list:
        return [self.decode(s, skip_special_tokens) for s in seqs]

    def batch(self, texts, max_length: int | None = None) -> Batch:
        """Encode `texts` with special tokens, truncated to `max_length` tokens (the special
        ones included) and right-padded to the longest."""
        texts = [_text("batch", t) for t in texts]
        with self._lock:
            try:
                if max_length is not None:
                    self._tk.enable_truncation(int(max_length))
                self._tk.enable_padding(pad_id=self._pad_id, pad_token=self._tk.id_to_token(self._pad_id) or "[PAD]")
                encs = self._tk.encode_batch(texts)
            finally:
                self._tk.no_padding()
                self._tk.no_truncation()
        n, length = len(encs), len(encs[0].ids) if encs else 0
        arrays = [np.array([getattr(e, f) for e in encs], np.int64).reshape(n, length)
                  for f in ("ids", "attention_mask", "type_ids")]
        return Batch(*arrays)


def _text(op, t) -> str:
    if not isinstance(t, str):
        raise TypeError(f"Tokenizer.{op}: expected str, got {type(t).__name__}")
    return t
