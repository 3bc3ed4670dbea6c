"""Row kernels (ir/kernels.py RowSpec): softmax, log_softmax, layer_norm, rms_norm, logsumexp and
the like as ONE kernel, parallel over rows.

Per row [lo, hi): for each stage of RowSpec.stages(), one pass over the row evaluates the
per-element producers of that stage's reductions and reduces them (U vector accumulators of W
lanes, then W lanes, then a scalar tail, combined as codegen/reduce.py combines them, so a sum
is accumulated in the same order and precision as the reduce kernel's); between passes the
per-row instrs whose reductions are done run once, on scalars; a last pass evaluates the
full-row outputs (W-wide body + one masked step) and the per-row outputs are stored.  A pass
re-reads the row, which is still in L1/L2 from the pass before, and recomputes the cheap
per-element producers instead of storing them.  Per-row values reach the per-element DAG as
extra scalar slots (slot = runtime scalars + instr index), so elementwise._emit_instrs
evaluates every DAG unchanged (each op rounded in its dtype, like op at a time).
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtype as D
from ..ir.kernels import RowSpec
from ..ir.ops import reduction
from . import codecs, jit
from .elementwise import _Kernel, _cast, _emit_instrs, _bits, lanes as ew_lanes
from .llvmutil import I64, F64, ltype, vec, splat, width_of
from .loops import KERNEL_FN, counted_loop, unit_range
from .reduce import UNROLL, _RedKernel


@dataclass(frozen=True)
class _Sub:
    """A part of a row kernel's DAG in the shape _emit_instrs evaluates."""
    inputs: tuple
    instrs: tuple
    outputs: tuple


class _Acc:
    """One reduction's accumulator rules, borrowed from the reduce kernel generator."""
    init, better, combine, hreduce = _RedKernel.init, _RedKernel.better, _RedKernel.combine, _RedKernel.hreduce
    is_arg = False

    def __init__(self, b, kind, val_dt, out_dt):
        self.b, self.red, self.val_dt, self.out_dt = b, reduction(kind), val_dt, out_dt
        self.is_float = val_dt.is_float
        self.acc_t = F64 if self.red.acc == "f64" and self.is_float else ltype(val_dt.compute)

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


class _RowKernel(_Kernel):
    slot = _RedKernel.slot

    def __init__(self, spec: RowSpec, name: str):
        super().__init__(spec, name, lanes(spec))
        self.row = spec
        self.n_scalars = len(spec.scalars)
        self.row_vals = {}

    def scalar(self, k, w):
        """Runtime scalar k, or (k >= the runtime scalars) the row value of instr k - n_scalars."""
        v = self.scalar_vals[k] if k < self.n_scalars else self.row_vals[k - self.n_scalars]
        if w == 1:
            return v
        got = self.scalar_splats.get((k, w)) if k < self.n_scalars else None
        return got if got is not None else splat(self.b, v, w)

    def sub(self, cone, outputs, extra=()):
        """_Sub of instrs `cone` (indices, in order), then `extra` instrs (refs in kernel terms),
        with `outputs` [(position in the sub, dtype)]; refs to row values become scalar refs."""
        at = {j: i for i, j in enumerate(cone)}

        def ref(r):
            if r[0] != "v":
                return r
            return ("v", at[r[1]]) if r[1] in at else ("s", self.n_scalars + r[1], self.row.instrs[r[1]][3])
        instrs = [(op, arg, dt, odt, tuple(ref(r) for r in refs)) for op, arg, dt, odt, refs in
                  [self.row.instrs[j] for j in cone] + list(extra)]
        return _Sub(self.row.inputs, tuple(instrs), tuple(outputs))

    def cone(self, refs):
        """The per-element instrs the values `refs` are computed from, in order."""
        spec, out, stack = self.row, set(), [r[1] for r in refs if r[0] == "v"]
        while stack:
            j = stack.pop()
            if j in out or spec.levels[j] != "e":
                continue
            out.add(j)
            stack += [r[1] for r in spec.instrs[j][4] if r[0] == "v"]
        return sorted(out)

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

    def reduce_pass(self, reds, in_base, row_str, n):
        """One pass over the row computing the reductions `reds` (instr indices)."""
        b, spec = self.b, self.row
        accs = [_Acc(b, spec.instrs[j][0], D.DType.from_name(spec.instrs[j][2]), D.DType.from_name(spec.instrs[j][3]))
                for j in reds]
        operands = [spec.instrs[j][4][0] for j in reds]
        cone = self.cone(operands)
        copies = [("copy", None, spec.instrs[j][2], spec.instrs[j][2], (r,)) for j, r in zip(reds, operands)]
        sub = self.sub(cone, [(len(cone) + i, spec.instrs[j][2]) for i, j in enumerate(reds)], copies)
        W, U = pass_lanes(spec, accs), UNROLL
        slots = [[self.slot(vec(a.acc_t, W)) for _ in range(U)] + [self.slot(a.acc_t)] for a in accs]
        for a, sl in zip(accs, slots):
            for k, s in enumerate(sl):
                b.store(a.init(W if k < U else 1), s)

        def step(j, w, k):
            offs = [self.sadd(x, j, s) for x, s in zip(in_base, row_str)]
            vals = _emit_instrs(b, sub, lambda q: self.load(q, offs[q], row_str[q], w), w, self.scalar,
                                decode_outputs=True)
            for a, sl, v in zip(accs, slots, vals):
                b.store(a.combine(b.load(sl[k]), a.widen(v)), sl[k])

        nvec = b.mul(b.udiv(n, I64(U * W)), I64(U * W))
        n1 = b.mul(b.udiv(n, I64(W)), I64(W))
        with counted_loop(b, I64(0), nvec, U * W, "rv") as i:
            for k in range(U):
                step(b.add(i, I64(k * W)), W, k)
        with counted_loop(b, nvec, n1, W, "r1") as j:
            step(j, W, 0)
        with counted_loop(b, n1, n, 1, "rt") as j:
            step(j, 1, U)
        for j, a, sl in zip(reds, accs, slots):
            s, _ = a.hreduce([b.load(x) for x in sl[:U]])
            self.row_vals[j] = a.result(a.combine(s, b.load(sl[U])), n)

    def build(self):
        spec, b = self.row, self.b
        lo, hi = unit_range(self.fn)
        n = self.dims[-1]
        row_str = [s[-1] for s in self.strides]
        need, stages = spec.needs(), spec.stages()
        full = [(k, j, dt) for k, (j, dt) in enumerate(spec.outputs) if spec.levels[j] == "e"]
        per_row = [(k, j, dt) for k, (j, dt) in enumerate(spec.outputs) if spec.levels[j] == "r"]
        with counted_loop(b, lo, hi, 1, "row") as r:
            in_base, _ = self.offsets(self.unravel(r, list(range(spec.rank - 1))))
            self.row_vals = {}
            for p, reds in enumerate(stages):
                self.eval_row_instrs(in_base, lambda j: need[j] < p)
                if reds:
                    self.reduce_pass(reds, in_base, row_str, n)
            self.eval_row_instrs(in_base, lambda j: True)
            for k, j, dtn in per_row:
                dt = D.DType.from_name(dtn)
                v = self.row_vals[j]
                v = codecs.encode(b, dt.codec, v) if dt.codec else v
                b.store(v, b.gep(self.out_ptr[k], [r], inbounds=True), align=dt.size_in_bytes)
            if full:
                self.write_rows(full, in_base, b.mul(r, n), row_str, n)
        b.ret_void()

    def write_rows(self, full, in_base, out_base, row_str, n):
        """The last pass: the full-row outputs, through the elementwise inner loop."""
        cone = self.cone([("v", j) for _, j, _ in full])
        at = {j: i for i, j in enumerate(cone)}
        sub = self.sub(cone, [(at[j], dt) for _, j, dt in full])
        saved = self.spec, self.out_ptr, self.out_dt
        self.spec = sub
        self.out_ptr = [saved[1][k] for k, _, _ in full]
        self.out_dt = [saved[2][k] for k, _, _ in full]
        self.inner_loop(I64(0), n, in_base, out_base, row_str)
        self.spec, self.out_ptr, self.out_dt = saved


def build(spec: RowSpec, name: str = "row") -> str:
    k = _RowKernel(spec, name)
    k.build()
    return str(k.m)


get_kernel = jit.KernelCache(lambda spec: (build(spec, "row"), "row"), KERNEL_FN)
