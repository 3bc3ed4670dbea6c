"""Backward passes of tests/test_fuzz_wide.py: random f64 losses `(tail(op(view(x), view(k))) * R).sum()`
whose `lc.grad` is compared with central differences along random directions.

Each argument is stored in a layout of its own and the loss starts with the view back to the
op's shape (transposed, narrowed, broadcast), so the gradient also flows through views: the
narrowed-away elements must get zero and a broadcast argument the sum over its copies.
The difference quotient uses h = 1e-5 on O(1) values, so it is good to ~1e-9; the check allows
1e-6 of the gradient's magnitude.  Data are continuous random values: no ties in max / sort.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

import lazycandle as lc
from fuzz_wide_ops import conv_params, convt_params, pool_params, scatter_params, slice_set_params, sort_params

VIEWS = ["contiguous", "transposed", "narrowed", "broadcast"]
TAILS = {
    "id": lambda y: y,
    "tanh": lambda y: y.tanh(),
    "sqr": lambda y: y.sqr() * 0.5,
    "exp": lambda y: (y * 0.3).exp(),
}


# ---- the differentiated ops: name -> (params strategy, shapes(p), op(p, x, k, aux)) -----------
def _conv_shapes(p, rank, transposed):
    G, cig, cog = p["groups"], p["cig"], p["cog"]
    xs = (p["batch"] or 1, G * cig) + p["hw"]
    ks = (G * cig, cog) + p["ks"] if transposed else (G * cog, cig) + p["ks"]
    if rank == 1:
        return xs[:2] + xs[3:], ks[:2] + ks[3:]
    return xs, ks


def _conv_op(p, x, k, rank, transposed):
    one = lambda v: v[1] if rank == 1 else v         # noqa: E731
    args = dict(padding=one(p["pad"]), stride=one(p["stride"]), dilation=one(p["dil"]), groups=p["groups"])
    if transposed:
        return getattr(x, f"conv_transpose{rank}d")(k, output_padding=one(p["opad"]), **args)
    return getattr(x, f"conv{rank}d")(k, **args)


def _scatter_shapes(p):
    shape, dim = p["shape"], p["dim"]
    return shape, shape[:dim] + (p["n_src"],) + shape[dim + 1:]


def _scatter_op(op):
    def build(p, x, k, aux):
        return getattr(x, op)(aux["ids"], k, p["dim"])
    return build


def _aux(op, p, rng):
    """The op's integer operands (no gradient): scatter / index ids, gather ids."""
    if op in ("scatter_add", "index_add", "scatter"):
        base, src = _scatter_shapes(p)
        dim, n = p["dim"], p["n_src"]
        if op == "index_add":
            return {"ids": lc.tensor(rng.integers(0, base[dim], n).astype(np.int64))}
        if op == "scatter_add":
            return {"ids": lc.tensor(rng.integers(0, base[dim], src).astype(np.int64))}
        # scatter: distinct ids along dim, so no write is lost to a later one
        fibres = src[:dim] + src[dim + 1:]
        rows = [rng.permutation(base[dim])[:n] for _ in range(int(np.prod(fibres)))]
        ids = np.moveaxis(np.array(rows, np.int64).reshape(fibres + (n,)), -1, dim)
        return {"ids": lc.tensor(np.ascontiguousarray(ids))}
    if op == "gather":
        shape = (2, 4) if p == 0 else (3, 2)
        return {"ids": lc.tensor(rng.integers(0, (3, 4)[p], shape).astype(np.int64))}
    return {}


@st.composite
def scatter_grad_params(draw):
    p = draw(scatter_params())
    p["n_src"] = min(p["n_src"], p["shape"][p["dim"]])
    return p


def _unary(fn):
    return lambda p, x, k, aux: fn(p, x)


GRAD_OPS = {
    "conv1d": (conv_params(1), lambda p: _conv_shapes(p, 1, False), lambda p, x, k, a: _conv_op(p, x, k, 1, False)),
    "conv2d": (conv_params(2), lambda p: _conv_shapes(p, 2, False), lambda p, x, k, a: _conv_op(p, x, k, 2, False)),
    "conv_transpose1d": (convt_params(1), lambda p: _conv_shapes(p, 1, True),
                         lambda p, x, k, a: _conv_op(p, x, k, 1, True)),
    "conv_transpose2d": (convt_params(2), lambda p: _conv_shapes(p, 2, True),
                         lambda p, x, k, a: _conv_op(p, x, k, 2, True)),
    "max_pool2d": (pool_params(), lambda p: ((p["bc"][0] or 1,) + p["bc"][1:] + p["hw"], None),
                   _unary(lambda p, x: x.max_pool2d(p["k"], p["stride"]))),
    "avg_pool2d": (pool_params(), lambda p: ((p["bc"][0] or 1,) + p["bc"][1:] + p["hw"], None),
                   _unary(lambda p, x: x.avg_pool2d(p["k"], p["stride"]))),
    "scatter_add": (scatter_params(), _scatter_shapes, _scatter_op("scatter_add")),
    "index_add": (scatter_params(), _scatter_shapes, _scatter_op("index_add")),
    "scatter": (scatter_grad_params(), _scatter_shapes, _scatter_op("scatter")),
    "slice_set": (slice_set_params(), lambda p: (p["shape"], p["shape"][:p["dim"]] + (p["n"],) + p["shape"][p["dim"] + 1:]),
                  lambda p, x, k, a: x.slice_set(k, p["dim"], p["start"])),
    "sort": (sort_params(), lambda p: (p["shape"], None), _unary(lambda p, x: x.sort_last_dim(p["asc"])[0])),
    "topk": (sort_params(), lambda p: (p["shape"], None),
             _unary(lambda p, x: x.topk(min(p["k"], x.shape[p["dim"]]), p["dim"], largest=not p["asc"])[0])),
    "cumsum": (sort_params(), lambda p: (p["shape"], None), _unary(lambda p, x: x.cumsum(p["dim"]))),
    "matmul": (st.tuples(st.integers(1, 4), st.integers(0, 4), st.integers(1, 4)),
               lambda p: ((p[0], p[1]), (p[1], p[2])), lambda p, x, k, a: x @ k),
    "softmax": (st.integers(0, 1), lambda p: ((3, 4), None), _unary(lambda p, x: lc.nn.softmax(x, p))),
    "log_softmax": (st.integers(0, 1), lambda p: ((3, 4), None), _unary(lambda p, x: lc.nn.log_softmax(x, p))),
    "layer_norm": (st.just(0), lambda p: ((3, 5), (5,)), lambda p, x, k, a: lc.nn.layer_norm(x, k, k * 0.5)),
    "logsumexp": (st.integers(0, 1), lambda p: ((3, 4), None), _unary(lambda p, x: x.logsumexp(p, keepdim=True))),
    "var": (st.integers(0, 1), lambda p: ((3, 4), None), _unary(lambda p, x: x.var(p, keepdim=True))),
    "gather": (st.integers(0, 1), lambda p: ((3, 4), None), lambda p, x, k, a: x.gather(a["ids"], p)),
}


@st.composite
def grad_cases(draw):
    op = draw(st.sampled_from(sorted(GRAD_OPS)))
    strat, shapes, _ = GRAD_OPS[op]
    p = draw(strat)
    xs, ks = shapes(p)
    views = [draw(st.sampled_from(VIEWS)) for _ in range(2)]
    return dict(op=op, p=p, shapes=(xs, ks), views=views, tail=draw(st.sampled_from(sorted(TAILS))),
                mode=draw(st.sampled_from(["eager", "compiled"])), seed=draw(st.integers(0, 2**32 - 1)))


# ---- arguments stored in another layout, viewed back inside the loss --------------------------
def stored_shape(view, shape):
    if view == "transposed" and len(shape) >= 2:
        return shape[:-2] + (shape[-1], shape[-2])
    if view == "narrowed" and shape:
        return shape[:-1] + (shape[-1] + 3,)
    if view == "broadcast" and shape:
        return (1,) + shape[1:]
    return shape


def view_back(view, t, shape):
    if view == "transposed" and len(shape) >= 2:
        return t.transpose(-1, -2)
    if view == "narrowed" and shape:
        return t.narrow(-1, 1, shape[-1])
    if view == "broadcast" and shape:
        return t.broadcast_as(shape)
    return t


def run_grad_case(case):
    op, p, (xs, ks), views = case["op"], case["p"], case["shapes"], case["views"]
    rng = np.random.default_rng(case["seed"])
    _, _, build = GRAD_OPS[op]
    aux = _aux(op, p, rng)
    shapes = [xs] + ([ks] if ks is not None else [])
    arrays = [rng.uniform(-1.5, 1.5, stored_shape(v, s)) for v, s in zip(views, shapes)]
    tail = TAILS[case["tail"]]
    probe = build(p, *[view_back(v, lc.tensor(a), s) for v, a, s in zip(views, arrays, shapes)]
                  + [None] * (2 - len(shapes)), aux)
    weights = lc.tensor(rng.uniform(-1, 1, probe.shape))

    def loss(*args):
        vs = [view_back(v, t, s) for v, t, s in zip(views, args, shapes)] + [None] * (2 - len(shapes))
        return (tail(build(p, *vs, aux)) * weights).sum()

    argnums = tuple(range(len(shapes)))
    if case["mode"] == "compiled":
        phs = [lc.placeholder(f"a{i}", a.shape, lc.f64) for i, a in enumerate(arrays)]
        prog = lc.compile(list(lc.grad(loss, argnums)(*phs)))
        used = {name for name, _, _ in prog.inputs}      # a linear loss's gradient reads no input
        grads = prog.run(**{f"a{i}": a for i, a in enumerate(arrays) if f"a{i}" in used})
    else:
        grads = [g.numpy() for g in lc.grad(loss, argnums)(*[lc.tensor(a) for a in arrays])]
    value = lambda arrs: float(loss(*[lc.tensor(a) for a in arrs]).item())   # noqa: E731
    what = f"grad of {op} {p} views {views} tail {case['tail']} {case['mode']} seed {case['seed']}"
    h = 1e-5
    for i, (a, g) in enumerate(zip(arrays, grads)):
        assert g.shape == a.shape and g.dtype == np.float64, f"{what}: arg {i} grad {g.shape} {g.dtype}"
        for _ in range(2):
            v = rng.standard_normal(a.shape)
            plus = [b + h * v if j == i else b for j, b in enumerate(arrays)]
            minus = [b - h * v if j == i else b for j, b in enumerate(arrays)]
            fd = (value(plus) - value(minus)) / (2 * h)
            an = float(np.sum(g * v))
            scale = float(np.sum(np.abs(g * v))) + 1e-3
            if not abs(fd - an) <= 1e-6 * scale + 1e-8:
                pytest.fail(f"{what}: arg {i}: directional derivative {an!r} from lc.grad, {fd!r} from "
                            f"central differences", pytrace=False)
