"""The small-m GEMM: out = a @ b for a few rows of a (1-16, up to 128 where it measures
fastest: runtime/matmul_skinny.py), at the memory limit.

A transformer at batch 1 with a short sequence multiplies 1-16 rows by weights of 0.5-10 MB:
the time is the time to stream the weight once.  The tiled GEMM packs B (a second pass over it)
and BLAS at m = 8 reaches ~40 % of the bandwidth here, so this kernel reads B in place, each
element once from DRAM, while the rows of a stay in L1 and the accumulators in registers:

    for each unit (batch, block of `ucols` output columns)     <- units split over the pool
      for each k chunk (all of k unless a row block of a would not fit L1)
        for each group of G columns of the block:                 its slice of B is read from DRAM
          for each block of MR rows of a:                         ... and from L1 for the next block
            for k in the chunk: acc[r][c] += a[r, k] * b[k, c]    MR x G accumulators

Two forms of B, by which of its strides is 1:
  * "t", B[k, j] at j * ldb + k (x @ w.T with w (n, k) row-major, as nn.linear): each output is
    a dot product over k; G columns at once, each a vector of VW lanes along k per row, summed
    across lanes at the end; the k tail is one masked step.  a's k stride must be 1.
  * "n", B[k, j] at k * ldb + j (x @ w with w (k, n) row-major): G = NV vectors of VW output
    columns; each k broadcasts a[r, k] (any strides) against NV vectors of row k of B; the
    column tail of a block is the same loop with masked loads.
bf16 on a host with AVX512-BF16 runs on the dot-product instruction (gemm_pairs.py), nothing
widened: "t" takes 2 VW k a step, whose pairs are adjacent as loaded; "n" interleaves rows k and
k + 1 of B into pairs against the broadcast word (a[r, k], a[r, k + 1]).
Row and column indices past the end are clamped to the last one, so partial blocks compute a
duplicate (not stored in "t"; stored to the same place with the same bits in "n") instead of
needing their own code.  MR is one of four row classes (runtime/matmul_skinny.py).  A long k is
cut into chunks (partial sums go through the output): in "t" so a row block of a stays in L1
(and the next group's rows of B are prefetched), in "n" so a group's walk down B stays on a few
pages.

The epilogue of the matmul (bias, activation, residual: ir/epilogue.py) is applied to each
unit's block of products after its last k chunk, while it is in L1, by the tiled GEMM's epilogue
function (codegen/gemm_epilogue.py, compiled once per epilogue; its address is the `ep_fn`
size), so `(x @ w + b).gelu()` is this one kernel.  Calling convention: the kernels' own,
`void k(i8** bufs, i64* sizes, i64* scalars, i64 lo, i64 hi)` with bufs (a, b, out, then
MAX_EPILOGUE_INPUTS epilogue operands, unused ones 0), sizes SIZES then EP_SIZES per epilogue
operand slot, scalars the epilogue's; [lo, hi) are units, so the kernel runs in a phase of the
native program like any other.
"""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from ..dtype import DType
from ..ir.kernels import KernelSpec
from . import gemm_pairs, jit, registry
from .gemm_epilogue import EP_FN, MAX_INPUTS as MAX_EPILOGUE_INPUTS
from .gemm_ir import (ZERO, acc_type, add, for_range, from_acc, gep, i64, imin, load, masked_vload, mul,
                      storage_type, store, to_acc, type_bytes, vload, vstore, zero)
from .llvmutil import I32, call_intrinsic, intrinsic, splat, type_suffix, vec
from .loops import KERNEL_FN, finalize_ir, kernel_function, new_module

SIZES = ("m", "n", "k", "rsa", "csa", "ldb", "ldo", "nb", "bsa", "bsb", "bso", "ucols", "ublocks",
         "kc", "kchunks", "ep_fn")
EP_SIZES = ("rse", "cse", "bse", "esz")     # per epilogue operand slot (MAX_EPILOGUE_INPUTS), after SIZES
MAX_GROUP = 8                           # "t": most dot products at once (streams of B)


def registers() -> int:
    """Vector registers of the host (32 with AVX-512, else 16)."""
    return 32 if jit.vector_bits() >= 512 else 16


def max_rows() -> int:
    """Most rows of a row block: MR x G accumulators + G loaded vectors + 1 must fit."""
    return 8 if registers() >= 32 else 4


def lanes_of(dt: DType) -> int:
    return jit.vector_bits() // (8 * type_bytes(acc_type(dt)))


def pair_form(dt: DType, vw: int) -> bool:
    """Whether the small-m kernel of `dt` with `vw` lanes (either form) runs on the bf16
    dot-product instruction here (gemm_pairs.usable)."""
    return gemm_pairs.usable(dt, vw)


def group_of(layout: str, mr: int) -> int:
    """G: columns ("t") or vectors of columns ("n") per group for MR rows."""
    g = (registers() - 1) // (mr + 1)
    return max(1, min(g, MAX_GROUP if layout == "t" else 4))


@dataclass(frozen=True)
class SkinnySpec(KernelSpec):
    """One small-m GEMM kernel: dtype, B's form ("t" | "n"), rows per block, columns (or
    vectors) per group, lanes.  The epilogue is not part of it: it is a function whose address
    comes in the sizes (0: none)."""
    dtype: DType
    layout: str
    mr: int
    group: int
    vw: int
    prefetch: bool = False  # "t": prefetch the next group's rows of B (measured at m = 8, n = 3072:
                            # ~73 -> ~85 % of the stream rate; at m = 1 it only costs load slots)
    pairs: bool = False     # bf16 on the dot-product instruction (gemm_pairs.py): "t" k-adjacent
                            # pairs as loaded, "n" two rows of B interleaved; nothing widened

    @property
    def group_cols(self) -> int:
        """Output columns per group: a block's `ucols` is a multiple of this."""
        return self.group if self.layout == "t" else self.group * self.vw

    def extent(self, sizes) -> int:
        s = dict(zip(SIZES, sizes))
        return s["nb"] * s["ublocks"] if s["m"] and s["n"] else 0

    def cost(self, sizes) -> float:
        s = dict(zip(SIZES, sizes))
        return 2.0 * s["nb"] * s["m"] * s["n"] * max(s["k"], 1)

    def describe(self) -> str:
        form = "x @ w.T (w rows along k)" if self.layout == "t" else "x @ w (w rows along n)"
        return (f"small-m GEMM {self.dtype.name}, {form}, {self.mr} rows x {self.group_cols} columns "
                f"per step, {self.vw} lanes" + (", bf16 pair dot products" if self.pairs else ""))


class _Builder:
    """Emits one SkinnySpec's kernel."""

    def __init__(self, spec: SkinnySpec):
        self.spec = spec
        self.m = new_module(f"skinny_{spec.dtype.name}_{spec.layout}")
        fn, self.b = kernel_function(self.m, "skinny")
        self.fn = fn
        dt = spec.dtype
        self.st, self.at = storage_type(dt), acc_type(dt)
        self.eb = dt.size_in_bytes
        self.vt = vec(self.at, spec.vw)

    # ---- helpers ---------------------------------------------------------------------
    def _masked_load(self, ptr, idx, mask):
        return masked_vload(self.b, ptr, idx, mask, self.eb)

    def _vec_load(self, ptr, idx, mask=None):
        """VW accumulator lanes from ptr[idx ...] (masked lanes read as 0)."""
        b = self.b
        raw = vload(b, ptr, idx, self.spec.vw, self.eb) if mask is None else self._masked_load(ptr, idx, mask)
        return to_acc(b, self.spec.dtype, raw)

    def _lane_mask(self, count, vw=None):
        """Lanes i < count of a VW (or `vw`) lane vector."""
        b, vw = self.b, vw or self.spec.vw
        lanes = ir.Constant(vec(ir.IntType(64), vw), [i64(i) for i in range(vw)])
        return b.icmp_signed("<", lanes, splat(b, count, vw))

    def _prefetch(self, ptr):
        b = self.b
        f = intrinsic(self.m, "llvm.prefetch.p0i8", ir.VoidType(), [ir.IntType(8).as_pointer(), I32, I32, I32])
        b.call(f, [b.bitcast(ptr, ir.IntType(8).as_pointer()), I32(0), I32(3), I32(1)])

    def _fma(self, x, y, acc):
        return call_intrinsic(self.b, "fma", [x, y, acc])

    # ---- the kernel --------------------------------------------------------------------
    def build(self) -> str:
        spec, b = self.spec, self.b
        bufs, sizes, scal, lo, hi = self.fn.args
        s = {name: load(b, sizes, i64(i), 8) for i, name in enumerate(SIZES)}
        ptr_t = self.st.as_pointer()

        def buf(i, t):
            return b.bitcast(load(b, bufs, i64(i), 8), t)
        a0, b0, o0 = buf(0, ptr_t), buf(1, ptr_t), buf(2, ptr_t)
        # accumulators: entry-block allocas, promoted to registers by the optimiser
        self.acc = [[b.alloca(self.vt) for _ in range(spec.group)] for _ in range(spec.mr)]
        self.spill = b.alloca(self.vt)
        self._epilogue_args(bufs, sizes, scal, s)
        with for_range(b, lo, hi, name="u") as u:
            bi, blk = b.sdiv(u, s["ublocks"]), b.srem(u, s["ublocks"])
            a = gep(b, a0, mul(b, bi, s["bsa"]))
            bm = gep(b, b0, mul(b, bi, s["bsb"]))
            o = gep(b, o0, mul(b, bi, s["bso"]))
            self.ep_base = [add(b, e["base"], mul(b, mul(b, bi, e["bse"]), e["esz"])) for e in self.ep_in]
            j0 = mul(b, blk, s["ucols"])
            j1 = imin(b, s["n"], add(b, j0, s["ucols"]))
            with for_range(b, ZERO, s["kchunks"], name="kc") as kc:
                chunk = (mul(b, kc, s["kc"]), imin(b, s["k"], mul(b, add(b, kc, i64(1)), s["kc"])),
                         b.icmp_signed("==", kc, ZERO), b.icmp_signed("==", kc, b.sub(s["kchunks"], i64(1))))
                with for_range(b, j0, j1, i64(spec.group_cols), name="j") as j:
                    with for_range(b, ZERO, s["m"], i64(spec.mr), name="i0") as i0:
                        last = b.sub(s["m"], i64(1))
                        rows = [imin(b, add(b, i0, i64(r)), last) for r in range(spec.mr)]
                        if spec.layout == "t":
                            real = [b.icmp_signed("<", add(b, i0, i64(r)), s["m"]) for r in range(spec.mr)]
                            self._group_t(s, a, bm, o, rows, real, j, j1, chunk)
                        else:
                            self._group_n(s, a, bm, o, rows, j, j1, chunk)
                with b.if_then(chunk[3]):
                    self._apply_epilogue(s, o, ZERO, j0, s["m"], b.sub(j1, j0))
        b.ret_void()
        return finalize_ir(self.m)

    def _epilogue_args(self, bufs, sizes, scal, s):
        """Entry-block state of the epilogue call: the tile function's address (0: none), per
        operand its base address and sizes (EP_SIZES), and stack arrays of the operands' tile
        addresses, row and column strides (gemm_epilogue.EP_FN's arguments)."""
        b = self.b
        i64t = ir.IntType(64)
        self.scal, self.ep_fn = scal, s["ep_fn"]
        arr = ir.ArrayType(i64t, MAX_EPILOGUE_INPUTS)
        self.ep_ptrs, self.ep_rs, self.ep_cs = (b.bitcast(b.alloca(arr), i64t.as_pointer()) for _ in range(3))
        self.ep_in = []
        for x in range(MAX_EPILOGUE_INPUTS):
            e = {name: load(b, sizes, i64(len(SIZES) + len(EP_SIZES) * x + i), 8) for i, name in enumerate(EP_SIZES)}
            store(b, e["rse"], self.ep_rs, i64(x), 8)
            store(b, e["cse"], self.ep_cs, i64(x), 8)
            e["base"] = b.ptrtoint(load(b, bufs, i64(3 + x), 8), i64t)
            self.ep_in.append(e)

    def _apply_epilogue(self, s, o, row0, col0, rows, cols):
        """Run the epilogue's tile function over the rows x cols tile at (row0, col0), which
        holds the stored products (as the tiled GEMM does: one compiled function per epilogue,
        not one small-m kernel per epilogue, keeps the compiles few).  It is called once per
        unit, over all its rows and columns (a few KB, still in L1): called per group, "t"
        tiles were G = 3 columns wide and the epilogue ran on vectors of 3 of its 16 lanes."""
        b = self.b
        with b.if_then(b.icmp_signed("!=", self.ep_fn, ZERO)):
            for x, (e, base) in enumerate(zip(self.ep_in, self.ep_base)):
                off = add(b, mul(b, row0, e["rse"]), mul(b, col0, e["cse"]))
                store(b, add(b, base, mul(b, off, e["esz"])), self.ep_ptrs, i64(x), 8)
            tile = b.bitcast(gep(b, o, add(b, mul(b, row0, s["ldo"]), col0)), ir.IntType(8).as_pointer())
            fn = b.inttoptr(self.ep_fn, EP_FN.as_pointer())
            b.call(fn, [tile, s["ldo"], rows, cols, self.ep_ptrs, self.ep_rs, self.ep_cs, self.scal])

    def _zero_acc(self):
        for row in self.acc:
            for p in row:
                self.b.store(zero(self.vt), p)

    def _store(self, o, s, row, col, value, w):
        """Round and store w lanes at (row, col)."""
        b = self.b
        v = from_acc(b, self.spec.dtype, value)
        idx = add(b, mul(b, row, s["ldo"]), col)
        if w == 1:
            b.store(v, gep(b, o, idx), align=self.eb)
        else:
            vstore(b, v, o, idx, self.eb)

    def _group_t(self, s, a, bm, o, rows, real, j, j1, chunk):
        """G dot products over the k chunk [k0, k1) for the block's rows: columns j.. (clamped
        to j1 - 1).  A chunk after the first adds the partial sums already in the output (the
        plan chunks k only for dtypes stored in their accumulator type); a clamped duplicate
        (`real` false, or a column past j1) is not stored, since it would add its partial sum a
        second time."""
        spec, b = self.spec, self.b
        vw = spec.vw
        k0, k1, first, _ = chunk
        lastc = b.sub(j1, i64(1))
        cols = [imin(b, add(b, j, i64(c)), lastc) for c in range(spec.group)]
        arow = [gep(b, a, mul(b, r, s["rsa"])) for r in rows]
        brow = [gep(b, bm, mul(b, c, s["ldb"])) for c in cols]
        ahead = mul(b, i64(spec.group), s["ldb"])
        self._zero_acc()
        kw = 2 * vw if spec.pairs else vw          # k a step
        kv = add(b, k0, mul(b, b.sdiv(b.sub(k1, k0), i64(kw)), i64(kw)))

        def load_k(p, kk, mask):
            if not spec.pairs:
                return self._vec_load(p, kk, mask)
            return vload(b, p, kk, kw, self.eb) if mask is None else self._masked_load(p, kk, mask)

        def madd(av, w, acc):
            return gemm_pairs.dot_words(b, acc, av, w) if spec.pairs else self._fma(av, w, acc)

        def step(kk, mask):
            if mask is None and spec.prefetch:
                for p in brow:
                    self._prefetch(gep(b, p, add(b, kk, ahead)))
            wv = [load_k(p, kk, mask) for p in brow]
            for r, ap in enumerate(arow):
                av = load_k(ap, kk, mask)
                for c, w in enumerate(wv):
                    p = self.acc[r][c]
                    b.store(madd(av, w, b.load(p)), p)
        with for_range(b, k0, kv, i64(kw), name="k") as kk:
            step(kk, None)
        with b.if_then(b.icmp_signed("<", kv, k1)):
            step(kv, self._lane_mask(b.sub(k1, kv), kw))
        red = intrinsic(self.m, f"llvm.vector.reduce.fadd.{type_suffix(self.vt)}", self.at, [self.at, self.vt])
        dt = spec.dtype
        for r, row in enumerate(rows):
            for c, col in enumerate(cols):
                total = b.call(red, [ir.Constant(self.at, -0.0), b.load(self.acc[r][c])], fastmath=("reassoc",))
                keep = real[r] if c == 0 else b.and_(real[r], b.icmp_signed("<", add(b, j, i64(c)), j1))
                with b.if_then(keep):
                    at = gep(b, o, add(b, mul(b, row, s["ldo"]), col))
                    before = to_acc(b, dt, b.load(at, align=self.eb))
                    b.store(from_acc(b, dt, b.select(first, total, b.fadd(total, before))), at, align=self.eb)

    def _group_n(self, s, a, bm, o, rows, j, j1, chunk):
        """NV vectors of output columns j.. for the block's rows over the k chunk [k0, k1).  B
        is read with masked loads (all lanes on in a full group: as fast as plain loads with
        AVX-512 masks), so one loop serves the partial group at the end of a block too.  A
        chunk after the first starts from the partial sums in the output (chunked only for
        dtypes stored as they accumulate); a clamped duplicate row loads them before any row
        of the group stores, so it stores the same bits."""
        spec, b = self.spec, self.b
        vw = spec.vw
        k0, k1, first, _ = chunk
        left = b.sub(j1, j)
        masks = [self._lane_mask(b.sub(left, i64(c * vw))) for c in range(spec.group)]
        self._zero_acc()
        with b.if_then(b.not_(first)):
            for r, row in enumerate(rows):
                for c in range(spec.group):
                    at = add(b, mul(b, row, s["ldo"]), add(b, j, i64(c * vw)))
                    b.store(self._vec_load(o, at, masks[c]), self.acc[r][c])
        arow = [gep(b, a, mul(b, r, s["rsa"])) for r in rows]
        if spec.pairs:
            self._pairs_n(s, arow, bm, j, masks)
        else:
            with b.if_else(b.icmp_signed(">=", left, i64(spec.group_cols))) as (full, part):
                with full:          # plain loads: a masked load is no plain one on every host
                    self._rows_n(s, arow, bm, j, k0, k1, [None] * spec.group)
                with part:
                    self._rows_n(s, arow, bm, j, k0, k1, masks)
        with b.if_else(b.icmp_signed(">=", left, i64(spec.group_cols))) as (full, part):
            with full:
                for r, row in enumerate(rows):
                    for c in range(spec.group):
                        self._store(o, s, row, add(b, j, i64(c * vw)), b.load(self.acc[r][c]), vw)
            with part:      # the partial group's columns one at a time, through the stack
                lanes = b.bitcast(self.spill, self.at.as_pointer())
                for r, row in enumerate(rows):
                    for c in range(spec.group):
                        b.store(b.load(self.acc[r][c]), self.spill)
                        count = imin(b, i64(vw), b.sub(left, i64(c * vw)))
                        with for_range(b, ZERO, count, name="t") as t:
                            self._store(o, s, row, add(b, add(b, j, i64(c * vw)), t), load(b, lanes, t, self.eb), 1)


    def _rows_n(self, s, arow, bm, j, k0, k1, masks):
        """The "n" form's k loop: each k broadcasts a[r, k] against the group's vectors of row k
        of B (read through `masks`, None for plain loads)."""
        spec, b = self.spec, self.b
        vw = spec.vw
        with for_range(b, k0, k1, name="k") as kk:
            brow = gep(b, bm, add(b, mul(b, kk, s["ldb"]), j))
            bv = [self._vec_load(brow, i64(c * vw), masks[c]) for c in range(spec.group)]
            for r, ap in enumerate(arow):
                av = splat(b, to_acc(b, spec.dtype, load(b, ap, mul(b, kk, s["csa"]), self.eb)), vw)
                for c, v in enumerate(bv):
                    p = self.acc[r][c]
                    b.store(self._fma(av, v, b.load(p)), p)

    def _pairs_n(self, s, arow, bm, j, masks):
        """The "n" form's k loop in bf16 pairs: rows k and k + 1 of B's group interleaved into
        (B[k, c], B[k + 1, c]) pairs, against the broadcast word (a[r, k], a[r, k + 1]); an
        odd k's last row pairs with zeros."""
        spec, b = self.spec, self.b
        vw, k = spec.vw, s["k"]
        zero16 = ir.Constant(self.st, 0)

        def step(k0, second):
            """Rows k0 and (when `second`) k0 + 1."""
            brow = gep(b, bm, add(b, mul(b, k0, s["ldb"]), j))
            nxt = gep(b, brow, s["ldb"])
            bv = []
            for c in range(spec.group):
                lo = self._masked_load(brow, i64(c * vw), masks[c])
                hi = self._masked_load(nxt, i64(c * vw), masks[c]) if second else zero(lo.type)
                bv.append(gemm_pairs.interleave(b, lo, hi))
            for r, ap in enumerate(arow):
                x0 = load(b, ap, mul(b, k0, s["csa"]), self.eb)
                x1 = load(b, ap, mul(b, add(b, k0, i64(1)), s["csa"]), self.eb) if second else zero16
                word = gemm_pairs.pair_word(b, x0, x1)
                for c, v in enumerate(bv):
                    p = self.acc[r][c]
                    b.store(gemm_pairs.dot_words(b, b.load(p), splat(b, word, vw), v), p)
        whole = mul(b, b.sdiv(k, i64(2)), i64(2))
        with for_range(b, ZERO, whole, i64(2), name="kp") as kk:
            step(kk, True)
        with b.if_then(b.icmp_signed("<", whole, k)):
            step(whole, False)


def build(spec: SkinnySpec) -> str:
    return _Builder(spec).build()


get_kernel = jit.KernelCache(lambda spec: (build(spec), "skinny"), KERNEL_FN)
registry.register(SkinnySpec, build, get_kernel, lambda spec: spec.vw)
