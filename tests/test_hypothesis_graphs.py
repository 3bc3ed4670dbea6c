"""Random elementwise DAGs (depth <= 5) over random strided inputs, against NumPy evaluating the
same DAG op by op.

* integers and f16 / bf16: bit-exact (each op is computed in f32 and rounded to the dtype, so
  fusion never changes a value; NumPy / ml_dtypes do the same eagerly);
* f32 / f64: the reference is evaluated in f64 / long double, and every element must lie within
  a running first-order error bound (a few ulps per op, propagated through the DAG).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import lazycandle as lc
from conftest import HP, assert_same, data, int_binary_ref, wrap_int

DTYPES = [lc.f32, lc.f64, lc.bf16, lc.f16, lc.i32, lc.i64, lc.u8, lc.i16, lc.u32]

FLOAT_OPS = ["add", "sub", "mul", "maximum", "minimum", "neg", "abs", "relu", "tanh", "sin", "sigmoid",
             "affine", "clamp", "where_gt", "cast_rt"]
LOWP_OPS = ["add", "sub", "mul", "maximum", "minimum", "neg", "abs", "relu", "clamp", "where_gt", "cast_rt", "sqr"]
INT_OPS = ["add", "sub", "mul", "maximum", "minimum", "div", "neg", "abs", "relu", "sign", "sqr", "clamp",
           "where_gt", "affine", "cast_rt"]
ARITY = {"add": 2, "sub": 2, "mul": 2, "maximum": 2, "minimum": 2, "div": 2, "where_gt": 2}


def ops_for(dt):
    if dt in (lc.f32, lc.f64):
        return FLOAT_OPS
    if dt in (lc.bf16, lc.f16):
        return LOWP_OPS
    return INT_OPS


# ---- strategies ----------------------------------------------------------------------------
@st.composite
def leaf_specs(draw, shape):
    r = len(shape)
    kinds = ["contiguous", "narrowed", "stepped", "broadcast"] + (["permuted"] if r >= 2 else [])
    kind = draw(st.sampled_from(kinds)) if r else "contiguous"
    # the view is taken of a realized buffer, or of a lazily computed node
    kind = ("computed:" if draw(st.booleans()) else "") + kind
    if kind.endswith("permuted"):
        return kind, tuple(draw(st.permutations(range(r))))
    if kind.endswith("narrowed"):
        extra = [draw(st.integers(0, 3)) for _ in range(r)]
        start = [draw(st.integers(0, e)) for e in extra]
        return kind, (tuple(extra), tuple(start))
    if kind.endswith("stepped"):
        steps = [draw(st.integers(1, 3)) for _ in range(r)]
        starts = [draw(st.integers(0, 2)) for _ in range(r)]
        return kind, (tuple(steps), tuple(starts))
    if kind.endswith("broadcast"):
        ones = tuple(draw(st.booleans()) for _ in range(r))
        drop = draw(st.integers(0, r))
        return kind, (ones, drop)
    return kind, None


@st.composite
def dag_cases(draw):
    dt = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    n_leaves = draw(st.integers(1, 3))
    leaves = [draw(leaf_specs(shape)) for _ in range(n_leaves)]
    n_ops = draw(st.integers(1, 5))
    ops = []
    for i in range(n_ops):
        op = draw(st.sampled_from(ops_for(dt)))
        avail = n_leaves + i
        # the first operand is usually the newest value, so chains get deep
        a = avail - 1 if draw(st.booleans()) else draw(st.integers(0, avail - 1))
        b = draw(st.integers(0, avail - 1))
        ops.append((op, a, b))
    extra_out = draw(st.integers(-1, n_leaves + n_ops - 2))   # an intermediate realized with the result
    pre_realize = draw(st.integers(-1, n_ops - 2))            # realize an intermediate first
    seed = draw(st.integers(0, 2**31 - 1))
    return dt, shape, leaves, ops, extra_out, pre_realize, seed


# ---- building the inputs -------------------------------------------------------------------
def _computed(a):
    t = lc.tensor(a)
    return t.maximum(t)      # a computed node with the same values (NaN included)


def build_leaf(spec, shape, dt, rng):
    kind, p = spec
    r = len(shape)
    src_of = lc.tensor
    if kind.startswith("computed:"):
        kind = kind.split(":", 1)[1]
        src_of = _computed
    if kind == "contiguous":
        a = data(dt, shape, rng)
        return src_of(a), a
    if kind == "permuted":
        perm = p
        src = [0] * r
        for i, d in enumerate(perm):
            src[d] = shape[i]
        a = data(dt, tuple(src), rng)
        return src_of(a).permute(perm), a.transpose(perm)
    if kind == "narrowed":
        extra, start = p
        a = data(dt, tuple(d + e for d, e in zip(shape, extra)), rng)
        t = src_of(a)
        for d in range(r):
            t = t.narrow(d, start[d], shape[d])
        return t, a[tuple(slice(s, s + n) for s, n in zip(start, shape))]
    if kind == "stepped":
        steps, starts = p
        big = tuple(s0 + n * st_ + 1 for n, st_, s0 in zip(shape, steps, starts))
        a = data(dt, big, rng)
        sl = tuple(slice(s0, s0 + n * st_, st_) for n, st_, s0 in zip(shape, steps, starts))
        return src_of(a)[sl], a[sl]
    if kind == "broadcast":
        ones, drop = p
        src = tuple(1 if o else d for d, o in zip(shape, ones))[drop:]
        a = data(dt, src, rng)
        return src_of(a).broadcast_as(shape), np.broadcast_to(a, shape)
    raise ValueError(kind)


# ---- lazycandle side -----------------------------------------------------------------------
def lc_apply(op, dt, x, y):
    if op == "add":
        return x + y
    if op == "sub":
        return x - y
    if op == "mul":
        return x * y
    if op == "div":
        return x / y
    if op in ("maximum", "minimum"):
        return getattr(x, op)(y)
    if op == "where_gt":
        return x.gt(y).where_cond(x, y)
    if op == "affine":
        return x.affine(0.5, 0.25) if dt.is_float else x.affine(3, -2)
    if op == "clamp":
        if dt.is_float:
            return x.clamp(-1.5, 1.25)
        return x.clamp(-20, 20) if dt.is_signed else x.clamp(3, 100)
    if op == "cast_rt":
        mid = {lc.f32: lc.f64, lc.f64: lc.f32, lc.bf16: lc.f32, lc.f16: lc.f32, lc.i32: lc.i64, lc.i64: lc.i32,
               lc.u8: lc.i16, lc.i16: lc.i64, lc.u32: lc.u8}[dt]
        return x.to_dtype(mid).to_dtype(dt)
    return getattr(x, op)()


# ---- NumPy side ----------------------------------------------------------------------------
def np_int(op, dt, x, y):
    if op in ("add", "sub", "mul", "maximum", "minimum", "div"):
        return int_binary_ref(op, x, y, dt)
    if op == "where_gt":
        return np.where(x > y, x, y)
    with np.errstate(over="ignore"):
        if op == "neg":
            return (np.zeros_like(x) - x).astype(dt.numpy)
        if op == "abs":
            return np.abs(x) if dt.is_signed else x.copy()
        if op == "relu":
            return np.maximum(x, dt.numpy.type(0))
        if op == "sign":
            return np.sign(x).astype(dt.numpy)
        if op == "sqr":
            return (x * x).astype(dt.numpy)
    if op == "clamp":
        lo, hi = (-20, 20) if dt.is_signed else (3, 100)
        return np.clip(x, lo, hi).astype(dt.numpy)
    if op == "affine":
        flat = [wrap_int(3 * v - 2, dt) for v in x.reshape(-1).tolist()]
        return np.array(flat, dtype=object).astype(dt.numpy).reshape(x.shape)
    if op == "cast_rt":
        mid = {lc.i32: np.int64, lc.i64: np.int32, lc.u8: np.int16, lc.i16: np.int64, lc.u32: np.uint8}[dt]
        return x.astype(mid).astype(dt.numpy)
    raise KeyError(op)


def np_lowp(op, dt, x, y):
    """Per op: compute in f32, round to the dtype (exactly what ml_dtypes / NumPy do eagerly)."""
    f = np.float32
    xs, ys = x.astype(f), y.astype(f)
    with np.errstate(all="ignore"):
        r = {
            "add": lambda: xs + ys, "sub": lambda: xs - ys, "mul": lambda: xs * ys,
            "maximum": lambda: np.maximum(xs, ys), "minimum": lambda: np.minimum(xs, ys),
            "neg": lambda: -xs, "abs": lambda: np.abs(xs), "relu": lambda: np.maximum(xs, f(0)),
            "clamp": lambda: np.clip(xs, f(-1.5), f(1.25)), "where_gt": lambda: np.where(xs > ys, xs, ys),
            "cast_rt": lambda: xs, "sqr": lambda: xs * xs,
        }[op]()
    return np.asarray(r, f).astype(dt.numpy)


def np_float(op, dt, x, y, ex, ey):
    """(value in high precision, error bound) for f32/f64: the reference is exact-ish and the
    bound covers a few ulps of rounding per op (FMA contraction only makes the error smaller)."""
    ulp1 = np.finfo(np.float32 if dt is lc.f32 else np.float64).eps     # ulp of 1
    if op == "add":
        v, e = x + y, ex + ey
    elif op == "sub":
        v, e = x - y, ex + ey
    elif op == "mul":
        v, e = x * y, np.abs(x) * ey + np.abs(y) * ex + ex * ey
    elif op == "maximum":
        v, e = np.maximum(x, y), np.maximum(ex, ey)
    elif op == "minimum":
        v, e = np.minimum(x, y), np.maximum(ex, ey)
    elif op == "where_gt":   # a flip near x == y changes the value by at most ex + ey
        v, e = np.where(x > y, x, y), ex + ey
    elif op == "neg":
        v, e = -x, ex
    elif op == "abs":
        v, e = np.abs(x), ex
    elif op == "relu":
        v, e = np.maximum(x, 0), ex
    elif op == "tanh":
        v, e = np.tanh(x), ex + 4 * ulp1 * np.abs(np.tanh(x))
    elif op == "sin":
        v, e = np.sin(x), ex + 4 * ulp1 * (np.abs(np.sin(x)) + 1e-30) + 4 * ulp1 * np.abs(x) * ulp1
    elif op == "sigmoid":
        s = 1 / (1 + np.exp(-x))
        v, e = s, ex * 0.25 + 4 * ulp1 * s
    elif op == "affine":
        v, e = x * HP(0.5) + HP(0.25), ex * 0.5
    elif op == "clamp":
        v, e = np.clip(x, HP(-1.5), HP(1.25)), ex
    elif op == "cast_rt":
        # f32 -> f64 -> f32 is exact; f64 -> f32 -> f64 rounds once to f32
        if dt is lc.f64:
            v = x
            e = ex + np.abs(x) * np.finfo(np.float32).eps
        else:
            v, e = x, ex
    else:
        raise KeyError(op)
    # rounding of this op's own result (a couple of ulps, generous for the transcendentals)
    e = e + 2 * ulp1 * np.abs(v)
    return v, e


def _to_hp(a):
    return np.asarray(a).astype(HP)


@settings(max_examples=50, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(dag_cases())
def test_random_elementwise_dag(case):
    dt, shape, leaves, ops, extra_out, pre_realize, seed = case
    rng = np.random.default_rng(seed)
    ts, arrs = [], []
    for spec in leaves:
        t, a = build_leaf(spec, shape, dt, rng)
        assert t.shape == shape == a.shape
        ts.append(t)
        arrs.append(np.array(a, order="C"))
    floaty = dt in (lc.f32, lc.f64)
    if floaty:
        vals = [_to_hp(a) for a in arrs]
        errs = [np.zeros(shape, HP) for _ in arrs]
    else:
        vals = list(arrs)
    for i, (op, ia, ib) in enumerate(ops):
        ts.append(lc_apply(op, dt, ts[ia], ts[ib]))
        if i == pre_realize:
            ts[-1].realize()
        if floaty:
            v, e = np_float(op, dt, vals[ia], vals[ib], errs[ia], errs[ib])
            vals.append(v)
            errs.append(e)
        elif dt.is_int:
            vals.append(np_int(op, dt, vals[ia], vals[ib]))
        else:
            vals.append(np_lowp(op, dt, vals[ia], vals[ib]))
    outs = [len(ts) - 1] + ([extra_out] if extra_out >= 0 else [])
    lc.realize(*[ts[k] for k in outs])
    for k in outs:
        got = ts[k].numpy()
        what = f"{dt.name} shape {shape} ops {ops} leaves {leaves} node {k}"
        assert got.shape == shape and got.dtype == dt.numpy, what
        if not floaty:
            assert_same(got, vals[k], what, bits=False)
            continue
        ref, bound = vals[k], errs[k]
        diff = np.abs(got.astype(HP) - ref)
        tiny = np.finfo(np.float32 if dt is lc.f32 else np.float64).tiny
        bad = ~(diff <= 4 * bound + tiny)
        if bad.any():
            idx = tuple(np.argwhere(bad)[0])
            pytest.fail(f"{what}: {int(bad.sum())} elements outside the error bound; first at {idx}: "
                        f"got {got[idx]!r} expected {ref[idx]!r} bound {bound[idx]!r}")
