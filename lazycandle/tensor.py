"""The public lazy Tensor.  Ops never compute: each adds an ir.Node (checking shapes and
dtypes at the user's line).  `realize` / `numpy()` hand the unrealized part of the graph to the
runtime, which compiles (or fetches from cache) fused kernels and runs them."""
from __future__ import annotations

from math import prod

import numpy as np

from . import dtype as D, named_dims
from .sizes import Size, size_max
from .compiler import realize_nodes
from .dtype import DType, as_dtype
from .errors import ShapeMismatch, UnsupportedDType, UnsupportedDTypeForOp, UnboundPlaceholder
from .ir.node import Node
from .layout import as_shape
from .tensor_math import MathMixin, const_node
from .tensor_views import ViewMixin
from .tensor_reduce import ReduceMixin
from .tensor_matmul import MatmulMixin
from .tensor_index import IndexMixin
from .tensor_conv_transpose import ConvTransposeMixin
from .tensor_interop import InteropMixin, from_dlpack
from .tensor_model import ModelMixin
from .tensor_model_ops import ModelOpsMixin
from .tensor_extras import ExtrasMixin


class Device:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"lc.{self.name}"


cpu = Device("cpu")


def _as_shape(shape, op) -> tuple:
    return as_shape(shape, op, ShapeMismatch)


class Tensor(ViewMixin, MathMixin, ReduceMixin, MatmulMixin, IndexMixin, ConvTransposeMixin, InteropMixin, ModelMixin,
             ModelOpsMixin, ExtrasMixin):
    """A lazy n-d array.  Metadata never computes; `numpy()`, `item()`, `to_list()` and
    `realize()` do."""
    __slots__ = ("_node", "__weakref__")
    __array_ufunc__ = None      # NumPy operators defer to ours: ndarray + Tensor is a Tensor
    __hash__ = object.__hash__  # == builds a tensor; hashing stays by identity (dict keys)

    def __init__(self, node: Node):
        self._node = node

    # ---- metadata (never realizes) ----------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._node.shape

    dims = shape

    @property
    def rank(self) -> int:
        return len(self._node.shape)

    ndim = rank

    @property
    def dtype(self) -> DType:
        return self._node.dtype

    @property
    def elem_count(self) -> int:
        return prod(self._node.shape)

    @property
    def device(self):
        return cpu

    @property
    def is_lazy(self) -> bool:
        return not self._node.realized

    def __repr__(self):
        state = "lazy" if self.is_lazy else "realized"
        return f"Tensor[{state}, shape={self.shape}, dtype={self.dtype.name}]"

    def __len__(self):
        """The first dim (Python's len() takes ints only: of a named dim it raises
        lc.SymbolicSizeError; `t.shape[0]` or `t.__len__()` give the lc.Size)."""
        if not self.shape:
            raise TypeError("len() of a rank-0 tensor")
        return self.shape[0]

    # ---- realizing --------------------------------------------------------------------
    def realize(self) -> "Tensor":
        realize_nodes([self._node])
        return self


# ---- creation -------------------------------------------------------------------------
def _from_array(arr: np.ndarray, dtype: DType) -> Tensor:
    """A realized tensor holding a row-major copy of `arr` as `dtype` (creation: NumPy copies)."""
    from .runtime.buffers import alloc
    buf = alloc(arr.size, dtype)
    np.copyto(buf.reshape(arr.shape), arr, casting="unsafe")
    return Tensor(Node("buffer", (), None, arr.shape, dtype, buffer=buf))


def tensor(data, dtype=None) -> Tensor:
    """From a numpy array, nested lists or a scalar (copies).  Python floats -> f32, ints -> i64,
    bools -> u8, unless `dtype` is given."""
    dtype = None if dtype is None else as_dtype(dtype)
    if isinstance(data, Tensor):
        return data.to_dtype(dtype) if dtype is not None and dtype is not data.dtype else data.copy()
    if isinstance(data, np.ndarray) or isinstance(data, np.generic):
        arr = np.asarray(data)
        if arr.dtype.kind in "OUSVcM m" and D._BY_NUMPY.get(arr.dtype) is None:
            raise UnsupportedDType(f"tensor: numpy dtype {arr.dtype} has no lazycandle equivalent")
        if dtype is None:
            dtype = D.DType.from_numpy(arr.dtype)
        return _from_array(arr, dtype)
    try:
        arr = np.asarray(data)
    except (ValueError, TypeError) as e:
        raise UnsupportedDType(f"tensor: cannot build a tensor from {type(data).__name__}: {e}") from None
    if dtype is None:
        kind = arr.dtype.kind
        if kind == "f":
            dtype = D.f32
        elif kind in "iu":
            dtype = D.i64
        elif kind == "b":
            dtype = D.u8
        else:
            raise UnsupportedDType(f"tensor: values of numpy kind {arr.dtype} have no lazycandle dtype")
    elif arr.dtype.kind not in "fiub":
        raise UnsupportedDType(f"tensor: values of numpy kind {arr.dtype} have no lazycandle dtype")
    return _from_array(arr, dtype)


def from_numpy(arr, dtype=None) -> Tensor:
    return tensor(arr, dtype)


Tensor.from_numpy = staticmethod(from_numpy)


def full(value, shape, dtype=D.f32) -> Tensor:
    """A lazy constant: one scalar node broadcast to `shape` (nothing is allocated until used).
    torch / NumPy's order `full(shape, value)` is accepted too when the first argument is a
    shape (a tuple or list)."""
    if isinstance(value, (tuple, list)) and not isinstance(shape, (tuple, list)):
        value, shape = shape, value
    return _full(value, shape, dtype, "full")


def _full(value, shape, dtype, op) -> Tensor:
    dtype = as_dtype(dtype)
    shape = _as_shape(shape, op)
    if dtype.storage_only:   # no lazy constants in a storage-only dtype: build the data now
        return _from_array(np.full(shape, float(value), np.float64).astype(dtype.numpy), dtype)
    c = const_node(value, dtype)
    if not shape:
        return Tensor(c)
    out = Tensor(c).broadcast_as(shape)
    checks = []
    for d in shape:
        if d.__class__ is Size:
            named_dims.require_ge0(checks, d, ShapeMismatch, f"{op}: negative size in shape {shape}")
    named_dims.require(out._node, checks, first=True)
    return out


def zeros(shape, dtype=D.f32) -> Tensor:
    return _full(0, shape, dtype, "zeros")


def ones(shape, dtype=D.f32) -> Tensor:
    return _full(1, shape, dtype, "ones")


def zeros_like(t: Tensor) -> Tensor:
    return zeros(t.shape, t.dtype)


def ones_like(t: Tensor) -> Tensor:
    return ones(t.shape, t.dtype)


def arange(start, end=None, step=1, dtype=D.i64) -> Tensor:
    if end is None:
        start, end = 0, start
    dtype = as_dtype(dtype)
    if step == 0:
        raise ValueError("arange: step must be nonzero")
    if any(v.__class__ is Size for v in (start, end, step)):
        return _named_arange(start, end, step, dtype)
    return _from_array(np.arange(start, end, step).astype(dtype.numpy), dtype)


def _named_arange(start, end, step, dtype) -> Tensor:
    """arange over sizes of named dims (`lc.arange(x.shape[0])` of a placeholder): the program
    computes it, as a running count of `step`s from `start` (integer bounds and step; a start
    or step that is a Size is a runtime scalar).  Its length is NumPy's, max(0, ceil((end -
    start) / step))."""
    for v in (start, end, step):
        if v.__class__ is not Size and not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"arange: over a size of named dims, start, end and step must be ints or sizes, "
                            f"got {v!r}")
    if step.__class__ is int and step < 0:
        n = size_max((start - end + (-step) - 1) // (-step), 0)
    else:
        n = size_max((end - start + step - 1) // step, 0)
    steps = _full(1, (n,), dtype, "arange").cumsum(0) - 1
    return steps * step + start if not (step.__class__ is int and step == 1) else steps + start


def randn(mean, std, shape, dtype=D.f32, seed=None) -> Tensor:
    dtype = as_dtype(dtype)
    _check_float_creation("randn", dtype)
    rng = np.random.default_rng(seed)
    return _from_array(rng.normal(mean, std, _as_shape(shape, "randn")).astype(dtype.numpy), dtype)


def rand(lo, hi, shape, dtype=D.f32, seed=None) -> Tensor:
    dtype = as_dtype(dtype)
    _check_float_creation("rand", dtype)
    rng = np.random.default_rng(seed)
    return _from_array(rng.uniform(lo, hi, _as_shape(shape, "rand")).astype(dtype.numpy), dtype)


def _check_float_creation(op, dtype):
    if not dtype.is_float:
        raise UnsupportedDTypeForOp(f"{op}: needs a float dtype, got {dtype.name}")


def placeholder(name: str, shape, dtype=D.f32) -> Tensor:
    """A named graph input, bound by Program.run(name=array).  A str in `shape` is a named
    size, bound at run (lazycandle/named_dims.py)."""
    shape = _as_shape(named_dims.placeholder_shape(shape), "placeholder")
    return Tensor(Node("placeholder", (), str(name), shape, as_dtype(dtype), label=str(name)))


def realize(*ts) -> tuple:
    """Realize several tensors in ONE compiled graph (shared work is computed once)."""
    if len(ts) == 1 and isinstance(ts[0], (list, tuple)):
        ts = tuple(ts[0])
    realize_nodes([t._node for t in ts])
    return ts


__all__ = ["Tensor", "tensor", "from_numpy", "full", "zeros", "ones", "zeros_like", "ones_like", "arange",
           "randn", "rand", "placeholder", "realize", "cpu", "from_dlpack", "UnboundPlaceholder"]
