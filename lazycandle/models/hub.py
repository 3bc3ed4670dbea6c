"""`lc.models.from_pretrained(path)`: a Hugging Face model folder -> a lazycandle model.

The folder holds config.json and model.safetensors, or model.safetensors.index.json and its
shards.  config.json's `model_type` picks the builder module from BUILDERS; the builder reads
the config through an HFConfig and takes its tensors from a VarBuilder, then every checkpoint
tensor it never asked for is an error (strict) or a warning, as is every config value it does
not implement: loading never silently drops what a checkpoint says.

Builder contract (models/gpt2.py, llama.py, bert.py each define it):

    def from_config(cfg: HFConfig, vb: lc.nn.VarBuilder):
        '''Build the model; read fields with cfg.get(name[, default]) (missing without a
        default: SerializationError naming field and file); for a value the model does not
        implement call cfg.unsupported(field, why) (raises when strict, warns otherwise);
        take tensors with vb.get(shape, name) / vb.pp(prefix); vb.dtype is the requested dtype
        (None: keep the checkpoint's).  A tensor the model may legitimately skip (a tied head
        that equals the embedding, a buffer like position_ids) is marked with vb.mark_used.'''

from_pretrained then sets `model.tokenizer` (Tokenizer or None), `model.config` stays the
model's own, and `model.hf_config` is the config dict.  A sequence longer than the model's
positions raises PromptTooLong (defined here so every model raises the same class:
generation.py should import it from here) through check_length, naming both lengths."""
from __future__ import annotations

import importlib
import json
import os
import warnings

from ..errors import IndexOutOfBounds, SerializationError
from ..nn_layers import VarBuilder, quantize_linears

BUILDERS = {"gpt2": "lazycandle.models.gpt2", "llama": "lazycandle.models.llama", "bert": "lazycandle.models.bert"}
_MISSING = object()


class HFConfig:
    """config.json's fields, read by a builder: `get` names missing fields and the file,
    `unsupported` rejects (strict) or warns about a value the model does not implement."""

    def __init__(self, data: dict, path: str, strict: bool = True):
        self.data, self.path, self.strict = data, path, strict

    def __contains__(self, field) -> bool:
        return field in self.data

    def get(self, field, default=_MISSING):
        v = self.data.get(field, default)
        if v is _MISSING:
            raise SerializationError(f"{self.path}: config field {field!r} is missing")
        return default if v is None and default is not _MISSING else v

    def unsupported(self, field, why: str) -> None:
        report(self.strict, f"{self.path}: config field {field!r} = {self.data.get(field)!r}: {why}")


def report(strict: bool, message: str) -> None:
    """SerializationError when strict, else a warning (what the loaders do with what they
    cannot honour)."""
    if strict:
        raise SerializationError(message)
    warnings.warn(message, stacklevel=3)


class PromptTooLong(IndexOutOfBounds, ValueError):
    """A prompt (or prompt + generated tokens) longer than the model's position table."""


def check_length(n, max_positions: int, what="sequence", tensor=None) -> None:
    """A `what` of n tokens must fit the model's max_position_embeddings.  A length that is a
    named dim (lc.Size) is checked when the program binds it: the check rides on `tensor`."""
    from ..named_dims import is_symbolic, require, require_ge0
    message = f"{what} length {n} exceeds the model's max_position_embeddings {max_positions}"
    if not is_symbolic(n):
        if n > max_positions:
            raise PromptTooLong(message)
        return
    checks = []
    require_ge0(checks, max_positions - n, PromptTooLong, message)
    if checks:
        require(tensor._node, checks)


def from_pretrained(path, dtype=None, strict: bool = True, quantize=None):
    """The model in folder `path` (see the module docstring).  With `quantize` (a GGML kind,
    "q4_0" ...) every Linear whose in-dim is a whole number of blocks becomes an lc.nn.QLinear
    (checkpoint tensors are mapped, so with dtype=None only the blocks are held in memory);
    norms, embeddings and biases stay float."""
    path = os.fspath(path)
    if quantize is not None:
        from ..qtensor import _format
        _format(quantize, "from_pretrained")       # an unknown kind fails before any loading
    cfg = HFConfig(_read_json(os.path.join(path, "config.json")), os.path.join(path, "config.json"), strict)
    kind = cfg.get("model_type")
    if kind not in BUILDERS:
        raise SerializationError(f"{cfg.path}: config field 'model_type' = {kind!r} is not supported "
                                 f"(known: {', '.join(BUILDERS)})")
    vb = VarBuilder.from_safetensors(checkpoint_files(path), dtype)
    model = importlib.import_module(BUILDERS[kind]).from_config(cfg, vb)
    for name in vb.unused():
        report(strict, f"{vb.file_of(name)}: tensor {name!r}: in the checkpoint but not used by the {kind} model")
    if quantize is not None:
        quantize_linears(model, quantize)
    from .tokenizer import Tokenizer
    tok = os.path.join(path, "tokenizer.json")
    model.tokenizer = Tokenizer.from_file(tok) if os.path.isfile(tok) else None
    model.hf_config = cfg.data
    return model


def checkpoint_files(path) -> list:
    """model.safetensors, or the shards model.safetensors.index.json lists (each must exist)."""
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        wmap = _read_json(index).get("weight_map")
        if not isinstance(wmap, dict) or not wmap:
            raise SerializationError(f"{index}: needs a non-empty 'weight_map' object")
        shards = {}                                 # shard file -> its first tensor (for messages)
        for name, shard in wmap.items():
            shards.setdefault(shard, name)
        for shard, name in shards.items():
            if not os.path.isfile(os.path.join(path, shard)):
                raise SerializationError(f"{index}: shard {shard!r} (holding tensor {name!r}) is missing "
                                         f"from {path}")
        files = [os.path.join(path, s) for s in shards]
        return files
    if os.path.isfile(single):
        return [single]
    raise SerializationError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _read_json(file) -> dict:
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise SerializationError(f"{file}: missing") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SerializationError(f"{file}: not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise SerializationError(f"{file}: a JSON {type(data).__name__}, not an object")
    return data
