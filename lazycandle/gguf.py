"""GGUF files (llama.cpp's model format): `load_gguf(path)` -> (tensors, metadata) and
`save_gguf(path, tensors, metadata)`.

Layout (little-endian, version 3): "GGUF", u32 version, u64 tensor count, u64 metadata count;
the metadata (key string, u32 value type, value; strings are u64 length + UTF-8 bytes, arrays
u32 element type + u64 count + elements); the tensor infos (name, u32 n_dims, u64 dims innermost
first, u32 ggml type, u64 offset into the data section); padding to `general.alignment` (default
32); the data section, each tensor starting at a multiple of the alignment.

Loading maps the file (private copy-on-write map, like safetensors loading) and hands out views:
QTensors for the block formats lc knows (ir/qformats.py), realized Tensors for F32 F16 BF16 F64
I16 I32 I64 (I8 widens to i16, a copy; so do tensors misaligned for their element size).  No
data is copied otherwise.  Metadata values come back typed: bool, str, NumPy scalars of the
stored type (np.uint32, np.float32, ...), NumPy arrays for numeric arrays, lists for string (or
nested) arrays; `save_gguf` writes those types back exactly (plain Python ints become u32, or
i32 / u64 / i64 when they do not fit; floats f32), so load -> save reproduces a file's metadata."""
from __future__ import annotations

import mmap
import os
import struct
from math import prod

import numpy as np

from . import dtype as D
from .errors import SerializationError
from .ir.qformats import BY_GGML_TYPE, FORMATS, row_bytes
from .qtensor import QTensor
from .tensor import Tensor

MAGIC = b"GGUF"
VERSION = 3
DEFAULT_ALIGNMENT = 32

# metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_NUMERIC = {U8: np.uint8, I8: np.int8, U16: np.uint16, I16: np.int16, U32: np.uint32, I32: np.int32,
            F32: np.float32, U64: np.uint64, I64: np.int64, F64: np.float64}
_BY_NUMPY = {np.dtype(v): k for k, v in _NUMERIC.items()}

# plain (unquantized) ggml tensor types -> (numpy dtype stored, lc dtype loaded)
_PLAIN = {0: (np.float32, D.f32), 1: (np.float16, D.f16), 30: (None, D.bf16), 28: (np.float64, D.f64),
          24: (np.int8, D.i16), 25: (np.int16, D.i16), 26: (np.int32, D.i32), 27: (np.int64, D.i64)}
_PLAIN_BY_LC = {D.f32: 0, D.f16: 1, D.bf16: 30, D.f64: 28, D.i16: 25, D.i32: 26, D.i64: 27}


def _fail(path, what, name=None) -> SerializationError:
    where = f" (tensor {name!r})" if name is not None else ""
    return SerializationError(f"load_gguf: {path}: {what}{where}")


# ---- reading ---------------------------------------------------------------------------------
class _Reader:
    """Sequential little-endian reads from the map, failing with SerializationError."""

    def __init__(self, path, mm):
        self.path, self.mm, self.pos, self.size = path, mm, 0, len(mm)
        self.name = None

    def take(self, n: int, what: str):
        if n < 0 or self.pos + n > self.size:
            raise _fail(self.path, f"truncated: {what} needs {n} bytes at offset {self.pos}, the file has "
                                   f"{self.size}", self.name)
        b = self.mm[self.pos:self.pos + n]
        self.pos += n
        return b

    def num(self, fmt: str, what: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.num("Q", what)
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _fail(self.path, f"{what} is not UTF-8: {e}", self.name) from None

    def value(self, vtype: int, key: str, depth=0):
        if vtype in _NUMERIC:
            dt = np.dtype(_NUMERIC[vtype]).newbyteorder("<")
            return np.frombuffer(self.take(dt.itemsize, f"value of {key!r}"), dt)[0].astype(dt.newbyteorder("="))
        if vtype == BOOL:
            return self.take(1, f"value of {key!r}") != b"\0"
        if vtype == STRING:
            return self.string(f"value of {key!r}")
        if vtype == ARRAY and depth < 8:
            et, n = self.num("I", f"array type of {key!r}"), self.num("Q", f"array length of {key!r}")
            if et in _NUMERIC:
                dt = np.dtype(_NUMERIC[et]).newbyteorder("<")
                raw = self.take(n * dt.itemsize, f"array {key!r} of {n} values")
                return np.frombuffer(raw, dt).astype(dt.newbyteorder("="))
            if n > self.size - self.pos:
                raise _fail(self.path, f"array {key!r} claims {n} elements, more than the file holds")
            return [self.value(et, key, depth + 1) for _ in range(n)]
        raise _fail(self.path, f"metadata {key!r} has unknown value type {vtype}")


def load_gguf(path):
    """(tensors, metadata) of the GGUF file at `path`: {name: QTensor or Tensor}, {key: value}."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                raise _fail(path, "truncated: empty file")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as e:
        raise _fail(path, f"cannot read: {e}") from None
    r = _Reader(path, mm)
    if r.take(4, "the magic") != MAGIC:
        raise _fail(path, "not a GGUF file (bad magic)")
    version = r.num("I", "the version")
    if version not in (2, 3):
        raise _fail(path, f"unsupported GGUF version {version} (big-endian files are not supported)")
    n_tensors, n_kv = r.num("Q", "the tensor count"), r.num("Q", "the metadata count")
    if n_tensors > r.size or n_kv > r.size:
        raise _fail(path, f"corrupt counts: {n_tensors} tensors, {n_kv} metadata entries")
    meta = {}
    for _ in range(n_kv):
        key = r.string("a metadata key")
        meta[key] = r.value(r.num("I", f"type of {key!r}"), key)
    infos = [_tensor_info(r) for _ in range(n_tensors)]
    align = _alignment(meta, path)
    start = -(-r.pos // align) * align
    tensors = {}
    for name, shape, gtype, offset in infos:
        if name in tensors:
            raise _fail(path, "named twice", name)
        tensors[name] = _tensor(path, mm, start, align, name, shape, gtype, offset)
    return tensors, meta


def _alignment(meta, path) -> int:
    a = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(a, (bool, str, list, np.ndarray)) or int(a) <= 0 or int(a) & (int(a) - 1):
        raise _fail(path, f"general.alignment {a!r} is not a power of two")
    return int(a)


def _tensor_info(r):
    name = r.name = r.string("a tensor name")
    nd = r.num("I", "n_dims")
    if nd > 4:
        raise _fail(r.path, f"{nd} dims (GGML has at most 4)", name)
    ne = [r.num("Q", "a dim") for _ in range(nd)]
    gtype, offset = r.num("I", "the tensor type"), r.num("Q", "the data offset")
    r.name = None
    return name, tuple(reversed(ne)), gtype, offset


def _tensor(path, mm, start, align, name, shape, gtype, offset):
    if offset % align:
        raise _fail(path, f"data offset {offset} is not a multiple of the alignment {align}", name)
    fmt = BY_GGML_TYPE.get(gtype)
    if fmt is None and gtype not in _PLAIN:
        raise _fail(path, f"unknown or unsupported tensor type {gtype}", name)
    count = prod(shape)
    if fmt is not None:
        if not shape or shape[-1] % fmt.block:
            raise _fail(path, f"{fmt.name} shape {shape}: the inner dim is not a multiple of {fmt.block}", name)
        nbytes = prod(shape[:-1]) * row_bytes(fmt, shape[-1])
    else:
        stored, lc_dt = _PLAIN[gtype]
        nbytes = count * (2 if stored is None else np.dtype(stored).itemsize)
    at = start + offset
    end = at + -(-nbytes // align) * align           # llama.cpp reads each tensor's padding too
    if end > len(mm):
        raise _fail(path, f"truncated: data [{at}, {end}) (padded) runs past the end of the file "
                          f"({len(mm)} bytes)", name)
    if fmt is not None:
        buf = np.frombuffer(mm, np.uint8, nbytes, at)
        buf.flags.writeable = False
        return QTensor(buf, shape, fmt.name)
    return _plain(mm, at, count, shape, stored, lc_dt)


def _plain(mm, at, count, shape, stored, lc_dt) -> Tensor:
    from .ir.node import Node
    npdt = lc_dt.numpy
    raw = np.frombuffer(mm, stored if stored is not None else np.uint16, count, at)
    if stored is None:
        buf = raw.view(npdt)
    elif np.dtype(stored) != np.dtype(npdt):
        buf = raw.astype(npdt)                       # I8 -> i16
    else:
        buf = raw
    if count and at % buf.dtype.itemsize:
        buf = buf.copy()
    buf.flags.writeable = False
    return Tensor(Node("buffer", (), None, tuple(shape), lc_dt, buffer=buf))


# ---- writing ---------------------------------------------------------------------------------
def _pack_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _int_type(values) -> int:
    lo, hi = min(values, default=0), max(values, default=0)
    if lo >= 0:
        return U32 if hi < 1 << 32 else U64
    return I32 if -(1 << 31) <= lo and hi < 1 << 31 else I64


def _typed(key, v):
    """(value type, packed bytes) of one metadata value."""
    if isinstance(v, (bool, np.bool_)):
        return BOOL, bytes([bool(v)])
    if isinstance(v, str):
        return STRING, _pack_string(v)
    if isinstance(v, np.generic) and v.dtype in _BY_NUMPY:
        return _BY_NUMPY[v.dtype], v.astype(v.dtype.newbyteorder("<")).tobytes()
    if isinstance(v, int):
        t = _int_type([v])
        return t, np.array(v, _NUMERIC[t]).astype(np.dtype(_NUMERIC[t]).newbyteorder("<")).tobytes()
    if isinstance(v, float):
        return F32, struct.pack("<f", v)
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype in _BY_NUMPY:
        t = _BY_NUMPY[v.dtype]
        return ARRAY, struct.pack("<IQ", t, v.size) + v.astype(v.dtype.newbyteorder("<")).tobytes()
    if isinstance(v, (list, tuple)):
        items = list(v)
        if items and all(isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_)) for i in items):
            return _typed(key, np.array(items, _NUMERIC[_int_type([int(i) for i in items])]))
        if items and all(isinstance(i, (float, np.floating)) for i in items):
            return _typed(key, np.array(items, np.float32))
        typed = [_typed(key, i) for i in items]
        types = {t for t, _ in typed}
        if len(types) > 1:
            raise SerializationError(f"save_gguf: metadata {key!r}: array of mixed types")
        et = types.pop() if types else U32
        return ARRAY, struct.pack("<IQ", et, len(items)) + b"".join(p for _, p in typed)
    raise SerializationError(f"save_gguf: metadata {key!r}: cannot store a {type(v).__name__} in GGUF")


def _tensor_bytes(name, t):
    """(ggml type, dims innermost first, array of the bytes) of one tensor."""
    if isinstance(t, QTensor):
        return FORMATS[t.kind].ggml_type, tuple(reversed(t.shape)), t.buffer()
    if not isinstance(t, Tensor):
        raise SerializationError(f"save_gguf: tensor {name!r} is a {type(t).__name__}, not a Tensor or QTensor")
    gtype = _PLAIN_BY_LC.get(t.dtype)
    if gtype is None:
        raise SerializationError(f"save_gguf: tensor {name!r}: GGUF has no {t.dtype.name} type")
    if t.rank > 4:
        raise SerializationError(f"save_gguf: tensor {name!r}: {t.rank} dims (GGML has at most 4)")
    a = np.ascontiguousarray(t.numpy())
    return gtype, tuple(reversed(t.shape)), a.reshape(-1).view(np.uint8)


def save_gguf(path, tensors: dict, metadata: dict | None = None) -> None:
    """Write `tensors` ({name: Tensor or QTensor}, in order) and `metadata` as GGUF version 3,
    the layout the gguf package's GGUFWriter writes."""
    from .serialization import _write_atomically
    metadata = dict(metadata or {})
    align = _alignment(metadata, os.fspath(path)) if "general.alignment" in metadata else DEFAULT_ALIGNMENT
    head = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(metadata))]
    for key, v in metadata.items():
        t, packed = _typed(key, v)
        head.append(_pack_string(str(key)) + struct.pack("<I", t) + packed)
    datas, offset = [], 0
    for name, t in tensors.items():
        gtype, dims, data = _tensor_bytes(name, t)
        head.append(_pack_string(str(name)) + struct.pack("<I", len(dims)) +
                    b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", gtype, offset))
        datas.append(data)
        offset += -(-data.size // align) * align
    header = b"".join(head)
    chunks = [header, bytes(-len(header) % align)]
    for data in datas:
        chunks += [data, bytes(-data.size % align)]
    _write_atomically(path, chunks)
