"""LLVM kernels of the index / data-movement ops (ABI of every kernel: `void k(i8** ptrs, i64 lo,
i64 hi)` over a range of independent units, split with pool.parallel_for).

* `IndexSpec` -- index_select, gather, scatter, scatter_add, index_add.  The iteration space is
  the shape S of the values moved (the output for the gather family, src for the scatter
  family), split as (outer dims, mid = the indexed dim, inner = the last dim after it).  A unit
  is one outer position times one block of the inner dim; it loops over mid sequentially, so
  every output element is written by exactly one unit, in the same order whatever the thread
  count (duplicate ids accumulate deterministically).  The scatter family first copies its
  slice of `t` into the output (same unit, so no cross-thread ordering is needed).
  Every id is checked (`id <u bound`: negative i64 ids are huge unsigned values); a bad id
  skips its access and the first one a unit meets is recorded in a status word
  (i64 flag set by cmpxchg, i64 id) that the runtime turns into IndexOutOfBounds.
* `CopySpec` -- a strided copy into a strided destination (cat's pieces).
* `Im2colSpec` -- convolution patches (b, c, kh, kw, oh, ow) read through the input's strides,
  zeros where the window lies in the padding.
* `NonzeroSpec` -- the flat ids of the nonzero elements of a 1-D mask, in order (a boolean-mask
  index `t[mask]` gathers with them).

Pure data movement loads and stores integers of the element's width (a raw byte copy, so the
storage-only dtypes and NaN payloads move untouched); scatter_add / index_add compute in the
dtype's compute type (decode, add, round once, encode).  Strides are compile-time constants
(part of the spec); operand offsets are folded into the pointers at run time.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import llvmlite.ir as ir

from .. import dtype as D
from ..layout import merge_dims
from . import codecs, jit, registry
from .llvmutil import I64, ltype
from .loops import KERNEL_FN, new_module, kernel_function, arg_pointer, counted_loop, unit_range
from ..ir.kernels import KernelSpec


GATHER_OPS = ("index_select", "gather")
SCATTER_OPS = ("scatter", "scatter_add", "index_add")
ARITH_OPS = ("scatter_add", "index_add")
VECTOR_IDS = ("index_select", "index_add")      # ids is 1-D: one id per mid position

MIN_UNITS = 16          # aim for at least this many units when the inner dim is split
MIN_BLOCK = 256         # never split the inner dim into blocks smaller than this


def raw_type(dt: D.DType) -> ir.IntType:
    return ir.IntType(8 * dt.size_in_bytes)


def choose_block(rows: int, inner: int) -> int:
    """Inner-dim block of a unit: the whole dim when there are enough rows to share out,
    else blocks of at least MIN_BLOCK elements.  Fixed per spec (never per thread count)."""
    if rows >= MIN_UNITS or inner <= MIN_BLOCK:
        return max(inner, 1)
    want = -(-MIN_UNITS // max(rows, 1))
    return max(MIN_BLOCK, -(-inner // want))


def split_iteration(shape, dim, strides_list):
    """Merge the dims before `dim` and after it (separately, for all operands at once).
    Returns (outer sizes, mid, inner, [(outer strides, mid stride, inner stride) per operand])."""
    pre, pre_st = merge_dims(shape[:dim], [s[:dim] for s in strides_list]) if dim else ((1,), [(0,)] * len(strides_list))
    if dim + 1 < len(shape):
        post, post_st = merge_dims(shape[dim + 1:], [s[dim + 1:] for s in strides_list])
    else:
        post, post_st = (1,), [(0,)] * len(strides_list)
    outer = tuple(pre) + tuple(post[:-1])
    per = []
    for k, s in enumerate(strides_list):
        per.append((tuple(pre_st[k]) + tuple(post_st[k][:-1]), s[dim], post_st[k][-1]))
    # drop size-1 outer dims (merge_dims keeps a single (1,) when everything is 1)
    keep = [i for i, d in enumerate(outer) if d != 1]
    outer = tuple(outer[i] for i in keep) or (1,)
    per = [(tuple(o[i] for i in keep) or (0,), m, n) for o, m, n in per]
    return outer, shape[dim], post[-1], per


# ---- shared IR helpers -------------------------------------------------------------------
def _unravel(b, r, sizes):
    """Indices (last fastest) of flat index r over `sizes`."""
    idx = [None] * len(sizes)
    for d in range(len(sizes) - 1, 0, -1):
        idx[d] = b.urem(r, I64(sizes[d]))
        r = b.udiv(r, I64(sizes[d]))
    idx[0] = r
    return idx


def _dot(b, idx, strides):
    acc = I64(0)
    for i, s in zip(idx, strides):
        if s:
            acc = b.add(acc, b.mul(i, I64(s)))
    return acc


def _at(b, ptr, off):
    return b.gep(ptr, [off], inbounds=True)


def _load_id(b, ids, off, id_dt):
    v = b.load(_at(b, ids, off), align=id_dt.size_in_bytes)
    return v if v.type.width == 64 else b.zext(v, I64)


def _record_bad(b, status, idv):
    """status[0]: 0 -> 1 by the first unit to find a bad id, which then stores it in status[1]."""
    res = b.cmpxchg(status, I64(0), I64(1), "monotonic", "monotonic")
    with b.if_then(b.extract_value(res, 1)):
        b.store(idv, _at(b, status, I64(1)), align=8)


def _combine(b, dt, old, new):
    """old + new in dt (wrapping ints; floats in the compute type, rounded once to dt)."""
    if dt.is_int:
        return b.add(old, new)
    if dt.codec:
        s = b.fadd(codecs.decode(b, dt.codec, old), codecs.decode(b, dt.codec, new))
        return codecs.encode(b, dt.codec, s)
    return b.fadd(old, new)


def _min(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _max(b, x, y):
    return b.select(b.icmp_signed(">", x, y), x, y)


# ---- index_select / gather / scatter / scatter_add / index_add ---------------------------
@dataclass(frozen=True)
class IndexSpec(KernelSpec):
    """Structure of one index kernel (also its cache key).  Operand strides are
    (outer strides, mid stride, inner stride) over the iteration space; for the operand that
    is indexed (t of the gather family, out of the scatter family) the mid stride is the
    stride of its indexed dim, multiplied by the id."""
    op: str
    dtype: str
    id_dtype: str
    outer: tuple
    mid: int
    inner: int
    bound: int            # size of the indexed dim: ids must be in [0, bound)
    block: int            # inner elements per unit
    mchunk: int           # mid positions per unit (the whole of mid for the scatter family)
    data: tuple           # gather family: t (indexed); scatter family: src
    ids: tuple
    out: tuple            # gather family: contiguous over S; scatter family: indexed
    base: tuple = ()      # scatter family: t, copied into out first (mid runs over bound)

    @property
    def nblk(self) -> int:
        return -(-self.inner // self.block)

    @property
    def nmc(self) -> int:
        return -(-self.mid // self.mchunk) if self.mid else 1

    @property
    def units(self) -> int:
        return prod(self.outer) * self.nmc * self.nblk

    @property
    def unit_cost(self) -> float:
        return float((self.mchunk + (self.bound if self.op in SCATTER_OPS else 0)) * self.block)

    def extent(self, sizes=()) -> int:
        return self.units

    def cost(self, sizes=()) -> float:
        return self.units * self.unit_cost

    def describe(self) -> str:
        return f"{self.op} {self.dtype} by {self.id_dtype}: outer {self.outer} x mid {self.mid} x inner {self.inner}"

def index_spec(op, dt, id_dt, shape, dim, bound, data, ids, out, base=None) -> IndexSpec:
    """Spec from the iteration shape S, the indexed dim and each operand's strides over S."""
    lst = [data, ids, out] + ([base] if base is not None else [])
    outer, mid, inner, per = split_iteration(tuple(shape), dim, lst)
    rows = prod(outer)
    mchunk = max(mid, 1)
    if op in GATHER_OPS and rows < MIN_UNITS and mid > 1:
        # every output element is written once: the mid range can be shared out as well
        want = -(-MIN_UNITS // max(rows, 1))
        mchunk = min(mid, max(-(-MIN_BLOCK // max(inner, 1)), -(-mid // want)))
    block = choose_block(rows * -(-mid // mchunk), inner)
    return IndexSpec(op, dt.name, id_dt.name, outer, mid, inner, bound, block, mchunk,
                     per[0], per[1], per[2], per[3] if base is not None else ())


def build_index(spec: IndexSpec, name: str = "idx") -> str:
    dt, id_dt = D.DType.from_name(spec.dtype), D.DType.from_name(spec.id_dtype)
    arith = spec.op in ARITH_OPS
    scatter = spec.op in SCATTER_OPS
    et = ltype(dt.storage) if arith else raw_type(dt)
    al = dt.size_in_bytes
    m = new_module(name)
    fn, b = kernel_function(m, name)
    ptrs = fn.args[0]
    out = arg_pointer(b, ptrs, 0, et, "out")
    data = arg_pointer(b, ptrs, 1, et, "data")
    ids = arg_pointer(b, ptrs, 2, ltype(id_dt.storage), "ids")
    status = arg_pointer(b, ptrs, 3, I64, "status")
    base = arg_pointer(b, ptrs, 4, et, "base") if scatter else None
    lo, hi = unit_range(fn)
    nblk, nmc = spec.nblk, spec.nmc
    bound = I64(spec.bound)
    with counted_loop(b, lo, hi, 1, "u") as u:
        r = u
        if nblk > 1:
            blk, r = b.urem(r, I64(nblk)), b.udiv(r, I64(nblk))
            q0 = b.mul(blk, I64(spec.block))
            q1 = _min(b, b.add(q0, I64(spec.block)), I64(spec.inner))
        else:
            q0, q1 = I64(0), I64(spec.inner)
        if nmc > 1:
            mc, r = b.urem(r, I64(nmc)), b.udiv(r, I64(nmc))
            i0 = b.mul(mc, I64(spec.mchunk))
            i1 = _min(b, b.add(i0, I64(spec.mchunk)), I64(spec.mid))
        else:
            i0, i1 = I64(0), I64(spec.mid)
        idx = _unravel(b, r, spec.outer)
        d_off, i_off, o_off = (_dot(b, idx, s[0]) for s in (spec.data, spec.ids, spec.out))
        if scatter:
            # this unit's slice of t -> out
            bs_off = _dot(b, idx, spec.base[0])
            with counted_loop(b, I64(0), bound, 1, "j") as j:
                sb = b.add(bs_off, b.mul(j, I64(spec.base[1])))
                so = b.add(o_off, b.mul(j, I64(spec.out[1])))
                with counted_loop(b, q0, q1, 1, "c") as q:
                    v = b.load(_at(b, base, b.add(sb, b.mul(q, I64(spec.base[2])))), align=al)
                    b.store(v, _at(b, out, b.add(so, b.mul(q, I64(spec.out[2])))), align=al)
        with counted_loop(b, i0, i1, 1, "i") as i:
            ib = b.add(i_off, b.mul(i, I64(spec.ids[1])))
            if spec.op in VECTOR_IDS:
                idv = _load_id(b, ids, ib, id_dt)
                ok = b.icmp_unsigned("<", idv, bound)
                with b.if_else(ok) as (then, other):
                    with then:
                        _index_row(b, spec, dt, idv, i, q0, q1, None, data, out, d_off, o_off, al)
                    with other:
                        _record_bad(b, status, idv)
            else:
                _index_row(b, spec, dt, None, i, q0, q1, (ids, ib, id_dt, status, bound), data, out,
                           d_off, o_off, al)
    b.ret_void()
    return str(m)


def _index_row(b, spec, dt, idv, i, q0, q1, per_elem, data, out, d_off, o_off, al):
    """Inner loop q in [q0, q1) at mid position i; the id is `idv` (hoisted) or loaded per
    element (per_elem = (ids, ids offset at q=0, id dtype, status, bound))."""
    scatter = spec.op in SCATTER_OPS
    with counted_loop(b, q0, q1, 1, "q") as q:
        if per_elem is not None:
            ids, ib, id_dt, status, bound = per_elem
            cur = _load_id(b, ids, b.add(ib, b.mul(q, I64(spec.ids[2]))), id_dt)
            ok = b.icmp_unsigned("<", cur, bound)
            with b.if_else(ok) as (then, other):
                with then:
                    _move(b, spec, dt, cur, i, q, scatter, data, out, d_off, o_off, al)
                with other:
                    _record_bad(b, status, cur)
        else:
            _move(b, spec, dt, idv, i, q, scatter, data, out, d_off, o_off, al)


def _move(b, spec, dt, idv, i, q, scatter, data, out, d_off, o_off, al):
    ds, os_ = spec.data, spec.out
    if not scatter:     # out[i, q] = t[id, q]
        src = b.add(b.add(d_off, b.mul(idv, I64(ds[1]))), b.mul(q, I64(ds[2])))
        dst = b.add(b.add(o_off, b.mul(i, I64(os_[1]))), b.mul(q, I64(os_[2])))
        b.store(b.load(_at(b, data, src), align=al), _at(b, out, dst), align=al)
        return
    # out[id, q] (+)= src[i, q]
    src = b.add(b.add(d_off, b.mul(i, I64(ds[1]))), b.mul(q, I64(ds[2])))
    dst = _at(b, out, b.add(b.add(o_off, b.mul(idv, I64(os_[1]))), b.mul(q, I64(os_[2]))))
    v = b.load(_at(b, data, src), align=al)
    if spec.op in ARITH_OPS:
        v = _combine(b, dt, b.load(dst, align=al), v)
    b.store(v, dst, align=al)


# ---- strided copy (cat) ------------------------------------------------------------------
@dataclass(frozen=True)
class CopySpec(KernelSpec):
    esize: int
    outer: tuple
    inner: int
    block: int
    src: tuple        # (outer strides, inner stride)
    dst: tuple

    @property
    def nblk(self) -> int:
        return -(-self.inner // self.block)

    @property
    def units(self) -> int:
        return prod(self.outer) * self.nblk

    def extent(self, sizes=()) -> int:
        return self.units

    def cost(self, sizes=()) -> float:
        return float(self.units * self.block)

    def describe(self) -> str:
        return f"strided copy of {self.esize}-byte elements: outer {self.outer} x inner {self.inner}"

def copy_spec(esize, shape, src_strides, dst_strides) -> CopySpec:
    mshape, (ss, ds) = merge_dims(tuple(shape), [tuple(src_strides), tuple(dst_strides)])
    outer, inner = tuple(mshape[:-1]) or (1,), mshape[-1]
    so, do = tuple(ss[:-1]) or (0,), tuple(ds[:-1]) or (0,)
    return CopySpec(esize, outer, inner, choose_block(prod(outer), inner), (so, ss[-1]), (do, ds[-1]))


def build_copy(spec: CopySpec, name: str = "copy") -> str:
    et = ir.IntType(8 * spec.esize)
    al = spec.esize
    m = new_module(name)
    fn, b = kernel_function(m, name)
    out = arg_pointer(b, fn.args[0], 0, et, "out")
    src = arg_pointer(b, fn.args[0], 1, et, "src")
    lo, hi = unit_range(fn)
    with counted_loop(b, lo, hi, 1, "u") as u:
        if spec.nblk > 1:
            blk, r = b.urem(u, I64(spec.nblk)), b.udiv(u, I64(spec.nblk))
            q0 = b.mul(blk, I64(spec.block))
            q1 = _min(b, b.add(q0, I64(spec.block)), I64(spec.inner))
        else:
            r, q0, q1 = u, I64(0), I64(spec.inner)
        idx = _unravel(b, r, spec.outer)
        s_off, d_off = _dot(b, idx, spec.src[0]), _dot(b, idx, spec.dst[0])
        with counted_loop(b, q0, q1, 1, "q") as q:
            v = b.load(_at(b, src, b.add(s_off, b.mul(q, I64(spec.src[1])))), align=al)
            b.store(v, _at(b, out, b.add(d_off, b.mul(q, I64(spec.dst[1])))), align=al)
    b.ret_void()
    return str(m)


# ---- im2col -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Im2colSpec(KernelSpec):
    esize: int
    b: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    ph: int
    pw: int
    sh: int
    sw: int
    dh: int
    dw: int
    xs: tuple         # strides of x (b, c, h, w)

    @property
    def oh(self) -> int:
        return (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def ow(self) -> int:
        return (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1

    @property
    def units(self) -> int:
        return self.b * self.c * self.kh * self.kw

    def extent(self, sizes=()) -> int:
        return self.units

    def cost(self, sizes=()) -> float:
        return float(self.units * self.oh * self.ow)

    def describe(self) -> str:
        return f"im2col {self.b}x{self.c}x{self.h}x{self.w}, kernel {self.kh}x{self.kw}"

def build_im2col(spec: Im2colSpec, name: str = "im2col") -> str:
    """Unit u = (bi, ci, ki, kj) writes the contiguous (oh, ow) plane of column row u.  The
    range of ox whose input column is inside [0, w) is computed once per unit (zeros left and
    right of it), rows whose input row is outside [0, h) are all zeros."""
    et = ir.IntType(8 * spec.esize)
    al = spec.esize
    zero = ir.Constant(et, 0)
    oh, ow = spec.oh, spec.ow
    m = new_module(name)
    fn, b = kernel_function(m, name)
    out = arg_pointer(b, fn.args[0], 0, et, "out")
    x = arg_pointer(b, fn.args[0], 1, et, "x")
    lo, hi = unit_range(fn)
    sb, sc, sy, sx = spec.xs
    with counted_loop(b, lo, hi, 1, "u") as u:
        bi, ci, ki, kj = _unravel(b, u, (spec.b, spec.c, spec.kh, spec.kw))
        x_off = b.add(b.mul(bi, I64(sb)), b.mul(ci, I64(sc)))
        o_row = b.mul(u, I64(oh * ow))
        # ox valid iff 0 <= ox*sw + kj*dw - pw < w
        num = b.sub(I64(spec.pw), b.mul(kj, I64(spec.dw)))          # ox*sw >= num
        x0 = b.select(b.icmp_signed("<=", num, I64(0)), I64(0),
                      b.sdiv(b.add(num, I64(spec.sw - 1)), I64(spec.sw)))
        x0 = _min(b, x0, I64(ow))
        num2 = b.add(num, I64(spec.w - 1))                            # ox*sw <= num2
        x1 = b.select(b.icmp_signed("<", num2, I64(0)), I64(0), b.add(b.sdiv(num2, I64(spec.sw)), I64(1)))
        x1 = _max(b, _min(b, x1, I64(ow)), x0)
        col0 = b.sub(b.mul(kj, I64(spec.dw)), I64(spec.pw))           # input column at ox = 0
        with counted_loop(b, I64(0), I64(oh), 1, "oy") as oy:
            iy = b.sub(b.add(b.mul(oy, I64(spec.sh)), b.mul(ki, I64(spec.dh))), I64(spec.ph))
            o = b.add(o_row, b.mul(oy, I64(ow)))
            inside = b.and_(b.icmp_signed(">=", iy, I64(0)), b.icmp_signed("<", iy, I64(spec.h)))
            with b.if_else(inside) as (then, other):
                with then:
                    with counted_loop(b, I64(0), x0, 1, "zl") as q:
                        b.store(zero, _at(b, out, b.add(o, q)), align=al)
                    row = b.add(b.add(x_off, b.mul(iy, I64(sy))), b.mul(col0, I64(sx)))
                    with counted_loop(b, x0, x1, 1, "cp") as q:
                        v = b.load(_at(b, x, b.add(row, b.mul(q, I64(spec.sw * sx)))), align=al)
                        b.store(v, _at(b, out, b.add(o, q)), align=al)
                    with counted_loop(b, x1, I64(ow), 1, "zr") as q:
                        b.store(zero, _at(b, out, b.add(o, q)), align=al)
                with other:
                    with counted_loop(b, I64(0), I64(ow), 1, "zf") as q:
                        b.store(zero, _at(b, out, b.add(o, q)), align=al)
    b.ret_void()
    return str(m)


# ---- nonzero (the ids of a boolean mask) -------------------------------------------------------
@dataclass(frozen=True)
class NonzeroSpec(KernelSpec):
    esize: int        # bytes of a mask element (compared raw with 0)
    stride: int       # of the 1-D mask

    def describe(self) -> str:
        return f"nonzero of a {self.esize}-byte mask (one sequential unit)"

def build_nonzero(spec: NonzeroSpec, name: str = "nonzero") -> str:
    """One sequential unit: out[j++] = i for every mask[i] != 0, i < n, writing at most `cap`
    ids (ptrs: out i64*, mask, params i64* {n, cap}; sizes are run-time values)."""
    et = ir.IntType(8 * spec.esize)
    m = new_module(name)
    fn, b = kernel_function(m, name)
    out = arg_pointer(b, fn.args[0], 0, I64, "out")
    mask = arg_pointer(b, fn.args[0], 1, et, "mask")
    params = arg_pointer(b, fn.args[0], 2, I64, "params")
    n = b.load(params, align=8)
    cap = b.load(_at(b, params, I64(1)), align=8)
    j = b.alloca(I64)
    b.store(I64(0), j)
    with counted_loop(b, I64(0), n, 1, "i") as i:
        v = b.load(_at(b, mask, b.mul(i, I64(spec.stride))), align=spec.esize)
        with b.if_then(b.icmp_unsigned("!=", v, ir.Constant(et, 0))):
            jj = b.load(j)
            with b.if_then(b.icmp_signed("<", jj, cap)):
                b.store(i, _at(b, out, jj), align=8)
            b.store(b.add(jj, I64(1)), j)
    b.ret_void()
    return str(m)


# ---- compile cache ------------------------------------------------------------------------
_BUILDERS = {IndexSpec: (build_index, "idx"), CopySpec: (build_copy, "copy"), Im2colSpec: (build_im2col, "im2col"),
             NonzeroSpec: (build_nonzero, "nonzero")}


def _build(spec):
    build, name = _BUILDERS[type(spec)]
    return build(spec, name), name


_kernels = jit.KernelCache(_build, KERNEL_FN)


def get_kernel(spec):
    """(CompiledModule, ctypes function) for a spec, compiled once per structure (the one
    kernel cache of jit.py, as for every other kernel kind)."""
    fn = _kernels(spec)
    return fn._module, fn
for _cls in _BUILDERS:
    registry.register(_cls, lambda spec: _build(spec)[0], _kernels)
