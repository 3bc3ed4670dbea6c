"""The one dtype table.  Everything dtype-specific (numpy mapping, LLVM storage type, the type
computation happens in, how values are converted on load/store) is a column here; codegen reads
the columns instead of branching on dtype names."""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from .errors import UnsupportedDType


@dataclass(frozen=True, eq=False)
class DType:
    name: str
    numpy: np.dtype
    size_in_bytes: int
    kind: str            # "f" float, "i" signed int, "u" unsigned int
    storage: str         # LLVM type the bytes are stored as: i8 i16 i32 i64 half float double
    compute: str         # LLVM type arithmetic runs in (f16/bf16/f8 compute in float)
    codec: str | None    # load/store conversion between storage and compute (None: same type)
    storage_only: bool = False
    struct_format: str | None = None    # `struct` code rounding a Python float to this dtype exactly

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in "iu"

    @property
    def is_signed(self) -> bool:
        return self.kind == "i"

    @property
    def bits(self) -> int:
        return self.size_in_bytes * 8

    def __repr__(self) -> str:
        return f"lc.{self.name}"

    __str__ = __repr__

    def __reduce__(self):
        return (DType.from_name, (self.name,))

    @staticmethod
    def from_name(name: str) -> "DType":
        try:
            return _BY_NAME[name]
        except (KeyError, TypeError):
            raise UnsupportedDType(f"unsupported dtype name {name!r}; known: {', '.join(_BY_NAME)}") from None

    @staticmethod
    def from_numpy(dt) -> "DType":
        """The lazycandle dtype of a numpy dtype of either byte order (lazycandle stores the
        native one; `lc.tensor` and program feeds byteswap)."""
        if dt is None:     # np.dtype(None) would be float64
            raise UnsupportedDType("a dtype is required, got None")
        try:
            dt = np.dtype(dt)
        except TypeError:
            raise UnsupportedDType(f"not a numpy dtype: {dt!r}") from None
        if not dt.isnative:
            dt = dt.newbyteorder("=")
        if dt == np.bool_:
            return u8
        found = _BY_NUMPY.get(dt)
        if found is None:
            raise UnsupportedDType(f"numpy dtype {dt} has no lazycandle equivalent")
        return found


def _d(name, npdt, kind, storage, compute, codec=None, storage_only=False, struct_format=None):
    npdt = np.dtype(npdt)
    return DType(name, npdt, npdt.itemsize, kind, storage, compute, codec, storage_only, struct_format)


u8 = _d("u8", np.uint8, "u", "i8", "i8")
u32 = _d("u32", np.uint32, "u", "i32", "i32")
i16 = _d("i16", np.int16, "i", "i16", "i16")
i32 = _d("i32", np.int32, "i", "i32", "i32")
i64 = _d("i64", np.int64, "i", "i64", "i64")
bf16 = _d("bf16", ml_dtypes.bfloat16, "f", "i16", "float", "bf16")
f16 = _d("f16", np.float16, "f", "half", "float", "half", struct_format="e")
f32 = _d("f32", np.float32, "f", "float", "float", struct_format="f")
f64 = _d("f64", np.float64, "f", "double", "double", struct_format="d")
f8e4m3 = _d("f8e4m3", ml_dtypes.float8_e4m3fn, "f", "i8", "float", "f8e4m3")
f6e2m3 = _d("f6e2m3", ml_dtypes.float6_e2m3fn, "f", "i8", "float", "f6e2m3", True)
f6e3m2 = _d("f6e3m2", ml_dtypes.float6_e3m2fn, "f", "i8", "float", "f6e3m2", True)
f4 = _d("f4", ml_dtypes.float4_e2m1fn, "f", "i8", "float", "f4e2m1", True)
f8e8m0 = _d("f8e8m0", ml_dtypes.float8_e8m0fnu, "f", "i8", "float", "f8e8m0", True)

ALL = (u8, u32, i16, i32, i64, bf16, f16, f32, f64, f8e4m3, f6e2m3, f6e3m2, f4, f8e8m0)
COMPUTE = tuple(d for d in ALL if not d.storage_only)
FLOATS = tuple(d for d in COMPUTE if d.is_float)
INTS = tuple(d for d in COMPUTE if d.is_int)
_BY_NAME = {d.name: d for d in ALL}
_BY_NUMPY = {d.numpy: d for d in ALL}


def as_dtype(x) -> DType:
    """Accept a DType, a dtype name or anything numpy understands as a dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    return DType.from_numpy(x)
