"""Tensors mixed with NumPy and Python (issue 8 items 7, 8, 9 and SPEC "Mixing with NumPy and
Python"): operators with arrays and NumPy scalars in either position stay lazy tensors, == and
!= build tensors, arrays never alias a tensor writably, DLPack, str / format, Python scalars
and pickling of tensors and programs."""
from __future__ import annotations

import operator
import pickle

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


# ---- item 8: arrays never alias a tensor writably -----------------------------------------
def test_numpy_is_a_read_only_view_that_cannot_be_made_writable():
    t = lc.tensor(A)
    u = t.numpy()
    assert not u.flags.writeable
    with pytest.raises(ValueError):
        u[0, 0] = 99.0
    with pytest.raises(ValueError):
        u.flags.writeable = True
    with pytest.raises(ValueError):
        np.asarray(t).setflags(write=True)
    np.testing.assert_array_equal(t.numpy(), A)


def test_np_array_copies_and_asarray_does_not_expose_the_buffer_writably():
    t = lc.tensor(A)
    for c in (np.array(t), np.array(t, copy=True), t.__array__(copy=True)):
        assert c.flags.writeable
        c[0, 0] = 99.0
    assert not np.asarray(t).flags.writeable
    np.testing.assert_array_equal(t.numpy(), A)
    d = np.asarray(t, dtype=np.float64)
    assert d.dtype == np.float64
    np.testing.assert_array_equal(d, A)
    with pytest.raises(ValueError):
        np.array(t, dtype=np.float64, copy=False)
    assert not np.array(t, copy=False).flags.writeable


def test_program_constants_cannot_be_changed_through_arrays():
    arr = A.copy()
    c = lc.tensor(arr)
    arr[0, 0] = 100.0                          # lc.tensor copied: later edits do not leak in
    x = lc.placeholder("x", A.shape)
    prog = lc.compile([x + c])
    lazy = c * 2.0
    for a in (c.numpy(), np.asarray(c)):
        with pytest.raises(ValueError):
            a[...] = 7.0
    w = np.array(c)
    w[...] = 7.0
    np.testing.assert_array_equal(prog(x=B)[0], B + A)
    np.testing.assert_array_equal(lazy.numpy(), A * 2.0)


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
    col = B[:, :1]
    for got, want in ((f(t, B), f(A, B)), (f(B, t), f(B, A)), (f(t, B[0]), f(A, B[0])), (f(col, t), f(col, A))):
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


# ---- DLPack -----------------------------------------------------------------------------------
def test_np_from_dlpack_is_a_zero_copy_read_only_view():
    t = lc.tensor(A) + 1.0
    d = np.from_dlpack(t)
    np.testing.assert_array_equal(d, A + 1.0)
    assert not d.flags.writeable
    assert d.ctypes.data == t.numpy().ctypes.data
    assert t.__dlpack_device__() == (1, 0)


def test_dlpack_consumer_without_version_gets_a_copy():
    t = lc.tensor(A)
    cap = t.__dlpack__()              # a pre-1.0 consumer cannot be told "read-only"
    assert cap is not None
    with pytest.raises(BufferError):
        t.__dlpack__(copy=False)


@pytest.mark.parametrize("src", ["f32", "i64", "u8", "bool", "transposed", "empty"])
def test_lc_from_dlpack(src):
    arrs = {"f32": A, "i64": np.arange(6).reshape(2, 3), "u8": np.arange(5, dtype=np.uint8),
            "bool": A > 0, "transposed": A.T, "empty": np.zeros((0, 3), np.float32)}
    a = arrs[src]
    t = lc.from_dlpack(a)
    assert isinstance(t, lc.Tensor) and t.shape == a.shape
    want = a.astype(np.uint8) if a.dtype == np.bool_ else a
    np.testing.assert_array_equal(t.numpy(), want)
    np.testing.assert_array_equal((t + t).numpy(), want + want)
    if src == "f32":
        assert t.numpy().ctypes.data == a.ctypes.data         # zero-copy
    assert lc.from_dlpack(t) is t
    np.testing.assert_array_equal(lc.from_dlpack(lc.tensor(A)).numpy(), A)


# ---- str / format / Python scalars ---------------------------------------------------------
def test_str_shows_values_with_a_shape_and_dtype_line_and_repr_stays_metadata():
    t = lc.tensor(A) * 2.0
    text = str(t)
    assert text.splitlines()[-1] == "Tensor[shape=(2, 3), dtype=f32]"
    assert np.array2string(A * 2.0) in text
    assert "lazy" not in text
    assert repr(lc.tensor(A) * 2.0).startswith("Tensor[lazy")
    assert "[0 1 2]" in str(lc.arange(0, 3))
    assert str(lc.tensor(np.float32(1.5))).startswith("1.5")


def test_str_summarises_large_tensors_and_works_on_storage_only_dtypes():
    text = str(lc.zeros((200, 300)))
    assert "..." in text and len(text) < 2000 and text.endswith("Tensor[shape=(200, 300), dtype=f32]")
    assert "dtype=f4" in str(lc.ones((2,), lc.f4))
    ph = lc.placeholder("x", (2,))
    assert str(ph + 1.0) == repr(ph + 1.0)          # nothing to show before it is bound


def test_str_of_a_huge_lazy_view_computes_only_the_shown_elements():
    body = str(lc.zeros((10 ** 6, 10 ** 6))).split("\nTensor[")[0]       # 4 TB if computed in full
    assert body == np.array2string(np.broadcast_to(np.float32(0), (10 ** 6, 10 ** 6)))
    a = np.arange(5000, dtype=np.float32) / 3
    t = lc.tensor(a).broadcast_as((10 ** 5, 5000))
    assert str(t).split("\nTensor[")[0] == np.array2string(np.broadcast_to(a, (10 ** 5, 5000)))
    b = np.arange(7 ** 4, dtype=np.int64).reshape(7, 7, 7, 7)
    v = lc.tensor(b).t()[:, 1:]
    assert str(v).split("\nTensor[")[0] == np.array2string(b.swapaxes(-1, -2)[:, 1:])


def test_format_of_one_element_tensors():
    t = lc.tensor(np.array([3.14159], np.float32))
    assert format(t, ".3f") == "3.142" and f"{t.sum_all():.2f}" == "3.14"
    assert f"{lc.tensor(np.int64(42)):5d}" == "   42"
    assert format(lc.tensor(A), "") == str(lc.tensor(A))
    assert f"{lc.tensor(np.float32(0.5)).to_dtype(lc.bf16):.1f}" == "0.5"
    with pytest.raises(lc.ShapeMismatch):
        format(lc.tensor(A), ".3f")
    with pytest.raises(TypeError):
        format(lc.tensor(A), ".3f")


def test_float_int_bool_of_one_element_tensors():
    t = lc.tensor(np.array([[2.75]], np.float32))
    assert float(t) == 2.75 and int(t) == 2 and bool(t) is True
    assert isinstance(float(lc.tensor(np.float32(1)).to_dtype(lc.bf16)), float)
    assert bool(lc.tensor(np.uint8(0))) is False and int(lc.tensor(np.int64(-3))) == -3
    assert isinstance(lc.tensor(np.float32(1.5)).item(), float)
    assert isinstance(lc.tensor(np.uint32(7)).item(), int)
    for f in (float, int, bool, lambda x: x.item()):
        with pytest.raises(lc.ShapeMismatch):
            f(lc.tensor(A))
        with pytest.raises(lc.ShapeMismatch):
            f(lc.zeros((0,)))


# ---- pickling --------------------------------------------------------------------------------
PICKLE_DTYPES = [lc.u8, lc.u32, lc.i16, lc.i32, lc.i64, lc.bf16, lc.f16, lc.f32, lc.f64, lc.f8e4m3,
                 lc.f6e2m3, lc.f6e3m2, lc.f4, lc.f8e8m0]


@pytest.mark.parametrize("dt", PICKLE_DTYPES, ids=[d.name for d in PICKLE_DTYPES])
def test_tensor_pickle_round_trip_keeps_bits_dtype_and_shape(dt):
    a = (np.arange(12, dtype=np.float32).reshape(3, 4) / 4).astype(dt.numpy)
    t = lc.tensor(a)
    for x, want in ((t, a), (t.t(), a.T), (t[1:, ::2], a[1:, ::2]), (t[0, 1], a[0, 1]),
                    (t.narrow(0, 0, 0), a[:0])):
        y = pickle.loads(pickle.dumps(x))
        assert y.dtype is dt and y.shape == want.shape and not y.is_lazy
        assert y.numpy().dtype == want.dtype and y.numpy().tobytes() == np.ascontiguousarray(want).tobytes()


def test_lazy_tensor_is_realized_when_pickled():
    t = (lc.tensor(A) * 3.0).exp()
    y = pickle.loads(pickle.dumps(t))
    np.testing.assert_array_equal(y.numpy(), t.numpy())
    assert not t.is_lazy


def test_bf16_nan_payload_survives_pickling():
    bits = np.array([0x7F81, 0xFFC1, 0x0001, 0x8000], np.uint16)
    t = lc.tensor(bits.view(ml_dtypes.bfloat16))
    assert pickle.loads(pickle.dumps(t)).numpy().view(np.uint16).tolist() == bits.tolist()


def test_program_pickle_round_trip_runs_with_the_same_feeds(compiled_counter):
    x = lc.placeholder("x", (4, 3))
    w = lc.placeholder("w", (3, 5))
    c = lc.tensor(np.linspace(-1, 1, 5, dtype=np.float32))
    ids = lc.tensor(np.array([2, 0], np.int64))
    y = lc.nn.softmax_last_dim((x @ w).relu() + c)
    z = x.t().index_select(ids, 0).sum(1).to_dtype(lc.f64)
    prog = lc.compile([y, z, x[1:3]])
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((4, 3)).astype(np.float32), "w": rng.standard_normal((3, 5)).astype(np.float32)}
    want = prog(**feeds)
    before = compiled_counter()
    again = pickle.loads(pickle.dumps(prog))
    assert compiled_counter() == before            # same graph structure: the kernel cache answers
    assert again.inputs == prog.inputs
    for g, e in zip(again(**feeds), want):
        assert g.dtype == e.dtype
        np.testing.assert_array_equal(g, e)
