"""lc.nn against NumPy."""
import numpy as np
import pytest

import lazycandle as lc

rng = np.random.default_rng(2)


def _softmax(x, d):
    e = np.exp(x - x.max(d, keepdims=True))
    return e / e.sum(d, keepdims=True)


@pytest.mark.parametrize("dt,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_log_softmax(dt, tol, dim):
    x = rng.standard_normal((7, 33)).astype(dt) * 4
    t = lc.tensor(x)
    np.testing.assert_allclose(lc.nn.softmax(t, dim).numpy(), _softmax(x.astype(np.float64), dim), rtol=tol, atol=tol)
    ls = x - x.max(dim, keepdims=True)
    ls = ls - np.log(np.exp(ls).sum(dim, keepdims=True))
    np.testing.assert_allclose(lc.nn.log_softmax(t, dim).numpy(), ls, rtol=tol, atol=tol)


def test_softmax_last_dim_transposed():
    x = rng.standard_normal((20, 9)).astype(np.float32)
    np.testing.assert_allclose(lc.nn.softmax_last_dim(lc.tensor(x).t()).numpy(), _softmax(x.T, -1),
                               rtol=1e-5, atol=1e-6)


def test_norms():
    x = rng.standard_normal((6, 40)).astype(np.float32)
    g = rng.standard_normal(40).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    xd = x.astype(np.float64)
    rms = xd / np.sqrt((xd ** 2).mean(-1, keepdims=True) + 1e-5) * g
    np.testing.assert_allclose(lc.nn.rms_norm(lc.tensor(x), lc.tensor(g), 1e-5).numpy(), rms, rtol=1e-5, atol=1e-5)
    mu = xd.mean(-1, keepdims=True)
    ln = (xd - mu) / np.sqrt(((xd - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b
    np.testing.assert_allclose(lc.nn.layer_norm(lc.tensor(x), lc.tensor(g), lc.tensor(b), 1e-5).numpy(), ln,
                               rtol=1e-5, atol=1e-5)


def test_linear_sigmoid_silu():
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    np.testing.assert_allclose(lc.nn.linear(lc.tensor(x), lc.tensor(w), lc.tensor(b)).numpy(), want,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lc.nn.linear(lc.tensor(x), lc.tensor(w)).numpy(), want - b, rtol=1e-5, atol=1e-5)
    t = lc.tensor(x)
    np.testing.assert_allclose(lc.nn.sigmoid(t).numpy(), 1 / (1 + np.exp(-x)), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(lc.nn.silu(t).numpy(), x / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)


def test_nn_rejects_ints():
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.nn.softmax(lc.tensor(np.ones((2, 2), np.int32)), -1)
