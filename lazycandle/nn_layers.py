"""Layers (candle-nn / torch.nn): Linear, Embedding, LayerNorm, RmsNorm, Conv1d, Conv2d, and
where their weights come from: a VarBuilder over safetensors checkpoints (read lazily, one tensor
at a time, recording which names were used) or over a VarMap of trainable Vars.

A layer built without a VarBuilder gets fresh trainable Vars with torch's initialisation
(kaiming-uniform for Linear/Conv, N(0, 1) for Embedding, ones/zeros for norms).  Forward passes
are the functional ops of lc.nn: no new math here."""
from __future__ import annotations

import math
import os

from . import dtype as D
from .errors import SerializationError, ShapeMismatchBinaryOp
from .tensor import Tensor, full, rand, randn


# ---- initialisers: callables (shape, dtype) -> Tensor -----------------------------------
def uniform_init(bound):
    return lambda shape, dtype: rand(-bound, bound, shape, dtype)


def normal_init(std=1.0):
    return lambda shape, dtype: randn(0.0, std, shape, dtype)


def const_init(value):
    return lambda shape, dtype: full(value, shape, dtype)


# ---- VarMap: named trainable Vars ---------------------------------------------------------
class VarMap:
    """Named trainable Vars (candle-nn's VarMap): `get` makes a Var on first use; `save` /
    `load` write and read them as safetensors."""

    def __init__(self):
        self._vars: dict = {}

    def get(self, shape, name, init=None, dtype=D.f32) -> Tensor:
        from .autograd import Var
        shape = tuple(shape)
        v = self._vars.get(name)
        if v is None:
            init = init or const_init(0)
            v = self._vars[name] = Var(init(shape, D.as_dtype(dtype)))
        elif tuple(v.shape) != shape:
            raise ShapeMismatchBinaryOp(f"VarMap.get: {name!r} has shape {tuple(v.shape)}, asked for {shape}")
        return v

    def all_vars(self) -> list:
        return list(self._vars.values())

    def data(self) -> dict:
        return dict(self._vars)

    def __len__(self):
        return len(self._vars)

    def __contains__(self, name):
        return name in self._vars

    def save(self, path) -> None:
        from .serialization import save_safetensors
        save_safetensors(dict(self._vars), path)

    def load(self, path) -> None:
        """Set every Var from the file (shape and dtype must match); names the map does not
        have yet become new Vars."""
        from .autograd import Var, _replace_var
        from .serialization import load_safetensors
        for name, t in load_safetensors(path).items():
            v = self._vars.get(name)
            if v is None:
                self._vars[name] = Var(t)
                continue
            if tuple(t.shape) != tuple(v.shape) or t.dtype is not v.dtype:
                raise SerializationError(f"{os.fspath(path)}: tensor {name!r}: {t.dtype.name} {tuple(t.shape)} "
                                         f"does not match the VarMap's {v.dtype.name} {tuple(v.shape)}")
            _replace_var(v, t.copy().realize()._node)


# ---- VarBuilder -----------------------------------------------------------------------------
class _Files:
    """Safetensors shards as one name space (each name in exactly one file), mapped lazily."""

    def __init__(self, paths):
        from .serialization import MappedSafetensors
        self.files = [MappedSafetensors(p) for p in paths]
        self.where: dict = {}
        for f in self.files:
            for name in f.names():
                if name in self.where:
                    raise SerializationError(f"{f.path}: tensor {name!r}: also in {self.where[name].path}")
                self.where[name] = f
        self.used: set = set()

    def describe(self) -> str:
        return ", ".join(f.path for f in self.files)


class VarBuilder:
    """Where a model's tensors come from (candle-nn's VarBuilder): `vb.pp("encoder")` scopes
    names, `vb.get(shape, "weight")` returns the tensor (checked).  Over safetensors files the
    tensors are mapped, not copied, and converted to `dtype` when one is given; over a VarMap
    `get` creates trainable Vars with the layer's initialiser."""

    def __init__(self, source, prefix: str = "", dtype=None):
        self._src = source
        self.prefix = prefix
        self.dtype = None if dtype is None else D.as_dtype(dtype)

    @classmethod
    def from_safetensors(cls, paths, dtype=None) -> "VarBuilder":
        if isinstance(paths, (str, os.PathLike)):
            paths = [paths]
        return cls(_Files([os.fspath(p) for p in paths]), "", dtype)

    @classmethod
    def from_varmap(cls, varmap: VarMap, dtype=D.f32) -> "VarBuilder":
        return cls(varmap, "", dtype)

    def pp(self, prefix) -> "VarBuilder":
        return VarBuilder(self._src, self._path(str(prefix)), self.dtype)

    push_prefix = pp

    def _path(self, name) -> str:
        return f"{self.prefix}.{name}" if self.prefix else name

    @property
    def is_trainable(self) -> bool:
        return isinstance(self._src, VarMap)

    def contains(self, name) -> bool:
        src = self._src
        return self._path(name) in (src if isinstance(src, VarMap) else src.where)

    contains_tensor = contains

    def get(self, shape, name, init=None) -> Tensor:
        """The tensor `prefix.name`, which must have `shape`; SerializationError names a missing
        or mis-shaped tensor and the file(s)."""
        shape, full = tuple(shape), self._path(name)
        if isinstance(self._src, VarMap):
            return self._src.get(shape, full, init, self.dtype or D.f32)
        f = self._src.where.get(full)
        if f is None:
            raise SerializationError(f"{self._src.describe()}: tensor {full!r}: missing "
                                     f"(the model needs shape {shape})")
        if f.shape(full) != shape:
            raise SerializationError(f"{f.path}: tensor {full!r}: shape {f.shape(full)} but the model needs {shape}")
        return self._load(f, full)

    def get_unchecked(self, name) -> Tensor:
        """The tensor `prefix.name` whatever its shape (missing: SerializationError)."""
        full = self._path(name)
        if isinstance(self._src, VarMap):
            if full not in self._src:
                raise SerializationError(f"VarMap: tensor {full!r}: missing")
            return self._src.data()[full]
        f = self._src.where.get(full)
        if f is None:
            raise SerializationError(f"{self._src.describe()}: tensor {full!r}: missing")
        return self._load(f, full)

    def _load(self, f, full) -> Tensor:
        self._src.used.add(full)
        t = f.tensor(full)
        if self.dtype is not None and t.dtype.is_float and t.dtype is not self.dtype:
            t = t.to_dtype(self.dtype).realize()
        return t

    def names(self) -> list:
        """Every tensor name under this builder's prefix (full names)."""
        src = self._src
        names = src.data() if isinstance(src, VarMap) else src.where
        p = self.prefix + "." if self.prefix else ""
        return [n for n in names if n.startswith(p)]

    def mark_used(self, name) -> None:
        """Count `prefix.name` as used without loading it (a tensor the model knows it may ignore)."""
        if not isinstance(self._src, VarMap):
            self._src.used.add(self._path(name))

    def unused(self) -> list:
        """Names of the checkpoint that no get() has asked for (sorted); [] over a VarMap."""
        if isinstance(self._src, VarMap):
            return []
        return sorted(set(self._src.where) - self._src.used)

    def file_of(self, name) -> str:
        """The file holding full name `name` (for error messages)."""
        src = self._src
        return "VarMap" if isinstance(src, VarMap) else src.where[name].path


# ---- layers -----------------------------------------------------------------------------
class Module:
    """Base of layers and models: parameters are the Tensor attributes named in PARAMS, and
    those of sub-Modules (attributes, or lists / tuples of them), named like torch."""
    PARAMS: tuple = ()

    def named_parameters(self, prefix: str = ""):
        for key, val in vars(self).items():
            name = f"{prefix}{key}"
            if key in self.PARAMS and isinstance(val, Tensor):
                yield name, val
            elif isinstance(val, Module):
                yield from val.named_parameters(name + ".")
            elif isinstance(val, (list, tuple)):
                for i, m in enumerate(val):
                    if isinstance(m, Module):
                        yield from m.named_parameters(f"{name}.{i}.")

    def parameters(self) -> list:
        return [p for _, p in self.named_parameters()]

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


def _builder(vb, dtype) -> VarBuilder:
    return vb if vb is not None else VarBuilder.from_varmap(VarMap(), dtype or D.f32)


class Linear(Module):
    """y = x @ weight.T + bias; weight (out_dim, in_dim) like torch and candle."""
    PARAMS = ("weight", "bias")

    def __init__(self, in_dim, out_dim, bias=True, *, vb=None, dtype=None):
        vb = _builder(vb, dtype)
        bound = 1.0 / math.sqrt(in_dim) if in_dim else 0.0
        self.weight = vb.get((out_dim, in_dim), "weight", uniform_init(bound))
        self.bias = vb.get((out_dim,), "bias", uniform_init(bound)) if bias else None

    @classmethod
    def from_weights(cls, weight, bias=None) -> "Linear":
        """candle's Linear::new(weight, bias)."""
        self = cls.__new__(cls)
        self.weight, self.bias = weight, bias
        return self

    def forward(self, x):
        from .nn import linear
        if x.rank == 2:
            return linear(x, self.weight, self.bias)
        # (..., in) as one (rows, in) matmul: the bias and what follows fuse into the GEMM's
        # epilogue (a batched matmul's consumer reads it through a view, a kernel of its own);
        # an unbatched (in,) input is one row, as in torch
        y = linear(x.reshape((-1, x.shape[-1])), self.weight, self.bias)
        return y.reshape(x.shape[:-1] + (self.weight.shape[0],))


class QLinear(Module):
    """y = x @ qweight.dequantize().T + bias with the weight kept in GGML blocks (a QTensor of
    shape (out, in); lc.qmatmul reads the blocks), the bias a float tensor: llama.cpp's and
    candle's quantized linear layer."""
    PARAMS = ("bias",)

    def __init__(self, qweight, bias=None):
        from .qtensor import QTensor
        if not isinstance(qweight, QTensor) or qweight.rank != 2:
            raise TypeError(f"QLinear: the weight must be a (out, in) QTensor, got {qweight!r}")
        if bias is not None and tuple(bias.shape) != (qweight.shape[0],):
            raise ShapeMismatchBinaryOp(f"QLinear: bias {tuple(bias.shape)} for a weight of {qweight.shape[0]} rows")
        self.qweight, self.bias = qweight, bias

    @classmethod
    def from_linear(cls, linear: Linear, kind: str) -> "QLinear":
        """`linear`'s weight packed into `kind` blocks (its bias kept as it is)."""
        from .qtensor import quantize
        return cls(quantize(linear.weight, kind), linear.bias)

    def forward(self, x):
        from .qtensor import qmatmul
        # (..., in) as (rows, in) like Linear: the bias joins the result's rows
        y = qmatmul(x if x.rank == 2 else x.reshape((-1, x.shape[-1])), self.qweight)
        if self.bias is not None:
            y = y.broadcast_add(self.bias if self.bias.dtype is y.dtype else self.bias.to_dtype(y.dtype))
        return y if x.rank == 2 else y.reshape(x.shape[:-1] + (self.qweight.shape[0],))


def quantize_linears(module: Module, kind=None) -> int:
    """Swap every Linear under `module` (attributes, lists of modules) for a QLinear in place:
    a Linear already holding a QTensor weight keeps it; with `kind` a float one whose in-dim is
    a whole number of `kind` blocks is quantized (others stay float).  Returns the count."""
    from .qtensor import QTensor, _format
    block = _format(kind, "quantize_linears").block if kind is not None else None
    count = 0

    def swap(m):
        nonlocal count
        if not isinstance(m, Linear):
            if isinstance(m, Module):
                count += quantize_linears(m, kind)
            return m
        if isinstance(m.weight, QTensor):
            count += 1
            return QLinear(m.weight, m.bias)
        if block is not None and m.weight.shape[1] % block == 0 and m.weight.dtype.is_float:
            count += 1
            return QLinear.from_linear(m, kind)
        return m
    for key, val in list(vars(module).items()):
        if isinstance(val, Module):
            setattr(module, key, swap(val))
        elif isinstance(val, (list, tuple)) and any(isinstance(v, Module) for v in val):
            setattr(module, key, type(val)(swap(v) for v in val))
    return count


class Embedding(Module):
    """Rows of weight (n, dim) at integer ids."""
    PARAMS = ("weight",)

    def __init__(self, n, dim, padding_idx=None, *, vb=None, dtype=None):
        init = normal_init(1.0)
        if padding_idx is not None:         # torch: that row starts at zero
            if not -n <= padding_idx < n:
                raise ValueError(f"Embedding: padding_idx {padding_idx} is outside [-{n}, {n})")
            row, normal = padding_idx % n, init
            init = lambda shape, dt: normal(shape, dt).slice_assign(  # noqa: E731
                [slice(row, row + 1)], full(0.0, (1, shape[1]), dt))
        self.padding_idx = padding_idx
        self.weight = _builder(vb, dtype).get((n, dim), "weight", init)

    @classmethod
    def from_weights(cls, weight) -> "Embedding":
        self = cls.__new__(cls)
        self.weight = weight
        return self

    def forward(self, ids):
        from .nn import embedding
        return embedding(ids, self.weight)


class LayerNorm(Module):
    """Layer norm over the last dim (weight ones, bias zeros, like torch)."""
    PARAMS = ("weight", "bias")

    def __init__(self, dim, eps=1e-5, elementwise_affine=True, bias=True, *, vb=None, dtype=None):
        if isinstance(dim, (tuple, list)):
            if len(dim) != 1:
                raise ValueError(f"LayerNorm: only the last dim is normalised, got normalized_shape {tuple(dim)}")
            dim = dim[0]
        vb = _builder(vb, dtype)
        self.eps = eps
        self.weight = vb.get((dim,), "weight", const_init(1)) if elementwise_affine else None
        self.bias = vb.get((dim,), "bias", const_init(0)) if elementwise_affine and bias else None

    @classmethod
    def from_weights(cls, weight, bias=None, eps=1e-5) -> "LayerNorm":
        self = cls.__new__(cls)
        self.weight, self.bias, self.eps = weight, bias, eps
        return self

    def forward(self, x):
        from .nn import layer_norm
        return layer_norm(x, self.weight, self.bias, self.eps)


class RmsNorm(Module):
    """x / rms(x) * weight over the last dim (weight ones)."""
    PARAMS = ("weight",)

    def __init__(self, dim, eps=1e-5, *, vb=None, dtype=None):
        self.eps = eps
        self.weight = _builder(vb, dtype).get((dim,), "weight", const_init(1))

    @classmethod
    def from_weights(cls, weight, eps=1e-5) -> "RmsNorm":
        self = cls.__new__(cls)
        self.weight, self.eps = weight, eps
        return self

    def forward(self, x):
        from .nn import rms_norm
        return rms_norm(x, self.weight, self.eps)


def _tuple(op, name, v, n):
    v = (v,) * n if isinstance(v, int) else tuple(v)
    if len(v) != n or not all(isinstance(i, int) and i >= 0 for i in v):
        raise ValueError(f"{op}: {name} must be an int or {n} non-negative ints, got {v!r}")
    return v


class _ConvNd(Module):
    PARAMS = ("weight", "bias")
    N = 0

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, padding_mode="zeros", *, vb=None, dtype=None):
        op, n = type(self).__name__, self.N
        if padding_mode != "zeros":
            raise ValueError(f"{op}: padding_mode {padding_mode!r} is not supported (only 'zeros')")
        if groups <= 0 or in_channels % groups or out_channels % groups:
            raise ValueError(f"{op}: {in_channels} in and {out_channels} out channels are not divisible "
                             f"into {groups} groups")
        self.kernel_size = _tuple(op, "kernel_size", kernel_size, n)
        self.stride = _tuple(op, "stride", stride, n)
        self.dilation = _tuple(op, "dilation", dilation, n)
        self.padding = self._padding(op, padding)
        self.groups = groups
        vb = _builder(vb, dtype)
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
        self.weight = vb.get((out_channels, in_channels // groups) + self.kernel_size, "weight", uniform_init(bound))
        self.bias = vb.get((out_channels,), "bias", uniform_init(bound)) if bias else None

    def _padding(self, op, padding):
        if padding == "valid":
            return (0,) * self.N
        if padding == "same":
            if any(s != 1 for s in self.stride):
                raise ValueError(f"{op}: padding='same' needs stride 1, got {self.stride}")
            total = [d * (k - 1) for d, k in zip(self.dilation, self.kernel_size)]
            if any(t % 2 for t in total):
                raise ValueError(f"{op}: padding='same' with kernel {self.kernel_size} and dilation "
                                 f"{self.dilation} needs uneven padding, which is not supported")
            return tuple(t // 2 for t in total)
        return _tuple(op, "padding", padding, self.N)

    def forward(self, x):
        unbatched = x.rank == self.N + 1
        if unbatched:
            x = x.unsqueeze(0)
        y = self._conv(x)
        if self.bias is not None:
            y = y.broadcast_add(self.bias.reshape((1, -1) + (1,) * self.N))
        return y.squeeze(0) if unbatched else y


class Conv1d(_ConvNd):
    """torch.nn.Conv1d: input (b, c_in, l) or (c_in, l); weight (c_out, c_in/groups, k)."""
    N = 1

    def _conv(self, x):
        return x.conv1d(self.weight, self.padding[0], self.stride[0], self.dilation[0], self.groups)


class Conv2d(_ConvNd):
    """torch.nn.Conv2d: input (b, c_in, h, w) or (c_in, h, w); weight (c_out, c_in/groups, kh, kw)."""
    N = 2

    def _conv(self, x):
        return x.conv2d(self.weight, self.padding, self.stride, self.dilation, self.groups)
