"""Reduction kernels (sum, mean, prod, max, min, argmax, argmin over any set of dims), with the
elementwise producers of the reduced value fused in (the same instruction DAG as elementwise
kernels, evaluated per input element).

Two loop shapes, chosen by where the innermost input dim lands:
  inner-reduce  (the last dim is reduced, e.g. sum(-1)): one unit per output element; the
                innermost reduced dim runs W-wide with U vector accumulators, then a
                horizontal combine;
  inner-output  (the last dim is kept, e.g. sum(0)): one unit per row of outputs; U vectors of
                W outputs stay in registers while the reduced dims are walked.
Like elementwise kernels, reduce kernels are compiled per shape class (sizes and strides other
than 0 / 1 arrive in the `sizes` array): the vectorised dim runs U = 4 vectors at a time while
4 W elements remain, then one vector at a time, then a scalar tail, so one kernel serves every
length.
Float sums and products accumulate in f64 (f32/f16/bf16 inputs), integer ones wrap in their dtype;
max/min propagate NaN like np.max; argmax/argmin keep the first index on ties (a NaN counts as
the maximum / minimum, first one wins, like NumPy).
"""
from __future__ import annotations

import contextlib

import llvmlite.ir as ir

from .. import dtype as D
from ..ir.kernels import RedSpec
from ..ir.ops import reduction
from . import jit, registry
from .elementwise import _Kernel, _emit_instrs, _bits
from .llvmutil import I32, I64, F64, ltype, vec, splat, const, width_of, FM_REDUCE
from .loops import KERNEL_FN, counted_loop, unit_range



def lanes(spec: RedSpec) -> int:
    """W of a reduce kernel (float sums accumulate in f64, so they count as 64-bit)."""
    bits = max([_bits(D.DType.from_name(dt)) for dt, _ in spec.inputs] +
               [_bits(D.DType.from_name(i[3])) for i in spec.instrs] + [32])
    if reduction(spec.kind).acc == "f64" and D.DType.from_name(spec.instrs[-1][3]).is_float:
        bits = 64
    return max(2, jit.vector_bits() // bits)


UNROLL = 4      # vector accumulators (inner-reduce) / output vectors (inner-output) per step


def _acc_type(spec, dt):
    if reduction(spec.kind).acc == "f64" and dt.is_float:
        return F64
    return ltype(dt.compute)


class _RedKernel(_Kernel):
    def __init__(self, spec, name):
        super().__init__(spec, name, lanes(spec))
        self.red = reduction(spec.kind)
        self.val_dt = D.DType.from_name(spec.instrs[-1][3])
        self.out_dtype = D.DType.from_name(spec.outputs[0][1])
        self.acc_t = _acc_type(spec, self.val_dt)
        self.is_arg = self.red.finish == "index"
        self.is_float = self.val_dt.is_float
        b, count = self.b, I64(1)
        for d, r in enumerate(spec.red):
            if r:
                count = b.mul(count, self.dims[d])
        self.count_f = b.sitofp(count, self.acc_t) if self.is_float else None

    # -- the combine step -----------------------------------------------------------------
    def value(self, offs, strides, w, given=None):
        """The reduced value at w lanes, in the accumulator type."""
        b = self.b

        def load(k):
            if given and k in given:
                return given[k]
            return self.load(k, offs[k], strides[k], w)

        v = _emit_instrs(b, self.spec, load, w, self.scalar, decode_outputs=True)[0]
        t = vec(self.acc_t, w)
        if v.type != t:
            v = b.fpext(v, t) if self.is_float else v
        return v

    def init(self, w):
        ident, t = self.red.identity, vec(self.acc_t, w)
        if ident in ("zero", "one"):
            v = 0 if ident == "zero" else 1
            return const(t, float(v) if self.is_float else v)
        big = ident == "lowest"     # the identity of max is the lowest value
        if self.is_float:
            return const(t, float("-inf") if big else float("inf"))
        bits = self.acc_t.width
        if self.val_dt.is_signed:
            return const(t, -(1 << (bits - 1)) if big else (1 << (bits - 1)) - 1)
        return const(t, 0 if big else (1 << bits) - 1)

    def better(self, new, old):
        """i1 mask: `new` replaces `old` (strictly better, or the first NaN)."""
        b = self.b
        big = self.red.combine == "max"
        if self.is_float:
            c = b.fcmp_ordered(">" if big else "<", new, old)
            return b.or_(c, b.and_(b.fcmp_unordered("uno", new, new), b.fcmp_ordered("ord", old, old)))
        cmp = b.icmp_signed if self.val_dt.is_signed else b.icmp_unsigned
        return cmp(">" if big else "<", new, old)

    def combine(self, acc, x):
        b = self.b
        if self.red.combine == "add":
            return b.fadd(acc, x, flags=FM_REDUCE) if self.is_float else b.add(acc, x)
        if self.red.combine == "mul":
            return b.fmul(acc, x, flags=FM_REDUCE) if self.is_float else b.mul(acc, x)
        return b.select(self.better(x, acc), x, acc)

    def finish(self, acc):
        """Accumulator scalar -> stored output value."""
        b = self.b
        if self.red.finish == "divide_count":
            w = width_of(acc.type)
            acc = b.fdiv(acc, self.count_f if w == 1 else splat(b, self.count_f, w))
        if self.acc_t == F64 and self.is_float:
            from .elementwise import _cast
            return self.store_value(_cast(b, acc, D.f64, self.out_dtype))
        return self.store_value(acc)

    def store_value(self, v):
        from . import codecs
        dt = self.out_dtype
        return codecs.encode(self.b, dt.codec, v) if dt.codec else v

    def hreduce(self, accs, idxs=None):
        """Combine a list of W-lane accumulators into one scalar (and its index)."""
        b = self.b
        acc = accs[0]
        idx = idxs[0] if idxs else None
        for k in range(1, len(accs)):
            if idxs:
                acc, idx = self.arg_pick(acc, idx, accs[k], idxs[k])
            else:
                acc = self.combine(acc, accs[k])
        w = width_of(acc.type)
        if w == 1:
            return acc, idx
        s = b.extract_element(acc, I32(0))
        si = b.extract_element(idx, I32(0)) if idxs else None
        for lane in range(1, w):
            x = b.extract_element(acc, I32(lane))
            if idxs:
                s, si = self.arg_pick(s, si, x, b.extract_element(idx, I32(lane)))
            else:
                s = self.combine(s, x)
        return s, si

    def arg_pick(self, v0, i0, v1, i1):
        """Pick (v1, i1) over (v0, i0) when v1 is better, or equally good with a lower index."""
        b = self.b
        better = self.better(v1, v0)
        if self.is_float:
            same = b.or_(b.fcmp_ordered("==", v1, v0),
                         b.and_(b.fcmp_unordered("uno", v0, v0), b.fcmp_unordered("uno", v1, v1)))
        else:
            same = b.icmp_unsigned("==", v1, v0)
        take = b.or_(better, b.and_(same, b.icmp_signed("<", i1, i0)))
        return b.select(take, v1, v0), b.select(take, i1, i0)

    # -- loops (accumulators live in entry-block allocas; mem2reg makes them registers) --------
    def slot(self, t):
        b = self.b
        with b.goto_block(self.fn.entry_basic_block):
            b.position_at_start(self.fn.entry_basic_block)
            return b.alloca(t)

    @contextlib.contextmanager
    def red_loops(self, dims, in_base):
        """Nested loops over reduced `dims`; yields (input offsets, flat reduced index base)."""
        b = self.b
        red_all = [d for d, r in enumerate(self.spec.red) if r]
        with contextlib.ExitStack() as stack:
            offs, flat = list(in_base), I64(0)
            for d in dims:
                i = stack.enter_context(counted_loop(b, I64(0), self.dims[d], 1, f"r{d}"))
                offs = [self.sadd(o, i, s[d]) for o, s in zip(offs, self.strides)]
                inner = I64(1)
                for e in red_all:
                    if e > d:
                        inner = b.mul(inner, self.dims[e])
                flat = b.add(flat, b.mul(i, inner))
            yield offs, flat

    def build(self):
        spec, b = self.spec, self.b
        lo, hi = unit_range(self.fn)
        out_dims = [d for d, r in enumerate(spec.red) if not r]
        red_dims = [d for d, r in enumerate(spec.red) if r]
        with counted_loop(b, lo, hi, 1, "unit") as u:
            if spec.inner_reduce:
                in_base, _ = self.offsets(self.unravel(u, out_dims) if out_dims else {})
                self.reduce_inner(in_base, u, red_dims)
            else:
                in_base, _ = self.offsets(self.unravel(u, out_dims[:-1]) if len(out_dims) > 1 else {})
                jd = out_dims[-1]
                self.reduce_outer(in_base, b.mul(u, self.dims[jd]), red_dims, jd)

    def _step(self, acc_slot, idx_slot, offs, strides, w, pos):
        """acc <- combine(acc, value at offs); for arg kinds also track the index `pos`."""
        b = self.b
        v = self.value(offs, strides, w)
        acc = b.load(acc_slot)
        if self.is_arg:
            better = self.better(v, acc)
            b.store(b.select(better, v, acc), acc_slot)
            b.store(b.select(better, pos, b.load(idx_slot)), idx_slot)
        else:
            b.store(self.combine(acc, v), acc_slot)

    def _lanes(self, pos, w):
        b = self.b
        if w == 1:
            return pos
        return b.add(splat(b, pos, w), ir.Constant(vec(I64, w), [I64(x) for x in range(w)]))

    def reduce_inner(self, in_base, out_off, red_dims):
        """Everything reduced for one output element; the last reduced dim runs W-wide."""
        b, W = self.b, self.W
        last = red_dims[-1]
        n = self.dims[last]
        U = UNROLL
        nvec = b.mul(b.udiv(n, I64(U * W)), I64(U * W))
        n1 = b.mul(b.udiv(n, I64(W)), I64(W))
        accs = [self.slot(vec(self.acc_t, W)) for _ in range(U)] + [self.slot(self.acc_t)]
        idxs = [self.slot(vec(I64, W)) for _ in range(U)] + [self.slot(I64)] if self.is_arg else [None] * (U + 1)
        for k, a in enumerate(accs):
            w = W if k < U else 1
            b.store(self.init(w), a)
            if self.is_arg:
                b.store(const(vec(I64, w), 0), idxs[k])
        sl = [s[last] for s in self.strides]
        with self.red_loops(red_dims[:-1], in_base) as (offs, flat):
            with counted_loop(b, I64(0), nvec, U * W, "rv") as i:
                for k in range(U):
                    j = b.add(i, I64(k * W))
                    o = [self.sadd(x, j, s) for x, s in zip(offs, sl)]
                    self._step(accs[k], idxs[k], o, sl, W, self._lanes(b.add(flat, j), W) if self.is_arg else None)
            with counted_loop(b, nvec, n1, W, "r1") as j:
                o = [self.sadd(x, j, s) for x, s in zip(offs, sl)]
                self._step(accs[0], idxs[0], o, sl, W, self._lanes(b.add(flat, j), W) if self.is_arg else None)
            with counted_loop(b, n1, n, 1, "rt") as j:
                o = [self.sadd(x, j, s) for x, s in zip(offs, sl)]
                self._step(accs[U], idxs[U], o, sl, 1, b.add(flat, j) if self.is_arg else None)
        vals = [b.load(a) for a in accs[:U]]
        ids = [b.load(x) for x in idxs[:U]] if self.is_arg else None
        s, si = self.hreduce(vals, ids)
        tail, tail_i = b.load(accs[U]), (b.load(idxs[U]) if self.is_arg else None)
        if self.is_arg:
            s, si = self.arg_pick(s, si, tail, tail_i)
        else:
            s = self.combine(s, tail)
        self._store(out_off, si if self.is_arg else s, 1)

    def reduce_outer(self, in_base, out_row, red_dims, jd):
        """One row of outputs: U x W output lanes held in registers while the reduced dims are
        walked; then a scalar tail of outputs."""
        b, W = self.b, self.W
        m = self.dims[jd]
        nvec = b.mul(b.udiv(m, I64(UNROLL * W)), I64(UNROLL * W))
        m1 = b.mul(b.udiv(m, I64(W)), I64(W))
        sj = [s[jd] for s in self.strides]
        accs = [self.slot(vec(self.acc_t, W)) for _ in range(UNROLL)]
        idxs = [self.slot(vec(I64, W)) for _ in range(UNROLL)] if self.is_arg else [None] * UNROLL

        def block(j0, U):
            """U x W outputs from j0 on."""
            for k in range(U):
                b.store(self.init(W), accs[k])
                if self.is_arg:
                    b.store(const(vec(I64, W), 0), idxs[k])
            base = [self.sadd(x, j0, s) for x, s in zip(in_base, sj)]
            with self.red_loops(red_dims, base) as (offs, flat):
                for k in range(U):
                    o = [self.sadd(x, I64(k * W), s) for x, s in zip(offs, sj)]
                    self._step(accs[k], idxs[k], o, sj, W, splat(b, flat, W) if self.is_arg else None)
            for k in range(U):
                v = b.load(idxs[k]) if self.is_arg else b.load(accs[k])
                self._store(b.add(b.add(out_row, j0), I64(k * W)), v, W)

        with counted_loop(b, I64(0), nvec, UNROLL * W, "jv") as j0:
            block(j0, UNROLL)
        with counted_loop(b, nvec, m1, W, "j1") as j0:
            block(j0, 1)
        acc1 = self.slot(self.acc_t)
        idx1 = self.slot(I64) if self.is_arg else None
        with counted_loop(b, m1, m, 1, "jt") as j:
            b.store(self.init(1), acc1)
            if self.is_arg:
                b.store(I64(0), idx1)
            base = [self.sadd(x, j, s) for x, s in zip(in_base, sj)]
            with self.red_loops(red_dims, base) as (offs, flat):
                self._step(acc1, idx1, offs, sj, 1, flat if self.is_arg else None)
            self._store(b.add(out_row, j), b.load(idx1) if self.is_arg else b.load(acc1), 1)

    def _store(self, off, v, w):
        b = self.b
        if self.is_arg:
            v = b.trunc(v, vec(I32, w))
        else:
            v = self.finish(v)
        p = b.gep(self.out_ptr[0], [off], inbounds=True)
        al = self.out_dtype.size_in_bytes
        if w == 1:
            b.store(v, p, align=al)
        else:
            b.store(v, b.bitcast(p, v.type.as_pointer()), align=al)


def build(spec: RedSpec, name="red") -> str:
    k = _RedKernel(spec, name)
    k.build()
    k.b.ret_void()
    return str(k.m)


get_kernel = jit.KernelCache(lambda spec: (build(spec, "red"), "red"), KERNEL_FN)
registry.register(RedSpec, lambda spec: build(spec, "red"), get_kernel, lanes)
