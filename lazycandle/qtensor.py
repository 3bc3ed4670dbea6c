"""Quantized tensors in GGML's block formats (candle's `QTensor`, llama.cpp's quantized weights).

`quantize(t, kind)` packs a float tensor's rows into blocks (formats: ir/qformats.py) with
llama.cpp's reference quantizers; `QTensor.dequantize()` unpacks them to f32; `qmatmul(x, qw)`
multiplies by the transposed weight straight from the blocks (codegen/qmatmul.py).  All three run
as generated LLVM kernels on the thread pool; NumPy only holds the bytes.  A QTensor's bytes are
immutable (GGUF loading hands out read-only views of the file map)."""
from __future__ import annotations

import os
from math import prod

import numpy as np

from . import dtype as D
from .errors import ShapeMismatch, UnsupportedDTypeForOp
from .ir.qformats import FORMATS, QFormat, row_bytes
from .tensor import Tensor

KINDS = tuple(FORMATS)


def _format(kind, op) -> QFormat:
    f = FORMATS.get(str(kind).lower()) if isinstance(kind, str) else None
    if f is None:
        raise ValueError(f"{op}: unknown quantization kind {kind!r} (known: {', '.join(KINDS)})")
    return f


def _check_shape(shape, f: QFormat, op, what="tensor"):
    if len(shape) == 0 or shape[-1] % f.block:
        raise ShapeMismatch(f"{op}: {f.name} packs the last dim in blocks of {f.block}, but the {what} has "
                            f"shape {tuple(shape)}")


class QTensor:
    """A tensor of `shape` stored as GGML `kind` blocks along its last dim (row-major rows)."""

    __slots__ = ("shape", "kind", "_buf", "_node")

    def __init__(self, buf: np.ndarray, shape, kind: str):
        f = _format(kind, "QTensor")
        shape = tuple(int(d) for d in shape)
        _check_shape(shape, f, "QTensor")
        want = prod(shape[:-1]) * row_bytes(f, shape[-1])
        buf = (np.frombuffer(buf, np.uint8) if isinstance(buf, (bytes, bytearray, memoryview))
               else np.asarray(buf).reshape(-1).view(np.uint8))
        if buf.size != want:
            raise ShapeMismatch(f"QTensor: {f.name} {shape} needs {want} bytes, got {buf.size}")
        self.shape, self.kind, self._buf, self._node = shape, f.name, buf, None

    @property
    def format(self) -> QFormat:
        return FORMATS[self.kind]

    @property
    def nbytes(self) -> int:
        return int(self._buf.size)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def elem_count(self) -> int:
        return prod(self.shape)

    def data(self) -> bytes:
        """The raw GGML block bytes (candle's `QTensor::data`)."""
        return self._buf.tobytes()

    def buffer(self) -> np.ndarray:
        """The blocks as a read-only uint8 array (no copy; for writers like save_gguf)."""
        v = self._buf.view()
        v.flags.writeable = False
        return v

    def node(self):
        """The blocks as a graph input: a realized u8 buffer node (made once, so every graph
        using this weight reads the same input)."""
        if self._node is None:
            from .ir.node import Node
            self._node = Node("buffer", (), None, (self.nbytes,), D.u8, buffer=self.buffer())
        return self._node

    def dequantize(self) -> Tensor:
        """The values as a realized f32 tensor (GGML's dequantize_row_*, bit for bit)."""
        from .codegen import quantize as Q
        from .runtime import buffers, qsteps
        from .tensor_interop import _buffer_tensor
        f = self.format
        out = buffers.alloc(self.elem_count, D.f32)
        spec, fn = Q.kernel(f.name, False)
        nblocks = self.elem_count // f.block
        qsteps.run(fn, [out, self._buf], (nblocks,), nblocks, spec.cost((1,)))
        return _buffer_tensor(out, D.f32, self.shape)

    def take_rows(self, ids) -> "QTensor":
        """A QTensor of this (n, dim) one's rows at the 1-D integer `ids`, bytes copied unchanged
        (lc's index_select over the (n, row bytes) u8 view): e.g. undoing the row permutation
        llama.cpp's converter applies to attn_q / attn_k."""
        from .tensor import tensor
        from .tensor_interop import _buffer_tensor
        if self.rank != 2:
            raise ShapeMismatch(f"take_rows: needs a (n, dim) QTensor, got shape {self.shape}")
        ids_t = ids if isinstance(ids, Tensor) else tensor(np.asarray(ids, np.int64))
        rows = _buffer_tensor(self.buffer(), D.u8, (self.shape[0], self.nbytes // max(self.shape[0], 1)))
        got = rows.index_select(ids_t, 0).numpy()
        return QTensor(got, (got.shape[0], self.shape[1]), self.kind)

    def embedding(self, ids) -> Tensor:
        """Rows of this (n, dim) QTensor at integer `ids` (any shape) as f32: ids.shape + (dim,),
        dequantizing only those rows (an embedding table kept in blocks, like llama.cpp's
        token_embd).  Eager: each row is one call of the dequantize kernel."""
        from .codegen import quantize as Q
        from .errors import IndexOutOfBounds
        from .runtime import buffers
        from .tensor_interop import _buffer_tensor
        import ctypes
        if self.rank != 2:
            raise ShapeMismatch(f"embedding: needs a (n, dim) QTensor, got shape {self.shape}")
        ids_np = np.asarray(ids.numpy() if isinstance(ids, Tensor) else ids)
        if ids_np.dtype.kind not in "iu":
            raise UnsupportedDTypeForOp(f"embedding: ids must be integers, got {ids_np.dtype}")
        n, dim = self.shape
        flat = ids_np.reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            bad = flat[(flat < 0) | (flat >= n)][0]
            raise IndexOutOfBounds(f"embedding: id {bad} out of range for {n} rows ({self.kind} {self.shape})")
        f = self.format
        per_row = dim // f.block
        out = buffers.alloc(flat.size * dim, D.f32)
        _, fn = Q.kernel(f.name, False)
        sizes = np.zeros(1, np.int64)
        base, wa = buffers.address(out), buffers.address(self._buf)
        for i, r in enumerate(flat.tolist()):
            ptrs = (ctypes.c_void_p * 2)(base + (i * dim - r * per_row * f.block) * 4, wa)
            fn(ctypes.addressof(ptrs), sizes.ctypes.data, None, r * per_row, (r + 1) * per_row)
        return _buffer_tensor(out, D.f32, ids_np.shape + (dim,))

    def __reduce__(self):
        return QTensor, (self._buf.tobytes(), self.shape, self.kind)

    def __repr__(self):
        return f"QTensor[{self.kind}, shape={self.shape}, {self.nbytes} bytes]"


def quantize(t, kind) -> QTensor:
    """`t` (a float tensor, or anything lc.tensor takes) packed into GGML `kind` blocks along its
    last dim, with llama.cpp's reference rounding (the bytes `llama-quantize` writes)."""
    from .codegen import quantize as Q
    from .runtime import qsteps
    from .tensor import tensor
    f = _format(kind, "quantize")
    if not isinstance(t, Tensor):
        t = tensor(np.asarray(t, np.float32)) if not isinstance(t, np.ndarray) or t.dtype.kind == "f" else tensor(t)
    if not t.dtype.is_float:
        raise UnsupportedDTypeForOp(f"quantize: needs a float tensor, got {t.dtype.name} {t.shape}")
    _check_shape(t.shape, f, "quantize")
    x = np.ascontiguousarray(t.to_dtype(D.f32).numpy()).reshape(-1)
    nblocks = x.size // f.block
    out = np.empty(nblocks * f.nbytes, np.uint8)
    spec, fn = Q.kernel(f.name, True)
    qsteps.run(fn, [out, x], (nblocks,), nblocks, spec.cost((1,)))
    return QTensor(out, t.shape, f.name)


# ---- qmatmul ----------------------------------------------------------------------------------
_PATHS = ("auto", "int8", "int8-avx2", "int8-generic", "f32")
_path = [os.environ.get("LAZYCANDLE_QMATMUL", "auto")]
if _path[0] not in _PATHS:
    _path[0] = "auto"


def set_qmatmul_path(name: str) -> None:
    """Force qmatmul's kernels: "int8" (int8 activations; vpdpbusd on VNNI hosts, pmaddubsw on
    AVX2 ones), "int8-avx2" (pmaddubsw even where VNNI is), "int8-generic" (the same sums without
    x86 intrinsics), "f32" (dequantize in registers, exact f32 products) or "auto" (the measured
    choice: int8).  Also LAZYCANDLE_QMATMUL."""
    if name not in _PATHS:
        raise ValueError(f"set_qmatmul_path: unknown path {name!r} (known: {', '.join(_PATHS)})")
    _path[0] = name


def get_qmatmul_path() -> str:
    return _path[0]


def _choose(m: int):
    """(path, isa) for m activation rows."""
    from .codegen import jit
    name = _path[0]
    if name == "auto":
        name = "int8"
    if name == "f32":
        return "f32", "none"
    if name == "int8-generic" or not jit.has_feature("avx2"):
        return "int8", "generic"
    vnni = jit.has_feature("avxvnni") or (jit.has_feature("avx512vnni") and jit.has_feature("avx512vl"))
    return "int8", "vnni" if vnni and name == "int8" else "avx2"


_TILES = {}        # tests / benches may override (m == 1, block 256?) -> (mt, nt)


def _tile(m: int, f: QFormat):
    """(activation rows, weight rows) per kernel tile.  Measured here (bench/qmatmul.py): more
    than one weight row per tile never won, and k-quant tiles of 2+ weight rows spill badly.
    A named (run-time) row count takes the multi-row tile; the node also carries m = 1's tile,
    which the step takes when the count binds to 1 (batch-1 decode of a batch-generic program)."""
    one = isinstance(m, int) and m == 1
    key = (one, f.block == 256)
    if key in _TILES:
        return _TILES[key]
    return (1, 1) if one else (4, 1)


def qmatmul(x, qw: QTensor) -> Tensor:
    """x @ qw.dequantize().T for qw of shape (out, in), computed from the blocks (candle's
    QMatMul::forward): a lazy node (op qmatmul, step in runtime/qsteps.py) like any other, so it
    sits in graphs, programs and jit.  x: float (..., in); the result has x's leading dims and,
    for f32 x, dtype f32 (other float dtypes: computed in f32, returned in x's dtype)."""
    from .ir import ops_model  # noqa: F401  (registers qmatmul)
    from .ir.node import Node
    from .runtime import qsteps  # noqa: F401  (registers its step)
    if not isinstance(qw, QTensor):
        raise TypeError(f"qmatmul: the weight must be a QTensor, got {type(qw).__name__}")
    if not isinstance(x, Tensor):
        raise TypeError(f"qmatmul: x must be a Tensor, got {type(x).__name__}")
    if not x.dtype.is_float:
        raise UnsupportedDTypeForOp(f"qmatmul: needs a float input, got {x.dtype.name} {x.shape}")
    if qw.rank != 2 or x.rank < 1 or x.shape[-1] != qw.shape[1]:
        raise ShapeMismatch(f"qmatmul: x {x.shape} @ ({qw.kind} weight {qw.shape}).T: need x's last dim "
                            f"== the weight's in dim (weight shape (out, in))")
    N, K = qw.shape
    lead = x.shape[:-1]
    m = prod(lead)
    xc = x.to_dtype(D.f32).contiguous().materializable()
    path, isa = _choose(m)
    mt, nt = _tile(m, qw.format)
    one = _tile(1, qw.format) if not isinstance(m, int) else (mt, nt)     # a named m bound to 1 at run
    src = xc._node
    if path == "int8":
        src = Node("qmatmul_act", (src,), (K,), lead + (K + K // 4,), D.u8, label="qmatmul int8 activations")
    res = Tensor(Node("qmatmul", (src, qw.node()), (qw.kind, N, K, path, isa, mt, nt, one), lead + (N,), D.f32,
                      label=f"qmatmul {qw.kind} {path}"))
    return res if x.dtype is D.f32 else res.to_dtype(x.dtype)
