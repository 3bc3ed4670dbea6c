"""Neural-network helpers.  Every function is a graph of core ops, so the scheduler fuses it
like any user expression (no hand-written kernels here).  Rotary embeddings and attention live
in nn_attention.py and are re-exported here."""
from __future__ import annotations

from math import prod

from .errors import DTypeMismatchBinaryOp, ShapeMismatchBinaryOp, UnsupportedDTypeForOp, names_op
from .tensor_extras import _float_only as _float
from .tensor_views import norm_dim

ID_DTYPES = ("u8", "u32", "i64")


def _ids(op, ids):
    """`ids` as a u8 / u32 / i64 Tensor (lists and arrays are converted)."""
    from .tensor import Tensor, tensor
    if not isinstance(ids, Tensor):
        ids = tensor(ids)
    if ids.dtype.name not in ID_DTYPES:
        raise UnsupportedDTypeForOp(f"{op}: ids must be u8, u32 or i64, got {ids.dtype.name} (shape {ids.shape})")
    return ids


def _same_dtype(op, *ts):
    for t in ts[1:]:
        if t is not None and t.dtype is not ts[0].dtype:
            raise DTypeMismatchBinaryOp(f"{op}: dtype mismatch {ts[0].dtype.name} and {t.dtype.name} "
                                        f"(shapes {ts[0].shape} and {t.shape})")


def _empty_along(t, dim, op) -> bool:
    """True when `dim` of t has no elements: the result is t's own (empty) shape and no row
    needs a max, so there is nothing to reduce (not an EmptyReduction)."""
    size = t.shape[norm_dim(dim, t.shape, op, dtype=t.dtype)] if t.shape else 1
    return size.__class__ is int and size == 0     # (a named dim bound to 0: EmptyReduction at run)


# ---- activations ------------------------------------------------------------------------
@names_op("softmax")
def softmax(t, dim):
    """exp(t - max) / sum(exp(t - max)) along `dim` (numerically stable)."""
    _float("softmax", t)
    if _empty_along(t, dim, "softmax"):
        return t
    e = t.broadcast_sub(_shift(t, dim)).exp()
    return e.broadcast_div(e.sum_keepdim(dim))


@names_op("softmax_last_dim")
def softmax_last_dim(t):
    return softmax(t, -1)


@names_op("log_softmax")
def log_softmax(t, dim):
    _float("log_softmax", t)
    if _empty_along(t, dim, "log_softmax"):
        return t
    x = t.broadcast_sub(_shift(t, dim))
    return x.broadcast_sub(x.exp().sum_keepdim(dim).log())


@names_op("sigmoid")
def sigmoid(t):
    return t.sigmoid()


@names_op("silu")
def silu(t):
    return t.silu()


@names_op("relu")
def relu(t):
    return t.relu()


@names_op("gelu")
def gelu(t, approximate="none"):
    """torch.nn.functional.gelu: the exact erf form by default, the tanh form with
    approximate="tanh" (Tensor.gelu is the tanh form, as in candle)."""
    if approximate == "none":
        return t.gelu_erf()
    if approximate == "tanh":
        return t.gelu()
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


@names_op("dropout")
def dropout(x, p, train=False, seed=None):
    """Identity unless `train`; when training, each element is kept with probability 1 - p
    (a Bernoulli mask drawn like lc.rand, seeded by `seed`) and scaled by 1 / (1 - p)."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p} (shape {x.shape}, {x.dtype.name})")
    _float("dropout", x)
    if not train or p == 0.0:
        return x
    if p == 1.0:
        return x._scalar_like(0)
    from .tensor import rand
    keep = rand(0.0, 1.0, x.shape, seed=seed) >= p
    return keep.where_cond(x * (1.0 / (1.0 - p)), x._scalar_like(0))


# ---- normalisation ----------------------------------------------------------------------
@names_op("rms_norm")
def rms_norm(x, alpha, eps=1e-5):
    """x / sqrt(mean(x^2, -1) + eps) * alpha (alpha over the last dim)."""
    _float("rms_norm", x)
    r = (x.sqr().mean_keepdim(-1) + eps).sqrt()
    y = x.broadcast_div(r)
    return y if alpha is None else y.broadcast_mul(alpha)


@names_op("layer_norm")
def layer_norm(x, gamma, beta, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last dim (gamma / beta may be None)."""
    _float("layer_norm", x)
    xc = x.broadcast_sub(x.mean_keepdim(-1))
    r = (xc.sqr().mean_keepdim(-1) + eps).sqrt()
    y = xc.broadcast_div(r)
    y = y if gamma is None else y.broadcast_mul(gamma)
    return y if beta is None else y.broadcast_add(beta)


def _channel_affine(op, y, weight, bias):
    """y * weight + bias with weight / bias of shape (C,) along dim 1 of y."""
    c = y.shape[1]
    per_channel = (1, c) + (1,) * (y.rank - 2)
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and p.shape != (c,):
            raise ShapeMismatchBinaryOp(f"{op}: {name} must have shape ({c},), got {p.shape} (input {y.shape})")
    _same_dtype(op, y, weight, bias)
    if weight is not None:
        y = y.broadcast_mul(weight.reshape(per_channel))
    return y if bias is None else y.broadcast_add(bias.reshape(per_channel))


@names_op("group_norm")
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.group_norm: x (N, C, *) normalised over each group of C / num_groups
    channels (biased variance), then the per-channel affine."""
    op = "group_norm"
    _float(op, x)
    if x.rank < 2:
        raise ShapeMismatchBinaryOp(f"{op}: input must be (N, C, *), got shape {x.shape} ({x.dtype.name})")
    n, c = x.shape[0], x.shape[1]
    if isinstance(num_groups, bool) or not isinstance(num_groups, int) or num_groups <= 0 or c % num_groups:
        raise ShapeMismatchBinaryOp(f"{op}: {c} channels are not divisible into {num_groups} groups "
                                    f"(shape {x.shape}, {x.dtype.name})")
    g = x.reshape((n, num_groups, -1))
    gc = g.broadcast_sub(g.mean_keepdim(-1))
    y = gc.broadcast_div((gc.sqr().mean_keepdim(-1) + eps).sqrt()).reshape(x.shape)
    return _channel_affine(op, y, weight, bias)


@names_op("batch_norm")
def batch_norm(x, running_mean, running_var, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.batch_norm in inference: (x - mean) / sqrt(var + eps) * weight + bias
    with the running statistics, per channel along dim 1."""
    op = "batch_norm"
    _float(op, x)
    if x.rank < 2:
        raise ShapeMismatchBinaryOp(f"{op}: input must be (N, C, *), got shape {x.shape} ({x.dtype.name})")
    c = x.shape[1]
    for name, s in (("running_mean", running_mean), ("running_var", running_var)):
        if s.shape != (c,):
            raise ShapeMismatchBinaryOp(f"{op}: {name} must have shape ({c},), got {s.shape} (input {x.shape})")
    _same_dtype(op, x, running_mean, running_var)
    per_channel = (1, c) + (1,) * (x.rank - 2)
    y = x.broadcast_sub(running_mean.reshape(per_channel)).broadcast_div(
        (running_var.reshape(per_channel) + eps).sqrt())
    return _channel_affine(op, y, weight, bias)


# ---- lookups and losses -----------------------------------------------------------------
@names_op("embedding")
def embedding(ids, table):
    """Rows of the (vocab, hidden) table at `ids` (any shape) -> ids.shape + (hidden,).
    An id out of range raises IndexOutOfBounds (when realized at the latest)."""
    op = "embedding"
    ids = _ids(op, ids)
    if table.rank != 2:
        raise ShapeMismatchBinaryOp(f"{op}: table must be 2-D (vocab, hidden), got {table.shape} "
                                    f"({table.dtype.name}); ids {ids.shape}")
    rows = table.index_select(ids.flatten_all() if ids.rank != 1 else ids, 0)
    return rows.reshape(ids.shape + (table.shape[1],))


def _class_ids(op, scores, targets):
    targets = _ids(op, targets)
    if scores.rank != 2 or targets.shape != scores.shape[:1]:
        raise ShapeMismatchBinaryOp(f"{op}: needs (N, C) scores and (N,) class ids, got {scores.shape} "
                                    f"({scores.dtype.name}) and {targets.shape} ({targets.dtype.name})")
    return targets


@names_op("nll")
def nll(log_probs, targets):
    """Negative log likelihood averaged over the batch: -mean(log_probs[i, targets[i]])
    (candle's nll, torch's nll_loss with reduction="mean")."""
    op = "nll"
    _float(op, log_probs)
    targets = _class_ids(op, log_probs, targets)
    picked = log_probs.gather(targets.unsqueeze(1), 1)
    return -picked.mean_all()


@names_op("cross_entropy")
def cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """torch.nn.functional.cross_entropy with class-id targets, the classes on the LAST dim:
    logits (..., C), targets (...) of any integer dtype.  Per target: (1 - eps) * -log p[t] +
    eps * mean_c(-log p[c]) (eps = label_smoothing); a target equal to `ignore_index` gives 0
    and is not counted by "mean" (all ignored: NaN, as torch); "sum" and "none" as torch.  A
    target outside [0, C) other than ignore_index raises IndexOutOfBounds when the loss runs."""
    op = "cross_entropy"
    _float(op, logits)
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{op}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    eps = float(label_smoothing)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {label_smoothing!r}")
    targets = _class_targets(op, logits, targets)
    c = logits.rank - 1
    keep = targets.ne(int(ignore_index))
    ids = keep.where_cond(targets, 0).unsqueeze(c)
    if _empty_along(logits, c, op):
        picked, logp = logits.gather(ids, c).squeeze(c), logits
    else:       # log_softmax's ops, the target's picked from the logits: the (..., C) log-probs are not written
        m = _shift(logits, c)
        lse = logits.broadcast_sub(m).exp().sum_keepdim(c).log()
        picked = logits.gather(ids, c).sub(m).sub(lse).squeeze(c)
        logp = logits.broadcast_sub(m).broadcast_sub(lse)
    loss = -picked if not eps else -picked * (1.0 - eps) - logp.mean(c) * eps
    loss = keep.where_cond(loss, 0.0)
    if reduction == "none":
        return loss
    acc = "f64" if logits.dtype.name == "f64" else "f32"      # (a bf16 count of targets would round)
    total = loss.to_dtype(acc).sum_all()
    if reduction == "mean":
        total = total / keep.to_dtype(acc).sum_all()
    return total.to_dtype(logits.dtype)


def _shift(t, dim):
    """t's max along dim, the shift that keeps exp finite, as a constant for backward: the
    value does not depend on it, so its gradient is 0 in exact arithmetic (as torch's
    log_softmax, which has none).  Differentiated, it cost a pass counting the ties of the
    max and an extra exp per element, and rounding noise routed to the argmax."""
    from .autograd import _constant
    return _constant(t.max_keepdim(dim))


def _class_targets(op, logits, targets):
    """`targets` as an i64 Tensor of shape logits.shape[:-1]."""
    from .tensor import Tensor, tensor
    if not isinstance(targets, Tensor):
        targets = tensor(targets)
    if not targets.dtype.is_int:
        raise UnsupportedDTypeForOp(f"{op}: targets must be integer class ids, got {targets.dtype.name} "
                                    f"(shape {targets.shape}; logits {logits.shape} {logits.dtype.name})")
    if logits.rank < 1 or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ShapeMismatchBinaryOp(f"{op}: needs logits (..., C) and targets of their leading shape, got "
                                    f"{logits.shape} ({logits.dtype.name}) and {targets.shape} ({targets.dtype.name})")
    return targets if targets.dtype.name == "i64" else targets.to_dtype("i64")


@names_op("mse_loss")
def mse_loss(a, b):
    """mean((a - b)^2) over every element (same shapes, torch's reduction="mean")."""
    _float("mse_loss", a)
    return a.sub(b).sqr().mean_all()


@names_op("linear")
def linear(x, w, b=None):
    """x @ w.T (+ b): w has candle's (out_features, in_features) layout.  x's leading dims are
    merged into the rows of one 2-D product (a view when x's rows are contiguous), as torch
    does: w's gradient is then one GEMM over all rows, not a batched product summed over the
    batch (the (batch, out, in) partial products written and reduced)."""
    if x.rank > 2 and w.rank == 2:
        lead = x.shape[:-1]
        y = x.reshape((prod(lead), x.shape[-1])).matmul(w.t()).reshape(lead + (w.shape[0],))
    else:
        y = x.broadcast_matmul(w.t())
    return y if b is None else y.broadcast_add(b)


from .nn_attention import rope, rope_i, rope_thd, scaled_dot_product_attention  # noqa: E402,F401
from .nn_layers import (Conv1d, Conv2d, Embedding, LayerNorm, Linear, Module, QLinear, RmsNorm,  # noqa: E402,F401
                        VarBuilder, VarMap, quantize_linears)
