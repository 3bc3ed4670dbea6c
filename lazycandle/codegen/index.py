"""LLVM kernels of the index / data-movement ops (the common kernel ABI of codegen/loops.py,
`void k(i8** bufs, i64* sizes, i64* scalars, i64 lo, i64 hi)`, over a range of independent
units, split over the native pool).

* `IndexSpec` -- index_select, gather, scatter, scatter_add, index_add.  The iteration space is
  the shape S of the values moved (the output for the gather family, src for the scatter
  family), split as (outer dims, mid = the indexed dim, inner = the last dim after it).  A unit
  is one outer position times one block of the inner dim (times one chunk of mid for the
  gather family); it loops over its mid range sequentially, so every output element is written
  by exactly one unit, in the same order whatever the thread count (duplicate ids accumulate
  deterministically).  The scatter family first copies its slice of `t` into the output (same
  unit, so no cross-thread ordering is needed).  Every id is checked (`id <u bound`: negative
  i64 ids are huge unsigned values); a bad id skips its access and the first one a unit meets
  is recorded in a status word (i64 flag set by cmpxchg, i64 id) that the runtime turns into
  IndexOutOfBounds.
* `CopySpec` -- a strided copy into a strided destination (cat's pieces).
* `Im2colSpec` -- convolution patches (b, c, kh, kw, oh, ow) read through the input's strides,
  zeros where the window lies in the padding.
* `NonzeroSpec` -- the flat ids of the nonzero elements of a 1-D mask, in order (a boolean-mask
  index `t[mask]` gathers with them).

Each spec is a shape CLASS (codegen/sizes_arg.py): sizes, the index bound, the unit split
(block and chunk lengths) and every stride that is not 0 or 1 are read from the `sizes`
argument, which the spec's `*_kernel` function returns with it; so a new length reuses the
kernel.  Unit strides stay constants, so inner copies vectorize as with baked sizes.  Pure
data movement loads and stores integers of the element's width (a raw byte copy, so the
storage-only dtypes and NaN payloads move untouched); scatter_add / index_add compute in the
dtype's compute type (decode, add, round once, encode).  Operand offsets are folded into the
pointers at run time.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import llvmlite.ir as ir

from .. import dtype as D
from ..layout import merge_dims
from . import codecs, jit, registry, sizes_arg as SA
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


def _divmod(b, r, n):
    """(r / n, r % n) for a run-time n >= 1, skipping the divisions when n is 1 (the usual
    case: a unit per row; the branch is the same for every unit)."""
    pre = b.block
    with b.if_then(b.icmp_unsigned("!=", n, I64(1))):
        q, m = b.udiv(r, n), b.urem(r, n)
        split = b.block
    qp, mp = b.phi(I64), b.phi(I64)
    qp.add_incoming(r, pre)
    qp.add_incoming(q, split)
    mp.add_incoming(I64(0), pre)
    mp.add_incoming(m, split)
    return qp, mp


def _split_unit(b, u, nblk, block, inner):
    """(rest of u, first, end) of the inner block that unit u covers (block index fastest)."""
    r, blk = _divmod(b, u, nblk)
    q0 = b.mul(blk, block)
    return r, q0, _min(b, b.add(q0, block), inner)


# ---- index_select / gather / scatter / scatter_add / index_add ---------------------------
INDEX_SIZES = ("mid", "inner", "bound", "block", "nblk", "mchunk", "nmc")


@dataclass(frozen=True)
class IndexSpec(KernelSpec):
    """Shape class of one index kernel (also its cache key): op, dtypes, the number of outer
    dims and each operand's stride classes over (outer dims, mid, inner).  For the operand
    that is indexed (t of the gather family, out of the scatter family) the mid stride is the
    stride of its indexed dim, multiplied by the id.  Sizes (`index_kernel`): the outer sizes,
    then INDEX_SIZES, then the RUNTIME strides of data, ids, out, base."""
    op: str
    dtype: str
    id_dtype: str
    rank: int             # outer dims
    data: tuple           # gather family: t (indexed); scatter family: src
    ids: tuple
    out: tuple            # gather family: contiguous over S; scatter family: indexed
    base: tuple = ()      # scatter family: t, copied into out first (mid runs over bound)
    scalar_inner: bool = False    # inner is 1 (the indexed dim is the last): no inner loop

    def _size(self, sizes, name):
        return sizes[self.rank + INDEX_SIZES.index(name)]

    def extent(self, sizes) -> int:
        return prod(sizes[:self.rank]) * self._size(sizes, "nmc") * self._size(sizes, "nblk")

    def unit_cost(self, sizes) -> float:
        scan_base = self._size(sizes, "bound") if self.op in SCATTER_OPS else 0
        return float((self._size(sizes, "mchunk") + scan_base) * self._size(sizes, "block"))

    def cost(self, sizes) -> float:
        return self.extent(sizes) * self.unit_cost(sizes)

    def describe(self) -> str:
        return f"{self.op} {self.dtype} by {self.id_dtype}: {self.rank} outer dims x mid x inner"


def index_kernel(op, dt, id_dt, shape, dim, bound, data, ids, out, base=None):
    """(IndexSpec, sizes) from the iteration shape S, the indexed dim, the indexed dim's size
    and each operand's strides over S."""
    lst = [data, ids, out] + ([base] if base is not None else [])
    outer, mid, inner, per = split_iteration(tuple(shape), dim, lst)
    rows = prod(outer)
    mchunk = max(mid, 1)
    if op in GATHER_OPS and rows < MIN_UNITS and mid > 1:
        # every output element is written once: the mid range can be shared out as well
        want = -(-MIN_UNITS // max(rows, 1))
        mchunk = min(mid, max(-(-MIN_BLOCK // max(inner, 1)), -(-mid // want)))
    nmc = -(-mid // mchunk) if mid else 1
    block = choose_block(rows * nmc, inner)
    full = [o + (m, n) for o, m, n in per]
    spec = IndexSpec(op, dt.name, id_dt.name, len(outer), *(SA.classes(s) for s in full[:3]),
                     SA.classes(full[3]) if base is not None else (), inner == 1)
    sizes = tuple(outer) + (mid, inner, bound, block, -(-inner // block), mchunk, nmc)
    return spec, sizes + tuple(v for s in full for v in SA.runtime_values(s))


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
    sz = SA.SizesReader(b, fn)
    outer = sz.many(spec.rank, "outer")
    mid, inner, bound, block, nblk, mchunk, nmc = (sz.next(n) for n in INDEX_SIZES)
    st = {k: sz.strides(getattr(spec, k)) for k in ("data", "ids", "out", "base")}
    R = spec.rank
    lo, hi = unit_range(fn)
    with counted_loop(b, lo, hi, 1, "u") as u:
        if spec.scalar_inner:
            r, q0, q1 = u, I64(0), I64(1)
        else:
            r, q0, q1 = _split_unit(b, u, nblk, block, inner)
        r, mc = _divmod(b, r, nmc)
        i0 = b.mul(mc, mchunk)
        i1 = _min(b, b.add(i0, mchunk), mid)
        idx = SA.unravel(b, r, outer)
        d_off, i_off, o_off = (SA.dot(b, idx, st[k][:R]) for k in ("data", "ids", "out"))
        if scatter:
            # this unit's slice of t -> out
            bs_off = SA.dot(b, idx, st["base"][:R])
            with counted_loop(b, I64(0), bound, 1, "j") as j:
                sb = b.add(bs_off, SA.scaled(b, j, st["base"][R]))
                so = b.add(o_off, SA.scaled(b, j, st["out"][R]))
                with counted_loop(b, q0, q1, 1, "c") as q:
                    v = b.load(_at(b, base, b.add(sb, SA.scaled(b, q, st["base"][R + 1]))), align=al)
                    b.store(v, _at(b, out, b.add(so, SA.scaled(b, q, st["out"][R + 1]))), align=al)
        offs = (d_off, o_off)
        with counted_loop(b, i0, i1, 1, "i") as i:
            ib = b.add(i_off, SA.scaled(b, i, st["ids"][R]))
            if spec.op in VECTOR_IDS:
                idv = _load_id(b, ids, ib, id_dt)
                ok = b.icmp_unsigned("<", idv, bound)
                with b.if_else(ok) as (then, other):
                    with then:
                        _index_row(b, spec, dt, idv, i, q0, q1, None, data, out, offs, st, al)
                    with other:
                        _record_bad(b, status, idv)
            else:
                _index_row(b, spec, dt, None, i, q0, q1, (ids, ib, id_dt, status, bound), data, out,
                           offs, st, al)
    b.ret_void()
    return str(m)


def _index_row(b, spec, dt, idv, i, q0, q1, per_elem, data, out, offs, st, al):
    """Inner loop q in [q0, q1) at mid position i; the id is `idv` (hoisted) or loaded per
    element (per_elem = (ids, ids offset at q=0, id dtype, status, bound))."""
    with counted_loop(b, q0, q1, 1, "q") as q:
        if per_elem is not None:
            ids, ib, id_dt, status, bound = per_elem
            cur = _load_id(b, ids, b.add(ib, SA.scaled(b, q, st["ids"][spec.rank + 1])), id_dt)
            ok = b.icmp_unsigned("<", cur, bound)
            with b.if_else(ok) as (then, other):
                with then:
                    _move(b, spec, dt, cur, i, q, data, out, offs, st, al)
                with other:
                    _record_bad(b, status, cur)
        else:
            _move(b, spec, dt, idv, i, q, data, out, offs, st, al)


def _move(b, spec, dt, idv, i, q, data, out, offs, st, al):
    R = spec.rank
    (d_off, o_off), ds, os_ = offs, st["data"], st["out"]
    if spec.op not in SCATTER_OPS:     # out[i, q] = t[id, q]
        src = b.add(b.add(d_off, SA.scaled(b, idv, ds[R])), SA.scaled(b, q, ds[R + 1]))
        dst = b.add(b.add(o_off, SA.scaled(b, i, os_[R])), SA.scaled(b, q, os_[R + 1]))
        b.store(b.load(_at(b, data, src), align=al), _at(b, out, dst), align=al)
        return
    # out[id, q] (+)= src[i, q]
    src = b.add(b.add(d_off, SA.scaled(b, i, ds[R])), SA.scaled(b, q, ds[R + 1]))
    dst = _at(b, out, b.add(b.add(o_off, SA.scaled(b, idv, os_[R])), SA.scaled(b, q, os_[R + 1])))
    v = b.load(_at(b, data, src), align=al)
    if spec.op in ARITH_OPS:
        v = _combine(b, dt, b.load(dst, align=al), v)
    b.store(v, dst, align=al)


# ---- strided copy (cat) ------------------------------------------------------------------
@dataclass(frozen=True)
class CopySpec(KernelSpec):
    """Shape class of a strided copy (cat's pieces): element size, outer dims after merging,
    the stride classes of src and dst over (outer dims, inner).  Sizes (`copy_kernel`): the
    outer sizes, inner, block, blocks per row, then the RUNTIME strides of src and dst."""
    esize: int
    rank: int
    src: tuple
    dst: tuple

    def extent(self, sizes) -> int:
        return prod(sizes[:self.rank]) * sizes[self.rank + 2]

    def unit_cost(self, sizes) -> float:
        return float(sizes[self.rank + 1])

    def cost(self, sizes) -> float:
        return self.extent(sizes) * self.unit_cost(sizes)

    def describe(self) -> str:
        return f"strided copy of {self.esize}-byte elements: {self.rank} outer dims x inner"


def copy_kernel(esize, shape, src_strides, dst_strides):
    """(CopySpec, sizes) of copying `shape` elements from src to dst strides."""
    mshape, (ss, ds) = merge_dims(tuple(shape), [tuple(src_strides), tuple(dst_strides)])
    outer, inner = tuple(mshape[:-1]) or (1,), mshape[-1]
    ss, ds = (tuple(ss[:-1]) or (0,)) + ss[-1:], (tuple(ds[:-1]) or (0,)) + ds[-1:]
    block = choose_block(prod(outer), inner)
    spec = CopySpec(esize, len(outer), SA.classes(ss), SA.classes(ds))
    return spec, outer + (inner, block, -(-inner // block)) + SA.runtime_values(ss) + SA.runtime_values(ds)


def build_copy(spec: CopySpec, name: str = "copy") -> str:
    et = ir.IntType(8 * spec.esize)
    al = spec.esize
    m = new_module(name)
    fn, b = kernel_function(m, name)
    out = arg_pointer(b, fn.args[0], 0, et, "out")
    src = arg_pointer(b, fn.args[0], 1, et, "src")
    sz = SA.SizesReader(b, fn)
    outer = sz.many(spec.rank, "outer")
    inner, block, nblk = sz.next("inner"), sz.next("block"), sz.next("nblk")
    ss, ds = sz.strides(spec.src), sz.strides(spec.dst)
    R = spec.rank
    lo, hi = unit_range(fn)
    with counted_loop(b, lo, hi, 1, "u") as u:
        r, q0, q1 = _split_unit(b, u, nblk, block, inner)
        idx = SA.unravel(b, r, outer)
        s_off, d_off = SA.dot(b, idx, ss[:R]), SA.dot(b, idx, ds[:R])
        with counted_loop(b, q0, q1, 1, "q") as q:
            v = b.load(_at(b, src, b.add(s_off, SA.scaled(b, q, ss[R]))), align=al)
            b.store(v, _at(b, out, b.add(d_off, SA.scaled(b, q, ds[R]))), align=al)
    b.ret_void()
    return str(m)


# ---- im2col -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Im2colSpec(KernelSpec):
    """Shape class of an im2col kernel: element size, the convolution's window (kernel,
    padding, stride, dilation: the op's arguments) and the stride classes of x (b, c, h, w).
    Sizes (`im2col_kernel`): b, c, h, w, oh, ow, then x's RUNTIME strides."""
    esize: int
    kh: int
    kw: int
    ph: int
    pw: int
    sh: int
    sw: int
    dh: int
    dw: int
    xs: tuple         # stride classes of x (b, c, h, w)

    def extent(self, sizes) -> int:
        return sizes[0] * sizes[1] * self.kh * self.kw

    def unit_cost(self, sizes) -> float:
        return float(sizes[4] * sizes[5])

    def cost(self, sizes) -> float:
        return self.extent(sizes) * self.unit_cost(sizes)

    def describe(self) -> str:
        return f"im2col, kernel {self.kh}x{self.kw}"


def im2col_kernel(esize, shape, strides, window):
    """(Im2colSpec, sizes) of the patches of x (shape, strides: b, c, h, w); window = (kh, kw,
    ph, pw, sh, sw, dh, dw)."""
    kh, kw, ph, pw, sh, sw, dh, dw = window
    h, w = shape[2], shape[3]
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    spec = Im2colSpec(esize, *window, SA.classes(strides))
    return spec, tuple(shape) + (oh, ow) + SA.runtime_values(strides)


def build_im2col(spec: Im2colSpec, name: str = "im2col") -> str:
    """Unit u = (bi, ci, ki, kj) writes the contiguous (oh, ow) plane of column row u.  The
    range of ox whose input column is inside [0, w) is computed once per unit (zeros left and
    right of it), rows whose input row is outside [0, h) are all zeros."""
    et = ir.IntType(8 * spec.esize)
    al = spec.esize
    zero = ir.Constant(et, 0)
    m = new_module(name)
    fn, b = kernel_function(m, name)
    out = arg_pointer(b, fn.args[0], 0, et, "out")
    x = arg_pointer(b, fn.args[0], 1, et, "x")
    sz = SA.SizesReader(b, fn)
    _, c, h, w, oh, ow = sz.many(6)
    sb, sc, sy, sx = sz.strides(spec.xs)
    plane = b.mul(oh, ow)
    step_x = SA.scaled(b, I64(spec.sw), sx)
    lo, hi = unit_range(fn)
    with counted_loop(b, lo, hi, 1, "u") as u:
        bi, ci, ki, kj = SA.unravel(b, u, (None, c, spec.kh, spec.kw))
        x_off = SA.dot(b, (bi, ci), (sb, sc))
        o_row = b.mul(u, plane)
        # ox valid iff 0 <= ox*sw + kj*dw - pw < w
        num = b.sub(I64(spec.pw), b.mul(kj, I64(spec.dw)))          # ox*sw >= num
        x0 = b.select(b.icmp_signed("<=", num, I64(0)), I64(0),
                      b.sdiv(b.add(num, I64(spec.sw - 1)), I64(spec.sw)))
        x0 = _min(b, x0, ow)
        num2 = b.add(num, b.sub(w, I64(1)))                           # ox*sw <= num2
        x1 = b.select(b.icmp_signed("<", num2, I64(0)), I64(0), b.add(b.sdiv(num2, I64(spec.sw)), I64(1)))
        x1 = _max(b, _min(b, x1, ow), x0)
        col0 = b.sub(b.mul(kj, I64(spec.dw)), I64(spec.pw))           # input column at ox = 0
        with counted_loop(b, I64(0), oh, 1, "oy") as oy:
            iy = b.sub(b.add(b.mul(oy, I64(spec.sh)), b.mul(ki, I64(spec.dh))), I64(spec.ph))
            o = b.add(o_row, b.mul(oy, ow))
            inside = b.and_(b.icmp_signed(">=", iy, I64(0)), b.icmp_signed("<", iy, h))
            with b.if_else(inside) as (then, other):
                with then:
                    with counted_loop(b, I64(0), x0, 1, "zl") as q:
                        b.store(zero, _at(b, out, b.add(o, q)), align=al)
                    row = b.add(b.add(x_off, SA.scaled(b, iy, sy)), SA.scaled(b, col0, sx))
                    with counted_loop(b, x0, x1, 1, "cp") as q:
                        v = b.load(_at(b, x, b.add(row, SA.scaled(b, q, step_x))), align=al)
                        b.store(v, _at(b, out, b.add(o, q)), align=al)
                    with counted_loop(b, x1, ow, 1, "zr") as q:
                        b.store(zero, _at(b, out, b.add(o, q)), align=al)
                with other:
                    with counted_loop(b, I64(0), ow, 1, "zf") as q:
                        b.store(zero, _at(b, out, b.add(o, q)), align=al)
    b.ret_void()
    return str(m)


# ---- nonzero (the ids of a boolean mask) -------------------------------------------------------
@dataclass(frozen=True)
class NonzeroSpec(KernelSpec):
    """Element size of the 1-D mask (compared raw with 0) and the class of its stride.  Sizes:
    n, cap (ids written at most), then the stride if RUNTIME."""
    esize: int
    stride: object

    def describe(self) -> str:
        return f"nonzero of a {self.esize}-byte mask (one sequential unit)"


def nonzero_kernel(esize, n, stride, cap):
    """(NonzeroSpec, sizes) of the ids of a mask of n elements `stride` apart, at most cap."""
    return NonzeroSpec(esize, SA.classes((stride,))[0]), (n, cap) + SA.runtime_values((stride,))


def build_nonzero(spec: NonzeroSpec, name: str = "nonzero") -> str:
    """One sequential unit: out[j++] = i for every mask[i] != 0, i < n, writing at most `cap`
    ids (ptrs: out i64*, mask)."""
    et = ir.IntType(8 * spec.esize)
    m = new_module(name)
    fn, b = kernel_function(m, name)
    out = arg_pointer(b, fn.args[0], 0, I64, "out")
    mask = arg_pointer(b, fn.args[0], 1, et, "mask")
    sz = SA.SizesReader(b, fn)
    n, cap = sz.next("n"), sz.next("cap")
    (stride,) = sz.strides((spec.stride,))
    j = b.alloca(I64)
    b.store(I64(0), j)
    with counted_loop(b, I64(0), n, 1, "i") as i:
        v = b.load(_at(b, mask, SA.scaled(b, i, stride)), align=spec.esize)
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
