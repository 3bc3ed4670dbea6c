"""What GPT-2 and Llama share above the forward pass: `model(ids)` (full sequences) and
`model.generate(...)` (a batch of prompts of different lengths, left-padded, one compiled decode
step for the whole batch), with the timings a benchmark reads (`run`).

A model subclasses CausalLM and defines `config` (with `max_len` and `vocab`),
`new_cache(batch, max_len, dtype=None)` and `forward(ids, cache, step, last=False)` (generation.py)."""
from __future__ import annotations

import json
import os
import time
import warnings
from itertools import chain
from dataclasses import dataclass, field

import numpy as np

from ..autograd import no_grad
from ..caches import cache_info
from ..dtype import i64, u8
from ..errors import IndexOutOfBounds, SerializationError, ShapeMismatch, SymbolicSizeError
from ..graph_api import compile
from ..nn_layers import Module
from ..tensor import Tensor, placeholder, realize, tensor
from .generation import KVCache, Step
from .hub import check_length


class CausalLM(Module):
    tokenizer = None
    eos_token_id = None         # an int, a list of ints, or None (set from the folder's config)
    bos_token_id = None

    def __call__(self, ids) -> Tensor:
        """Logits (b, t, vocab), f32, of full sequences `ids` (a list of ints, a list of equal
        length lists, or a (b, t) integer array / tensor), no cache."""
        ids = ids if isinstance(ids, Tensor) else tensor(_as_rows(ids), i64)
        if ids.rank != 2:
            raise ShapeMismatch(f"{type(self).__name__}: ids must be (batch, tokens), got shape {ids.shape}")
        check_length(ids.shape[1], self.config.max_len, tensor=ids)
        return self.forward(ids, None, Step(0, ids.shape[1]))

    def generate(self, ids, max_new_tokens: int, sampler=None, eos_token_id=None, stop=None,
                 return_logits: bool = False):
        """The new tokens of each prompt (`ids`: a list of ints, or a list of such lists of any
        lengths): a list (a list of lists); with return_logits also the (n_new, vocab) f32
        logits each token was picked from.  Stops a sequence after `eos_token_id` (default:
        the config's; the token is kept) or once its text contains a `stop` string (needs
        model.tokenizer).  An empty prompt starts from the config's bos token (none: nothing
        is generated)."""
        if hasattr(ids, "_node") or isinstance(ids, np.ndarray):
            ids = np.asarray(ids).tolist()
        batched = isinstance(ids, (list, tuple)) and bool(ids) and not _is_int(ids[0])
        prompts = [[int(t) if _is_int(t) else t for t in p] for p in ids] if batched else \
            [[int(t) if _is_int(t) else t for t in ids]]
        gen = run(self, prompts, max_new_tokens, sampler, eos_token_id, stop, keep_logits=return_logits)
        tokens = gen.tokens if batched else gen.tokens[0]
        if not return_logits:
            return tokens
        return tokens, (gen.logits if batched else gen.logits[0])


def set_special_ids(model, cfg, bos=None, eos=None) -> None:
    """model.bos_token_id / eos_token_id from config.json (defaults `bos`, `eos`), then from the
    folder's generation_config.json when it has them (where transformers' generate reads them:
    instruction-tuned Llamas list their end-of-turn token there)."""
    model.bos_token_id, model.eos_token_id = cfg.get("bos_token_id", bos), cfg.get("eos_token_id", eos)
    gen = os.path.join(os.path.dirname(cfg.path), "generation_config.json")
    if os.path.isfile(cfg.path) and os.path.isfile(gen):
        try:
            with open(gen, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise SerializationError(f"{gen}: not readable JSON: {e}") from None
        model.bos_token_id = data.get("bos_token_id", model.bos_token_id)
        model.eos_token_id = data.get("eos_token_id", model.eos_token_id)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer))


def _as_rows(ids) -> np.ndarray:
    try:
        a = np.asarray(ids)
    except ValueError:
        a = np.asarray(ids, dtype=object)
    if a.dtype == object:
        raise ShapeMismatch("ids: the sequences of a batch must have one length for model(ids) "
                            "(generate takes prompts of different lengths)")
    return (a.reshape(1, -1) if a.ndim == 1 else a).astype(np.int64)


# ---- one batch of sequences being generated --------------------------------------------------
class Session:
    """A batch of sequences sharing one KV cache (batch, kv_heads, slots, head_dim).
    `prefill(prompts)` runs the left-padded prompts eagerly; `decode(tokens)` one new token per
    sequence.  Decode steps run ONE compiled Program cached on the model per cache dtype
    (DecodeProgram), whatever the batch size, cache length and filled length (named dims "b",
    "M" and "S": a new size binds the same program, it compiles nothing); the attention reads
    the filled slots of the cache, no more.  The padding comes as data (`attend`, whose length
    binds S), the caches go in (read in place) and only the step's new keys and values come
    back, written into the caches by KVCache.commit, so a step builds no graph, compiles
    nothing and writes O(new rows) of cache.  `compiled=False` builds each decode step eagerly
    instead.  Both return the last position's logits, a (batch, vocab) f32 array.  `max_len`
    (at most the model's) is how many positions the session holds."""

    def __init__(self, model, batch: int, max_len: int, compiled: bool = True):
        self.model, self.compiled = model, compiled
        self.batch, self.max_len, self.pos = batch, min(max_len, model.config.max_len), 0
        # compiled: a slot to spare (decode), at the decode program's first candidate length: the
        # program is built at the first decode step, after the prompt's token (_decoder)
        self.cache = model.new_cache(batch, first_cache_len(self.max_len + 1) if compiled else self.max_len)
        self.fitted = False              # whether the cache's length is the decode program's (_decoder)
        self.pad = None                  # (batch,) i64 tensor of left padding, when any
        # per cache slot: 1 once it holds one of the sequence's tokens (0: padding, or not yet written)
        self.attend = np.zeros((batch, self.cache.max_len), np.uint8)

    def _room(self, n: int):
        if self.pos + n > self.max_len:
            raise IndexOutOfBounds(f"generate: {self.pos + n} positions exceed the cache's max_len {self.max_len}")

    def prefill(self, prompts) -> np.ndarray:
        """Run `prompts` (one list of ids per sequence, left-padded to the longest)."""
        if len(prompts) != self.batch:
            raise IndexOutOfBounds(f"prefill: {len(prompts)} prompts for a batch of {self.batch}")
        t = max(len(p) for p in prompts)
        if self.pos == 0 and any(len(p) < t for p in prompts):
            self.pad = tensor(np.array([t - len(p) for p in prompts], np.int64))
        ids = np.array([[0] * (t - len(p)) + list(p) for p in prompts], np.int64)
        return self._eager(ids)

    def decode(self, tokens) -> np.ndarray:
        ids = np.asarray(tokens, np.int64).reshape(self.batch, 1)
        if not self.compiled:
            return self._eager(ids)
        self._room(1)
        decoder = self._decoder()
        n = decoder.attended(self.batch, self.pos, min(self.cache.max_len, self.attend.shape[1]))
        feeds = {"ids": ids, "attend": np.ascontiguousarray(self.attend[:, :n])}
        feeds.update({f"k{i}": a for i, a in enumerate(self.cache.k)})
        feeds.update({f"v{i}": a for i, a in enumerate(self.cache.v)})
        logits, *rows = decoder.program.run(**feeds)
        del feeds                       # the caches' only holder is the cache again (donation)
        self._commit(1, rows)
        return logits

    def _eager(self, ids: np.ndarray) -> np.ndarray:
        self._room(ids.shape[1])
        step = Step(self.pos, ids.shape[1], pad=self.pad)
        with no_grad():     # (trainable weights would make realized nodes keep the graph)
            logits = self.model.forward(tensor(ids, i64), self.cache, step, last=True)[:, -1]
        rows = self.cache.rows()
        realize(logits, *rows)
        out = logits.numpy()
        del logits                      # the graph reads the caches: drop it before commit (donation)
        self._commit(ids.shape[1], rows)
        return out

    def _commit(self, t: int, rows) -> None:
        self.cache.commit(self.pos, rows)
        end = min(self.pos + t, self.attend.shape[1])
        self.attend[:, self.pos:end] = 1
        if self.pad is not None and self.pos == 0:
            self.attend[np.arange(self.attend.shape[1]) < self.pad.numpy()[:, None]] = 0
        self.pos += t

    def _decoder(self) -> "DecodeProgram":
        """The decode program; at the first step the cache moves to a length of its size class
        (cache_len) when its own is not one (e.g. equal to one of the graph's own sizes)."""
        decoder = self._program()
        if self.fitted:
            return decoder
        self.fitted = True
        if not decoder.fits({"b": self.batch, "M": self.cache.max_len}):
            slots = decoder.cache_len(self.batch, self.max_len + 1)
            old, attend = self.cache, self.attend
            self.cache = self.model.new_cache(self.batch, slots, old.dtype)
            if self.pos:
                self.cache.commit(0, [t.narrow(2, 0, self.pos) for t in old.tensors()])
            self.attend = np.zeros((self.batch, slots), np.uint8)
            keep = min(slots, attend.shape[1])
            self.attend[:, :keep] = attend[:, :keep]
        return decoder

    def _program(self) -> "DecodeProgram":
        """The decode step for any batch size > 1 ("b"; one sequence has its own: a size 1 is
        a size class of its own, where broadcasts differ), or for this one when the model's ops
        need a concrete batch (a layer raising SymbolicSizeError, e.g. quantized matmuls choosing
        their tiles by row count) or the batch size is one of the graph's own sizes; any cache
        length and filled length either way."""
        dt = self.cache.k[0].dtype
        progs = self.model.__dict__.setdefault("_programs", {})
        named = ("decode", dt.name)
        fixed = named + (self.batch,)
        if fixed in progs:
            return progs[fixed]
        if self.batch > 1 and progs.get("named batch", True):
            try:
                if named not in progs:
                    progs[named] = DecodeProgram(*self._build("b", dt))
                if progs[named].fits({"b": self.batch}):
                    return progs[named]
            except SymbolicSizeError:
                progs["named batch"] = False
        progs[fixed] = DecodeProgram(*self._build(self.batch, dt))
        return progs[fixed]

    def _build(self, b, dt):
        n, (_, heads, _, hd) = len(self.cache.k), self.cache.k[0].shape
        shape = (b, heads, "M", hd)
        cache = KVCache([placeholder(f"k{i}", shape, dt) for i in range(n)],
                        [placeholder(f"v{i}", shape, dt) for i in range(n)])
        attend = placeholder("attend", (b, "S"), u8)
        step = Step(attend.shape[1], 1, attend=attend)
        with no_grad():
            logits = self.model.forward(placeholder("ids", (b, 1), i64), cache, step, last=True)
        outs = [logits[:, -1]] + cache.rows()
        return compile(outs), outs


BIND_BLOCK = 16      # a step attends to the filled slots rounded up to a multiple of this (masked)


def first_cache_len(least: int) -> int:
    """The first cache length DecodeProgram.cache_len tries for `least` slots."""
    return -(-least // BIND_BLOCK) * BIND_BLOCK + 1


class DecodeProgram:
    """A compiled decode step (`program`) and the sizes of its graph.  The engine binds a new
    size of a named dim by formulas derived once for the program's size class, where every
    named size is >= 2 and differs from every other size of the graph; a size outside it (a
    cache filled to 64 slots in a model of head dim 64) rebinds from the graph, ~0.1-1 s.  So
    the cache is allocated at a length of the class (`cache_len`) and a step attends to a few
    more slots than are filled (`attended`): the extra slots are masked out (attend 0), the
    result is the same.  Rounding the attended count up to BIND_BLOCK slots also binds a new
    size once per block instead of every step: a binding costs ~2-4 ms of Python for GPT-2
    124M's 12 layers (plan formulas, native words, matmul forms), an extra masked slot
    ~0.1 us per layer."""

    def __init__(self, program, outputs):
        self.program = program
        self.sizes, self.named = set(), set()           # int sizes; sizes of named dims (lc.Size)
        seen, stack = set(), [t._node for t in outputs]
        while stack:
            n = stack.pop()
            if id(n) in seen:
                continue
            seen.add(id(n))
            for d in n.shape:
                (self.sizes if d.__class__ is int else self.named).add(d)
            stack.extend(n.srcs)

    def fits(self, env: dict) -> bool:
        """Whether named sizes `env` ({name: int}, of some names) are in the program's class."""
        vals = [d.evaluate(env) for d in self.named if d.names() <= env.keys()]
        return min(vals, default=2) >= 2 and len(set(vals)) == len(vals) and not self.sizes.intersection(vals)

    def cache_len(self, batch: int, least: int) -> int:
        """A cache length in the class for this batch, >= `least` rounded up to a multiple of
        BIND_BLOCK, + 1 (room for `attended` to round up)."""
        m = first_cache_len(least)
        while not self.fits({"b": batch, "M": m}):
            m += 1
        return m

    def attended(self, batch: int, filled: int, slots: int) -> int:
        """How many cache slots a step reads: `filled` rounded up to a multiple of BIND_BLOCK,
        or the next count <= slots in the class (else `filled` itself)."""
        env = {"b": batch, "M": slots}
        for n in chain(range(-(-filled // BIND_BLOCK) * BIND_BLOCK, slots + 1), range(filled, slots + 1)):
            env["S"] = n
            if self.fits(env):
                return n
        return filled


# ---- the generation loop ------------------------------------------------------------------------
@dataclass
class Generation:
    tokens: list                # per sequence, its new tokens
    logits: list                # per sequence, (n_new, vocab) f32 (empty when not kept)
    prefill_ms: float = 0.0     # the prompts' forward pass
    decode_ms: list = field(default_factory=list)   # per decode step (the whole batch)
    kernels_after_warmup: int = 0   # kernels compiled during decode after `warmup` steps

    @property
    def decode_ms_per_token(self) -> float:
        """Median ms of a decode step (one token for every sequence of the batch)."""
        return float(np.median(self.decode_ms)) if self.decode_ms else float("nan")


def run(model, prompts, max_new_tokens: int, sampler=None, eos_token_id=None, stop=None,
        keep_logits: bool = False, warmup: int = 3, compiled: bool = True, on_token=None) -> Generation:
    """Generate for every prompt of `prompts` (lists of ids) as model.generate describes,
    timing the prefill and each decode step.  `on_token(seq, token)` sees each new token."""
    from .sampling import Sampler
    sampler = Sampler() if sampler is None else sampler
    if isinstance(max_new_tokens, bool) or not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    cfg = model.config
    eos = _id_set(model.eos_token_id if eos_token_id is None else eos_token_id)
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if stops and model.tokenizer is None:
        raise ValueError("generate: stop strings need model.tokenizer (the folder has no tokenizer.json)")
    for p in prompts:
        check_length(len(p), cfg.max_len, "prompt")
        bad = [t for t in p if not _is_int(t) or not 0 <= t < cfg.vocab]
        if bad:
            raise IndexOutOfBounds(f"generate: token id {bad[0]!r} is outside the vocabulary (0..{cfg.vocab - 1})")
    bos = model.bos_token_id
    bos = bos if _is_int(bos) and 0 <= bos < cfg.vocab else None
    prompts = [p if p or bos is None else [int(bos)] for p in prompts]
    live = [i for i, p in enumerate(prompts) if p]
    gen = Generation([[] for _ in prompts], [[] for _ in prompts])
    longest = max((len(prompts[i]) for i in live), default=0)
    n = min(max_new_tokens, cfg.max_len - longest)
    if n < max_new_tokens and live:
        warnings.warn(f"generate: {max_new_tokens} new tokens after a prompt of {longest} pass the model's "
                      f"max_position_embeddings {cfg.max_len}; generating {n}", stacklevel=3)
    if live and n > 0:
        _loop(model, [prompts[i] for i in live], n, sampler, eos, stops, keep_logits, warmup, compiled,
              on_token, gen, live)
    vocab = cfg.vocab
    gen.logits = [np.stack(rows).astype(np.float32) if rows else np.zeros((0, vocab), np.float32)
                  for rows in gen.logits] if keep_logits else []
    return gen


def _loop(model, prompts, n, sampler, eos, stops, keep_logits, warmup, compiled, on_token, gen, live):
    b = len(prompts)
    session = Session(model, b, min(max(len(p) for p in prompts) + n, model.config.max_len), compiled)
    t0 = time.perf_counter()
    logits = session.prefill(prompts)
    gen.prefill_ms = (time.perf_counter() - t0) * 1e3
    done, kernels_at = [False] * b, None
    for step in range(n):
        picks = sampler.pick(logits)
        for j, tok in enumerate(picks):
            if done[j]:
                continue
            i = live[j]
            gen.tokens[i].append(tok)
            if keep_logits:
                gen.logits[i].append(np.array(logits[j], np.float32))
            if on_token is not None:
                on_token(i, tok)
            done[j] = tok in eos or _hit(model.tokenizer, gen.tokens[i], stops)
        if all(done) or step == n - 1:
            break
        if step == warmup:
            kernels_at = cache_info()["kernels"]
        t0 = time.perf_counter()
        logits = session.decode(picks)
        gen.decode_ms.append((time.perf_counter() - t0) * 1e3)
    gen.kernels_after_warmup = 0 if kernels_at is None else cache_info()["kernels"] - kernels_at


def _id_set(ids) -> set:
    if ids is None:
        return set()
    return {int(ids)} if _is_int(ids) else {int(i) for i in ids}


def _hit(tokenizer, tokens, stops) -> bool:
    """Whether the text of `tokens` contains a stop string (only its tail can be new)."""
    if not stops:
        return False
    tail = tokenizer.decode(tokens[-max(8, max(len(s) for s in stops) + 4):])
    return any(s in tail for s in stops)
