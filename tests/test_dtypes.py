"""The dtype table: the 14 dtypes, their metadata and the name / numpy mappings."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import lazycandle as lc
from conftest import ALL_DTYPES, COMPUTE, FLOATS, INTS, STORAGE_ONLY, ids

EXPECTED = {
    # name: (numpy dtype, size_in_bytes, is_float, is_int)
    "u8": (np.uint8, 1, False, True),
    "u32": (np.uint32, 4, False, True),
    "i16": (np.int16, 2, False, True),
    "i32": (np.int32, 4, False, True),
    "i64": (np.int64, 8, False, True),
    "bf16": (ml_dtypes.bfloat16, 2, True, False),
    "f16": (np.float16, 2, True, False),
    "f32": (np.float32, 4, True, False),
    "f64": (np.float64, 8, True, False),
    "f8e4m3": (ml_dtypes.float8_e4m3fn, 1, True, False),
    "f6e2m3": (ml_dtypes.float6_e2m3fn, 1, True, False),
    "f6e3m2": (ml_dtypes.float6_e3m2fn, 1, True, False),
    "f4": (ml_dtypes.float4_e2m1fn, 1, True, False),
    "f8e8m0": (ml_dtypes.float8_e8m0fnu, 1, True, False),
}


def test_all_fourteen_exported():
    names = [d.name for d in ALL_DTYPES]
    assert sorted(names) == sorted(EXPECTED)
    for name in EXPECTED:
        d = getattr(lc, name)
        assert isinstance(d, lc.DType)
        assert d.name == name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_metadata(name):
    d = getattr(lc, name)
    npdt, size, is_float, is_int = EXPECTED[name]
    assert d.numpy == np.dtype(npdt)
    assert isinstance(d.numpy, np.dtype)
    assert d.size_in_bytes == size
    assert d.is_float is is_float
    assert d.is_int is is_int


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=ids(ALL_DTYPES))
def test_from_name_roundtrip(dt):
    assert lc.DType.from_name(dt.name) is dt


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=ids(ALL_DTYPES))
def test_from_numpy_roundtrip(dt):
    assert lc.DType.from_numpy(dt.numpy) is dt
    assert lc.DType.from_numpy(np.dtype(dt.numpy)) is dt


def test_from_numpy_type_objects():
    assert lc.DType.from_numpy(np.float32) is lc.f32
    assert lc.DType.from_numpy(ml_dtypes.bfloat16) is lc.bf16
    assert lc.DType.from_numpy(ml_dtypes.float8_e4m3fn) is lc.f8e4m3
    assert lc.DType.from_numpy(ml_dtypes.float4_e2m1fn) is lc.f4


@pytest.mark.parametrize("name", ["f128", "float32", "int8", "", "F32", "bfloat16", "f8"])
def test_from_name_unknown(name):
    with pytest.raises(lc.UnsupportedDType):
        lc.DType.from_name(name)


@pytest.mark.parametrize("npdt", [np.complex64, np.complex128, np.object_, np.str_, np.int8, np.uint16,
                                  np.uint64, ml_dtypes.float8_e5m2], ids=str)
def test_from_numpy_unsupported(npdt):
    with pytest.raises(lc.UnsupportedDType):
        lc.DType.from_numpy(np.dtype(npdt))


def test_unsupported_dtype_is_type_error():
    with pytest.raises(TypeError):
        lc.DType.from_name("nope")
    assert issubclass(lc.UnsupportedDType, lc.Error)


def test_partitions():
    assert set(COMPUTE) | set(STORAGE_ONLY) == set(ALL_DTYPES)
    assert set(FLOATS) | set(INTS) == set(COMPUTE)
    for d in ALL_DTYPES:
        assert d.is_float != d.is_int


def test_dtype_identity_and_hash():
    # dtypes are usable as dict keys and compare by identity / equality consistently
    table = {d: d.name for d in ALL_DTYPES}
    assert len(table) == 14
    assert lc.f32 == lc.f32
    assert lc.f32 != lc.f64


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=ids(ALL_DTYPES))
def test_tensor_dtype_survives_roundtrip(dt):
    a = np.array([1, 2, 4], np.float32).astype(dt.numpy)
    t = lc.tensor(a)
    assert t.dtype is dt
    out = t.numpy()
    assert out.dtype == dt.numpy
    np.testing.assert_array_equal(out.view(f"u{dt.size_in_bytes}"), a.view(f"u{dt.size_in_bytes}"))
