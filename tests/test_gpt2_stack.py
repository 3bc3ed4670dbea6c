"""A GPT-2-small-shaped stack written the natural way (`x = x + attn(ln1(x)); x = x + mlp(ln2(x))`,
causal mask, 12 heads, gelu MLP; model code in bench/gpt2_block.py) runs eagerly, through
`lc.compile` with placeholders and through `lc.jit`, and matches a float64 NumPy reference within
rtol 1e-4 (atol 1e-4 of the output's scale, for elements near zero)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import lazycandle as lc  # noqa: E402
from bench import gpt2_block as G  # noqa: E402

BATCH, SEQ, DIM, HEADS, BLOCKS = 2, 7, 48, 12, 2


@pytest.fixture(scope="module")
def model():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((BATCH, SEQ, DIM)).astype(np.float32)
    blocks, mask = G.init_params(DIM, BLOCKS, seed=3), G.causal_mask(SEQ)
    ref = G.np_stack(x.astype(np.float64), blocks, mask, HEADS)
    return x, blocks, mask, ref


def _close(got, ref):
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_gpt2_stack_eager_matches_numpy(model):
    x, blocks, mask, ref = model
    _close(G.stack(lc.tensor(x), G.as_tensors(blocks), lc.tensor(mask), HEADS).numpy(), ref)


def test_gpt2_stack_compiled_with_placeholders_matches_numpy(model):
    x, blocks, mask, ref = model
    xp = lc.placeholder("x", x.shape, lc.f32)
    prog = lc.compile([G.stack(xp, G.as_placeholders(blocks), lc.tensor(mask), HEADS)])
    _close(prog.run(x=x, **G.feeds(blocks))[0], ref)
    x2 = np.random.default_rng(9).standard_normal(x.shape).astype(np.float32)      # same program, new data
    _close(prog.run(x=x2, **G.feeds(blocks))[0], G.np_stack(x2.astype(np.float64), blocks, mask, HEADS))


def test_gpt2_stack_jit_matches_numpy(model):
    x, blocks, mask, ref = model
    names = list(G.PARAM_SHAPES)

    @lc.jit
    def forward(x, mask, *flat):
        ps = [dict(zip(names, flat[i * len(names):(i + 1) * len(names)])) for i in range(BLOCKS)]
        return G.stack(x, ps, mask, HEADS)
    flat = [p[k] for p in blocks for k in names]
    _close(forward(x, mask, *flat), ref)

