"""Reading and writing tensors: the safetensors format (loaded memory-mapped) and NumPy's .npz.

safetensors layout: an 8-byte little-endian header length N, N bytes of JSON (padded with spaces
so the data starts 8-byte aligned) mapping each name to {"dtype", "shape", "data_offsets"} (byte
offsets into the data; optional "__metadata__": str -> str), then the data, packed in header
order.  We write exactly what the `safetensors` package writes (tensors ordered by descending dtype
rank, then by name), so the files are byte-for-byte the same.

Loading maps the file (a private copy-on-write mapping, so the engine can never fault on it) and
each realized tensor's buffer is a read-only view into the map: nothing is copied until a kernel
reads it.  The map lives as long as any buffer viewing it.  Copies are made only for
  - tensors whose bytes are not aligned to their element size (a hand-made file can do that),
  - the packed sub-byte dtypes F4 (2 per byte) and F6_E2M3 / F6_E3M2 (4 per 3 bytes), which lc
    stores one per byte; bits are packed little-endian: element i starts at bit i*width,
  - format dtypes lc does not have, which widen exactly: I8 -> i16, U16 -> u32, F8_E5M2,
    F8_E4M3FNUZ, F8_E5M2FNUZ -> f16, BOOL -> u8 (a view), U64 -> i64 when every value fits.
    Anything not exactly representable (C64, U64 values >= 2**63) raises SerializationError.
"""
from __future__ import annotations

import json
import mmap
import os
from dataclasses import dataclass
from math import prod

import ml_dtypes
import numpy as np

from . import dtype as D
from .errors import SerializationError, UnsupportedDType
from .ir.node import Node
from .tensor import Tensor, _from_array, realize


@dataclass(frozen=True)
class _Code:
    """One safetensors dtype: its rank in the package's ordering, its size in bits, the numpy
    dtype of its stored elements, and the lc dtype it loads as (None: cannot be loaded)."""
    rank: int
    bits: int
    stored: object
    lc: D.DType | None


# Ranks follow the safetensors package's dtype order (it writes descending rank, then name).
CODES = {
    "BOOL": _Code(0, 8, np.uint8, D.u8),
    "F4": _Code(1, 4, np.uint8, D.f4),
    "F6_E2M3": _Code(2, 6, np.uint8, D.f6e2m3),
    "F6_E3M2": _Code(3, 6, np.uint8, D.f6e3m2),
    "U8": _Code(4, 8, np.uint8, D.u8),
    "I8": _Code(5, 8, np.int8, D.i16),
    "F8_E5M2": _Code(6, 8, ml_dtypes.float8_e5m2, D.f16),
    "F8_E4M3": _Code(7, 8, ml_dtypes.float8_e4m3fn, D.f8e4m3),
    "F8_E8M0": _Code(8, 8, ml_dtypes.float8_e8m0fnu, D.f8e8m0),
    "F8_E4M3FNUZ": _Code(9, 8, ml_dtypes.float8_e4m3fnuz, D.f16),
    "F8_E5M2FNUZ": _Code(10, 8, ml_dtypes.float8_e5m2fnuz, D.f16),
    "I16": _Code(11, 16, np.int16, D.i16),
    "U16": _Code(12, 16, np.uint16, D.u32),
    "F16": _Code(13, 16, np.float16, D.f16),
    "BF16": _Code(14, 16, ml_dtypes.bfloat16, D.bf16),
    "I32": _Code(15, 32, np.int32, D.i32),
    "U32": _Code(16, 32, np.uint32, D.u32),
    "F32": _Code(17, 32, np.float32, D.f32),
    "C64": _Code(18, 64, np.complex64, None),
    "F64": _Code(19, 64, np.float64, D.f64),
    "I64": _Code(20, 64, np.int64, D.i64),
    "U64": _Code(21, 64, np.uint64, D.i64),
}
# The code each lc dtype is saved as (bool is saved as U8: lc has no bool dtype).
SAVE_CODE = {"u8": "U8", "u32": "U32", "i16": "I16", "i32": "I32", "i64": "I64", "bf16": "BF16", "f16": "F16",
             "f32": "F32", "f64": "F64", "f8e4m3": "F8_E4M3", "f8e8m0": "F8_E8M0", "f4": "F4",
             "f6e2m3": "F6_E2M3", "f6e3m2": "F6_E3M2"}
_PACKED_BITS = (4, 6)
_META = "__metadata__"


def _fail(path, what, name=None) -> SerializationError:
    where = f" tensor {name!r}:" if name is not None else ""
    return SerializationError(f"{os.fspath(path)!s}:{where} {what}")


# ---- safetensors: saving ------------------------------------------------------------------
def save_safetensors(tensors: dict, path, metadata: dict | None = None) -> None:
    """Write `{name: Tensor}` to `path` in the safetensors format (realizing lazy tensors in one
    graph).  The file is written next to `path` and renamed over it, so saving over a file that
    loaded tensors still map never truncates their pages."""
    if not isinstance(tensors, dict):
        raise _fail(path, f"save_safetensors needs a dict of name -> Tensor, got {type(tensors).__name__}")
    if metadata is not None and (not isinstance(metadata, dict) or
                                 not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise _fail(path, "metadata must be a dict of str -> str")
    for name, t in tensors.items():
        if not isinstance(name, str) or name == _META:
            raise _fail(path, f"tensor names must be strings other than {_META!r}", name)
        if not isinstance(t, Tensor):
            raise _fail(path, f"not an lc.Tensor but {type(t).__name__}", name)
    realize(*tensors.values())
    entries = sorted(((CODES[SAVE_CODE[t.dtype.name]].rank, name, t) for name, t in tensors.items()),
                     key=lambda e: (-e[0], e[1]))
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header[_META] = dict(metadata)
    for _, name, t in entries:
        blob = _stored_bytes(path, name, t)
        header[name] = {"dtype": SAVE_CODE[t.dtype.name], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    _write_atomically(path, [len(text).to_bytes(8, "little"), text, *blobs])


def _stored_bytes(path, name, t: Tensor):
    """The tensor's bytes as the file stores them (sub-byte dtypes packed)."""
    raw = np.ascontiguousarray(t.numpy()).reshape(-1).view(np.uint8)
    bits = CODES[SAVE_CODE[t.dtype.name]].bits
    if bits not in _PACKED_BITS:
        return memoryview(raw)
    if raw.size * bits % 8:
        raise _fail(path, f"{t.dtype.name} {t.shape}: {raw.size} elements of {bits} bits do not fill whole "
                          f"bytes, which the format requires", name)
    return _pack(raw, bits).tobytes()


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """Pack `bits`-wide codes (one per byte) little-endian: element i starts at bit i*bits."""
    per = 8 // np.gcd(8, bits)                 # elements per group of whole bytes: F4 2, F6 4
    groups = codes.reshape(-1, per).astype(np.uint32) & ((1 << bits) - 1)
    word = np.zeros(len(groups), np.uint32)
    for i in range(per):
        word |= groups[:, i] << (i * bits)
    nbytes = per * bits // 8
    return np.stack([(word >> (8 * j)) & 0xFF for j in range(nbytes)], axis=1).astype(np.uint8).reshape(-1)


def _unpack(data: np.ndarray, bits: int, count: int) -> np.ndarray:
    per = 8 // np.gcd(8, bits)
    nbytes = per * bits // 8
    grouped = data.reshape(-1, nbytes).astype(np.uint32)
    word = np.zeros(len(grouped), np.uint32)
    for j in range(nbytes):
        word |= grouped[:, j] << (8 * j)
    codes = np.stack([(word >> (i * bits)) & ((1 << bits) - 1) for i in range(per)], axis=1)
    return codes.astype(np.uint8).reshape(-1)[:count]


def _write_atomically(path, chunks) -> None:
    import tempfile         # here, not at import: tempfile and zipfile cost `import lazycandle` ~10 ms
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".lc-save-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---- safetensors: loading -----------------------------------------------------------------
def load_safetensors(path) -> dict:
    """`{name: Tensor}` from a safetensors file, memory-mapped (see the module docstring).
    A truncated, corrupt or inconsistent file raises SerializationError naming file and tensor."""
    return _open(path, want_map=True)[1]


def load_safetensors_metadata(path) -> dict:
    """The file's `__metadata__` (str -> str; {} when it has none), checking the whole header."""
    return _open(path, want_map=False)[0]


class MappedSafetensors:
    """One safetensors file, header checked and data mapped, whose tensors are made one at a
    time on request (a checkpoint loader reads only the tensors its model asks for)."""

    def __init__(self, path):
        self.path = str(path)
        self.metadata, self._entries, self._mm, self._start = _open(path, want_map=None)

    def names(self) -> list:
        return list(self._entries)

    def __contains__(self, name) -> bool:
        return name in self._entries

    def shape(self, name) -> tuple:
        return self._entries[name][1]

    def tensor(self, name) -> Tensor:
        """The tensor `name` as a read-only view of the map (KeyError when absent)."""
        return _tensor_from_map(self.path, self._mm, self._start, name, *self._entries[name])


def _open(path, want_map):
    """(metadata, tensors) when want_map, (metadata, None) when not; want_map None gives the
    unmade (metadata, entries, map, data start) for MappedSafetensors."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise _fail(path, f"truncated: {size} bytes, shorter than the 8-byte header length")
            n = int.from_bytes(f.read(8), "little")
            if n > size - 8:
                raise _fail(path, f"header length {n} runs past the end of the file ({size} bytes)")
            meta, header = _parse_header(path, f.read(n))
            entries = _check_entries(path, header, size - 8 - n)
            if want_map is False:
                return meta, None
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as e:
        raise _fail(path, f"cannot read: {e}") from None
    if want_map is None:
        return meta, entries, mm, 8 + n
    return meta, {name: _tensor_from_map(path, mm, 8 + n, name, *e) for name, e in entries.items()}


def _parse_header(path, raw: bytes):
    """(metadata, {name: entry}) from the JSON header."""
    def no_duplicates(pairs):
        d = dict(pairs)
        if len(d) != len(pairs):
            dup = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
            raise _fail(path, "header names it twice", dup)
        return d
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, SerializationError):
            raise
        raise _fail(path, f"header is not valid UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise _fail(path, f"header is a JSON {type(header).__name__}, not an object")
    meta = header.pop(_META, None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise _fail(path, f"{_META} must map strings to strings")
    return meta or {}, header


def _is_count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _check_entries(path, header: dict, data_len: int) -> dict:
    """Validate every entry; returns name -> (code, shape, begin, end) in file order.  The
    entries must tile the data region exactly: no gap, no overlap, nothing left over."""
    checked = []
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise _fail(path, "entry needs dtype, shape and data_offsets", name)
        code, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(code, str) or code not in CODES:
            raise _fail(path, f"unknown dtype {code!r} (known: {', '.join(CODES)})", name)
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise _fail(path, f"shape {shape!r} is not a list of non-negative ints", name)
        if not (isinstance(offs, list) and len(offs) == 2 and all(_is_count(o) for o in offs) and offs[0] <= offs[1]):
            raise _fail(path, f"data_offsets {offs!r} are not [begin, end] with 0 <= begin <= end", name)
        bits = prod(shape) * CODES[code].bits
        if bits % 8 or bits // 8 != offs[1] - offs[0]:
            raise _fail(path, f"{code} {tuple(shape)} needs {bits / 8:g} bytes but data_offsets {offs} hold "
                              f"{offs[1] - offs[0]}", name)
        checked.append((offs[0], offs[1], name, code, tuple(shape)))
    checked.sort()
    pos = 0
    for begin, end, name, _, _ in checked:
        if begin != pos:
            raise _fail(path, f"data_offsets start at {begin}, but the previous tensor ends at {pos} "
                              f"({'overlap' if begin < pos else 'gap'})", name)
        pos = end
    if pos > data_len:
        begin, end, name, _, _ = next(c for c in checked if c[1] > data_len)
        raise _fail(path, f"truncated: the tensor's data is bytes [{begin}, {end}) of the data region, but the "
                          f"file holds {data_len} data bytes (tensors cover {pos})", name)
    if pos != data_len:
        raise _fail(path, f"tensors cover {pos} data bytes but the file holds {data_len}")
    return {name: (code, shape, begin, end) for begin, end, name, code, shape in checked}


def _tensor_from_map(path, mm, data_start, name, code, shape, begin, end) -> Tensor:
    c = CODES[code]
    if c.lc is None:
        raise _fail(path, f"dtype {code} has no exact lazycandle equivalent", name)
    count = prod(shape)
    start = data_start + begin
    if count == 0:
        buf = np.empty(0, c.lc.numpy)
    elif c.bits in _PACKED_BITS:
        buf = _unpack(np.frombuffer(mm, np.uint8, end - begin, start), c.bits, count).view(c.lc.numpy)
    else:
        stored = np.frombuffer(mm, c.stored, count, start)
        if stored.dtype != c.lc.numpy:
            buf = _widen(path, name, code, stored, c.lc)
        elif start % stored.dtype.itemsize:
            buf = stored.view(c.lc.numpy).copy()      # misaligned for its element size
        else:
            buf = stored.view(c.lc.numpy)
    buf.flags.writeable = False
    return Tensor(Node("buffer", (), None, shape, c.lc, buffer=buf))


def _widen(path, name, code, stored: np.ndarray, to: D.DType) -> np.ndarray:
    """Convert a format dtype lc lacks to a wider lc dtype, exactly (else SerializationError)."""
    if code == "U64" and stored.size and int(stored.max()) >= 1 << 63:
        raise _fail(path, f"U64 value {int(stored.max())} does not fit in i64", name)
    return stored.astype(to.numpy)


# ---- checkpoints ----------------------------------------------------------------------------
def take_tensors(tensors: dict, expected: dict, source, prefixes=("",)) -> dict:
    """The tensors a model needs from a loaded checkpoint: `expected` maps each name to its
    shape; a name may carry any of `prefixes` in the file ("transformer.h.0..." for "h.0...").
    A missing tensor or a wrong shape raises SerializationError naming it (and the file);
    tensors the model does not use are ignored."""
    out = {}
    for name, shape in expected.items():
        found = next((p + name for p in prefixes if p + name in tensors), None)
        if found is None:
            raise _fail(source, f"missing (the model needs shape {tuple(shape)}; tried prefixes "
                                f"{', '.join(repr(p) for p in prefixes)})", name)
        t = tensors[found]
        if tuple(t.shape) != tuple(shape):
            raise _fail(source, f"shape {tuple(t.shape)} but the model needs {tuple(shape)}", found)
        out[name] = t
    return out


# ---- npz ------------------------------------------------------------------------------------
_NPZ_DTYPES = "__lazycandle_dtypes__"     # JSON {name: lc dtype name} for dtypes .npy cannot name
# .npy keeps these numpy dtypes; the rest (ml_dtypes' types) are stored as raw unsigned ints.
_NPY_NATIVE = ("u8", "u32", "i16", "i32", "i64", "f16", "f32", "f64")
# numpy dtypes lc lacks, loaded widened exactly (as for safetensors).
_NPZ_WIDEN = {np.dtype(np.int8): D.i16, np.dtype(np.uint16): D.u32, np.dtype(np.uint64): D.i64}


def save_npz(tensors: dict, path) -> None:
    """Write `{name: Tensor}` with np.savez.  bf16 / f8 / f6 / f4 arrays are stored as their raw
    bits (unsigned ints of the same size) and an entry `__lazycandle_dtypes__` (a JSON string)
    names their lc dtype, so `load_npz` gets the same dtype back."""
    if not isinstance(tensors, dict):
        raise _fail(path, f"save_npz needs a dict of name -> Tensor, got {type(tensors).__name__}")
    for name, t in tensors.items():
        if not isinstance(name, str) or name == _NPZ_DTYPES:
            raise _fail(path, f"tensor names must be strings other than {_NPZ_DTYPES!r}", name)
        if not isinstance(t, Tensor):
            raise _fail(path, f"not an lc.Tensor but {type(t).__name__}", name)
    realize(*tensors.values())
    arrays, special = {}, {}
    for name, t in tensors.items():
        a = t.numpy()
        if t.dtype.name not in _NPY_NATIVE:
            a = a.view(np.dtype(f"u{t.dtype.size_in_bytes}"))
            special[name] = t.dtype.name
        arrays[name] = a
    if special:
        arrays[_NPZ_DTYPES] = np.array(json.dumps(special))
    path = os.fspath(path)
    if not path.endswith(".npz"):          # np.savez would append ".npz" to a str path
        with open(path, "wb") as f:
            np.savez(f, **arrays)
    else:
        np.savez(path, **arrays)


def load_npz(path) -> dict:
    """`{name: Tensor}` from an .npz file (as written by `save_npz` or by np.savez)."""
    import zipfile
    try:
        with np.load(path, allow_pickle=False) as z:
            special = {}
            if _NPZ_DTYPES in z.files:
                try:
                    special = json.loads(str(z[_NPZ_DTYPES]))
                    assert isinstance(special, dict)
                except (ValueError, AssertionError):
                    raise _fail(path, f"{_NPZ_DTYPES} is not a JSON object") from None
            return {name: _tensor_from_npy(path, name, _read_member(path, z, name), special.get(name))
                    for name in z.files if name != _NPZ_DTYPES}
    except SerializationError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise _fail(path, f"not a readable .npz file: {e}") from None


def _read_member(path, z, name):
    import zipfile
    try:
        return z[name]
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        raise _fail(path, f"cannot read its array: {e}", name) from None


def _tensor_from_npy(path, name, arr: np.ndarray, lc_name) -> Tensor:
    if lc_name is not None:
        try:
            dt = D.DType.from_name(lc_name)
        except UnsupportedDType:
            raise _fail(path, f"unknown lazycandle dtype {lc_name!r}", name) from None
        if arr.dtype.itemsize != dt.size_in_bytes or arr.dtype.kind not in "uiV":
            raise _fail(path, f"stored as {arr.dtype}, which cannot hold {lc_name} bits", name)
        return _from_array(np.ascontiguousarray(arr).reshape(arr.shape).view(dt.numpy), dt)
    if arr.dtype in _NPZ_WIDEN:
        to = _NPZ_WIDEN[arr.dtype]
        if arr.dtype == np.uint64 and arr.size and int(arr.max()) >= 1 << 63:
            raise _fail(path, f"uint64 value {int(arr.max())} does not fit in i64", name)
        return _from_array(arr, to)
    try:
        dt = D.DType.from_numpy(arr.dtype)
    except UnsupportedDType:
        raise _fail(path, f"numpy dtype {arr.dtype} has no lazycandle equivalent", name) from None
    return _from_array(arr, dt)
