"""Row normalisations (softmax, log_softmax, layer_norm, rms_norm, logsumexp over the last dim):
values against NumPy across dtypes, layouts, odd row lengths and -inf/NaN rows; low precision
bit for bit equal to op at a time (fusion never changes a low-precision value); and the kernel
counts issue 10 asks for (ONE row kernel each), which are strict xfails until the row kernel lands."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.compiler import schedule_capture
from lazycandle.ir.graph import capture
from conftest import assert_same, data, ids, rng_for

EPS = 1e-5
ROW_LENGTHS = [1, 7, 9, 17, 1000]       # 1, W-1 / W+1 at W = 8, 16, a long row
HIGH = [lc.f32, lc.f64]
LOW = [lc.f16, lc.bf16]


def _lse(x):
    m = np.max(x, -1, keepdims=True)
    return m + np.log(np.sum(np.exp(x - m), -1, keepdims=True))


def _softmax(x):
    e = np.exp(x - np.max(x, -1, keepdims=True))
    return e / np.sum(e, -1, keepdims=True)


def _layer_norm(x, g, b):
    xc = x - x.mean(-1, keepdims=True)
    return xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + EPS) * g + b


def _rms_norm(x, a):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * a


OPS = {
    "softmax": (lambda x, g, b: lc.nn.softmax(x, -1), lambda x, g, b: _softmax(x)),
    "log_softmax": (lambda x, g, b: lc.nn.log_softmax(x, -1), lambda x, g, b: x - _lse(x)),
    "layer_norm": (lambda x, g, b: lc.nn.layer_norm(x, g, b, EPS), _layer_norm),
    "rms_norm": (lambda x, g, b: lc.nn.rms_norm(x, g, EPS), lambda x, g, b: _rms_norm(x, g)),
    "logsumexp": (lambda x, g, b: x.logsumexp(-1, keepdim=True), lambda x, g, b: _lse(x)),
}


def _inputs(dt, rows, n, seed):
    rng = rng_for("rows", dt.name, rows, n, seed)
    return data(dt, (rows, n), rng), data(dt, (n,), rng, "pos"), data(dt, (n,), rng)


@pytest.mark.parametrize("n", ROW_LENGTHS)
@pytest.mark.parametrize("dt", HIGH, ids=ids(HIGH))
@pytest.mark.parametrize("op", sorted(OPS))
def test_row_op_matches_numpy(op, dt, n):
    x, g, b = _inputs(dt, 5, n, 0)
    got = OPS[op][0](lc.tensor(x), lc.tensor(g), lc.tensor(b)).numpy()
    want = OPS[op][1](x.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    tol = 2e-5 if dt is lc.f32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)


def _materialised(op, x, g, b):
    """The op with every intermediate realised: the op-at-a-time reference (each op its own
    kernel) that a fused low-precision result must equal bit for bit."""
    def r(t):
        return lc.tensor(t.numpy())
    if op == "softmax":
        e = r(r(x.broadcast_sub(r(x.max_keepdim(-1)))).exp())
        return e.broadcast_div(r(e.sum_keepdim(-1)))
    if op == "layer_norm":
        xc = r(x.broadcast_sub(r(x.mean_keepdim(-1))))
        rs = r(r(r(r(xc.sqr()).mean_keepdim(-1)) + EPS).sqrt())
        return r(r(xc.broadcast_div(rs)).broadcast_mul(g)).broadcast_add(b)
    xs = r(r(x.sqr()).mean_keepdim(-1))
    rs = r(r(xs + EPS).sqrt())
    return r(x.broadcast_div(rs)).broadcast_mul(g)


@pytest.mark.parametrize("n", [9, 1000])
@pytest.mark.parametrize("dt", LOW, ids=ids(LOW))
@pytest.mark.parametrize("op", ["softmax", "layer_norm", "rms_norm"])
def test_low_precision_row_op_is_bit_exact_with_op_at_a_time(op, dt, n):
    x, g, b = (lc.tensor(a) for a in _inputs(dt, 4, n, 1))
    fused = OPS[op][0](x, g, b).numpy()
    assert_same(fused, _materialised(op, x, g, b).numpy(), f"{op} {dt.name}", bits=True)


@pytest.mark.parametrize("layout", ["transposed", "narrowed"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_row_op_on_a_strided_input(op, layout):
    x, g, b = _inputs(lc.f32, 40, 33, 2)
    if layout == "transposed":
        base = np.ascontiguousarray(x[:33].T)                # (33, 33): rows strided
        t, ref = lc.tensor(base).t(), base.T
        g, b = g[:33], b[:33]
    else:
        t, ref = lc.tensor(x).narrow(1, 3, 29), x[:, 3:32]
        g, b = g[3:32], b[3:32]
    got = OPS[op][0](t, lc.tensor(g), lc.tensor(b)).numpy()
    want = OPS[op][1](ref.astype(np.float64), g.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-4)


def test_softmax_of_an_all_minus_inf_row_is_nan_like_numpy():
    x = np.array([[-np.inf] * 5, [0.0, 1.0, 2.0, 3.0, 4.0]], np.float32)
    got = lc.nn.softmax(lc.tensor(x), -1).numpy()
    with np.errstate(invalid="ignore"):
        want = _softmax(x.astype(np.float64))
    assert np.isnan(got[0]).all() and np.isnan(want[0]).all()
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)


def test_softmax_gives_zeros_where_a_row_is_masked_with_minus_inf():
    x = np.random.default_rng(3).normal(size=(6, 19)).astype(np.float32)
    x[np.triu_indices(6, 1, 19)] = -np.inf                   # causal-style mask
    got = lc.nn.softmax(lc.tensor(x), -1).numpy()
    assert (got[np.triu_indices(6, 1, 19)] == 0).all()
    np.testing.assert_allclose(got, _softmax(x.astype(np.float64)), rtol=1e-6, atol=1e-7)


def test_softmax_row_with_a_nan_is_nan_and_others_are_untouched():
    x = np.random.default_rng(4).normal(size=(3, 17)).astype(np.float32)
    x[1, 5] = np.nan
    got = lc.nn.softmax(lc.tensor(x), -1).numpy()
    assert np.isnan(got[1]).all()
    np.testing.assert_allclose(got[[0, 2]], _softmax(x[[0, 2]].astype(np.float64)), rtol=1e-6)


def test_row_op_on_zero_rows_is_empty():
    x = np.zeros((0, 8), np.float32)
    for op in sorted(OPS):
        got = OPS[op][0](lc.tensor(x), lc.tensor(np.ones(8, np.float32)), lc.tensor(np.zeros(8, np.float32)))
        assert got.numpy().shape[0] == 0, op


def _kernels(t):
    kernels, _, notes = schedule_capture(capture([t._node]))
    return kernels


@pytest.mark.parametrize("op", sorted(OPS))
def test_row_op_is_one_kernel(op):
    x, g, b = (lc.tensor(a) for a in _inputs(lc.f32, 64, 128, 5))
    assert len(_kernels(OPS[op][0](x, g, b))) == 1
