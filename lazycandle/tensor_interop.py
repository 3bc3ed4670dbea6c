"""Where a Tensor meets NumPy and Python (SPEC "Realizing" and "Mixing with NumPy and Python").

  numpy() / np.asarray(t)   a read-only view of the tensor's buffer that cannot be made
                            writable again, so nothing done to it reaches the tensor, a tensor
                            built on it, or a constant baked into a compiled program
  np.array(t)               a writable copy (`__array__` follows NumPy 2's `copy` argument)
  __dlpack__ / from_dlpack  zero-copy DLPack export (flagged read-only; a consumer too old to
                            read that flag gets a copy) and import
  str / format              values NumPy-style with a `Tensor[shape=..., dtype=...]` line
                            (a large lazy view computes only the elements shown); repr stays
                            metadata-only (tensor.py)
  item / float / int / bool one-element tensors only
  iteration                 rank-(r-1) tensors along dim 0; a rank-0 tensor is not iterable
  pickling                  the realized data, its dtype and shape (a placeholder pickles as
                            a placeholder)
"""
from __future__ import annotations

from math import prod

import numpy as np

from .compiler import realize_nodes
from .errors import ShapeMismatch, UnboundPlaceholder
from .runtime.buffers import readonly


class NotOneElement(ShapeMismatch, TypeError):
    """A Python-scalar conversion of a tensor that does not hold exactly one element (a
    ShapeMismatch, and a TypeError like NumPy's)."""


class InteropMixin:
    __slots__ = ()

    # ---- arrays ---------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The data as a read-only ndarray of `dtype.numpy` with `shape` (no copy; use
        `np.array(t)` or `.copy()` for a writable one)."""
        n = self._node
        if n.buffer is None:
            realize_nodes([n])
        return readonly(n.buffer, n.shape)

    def to_list(self):
        return self.numpy().tolist()

    tolist = to_list

    def __array__(self, dtype=None, copy=None):
        """NumPy 2's protocol: copy=None gives the read-only view (a converted copy when
        `dtype` differs), copy=True a writable copy, copy=False raises when a copy is needed."""
        a = self.numpy()
        if dtype is not None and np.dtype(dtype) != a.dtype:
            if copy is False:
                raise ValueError(f"Unable to avoid a copy while converting a {self.dtype.name} tensor "
                                 f"{self.shape} to {np.dtype(dtype)}")
            return a.astype(dtype)
        return a.copy() if copy else a

    # ---- DLPack -------------------------------------------------------------------------
    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """NumPy's export of the read-only view (`dlpack.export` relabels it for the dtypes NumPy's
        DLPack cannot carry)."""
        a = self.numpy()
        if max_version is None or tuple(max_version) < (1, 0):
            # DLPack < 1.0 cannot say "read-only": such a consumer gets its own copy
            if copy is False:
                raise BufferError(f"__dlpack__: a {self.dtype.name} tensor is exported read-only, which a "
                                  f"DLPack consumer older than 1.0 cannot be told; pass copy=None or True")
            a = a.copy()
        from .dlpack import CODES, export
        if self.dtype in CODES:             # bf16, float8, ...: NumPy's DLPack cannot carry them
            return export(a, self.dtype, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)
        return a.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        return (1, 0)           # (kDLCPU, device 0)

    # ---- Python scalars ------------------------------------------------------------------
    def item(self):
        """The one element as a Python float (float dtypes) or int."""
        if self.elem_count != 1:
            raise NotOneElement(f"item: needs a one-element tensor, got shape {self.shape} ({self.dtype.name})")
        v = self.numpy().reshape(())[()]
        return float(v) if self.dtype.is_float else int(v)

    def __bool__(self):
        if self.elem_count != 1:
            raise NotOneElement(f"the truth value of a tensor with shape {self.shape} is ambiguous")
        return bool(self.item())

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    # ---- text ----------------------------------------------------------------------------
    def __str__(self):
        """The values NumPy-style (summarised when large; realizes the tensor), then a
        `Tensor[shape=..., dtype=...]` line.  A graph over unbound placeholders shows repr."""
        try:
            if self.is_lazy and self._node.op.category == "view" \
                    and self.elem_count > np.get_printoptions()["threshold"]:
                body = np.array2string(_shown_part(self), threshold=0)
            else:
                body = np.array2string(self.numpy())
        except UnboundPlaceholder:
            return repr(self)
        return f"{body}\nTensor[shape={self.shape}, dtype={self.dtype.name}]"

    def __format__(self, spec):
        if not spec:
            return str(self)
        if self.elem_count != 1:
            raise NotOneElement(f"format: spec {spec!r} needs a one-element tensor, got shape {self.shape} "
                                f"({self.dtype.name})")
        return format(self.item(), spec)

    # ---- iteration -----------------------------------------------------------------------
    def __iter__(self):
        if not self.shape:
            raise TypeError(f"iteration over a 0-d tensor ({self.dtype.name})")
        return (self[i] for i in range(self.shape[0]))

    # ---- pickling ------------------------------------------------------------------------
    def __reduce__(self):
        n = self._node
        if n.op.name == "placeholder":
            from .tensor import placeholder
            return placeholder, (n.arg, n.shape, n.dtype)
        return rebuild_tensor, (self.numpy().tobytes(), self.dtype, self.shape)


def _shown_part(t) -> np.ndarray:
    """The elements NumPy's summary of `t` shows: along each long dim the first `edgeitems`,
    one stand-in for the elided middle, and the last `edgeitems`.  Printed with threshold=0 it
    reads exactly as the summary of the whole, without computing a lazy view (a broadcast
    constant can be far larger than memory) in full."""
    from .tensor_index import cat
    edge = np.get_printoptions()["edgeitems"]
    for d, size in enumerate(t.shape):
        if size > 2 * edge + 1:
            t = cat([t.narrow(d, 0, edge + 1), t.narrow(d, size - edge, edge)], d)
    return t.numpy()


def rebuild_tensor(data: bytes, dtype, shape):
    """A realized tensor holding the raw bytes `data` (the inverse of Tensor.__reduce__)."""
    from .runtime.buffers import alloc
    buf = alloc(prod(shape), dtype)
    buf.view(np.uint8)[:] = np.frombuffer(data, np.uint8)
    return _buffer_tensor(buf, dtype, shape)


def _buffer_tensor(buf, dtype, shape):
    from .ir.node import Node
    from .tensor import Tensor
    return Tensor(Node("buffer", (), None, tuple(shape), dtype, buffer=buf))


def from_dlpack(x):
    """A tensor over the memory of any DLPack producer (`__dlpack__`), without a copy when the
    data is row-major; otherwise (or for big-endian data) the data is copied.  Like every
    zero-copy import, later writes by the producer show in the tensor.  NumPy reads the capsule;
    the dtypes it cannot (bf16, float8, ...) are read by `dlpack.to_numpy`."""
    from .dlpack import to_numpy
    from .dtype import DType
    from .tensor import Tensor, tensor
    if isinstance(x, Tensor):
        return x
    try:
        arr = np.from_dlpack(x)
    except (RuntimeError, BufferError):     # a dtype NumPy's DLPack cannot carry (bf16, float8, ...)
        arr = to_numpy(x)
    dtype = DType.from_numpy(arr.dtype)
    if arr.dtype == np.bool_:
        arr = arr.view(np.uint8)
    if not (arr.flags.c_contiguous and arr.dtype.isnative):
        return tensor(arr, dtype)
    return _buffer_tensor(arr.reshape(-1), dtype, arr.shape)
