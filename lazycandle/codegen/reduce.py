"""Reduction kernels (sum, mean, prod, max, min, argmax, argmin over any set of dims), with the
elementwise producers of the reduced value fused in (the same instruction DAG as elementwise
kernels, evaluated per input element).

Two loop shapes, chosen by where the innermost input dim lands:
  inner-reduce  (the last dim is reduced, e.g. sum(-1)): one unit per output element, run
                ROWS units (rows) side by side when only the last dim is reduced, so several
                streams of the input are in flight and prefetched; the innermost reduced dim
                runs W-wide with UNROLL / ROWS vector accumulators per row, then a
                horizontal combine per row;
  inner-output  (the last dim is kept, e.g. sum(0)): one unit per strip of at most
                OUTPUT_STRIP outputs of a row (so two threads share a single row of outputs;
                the strips of one row that one call runs are walked as one);
                the strip's accumulators (codegen/reduce_strip.py; argmax / argmin here)
                sit in a stack array while the reduced dims are
                walked in passes over the strip, so every step reads contiguous runs of the
                input (argmax / argmin keep U vectors of outputs and indices in registers).
                A strip of a whole row of adjacent rows reads one row per pass (ONE_ROW;
                for f32-valued sums, rows shorter than a PAGE): the input is then one
                stream, which Zen 4's prefetchers follow at the memory's rate, where 8 rows
                per pass over short rows they do not (sum(0) f32 (65536, 256), 1 thread:
                5.2 -> 2.5 ms; max(0) 7.4 -> 2.3; max(0) (4096, 1024) 0.51 -> 0.33).
                Other strips (two threads sharing each row, rows wider than OUTPUT_STRIP,
                views) read ROW_BLOCK rows per pass: one row per pass over half of each row
                took twice as long ((2048, 4096) sum(0): 2.5 against 1.25 ms).  A strip of
                at most ROW_PREFETCH_BYTES a row (narrow rows, or two threads each reading
                half of every 4 KiB page) prefetches the same place of the next block's
                rows: the hardware prefetcher starts a stream per page and row and runs past
                a short strip into the other thread's half.
How many streams run at once and what is prefetched depends on the host CPU (_stream_tuning).
Like elementwise kernels, reduce kernels are compiled per shape class (sizes and strides other
than 0 / 1 arrive in the `sizes` array): the vectorised dim runs U = 4 vectors at a time while
4 W elements remain, then one vector at a time, then a scalar tail, so one kernel serves every
length.
Float sums and products accumulate in f64 (f32/f16/bf16 inputs: an f32-valued sum over the
last dim loads full registers of f32, adds groups of PAIRED of them pairwise in f32 and widens
each group into f64 accumulators; over leading dims it adds groups of CHAIN rows in one f32
chain, kept in a second stack array between passes, and widens each group once), integer ones
wrap in their dtype;
max/min propagate NaN like np.max (over the last dim the float accumulators take only ordered
values and a NaN seen is kept in a mask beside them, so each vector costs one compare and
select); argmax/argmin keep the first index on ties (a NaN counts as
the maximum / minimum, first one wins, like NumPy).
At one thread every form read a 16 MiB L3-resident input at the stream rate on an Intel host
(Emerald Rapids); on AMD Zen 4 an f32 sum that widened every value was bound by its f32 -> f64
conversions instead (one 512-bit register per 2 cycles: 55 GB/s), hence PAIRED.  Measured and
dropped: the next row block's prefetch on strips of whole pages (3 % slower at 1 thread on 4 KiB
rows) and walking the first strip backwards (inner-output); non-temporal prefetch and cldemote,
meant to leave the caller's L2 to the interpreter, evict the input from the L3, so the next call
reads DRAM (3x slower).
"""
from __future__ import annotations

import contextlib

import llvmlite.ir as ir

from .. import dtype as D
from ..ir.kernels import MIN_STRIP, OUTPUT_STRIP, RedSpec
from ..ir.ops import reduction
from .elementwise import _Kernel, _emit_instrs
from .fused import red_lanes as lanes
from .jit import host_info
from .llvmutil import I8, I32, I64, F64, intrinsic, ltype, vec, splat, const, width_of, FM_REDUCE
from .loops import counted_loop, finalize_ir, plain_latch, unit_range
from .reduce_strip import StripTuning, reduce_strip

ROW_BLOCK = 8   # inner-output, narrower strips: reduced rows per pass (trip of an accumulator through L1)
UNROLL = 4      # vector accumulators (inner-reduce) / output vectors (inner-output) per step


def _stream_tuning(cpu: str) -> tuple:
    """(ROWS, PREFETCH, ROW_PREFETCH_BYTES) on a host CPU (LLVM's name for it): how many
    streams a reduction reads at once and what software prefetch helps the hardware's.
    Intel cores: 4 rows side by side ran 20-25 % faster from DRAM than one row at a time, a
    prefetch 16 KiB ahead took 6-9 % more off (sum(-1), 128 MiB), and the next row block's
    prefetch on narrow strips took sum(0) f32 (2 threads) (4096, 1024) 310-316 -> 279-281 us,
    (8192, 512) 378 -> 314-317, (1 thread) (32768, 128) 674-685 -> 503.  AMD Zen 4 runs the same
    code at about half the stream rate; its own prefetchers follow one row at a time best, with
    no software prefetch: sum(-1) f32, 1 thread, (16384, 1024) 16 -> 31-34 GB/s, (65536, 256)
    8-10 -> 24-30, (4096, 1024) in the L3 31-38 -> 46-48, 2 threads 64-72 -> 81; sum(0)
    (4096, 1024), 2 threads 35 -> 60 (python -m bench.reduce_streams, compiled, rotating)."""
    return (1, 0, 0, True) if cpu.startswith("znver") else (4, 16384, 2048, False)


# ROWS: inner-reduce rows read side by side (UNROLL / ROWS accumulators each); PREFETCH: bytes
# inner-reduce reads ahead by software prefetch (0: none); ROW_PREFETCH_BYTES: an inner-output
# strip of at most this many bytes a row prefetches the same place of the next row block as it
# reads each row; ONE_ROW: an inner-output strip of a whole row of adjacent rows reads one row
# per pass instead of ROW_BLOCK
ROWS, PREFETCH, ROW_PREFETCH_BYTES, ONE_ROW = _stream_tuning(host_info()["cpu"])
PAGE = 4096         # f32-valued sums read one row per pass only over rows shorter than this (bytes)
CHAIN = 16          # inner-output f32-valued sums: rows added in one f32 chain before one widening

PAIRED = 4          # f32-valued sums: full registers added pairwise in f32 before one widening to f64
PAIR_FLAGS = ()      # the f32 adds of a group stay a tree (no reassoc): its bound holds, and it ran faster
SUM_GROUPS = 1      # inner-reduce f32-valued sums: groups of PAIRED registers per row and step
F32_BLOCK = 256     # row.py's blocked f32 sums over a row: elements per f32 partial (a multiple of U * 2W)


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
        self.val_t = ltype(self.val_dt.compute)
        self.is_arg = self.red.finish == "index"
        self.is_float = self.val_dt.is_float
        # a float sum whose values compute in f32 adds them in f32 at full width (2W lanes)
        # for a bounded number of terms, then widens into its f64 accumulators
        self.narrow_sum = (self.red.combine == "add" and self.acc_t == F64
                           and self.val_dt.is_float and self.val_dt.compute == "float")
        self.nan_apart = self.is_float and self.red.combine in ("max", "min") and not self.is_arg
        b, count = self.b, I64(1)
        for d, r in enumerate(spec.red):
            if r:
                count = b.mul(count, self.dims[d])
        self.count_f = b.sitofp(count, self.acc_t) if self.is_float else None
        # reduce_strip evaluates f32 sums at 2W lanes: runtime scalars need splats at that width
        self.scalar_splats.update({(k, 2 * self.W): splat(b, v, 2 * self.W) for k, v in enumerate(self.scalar_vals)})

    # -- the combine step -----------------------------------------------------------------
    def value(self, offs, strides, w, given=None, widen=True):
        """The reduced value at w lanes, in the accumulator type (in its own computed type
        when not `widen`)."""
        b = self.b

        def load(k):
            if given and k in given:
                return given[k]
            return self.load(k, offs[k], strides[k], w)

        v = _emit_instrs(b, self.spec, load, w, self.scalar, decode_outputs=True)[0]
        t = vec(self.acc_t, w)
        if v.type != t and widen:
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
        if idxs is None and self.red.combine in ("max", "min"):
            # exact in any order: halves combined as vectors (log2 w steps, not w - 1 in a chain)
            while w > 1:
                w //= 2
                lo, hi = (b.shuffle_vector(acc, acc, ir.Constant(ir.VectorType(I32, w), [I32(h * w + i) for i in range(w)]))
                          for h in range(2))
                acc = self.combine(lo, hi)
            return b.extract_element(acc, I32(0)), None
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
        if spec.inner_reduce:
            def base(u):
                return self.offsets(self.unravel(u, out_dims) if out_dims else {})[0]

            R = ROWS if len(red_dims) == 1 and not self.is_arg else 1
            blocked = lo
            if R > 1:
                blocked = b.add(lo, b.mul(b.sdiv(b.sub(hi, lo), I64(R)), I64(R)))
                with counted_loop(b, lo, blocked, R, "units") as u:
                    us = [b.add(u, I64(r)) for r in range(R)]
                    self.reduce_inner([base(x) for x in us], us, red_dims)
            with counted_loop(b, blocked, hi, 1, "unit") as u:
                self.reduce_inner([base(u)], [u], red_dims)
            return
        jd = out_dims[-1]
        m = self.dims[jd]
        with self.strips(lo, hi, m) as (outer, j_lo, j_hi):
            in_base, _ = self.offsets(self.unravel(outer, out_dims[:-1]) if len(out_dims) > 1 else {})
            walk = self.reduce_outer if self.is_arg else self.reduce_strip
            walk(in_base, b.mul(outer, m), red_dims, jd, j_lo, j_hi)

    @contextlib.contextmanager
    def strips(self, lo, hi, m):
        """Loop over the strips of units [lo, hi); yields (outer row, first output, end output).
        A row's m outputs split into ir.kernels.output_strips(m) strips of equal width (a
        multiple of W; the last may be shorter or empty), so that two threads can share a row;
        consecutive strips of one row that the same call runs are walked as ONE strip while
        it fits OUTPUT_STRIP (one thread then reads whole rows: a thread reading half of each
        4 KiB page loses a fifth of the bandwidth to the prefetcher fetching the other half).
        Each output is summed in the same order either way, so results do not depend on the
        split."""
        b, W = self.b, self.W
        s = b.udiv(b.add(m, I64(OUTPUT_STRIP - 1)), I64(OUTPUT_STRIP))
        least = b.select(b.icmp_signed(">=", m, I64(2 * MIN_STRIP)), I64(2), I64(1))
        s = b.select(b.icmp_unsigned("<", s, least), least, s)
        s = b.select(b.icmp_unsigned(">", s, I64(1)), b.add(s, b.and_(s, I64(1))), s)
        width = b.udiv(b.add(m, b.sub(s, I64(1))), s)
        width = b.mul(b.udiv(b.add(width, I64(W - 1)), I64(W)), I64(W))
        width = b.select(b.icmp_unsigned("<", width, I64(W)), I64(W), width)
        per = b.udiv(I64(OUTPUT_STRIP), width)         # strips merged at most (>= 1)

        def least_of(x, y):
            return b.select(b.icmp_signed("<", x, y), x, y)

        pre = b.block
        head = self.fn.append_basic_block("strip.head")
        body = self.fn.append_basic_block("strip.body")
        done = self.fn.append_basic_block("strip.done")
        b.branch(head)
        b.position_at_end(head)
        u = b.phi(I64, name="unit")
        u.add_incoming(lo, pre)
        b.cbranch(b.icmp_signed("<", u, hi), body, done)
        b.position_at_end(body)
        outer, strip = b.udiv(u, s), b.urem(u, s)
        k = least_of(least_of(per, b.sub(hi, u)), b.sub(s, strip))
        j_lo = least_of(b.mul(strip, width), m)
        yield outer, j_lo, least_of(b.mul(b.add(strip, k), width), m)
        u.add_incoming(b.add(u, k), b.block)
        b.branch(head)
        b.position_at_end(done)

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

    @contextlib.contextmanager
    def row_loops(self, rows, red_dims):
        """The loops over every reduced dim but the last, for a block of `rows` (each a list
        of input offsets); yields the offsets of each row.  A block of several rows has one
        reduced dim (build makes it so), so there is nothing to loop over."""
        if len(rows) > 1:
            yield rows
            return
        with self.red_loops(red_dims[:-1], rows[0]) as (offs, _):
            yield [offs]

    def row_unroll(self, R):
        """Vector accumulators per row in a block of R rows.  A float sum or product keeps the
        block's count for a row run alone too (the rows left over by the block loop), so each
        row is added in the same order wherever the thread split puts it."""
        if self.is_float and self.red.combine in ("add", "mul"):
            R = ROWS
        return max(1, UNROLL // R)

    def reduce_inner(self, rows, outs, red_dims):
        """Everything reduced for the output elements `outs` (a block of rows read side by side,
        so that several streams are in flight); the last reduced dim runs W-wide with
        row_unroll vector accumulators per row, then a horizontal combine per row."""
        if self.narrow_sum:
            return self.sum_inner_widened(rows, outs, red_dims)
        if self.is_arg:
            return self.arg_inner(rows[0], outs[0], red_dims)
        b, W, R = self.b, self.W, len(rows)
        last = red_dims[-1]
        n = self.dims[last]
        U = self.row_unroll(R)
        nvec = b.mul(b.udiv(n, I64(U * W)), I64(U * W))
        n1 = b.mul(b.udiv(n, I64(W)), I64(W))
        accs = [[self.slot(vec(self.acc_t, W)) for _ in range(U)] + [self.slot(self.acc_t)] for _ in rows]
        for a in (a for row in accs for a in row):
            b.store(self.init(width_of(a.type.pointee)), a)
        # float max / min: the accumulators take only ordered values (one compare and select
        # per vector) and a NaN seen is recorded in a mask off their dependency chain
        nans = [[self.slot(vec(ir.IntType(1), W)), self.slot(ir.IntType(1))] for _ in rows] if self.nan_apart else None
        for m in (m for row in nans or () for m in row):
            b.store(const(m.type.pointee, 0), m)

        def step(r, k, o, w):
            if not nans:
                return self._step(accs[r][k], None, o, sl, w, None)
            v, acc = self.value(o, sl, w), b.load(accs[r][k])
            b.store(b.select(b.fcmp_ordered(">" if self.red.combine == "max" else "<", v, acc), v, acc), accs[r][k])
            mask = nans[r][0 if w > 1 else 1]
            b.store(b.or_(b.load(mask), b.fcmp_unordered("uno", v, v)), mask)

        sl = [s[last] for s in self.strides]
        with self.row_loops(rows, red_dims) as row_offs:
            with counted_loop(b, I64(0), nvec, U * W, "rv") as i:
                for offs in row_offs:
                    self.prefetch([self.sadd(x, i, s) for x, s in zip(offs, sl)], sl)
                for k in range(U):
                    j = b.add(i, I64(k * W))
                    for r, offs in enumerate(row_offs):
                        step(r, k, [self.sadd(x, j, s) for x, s in zip(offs, sl)], W)
            with counted_loop(b, nvec, n1, W, "r1") as j:
                for r, offs in enumerate(row_offs):
                    step(r, 0, [self.sadd(x, j, s) for x, s in zip(offs, sl)], W)
            with counted_loop(b, n1, n, 1, "rt") as j:
                for r, offs in enumerate(row_offs):
                    step(r, U, [self.sadd(x, j, s) for x, s in zip(offs, sl)], 1)
        for r, out_off in enumerate(outs):
            s, _ = self.hreduce([b.load(a) for a in accs[r][:U]])
            s = self.combine(s, b.load(accs[r][U]))
            if nans:
                lanes_nan = b.icmp_unsigned("!=", b.bitcast(b.load(nans[r][0]), ir.IntType(W)), ir.IntType(W)(0))
                s = b.select(b.or_(lanes_nan, b.load(nans[r][1])), ir.Constant(self.acc_t, float("nan")), s)
            self._store(out_off, s, 1)

    def prefetch(self, offs, strides):
        """Prefetch PREFETCH bytes ahead of `offs` in every unit-stride input: the hardware
        prefetcher alone leaves a last-dim reduction a few percent under the stream rate from
        DRAM (each 4 KiB page of a row starts a new prefetch stream), where _stream_tuning
        says so."""
        if not PREFETCH:
            return
        self.prefetch_at({k: self.b.add(o, I64(PREFETCH // self.in_dt[k].size_in_bytes))
                          for k, (o, s) in enumerate(zip(offs, strides)) if s == 1})

    def prefetch_at(self, offs):
        """Prefetch the element at offset `offs[k]` of input k, for each k in the dict."""
        b = self.b
        fn = intrinsic(self.m, "llvm.prefetch.p0i8", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
        for k, o in offs.items():
            p = b.bitcast(b.gep(self.in_ptr[k], [o]), I8.as_pointer())
            b.call(fn, [p, I32(0), I32(3), I32(1)])

    def arg_inner(self, in_base, out_off, red_dims):
        """reduce_inner for argmax / argmin (one row): U W-lane accumulators and their indices,
        the first index winning ties."""
        b, W, U = self.b, self.W, UNROLL
        last = red_dims[-1]
        n = self.dims[last]
        nvec = b.mul(b.udiv(n, I64(U * W)), I64(U * W))
        n1 = b.mul(b.udiv(n, I64(W)), I64(W))
        accs = [self.slot(vec(self.acc_t, W)) for _ in range(U)] + [self.slot(self.acc_t)]
        idxs = [self.slot(vec(I64, W)) for _ in range(U)] + [self.slot(I64)]
        for k, a in enumerate(accs):
            w = W if k < U else 1
            b.store(self.init(w), a)
            b.store(const(vec(I64, w), 0), idxs[k])
        sl = [s[last] for s in self.strides]
        with self.red_loops(red_dims[:-1], in_base) as (offs, flat):
            with counted_loop(b, I64(0), nvec, U * W, "rv") as i:
                for k in range(U):
                    j = b.add(i, I64(k * W))
                    o = [self.sadd(x, j, s) for x, s in zip(offs, sl)]
                    self._step(accs[k], idxs[k], o, sl, W, self._lanes(b.add(flat, j), W))
            with counted_loop(b, nvec, n1, W, "r1") as j:
                o = [self.sadd(x, j, s) for x, s in zip(offs, sl)]
                self._step(accs[0], idxs[0], o, sl, W, self._lanes(b.add(flat, j), W))
            with counted_loop(b, n1, n, 1, "rt") as j:
                o = [self.sadd(x, j, s) for x, s in zip(offs, sl)]
                self._step(accs[U], idxs[U], o, sl, 1, b.add(flat, j))
        s, si = self.hreduce([b.load(a) for a in accs[:U]], [b.load(x) for x in idxs[:U]])
        s, si = self.arg_pick(s, si, b.load(accs[U]), b.load(idxs[U]))
        self._store(out_off, si, 1)

    def pairwise(self, vals, flags=FM_REDUCE):
        """The sum of `vals` as a balanced tree of adds (an odd one out joins a level later)."""
        while len(vals) > 1:
            vals = [self.b.fadd(vals[k], vals[k + 1], flags=flags) if k + 1 < len(vals) else vals[k]
                    for k in range(0, len(vals), 2)]
        return vals[0]

    def sum_inner_widened(self, rows, outs, red_dims):
        """reduce_inner for an f32-valued sum: each step of the last reduced dim loads SUM_GROUPS
        groups of PAIRED full registers (E = 2W f32 lanes) per row; a group is added pairwise
        in f32 and its E lanes widened into two W-lane f64 accumulators (2 SUM_GROUPS chains
        per row, the same for a row run alone); then E-wide steps and a scalar tail, widened
        with no f32 addition.  A value meets at most log2(PAIRED) f32 roundings (error at most
        log2(PAIRED) u sum|x|, u = 2^-24; on rows of normal values about 0.4x the error of
        NumPy's pairwise f32 sum), and there are 2 conversions per PAIRED registers instead of
        2 per register.  Widening every value was bound by the conversions on Zen 4 (one
        512-bit register per 2 cycles); sum(-1) f32 (4096, 1024), L3-resident, compiled, 1
        thread: widening every value 0.342-0.387 ms, PAIRED = 4 0.280-0.301, torch 0.281-0.295;
        PAIRED = 8 or 2 groups a step were no faster, and a chain of adds (reassociated) was
        slower than the tree (python -m bench.host_choices --sum)."""
        b, W = self.b, self.W
        G, E = SUM_GROUPS, 2 * W
        step_len = G * PAIRED * E
        last = red_dims[-1]
        n = self.dims[last]
        nvec = b.mul(b.udiv(n, I64(step_len)), I64(step_len))
        n1 = b.mul(b.udiv(n, I64(E)), I64(E))
        accs = [[self.slot(vec(F64, W)) for _ in range(2 * G)] for _ in rows]
        tails = [self.slot(F64) for _ in rows]
        for a in (a for row in accs for a in row):
            b.store(self.init(W), a)
        for t in tails:
            b.store(self.init(1), t)
        sl = [s[last] for s in self.strides]

        def at(offs, j):
            return [self.sadd(x, j, s) for x, s in zip(offs, sl)]

        def widen_into(r, g, v):
            """E f32 lanes into accumulators 2g and 2g + 1 of row r."""
            for h in range(2):
                a = accs[r][2 * g + h]
                half = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, W), [I32(h * W + i) for i in range(W)]))
                b.store(b.fadd(b.load(a), b.fpext(half, vec(F64, W)), flags=FM_REDUCE), a)

        with self.row_loops(rows, red_dims) as row_offs:
            # (LLVM's 8x unroll of this loop made the L3-resident (4096, 1024) sum 4-15 % slower)
            with counted_loop(b, I64(0), nvec, step_len, "rv", on_latch=plain_latch(b)) as i:
                for offs in row_offs:
                    self.prefetch(at(offs, i), sl)
                for g in range(G):
                    for r, offs in enumerate(row_offs):
                        loads = [self.value(at(offs, b.add(i, I64((g * PAIRED + k) * E))), sl, E, widen=False)
                                 for k in range(PAIRED)]
                        widen_into(r, g, self.pairwise(loads, PAIR_FLAGS))
            with counted_loop(b, nvec, n1, E, "r1") as j:
                for r, offs in enumerate(row_offs):
                    widen_into(r, 0, self.value(at(offs, j), sl, E, widen=False))
            with counted_loop(b, n1, n, 1, "rt") as j:
                for r, offs in enumerate(row_offs):
                    b.store(b.fadd(b.load(tails[r]), self.value(at(offs, j), sl, 1), flags=FM_REDUCE), tails[r])
        for r, out_off in enumerate(outs):
            s, _ = self.hreduce([b.load(a) for a in accs[r]])
            self._store(out_off, b.fadd(s, b.load(tails[r]), flags=FM_REDUCE), 1)

    def reduce_strip(self, in_base, out_row, red_dims, jd, j_lo, j_hi):
        reduce_strip(self, StripTuning(UNROLL, ROW_BLOCK, ROW_PREFETCH_BYTES, ONE_ROW, PAGE, CHAIN, PAIR_FLAGS),
                     in_base, out_row, red_dims, jd, j_lo, j_hi)

    def reduce_outer(self, in_base, out_row, red_dims, jd, j_lo, j_hi):
        """Outputs [j_lo, j_hi) of one row for argmax/argmin: U x W output lanes (and their
        indices) held in registers while the reduced dims are walked; then a scalar tail."""
        b, W = self.b, self.W
        n = b.sub(j_hi, j_lo)
        nvec = b.add(j_lo, b.mul(b.udiv(n, I64(UNROLL * W)), I64(UNROLL * W)))
        m1 = b.add(j_lo, b.mul(b.udiv(n, I64(W)), I64(W)))
        m = j_hi
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

        with counted_loop(b, j_lo, nvec, UNROLL * W, "jv") as j0:
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
    return finalize_ir(k.m)

