"""Tensors mixed with NumPy values in operators (issue 8 items 7 and 9, SPEC "Mixing with NumPy
and Python"): arrays and NumPy scalars in either position stay lazy tensors, and == / != build
tensors."""
from __future__ import annotations

import operator

import ml_dtypes
import numpy as np
import pytest

import lazycandle as lc

A = np.array([[1.0, -2.0, 3.0], [0.5, 2.0, -4.0]], np.float32)
B = np.array([[2.0, 2.0, -1.0], [0.5, 3.0, 1.0]], np.float32)


# ---- item 7: == and != are tensors ---------------------------------------------------------
def test_eq_and_ne_with_a_scalar_return_u8_tensors():
    t = lc.tensor(np.array([1, 2, 3, 2], np.int64))
    for got, want in ((t == 2, [0, 1, 0, 1]), (t != 2, [1, 0, 1, 0]), (2 == t, [0, 1, 0, 1]),
                      (t > 2, [0, 0, 1, 0])):
        assert isinstance(got, lc.Tensor) and got.dtype is lc.u8
        assert got.numpy().tolist() == want


def test_eq_between_tensors_broadcasts_like_numpy():
    a, b = lc.tensor(A), lc.tensor(B[:1])
    np.testing.assert_array_equal((a == b).numpy(), (A == B[:1]).astype(np.uint8))
    np.testing.assert_array_equal((a != b).numpy(), (A != B[:1]).astype(np.uint8))
    with pytest.raises(lc.DTypeMismatchBinaryOp):
        a == lc.tensor(A.astype(np.float64))


def test_tensors_stay_hashable_by_identity():
    a, b = lc.tensor(A), lc.tensor(A)
    grads = {a: 1, b: 2}
    assert grads[a] == 1 and grads[b] == 2 and len({a, b, a}) == 2
    assert a in grads and hash(a) != hash(b)
    assert (a == None) is False and (a != "x") is True     # noqa: E711 - non-operands fall back to identity


# ---- item 9: NumPy values in operators ------------------------------------------------------
BINARY_OPERATORS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
                    "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
                    "eq": operator.eq, "ne": operator.ne}


def _kinds(values):
    """(tensor, feeds-or-None) for a realized, a lazy and a placeholder tensor holding `values`."""
    realized = lc.tensor(values).realize()
    lazy = lc.tensor(values) * 1.0
    ph = lc.placeholder("t", values.shape, lc.f32)
    return {"realized": (realized, None), "lazy": (lazy, None), "placeholder": (ph, {"t": values})}


def _value(y, feeds):
    assert isinstance(y, lc.Tensor), f"result is {type(y).__name__}, not lc.Tensor"
    assert y.is_lazy
    return y.numpy() if feeds is None else lc.compile([y])(**feeds)[0]


@pytest.mark.parametrize("kind", ["realized", "lazy", "placeholder"])
@pytest.mark.parametrize("op", sorted(BINARY_OPERATORS))
def test_ndarray_operand_in_either_position_gives_a_lazy_tensor(op, kind):
    f = BINARY_OPERATORS[op]
    t, feeds = _kinds(A)[kind]
    for got, want in ((f(t, B), f(A, B)), (f(B, t), f(B, A)), (f(t, B[0]), f(A, B[0])), (f(B[:, :1], t), f(B[:, :1], A))):
        want = want.astype(np.uint8) if want.dtype == np.bool_ else want
        np.testing.assert_array_equal(_value(got, feeds), want)


@pytest.mark.parametrize("kind", ["realized", "lazy", "placeholder"])
def test_ndarray_matmul_in_either_position_gives_a_lazy_tensor(kind):
    t, feeds = _kinds(A)[kind]
    np.testing.assert_allclose(_value(t @ B.T, feeds), A @ B.T, rtol=1e-6)
    np.testing.assert_allclose(_value(B.T @ t, feeds), B.T @ A, rtol=1e-6)
    np.testing.assert_allclose(_value(np.stack([B.T, B.T]) @ t, feeds), np.stack([B.T, B.T]) @ A, rtol=1e-6)


SCALARS = {"np_bool": np.bool_(True), "np_f64": np.float64(2.5), "np_f32": np.float32(-1.5), "np_i64": np.int64(3),
           "np_u8": np.uint8(7), "zero_d_f64": np.array(2.0), "zero_d_i32": np.array(3, np.int32),
           "zero_d_bool": np.array(False), "np_bf16": ml_dtypes.bfloat16(0.5)}


@pytest.mark.parametrize("kind", ["realized", "lazy", "placeholder"])
@pytest.mark.parametrize("name", sorted(SCALARS))
def test_numpy_scalars_and_0d_arrays_act_like_python_scalars_of_the_tensors_dtype(name, kind):
    s = SCALARS[name]
    t, feeds = _kinds(A)[kind]
    py = float(s)
    for got, want in ((t + s, A + np.float32(py)), (s + t, np.float32(py) + A), (t * s, A * np.float32(py)),
                      (s - t, np.float32(py) - A), (t < s, (A < np.float32(py)).astype(np.uint8)),
                      (s == t, (A == np.float32(py)).astype(np.uint8))):
        v = _value(got, feeds)
        assert v.dtype == want.dtype        # no promotion: an f32 tensor stays f32
        np.testing.assert_array_equal(v, want)


def test_numpy_scalar_with_an_integer_tensor_truncates_like_a_python_float():
    t = lc.tensor(np.array([1, 2, 3], np.int32))
    assert (t + np.array(2.7)).numpy().tolist() == [3, 4, 5]
    assert (t * np.float64(-1.9)).numpy().tolist() == [-1, -2, -3]
    assert (t + np.bool_(True)).dtype is lc.i32


def test_ndarray_of_another_dtype_is_a_dtype_mismatch_not_a_promotion():
    t = lc.tensor(A)
    with pytest.raises(lc.DTypeMismatchBinaryOp):
        t + A.astype(np.float64)
    with pytest.raises(lc.DTypeMismatchBinaryOp):
        A.astype(np.float64) + t
    with pytest.raises(lc.UnsupportedDType):
        t + A.astype(np.complex64)
    with pytest.raises(TypeError):
        t + np.complex128(1j)


def test_powf_and_where_cond_take_numpy_scalars_and_arrays():
    t = lc.tensor(A)
    np.testing.assert_allclose((t ** np.array(2.0)).numpy(), A ** 2, rtol=1e-6)
    mask = lc.tensor(A > 0)
    np.testing.assert_array_equal(mask.where_cond(B, np.float32(0)).numpy(), np.where(A > 0, B, 0))
