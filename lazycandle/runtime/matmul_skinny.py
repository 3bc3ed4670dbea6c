"""The small-m matmul path (codegen/gemm_skinny.py): when it applies, and its plan.

Under the "auto" backend a float matmul whose rows (batch rows of a broadcast B folded in) are
at most RULE_M runs the small-m kernel: it is bound by reading B, which it reads once, in place,
where the tiled GEMM packs it first and BLAS at m = 8 reaches well under half of the bandwidth
here (bench/skinny_gemm.py).  Up to MEASURED_M rows it runs where it measured faster than both
BLAS and the tiled GEMM on a problem of the bucket (runtime/matmul_auto.py's timing and size
classes; here it won up to m = 128 on the transformer shapes, but the crossover moves with the
register count, the cache sizes and k, since each column group re-reads all of a from L2).
The kernel takes the standard kernel arguments, so the native program calls it in one of its
phases (runtime/native_exec.py) and the Python executor runs the same kernel over the pool.
"""
from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np

from .. import caches
from ..dtype import DType
from ..layout import Layout
from ..codegen import gemm_epilogue, gemm_skinny as K, jit
from ..codegen.gemm_ir import acc_type, storage_type
from . import matmul_auto, native_pool
from .buffers import address

RULE_M = 16         # up to this many rows: always the small-m kernel
MEASURED_M = 128    # up to this many: where it measured fastest ...
WIN_MARGIN = 0.05   # ... by this much (a close call keeps BLAS / tiled; 0.25 kept x @ w at m = 128 off
                    # the kernel where it measured 12-30 % faster, behind NumPy at 2 threads)
UNITS = 16          # units (column blocks) a call aims at, so two threads share evenly


def _fold_batch(g):
    """g with a batch of a broadcast B folded into m (the rows of a, the output and every
    epilogue operand continue across batches), when that is exact; else g."""
    if len(g.bshape) != 1 or g.nbatch <= 1 or g.bsb[0] != 0:
        return g

    def rows(rs, bs):           # the folded row stride, or None
        return bs if g.m == 1 else rs if bs == g.m * rs else None
    rsa, rso = rows(g.rsa, g.bsa[0]), rows(g.ldo, g.bso[0])
    eps = [rows(rs, bs[0]) for rs, _, bs in g.ep]
    if rsa is None or rso != g.ldo or any(r is None for r in eps):
        return g
    ep = tuple((r, cs, (0,)) for r, (_, cs, _) in zip(eps, g.ep))
    return replace(g, m=g.m * g.nbatch, rsa=rsa, bshape=(1,), bsa=(0,), bsb=(0,), bso=(0,), ep=ep)


def layout_of(g):
    """"t" | "n": the kernel form for geometry g (already folded), or None when the small-m
    kernel does not apply (rows above MEASURED_M, non-float, a batch that does not merge to one dim,
    or no unit stride where the form needs one)."""
    if not g.dtype.is_float or g.m > MEASURED_M or len(g.bshape) != 1:
        return None
    if g.rsb == 1 and g.csa == 1:
        return "t"
    if g.csb == 1:
        return "n"
    return None


def applies(g) -> bool:
    """The kernel can run g (whether it is chosen is `chosen`'s call)."""
    return layout_of(_fold_batch(g)) is not None


_choices: dict = caches.register("matmul small-m choices", {})


def chosen(g, threads: int, others, measure: bool = True):
    """Whether the auto backend runs g on the small-m kernel: by rule up to RULE_M rows, then
    where it measured WIN_MARGIN faster than `others(geometry) -> {backend: plan}` (once per
    size bucket); with `measure` False, None where that would measure."""
    f = _fold_batch(g)
    if layout_of(f) is None:
        return False
    if f.m <= RULE_M:
        return True
    key = matmul_auto.bucket(f, threads) + (layout_of(f),)
    hit = _choices.get(key)
    if hit is None:
        got = matmul_auto.recall("small-m", key, ("yes", "no"))
        if got is None:
            if not measure:
                return None
            best = matmul_auto.measure(f, threads, lambda p: dict(others(p), skinny=SkinnyPlan(p, threads)))
            others_best = min(t for name, t in best.items() if name != "skinny")
            got = "yes" if best["skinny"] * (1 + WIN_MARGIN) < others_best else "no"
            jit.remember_choice("matmul small-m", matmul_auto._ident(key), got)
        hit = _choices.setdefault(key, got == "yes")
    return hit


def _ceil(x: int, y: int) -> int:
    return -(-x // y)


def rows_per_block(m: int) -> int:
    """MR: a power of two up to max_rows() (the kernel's row count is compiled in; four row
    classes keep the compiles few): the smallest that holds m, so a decode step (m = 1) does
    no FMA for rows it does not have."""
    mr = 1
    while mr < min(m, K.max_rows()):
        mr *= 2
    return mr


PREFETCH_ROWS = 4         # "t": prefetch B from this many rows per block on (gemm_skinny.SkinnySpec)
A_L1_BYTES = 24 << 10     # "t": a row block's chunk of a stays in L1 (half of a 48 KB L1d)
N_ROWS = 64               # "n": rows of B a k chunk walks before the next group of columns


def _k_limit(spec) -> int:
    """The longest k a kernel runs in one chunk: "t", while a row block of a fits A_L1_BYTES;
    "n", N_ROWS rows of B, so a group's walk down B stays on a few pages (walking all of k, a
    group touches one page per row, and each next group walks them again: f32 1 x 4096 @
    4096 x 4096 ran at 130 ms against 17 for x @ w.T on an AVX2 Zen 3, its TLB missed)."""
    if spec.layout == "t":
        return A_L1_BYTES // (spec.mr * spec.dtype.size_in_bytes)
    return N_ROWS


def _k_chunk(spec, k: int) -> int:
    """Columns of a per k chunk: all of k when it is within _k_limit (or the dtype is stored
    narrower than it accumulates: partial sums go through the output), else a multiple of the
    lanes that is.  Measured at m = 8, k = 3072 ("t"): a from L2 on every step held the kernel
    to ~65 % of the stream rate."""
    if storage_type(spec.dtype) != acc_type(spec.dtype) or k <= _k_limit(spec) or spec.pairs:
        return max(k, 1)
    return max(spec.vw, _k_limit(spec) // spec.vw * spec.vw)


def unit_sizes(gc, m, n, k, rsa, csa, ldb, ldo, nb, bsa, bsb, bso, kc) -> list:
    """The kernel's SIZES (gemm_skinny.SIZES, before the epilogue words) on a folded geometry:
    column blocks of whole groups of `gc` columns, about UNITS of them per call, k in chunks
    of kc (_k_chunk)."""
    per = max(1, -(-UNITS // max(nb, 1)))
    ucols = max(gc, -(-_ceil(n, per) // gc) * gc)
    return [m, n, k, rsa, csa, ldb, ldo, nb, bsa, bsb, bso, ucols, -(-n // ucols), kc, max(1, _ceil(k, kc))]


def spec_of(f) -> K.SkinnySpec:
    """The kernel of folded geometry f (_fold_batch; layout_of(f) is not None)."""
    layout, mr, vw = layout_of(f), rows_per_block(f.m), K.lanes_of(f.dtype)
    return K.SkinnySpec(f.dtype, layout, mr, K.group_of(layout, mr), vw, prefetch=layout == "t" and mr >= PREFETCH_ROWS,
                        pairs=K.pair_form(f.dtype, vw))


class SkinnyPlan:
    """The small-m kernel on one geometry: its spec, sizes and unit count."""
    backend = "skinny"

    def __init__(self, g, threads: int, epilogue=None):
        self.g, self.threads = g, threads
        f = _fold_batch(g)
        layout = layout_of(f)
        self.spec = spec_of(f)
        self.fn = self.spec.compiled()
        self.fn_addr = ctypes.cast(self.fn, ctypes.c_void_p).value
        sizes = unit_sizes(self.spec.group_cols, f.m, f.n, f.k, f.rsa, f.csa, f.csb if layout == "t" else f.rsb,
                           f.ldo, f.nbatch, f.bsa[0], f.bsb[0], f.bso[0], _k_chunk(self.spec, f.k))
        self.ep_kernel, esz = None, ()
        if epilogue is not None:        # compiled once per epilogue (kept alive by the plan)
            self.ep_kernel = gemm_epilogue.get_kernel(epilogue)
            esz = [DType.from_name(epilogue.ew.inputs[x][0]).size_in_bytes for x in epilogue.extras]
        sizes.append(ctypes.cast(self.ep_kernel, ctypes.c_void_p).value if epilogue is not None else 0)
        ep = [(rs, cs, bs[0], e) for (rs, cs, bs), e in zip(f.ep, esz)]
        for rs, cs, bs, e in ep + [(0, 0, 0, 0)] * (K.MAX_EPILOGUE_INPUTS - len(ep)):
            sizes += [rs, cs, bs, e]
        self.n_extras = len(ep)
        self.sizes_list = sizes
        self.sizes = np.array(sizes, np.int64)
        self.extent = self.spec.extent(sizes)
        self.cost = self.spec.cost(sizes) / max(self.extent, 1)
        self.out_elems = g.nbatch * g.m * g.n

    def run(self, a: int, b: int, o: int, extras=(), scalars: int = 0) -> None:
        """Addresses of a, b, the output, the epilogue operands, and its packed scalars."""
        if not self.extent:
            return
        pad = (0,) * (K.MAX_EPILOGUE_INPUTS - len(extras))
        addrs = (ctypes.c_void_p * (3 + K.MAX_EPILOGUE_INPUTS))(a, b, o, *extras, *pad)
        bufs, sz, fn = ctypes.addressof(addrs), address(self.sizes), self.fn
        if self.threads > 1 and self.extent > 1 and self.extent * self.cost >= native_pool.MIN_COST:
            native_pool.parallel(self.fn_addr, bufs, sz, scalars, 0, self.extent, 1, self.threads)
            return
        fn(bufs, sz, scalars or None, 0, self.extent)


class Rebinder:
    """One matmul step's small-m kernel re-bound to other operand layouts by arithmetic (a
    decode step meets a new length at every token): the backend decision, the spec (B's form,
    rows per block), the compiled kernel and its epilogue are `plan`'s, made once; a call works
    out only the kernel's sizes (the epilogue operands' strides included), extent and cost per
    unit.  It returns None when the layouts leave the decision's bucket -- another form or row
    class, across RULE_M, (above RULE_M) a measured choice's other size bucket, or an epilogue
    operand whose column stride class the epilogue was not compiled for -- and the caller
    decides again (matmul.plan_for)."""

    def __init__(self, plan):
        from .matmul import _canon, geometry
        f = _fold_batch(plan.g)
        self._canon, self._geometry = _canon, geometry
        self.plan, self.dtype, self.threads = plan, plan.g.dtype, plan.threads
        spec = plan.spec
        self.form, self.gc = spec.layout, spec.group_cols
        self.bucket = matmul_auto.bucket(f, plan.threads)
        # the rows rows_per_block gives spec.mr for: by rule up to RULE_M, then where measured
        top = K.max_rows()
        self.m_lo = 0 if spec.mr == 1 else spec.mr // 2 + 1
        self.m_hi = spec.mr if spec.mr < top else MEASURED_M
        self.m_ranges = self._ranges(f)
        # _k_chunk: all of k, or (a k past _k_limit, for dtypes stored as they accumulate) chunks
        self.k_whole = _k_chunk(spec, 1 << 40) == 1 << 40
        self.k_max = _k_limit(spec)
        self.k_chunk = _k_chunk(spec, self.k_max + 1)
        at = K.SIZES.index("ep_fn")
        self.ep_fn = plan.sizes_list[at]
        # per epilogue operand: its item size and the column stride class its kernel was compiled for
        self.ep_esz = tuple(plan.sizes_list[at + 4 + 4 * x] for x in range(plan.n_extras))
        self.ep_cols = tuple(gemm_epilogue.col_class(cs) for _, cs, _ in plan.g.ep)
        self.pad = [0] * (4 * (K.MAX_EPILOGUE_INPUTS - plan.n_extras))
        self.two_d = len(plan.g.bshape) == 1 and plan.g.nbatch == 1

    def _ranges(self, f):
        """The row ranges within [m_lo, m_hi] that run this kernel: up to RULE_M by rule, above
        it the size buckets (at f's other sizes and forms) whose measured decision is the
        small-m kernel -- decisions already made (in memory or on disk): a bucket not measured
        yet is left to the layered path, which measures it once."""
        from .matmul import backend_for
        ranges = [(self.m_lo, min(self.m_hi, RULE_M))] if self.m_lo <= RULE_M else []
        for bits in range(max(self.m_lo, RULE_M + 1).bit_length(), self.m_hi.bit_length() + 1):
            lo, hi = max(self.m_lo, RULE_M + 1, 1 << (bits - 1)), min(self.m_hi, (1 << bits) - 1)
            if lo <= hi and backend_for(replace(f, m=lo), "auto", self.threads, measure=False) == "skinny":
                ranges.append((lo, hi))
        return tuple(ranges)

    def __call__(self, la, lb, *ep_layouts):
        """(sizes, extent, cost per unit) at layouts la @ lb (and the epilogue operands'), or None
        (decide again)."""
        return self.sized(la.shape, la.strides, lb.shape, lb.strides,
                          tuple((e.shape, e.strides) for e in ep_layouts))

    def sized(self, a_shape, a_strides, b_shape, b_strides, ep=()):
        """__call__ on the operands' shapes and strides (what a generated binding has at hand,
        without Layout objects); `ep`: (shape, strides) per epilogue operand."""
        if len(ep) != len(self.ep_esz):
            return None
        if self.two_d and len(a_shape) == 2:
            (m, k), n = a_shape, b_shape[1]
            rsa, csa = self._canon(m, k, *a_strides)
            rsb, csb = self._canon(k, n, *b_strides)
            ldo, nb, bsa, bsb, bso = n, 1, 0, 0, 0
            f = None
            eps = [(st[-2] if m > 1 else 0, st[-1] if n > 1 else 0, 0) for _, st in ep]
            cols = [cs for _, cs, _ in eps]
        else:
            la, lb = Layout(a_shape, a_strides), Layout(b_shape, b_strides)
            g = self._geometry(la, lb, self.dtype, [Layout(sh, st) for sh, st in ep])
            f = _fold_batch(g)
            if len(f.bshape) != 1:
                return None
            m, n, k, rsa, csa, rsb, csb, ldo, nb = f.m, f.n, f.k, f.rsa, f.csa, f.rsb, f.csb, f.ldo, f.nbatch
            bsa, bsb, bso = f.bsa[0], f.bsb[0], f.bso[0]
            eps = [(rs, cs, bs[0]) for rs, cs, bs in f.ep]
            cols = [cs for _, cs, _ in g.ep]
        if tuple(gemm_epilogue.col_class(cs) for cs in cols) != self.ep_cols:
            return None
        form = "t" if rsb == 1 and csa == 1 else "n" if csb == 1 else None
        if form != self.form or not any(lo <= m <= hi for lo, hi in self.m_ranges):
            return None
        if m > RULE_M:          # a measured decision's bucket, but for m (m_ranges)
            if f is None:
                f = self._geometry(Layout(a_shape, a_strides), Layout(b_shape, b_strides), self.dtype)
            got = matmul_auto.bucket(f, self.threads)
            if got[:3] != self.bucket[:3] or got[4:] != self.bucket[4:]:
                return None
        kc = max(k, 1) if self.k_whole or k <= self.k_max else self.k_chunk
        sizes = unit_sizes(self.gc, m, n, k, rsa, csa, csb if form == "t" else rsb, ldo, nb, bsa, bsb, bso, kc)
        sizes.append(self.ep_fn)
        for (rs, cs, bs), esz in zip(eps, self.ep_esz):
            sizes += [rs, cs, bs, esz]
        sizes += self.pad
        extent = nb * sizes[12] if m and n else 0
        return sizes, extent, 2.0 * nb * m * n * max(k, 1) / max(extent, 1)

    def source(self, i, a_shape, a_strides, b_shape, b_strides, ep=()):
        """`sized` as lines of a generated function (the direct path, native_direct.py): from
        source tokens of the operands' shapes and strides (`ep`: (shape, strides) tokens per
        epilogue operand) they set s<i>, e<i>, c<i> (sizes, extent, cost per unit) or return
        None where `sized` does; None (no lines) for a batched problem, which only `sized`
        decides."""
        if not self.two_d or len(a_shape) != 2 or len(b_shape) != 2 or len(ep) != len(self.ep_esz):
            return None
        (rs_a, cs_a), (rs_b, cs_b) = a_strides, b_strides
        m, k, n = f"m{i}", f"k{i}", f"n{i}"
        lines = [f"    {m}, {k}, {n} = {a_shape[0]}, {a_shape[1]}, {b_shape[1]}",
                 f"    csa{i} = 1 if {k} == 1 else {cs_a}",           # _canon of a (rows m, cols k)
                 f"    rsa{i} = (max({k}, 1) if csa{i} == 1 else 1) if {m} == 1 else {rs_a}",
                 f"    csb{i} = 1 if {n} == 1 else {cs_b}",           # ... and of b (rows k, cols n)
                 f"    rsb{i} = (max({n}, 1) if csb{i} == 1 else 1) if {k} == 1 else {rs_b}"]
        checks = ["(" + " or ".join(f"{lo} <= {m} <= {hi}" for lo, hi in self.m_ranges) + ")"
                  if self.m_ranges else "False"]
        t_form = f"rsb{i} == 1 and csa{i} == 1"
        checks.append(t_form if self.form == "t" else f"not ({t_form}) and csb{i} == 1")
        tail = [str(self.ep_fn)]
        for x, ((_, st), col) in enumerate(zip(ep, self.ep_cols)):
            lines += [f"    rse{i}_{x} = {st[-2]} if {m} > 1 else 0", f"    cse{i}_{x} = {st[-1]} if {n} > 1 else 0"]
            checks.append(f"cse{i}_{x} == {col}" if col in (0, 1) else f"cse{i}_{x} != 0 and cse{i}_{x} != 1")
            tail += [f"rse{i}_{x}", f"cse{i}_{x}", "0", str(self.ep_esz[x])]
        if self.m_ranges and self.m_ranges[-1][1] > RULE_M:   # matmul_auto.bucket of a 2-D problem, but for m
            _, _, forms, _, bn, bk, _ = self.bucket
            same = [f"{(1 << bits) >> 1} <= {tok} < {1 << bits}" for tok, bits in ((n, bn), (k, bk))]
            same.append(f"(csa{i} == 1) == {forms[0]} and (csb{i} == 1) == {forms[1]}")
            checks.append(f"({m} <= {RULE_M} or ({' and '.join(same)}))")
        lines.append(f"    if not ({' and '.join(checks)}):\n        return None")
        whole = f"max({k}, 1)"
        lines.append(f"    kc{i} = {whole}" if self.k_whole else
                     f"    kc{i} = {whole} if {k} <= {self.k_max} else {self.k_chunk}")
        ldb = f"csb{i}" if self.form == "t" else f"rsb{i}"
        gc = self.gc
        tail += [str(x) for x in self.pad]
        lines += [f"    u{i} = max({gc}, -(-(-(-{n} // {UNITS})) // {gc}) * {gc})",      # unit_sizes, one batch
                  f"    w{i} = -(-{n} // u{i})",
                  f"    e{i} = w{i} if {m} and {n} else 0",
                  f"    s{i} = ({m}, {n}, {k}, rsa{i}, csa{i}, {ldb}, {n}, 1, 0, 0, 0, u{i}, w{i}, kc{i}, "
                  f"max(1, -(-{k} // kc{i})), {''.join(f'{x}, ' for x in tail)})",
                  f"    c{i} = 2.0 * {m} * {n} * max({k}, 1) / max(e{i}, 1)"]
        return lines
