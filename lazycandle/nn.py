"""Neural-network helpers.  Every function is a graph of core ops, so the scheduler fuses it
like any user expression (no hand-written kernels here)."""
from __future__ import annotations

from .errors import UnsupportedDTypeForOp
from .tensor_views import norm_dim


def _float(op, t):
    if not t.dtype.is_float or t.dtype.storage_only:
        raise UnsupportedDTypeForOp(f"{op}: needs a float dtype, got {t.dtype.name}")


def _empty_along(t, dim, op) -> bool:
    """True when `dim` of t has no elements: the result is t's own (empty) shape and no row
    needs a max, so there is nothing to reduce (not an EmptyReduction)."""
    return bool(t.shape) and t.shape[norm_dim(dim, t.shape, op)] == 0


def softmax(t, dim):
    """exp(t - max) / sum(exp(t - max)) along `dim` (numerically stable)."""
    _float("softmax", t)
    if _empty_along(t, dim, "softmax"):
        return t
    e = t.broadcast_sub(t.max_keepdim(dim)).exp()
    return e.broadcast_div(e.sum_keepdim(dim))


def softmax_last_dim(t):
    return softmax(t, -1)


def log_softmax(t, dim):
    _float("log_softmax", t)
    if _empty_along(t, dim, "log_softmax"):
        return t
    x = t.broadcast_sub(t.max_keepdim(dim))
    return x.broadcast_sub(x.exp().sum_keepdim(dim).log())


def rms_norm(x, alpha, eps):
    """x / sqrt(mean(x^2, -1) + eps) * alpha (alpha over the last dim)."""
    _float("rms_norm", x)
    r = (x.sqr().mean_keepdim(-1) + eps).sqrt()
    return x.broadcast_div(r).broadcast_mul(alpha)


def layer_norm(x, gamma, beta, eps):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last dim."""
    _float("layer_norm", x)
    xc = x.broadcast_sub(x.mean_keepdim(-1))
    r = (xc.sqr().mean_keepdim(-1) + eps).sqrt()
    return xc.broadcast_div(r).broadcast_mul(gamma).broadcast_add(beta)


def sigmoid(t):
    return t.sigmoid()


def silu(t):
    return t.silu()


def linear(x, w, b=None):
    """x @ w.T (+ b): w has candle's (out_features, in_features) layout."""
    y = x.broadcast_matmul(w.t())
    return y if b is None else y.broadcast_add(b)
