"""The gradients of a GPT-2-style block (pre-norm layer_norm, causal multi-head attention,
tanh-gelu MLP, residuals; bench/gpt2_block.py's model code) against a backward pass written by
hand in NumPy, in f64: every parameter's gradient and the input's."""
import math

import numpy as np

import lazycandle as lc
from bench import gpt2_block as G


def _ln_forward(x, g, b):
    xc = x - x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(-1, keepdims=True) + G.EPS)
    xhat = xc * rstd
    return xhat * g + b, (xhat, rstd, g)


def _ln_backward(dy, cache):
    """d layer_norm: returns (dx, dgamma, dbeta)."""
    xhat, rstd, g = cache
    dxhat = dy * g
    dx = rstd * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    return dx, (dy * xhat).sum((0, 1)), dy.sum((0, 1))


def _linear_backward(dy, x, w):
    """y = x @ w.T + b: returns (dx, dw, db)."""
    flat_dy, flat_x = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    return dy @ w, flat_dy.T @ flat_x, flat_dy.sum(0)


def _gelu_tanh_grad(f):
    c = math.sqrt(2 / math.pi)
    th = np.tanh(c * (f + 0.044715 * f ** 3))
    return 0.5 * (1 + th) + 0.5 * f * (1 - th ** 2) * c * (1 + 3 * 0.044715 * f ** 2)


def block_backward(x, p, mask, n_head, dout):
    """Forward the block in NumPy keeping what the backward needs, then the backward by hand.
    Returns (out, dx, {param: grad})."""
    b, t, d = x.shape
    hd = d // n_head
    scale = 1.0 / math.sqrt(hd)
    heads = lambda z: z.reshape(b, t, n_head, hd).transpose(0, 2, 1, 3)       # noqa: E731
    merge = lambda z: z.transpose(0, 2, 1, 3).reshape(b, t, d)                # noqa: E731
    # forward
    a1, ln1 = _ln_forward(x, p["ln1_g"], p["ln1_b"])
    h = a1 @ p["w_qkv"].T + p["b_qkv"]
    q, k, v = (heads(z) for z in np.split(h, 3, -1))
    s = q @ k.transpose(0, 1, 3, 2) * scale + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    att = e / e.sum(-1, keepdims=True)
    y = merge(att @ v)
    x1 = x + y @ p["w_proj"].T + p["b_proj"]
    a2, ln2 = _ln_forward(x1, p["ln2_g"], p["ln2_b"])
    f = a2 @ p["w_fc"].T + p["b_fc"]
    u = G._np_gelu(f)
    out = x1 + u @ p["w_out"].T + p["b_out"]
    # backward
    grads = {}
    du, grads["w_out"], grads["b_out"] = _linear_backward(dout, u, p["w_out"])
    df = du * _gelu_tanh_grad(f)
    da2, grads["w_fc"], grads["b_fc"] = _linear_backward(df, a2, p["w_fc"])
    dx1_ln, grads["ln2_g"], grads["ln2_b"] = _ln_backward(da2, ln2)
    dx1 = dout + dx1_ln
    dy, grads["w_proj"], grads["b_proj"] = _linear_backward(dx1, y, p["w_proj"])
    dyh = heads(dy)
    datt = dyh @ v.transpose(0, 1, 3, 2)
    dv = att.transpose(0, 1, 3, 2) @ dyh
    ds = att * (datt - (datt * att).sum(-1, keepdims=True)) * scale
    dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
    dh = np.concatenate([merge(dq), merge(dk), merge(dv)], -1)
    da1, grads["w_qkv"], grads["b_qkv"] = _linear_backward(dh, a1, p["w_qkv"])
    dx_ln, grads["ln1_g"], grads["ln1_b"] = _ln_backward(da1, ln1)
    return out, dx1 + dx_ln, grads


def test_gpt2_block_gradients_match_a_hand_written_numpy_backward():
    rng = np.random.default_rng(5)
    b, t, d, heads = 2, 5, 8, 2
    params = {k: v.astype(np.float64) * (5.0 if k.startswith("w") else 1.0)
              for k, v in G.init_params(d, 1, seed=7)[0].items()}
    x = rng.standard_normal((b, t, d))
    mask = G.causal_mask(t).astype(np.float64)
    dout = rng.standard_normal((b, t, d))
    names = sorted(params)

    def loss(x, *ps):
        return (G.block(x, dict(zip(names, ps)), lc.tensor(mask), heads) * lc.tensor(dout)).sum()

    value, grads = lc.value_and_grad(loss, tuple(range(1 + len(names))))(
        lc.tensor(x), *[lc.tensor(params[k]) for k in names])
    out, dx, want = block_backward(x, params, mask, heads, dout)
    np.testing.assert_allclose(value.numpy(), (out * dout).sum(), rtol=1e-12)
    np.testing.assert_allclose(grads[0].numpy(), dx, rtol=1e-10, atol=1e-12, err_msg="x")
    for name, g in zip(names, grads[1:]):
        np.testing.assert_allclose(g.numpy(), want[name], rtol=1e-10, atol=1e-12, err_msg=name)
