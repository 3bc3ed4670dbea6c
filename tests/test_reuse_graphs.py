"""Graphs with heavy reuse compile in time near-linear in their size (issue 37, defect 1).

A normalisation loop `y = (y - y.mean_keepdim(0)) * 1.001` reads every value twice; the row
kernel builder once keyed its instructions by nested tuples repeating each shared
subexpression (hashing them was exponential in the depth: n=60 never finished), and a row
kernel fusing a long chain of reductions recomputed ever longer cones in each pass (code
quadratic in the chain).  These tests build such graphs and check values against NumPy; the
10,000-op forms are behind `-m slow` (seconds each, most of it LLVM on the first run)."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.codegen.row import value_numbers
from lazycandle.compiler import schedule_capture
from lazycandle.ir.graph import capture
from lazycandle.ir.ops import OPS, REDUCE
from lazycandle.ir.rows import MAX_ROW_REDUCTIONS


def _normalise_loop(x, n):
    for _ in range(n):
        x = x - x.mean(0, keepdims=True) if isinstance(x, np.ndarray) else x - x.mean_keepdim(0)
        x = x * np.float32(1.001) if isinstance(x, np.ndarray) else x * 1.001
    return x


def _numpy_loop(x, n):
    for _ in range(n):
        x = (x - x.mean(0, keepdims=True, dtype=np.float64).astype(np.float32)) * np.float32(1.001)
    return x


@pytest.mark.parametrize("n", [60, 200])
def test_normalisation_loop_with_reused_values_realizes_like_numpy(n):
    x0 = np.linspace(-1, 1, 257, dtype=np.float32)
    got = _normalise_loop(lc.tensor(x0), n).numpy()
    np.testing.assert_allclose(got, _numpy_loop(x0, n), rtol=1e-5, atol=1e-6)


def test_row_kernels_of_a_reduction_chain_stay_bounded():
    """Each row kernel of a 60-step chain makes at most MAX_ROW_REDUCTIONS passes."""
    y = _normalise_loop(lc.tensor(np.linspace(-1, 1, 33, dtype=np.float32)), 60)
    kernels, _, _ = schedule_capture(capture([y._node]))
    rows = [k for k in kernels if k.kind == "row"]
    assert rows
    for k in rows:
        passes = sum(1 for instr in k.spec.instrs if OPS[instr[0]].category == REDUCE)
        assert passes <= MAX_ROW_REDUCTIONS


def test_value_numbers_are_linear_in_a_dag_of_diamonds():
    """2,000 levels of x_{k+1} = x_k * x_k: nested keys would be 2^2000 long."""
    instrs = [("copy", None, "f32", "f32", (("i", 0),))]
    for k in range(2000):
        instrs.append(("mul", None, "f32", "f32", (("v", k), ("v", k))))
    instrs.append(("mul", None, "f32", "f32", (("v", 0), ("v", 0))))   # the same value as instr 1
    nums = value_numbers(instrs)
    assert len(set(nums)) == 2001 and nums[-1] == nums[1]


def _two_readers(x, n):
    """Every value read by two later ops: a, b = b, (a + b) * 0.5."""
    a, b = x, x * 0.5
    for _ in range(n):
        a, b = b, (a + b) * 0.5
    return b


def test_a_graph_where_every_value_is_read_twice_realizes_like_numpy():
    x0 = np.linspace(-1, 1, 65, dtype=np.float32)
    got = _two_readers(lc.tensor(x0), 1000).numpy()
    np.testing.assert_allclose(got, _two_readers(x0, 1000), rtol=1e-6, atol=1e-7)   # NumPy: f32 too


def test_gradient_through_a_graph_of_diamonds():
    """d/dx of sum(f^k(x)) with f(y) = y * y + y reused: the backward graph reuses too."""
    def f(x):
        for _ in range(40):
            x = (x * x + x) * 0.5
        return x.sum()
    x0 = np.linspace(-0.5, 0.5, 17)
    g = lc.grad(f)(lc.tensor(x0)).numpy()
    y, dy = x0.copy(), np.ones_like(x0)
    for _ in range(40):
        dy, y = dy * (2 * y + 1) * 0.5, (y * y + y) * 0.5
    np.testing.assert_allclose(g, dy, rtol=1e-12, atol=1e-300)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["normalise", "two_readers"])
def test_ten_thousand_op_reuse_graphs_compile_and_match(kind):
    x0 = np.linspace(-1, 1, 257, dtype=np.float32)
    if kind == "normalise":
        got, want = _normalise_loop(lc.tensor(x0), 3334).numpy(), _numpy_loop(x0, 3334)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    else:
        got = _two_readers(lc.tensor(x0), 5000).numpy()
        np.testing.assert_allclose(got, _two_readers(x0, 5000), rtol=1e-6, atol=1e-7)


def test_a_residual_stream_is_read_not_recomputed_by_each_layer_norm():
    """x_{i+1} = x_i + a_i with layer_norm(x_i) of each: recomputing x_i from x_0 and every a_j
    is cheap in ops but reads i + 1 buffers (a 6-layer BERT's last norm read 12); past
    RECOMPUTE_READS the norms read the stored x_i, so the bytes grow linearly in depth."""
    def stream(layers):
        x = lc.placeholder("x", (64, 96))
        outs = []
        for i in range(layers):
            x = x + lc.placeholder(f"a{i}", (64, 96))
            outs.append(lc.nn.layer_norm(x, lc.ones((96,)), lc.zeros((96,)), 1e-5))
        kernels, _, _ = schedule_capture(capture([t._node for t in outs]))
        return sum(len(k.inputs) for k in kernels)
    assert stream(24) <= 4 * 24        # 393 input reads when each norm recomputed its x_i
