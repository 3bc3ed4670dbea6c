"""The op catalogue of tests/test_fuzz_wide.py: for each family (conv, pools, transposed conv,
scatter / index_add, slice_set, sort / topk, cumsum) a hypothesis strategy for its arguments,
the lazycandle call and a NumPy reference.

A reference returns (value, magnitude): `value` is computed in f64 (int64 / uint64 for integer
dtypes, so wrap-around matches after the cast), `magnitude` is the same op on |inputs|, which
bounds the rounding error of any summation order.  `check` compares with the tolerance the SPEC
gives the dtype: integers and the exact ops bit for bit, f64 1e-12 and f32 1e-5 of the
magnitude, f16 / bf16 one unit of the type's last place plus an f32-accumulation allowance.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st

import lazycandle as lc
from conftest import assert_same, data

FLOAT_DTS = [lc.f32, lc.f64, lc.f16, lc.bf16]
INT_DTS = [lc.i32, lc.i64, lc.u32, lc.i16, lc.u8]
LAYOUTS = ["contiguous", "transposed", "narrowed", "broadcast", "permuted", "stepped", "computed"]


# ---- inputs in any layout ----------------------------------------------------------------
def layout_input(kind, shape, dt, rng, source=lc.tensor, domain="any"):
    """(tensor, equal NumPy array): `source(array)` makes the stored tensor (lc.tensor, or a
    placeholder bound later) and `kind` the view of it that the op reads."""
    shape = tuple(shape)
    r = len(shape)
    if r == 0 or kind == "contiguous":
        a = data(dt, shape, rng, domain)
        return source(a), a
    if kind == "computed":
        a = data(dt, shape, rng, domain)
        t = source(a)
        return t.maximum(t), a
    if kind == "transposed":
        if r == 1:
            a = data(dt, shape + (2,), rng, domain)
            return source(a).t()[1], a.T[1]
        a = data(dt, shape[:-2] + (shape[-1], shape[-2]), rng, domain)
        return source(a).t(), np.swapaxes(a, -1, -2)
    if kind == "permuted":
        perm = tuple(reversed(range(r)))
        a = data(dt, tuple(shape[p] for p in perm), rng, domain)
        return source(a).permute(perm), np.transpose(a, perm)
    if kind == "narrowed":
        a = data(dt, tuple(d + 2 for d in shape), rng, domain)
        t = source(a)
        for d in range(r):
            t = t.narrow(d, 1 + d % 2, shape[d])
        return t, a[tuple(slice(1 + d % 2, 1 + d % 2 + shape[d]) for d in range(r))]
    if kind == "stepped":
        a = data(dt, tuple(2 * d + 1 for d in shape), rng, domain)
        sl = tuple(slice(1, 1 + 2 * d, 2) for d in shape)
        return source(a)[sl], a[sl]
    if kind == "broadcast":
        src = tuple(1 if d % 2 == 0 else s for d, s in enumerate(shape))
        a = data(dt, src, rng, domain)
        return source(a).broadcast_as(shape), np.broadcast_to(a, shape)
    raise ValueError(kind)


# ---- comparison ----------------------------------------------------------------------------
def check(got, ref, mag, dt, what, exact=False, loose=False):
    """got (lazycandle result as NumPy) against ref / mag (f64 or integer arrays)."""
    got = np.asarray(got)
    ref = np.asarray(ref)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != expected {ref.shape}"
    assert got.dtype == dt.numpy, f"{what}: dtype {got.dtype} != {dt.numpy}"
    if dt.is_int or exact:
        assert_same(got, ref.astype(dt.numpy), what)
        return
    if got.size == 0:
        return
    g = got.astype(np.float64)
    mag = np.abs(np.asarray(mag, np.float64))
    with np.errstate(all="ignore"):
        if dt is lc.f64:
            bound = 1e-12 * mag + 1e-300
        elif dt is lc.f32:
            bound = 1e-5 * mag + 1e-30
        else:
            # one unit of the type's last place of the result, plus f32 accumulation error
            # (`loose`: plus one rounding of the type per partial sum, for orders SPEC leaves open)
            eps = float(np.finfo(dt.numpy).eps) if dt is lc.f16 else 2.0 ** -7
            ulp = np.abs(np.spacing(ref.astype(np.float32).astype(dt.numpy)).astype(np.float64))
            bound = ulp + 1e-5 * mag + (eps * mag if loose else 0.0)
        gn, rn = np.isnan(g), np.isnan(ref)
        bad = (gn != rn) | (~gn & ~rn & ~((g == ref) | (np.abs(g - ref) <= bound)))
    if bad.any():
        idx = [tuple(i) for i in np.argwhere(bad)[:5]]
        pytest.fail(f"{what}: {int(bad.sum())} of {bad.size} elements off; "
                    + "; ".join(f"at {i}: got {got[i]!r} expected {ref[i]!r} bound {bound[i]!r}" for i in idx),
                    pytrace=False)


def wide(a):
    """NumPy array -> f64 (floats) or the widest integer type of its signedness."""
    a = np.asarray(a)
    if a.dtype.kind == "u":
        return a.astype(np.uint64)
    if a.dtype.kind == "i":
        return a.astype(np.int64)
    return a.astype(np.float32).astype(np.float64) if a.dtype.itemsize < 4 else a.astype(np.float64)


# ---- references ----------------------------------------------------------------------------
def np_conv2d(x, k, pad, stride, dil, groups):
    b, ci, h, w = x.shape
    co, cig, kh, kw = k.shape
    (ph, pw), (sh, sw), (dh, dw) = pad, stride, dil
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((b, co, oh, ow), x.dtype)
    cog = co // groups
    for g in range(groups):
        xs, ks = xp[:, g * cig:(g + 1) * cig], k[g * cog:(g + 1) * cog]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]
                out[:, g * cog:(g + 1) * cog] += np.einsum("bchw,oc->bohw", patch, ks[:, :, i, j])
    return out


def np_conv_transpose2d(x, k, pad, opad, stride, dil, groups):
    b, ci, ih, iw = x.shape
    _, cog, kh, kw = k.shape
    (ph, pw), (oph, opw), (sh, sw), (dh, dw) = pad, opad, stride, dil
    H = (ih - 1) * sh + dh * (kh - 1) + 1 + oph
    W = (iw - 1) * sw + dw * (kw - 1) + 1 + opw
    full = np.zeros((b, cog * groups, H, W), x.dtype)
    cig = ci // groups
    for g in range(groups):
        xs, ks = x[:, g * cig:(g + 1) * cig], k[g * cig:(g + 1) * cig]
        for i in range(kh):
            for j in range(kw):
                contrib = np.einsum("bchw,co->bohw", xs, ks[:, :, i, j])
                full[:, g * cog:(g + 1) * cog, i * dh: i * dh + sh * (ih - 1) + 1: sh,
                     j * dw: j * dw + sw * (iw - 1) + 1: sw] += contrib
    return full[:, :, ph:H - ph, pw:W - pw]


def np_pool(x, k, stride, how):
    b, c, h, w = x.shape
    (kh, kw), (sh, sw) = k, stride
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    wins = np.stack([x[:, :, i: i + sh * (oh - 1) + 1: sh, j: j + sw * (ow - 1) + 1: sw]
                     for i in range(kh) for j in range(kw)], -1)
    return wins.max(-1) if how == "max" else wins.mean(-1)


def np_scatter(op, base, ids, src, dim):
    out = base.copy()
    with np.errstate(over="ignore"):     # integer sums wrap, as in the dtype
        _np_scatter_into(op, out, ids, src, dim)
    return out


def _np_scatter_into(op, out, ids, src, dim):
    if op == "index_add":
        np.add.at(np.moveaxis(out, dim, 0), ids.astype(np.int64), np.moveaxis(src, dim, 0))
        return
    for idx in np.ndindex(*src.shape):       # C order: the last write along dim wins
        to = idx[:dim] + (int(ids[idx]),) + idx[dim + 1:]
        if op == "scatter":
            out[to] = src[idx]
        else:
            out[to] += src[idx]


def np_sort_ids(x, descending):
    """Stable sort ids of the last dim; NaN last ascending, first descending (equal values,
    -0.0 and +0.0 included, keep input order)."""
    x = wide(x)             # (np.unique does not order an ml_dtypes NaN last)
    flat = x.reshape(-1)
    if flat.size == 0:
        return np.zeros(x.shape, np.int64)
    _, inv = np.unique(flat, return_inverse=True)   # exact ranks (NaNs share the last rank)
    key = inv.reshape(x.shape).astype(np.int64)
    return np.argsort(-key if descending else key, axis=-1, kind="stable")


# ---- families: strategy + lazycandle call + reference ---------------------------------------
def _pairs(draw, lo, hi):
    return (draw(st.integers(lo, hi)), draw(st.integers(lo, hi)))


@st.composite
def conv_params(draw, rank):
    groups = draw(st.sampled_from([1, 1, 2]))
    cig, cog = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ks = _pairs(draw, 1, 3) if rank == 2 else (1, draw(st.integers(1, 4)))
    dil = _pairs(draw, 1, 2) if rank == 2 else (1, draw(st.integers(1, 3)))
    stride = _pairs(draw, 1, 3) if rank == 2 else (1, draw(st.integers(1, 3)))
    pad = _pairs(draw, 0, 2) if rank == 2 else (0, draw(st.integers(0, 2)))
    span = [d * (k - 1) + 1 for d, k in zip(dil, ks)]
    hw = tuple(max(draw(st.integers(0, 6)) + s - 2 * p, 1) for s, p in zip(span, pad))
    if rank == 1:
        hw = (1, hw[1])
    batch = draw(st.sampled_from([0, 1, 2, 3]))
    return dict(groups=groups, cig=cig, cog=cog, ks=ks, dil=dil, stride=stride, pad=pad, hw=hw, batch=batch)


@st.composite
def convt_params(draw, rank):
    p = draw(conv_params(rank))
    p["hw"] = tuple(max(1, h - 2) for h in p["hw"])
    if rank == 1:
        p["hw"] = (1, p["hw"][1])
    opad = []
    for s, d, pd, k in zip(p["stride"], p["dil"], p["pad"], p["ks"]):
        opad.append(draw(st.integers(0, max(s, d) - 1)))
    p["opad"] = tuple(opad)
    # the output must not be empty: (i-1)s - 2p + d(k-1) + op + 1 >= 1
    p["pad"] = tuple(min(pd, ((h - 1) * s + d * (k - 1) + op) // 2)
                     for pd, h, s, d, k, op in zip(p["pad"], p["hw"], p["stride"], p["dil"], p["ks"], p["opad"]))
    return p


def run_conv(p, dt, kinds, rng, source, transposed, rank):
    G, cig, cog = p["groups"], p["cig"], p["cog"]
    ci, co = G * cig, G * cog
    xs = (p["batch"], ci) + p["hw"]
    kshape = (ci, cog) + p["ks"] if transposed else (co, cig) + p["ks"]
    if rank == 1:
        xs, kshape = xs[:2] + xs[3:], kshape[:2] + kshape[3:]
    x, xa = layout_input(kinds[0], xs, dt, rng, source, "small")
    k, ka = layout_input(kinds[1], kshape, dt, rng, source, "small")
    x4, k4 = wide(xa), wide(ka)
    if rank == 1:
        x4, k4 = x4[:, :, None, :], k4[:, :, None, :]
    if transposed:
        args = dict(padding=p["pad"][1], output_padding=p["opad"][1], stride=p["stride"][1], dilation=p["dil"][1])
        if rank == 2:
            args = dict(padding=p["pad"], output_padding=p["opad"], stride=p["stride"], dilation=p["dil"])
        y = getattr(x, f"conv_transpose{rank}d")(k, groups=G, **args)
        ref = lambda a, b: np_conv_transpose2d(a, b, p["pad"], p["opad"], p["stride"], p["dil"], G)
    else:
        args = dict(padding=p["pad"][1], stride=p["stride"][1], dilation=p["dil"][1])
        if rank == 2:
            args = dict(padding=p["pad"], stride=p["stride"], dilation=p["dil"])
        y = getattr(x, f"conv{rank}d")(k, groups=G, **args)
        ref = lambda a, b: np_conv2d(a, b, p["pad"], p["stride"], p["dil"], G)
    val = ref(x4, k4)
    mag = ref(np.abs(x4.astype(np.float64)), np.abs(k4.astype(np.float64)))
    if rank == 1:
        val, mag = val[:, :, 0], mag[:, :, 0]
    return [(y, val, mag, {})]


@st.composite
def pool_params(draw):
    k = _pairs(draw, 1, 3)
    stride = draw(st.one_of(st.none(), st.just(_pairs(draw, 1, 3))))
    hw = (k[0] + draw(st.integers(0, 5)), k[1] + draw(st.integers(0, 5)))
    return dict(k=k, stride=stride, hw=hw, bc=(draw(st.integers(0, 2)), draw(st.integers(1, 3))))


def run_pool(p, dt, kinds, rng, source, how):
    x, xa = layout_input(kinds[0], p["bc"] + p["hw"], dt, rng, source)
    stride = p["k"] if p["stride"] is None else p["stride"]
    y = getattr(x, f"{how}_pool2d")(p["k"], p["stride"])
    xw = wide(xa)
    val = np_pool(xw, p["k"], stride, how)
    return [(y, val, np_pool(np.abs(xw.astype(np.float64)), p["k"], stride, how), {"exact": how == "max"})]


@st.composite
def scatter_params(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 4)) for _ in range(rank))
    dim = draw(st.integers(0, rank - 1))
    n_src = draw(st.integers(0, 5))
    return dict(shape=shape, dim=dim, n_src=n_src, ids_dt=draw(st.sampled_from([lc.u8, lc.u32, lc.i64])))


def run_scatter(p, dt, kinds, rng, source, op):
    shape, dim = p["shape"], p["dim"]
    src_shape = shape[:dim] + (p["n_src"],) + shape[dim + 1:]
    base, ba = layout_input(kinds[0], shape, dt, rng, source)
    src, sa = layout_input(kinds[1], src_shape, dt, rng, source)
    ids_shape = (p["n_src"],) if op == "index_add" else src_shape
    ia = rng.integers(0, shape[dim], ids_shape).astype(p["ids_dt"].numpy)
    ids = source(ia)
    y = getattr(base, op)(ids, src, dim)
    val = np_scatter(op, wide(ba), ia, wide(sa), dim)
    mag = np_scatter(op, np.abs(wide(ba).astype(np.float64)), ia, np.abs(wide(sa).astype(np.float64)), dim)
    return [(y, val, mag, {"exact": op == "scatter", "loose": True})]


@st.composite
def slice_set_params(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 5)) for _ in range(rank))
    dim = draw(st.integers(0, rank - 1))
    n = draw(st.integers(0, shape[dim]))
    return dict(shape=shape, dim=dim, n=n, start=draw(st.integers(0, shape[dim] - n)))


def run_slice_set(p, dt, kinds, rng, source):
    shape, dim, n, start = p["shape"], p["dim"], p["n"], p["start"]
    base, ba = layout_input(kinds[0], shape, dt, rng, source)
    src, sa = layout_input(kinds[1], shape[:dim] + (n,) + shape[dim + 1:], dt, rng, source)
    y = base.slice_set(src, dim, start)
    out = np.array(ba)
    out[(slice(None),) * dim + (slice(start, start + n),)] = sa
    # read the old value too: the in-place update must not clobber it
    return [(y, out, out, {"exact": True}), (base, np.array(ba), ba, {"exact": True})]


@st.composite
def sort_params(draw):
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(0, 6)) for _ in range(rank - 1)) + (draw(st.integers(0, 9)),)
    return dict(shape=shape, asc=draw(st.booleans()), ties=draw(st.booleans()),
                k=draw(st.integers(0, shape[-1])), dim=draw(st.integers(0, rank - 1)))


def _sort_data(kind, shape, dt, rng, source, ties):
    if not ties:
        return layout_input(kind, shape, dt, rng, source)
    lo, hi = (0, 3) if dt.is_int and not dt.is_signed else (-2, 2)
    a = rng.integers(lo, hi, shape, endpoint=True).astype(np.float64)
    if dt.is_float and a.size >= 3:
        flat = a.reshape(-1)
        flat[0], flat[1] = -0.0, 0.0
        flat[rng.integers(0, a.size)] = np.nan
    a = a.astype(dt.numpy)
    t = source(a)
    if kind == "transposed" and a.ndim >= 2:
        a = np.ascontiguousarray(np.swapaxes(a, -1, -2))
        return source(a).t(), np.swapaxes(a, -1, -2)
    return t, a


def run_sort(p, dt, kinds, rng, source, op):
    x, xa = _sort_data(kinds[0], p["shape"], dt, rng, source, p["ties"])
    if op == "sort":
        vals, ids = x.sort_last_dim(p["asc"])
        ref_ids = np_sort_ids(xa, not p["asc"])
        return [(ids, ref_ids.astype(np.uint32), ref_ids, {"exact": True, "dt": lc.u32}),
                (vals, np.take_along_axis(xa, ref_ids, -1), xa, {"exact": True})]
    dim, k = p["dim"], p["k"]
    if op == "topk":
        k = min(k, p["shape"][dim])
        vals, ids = x.topk(k, dim, largest=not p["asc"])
        moved = np.moveaxis(xa, dim, -1)
        ref_ids = np.moveaxis(np_sort_ids(moved, not p["asc"])[..., :k], -1, dim)
        return [(ids, ref_ids, ref_ids, {"exact": True, "dt": lc.i64}),
                (vals, np.take_along_axis(xa, ref_ids, dim), xa, {"exact": True})]
    # cumsum: ints wrap in the dtype, floats accumulate wide and round each output once
    y = x.cumsum(dim)
    xw = wide(xa)
    if dt.is_int:
        return [(y, np.cumsum(xw, dim).astype(dt.numpy), None, {})]
    return [(y, np.cumsum(xw, dim), np.cumsum(np.abs(xw), dim), {})]


@st.composite
def reduce_params(draw):
    rank = draw(st.integers(0, 4))
    shape = tuple(draw(st.integers(0, 4)) for _ in range(rank))
    how = draw(st.sampled_from(["sum", "mean", "max", "min", "argmax", "argmin"]))
    if how in ("sum", "mean"):
        dims = sorted(set(draw(st.lists(st.integers(0, max(rank - 1, 0)), min_size=1, max_size=3)))) if rank else None
    else:
        dims = draw(st.integers(0, rank - 1)) if rank else None
    return dict(shape=shape, how=how, dims=dims, keepdim=draw(st.booleans()))


def run_reduce(p, dt, kinds, rng, source):
    """sum / mean / max / min / argmax / argmin over random dims (rank 0: over everything);
    a zero-length max / min / argmax must raise EmptyReduction at the call."""
    how, dims, keep = p["how"], p["dims"], p["keepdim"]
    if how == "mean" and not dt.is_float:
        how = "sum"
    x, xa = layout_input(kinds[0], p["shape"], dt, rng, source)
    axis = tuple(dims) if isinstance(dims, list) else dims
    empty = xa.size == 0 if axis is None else xa.shape[axis] == 0 if isinstance(axis, int) else False
    if how not in ("sum", "mean") and empty and 0 in np.delete(xa.shape, axis):
        return []       # nothing left to reduce into: test_max_over_empty_dim_into_empty_output_raises
    if how not in ("sum", "mean") and empty:
        with pytest.raises(lc.EmptyReduction):
            getattr(x, how)(dims, keepdim=keep) if dims is not None else getattr(x, how)()
        return []
    if dims is None:
        y = getattr(x, how)() if how not in ("argmax", "argmin") else x.flatten_all().argmax(0) \
            if how == "argmax" else x.flatten_all().argmin(0)
    else:
        y = getattr(x, how)(dims, keepdim=keep)
    xw = wide(xa)
    if how in ("argmax", "argmin"):
        flat = xw.reshape(-1) if dims is None else xw
        ref = getattr(np, how)(flat, axis=None if dims is None else axis, keepdims=keep and dims is not None)
        return [(y, np.asarray(ref).astype(np.uint32), None, {"dt": lc.u32})]
    with np.errstate(all="ignore"):
        if how == "sum":
            ref = np.sum(xw, axis=axis, keepdims=keep)
            if dt.is_int:
                return [(y, ref.astype(dt.numpy), None, {})]
        else:
            ref = getattr(np, how)(xw, axis=axis, keepdims=keep)
        mag = np.sum(np.abs(xw.astype(np.float64)), axis=axis, keepdims=keep)
    if how == "mean":
        mag = mag / max(1, xw.size // max(1, np.asarray(ref).size))
    return [(y, ref, mag, {"exact": how in ("max", "min")})]


@st.composite
def gather_params(draw):
    p = draw(scatter_params())
    p["select"] = draw(st.booleans())
    return p


def run_gather(p, dt, kinds, rng, source):
    """gather (ids of the tensor's shape but `n_src` along dim) and index_select (1-D ids)."""
    shape, dim, n = p["shape"], p["dim"], p["n_src"]
    x, xa = layout_input(kinds[0], shape, dt, rng, source)
    if p["select"]:
        ia = rng.integers(0, shape[dim], n).astype(p["ids_dt"].numpy)
        return [(x.index_select(source(ia), dim), np.take(xa, ia.astype(np.int64), dim), None, {"exact": True})]
    ia = rng.integers(0, shape[dim], shape[:dim] + (n,) + shape[dim + 1:]).astype(p["ids_dt"].numpy)
    return [(x.gather(source(ia), dim), np.take_along_axis(xa, ia.astype(np.int64), dim), None, {"exact": True})]


def run_slice_set_at(p, dt, kinds, rng, source):
    """slice_set with a runtime start (a one-element i64 tensor, as a decode step feeds its
    position), which may put part of src outside the tensor: those positions are not written."""
    shape, dim, n = p["shape"], p["dim"], p["n"]
    start = int(rng.integers(-n - 1, shape[dim] + 2))
    base, ba = layout_input(kinds[0], shape, dt, rng, source)
    src, sa = layout_input(kinds[1], shape[:dim] + (n,) + shape[dim + 1:], dt, rng, source)
    y = base.slice_set(src, dim, source(np.array([start], np.int64)))
    out = np.array(ba)
    for i in range(n):
        if 0 <= start + i < shape[dim]:
            out[(slice(None),) * dim + (start + i,)] = sa[(slice(None),) * dim + (i,)]
    return [(y, out, None, {"exact": True})]


# name -> (params strategy, runner(p, dt, kinds, rng, source), dtypes, number of tensor inputs)
FAMILIES = {
    "conv1d": (conv_params(1), lambda p, *a: run_conv(p, *a, transposed=False, rank=1), FLOAT_DTS + INT_DTS[:3], 2),
    "conv2d": (conv_params(2), lambda p, *a: run_conv(p, *a, transposed=False, rank=2), FLOAT_DTS + INT_DTS[:3], 2),
    "conv_transpose1d": (convt_params(1), lambda p, *a: run_conv(p, *a, transposed=True, rank=1), FLOAT_DTS + [lc.i32], 2),
    "conv_transpose2d": (convt_params(2), lambda p, *a: run_conv(p, *a, transposed=True, rank=2), FLOAT_DTS + [lc.i64], 2),
    "max_pool2d": (pool_params(), lambda p, *a: run_pool(p, *a, how="max"), FLOAT_DTS + INT_DTS, 1),
    "avg_pool2d": (pool_params(), lambda p, *a: run_pool(p, *a, how="avg"), FLOAT_DTS, 1),
    "scatter": (scatter_params(), lambda p, *a: run_scatter(p, *a, op="scatter"), FLOAT_DTS + INT_DTS, 2),
    "scatter_add": (scatter_params(), lambda p, *a: run_scatter(p, *a, op="scatter_add"), FLOAT_DTS + INT_DTS, 2),
    "index_add": (scatter_params(), lambda p, *a: run_scatter(p, *a, op="index_add"), FLOAT_DTS + INT_DTS, 2),
    "slice_set": (slice_set_params(), run_slice_set, FLOAT_DTS + INT_DTS, 2),
    "slice_set_at": (slice_set_params(), run_slice_set_at, FLOAT_DTS + INT_DTS, 2),
    "reduce": (reduce_params(), run_reduce, FLOAT_DTS + INT_DTS, 1),
    "gather": (gather_params(), run_gather, FLOAT_DTS + INT_DTS, 1),
    "sort": (sort_params(), lambda p, *a: run_sort(p, *a, op="sort"), FLOAT_DTS + INT_DTS, 1),
    "topk": (sort_params(), lambda p, *a: run_sort(p, *a, op="topk"), FLOAT_DTS + INT_DTS, 1),
    "cumsum": (sort_params(), lambda p, *a: run_sort(p, *a, op="cumsum"), FLOAT_DTS + INT_DTS, 1),
}


@st.composite
def op_cases(draw, families=tuple(FAMILIES)):
    fam = draw(st.sampled_from(sorted(families)))
    params, _, dts, n_in = FAMILIES[fam]
    return dict(family=fam, dt=draw(st.sampled_from(dts)), params=draw(params),
                kinds=[draw(st.sampled_from(LAYOUTS)) for _ in range(n_in)],
                mode=draw(st.sampled_from(["eager", "compiled", "together"])),
                seed=draw(st.integers(0, 2**32 - 1)))


def run_op_case(case):
    """Build the case's op over its inputs, realize it (eagerly, through lc.compile with
    placeholders, or together with every other result) and compare with NumPy."""
    fam, dt, mode = case["family"], case["dt"], case["mode"]
    _, runner, _, _ = FAMILIES[fam]
    feeds = {}

    def source(a):
        if mode != "compiled":
            return lc.tensor(a)
        name = f"in{len(feeds)}"
        feeds[name] = np.array(a, order="C")     # (ascontiguousarray makes 0-d 1-d)
        return lc.placeholder(name, a.shape, lc.DType.from_numpy(a.dtype))

    rng = np.random.default_rng(case["seed"])
    checks = runner(case["params"], dt, case["kinds"], rng, source)
    outs = [c[0] for c in checks]
    if not outs:
        return
    if mode == "compiled":
        prog = lc.compile(outs)
        used = {k: v for k, v in feeds.items() if k in {name for name, _, _ in prog.inputs}}
        kept = {k: v.copy() for k, v in used.items()}
        got = [g.copy() for g in prog.run(**used)]
        again = prog.run(**used)        # a second run: no state left by the first (in-place updates)
        for k, v in used.items():
            assert_same(v, kept[k], f"{fam}: feed {k} changed by the run")
        for g, a in zip(got, again):
            assert_same(a, g, f"{fam}: a second run of the same program differs")
    elif mode == "together":
        lc.realize(*outs)
        got = [t.numpy() for t in outs]
    else:
        got = [t.numpy() for t in outs]
    what = f"{fam} {dt.name} {mode} kinds {case['kinds']} params {case['params']} seed {case['seed']}"
    for g, (_, ref, mag, opts) in zip(got, checks):
        opts = dict(opts)
        check(g, ref, mag, opts.pop("dt", dt), what, **opts)
