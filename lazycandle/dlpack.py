"""DLPack for the dtypes NumPy's DLPack cannot carry: bf16 and the ml_dtypes floats (float8 e4m3 and
e8m0, float6, float4), which NumPy neither exports ("DLPack only supports signed/unsigned integers,
float and complex") nor imports ("Unsupported dtype in DLTensor").  Every other dtype keeps going
through NumPy (tensor_interop.py).

The DLPack C structs (dlpack.h, v1.1) are declared here with ctypes and used both ways:

  export     NumPy exports the bits as the unsigned integer of the same size, then the capsule's
             DLDataType is rewritten to the DLPack code.  The capsule, its destructor, the deleter,
             the read-only / copy flags and the legacy "dltensor" path stay NumPy's C code.  (A
             destructor or deleter written as a ctypes callback would run Python while the error
             that drops the capsule, such as NumPy refusing the dtype, is still set: the caller
             then gets "SystemError: error return without exception set" and the export leaks.)
  to_numpy   reads a producer's capsule itself (zero-copy, any strides), marks it consumed and
             calls the producer's deleter when the last array over the memory is gone.
"""
from __future__ import annotations

import ctypes
import weakref
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_int32, c_int64, c_ssize_t, c_uint8, \
    c_uint16, c_uint32, c_uint64, c_void_p, py_object

import numpy as np

from . import dtype as D
from .errors import UnsupportedDType
from .layout import contiguous_strides

VERSION = (1, 1)            # the float8/6/4 codes and the padded sub-byte flag are DLPack 1.1
CPU = 1                     # kDLCPU
READ_ONLY = 1 << 0          # DLPACK_FLAG_BITMASK_READ_ONLY
SUBBYTE_PADDED = 1 << 2     # DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED: one sub-byte value a byte

# DLDataTypeCode values (dlpack.h), by code
CODE_NAMES = ("kDLInt", "kDLUInt", "kDLFloat", "kDLOpaqueHandle", "kDLBfloat", "kDLComplex", "kDLBool",
              "kDLFloat8_e3m4", "kDLFloat8_e4m3", "kDLFloat8_e4m3b11fnuz", "kDLFloat8_e4m3fn",
              "kDLFloat8_e4m3fnuz", "kDLFloat8_e5m2", "kDLFloat8_e5m2fnuz", "kDLFloat8_e8m0fnu",
              "kDLFloat6_e2m3fn", "kDLFloat6_e3m2fn", "kDLFloat4_e2m1fn")

# the lazycandle dtypes NumPy's DLPack cannot carry -> (DLPack code, bits); f6/f4 are stored one
# value a byte, which DLPack calls padded (its default for bits < 8 is packed)
CODES = {D.bf16: (4, 16), D.f8e4m3: (10, 8), D.f8e8m0: (14, 8), D.f6e2m3: (15, 6), D.f6e3m2: (16, 6),
         D.f4: (17, 4)}
_BY_CODE = {code: dt for dt, code in CODES.items()}


class DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", DLDevice), ("ndim", c_int32), ("dtype", DLDataType),
                ("shape", POINTER(c_int64)), ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


Deleter = CFUNCTYPE(None, c_void_p)     # void (*)(DLManagedTensor[Versioned] *self)


class DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", Deleter)]


class DLPackVersion(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32)]


class DLManagedTensorVersioned(Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", c_void_p), ("deleter", Deleter),
                ("flags", c_uint64), ("dl_tensor", DLTensor)]


def _capi(name, restype, *argtypes):
    """A Python C-API function (a fresh ctypes object: the shared `ctypes.pythonapi.<name>` keeps
    whatever signature other code gave it)."""
    f = ctypes.pythonapi[name]
    f.restype, f.argtypes = restype, argtypes
    return f


_is_valid = _capi("PyCapsule_IsValid", c_int, py_object, c_char_p)
_get_pointer = _capi("PyCapsule_GetPointer", c_void_p, py_object, c_char_p)
_set_name = _capi("PyCapsule_SetName", c_int, py_object, c_char_p)
_memory = _capi("PyMemoryView_FromMemory", py_object, c_void_p, c_ssize_t, c_int)
_PyBUF_READ, _PyBUF_WRITE = 0x100, 0x200

# capsule name -> (its struct, the name a consumer gives it).  A capsule keeps a pointer to its
# name and may outlive this module at interpreter exit, so the "used" names are never freed
_CAPSULES = {b"dltensor_versioned": (DLManagedTensorVersioned, b"used_dltensor_versioned"),
             b"dltensor": (DLManagedTensor, b"used_dltensor")}
for _, _used in _CAPSULES.values():
    ctypes.pythonapi.Py_IncRef(py_object(_used))


def _open(capsule):
    """(the capsule's name, its DLManagedTensor[Versioned]); BufferError unless it is an
    unconsumed DLPack capsule."""
    for name, (struct, _) in _CAPSULES.items():
        if _is_valid(capsule, name):
            return name, struct.from_address(_get_pointer(capsule, name))
    raise BufferError(f"not an unconsumed DLPack capsule: {capsule!r}")


# ---- export ------------------------------------------------------------------------------------
def export(a: np.ndarray, dtype, **kwargs):
    """`a.__dlpack__(**kwargs)` for an array of `dtype`, one of CODES: NumPy exports the same bytes
    as unsigned integers (no copy unless NumPy's own rules make one) and the DLDataType is made
    `dtype`'s.  f6/f4 need a versioned capsule, the only kind that can say "padded"."""
    code, bits = CODES[dtype]
    capsule = a.view(f"u{a.itemsize}").__dlpack__(**kwargs)
    name, managed = _open(capsule)
    if bits < 8:
        if name != b"dltensor_versioned":
            raise BufferError(f"__dlpack__: {dtype.name} is stored one value a byte, which a DLPack consumer "
                              f"older than 1.0 cannot be told; pass max_version=(1, 0) or later")
        managed.flags |= SUBBYTE_PADDED
    managed.dl_tensor.dtype = DLDataType(code, bits, 1)
    return capsule


# ---- import ------------------------------------------------------------------------------------
def to_numpy(x) -> np.ndarray:
    """The data of DLPack producer `x` as an ndarray over its memory (no copy, its strides; read-only
    when the producer says so), for the dtypes in CODES.  The capsule is marked consumed and the
    producer's deleter runs once the last array over the memory is gone."""
    capsule = _capsule(x)
    name, managed = _open(capsule)
    # until the capsule is renamed below, an error leaves the deleter to the producer's destructor
    versioned = name == b"dltensor_versioned"
    if versioned and managed.version.major != VERSION[0]:
        raise BufferError(f"from_dlpack: DLPack {managed.version.major}.{managed.version.minor} capsule, "
                          f"only major version {VERSION[0]} is understood")
    flags = managed.flags if versioned else 0
    t = managed.dl_tensor
    if t.device.device_type != CPU:
        device = (t.device.device_type, t.device.device_id)
        raise BufferError(f"from_dlpack: the data is on DLPack device {device}, only the CPU ({CPU}, 0) "
                          f"is supported")
    dtype = _dtype(t.dtype, flags)
    owner, arr = _view(t, dtype.numpy, writable=not flags & READ_ONLY)
    _set_name(capsule, _CAPSULES[name][1])
    if managed.deleter:
        weakref.finalize(owner, managed.deleter, ctypes.addressof(managed)).atexit = False
    return arr


def _capsule(x):
    """A versioned capsule from `x` when it takes `max_version`, else a legacy one."""
    try:
        return x.__dlpack__(max_version=VERSION)
    except TypeError:
        return x.__dlpack__()


def _dtype(dt: DLDataType, flags: int):
    """The lazycandle dtype of a DLDataType (UnsupportedDType naming the code otherwise)."""
    found = _BY_CODE.get((dt.code, dt.bits))
    if found is not None and dt.lanes == 1 and (dt.bits >= 8 or flags & SUBBYTE_PADDED):
        return found
    name = CODE_NAMES[dt.code] if dt.code < len(CODE_NAMES) else "unknown code"
    packed = " (packed)" if found is not None and dt.bits < 8 else ""
    raise UnsupportedDType(f"from_dlpack: DLPack dtype code {dt.code} ({name}), {dt.bits} bits, {dt.lanes} "
                           f"lane(s){packed} has no lazycandle equivalent")


def _view(t: DLTensor, npdt: np.dtype, writable: bool):
    """(owner, array): a memoryview spanning the bytes `t` addresses, and the ndarray of `npdt` over
    it with `t`'s shape and strides (row-major when DLPack gives none)."""
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else contiguous_strides(shape)
    lo = hi = 0                 # element offsets of the lowest and highest element addressed
    if 0 not in shape:
        for n, s in zip(shape, strides):
            lo, hi = lo + min(0, (n - 1) * s), hi + max(0, (n - 1) * s)
    item = npdt.itemsize
    nbytes = (hi - lo + 1) * item if 0 not in shape else 0
    start = (t.data or 0) + t.byte_offset + lo * item
    owner = _memory(start, nbytes, _PyBUF_WRITE if writable else _PyBUF_READ)
    return owner, np.ndarray(shape, npdt, owner, -lo * item, tuple(s * item for s in strides))
