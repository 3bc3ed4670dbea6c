"""lazycandle: a graph-compiled lazy tensor engine (candle-like API, fused LLVM kernels)."""
from .dtype import DType, u8, u32, i16, i32, i64, bf16, f16, f32, f64, f8e4m3, f6e2m3, f6e3m2, f4, f8e8m0
from .errors import (Error, DTypeMismatchBinaryOp, UnsupportedDTypeForOp, UnsupportedDType, ShapeMismatchBinaryOp,
                     BroadcastIncompatibleShapes, ShapeMismatch, DimOutOfRange, NarrowInvalidArgs, IndexOutOfBounds,
                     EmptyReduction, UnboundPlaceholder, FeedError, SerializationError, SchedulerError,
                     SymbolicSizeError)
from .sizes import Size
from .tensor import (Tensor, tensor, from_numpy, full, zeros, ones, zeros_like, ones_like, arange, randn, rand,
                     placeholder, realize, cpu, from_dlpack)
from .tensor_index import cat, stack
from .functions import *  # noqa: F401,F403  (lc.exp(t) & co., where, matmul, eye, linspace, tril, triu)
from . import nn
from .autograd import Var, GradStore, grad, value_and_grad, no_grad
from . import optim
from .graph_api import compile, Program, jit, dump
from .caches import clear_caches, cache_info
from .config import get_num_threads, set_num_threads, num_threads, set_matmul_backend, get_matmul_backend
from .qtensor import QTensor, quantize, qmatmul

__version__ = "0.1.0"


_SERIALIZATION = ("save_safetensors", "load_safetensors", "load_safetensors_metadata", "save_npz", "load_npz")
_GGUF = ("load_gguf", "save_gguf")


def __getattr__(name):
    """`lc.dask`, `lc.models` and the file formats (`lc.save_safetensors` & co.: serialization.py and json)
    are imported on first use, so `import lazycandle` never imports dask and stays short."""
    import importlib
    if name in ("dask", "models"):
        return importlib.import_module("." + name, __name__)
    if name in _SERIALIZATION:
        return getattr(importlib.import_module(".serialization", __name__), name)
    if name in _GGUF:
        return getattr(importlib.import_module(".gguf", __name__), name)
    raise AttributeError(f"module 'lazycandle' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SERIALIZATION) | {"dask", "models"})
