"""lc.jit signatures (issue 8 item 15): bool inputs, keyword arguments, Python scalars,
NumPy scalars and static arguments; tensors are read in place."""
import math

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.graph_api import _feed_array


def _counting(fn):
    calls = []

    def traced(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)
    return traced, calls


def test_bool_array_inputs_are_accepted_as_u8_masks():
    f = lc.jit(lambda m, x: m.where_cond(x, -x))
    mask = np.array([True, False, True, False])
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(f(mask, x), np.where(mask, x, -x))
    np.testing.assert_array_equal(lc.jit(lambda m: m + m)(mask), mask.astype(np.uint8) * 2)


def test_compiled_program_takes_a_bool_feed_for_a_u8_placeholder():
    m = lc.placeholder("m", (3,), lc.u8)
    prog = lc.compile([m * 3])
    np.testing.assert_array_equal(prog(m=np.array([True, False, True]))[0], [3, 0, 3])


def test_keyword_arguments_are_part_of_the_signature():
    fn, calls = _counting(lambda x, *, scale, bias=None: x * scale + (0.0 if bias is None else bias))
    f = lc.jit(fn)
    x = np.arange(5, dtype=np.float32)
    b = np.ones(5, np.float32)
    np.testing.assert_allclose(f(x, scale=2.0), x * 2)
    np.testing.assert_allclose(f(x, scale=2.0, bias=b), x * 2 + 1)
    np.testing.assert_allclose(f(x, bias=b, scale=2.0), x * 2 + 1)       # keyword order does not matter
    np.testing.assert_allclose(f(x, scale=2.0, bias=b * 5), x * 2 + 5)   # new data, same signature
    assert len(calls) == 2


def test_python_float_argument_keeps_the_tensor_dtype():
    fn, calls = _counting(lambda x, s: x * s + s)
    f = lc.jit(fn)
    x = np.linspace(-1, 1, 7, dtype=np.float32)
    out = f(x, 0.5)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x * np.float32(0.5) + np.float32(0.5), rtol=1e-6)
    np.testing.assert_allclose(f(x, 0.5), out)
    assert len(calls) == 1
    np.testing.assert_allclose(f(x, 3.0), x * 3 + 3, rtol=1e-6)          # a new value is a new signature
    assert len(calls) == 2
    assert f(x.astype(np.float64), 0.5).dtype == np.float64
    assert f(np.arange(3, dtype=np.int32), 2).dtype == np.int32


def test_nan_static_float_is_one_signature():
    fn, calls = _counting(lambda x, s: x * s)
    f = lc.jit(fn)
    x = np.ones(3, np.float32)
    assert np.isnan(f(x, math.nan)).all() and np.isnan(f(x, math.nan)).all()
    assert len(calls) == 1


def test_signed_zero_static_floats_are_different_signatures():
    """-0.0 and 0.0 share one plan (scalars are runtime arguments), yet each call gets its own
    value: x * -0.0 is -0.0 and x + -0.0 keeps x's zeros' signs (value class of the add rewrite)."""
    f = lc.jit(lambda x, s: x * s)
    x = np.ones(3, np.float32)
    assert np.signbit(f(x, -0.0)).all() and not np.signbit(f(x, 0.0)).any()
    assert np.signbit(f(x, -0.0)).all()
    g = lc.jit(lambda x, s: x + s)
    z = np.zeros(3, np.float32)
    assert not np.signbit(g(z, -0.0)).any() and not np.signbit(g(z, 0.0)).any()
    assert np.signbit(g(-z, -0.0)).all() and not np.signbit(g(-z, 0.0)).any()


def test_numpy_scalar_argument_is_a_zero_d_input_of_its_dtype():
    fn, calls = _counting(lambda x, s: x * s)
    f = lc.jit(fn)
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(f(x, np.float32(2)), x * 2)
    np.testing.assert_allclose(f(x, np.float32(5)), x * 5)                # data, not signature
    assert len(calls) == 1


def test_static_tuple_and_none_arguments():
    f = lc.jit(lambda x, dims, keep: x.sum_keepdim(dims) if keep else x.sum(dims))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(f(x, (0,), False), x.sum(0))
    np.testing.assert_allclose(f(x, [1], True), x.sum(1, keepdims=True))
    g = lc.jit(lambda x, b=None: x if b is None else x + b)
    np.testing.assert_allclose(g(x, None), x)


def test_tensor_arguments_are_read_in_place():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = lc.tensor(arr)
    assert np.shares_memory(_feed_array(t, None), t.numpy())
    assert np.shares_memory(_feed_array(arr, None), arr)
    mask = np.array([True, False])
    assert np.shares_memory(_feed_array(mask, None), mask)
    f = lc.jit(lambda a, b: a @ b)
    lazy = lc.tensor(arr) * 2.0
    np.testing.assert_allclose(f(lazy, t.t()), (arr * 2) @ arr.T)


def test_unsupported_argument_and_result_types_raise_type_error():
    f = lc.jit(lambda x, opts: x)
    with pytest.raises(TypeError, match="argument a1"):
        f(np.ones(2, np.float32), {"a": 1})
    g = lc.jit(lambda x: 3)
    with pytest.raises(TypeError, match="must return"):
        g(np.ones(2, np.float32))


def test_several_outputs_and_an_output_that_is_an_input():
    f = lc.jit(lambda a, b: (a + b, a))
    a, b = np.ones(3, np.float32), np.arange(3, dtype=np.float32)
    s, same = f(a, b)
    np.testing.assert_array_equal(s, a + b)
    np.testing.assert_array_equal(same, a)


def test_decorator_forms_keep_the_function_name():
    @lc.jit
    def double(x):
        return x * 2.0

    @lc.jit(dynamic=True)
    def triple(x):
        return x * 3.0

    assert double.__name__ == "double" and triple.__name__ == "triple"
    np.testing.assert_array_equal(double(np.ones(2, np.float32)), [2, 2])
    np.testing.assert_array_equal(triple(np.ones(5, np.float32)), [3] * 5)
