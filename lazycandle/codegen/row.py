"""Row kernels (ir/kernels.py RowSpec): softmax, log_softmax, layer_norm, rms_norm, logsumexp and
the like as ONE kernel, parallel over rows.

Per row [lo, hi): for each stage of RowSpec.stages(), one pass over the row evaluates the
per-element producers of that stage's reductions and reduces them (U vector accumulators of W
lanes, then W lanes, then a scalar tail, combined as codegen/reduce.py combines them and
finished in halving steps; an f32 sum adds BLOCK_CHAINS independent f32 partials per block of
F32_BLOCK elements into its f64 accumulators, which keeps SPEC's accuracy without an f32 -> f64
conversion per element or a row-long chain of dependent adds); between passes the per-row
instrs whose reductions are done run once, on scalars; a last pass evaluates the full-row
outputs (W-wide body + one masked step; non-temporal stores when the outputs are larger than
L2) and the per-row outputs are stored.  A pass re-reads the row, which is still in L1/L2
from the pass before, and recomputes the cheap per-element producers instead of storing them
(a costly one, softmax's exp, is stashed by the last reduction pass: in a stack row buffer
when the row fits, else in the output); the passes after the first prefetch the next row, so
that only the first pass of the first row waits on DRAM.  Per-row values reach the
per-element DAG as extra scalar slots (slot = runtime scalars + instr index), so
elementwise._emit_instrs evaluates every DAG unchanged (each op rounded in its dtype, like op
at a time).
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from .. import dtype as D
from ..ir.kernels import RowSpec
from ..ir.ops import OPS, reduction
from . import codecs, jit
from .elementwise import _Kernel, _cast, _emit_instrs, _bits, lanes as ew_lanes
from .llvmutil import I8, I32, I64, F32, F64, VOID, intrinsic, ltype, vec, splat, width_of
from .loops import counted_loop, unit_range
from .reduce import F32_BLOCK, UNROLL, _RedKernel


STASH_COST = 4     # op cost of a per-element value worth writing once rather than computing twice
STASH_ROW = 4096   # elements of the per-thread row buffer a stash uses when the row fits (16 KiB of f32)
BLOCK_CHAINS = 4   # independent f32 partial sums per step of a blocked f32 sum (F32_BLOCK a multiple of 4 E)


def _reciprocal_divide(cpu: str) -> bool:
    """Whether an f32 division by a row value becomes a multiplication by its f64 reciprocal
    (divide_by_reciprocals) on a host CPU (LLVM's name for it), or stays a vector divide; both
    give the correctly rounded quotient.  Intel cores divide 512-bit vectors slowly and
    convert f32 <-> f64 at full rate; AMD Zen 4 is the other way round (4 conversions per 16
    lanes cost more than one vdivps): layer_norm (4096, 1024) f32, 1 thread, compiled,
    rotating: 319 -> 265 ns a row with the divide (256 rows, L2-resident: 424 -> 350; torch
    424-446), softmax 561 -> 543."""
    return not cpu.startswith("znver")


RECIPROCAL_DIVIDE = _reciprocal_divide(jit.host_info()["cpu"])


@dataclass(frozen=True)
class _Sub:
    """A part of a row kernel's DAG in the shape _emit_instrs evaluates."""
    inputs: tuple
    instrs: tuple
    outputs: tuple


class _Acc:
    """One reduction's accumulator rules, borrowed from the reduce kernel generator."""
    init, better, combine = _RedKernel.init, _RedKernel.better, _RedKernel.combine
    is_arg = False

    def __init__(self, b, kind, val_dt, out_dt):
        self.b, self.red, self.val_dt, self.out_dt = b, reduction(kind), val_dt, out_dt
        self.is_float = val_dt.is_float
        self.acc_t = F64 if self.red.acc == "f64" and self.is_float else ltype(val_dt.compute)

    def hreduce(self, accs):
        """The accumulators combined into one scalar: lane-wise, then halving the vector
        (log2 W dependent steps; a lane-by-lane chain of NaN-aware max selects cost a row
        about W times their latency)."""
        b, acc = self.b, accs[0]
        for x in accs[1:]:
            acc = self.combine(acc, x)
        w = width_of(acc.type)
        while w > 1:
            h = w // 2
            lo, hi = (b.shuffle_vector(acc, acc, ir.Constant(ir.VectorType(I32, h), list(range(o, o + h))))
                      for o in (0, h))
            acc, w = self.combine(lo, hi), h
        return (b.extract_element(acc, I32(0)) if isinstance(acc.type, ir.VectorType) else acc), None

    def widen(self, v):
        t = vec(self.acc_t, width_of(v.type))
        return self.b.fpext(v, t) if v.type != t and self.is_float else v

    def result(self, acc, n):
        """The row value: finished like the reduce kernel's output, in the output's compute type."""
        b = self.b
        if self.red.finish == "divide_count":
            acc = b.fdiv(acc, b.sitofp(n, self.acc_t))
        if self.acc_t == F64 and self.is_float:
            return _cast(b, acc, D.f64, self.out_dt)
        return acc


def pass_lanes(spec: RowSpec, accs) -> int:
    """W of a reduction pass: reduce.lanes' rule (f64 accumulators count as 64-bit)."""
    bits = max([_bits(D.DType.from_name(dt)) for dt, _ in spec.inputs] +
               [_bits(D.DType.from_name(i[3])) for i in spec.instrs] + [32])
    if any(a.acc_t == F64 for a in accs):
        bits = 64
    return max(2, jit.vector_bits() // bits)


def lanes(spec: RowSpec) -> int:
    """W of the final (output) pass."""
    return ew_lanes(spec)


def value_numbers(instrs) -> list:
    """Per instr, a number equal for instrs that compute the same value (same op, arg, dtypes and
    operands, operands compared by their numbers): hash-consing, linear in the DAG, where keys
    nesting the operands' keys would repeat every shared subexpression (exponential in depth)."""
    table: dict = {}
    nums: list = []
    for op, arg, dt, odt, refs in instrs:
        key = (op, arg, dt, odt, tuple(("v", nums[r[1]]) if r[0] == "v" else r for r in refs))
        nums.append(table.setdefault(key, len(table)))
    return nums


class _RowKernel(_Kernel):
    slot = _RedKernel.slot
    ROW_STREAMING = True

    def __init__(self, spec: RowSpec, name: str):
        super().__init__(spec, name, lanes(spec))
        self.row = spec
        self.n_scalars = len(spec.scalars)
        self.row_vals = {}
        self.next_row = None     # per input: element distance to the next row's start, while prefetching
        self.stash_row = None    # per row: where the stash of the last reduction pass lives (see stash_scratch)

    def load(self, k, off, stride, w, mask=None):
        """The elementwise load; while `next_row` is set, a full-vector load of a row input
        also prefetches the same lanes of the next row (a row is often one 4 KiB page, where
        the hardware prefetcher stops, so the next row's first pass would wait on DRAM)."""
        if self.next_row is not None and k < len(self.next_row) and self.next_row[k] is not None \
                and stride != 0 and w > 1 and mask is None:
            b = self.b
            fn = intrinsic(self.m, "llvm.prefetch.p0i8", VOID, [I8.as_pointer(), I32, I32, I32])
            p = b.bitcast(b.gep(self.in_ptr[k], [b.add(off, self.next_row[k])]), I8.as_pointer())
            b.call(fn, [p, I32(0), I32(3), I32(1)])
        return super().load(k, off, stride, w, mask)

    def scalar(self, k, w):
        """Runtime scalar k, or (k >= the runtime scalars) the row value of instr k - n_scalars."""
        v = self.row_vals[k] if isinstance(k, tuple) else \
            self.scalar_vals[k] if k < self.n_scalars else self.row_vals[k - self.n_scalars]
        if w == 1:
            return v
        got = self.scalar_splats.get((k, w)) if isinstance(k, int) and k < self.n_scalars else None
        return got if got is not None else splat(self.b, v, w)

    def sub(self, cone, outputs, extra=(), leaves=None):
        """_Sub of instrs `cone` (indices, in order), then `extra` instrs (refs in kernel terms),
        with `outputs` [(position in the sub, dtype)]; refs to row values become scalar refs and
        refs to `leaves` {instr: input index} read that input."""
        at, leaves = {j: i for i, j in enumerate(cone)}, leaves or {}

        def ref(r):
            if r[0] != "v":
                return r
            if r[1] in leaves:
                return ("i", leaves[r[1]])
            return ("v", at[r[1]]) if r[1] in at else ("s", self.n_scalars + r[1], self.row.instrs[r[1]][3])
        instrs = [(op, arg, dt, odt, tuple(ref(r) for r in refs)) for op, arg, dt, odt, refs in
                  [self.row.instrs[j] for j in cone] + list(extra)]
        inputs = self.row.inputs + tuple((self.row.instrs[j][3], ()) for j in sorted(leaves, key=leaves.get))
        return _Sub(inputs, tuple(instrs), tuple(outputs))

    def cone(self, refs, leaves=()):
        """The per-element instrs the values `refs` are computed from, in order (stopping at
        `leaves`)."""
        spec, out, stack = self.row, set(), [r[1] for r in refs if r[0] == "v"]
        while stack:
            j = stack.pop()
            if j in out or spec.levels[j] != "e":
                continue
            out.add(j)
            if j not in leaves:
                stack += [r[1] for r in spec.instrs[j][4] if r[0] == "v"]
        return sorted(out)

    def cost(self, cone) -> int:
        return sum(OPS[self.row.instrs[j][0]].cost for j in cone)

    def eval_row_instrs(self, in_base, ready):
        """Per-row elementwise instrs whose reductions are done, once per row (scalars)."""
        spec = self.row
        todo = [j for j in range(len(spec.instrs)) if spec.levels[j] == "r" and not spec.is_reduction(j)
                and j not in self.row_vals and ready(j)]
        if not todo:
            return
        sub = self.sub(todo, [(i, spec.instrs[j][3]) for i, j in enumerate(todo)])
        vals = _emit_instrs(self.b, sub, lambda k: self.load(k, in_base[k], 0, 1), 1, self.scalar,
                            decode_outputs=True)
        self.row_vals.update(zip(todo, vals))

    def reduce_pass(self, reds, in_base, row_str, n, stash=None, out_base=None):
        """One pass over the row computing the reductions `reds` (instr indices); `stash` (instr,
        output k) also writes that per-element value to full output k, for the last pass."""
        b, spec = self.b, self.row
        accs = [_Acc(b, spec.instrs[j][0], D.DType.from_name(spec.instrs[j][2]), D.DType.from_name(spec.instrs[j][3]))
                for j in reds]
        operands = [spec.instrs[j][4][0] for j in reds]
        cone = self.cone(operands)
        copies = [("copy", None, spec.instrs[j][2], spec.instrs[j][2], (r,)) for j, r in zip(reds, operands)]
        outs = [(len(cone) + i, spec.instrs[j][2]) for i, j in enumerate(reds)]
        if stash:
            outs.append((cone.index(stash[0]), spec.instrs[stash[0]][3]))   # (pass instr, output instr, k)
        sub = self.sub(cone, outs, copies)
        W, U = pass_lanes(spec, accs), UNROLL
        E = min(max(W, ew_lanes(sub)), U * W)   # evaluate E lanes at once, accumulate W-wide halves
        blocked = [a.acc_t == F64 and a.red.combine == "add" and a.val_dt == D.f32 for a in accs]
        # a step covers S lanes: U W-wide accumulators, or BLOCK_CHAINS f32 partials of E lanes
        # each (independent add chains hide the add latency; two would leave a row latency-bound)
        S = max(U * W, BLOCK_CHAINS * E) if any(blocked) else U * W
        slots = [[self.slot(vec(a.acc_t, W)) for _ in range(U)] + [self.slot(a.acc_t)] for a in accs]
        for a, sl in zip(accs, slots):
            for k, s in enumerate(sl):
                b.store(a.init(W if k < U else 1), s)
        # f32 sums: E-lane f32 partials per block of F32_BLOCK elements, added into the f64
        # accumulators after each block (no f32 -> f64 conversion per element)
        parts = [[self.slot(vec(F32, E)) for _ in range(S // E)] if bl else None for bl in blocked]

        def add_parts(a, part_slots, v, k):
            """The W-lane pieces of value v (w lanes, accumulator type) into slots k, k+1, ..."""
            w = width_of(v.type)
            for p in range(max(1, w // W)):
                piece = v if w <= W else b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, W),
                                                                            [p * W + x for x in range(W)]))
                q = k + p if w == 1 else (k + p) % U
                b.store(a.combine(b.load(part_slots[q]), piece), part_slots[q])

        def step(j, w, k, in_block=False):
            """Lanes [j, j + w) into accumulators k, k+1, ... (mod U; W lanes each; w = 1: the
            tail's); in a block, a blocked sum's lanes go into its f32 partial k * W // E."""
            offs = [self.sadd(x, j, s) for x, s in zip(in_base, row_str)]
            vals = _emit_instrs(b, sub, lambda q: self.load(q, offs[q], row_str[q], w), w, self.scalar,
                                decode_outputs=True)
            for a, sl, v, pt in zip(accs, slots, vals, parts):
                if in_block and pt is not None:
                    q = k * W // E
                    b.store(a.combine(b.load(pt[q]), v), pt[q])
                else:
                    add_parts(a, sl, a.widen(v), k)
            if stash:
                self.store_at(self.stash_row, self.out_dt[stash[2]], j, vals[-1], w)

        nvec = b.mul(b.udiv(n, I64(S)), I64(S))
        n1 = b.mul(b.udiv(n, I64(W)), I64(W))
        if any(blocked):
            with counted_loop(b, I64(0), nvec, F32_BLOCK, "rb") as blk:
                end = b.add(blk, I64(F32_BLOCK))
                end = b.select(b.icmp_signed("<", end, nvec), end, nvec)
                for pt in parts:
                    for x in pt or ():
                        b.store(ir.Constant(vec(F32, E), 0.0), x)
                with counted_loop(b, blk, end, S, "rv") as i:
                    for c in range(S // E):
                        step(b.add(i, I64(c * E)), E, c * E // W, True)
                for a, sl, pt in zip(accs, slots, parts):
                    for q, x in enumerate(pt or ()):
                        add_parts(a, sl, a.widen(b.load(x)), q * E // W)
        else:
            with counted_loop(b, I64(0), nvec, U * W, "rv") as i:
                for c in range(U * W // E):
                    step(b.add(i, I64(c * E)), E, c * E // W)
        with counted_loop(b, nvec, n1, W, "r1") as j:
            step(j, W, 0)
        with counted_loop(b, n1, n, 1, "rt") as j:
            step(j, 1, U)
        for j, a, sl in zip(reds, accs, slots):
            s, _ = a.hreduce([b.load(x) for x in sl[:U]])
            self.row_vals[j] = a.result(a.combine(s, b.load(sl[U])), n)

    def store_at(self, ptr, dt, off, v, w):
        """Store compute value(s) v (w lanes) of dtype dt at element `off` of `ptr`."""
        b = self.b
        v = codecs.encode(b, dt.codec, v) if dt.codec else v
        p = b.gep(ptr, [off], inbounds=True)
        b.store(v, p if w == 1 else b.bitcast(p, v.type.as_pointer()), align=dt.size_in_bytes)

    def stash_scratch(self, stash, full, n):
        """(a row buffer of STASH_ROW elements on the stack, i1 n <= STASH_ROW) for a stash that
        is not itself an output, else (None, None).  A row that fits keeps its stash there, in
        L1, instead of in the output: the output is then written once, in the last pass, and
        may stream (softmax: no read-for-ownership of an output row that is written twice)."""
        if not stash or any(j == stash[1] and k == stash[2] for k, j, _ in full):
            return None, None
        et = self.out_ptr[stash[2]].type.pointee
        buf = self.slot(ir.ArrayType(et, STASH_ROW))
        buf.align = 64
        return self.b.bitcast(buf, et.as_pointer()), self.b.icmp_signed("<=", self.dims[-1], I64(STASH_ROW))

    def pick_stash(self, stages, full):
        """(instr of the last reduction pass, the same value's instr in the output pass, output
        k): the costliest per-element value both passes compute (the recompute pass gives each
        reduction its own copy, so they are matched by what they compute), when an output of
        its dtype can hold it between the two passes (softmax: exp(x - max) is written by the
        sum's pass, then divided in place)."""
        spec = self.row
        if not stages or not full:
            return None
        keys = value_numbers(spec.instrs)
        last = {keys[j]: j for j in self.cone([spec.instrs[j][4][0] for j in stages[-1]])}
        shared = [j for j in self.cone([("v", j) for _, j, _ in full]) if keys[j] in last]
        best = max(shared, key=lambda j: (self.cost(self.cone([("v", j)])), j), default=None)
        if best is None or self.cost(self.cone([("v", best)])) < STASH_COST:
            return None
        holders = [k for k, j, dtn in full if j == best] + [k for k, j, dtn in full if dtn == spec.instrs[best][3]]
        return (last[keys[best]], best, holders[0]) if holders else None

    def build(self):
        spec, b = self.row, self.b
        lo, hi = unit_range(self.fn)
        n = self.dims[-1]
        row_str = [s[-1] for s in self.strides]
        need, stages = spec.needs(), [s for s in spec.stages() if s]
        full = [(k, j, dt) for k, (j, dt) in enumerate(spec.outputs) if spec.levels[j] == "e"]
        per_row = [(k, j, dt) for k, (j, dt) in enumerate(spec.outputs) if spec.levels[j] == "r"]
        stash = self.pick_stash(stages, full)
        scratch, fits = self.stash_scratch(stash, full, n)
        # non-temporal stores for large outputs, unless the write pass overwrites a stash it
        # just wrote in the output (streaming a line that is in cache costs more than it saves)
        stream = None
        if full and self.can_stream() and (not stash or scratch is not None):
            stream = self.streaming_wanted() if not stash else b.and_(self.streaming_wanted(), fits)
        with counted_loop(b, lo, hi, 1, "row") as r:
            in_base, _ = self.offsets(self.unravel(r, list(range(spec.rank - 1))))
            nxt, _ = self.offsets(self.unravel(b.add(r, I64(1)), list(range(spec.rank - 1))))
            deltas = [None if all(st[d] == 0 for d in range(spec.rank - 1)) else b.sub(x, y)
                      for x, y, st in zip(nxt, in_base, self.strides)]
            out_base = b.mul(r, n)
            if stash:
                out_row = b.gep(self.out_ptr[stash[2]], [out_base], inbounds=True)
                self.stash_row = out_row if scratch is None else b.select(fits, scratch, out_row)
            self.row_vals = {}
            for p, reds in enumerate(stages):
                self.eval_row_instrs(in_base, lambda j: need[j] < p)
                self.next_row = deltas if p > 0 else None     # the first pass is the one that waits
                self.reduce_pass(reds, in_base, row_str, n, stash if p == len(stages) - 1 else None, out_base)
                self.next_row = None
            self.eval_row_instrs(in_base, lambda j: True)
            for k, j, dtn in per_row:
                dt = D.DType.from_name(dtn)
                v = self.row_vals[j]
                v = codecs.encode(b, dt.codec, v) if dt.codec else v
                b.store(v, b.gep(self.out_ptr[k], [r], inbounds=True), align=dt.size_in_bytes)
            if full:
                self.next_row = deltas if stages else None
                self.write_rows(full, in_base, out_base, row_str, n, stash, stream)
                self.next_row = None
        if stream is not None:
            with b.if_then(stream):
                self.store_fence()          # the streamed stores are visible before we return
        b.ret_void()

    def write_rows(self, full, in_base, out_base, row_str, n, stash, stream):
        """The last pass: the full-row outputs, through the elementwise inner loop; a stashed
        value is read back from the output that holds it.  `stream` (an i1, see
        elementwise.streaming_min_bytes: outputs larger than L2) makes the stores non-temporal,
        so a row written once is not first read into the cache (read-for-ownership)."""
        if stash:           # an output holding its own value is already written
            full = [o for o in full if o[1] != stash[1] or o[0] != stash[2]]
            if not full:
                return
        leaves = {stash[1]: len(self.in_ptr)} if stash else {}
        cone = [j for j in self.cone([("v", j) for _, j, _ in full], leaves) if j not in leaves]
        at = {j: i for i, j in enumerate(cone)}
        sub = self.sub(cone, [(at[j], dt) for _, j, dt in full], leaves=leaves)
        if RECIPROCAL_DIVIDE:
            sub = self.divide_by_reciprocals(sub)
        saved = self.spec, self.out_ptr, self.out_dt, self.in_ptr, self.in_dt
        if stash:
            self.in_ptr = self.in_ptr + [self.stash_row]
            self.in_dt = self.in_dt + [self.out_dt[stash[2]]]
            in_base, row_str = list(in_base) + [I64(0)], list(row_str) + [1]
        self.spec = sub
        self.out_ptr = [saved[1][k] for k, _, _ in full]
        self.out_dt = [saved[2][k] for k, _, _ in full]
        self.inner_loop(I64(0), n, in_base, out_base, row_str, stream)
        self.spec, self.out_ptr, self.out_dt, self.in_ptr, self.in_dt = saved


    def divide_by_reciprocals(self, sub: _Sub) -> _Sub:
        """`sub` with each f32 division by a row value made a multiplication by that value's
        f64 reciprocal, computed once per row: RN32(e * RN64(1 / s)) in f64 is within 2^-52 of
        e / s, and an f32 quotient is never within 2^-49 of an f32 rounding midpoint, so this
        is exactly the f32 division (inf, NaN and zero divisors included) for a normal result,
        at a fraction of a vector divide's cost (softmax's write pass, layer_norm's normalise).
        Low-precision dtypes divide in f32 with their own rounding after, so they keep fdiv."""
        at, instrs = {}, []

        def ref(r):
            return ("v", at[r[1]]) if r[0] == "v" else r
        for j, (op, arg, dt, odt, refs) in enumerate(sub.instrs):
            refs = tuple(ref(r) for r in refs)
            d = refs[1] if op == "div" else None
            if not (dt == odt == "f32" and d and d[0] == "s" and d[1] >= self.n_scalars):
                at[j] = len(instrs)
                instrs.append((op, arg, dt, odt, refs))
                continue
            key = ("recip", d[1])
            if key not in self.row_vals:
                s64 = self.b.fpext(self.scalar(d[1], 1), F64)
                self.row_vals[key] = self.b.fdiv(ir.Constant(F64, 1.0), s64)
            n = len(instrs)
            instrs += [("cast", ("dtype", "f64"), "f32", "f64", (refs[0],)),
                       ("mul", None, "f64", "f64", (("v", n), ("s", key, "f64"))),
                       ("cast", ("dtype", "f32"), "f64", "f32", (("v", n + 1),))]
            at[j] = n + 2
        return _Sub(sub.inputs, tuple(instrs), tuple((at[j], dt) for j, dt in sub.outputs))


def build(spec: RowSpec, name: str = "row") -> str:
    k = _RowKernel(spec, name)
    k.build()
    return str(k.m)

