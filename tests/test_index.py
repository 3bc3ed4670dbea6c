"""Indexing and data movement against NumPy: index_select, gather, scatter, scatter_add,
index_add, cat, stack, pad_with_zeros / pad_with_same, upsample_nearest1d / 2d and the pools
(max_pool2d / avg_pool2d; convolution is in test_conv.py).  Every op x dtypes (including a
storage-only one where the op is data movement) x layouts x odd / zero sizes x id dtypes;
out-of-range and negative ids raise IndexOutOfBounds and the process survives; 1 and 2 threads
give identical bits."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import lazycandle as lc
from conftest import assert_matches, assert_same, data, ids as dt_ids, make_input, rng_for

MOVE_DTYPES = [lc.f32, lc.f64, lc.f16, lc.bf16, lc.i64, lc.u8, lc.u32, lc.f4, lc.f8e8m0]
ARITH_DTYPES = [lc.f32, lc.f64, lc.f16, lc.bf16, lc.i64, lc.u8, lc.u32, lc.f8e4m3]
ID_DTYPES = [lc.u8, lc.u32, lc.i64]
LAYOUTS = ["contiguous", "transposed", "narrowed", "broadcast"]


def dtype_layout_cases(dtypes):
    """Each dtype with one layout (cycling), plus f32 with every layout: every dtype and every
    layout is covered without compiling the whole cross product."""
    cases = [(dt, LAYOUTS[i % len(LAYOUTS)]) for i, dt in enumerate(dtypes)]
    cases += [(lc.f32, l) for l in LAYOUTS if (lc.f32, l) not in cases]
    return cases


def case_id(c):
    return getattr(c, "name", str(c))


def same(got, exp, what=""):
    """Exact comparison; storage-only dtypes (no NumPy arithmetic) compare raw bytes."""
    got, exp = np.asarray(got), np.asarray(exp)
    assert got.shape == exp.shape, f"{what}: shape {got.shape} != {exp.shape}"
    assert got.dtype == exp.dtype, f"{what}: dtype {got.dtype} != {exp.dtype}"
    if got.dtype in (lc.f4.numpy, lc.f6e2m3.numpy, lc.f6e3m2.numpy, lc.f8e8m0.numpy):
        np.testing.assert_array_equal(np.ascontiguousarray(got).view(np.uint8),
                                      np.ascontiguousarray(exp).view(np.uint8), err_msg=what)
        return
    assert_same(got, exp, what, bits=True)


def id_array(id_dt, shape, bound, rng):
    return rng.integers(0, max(bound, 1), size=shape).astype(id_dt.numpy)


def ids_tensor(arr, layout="contiguous"):
    """ids tensor with the given layout (transposed / narrowed views of a bigger buffer)."""
    arr = np.asarray(arr)
    if layout == "transposed" and arr.ndim >= 2:
        return lc.tensor(np.ascontiguousarray(np.swapaxes(arr, -1, -2))).t()
    if layout == "narrowed":
        big = np.zeros(tuple(d + 2 for d in arr.shape), arr.dtype)
        big[tuple(slice(1, 1 + d) for d in arr.shape)] = arr
        t = lc.tensor(big)
        for d, n in enumerate(arr.shape):
            t = t.narrow(d, 1, n)
        return t
    return lc.tensor(arr)


def add_in(dt, a, b):
    """a + b rounded like lazycandle: ints wrap, f16/bf16/f8 compute in f32 and round once."""
    if dt.is_int:
        return (a + b).astype(dt.numpy)
    if dt is lc.f64:
        return a + b
    return (a.astype(np.float32) + b.astype(np.float32)).astype(dt.numpy)


def ref_scatter(a, ids, src, dim, mode, dt, vector_ids=False):
    """Sequential reference: mid position i in order, each a conflict-free put_along_axis."""
    out = np.array(a, copy=True)
    for i in range(src.shape[dim]):
        s = np.take(src, [i], axis=dim)
        idx = np.full(s.shape, ids[i], np.int64) if vector_ids else np.take(ids, [i], axis=dim).astype(np.int64)
        new = s if mode == "set" else add_in(dt, np.take_along_axis(out, idx, axis=dim), s)
        np.put_along_axis(out, idx, new, axis=dim)
    return out


# ---- index_select ------------------------------------------------------------------------------
@pytest.mark.parametrize("dt,layout", dtype_layout_cases(MOVE_DTYPES), ids=case_id)
def test_index_select_dtypes_layouts(dt, layout):
    rng = rng_for("isel", dt.name, layout)
    shape = (5, 7, 3)
    t, a = make_input(layout, shape, dt, rng)
    for dim, id_dt in ((0, lc.u32), (1, lc.i64), (2, lc.u8)):
        ids = id_array(id_dt, (9,), shape[dim], rng)
        same(t.index_select(lc.tensor(ids), dim).numpy(), np.take(a, ids.astype(np.int64), axis=dim),
             f"index_select {dt.name} {layout} dim {dim}")


@pytest.mark.parametrize("shape,dim,id_dt", [((1,), 0, lc.u8), ((13,), 0, lc.u32), ((4, 1), 1, lc.i64),
                                             ((3, 5, 2, 4), 2, lc.u8), ((3, 5, 2, 4), -1, lc.u32),
                                             ((2, 300), 0, lc.i64), ((600, 3), 1, lc.u32)], ids=case_id)
def test_index_select_shapes(shape, dim, id_dt):
    rng = rng_for("isel-shape", id_dt.name, shape, dim)
    a = data(lc.f32, shape, rng)
    ids = id_array(id_dt, (7,), shape[dim], rng)
    got = lc.tensor(a).index_select(lc.tensor(ids), dim).numpy()
    same(got, np.take(a, ids.astype(np.int64), axis=dim))


def test_index_select_strided_ids_and_const_operands():
    rng = rng_for("isel-strided-ids")
    a = data(lc.f32, (6, 5), rng)
    big = np.array([[5, 0, 1], [3, 3, 2]], np.int64)
    got = lc.tensor(a).index_select(lc.tensor(big).t()[:, 1], 0).numpy()   # ids stride 3
    same(got, a[big.T[:, 1]])
    z = lc.zeros((4, 3), lc.f32).index_select(lc.tensor([0, 3, 3]), 0).numpy()   # constant tensor
    same(z, np.zeros((3, 3), np.float32))
    one = lc.tensor(a).index_select(lc.zeros((2,), lc.u32), 1).numpy()          # constant ids
    same(one, a[:, [0, 0]])


def test_index_select_lists_and_embedding():
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    same(lc.tensor(a).index_select([3, 1], 0).numpy(), a[[3, 1]])
    same(lc.tensor(a).embedding(lc.tensor(np.array([2, 2, 0], np.uint32))).numpy(), a[[2, 2, 0]])


def test_index_select_of_lazy_inputs_fuses_around():
    rng = rng_for("isel-lazy")
    a = data(lc.f32, (8, 16), rng)
    t = lc.tensor(a)
    ids = lc.tensor(np.array([1, 7, 0], np.int64))
    y = ((t * 2.0).index_select(ids + 0, 0) + 1.0).numpy()      # producer, id arithmetic, consumer
    same(y, (a * 2.0)[[1, 7, 0]] + 1.0)


# ---- gather ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt,layout", dtype_layout_cases(MOVE_DTYPES), ids=case_id)
def test_gather_dtypes_layouts(dt, layout):
    rng = rng_for("gather", dt.name, layout)
    shape = (4, 6, 5)
    t, a = make_input(layout, shape, dt, rng)
    for dim, id_dt, n in ((0, lc.i64, 7), (1, lc.u8, 3), (2, lc.u32, 5)):
        ishape = shape[:dim] + (n,) + shape[dim + 1:]
        ids = id_array(id_dt, ishape, shape[dim], rng)
        for ilay in ("contiguous", "transposed") if dt is lc.f32 else ("contiguous",):
            got = t.gather(ids_tensor(ids, ilay), dim).numpy()
            same(got, np.take_along_axis(a, ids.astype(np.int64), axis=dim), f"gather {dt.name} {layout} {dim} {ilay}")


@pytest.mark.parametrize("shape,dim,n", [((1,), 0, 5), ((17,), 0, 17), ((3, 1), 1, 1), ((2, 3, 4, 5), 1, 2),
                                         ((2, 3, 4, 5), 3, 6), ((1000, 2), 0, 40)])
def test_gather_shapes(shape, dim, n):
    rng = rng_for("gather-shape", shape, dim, n)
    a = data(lc.i64, shape, rng)
    ids = id_array(lc.u32, shape[:dim] + (n,) + shape[dim + 1:], shape[dim], rng)
    same(lc.tensor(a).gather(lc.tensor(ids), dim).numpy(), np.take_along_axis(a, ids.astype(np.int64), axis=dim))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_gather_index_select_hypothesis(hdata):
    rank = hdata.draw(st.integers(1, 4))
    shape = tuple(hdata.draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    dim = hdata.draw(st.integers(-rank, rank - 1))
    d = dim % rank
    id_dt = hdata.draw(st.sampled_from(ID_DTYPES))
    dt = hdata.draw(st.sampled_from([lc.f32, lc.u8, lc.f16]))
    layout = hdata.draw(st.sampled_from(LAYOUTS))
    rng = np.random.default_rng(hdata.draw(st.integers(0, 2 ** 32 - 1)))
    t, a = make_input(layout, shape, dt, rng)
    n = hdata.draw(st.integers(0, 7))
    ids1 = id_array(id_dt, (n,), shape[d], rng)
    same(t.index_select(lc.tensor(ids1), dim).numpy(), np.take(a, ids1.astype(np.int64), axis=d), "index_select")
    ids2 = id_array(id_dt, shape[:d] + (n,) + shape[d + 1:], shape[d], rng)
    same(t.gather(lc.tensor(ids2), dim).numpy(), np.take_along_axis(a, ids2.astype(np.int64), axis=d), "gather")


# ---- scatter / scatter_add / index_add ---------------------------------------------------------
@pytest.mark.parametrize("dt,layout", dtype_layout_cases(ARITH_DTYPES), ids=case_id)
def test_scatter_add_dtypes_layouts(dt, layout):
    rng = rng_for("scatter_add", dt.name, layout)
    shape = (5, 4, 3)
    t, a = make_input(layout, shape, dt, rng)
    for dim, id_dt, n in ((0, lc.u32, 8), (1, lc.i64, 2), (2, lc.u8, 5)):
        sshape = shape[:dim] + (n,) + shape[dim + 1:]
        s_t, s = make_input("transposed" if layout == "narrowed" else "contiguous", sshape, dt, rng)
        ids = id_array(id_dt, sshape, shape[dim], rng)           # duplicates on purpose
        got = t.scatter_add(lc.tensor(ids), s_t, dim).numpy()
        same(got, ref_scatter(a, ids, s, dim, "add", dt), f"scatter_add {dt.name} {layout} dim {dim}")


@pytest.mark.parametrize("dt,layout", dtype_layout_cases(MOVE_DTYPES), ids=case_id)
def test_scatter_dtypes_layouts(dt, layout):
    rng = rng_for("scatter", dt.name, layout)
    shape = (6, 5)
    t, a = make_input(layout, shape, dt, rng)
    for dim, id_dt in ((0, lc.i64), (1, lc.u8)):
        sshape = (3, 5) if dim == 0 else (6, 4)
        s = data(dt, sshape, rng)
        # distinct ids per (pre, post) column so the result does not depend on write order ...
        ids = np.stack([rng.permutation(shape[dim])[:sshape[dim]] for _ in range(sshape[1 - dim])], axis=1 - dim)
        ids = ids.astype(id_dt.numpy)
        got = t.scatter(lc.tensor(ids), lc.tensor(s), dim).numpy()
        same(got, ref_scatter(a, ids, s, dim, "set", dt), f"scatter {dt.name} {layout} dim {dim}")
    # ... and with duplicates the last write along dim wins (sequential semantics, deterministic)
    ids = np.zeros((4, 5), np.uint32)
    s = data(dt, (4, 5), rng)
    same(t.scatter(lc.tensor(ids), lc.tensor(s), 0).numpy(), ref_scatter(a, ids, s, 0, "set", dt))


@pytest.mark.parametrize("dt,layout", dtype_layout_cases(ARITH_DTYPES), ids=case_id)
def test_index_add_dtypes_layouts(dt, layout):
    rng = rng_for("index_add", dt.name, layout)
    shape = (4, 7, 3)
    t, a = make_input(layout, shape, dt, rng)
    for dim, id_dt, n in ((0, lc.u8, 9), (1, lc.u32, 3), (2, lc.i64, 4)):
        sshape = shape[:dim] + (n,) + shape[dim + 1:]
        s_t, s = make_input("broadcast" if layout == "transposed" else "contiguous", sshape, dt, rng)
        ids = id_array(id_dt, (n,), shape[dim], rng)
        got = t.index_add(lc.tensor(ids), s_t, dim).numpy()
        same(got, ref_scatter(a, ids, s, dim, "add", dt, vector_ids=True), f"index_add {dt.name} {layout} {dim}")


def test_scatter_ops_zero_sizes():
    rng = rng_for("scatter-zero")
    a = data(lc.f32, (3, 4), rng)
    t = lc.tensor(a)
    empty_ids = lc.tensor(np.zeros((0, 4), np.int64))
    empty_src = lc.tensor(np.zeros((0, 4), np.float32))
    same(t.scatter_add(empty_ids, empty_src, 0).numpy(), a)        # nothing scattered: a copy
    same(t.scatter(empty_ids, empty_src, 0).numpy(), a)
    same(t.index_add(lc.tensor(np.zeros((0,), np.uint32)), empty_src, 0).numpy(), a)
    z = lc.tensor(np.zeros((0, 4), np.float32))
    same(z.scatter_add(lc.tensor(np.zeros((0, 4), np.uint8)), z, 0).numpy(), np.zeros((0, 4), np.float32))
    same(z.index_select(lc.tensor(np.zeros((0,), np.uint32)), 0).numpy(), np.zeros((0, 4), np.float32))
    same(t.index_select(lc.tensor(np.zeros((0,), np.uint32)), 1).numpy(), np.zeros((3, 0), np.float32))
    same(t.gather(lc.tensor(np.zeros((0, 4), np.int64)), 0).numpy(), np.zeros((0, 4), np.float32))
    # a target dim of size 0: every id is out of range
    e = lc.tensor(np.zeros((3, 0), np.float32))
    with pytest.raises(lc.IndexOutOfBounds):
        e.scatter_add(lc.tensor(np.zeros((3, 2), np.int64)), lc.tensor(np.ones((3, 2), np.float32)), 1).numpy()


def test_scatter_add_int_wraps():
    a = np.array([250, 3], np.uint8)
    got = lc.tensor(a).scatter_add(lc.tensor(np.array([0, 0, 1], np.uint32)),
                                   lc.tensor(np.array([5, 4, 1], np.uint8)), 0).numpy()
    same(got, np.array([3, 4], np.uint8))


# ---- out-of-range ids ---------------------------------------------------------------------------
def _bad_cases():
    cases = []
    for id_dt in ID_DTYPES:
        bad_vals = [4, 255] if id_dt is lc.u8 else ([4, 2 ** 32 - 1] if id_dt is lc.u32 else [4, -1, -(2 ** 63)])
        for v in bad_vals:
            cases.append((id_dt, v))
    return cases


@pytest.mark.parametrize("op", ["index_select", "gather", "scatter", "scatter_add", "index_add"])
@pytest.mark.parametrize("id_dt,bad", _bad_cases(), ids=lambda x: getattr(x, "name", str(x)))
def test_out_of_range_ids_raise(op, id_dt, bad):
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    t = lc.tensor(a)
    if op in ("index_select", "index_add"):
        vals = np.array([1, 3, 0, 2, 1], np.int64)
        vals[3] = bad
        ids = lc.tensor(vals.astype(id_dt.numpy))
    else:
        vals = np.zeros((5, 3), np.int64)
        vals[2, 1] = bad
        ids = lc.tensor(vals.astype(id_dt.numpy))
    src = lc.tensor(np.ones((5, 3), np.float32))
    make = {"index_select": lambda: t.index_select(ids, 0), "gather": lambda: t.gather(ids, 0),
            "scatter": lambda: t.scatter(ids, src, 0), "scatter_add": lambda: t.scatter_add(ids, src, 0),
            "index_add": lambda: t.index_add(ids, src, 0)}[op]
    y = make()
    with pytest.raises(lc.IndexOutOfBounds) as ei:
        y.numpy()
    msg = str(ei.value)
    assert op in msg and str(bad if id_dt is lc.i64 else int(np.array(bad).astype(id_dt.numpy))) in msg
    assert "size 4" in msg
    assert isinstance(ei.value, IndexError)
    assert y.is_lazy
    with pytest.raises(lc.IndexOutOfBounds):     # still raises, never crashes
        y.realize()
    # and the process is fine: the same op with good ids works
    good = lc.tensor(np.clip(vals, 0, 3).astype(id_dt.numpy))
    make_good = {"index_select": lambda: t.index_select(good, 0), "gather": lambda: t.gather(good, 0),
                 "scatter": lambda: t.scatter(good, src, 0), "scatter_add": lambda: t.scatter_add(good, src, 0),
                 "index_add": lambda: t.index_add(good, src, 0)}[op]
    assert make_good().numpy().shape[1] == 3


def test_out_of_range_ids_big_parallel():
    """Bad ids spread over a big, multi-threaded kernel: still one clean IndexOutOfBounds."""
    rng = rng_for("oob-big")
    a = data(lc.f32, (64, 4096), rng)
    ids = rng.integers(0, 64, size=(128, 4096)).astype(np.int64)
    ids[5, 7] = -3
    ids[100, 4000] = 64
    with lc.num_threads(2):
        with pytest.raises(lc.IndexOutOfBounds):
            lc.tensor(a).gather(lc.tensor(ids), 0).numpy()
        with pytest.raises(lc.IndexOutOfBounds):
            lc.tensor(a).scatter_add(lc.tensor(ids), lc.tensor(data(lc.f32, (128, 4096), rng)), 0).numpy()


# ---- call-time errors ---------------------------------------------------------------------------
def test_index_errors_at_call():
    t = lc.tensor(np.zeros((3, 4), np.float32))
    for bad_dt in (np.int32, np.int16, np.float32):
        with pytest.raises(lc.UnsupportedDTypeForOp, match="index_select"):
            t.index_select(lc.tensor(np.zeros(2, bad_dt)), 0)
        with pytest.raises(lc.UnsupportedDTypeForOp, match="gather"):
            t.gather(lc.tensor(np.zeros((3, 4), bad_dt)), 0)
    ids2 = lc.tensor(np.zeros((2, 2), np.int64))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="index_select"):
        t.index_select(ids2, 0)
    with pytest.raises(lc.DimOutOfRange):
        t.index_select(lc.tensor(np.zeros(2, np.int64)), 2)
    with pytest.raises(lc.DimOutOfRange):
        t.gather(lc.tensor(np.zeros((3, 4), np.int64)), -3)
    with pytest.raises(lc.ShapeMismatchBinaryOp, match=r"gather.*\(3, 5\)"):
        t.gather(lc.tensor(np.zeros((3, 5), np.int64)), 0)
    with pytest.raises(lc.ShapeMismatchBinaryOp):
        t.gather(lc.tensor(np.zeros((3,), np.int64)), 0)
    src = lc.tensor(np.zeros((2, 4), np.float32))
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="scatter_add"):
        t.scatter_add(lc.tensor(np.zeros((2, 3), np.int64)), src, 0)
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="scatter"):
        t.scatter(lc.tensor(np.zeros((2, 4), np.int64)), lc.tensor(np.zeros((2, 5), np.float32)), 0)
    with pytest.raises(lc.DTypeMismatchBinaryOp, match="scatter_add"):
        t.scatter_add(lc.tensor(np.zeros((2, 4), np.int64)), lc.tensor(np.zeros((2, 4), np.float64)), 0)
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="index_add"):
        t.index_add(lc.tensor(np.zeros((3,), np.int64)), src, 0)
    with pytest.raises(lc.UnsupportedDTypeForOp, match="index_add"):
        t.index_add(lc.tensor(np.zeros((2,), np.float32)), src, 0)
    f4 = lc.tensor(np.zeros((3, 4), np.float32).astype(lc.f4.numpy))
    f4src = lc.tensor(np.zeros((2, 4), np.float32).astype(lc.f4.numpy))
    with pytest.raises(lc.UnsupportedDTypeForOp, match="storage-only"):
        f4.scatter_add(lc.tensor(np.zeros((2, 4), np.int64)), f4src, 0)
    with pytest.raises(lc.UnsupportedDTypeForOp, match="storage-only"):
        f4.index_add(lc.tensor(np.zeros((2,), np.int64)), f4src, 0)
    with pytest.raises(lc.DimOutOfRange):
        lc.tensor(np.float32(1.0)).index_select(lc.tensor(np.zeros(1, np.int64)), 0)


# ---- threads --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", [lc.f32, lc.bf16, lc.i64], ids=dt_ids([lc.f32, lc.bf16, lc.i64]))
def test_one_vs_two_threads_identical(dt):
    rng = rng_for("threads", dt.name)
    a = data(dt, (64, 2048), rng)
    s = data(dt, (256, 2048), rng)
    ids = rng.integers(0, 64, size=(256, 2048)).astype(np.int64)      # heavy duplicates
    vids = rng.integers(0, 64, size=(256,)).astype(np.uint32)
    sel = rng.integers(0, 64, size=(300,)).astype(np.uint32)
    outs = []
    for n in (1, 2):
        with lc.num_threads(n):
            t = lc.tensor(a)
            outs.append([t.scatter_add(lc.tensor(ids), lc.tensor(s), 0).numpy(),
                         t.index_add(lc.tensor(vids), lc.tensor(s), 0).numpy(),
                         t.t().scatter_add(lc.tensor(ids.T.copy()), lc.tensor(s.T.copy()), 1).numpy(),
                         t.gather(lc.tensor(ids), 0).numpy(),
                         t.index_select(lc.tensor(sel), 0).numpy(),
                         lc.cat([t, t.t().contiguous().t()], 0).numpy()])
    for x, y in zip(*outs):
        same(x, y, "1 vs 2 threads")
    same(outs[0][0], ref_scatter(a, ids, s, 0, "add", dt))
    same(outs[0][1], ref_scatter(a, vids, s, 0, "add", dt, vector_ids=True))
    same(outs[0][3], np.take_along_axis(a, ids, 0))
    same(outs[0][4], a[sel])


def test_compiled_once_per_structure(compiled_counter):
    rng = rng_for("once")
    def run():
        a = data(lc.f32, (9, 11), rng)
        ids = id_array(lc.u32, (5,), 9, rng)
        return lc.tensor(a).index_select(lc.tensor(ids), 0).numpy(), a[ids]
    got, exp = run()
    same(got, exp)
    c = compiled_counter()
    for _ in range(3):
        got, exp = run()
        same(got, exp)
    assert compiled_counter() == c


# ---- cat / stack / pad ----------------------------------------------------------------------------
@pytest.mark.parametrize("dt", MOVE_DTYPES + [lc.f6e3m2], ids=dt_ids(MOVE_DTYPES + [lc.f6e3m2]))
def test_cat_dtypes_layouts(dt):
    rng = rng_for("cat", dt.name)
    for dim in (0, 1, 2, -1) if dt is lc.f32 else (1,):
        d = dim % 3
        parts, arrs = [], []
        for k, layout in enumerate(LAYOUTS):
            shape = [3, 5, 4]
            shape[d] = (2, 1, 3, 5)[k]
            t, a = make_input(layout, tuple(shape), dt, rng)
            parts.append(t)
            arrs.append(a)
        same(lc.cat(parts, dim).numpy(), np.concatenate(arrs, axis=d), f"cat {dt.name} dim {dim}")


def test_cat_shapes_and_edge_cases():
    rng = rng_for("cat-edge")
    a, b = data(lc.f32, (2, 3), rng), data(lc.f32, (0, 3), rng)
    same(lc.cat([lc.tensor(a), lc.tensor(b), lc.tensor(a)], 0).numpy(), np.concatenate([a, b, a]))
    same(lc.cat([lc.tensor(a)], 1).numpy(), a)
    same(lc.cat([lc.tensor(b), lc.tensor(b)], 1).numpy(), np.zeros((0, 6), np.float32))
    x = data(lc.f32, (7,), rng)
    same(lc.cat([lc.tensor(x), lc.full(2.5, (3,)), lc.tensor(x)[::2]], 0).numpy(),
         np.concatenate([x, np.full(3, 2.5, np.float32), x[::2]]))
    big = [data(lc.f32, (300, 257), rng) for _ in range(3)]        # threaded path, odd sizes
    same(lc.cat([lc.tensor(v) for v in big], 1).numpy(), np.concatenate(big, 1))
    same(lc.cat([lc.tensor(v).t() for v in big], 0).numpy(), np.concatenate([v.T for v in big], 0))
    lazy = lc.cat([lc.tensor(a) + 1.0, lc.tensor(a).exp()], 1)
    assert_matches(lazy.numpy(), np.concatenate([a + 1.0, np.exp(a.astype(np.float64))], 1), lc.f32, "transc")


def test_cat_errors():
    a = lc.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(lc.DTypeMismatchBinaryOp, match="cat"):
        lc.cat([a, lc.tensor(np.zeros((2, 3), np.float64))], 0)
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="cat"):
        lc.cat([a, lc.tensor(np.zeros((2, 4), np.float32))], 0)
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="cat"):
        lc.cat([a, lc.tensor(np.zeros((2, 3, 1), np.float32))], 0)
    with pytest.raises(lc.DimOutOfRange):
        lc.cat([a, a], 2)
    with pytest.raises(ValueError):
        lc.cat([], 0)
    with pytest.raises(lc.ShapeMismatchBinaryOp, match="stack"):
        lc.stack([a, lc.tensor(np.zeros((3, 2), np.float32))], 0)
    with pytest.raises(lc.DimOutOfRange):
        lc.stack([a, a], 3)


@pytest.mark.parametrize("dt", [lc.f32, lc.u8, lc.bf16, lc.f8e8m0], ids=dt_ids([lc.f32, lc.u8, lc.bf16, lc.f8e8m0]))
def test_stack(dt):
    rng = rng_for("stack", dt.name)
    ts, arrs = zip(*[make_input(l, (3, 4), dt, rng) for l in ("contiguous", "transposed", "broadcast")])
    for dim in (0, 1, 2, -1, -3) if dt is lc.f32 else (1,):
        same(lc.stack(ts, dim).numpy(), np.stack(arrs, axis=dim), f"stack dim {dim}")


@pytest.mark.parametrize("dt,layout", [(lc.f32, "contiguous"), (lc.i64, "transposed"), (lc.f16, "broadcast"),
                                       (lc.f4, "narrowed")], ids=case_id)
def test_pad(dt, layout):
    rng = rng_for("pad", dt.name, layout)
    t, a = make_input(layout, (3, 5), dt, rng)
    zero = np.zeros((), np.float32).astype(dt.numpy)
    for dim, l, r in ((0, 1, 2), (-1, 2, 0), (1, 0, 0)):
        d = dim % 2
        width = [(0, 0), (0, 0)]
        width[d] = (l, r)
        same(t.pad_with_zeros(dim, l, r).numpy(), np.pad(a, width, constant_values=zero), f"pad zeros {dim}")
        same(t.pad_with_same(dim, l, r).numpy(), np.pad(a, width, mode="edge"), f"pad same {dim}")
    with pytest.raises(lc.DimOutOfRange):
        t.pad_with_zeros(2, 1, 1)
    with pytest.raises(ValueError):
        t.pad_with_same(0, -1, 1)


# ---- upsample -----------------------------------------------------------------------------------
def _nearest_ids(src, dst):
    return (np.arange(dst) * src) // dst


@pytest.mark.parametrize("dt,layout", [(lc.f32, "contiguous"), (lc.u32, "transposed"), (lc.bf16, "narrowed"),
                                       (lc.f6e2m3, "contiguous")], ids=case_id)
def test_upsample_nearest1d(dt, layout):
    rng = rng_for("up1", dt.name, layout)
    t, a = make_input(layout, (2, 3, 7), dt, rng)
    for size in (7, 14, 11, 3, 1):
        same(t.upsample_nearest1d(size).numpy(), np.take(a, _nearest_ids(7, size), axis=2), f"size {size}")
    t8, a8 = make_input(layout, (1, 2, 8), dt, rng)
    same(t8.upsample_nearest1d(4).numpy(), a8[..., ::2])


@pytest.mark.parametrize("dt,layout", [(lc.f32, "contiguous"), (lc.f16, "transposed"), (lc.i64, "broadcast")],
                         ids=case_id)
def test_upsample_nearest2d(dt, layout):
    rng = rng_for("up2", dt.name, layout)
    t, a = make_input(layout, (2, 3, 5, 4), dt, rng)
    for h, w in ((10, 8), (7, 9), (3, 4), (15, 5)):
        exp = np.take(np.take(a, _nearest_ids(5, h), axis=2), _nearest_ids(4, w), axis=3)
        same(t.upsample_nearest2d(h, w).numpy(), exp, f"{h}x{w}")
    with pytest.raises(lc.ShapeMismatch):
        t.upsample_nearest1d(3)


# ---- pools --------------------------------------------------------------------------------------
def _windows(a, kh, kw, sh, sw):
    w = np.lib.stride_tricks.sliding_window_view(a, (kh, kw), axis=(2, 3))
    return w[:, :, ::sh, ::sw]


POOL_CASES = [(2, None), ((3, 2), None), (3, 2), ((2, 3), (1, 2)), (1, 1), ((5, 7), None)]


POOL_DT_CASES = [(lc.f32, l, POOL_CASES) for l in ("contiguous", "transposed", "narrowed", "broadcast")] + [
    (dt, l, POOL_CASES[2:4]) for dt, l in ((lc.f64, "transposed"), (lc.f16, "narrowed"), (lc.bf16, "contiguous"),
                                           (lc.i64, "transposed"), (lc.u8, "contiguous"))]


@pytest.mark.parametrize("dt,layout,cases", POOL_DT_CASES, ids=case_id)
def test_max_pool2d(dt, layout, cases):
    rng = rng_for("maxpool", dt.name, layout)
    t, a = make_input(layout, (2, 3, 7, 9), dt, rng)
    for k, s in cases:
        kh, kw = (k, k) if isinstance(k, int) else k
        sh, sw = (kh, kw) if s is None else ((s, s) if isinstance(s, int) else s)
        exp = _windows(a, kh, kw, sh, sw).max(axis=(-1, -2))
        same(t.max_pool2d(k, s).numpy(), exp, f"max_pool2d {k} {s}")


@pytest.mark.parametrize("dt,layout,cases", [c for c in POOL_DT_CASES if c[0].is_float], ids=case_id)
def test_avg_pool2d(dt, layout, cases):
    rng = rng_for("avgpool", dt.name, layout)
    t, a = make_input(layout, (2, 3, 7, 9), dt, rng)
    for k, s in cases:
        kh, kw = (k, k) if isinstance(k, int) else k
        sh, sw = (kh, kw) if s is None else ((s, s) if isinstance(s, int) else s)
        ref = _windows(a.astype(np.float64), kh, kw, sh, sw).mean(axis=(-1, -2))
        assert_matches(t.avg_pool2d(k, s).numpy(), ref, dt, "arith", f"avg_pool2d {k} {s}")


def test_pool_errors_and_edges():
    t = lc.tensor(np.zeros((1, 1, 3, 3), np.float32))
    with pytest.raises(lc.ShapeMismatch):
        t.max_pool2d(4)
    with pytest.raises(lc.ShapeMismatch):
        lc.tensor(np.zeros((3, 3), np.float32)).avg_pool2d(2)
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.tensor(np.zeros((1, 1, 3, 3), np.int64)).avg_pool2d(2)
    with pytest.raises(lc.UnsupportedDTypeForOp):
        lc.tensor(np.zeros((1, 1, 3, 3), np.float32).astype(lc.f4.numpy)).max_pool2d(2)
    with pytest.raises(ValueError):
        t.max_pool2d(0)
    same(lc.tensor(np.zeros((0, 2, 4, 4), np.float32)).max_pool2d(2).numpy(), np.zeros((0, 2, 2, 2), np.float32))
    same(lc.zeros((1, 2, 4, 4)).max_pool2d(2).numpy(), np.zeros((1, 2, 2, 2), np.float32))   # constant input


def test_dump_of_index_kernels():
    t = lc.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    y = lc.cat([t.index_select(lc.tensor([2, 0]), 0), t], 0)
    sched = lc.dump(y, stage="schedule")
    assert "index_select" in sched and "cat" in sched
    llvm = lc.dump(y, stage="llvm")
    assert '@"idx"' in llvm and '@"copy"' in llvm
