"""Bad input to the public API (issue 8, items 2, 10, 12, 13): every shape, size, dim and index
goes through one check (layout.as_index / as_shape), so negative sizes, floats, bools and
strings get a typed error at the call, never a tensor that later writes out of bounds."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import lazycandle as lc


def f32(*shape):
    return lc.tensor(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape))


# ---- item 2: negative sizes ----------------------------------------------------------------
NEGATIVE_SIZE_CALLS = {
    "broadcast_as": (lambda: lc.ones((1, 3)).broadcast_as((-4, 3)), lc.BroadcastIncompatibleShapes),
    "expand": (lambda: lc.ones((1, 3)).expand((-4, 3)), lc.BroadcastIncompatibleShapes),
    "broadcast_left": (lambda: lc.ones((1, 3)).broadcast_left((-2,)), lc.BroadcastIncompatibleShapes),
    "broadcast_left_int": (lambda: lc.ones((1, 3)).broadcast_left(-2), lc.BroadcastIncompatibleShapes),
    "reshape_two_negatives": (lambda: f32(6).reshape((-2, -3)), lc.ShapeMismatch),
    "reshape_minus_two": (lambda: f32(6).reshape((-2, 3)), lc.ShapeMismatch),
    "reshape_two_minus_ones": (lambda: f32(6).reshape((-1, -1)), lc.ShapeMismatch),
    "reshape_minus_one_with_zero": (lambda: f32(6).reshape((-1, 0)), lc.ShapeMismatch),
    "zeros": (lambda: lc.zeros((-1,)), lc.ShapeMismatch),
    "ones": (lambda: lc.ones((2, -3)), lc.ShapeMismatch),
    "full": (lambda: lc.full(1.0, (3, -1)), lc.ShapeMismatch),
    "full_storage_only": (lambda: lc.full(1.0, (-3,), lc.f4), lc.ShapeMismatch),
    "randn": (lambda: lc.randn(0.0, 1.0, (-2,)), lc.ShapeMismatch),
    "rand": (lambda: lc.rand(0.0, 1.0, -2), lc.ShapeMismatch),
    "placeholder": (lambda: lc.placeholder("x", (-1, 2)), lc.ShapeMismatch),
    "narrow_length": (lambda: f32(4).narrow(0, 1, -1), lc.NarrowInvalidArgs),
    "narrow_start": (lambda: f32(4).narrow(0, -1, 2), lc.NarrowInvalidArgs),
    "pad_with_zeros": (lambda: f32(4).pad_with_zeros(0, -1, 0), lc.NarrowInvalidArgs),
    "pad_with_same": (lambda: f32(4).pad_with_same(0, 0, -2), lc.NarrowInvalidArgs),
    "chunk": (lambda: f32(4).chunk(-1, 0), lc.ShapeMismatch),
    "upsample": (lambda: f32(1, 1, 4).upsample_nearest1d(-3), lc.ShapeMismatch),
}


@pytest.mark.parametrize("name", sorted(NEGATIVE_SIZE_CALLS))
def test_negative_size_raises_typed_error_at_the_call(name):
    call, err = NEGATIVE_SIZE_CALLS[name]
    with pytest.raises(err):
        call()


def test_negative_broadcast_cannot_reach_index_add_or_cat():
    # issue 8's repro: these used to segfault / write before the buffer
    with pytest.raises(lc.BroadcastIncompatibleShapes):
        neg = lc.ones((1, 3)).broadcast_as((-4, 3))
        neg.index_add(lc.tensor([10 ** 6]), lc.ones((1, 3)), 0).numpy()
    with pytest.raises(lc.BroadcastIncompatibleShapes):
        lc.cat([lc.ones((1, 3)).broadcast_as((-4, 3)), lc.ones((8, 3))], 0).numpy()


def test_zero_sizes_stay_valid():
    assert lc.zeros((0, 3)).numpy().shape == (0, 3)
    assert lc.ones((1, 3)).broadcast_as((0, 3)).numpy().shape == (0, 3)
    np.testing.assert_array_equal(lc.cat([lc.zeros((0, 3)), f32(2, 3)], 0).numpy(), f32(2, 3).numpy())


# ---- item 10: argmax indices are u32 ---------------------------------------------------------
@pytest.mark.parametrize("op", ["argmax", "argmin", "argmax_keepdim", "argmin_keepdim"])
def test_arg_reduction_over_a_dim_longer_than_u32_raises_at_the_call(op):
    long = lc.zeros((1, 1)).broadcast_as((2, 2 ** 32))     # a view: no memory is needed
    with pytest.raises(lc.ShapeMismatch, match="u32"):
        getattr(long, op)(1)
    ok = getattr(lc.zeros((1,)).broadcast_as((2 ** 32 - 1,)), op)(0)     # the longest dim that fits
    assert ok.dtype is lc.u32 and ok.is_lazy


# ---- item 12: dims, sizes and indices are ints -------------------------------------------
FLOAT_ARG_CALLS = {
    "sum_dim": lambda x: x.sum(1.5),
    "sum_dims": lambda x: x.sum((0, 1.0)),
    "max_dim": lambda x: x.max(1.0),
    "argmax_dim": lambda x: x.argmax(0.5),
    "narrow_start": lambda x: x.narrow(0, 0.5, 1),
    "narrow_length": lambda x: x.narrow(0, 0, 1.0),
    "narrow_dim": lambda x: x.narrow(0.0, 0, 1),
    "index_float": lambda x: x[1.5],
    "index_float_in_tuple": lambda x: x[0, 1.0],
    "index_str": lambda x: x["a"],
    "index_list_of_floats": lambda x: x[[0.5, 1]],     # a list of ints is ids (SPEC: t[ids])
    "zeros": lambda x: lc.zeros((2.5,)),
    "ones_int_float": lambda x: lc.ones(3.0),
    "full": lambda x: lc.full(1, (2, 2.0)),
    "placeholder": lambda x: lc.placeholder("p", (2.0,)),
    "reshape": lambda x: x.reshape((3.0, 4)),
    "broadcast_as": lambda x: x.broadcast_as((2, 3.0, 4)),
    "transpose": lambda x: x.transpose(0, 1.0),
    "permute": lambda x: x.permute((1.0, 0)),
    "unsqueeze": lambda x: x.unsqueeze(0.0),
    "squeeze": lambda x: x.squeeze(0.0),
    "chunk": lambda x: x.chunk(2.0, 0),
    "cat_dim": lambda x: lc.cat([x, x], 0.0),
    "pad": lambda x: x.pad_with_zeros(0, 1.0, 0),
    "index_select_dim": lambda x: x.index_select(lc.tensor([0]), 1.0),
    "set_num_threads": lambda x: lc.set_num_threads(2.5),
    "num_threads_scope": lambda x: lc.num_threads(2.5).__enter__(),
}


@pytest.mark.parametrize("name", sorted(FLOAT_ARG_CALLS))
def test_float_or_str_dim_size_or_index_raises_type_error(name):
    before = lc.get_num_threads()
    with pytest.raises(TypeError):
        FLOAT_ARG_CALLS[name](f32(3, 4))
    assert lc.get_num_threads() == before


BOOL_ARG_CALLS = {
    "sum": lambda x, b: x.sum(b),
    "max": lambda x, b: x.max(b),
    "narrow": lambda x, b: x.narrow(b, 0, 1),
    "index": lambda x, b: x[b],
    "transpose": lambda x, b: x.transpose(b, 0),
    "zeros": lambda x, b: lc.zeros((b, 2)),
    "set_num_threads": lambda x, b: lc.set_num_threads(b),
}


@pytest.mark.parametrize("b", [True, np.bool_(False)], ids=["bool", "np_bool"])
@pytest.mark.parametrize("name", sorted(BOOL_ARG_CALLS))
def test_bool_as_dim_or_size_raises_type_error(name, b):
    with pytest.raises(TypeError):
        BOOL_ARG_CALLS[name](f32(3, 4), b)


def test_numpy_integers_are_accepted_as_dims_sizes_and_indices():
    x = f32(3, 4)
    a = x.numpy()
    i = np.int64
    np.testing.assert_array_equal(x.sum(i(1)).numpy(), a.sum(1))
    np.testing.assert_array_equal(x.sum([np.int32(0), 1]).numpy(), a.sum((0, 1)))
    np.testing.assert_array_equal(x.narrow(i(1), np.uint8(1), i(2)).numpy(), a[:, 1:3])
    np.testing.assert_array_equal(x[i(2)].numpy(), a[2])
    np.testing.assert_array_equal(x[np.int16(-1), i(1)].numpy(), a[-1, 1])
    np.testing.assert_array_equal(x.reshape((i(2), np.int32(6))).numpy(), a.reshape(2, 6))
    np.testing.assert_array_equal(x.transpose(i(0), i(1)).numpy(), a.T)
    assert lc.zeros((i(2), np.uint32(3))).shape == (2, 3)
    assert lc.zeros(np.array([2, 3])).shape == (2, 3)
    assert x.argmax(np.int8(1)).numpy().tolist() == [3, 3, 3]
    old = lc.get_num_threads()
    try:
        lc.set_num_threads(np.int64(1))
        assert lc.get_num_threads() == 1
    finally:
        lc.set_num_threads(old)


# ---- item 13: other bad input --------------------------------------------------------------
def test_to_dtype_none_raises_unsupported_dtype():
    with pytest.raises(lc.UnsupportedDType):
        f32(2).to_dtype(None)
    with pytest.raises(lc.UnsupportedDType):
        lc.DType.from_numpy(None)
    with pytest.raises(lc.UnsupportedDType):
        lc.zeros((2,), None)


def test_string_index_raises_type_error():
    with pytest.raises(TypeError):
        f32(2, 2)["a"]
    with pytest.raises(TypeError):
        lc.tensor(np.float32(1))["a"]


@pytest.mark.parametrize("code", [">f4", ">f8", ">i2", ">i4", ">i8", ">u4", ">f2"])
def test_big_endian_arrays_are_byteswapped_to_native(code):
    a = np.array([[1, 2, 3], [-4 if code[1] != "u" else 4, 5, 6]], dtype=code)
    t = lc.tensor(a)
    assert t.dtype.numpy == a.dtype.newbyteorder("=")
    assert t.numpy().dtype.isnative
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal((t + t).numpy(), a + a)
    x = lc.placeholder("x", a.shape, t.dtype)
    prog = lc.compile([x + x])
    np.testing.assert_array_equal(prog(x=a)[0], a + a)


def test_rank0_reductions_take_only_dim_0_or_minus_1():
    s = lc.tensor(np.float32(3.5))
    for d in (0, -1, [0], (-1,)):
        assert s.sum(d).item() == 3.5 and s.sum(d).shape == ()
        assert s.sum_keepdim(d).shape == ()
    assert s.max(0).item() == 3.5 and s.argmax(-1).item() == 0
    for d in (7, 1, -2):
        with pytest.raises(lc.DimOutOfRange):
            s.sum(d)
        with pytest.raises(lc.DimOutOfRange):
            s.max(d)
        with pytest.raises(lc.DimOutOfRange):
            s.argmin(d)


@pytest.mark.parametrize("shape,dim", [((3, 0), -1), ((3, 0), 1), ((2, 0, 4), 1)])
def test_softmax_family_of_an_empty_dim_is_an_empty_result(shape, dim):
    x = lc.zeros(shape)
    for y in (lc.nn.softmax(x, dim), lc.nn.log_softmax(x, dim)):
        assert y.shape == shape and y.dtype is lc.f32
        assert y.numpy().shape == shape


def test_norms_of_empty_rows_are_empty():
    x = lc.zeros((3, 0))
    w = lc.zeros((0,))
    assert lc.nn.layer_norm(x, w, w, 1e-5).numpy().shape == (3, 0)
    assert lc.nn.rms_norm(x, w, 1e-5).numpy().shape == (3, 0)


def test_max_over_an_empty_dim_raises_even_into_an_empty_result():
    """SPEC, NumPy and torch: max/min/arg* over a zero-length dim raise, whatever the output."""
    for how in ("max", "min", "argmax", "argmin"):
        with pytest.raises(lc.EmptyReduction):
            getattr(lc.zeros((0, 0)), how)(1)
    assert lc.zeros((0, 4)).argmax_keepdim(1).numpy().shape == (0, 1)    # a non-empty dim is reduced
    with pytest.raises(lc.EmptyReduction):
        lc.zeros((4, 0)).max(1)
    with pytest.raises(lc.EmptyReduction):
        lc.zeros((0, 3)).argmin(0)


def test_iterating_a_rank0_tensor_raises_type_error():
    s = lc.tensor(np.float32(1))
    with pytest.raises(TypeError, match="0-d"):
        list(s)
    with pytest.raises(TypeError):
        iter(s)


def test_iterating_yields_rank_minus_one_tensors():
    a = np.arange(6, dtype=np.int32).reshape(3, 2)
    rows = list(lc.tensor(a))
    assert len(rows) == 3 and all(isinstance(r, lc.Tensor) and r.shape == (2,) for r in rows)
    for r, e in zip(rows, a):
        np.testing.assert_array_equal(r.numpy(), e)
    assert [x.item() for x in lc.tensor(a[:, 0])] == [0, 2, 4]
    assert list(lc.zeros((0, 2))) == []


def test_placeholder_pickles_as_a_placeholder():
    p = pickle.loads(pickle.dumps(lc.placeholder("x", (2, 3), lc.bf16)))
    assert p.shape == (2, 3) and p.dtype is lc.bf16
    with pytest.raises(lc.UnboundPlaceholder):
        p.numpy()
