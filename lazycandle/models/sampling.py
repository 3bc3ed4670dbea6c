"""Picking the next token from a row of logits, on lazycandle ops: greedy (argmax), temperature,
top-k (lc topk) and top-p (descending sort + cumsum).  The only host work is drawing one uniform
number per token from a seeded NumPy generator; the pick is the count of cumulative
probabilities below it, computed by the engine."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import nn
from ..dtype import i64
from ..tensor import tensor


@dataclass
class Sampler:
    """temperature 0 is greedy; top_k 0 and top_p 1.0 keep every token."""
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"Sampler: need temperature >= 0, top_k >= 0 and 0 < top_p <= 1, got "
                             f"temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}")
        self._rng = np.random.default_rng(self.seed)

    def __call__(self, logits) -> int:
        """The next token id for `logits`, a 1-D lc tensor (or array) over the vocabulary."""
        if not hasattr(logits, "_node"):
            logits = tensor(logits)
        if logits.rank != 1:
            raise ValueError(f"Sampler: logits must be 1-D (vocab,), got shape {logits.shape}")
        if self.temperature == 0.0:
            return int(logits.argmax(0).item())
        probs, ids = candidates(logits, self.temperature, self.top_k, self.top_p)
        u = float(self._rng.random())
        pick = (probs.cumsum(0) <= u * probs.sum()).astype(probs.dtype).sum().astype(ids.dtype)
        last = probs.shape[0] - 1
        return int(ids[pick.clip(0, last).unsqueeze(0)].item())


    def pick(self, rows) -> list:
        """One token id per row of `rows`, a (batch, vocab) array or tensor: greedy is one
        argmax over the batch; sampling draws row by row from the one seeded generator."""
        rows = rows if hasattr(rows, "_node") else tensor(rows)
        if self.temperature == 0.0:
            return [int(i) for i in rows.argmax(-1).numpy()]
        return [self(rows[j]) for j in range(rows.shape[0])]


def candidates(logits, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """(probabilities, token ids) of the tokens sampling may pick, most likely first; the
    probabilities are unnormalised outside the kept set's total (they sum to the kept mass)."""
    scaled = logits * (1.0 / temperature)
    vocab = scaled.shape[0]
    if 0 < top_k < vocab:
        values, ids = scaled.topk(top_k)
    else:
        values, ids = scaled.sort_last_dim(asc=False)
        ids = ids.astype(i64)
    probs = nn.softmax(values, 0)
    if top_p < 1.0:
        before = probs.cumsum(0) - probs           # mass of the more likely tokens
        probs = probs.masked_fill(before >= top_p, 0.0)   # the most likely one always stays
    return probs, ids

