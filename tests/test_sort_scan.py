"""Sorting (arg_sort_last_dim, sort_last_dim, topk) and cumsum against NumPy: every compute dtype,
ties (stability), NaN / Inf / signed zeros, row lengths 0, 1, odd and past a power of two,
every layout, dims anywhere; errors at the call; a hypothesis sweep over shapes, layouts and
dtypes.  Sort order is exact: ids equal np.argsort(kind="stable") (NaN last) ascending, and a
stable sort with NaN first descending."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import lazycandle as lc
from conftest import COMPUTE, FLOATS, INTS, ids as dt_ids, make_input, rng_for, with_specials

LAYOUTS = ["contiguous", "transposed", "narrowed", "stepped", "broadcast", "permuted"]


def sort_data(dt, shape, *key):
    """Values with many ties; floats also get NaN, +-Inf and both zeros."""
    rng = rng_for(dt.name, shape, *key)
    if dt.is_int:
        info = np.iinfo(dt.numpy)
        v = rng.integers(0, 6, shape) if rng.random() < 0.5 else rng.integers(int(info.min), int(info.max), shape,
                                                                              endpoint=True, dtype=np.int64 if dt is not lc.u32 else np.uint64)
        a = np.asarray(v).astype(dt.numpy)
        if a.size >= 2:
            a.reshape(-1)[:2] = info.min, info.max
        return a
    a = (rng.integers(-4, 5, shape) / 2.0).astype(np.float32).astype(dt.numpy)
    if a.size:
        flat = a.reshape(-1)
        pick = rng.random(flat.size) < 0.3
        specials = with_specials(np.zeros(14, np.float32)).astype(dt.numpy)
        flat[pick] = specials[rng.integers(0, len(specials), int(pick.sum()))]
    return a


def as_exact(a):
    """Values as a NumPy array that orders exactly like the dtype (ints stay ints)."""
    return a if a.dtype.kind in "iu" else a.astype(np.float64)


def ref_argsort(a, asc=True):
    """Stable argsort of each last-dim row; NaN last ascending, first descending."""
    x = as_exact(np.asarray(a))
    if asc:
        return np.argsort(x, axis=-1, kind="stable").astype(np.uint32)
    flat = x.reshape(int(np.prod(x.shape[:-1])), x.shape[-1])
    out = np.empty(flat.shape, np.uint32)
    for r, row in enumerate(flat):
        vals = row.tolist()
        out[r] = sorted(range(len(vals)), key=lambda i: (0, 0) if vals[i] != vals[i] else (1, -vals[i]))
    return out.reshape(x.shape)


def same_bits(got, exp):
    got, exp = np.ascontiguousarray(got), np.ascontiguousarray(exp)
    assert got.shape == exp.shape and got.dtype == exp.dtype, (got.shape, got.dtype, exp.shape, exp.dtype)
    np.testing.assert_array_equal(got.view(np.uint8), exp.view(np.uint8))


# ---- argsort / sort ----------------------------------------------------------------------
@pytest.mark.parametrize("asc", [True, False], ids=["asc", "desc"])
@pytest.mark.parametrize("dt", COMPUTE, ids=dt_ids(COMPUTE))
def test_sort_matches_stable_argsort_for_every_dtype(dt, asc):
    a = sort_data(dt, (6, 37), asc)
    t = lc.tensor(a)
    ids = t.arg_sort_last_dim(asc=asc)
    assert ids.dtype is lc.u32
    exp = ref_argsort(a, asc)
    np.testing.assert_array_equal(ids.numpy(), exp)
    values, ids2 = t.sort_last_dim(asc=asc)
    np.testing.assert_array_equal(ids2.numpy(), exp)
    same_bits(values.numpy(), np.take_along_axis(a, exp.astype(np.int64), -1))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 8, 9, 16, 31, 33, 64, 65, 127, 129, 1000, 4097])
def test_sort_any_row_length(n):
    a = sort_data(lc.f32, (3, n), "len")
    for asc in (True, False):
        np.testing.assert_array_equal(lc.tensor(a).arg_sort_last_dim(asc).numpy(), ref_argsort(a, asc))


def _specials_row_data(shape, key):
    """f32 rows of few distinct values (many ties) with NaNs (one a negative NaN with a payload,
    whose bits the sorted values must keep), infs and both zeros."""
    rng = rng_for("specials", shape, key)
    a = (rng.integers(-3, 4, shape) / 2.0).astype(np.float32)
    flat = a.reshape(-1)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.0, -0.0], np.float32)
    pick = rng.random(flat.size) < 0.3
    flat[pick] = specials[rng.integers(0, len(specials), int(pick.sum()))]
    if flat.size:
        flat.view(np.uint32)[rng.integers(0, flat.size)] = 0xFFC01234
    return a


@pytest.mark.parametrize("bits", ["host", 256], ids=["host", "avx2"])
def test_sorted_values_and_ids_around_the_vector_width_and_long_rows(monkeypatch, bits):
    """Row lengths 0, 1, W-1, W, W+1, 1000, 1024, 4097 (W composites per vector): ids equal the
    stable argsort and the values are the input's bits at those ids (-0.0 stays -0.0 and keeps
    its place among the zeros, NaN bits survive), ascending and descending.  1000-long rows
    alternate between 32-byte aligned and unaligned output rows."""
    from lazycandle.codegen import jit
    if bits != "host":
        monkeypatch.setattr(jit, "vector_bits", lambda: bits)
    W = jit.vector_bits() // 64
    for n in sorted({0, 1, W - 1, W, W + 1, 1000, 1024, 4097}):
        a = _specials_row_data((3, n), f"{bits}-{n}")
        for asc in (True, False):
            v, i = lc.tensor(a).sort_last_dim(asc=asc)
            lc.realize(v, i)                        # one plan: the argsort kernel writes both
            exp = ref_argsort(a, asc)
            np.testing.assert_array_equal(i.numpy(), exp)
            same_bits(v.numpy(), np.take_along_axis(a, exp.astype(np.int64), -1))


@pytest.mark.parametrize("dt", [lc.f64, lc.i64, lc.f16], ids=["f64", "i64", "f16"])
def test_sort_long_rows_of_wide_and_narrow_keys(dt):
    a = sort_data(dt, (2, 300), "long")
    np.testing.assert_array_equal(lc.tensor(a).arg_sort_last_dim().numpy(), ref_argsort(a))


@pytest.mark.parametrize("bits", [128, 256], ids=["sse", "avx2"])
def test_sort_network_for_narrower_vector_registers(monkeypatch, bits):
    """The network's shape follows the host's vector width; check the widths of other hosts."""
    from lazycandle.codegen import jit
    monkeypatch.setattr(jit, "vector_bits", lambda: bits)
    lc.clear_caches()       # plans bind sizes: one cached at another width would be reused
    for n in (3, 5, 16, 17, 100, 300):
        a = sort_data(lc.f32, (5 + bits // 128, n), "narrow", bits)     # shapes no other test compiles
        ids = lc.tensor(a).arg_sort_last_dim(asc=n % 2 == 0)
        assert f"vectors of {min(bits // 64, 1 << (n - 1).bit_length())}" in lc.dump(ids, stage="schedule")
        np.testing.assert_array_equal(ids.numpy(), ref_argsort(a, n % 2 == 0))


def test_nan_sorts_last_ascending_and_first_descending():
    a = np.array([[1.0, np.nan, -np.inf, 0.0, -0.0, np.nan, np.inf, -1.0]], np.float32)
    v, i = lc.tensor(a).sort_last_dim()
    assert i.to_list() == [[2, 7, 3, 4, 0, 6, 1, 5]]
    v, i = lc.tensor(a).sort_last_dim(asc=False)
    assert i.to_list() == [[1, 5, 6, 0, 3, 4, 7, 2]]
    assert np.isnan(v.numpy()[0, :2]).all()


def test_equal_values_keep_input_order():
    a = np.array([[2, 1, 2, 1, 2, 1]], np.int32)
    assert lc.tensor(a).arg_sort_last_dim().to_list() == [[1, 3, 5, 0, 2, 4]]
    assert lc.tensor(a).arg_sort_last_dim(asc=False).to_list() == [[0, 2, 4, 1, 3, 5]]


@pytest.mark.parametrize("kind", LAYOUTS)
def test_sort_reads_any_layout(kind):
    rng = rng_for("layout", kind)
    t, a = make_input(kind, (4, 5, 19), lc.f32, rng)
    np.testing.assert_array_equal(t.arg_sort_last_dim().numpy(), ref_argsort(a))
    v, _ = t.sort_last_dim(asc=False)
    same_bits(v.numpy(), np.take_along_axis(a, ref_argsort(a, False).astype(np.int64), -1))


def test_sort_of_a_lazy_expression_and_its_use_downstream():
    a = sort_data(lc.f32, (5, 12), "lazy")
    a = np.nan_to_num(a, nan=0.5, posinf=9.0, neginf=-9.0)
    t = lc.tensor(a)
    v, i = (t * 2 + 1).sort_last_dim()
    exp = np.sort(a * 2 + 1, axis=-1)
    np.testing.assert_array_equal(v.numpy(), exp)
    np.testing.assert_allclose(v.sum(1).numpy(), exp.sum(1), rtol=1e-6)
    np.testing.assert_array_equal(t.gather(i, 1).numpy(), np.take_along_axis(a, i.numpy().astype(np.int64), 1))


def test_sort_values_come_from_the_argsort_kernel_or_from_ids_realized_earlier():
    a = sort_data(lc.f16, (4, 21), "fused")
    exp_ids = ref_argsort(a)
    exp = np.take_along_axis(a, exp_ids.astype(np.int64), -1)
    v, i = lc.tensor(a).sort_last_dim()
    assert "also writes the sorted values" in lc.dump(v, i, stage="schedule")
    same_bits(v.numpy(), exp)                       # values only: the ids stay inside the plan
    np.testing.assert_array_equal(i.numpy(), exp_ids)
    v, i = lc.tensor(a).sort_last_dim()
    i.realize()                                     # a later plan reads the realized ids
    same_bits(v.numpy(), exp)


def test_sort_of_rank_one_and_constant_tensors():
    a = np.array([3.0, -1.0, 2.0], np.float32)
    assert lc.tensor(a).arg_sort_last_dim().to_list() == [1, 2, 0]
    assert lc.full(5, (2, 3), lc.i32).arg_sort_last_dim().to_list() == [[0, 1, 2]] * 2


def test_sort_threads_give_identical_results():
    a = sort_data(lc.f32, (64, 257), "threads")
    with lc.num_threads(1):
        one = lc.tensor(a).arg_sort_last_dim().numpy()
    with lc.num_threads(2):
        two = lc.tensor(a).arg_sort_last_dim().numpy()
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, ref_argsort(a))


# ---- topk --------------------------------------------------------------------------------
@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("dt", [lc.f32, lc.bf16, lc.i64, lc.u8], ids=["f32", "bf16", "i64", "u8"])
def test_topk_like_torch_with_stable_ties(dt, dim, largest):
    a = sort_data(dt, (5, 7, 9), "topk", dim)
    k = 3
    moved = np.moveaxis(a, dim, -1)
    order = ref_argsort(moved, asc=not largest)[..., :k].astype(np.int64)
    exp_ids = np.moveaxis(order, -1, dim)
    v, i = lc.tensor(a).topk(k, dim=dim, largest=largest)
    assert i.dtype is lc.i64 and i.shape == exp_ids.shape
    np.testing.assert_array_equal(i.numpy(), exp_ids)
    same_bits(v.numpy(), np.take_along_axis(a, exp_ids, dim))


@pytest.mark.parametrize("k", [0, 9])
def test_topk_with_k_zero_or_the_whole_dim(k):
    a = sort_data(lc.f32, (4, 9), "k-edge")
    v, i = lc.tensor(a).topk(k)
    assert v.shape == (4, k) and i.shape == (4, k)
    np.testing.assert_array_equal(i.numpy(), ref_argsort(a, False)[:, :k])


@pytest.mark.parametrize("k", [10, -1])
def test_topk_k_out_of_range_raises_at_the_call(k):
    with pytest.raises(lc.NarrowInvalidArgs, match=r"topk.*k = .*size 9"):
        lc.zeros((4, 9)).topk(k)


def test_sort_errors_are_typed_and_raised_at_the_call():
    t = lc.zeros((3, 4))
    with pytest.raises(lc.DimOutOfRange):
        t.topk(1, dim=2)
    with pytest.raises(lc.DimOutOfRange):
        lc.tensor(1.0).arg_sort_last_dim()
    with pytest.raises(lc.DimOutOfRange):
        t.cumsum(-3)
    with pytest.raises(TypeError):
        t.topk(1.5)
    f4 = lc.tensor(np.zeros((2, 2), np.uint8).view(lc.f4.numpy))
    for call in (lambda: f4.arg_sort_last_dim(), lambda: f4.sort_last_dim(), lambda: f4.topk(1),
                 lambda: f4.cumsum(0)):
        with pytest.raises(lc.UnsupportedDTypeForOp, match="f4"):
            call()


# ---- cumsum ------------------------------------------------------------------------------
def cumsum_data(dt, shape, *key):
    rng = rng_for("cumsum", dt.name, shape, *key)
    if dt.is_int:
        info = np.iinfo(dt.numpy)
        return rng.integers(int(info.min) // 2, int(info.max) // 2, shape, dtype=np.int64).astype(dt.numpy) \
            if dt.is_signed else rng.integers(0, int(info.max), shape, dtype=np.uint64).astype(dt.numpy)
    return rng.standard_normal(shape).astype(np.float32).astype(dt.numpy)


@pytest.mark.parametrize("dt", INTS, ids=dt_ids(INTS))
def test_cumsum_of_integers_keeps_the_dtype_and_wraps(dt):
    a = cumsum_data(dt, (3, 50))
    got = lc.tensor(a).cumsum(1)
    assert got.dtype is dt
    np.testing.assert_array_equal(got.numpy(), np.cumsum(a, axis=1, dtype=a.dtype))


@pytest.mark.parametrize("dt", [lc.bf16, lc.f16, lc.f8e4m3], ids=["bf16", "f16", "f8e4m3"])
def test_cumsum_of_low_precision_accumulates_in_f32_and_rounds_each_output(dt):
    a = cumsum_data(dt, (4, 300))
    exp = np.cumsum(a.astype(np.float32), axis=1).astype(dt.numpy)
    same_bits(lc.tensor(a).cumsum(1).numpy(), exp)


@pytest.mark.parametrize("dt", [lc.f32, lc.f64], ids=["f32", "f64"])
def test_cumsum_of_f32_f64_within_reduction_tolerance_of_f64(dt):
    a = cumsum_data(dt, (3, 5000))
    ref = np.cumsum(a.astype(np.float64), axis=1)
    scale = np.cumsum(np.abs(a.astype(np.float64)), axis=1)
    got = lc.tensor(a).cumsum(-1).numpy()
    assert got.dtype == a.dtype
    rtol = 1e-5 if dt is lc.f32 else 1e-12
    assert np.all(np.abs(got - ref) <= rtol * scale + (1e-30 if dt is lc.f64 else 1e-6))


def test_cumsum_propagates_nan_and_inf_like_numpy():
    a = np.array([[1.0, np.inf, 2.0, -np.inf, 3.0], [1.0, np.nan, 2.0, 0.0, 1.0]], np.float32)
    np.testing.assert_array_equal(lc.tensor(a).cumsum(1).numpy(), np.cumsum(a, 1))


@pytest.mark.parametrize("kind", LAYOUTS)
@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cumsum_along_any_dim_of_any_layout(kind, dim):
    t, a = make_input(kind, (4, 3, 6), lc.i32, rng_for("cs", kind, dim))
    np.testing.assert_array_equal(t.cumsum(dim).numpy(), np.cumsum(a, axis=dim, dtype=np.int32))


@pytest.mark.parametrize("shape", [(0, 4), (4, 0), (1,), (5,)])
def test_cumsum_of_empty_and_short_tensors(shape):
    a = cumsum_data(lc.i64, shape)
    for d in range(len(shape)):
        np.testing.assert_array_equal(lc.tensor(a).cumsum(d).numpy(), np.cumsum(a, axis=d))


# ---- hypothesis ---------------------------------------------------------------------------
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dt=st.sampled_from(COMPUTE), kind=st.sampled_from(LAYOUTS),
       shape=st.lists(st.integers(1, 11), min_size=1, max_size=3).map(tuple), asc=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_sort_and_cumsum_hypothesis(dt, kind, shape, asc, seed):
    rng = np.random.default_rng(seed)
    t, a = make_input(kind, shape, dt, rng)
    np.testing.assert_array_equal(t.arg_sort_last_dim(asc).numpy(), ref_argsort(a, asc))
    dim = int(rng.integers(0, len(shape)))
    if dt.is_int:
        np.testing.assert_array_equal(t.cumsum(dim).numpy(), np.cumsum(a, axis=dim, dtype=a.dtype))
    elif dt in (lc.bf16, lc.f16, lc.f8e4m3):
        same_bits(t.cumsum(dim).numpy(), np.cumsum(a.astype(np.float32), axis=dim).astype(dt.numpy))
    else:
        ref = np.cumsum(a.astype(np.float64), axis=dim)
        np.testing.assert_allclose(t.cumsum(dim).numpy(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dt", [lc.f32, lc.f64, lc.f16, lc.bf16, lc.f8e4m3])
def test_cumsum_keeps_negative_zero_like_numpy(dt):
    """A running sum that has only seen -0 is -0 (the float scan starts from -0, the additive
    identity; a +0 start turned a leading -0 into +0)."""
    a = np.array([[-0.0, -0.0, 1.0], [-0.0, 2.0, -0.0]], np.float32).astype(dt.numpy)
    for d in (0, 1):
        got = lc.tensor(a, dtype=dt).cumsum(d).numpy()
        want = np.cumsum(a.astype(np.float32), axis=d).astype(dt.numpy)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
