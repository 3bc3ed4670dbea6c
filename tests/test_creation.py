"""Creating tensors, their metadata, and realizing them."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lazycandle as lc
from conftest import ALL_DTYPES, COMPUTE, FLOATS, STORAGE_ONLY, assert_same, ids


# ---- lc.tensor ----------------------------------------------------------------------------
@pytest.mark.parametrize("dt", ALL_DTYPES, ids=ids(ALL_DTYPES))
def test_tensor_from_array_infers_dtype(dt):
    a = np.array([[0.5, 1, 2], [3, 4, 6]], np.float32).astype(dt.numpy)
    t = lc.tensor(a)
    assert t.dtype is dt
    assert t.shape == (2, 3)
    assert_same(t.numpy(), a, "tensor(array)", bits=True)


def test_tensor_copies_its_input():
    a = np.arange(6, dtype=np.float32)
    t = lc.tensor(a)
    a[0] = 100.0
    assert t.numpy()[0] == 0.0
    t2 = lc.Tensor.from_numpy(a)
    a[1] = 200.0
    assert t2.numpy()[1] == 1.0


def test_tensor_from_non_contiguous_array():
    a = np.arange(24, dtype=np.float64).reshape(4, 6)[::2, 1::2].T
    t = lc.tensor(a)
    assert t.shape == a.shape
    assert_same(t.numpy(), np.ascontiguousarray(a))


@pytest.mark.parametrize("data,dt,expected", [
    (1.5, lc.f32, np.float32(1.5)),
    (3, lc.i64, np.int64(3)),
    (True, lc.u8, np.uint8(1)),
    ([1.0, 2.5], lc.f32, np.array([1.0, 2.5], np.float32)),
    ([[1, 2], [3, -4]], lc.i64, np.array([[1, 2], [3, -4]], np.int64)),
    ([True, False, True], lc.u8, np.array([1, 0, 1], np.uint8)),
    ([1, 2.5], lc.f32, np.array([1, 2.5], np.float32)),
    (np.array([True, False]), lc.u8, np.array([1, 0], np.uint8)),
    (np.array([1.5, 2.0]), lc.f64, np.array([1.5, 2.0])),
    (np.array([1, 2], np.int32), lc.i32, np.array([1, 2], np.int32)),
    (np.array([1, 2], np.int16), lc.i16, np.array([1, 2], np.int16)),
    (np.array([1, 2], np.uint32), lc.u32, np.array([1, 2], np.uint32)),
    (np.array([1, 2], np.float16), lc.f16, np.array([1, 2], np.float16)),
], ids=lambda v: type(v).__name__ if not isinstance(v, lc.DType) else v.name)
def test_tensor_inference(data, dt, expected):
    t = lc.tensor(data)
    assert t.dtype is dt
    assert_same(t.numpy(), np.asarray(expected))


def test_scalar_is_rank0():
    t = lc.tensor(2.5)
    assert t.shape == () and t.rank == 0 and t.elem_count == 1
    assert t.item() == 2.5
    assert isinstance(t.item(), float)
    assert isinstance(lc.tensor(7).item(), int)


@pytest.mark.parametrize("dt", COMPUTE + STORAGE_ONLY, ids=ids(COMPUTE + STORAGE_ONLY))
def test_tensor_with_dtype(dt):
    vals = [[0.0, 1.0], [2.0, 4.0]]
    t = lc.tensor(vals, dtype=dt)
    assert t.dtype is dt
    assert_same(t.numpy(), np.array(vals).astype(dt.numpy))


def test_tensor_dtype_by_name_and_numpy():
    assert lc.tensor([1, 2], dtype="f32").dtype is lc.f32
    assert lc.tensor([1, 2], dtype=np.float64).dtype is lc.f64
    assert lc.tensor(np.array([1.0, 2.0], np.float32), dtype=lc.bf16).dtype is lc.bf16


def test_tensor_float_list_to_int_dtype_truncates():
    t = lc.tensor([1.7, -2.7, 3.0], dtype=lc.i32)
    assert_same(t.numpy(), np.array([1, -2, 3], np.int32))


@pytest.mark.parametrize("bad", [
    np.array([1 + 2j]), np.array([1 + 2j], np.complex64), np.array(["a", "b"]), np.array([object()]),
    1 + 2j, "abc", [1 + 1j, 2], ["x", "y"], [object()], np.array([1, 2], np.int8), np.array([1], np.uint64),
], ids=lambda v: f"{type(v).__name__}:{getattr(v, 'dtype', '')}")
def test_tensor_unsupported(bad):
    with pytest.raises(lc.UnsupportedDType):
        lc.tensor(bad)


def test_from_numpy_unsupported():
    with pytest.raises(lc.UnsupportedDType):
        lc.Tensor.from_numpy(np.array([1j]))


# ---- constructors -------------------------------------------------------------------------
@pytest.mark.parametrize("dt", ALL_DTYPES, ids=ids(ALL_DTYPES))
def test_zeros_ones(dt):
    z = lc.zeros((2, 3), dt)
    o = lc.ones((3,), dtype=dt)
    assert z.dtype is dt and z.shape == (2, 3)
    assert o.dtype is dt and o.shape == (3,)
    assert_same(z.numpy(), np.zeros((2, 3), np.float32).astype(dt.numpy))
    assert_same(o.numpy(), np.ones((3,), np.float32).astype(dt.numpy))


def test_zeros_default_dtype_and_int_shape():
    z = lc.zeros((4,))
    assert z.dtype is lc.f32
    assert lc.zeros(5).shape == (5,)
    assert lc.ones(()).shape == ()
    assert lc.ones(()).item() == 1.0
    assert lc.zeros((0, 3)).numpy().shape == (0, 3)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=ids(ALL_DTYPES))
def test_full(dt):
    t = lc.full(3, (2, 2), dt)
    assert t.dtype is dt
    assert_same(t.numpy(), np.full((2, 2), 3, np.float32).astype(dt.numpy))


def test_full_default_and_values():
    t = lc.full(2.5, (3,))
    assert t.dtype is lc.f32
    assert_same(t.numpy(), np.full(3, 2.5, np.float32))
    assert_same(lc.full(-7, (2,), lc.i32).numpy(), np.full(2, -7, np.int32))
    assert_same(lc.full(float("nan"), (2,), lc.f64).numpy(), np.full(2, np.nan))
    assert_same(lc.full(float("-inf"), (1,), lc.f16).numpy(), np.full(1, -np.inf, np.float16))


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=ids(ALL_DTYPES))
def test_zeros_like_ones_like(dt):
    base = lc.tensor(np.array([[1, 2, 3]], np.float32).astype(dt.numpy))
    z, o = lc.zeros_like(base), lc.ones_like(base)
    assert z.dtype is dt and o.dtype is dt and z.shape == (1, 3) and o.shape == (1, 3)
    assert_same(z.numpy(), np.zeros((1, 3), np.float32).astype(dt.numpy))
    assert_same(o.numpy(), np.ones((1, 3), np.float32).astype(dt.numpy))


def test_zeros_like_of_lazy_view_stays_lazy():
    base = lc.tensor(np.ones((3, 4), np.float32))
    v = (base * 2).t()
    z = lc.zeros_like(v)
    assert z.shape == (4, 3)
    assert v.is_lazy
    assert_same(z.numpy(), np.zeros((4, 3), np.float32))


@pytest.mark.parametrize("args,kw,expected", [
    ((0, 5), {}, np.arange(0, 5)),
    ((2, 11, 3), {}, np.arange(2, 11, 3)),
    ((5, 0, -2), {}, np.arange(5, 0, -2)),
    ((-3, 3), {"dtype": lc.i32}, np.arange(-3, 3, dtype=np.int32)),
    ((0, 1, 0.25), {"dtype": lc.f32}, np.arange(0, 1, 0.25, dtype=np.float32)),
    ((0.0, 2.0, 0.5), {"dtype": lc.f64}, np.arange(0.0, 2.0, 0.5)),
    ((0, 4), {"dtype": lc.bf16}, np.arange(0, 4).astype(ml_dtypes.bfloat16)),
    ((3, 3), {}, np.arange(3, 3)),
])
def test_arange(args, kw, expected):
    t = lc.arange(*args, **kw)
    assert t.dtype is kw.get("dtype", lc.i64)
    assert_same(t.numpy(), expected)


def test_arange_step_keyword():
    assert_same(lc.arange(0, 10, step=4).numpy(), np.array([0, 4, 8], np.int64))


@pytest.mark.parametrize("dt", FLOATS, ids=ids(FLOATS))
def test_randn_rand(dt):
    n = 4000
    r = lc.randn(1.0, 2.0, (n,), dtype=dt, seed=7)
    u = lc.rand(-1.0, 3.0, (40, 100), dtype=dt, seed=3)
    assert r.dtype is dt and r.shape == (n,)
    assert u.dtype is dt and u.shape == (40, 100)
    rn = r.numpy().astype(np.float64)
    un = u.numpy().astype(np.float64)
    assert np.isfinite(rn).all()
    if dt is not lc.f8e4m3:
        assert abs(rn.mean() - 1.0) < 0.2 and abs(rn.std() - 2.0) < 0.2
        assert abs(un.mean() - 1.0) < 0.15
    assert un.min() >= -1.0 and un.max() <= 3.0
    assert len(np.unique(un)) > 5


def test_rand_seed_is_deterministic():
    a = lc.rand(0.0, 1.0, (100,), seed=123).numpy()
    b = lc.rand(0.0, 1.0, (100,), seed=123).numpy()
    c = lc.rand(0.0, 1.0, (100,), seed=124).numpy()
    assert_same(a, b)
    assert not np.array_equal(a, c)
    assert_same(lc.randn(0.0, 1.0, (5, 5), seed=9).numpy(), lc.randn(0.0, 1.0, (5, 5), seed=9).numpy())


def test_randn_default_dtype():
    assert lc.randn(0.0, 1.0, (3,)).dtype is lc.f32
    assert lc.rand(0.0, 1.0, (3,)).dtype is lc.f32


# ---- metadata -----------------------------------------------------------------------------
def _assert_meta(t, shape, dt):
    assert t.shape == shape and isinstance(t.shape, tuple)
    assert all(type(d) is int for d in t.shape)
    assert t.dims == shape
    assert t.rank == len(shape) and t.ndim == len(shape)
    assert t.dtype is dt
    assert t.elem_count == int(np.prod(shape, dtype=np.int64))
    assert t.device == lc.cpu


def test_metadata_never_realizes(compiled_counter):
    a = lc.tensor(np.ones((3, 4), np.float32))
    y = (a * 2.0 + 1.0).exp()
    x = y[1:, None, ::2].t()
    before = compiled_counter()
    _assert_meta(x, (2, 2, 1), lc.f32)
    _assert_meta(y, (3, 4), lc.f32)
    r = repr(x)
    assert "lazy" in r.lower() and "f32" in r
    assert x.is_lazy and y.is_lazy
    assert compiled_counter() == before
    assert_same(x.numpy(), np.exp(np.full((2, 2, 1), 3.0, np.float32)))
    assert not x.is_lazy


def test_metadata_values():
    a = lc.tensor(np.zeros((2, 3, 5), np.float32))
    _assert_meta(a, (2, 3, 5), lc.f32)
    _assert_meta(a.t(), (2, 5, 3), lc.f32)
    _assert_meta(a[0], (3, 5), lc.f32)
    _assert_meta(lc.tensor(3), (), lc.i64)
    _assert_meta(lc.zeros((0, 4), lc.u8), (0, 4), lc.u8)
    _assert_meta(a.lt(a), (2, 3, 5), lc.u8)


def test_repr_shows_state_shape_dtype():
    t = lc.tensor(np.ones((2, 3), np.float64)) + 1.0
    r = repr(t)
    assert t.is_lazy
    assert "lazy" in r.lower()
    assert "f64" in r
    assert "2" in r and "3" in r
    t.realize()
    r2 = repr(t)
    assert "realized" in r2.lower()
    assert not t.is_lazy


def test_repr_never_computes(compiled_counter):
    a = lc.tensor(np.ones(9, np.float32))
    y = (a.sin() * 3.0 - a).sqrt()
    before = compiled_counter()
    for _ in range(3):
        repr(y)      # str(y) shows values, so it realizes (SPEC "Mixing with NumPy and Python")
    assert y.is_lazy
    assert compiled_counter() == before


# ---- realizing ----------------------------------------------------------------------------
def test_numpy_to_list_item():
    a = np.array([[1.5, 2.0], [-3.0, 4.25]], np.float32)
    t = lc.tensor(a) * 2.0
    out = t.numpy()
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == (2, 2)
    assert_same(out, a * 2)
    assert t.to_list() == (a * 2).tolist()
    assert (lc.tensor(a)[1, 1] + 1.0).item() == 5.25
    assert lc.tensor([7], dtype=lc.i32).item() == 7
    with pytest.raises(Exception):
        t.item()


@pytest.mark.parametrize("dt", COMPUTE, ids=ids(COMPUTE))
def test_item_and_to_list_types(dt):
    t = lc.tensor(np.array([[2]], np.float32).astype(dt.numpy))
    v = t.item()
    assert v == 2
    assert t.to_list() == [[2]]


def test_realize_returns_self_and_holds_data():
    a = lc.tensor(np.arange(5, dtype=np.float32))
    y = a * a
    assert y.is_lazy
    r = y.realize()
    assert r is y
    assert not y.is_lazy
    assert_same(y.numpy(), np.arange(5, dtype=np.float32) ** 2)
    # realizing again is a no-op
    assert y.realize() is y


def test_lc_realize_several():
    a = lc.tensor(np.arange(6, dtype=np.float32))
    x = a * 2.0
    y = x + 1.0
    z = x.neg()
    out = lc.realize(x, y, z)
    assert len(out) == 3 and out[0] is x and out[1] is y and out[2] is z
    for t in (x, y, z):
        assert not t.is_lazy
    base = np.arange(6, dtype=np.float32)
    assert_same(x.numpy(), base * 2)
    assert_same(y.numpy(), base * 2 + 1)
    assert_same(z.numpy(), -(base * 2))


def test_lc_realize_mixed_realized_and_views():
    a = lc.tensor(np.arange(12, dtype=np.int32).reshape(3, 4))
    y = a * 3
    v = y.t()
    lc.realize(a, v, y)
    assert_same(v.numpy(), (np.arange(12, dtype=np.int32).reshape(3, 4) * 3).T)


def test_numpy_of_realized_source_is_stable():
    a = np.arange(4, dtype=np.float32)
    t = lc.tensor(a)
    assert_same(t.numpy(), a)
    assert_same(t.numpy(), a)


@pytest.mark.parametrize("dt", STORAGE_ONLY, ids=ids(STORAGE_ONLY))
def test_storage_only_creation_and_numpy(dt):
    a = np.array([[0.5, 1, 2], [4, 1, 0.5]], np.float32).astype(dt.numpy)
    t = lc.tensor(a)
    assert t.dtype is dt
    assert_same(t.numpy(), a, bits=True)
    r = lc.rand(0.5, 4.0, (3, 3), dtype=dt, seed=1)
    assert r.dtype is dt and r.numpy().dtype == dt.numpy
