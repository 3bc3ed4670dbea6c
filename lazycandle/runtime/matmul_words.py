"""The tiled and BLAS matmul steps of a native program, bound to a new size by arithmetic.

A 2-D tiled or BLAS plan (runtime/matmul.py, matmul_blas.py) is built once per native program
(one per combination of matmul forms) at the program's own binding: the kernel, the epilogue,
the thread count and the backend decision are its structure.  What depends on the sizes -- the
tiled driver's parameter block (chunk splits, m/n/k blocking, task counts, workspace offsets)
or the BLAS task words -- is written as straight-line lines of the operands' shapes and strides
(`lines`), which the program's binders evaluate with the rest of a binding's words (the direct
path compiles them: codegen/binder_ir.py).  The step then runs from those words (`item`): the
pointers come from the program's pointer words, nothing is looked up or built per size.

The lines return None (the layered path decides again) where the structure would change: a
size bucket whose measured backend is another one (`Regime`), an epilogue operand of another
column-stride class, a problem large enough for the tiled GEMM's shared-B or balanced splits
(>= SHARED_B_MIN_FLOPS on several threads), BLAS operands that need a copy or a split into
several pieces."""
from __future__ import annotations

import ctypes
from dataclasses import replace

import numpy as np

from ..codegen import gemm, gemm_epilogue, gemm_pool, pool_ir, task_ir
from . import blas, matmul_auto, native_pool
from .buffers import address

def lead_checks(*shapes) -> list:
    """Checks that every dim of the shapes' tokens before their last two is 1 (a 2-D problem)."""
    return [f"{tok} == 1" for shape in shapes for tok in shape[:-2]]


def canon_lines(i, a_shape, a_strides, b_shape, b_strides) -> list:
    """m<i>, k<i>, n<i> and the canonical strides (matmul._canon) of a 2-D a @ b (the last two
    dims of the tokens; the others are checked to be 1: lead_checks)."""
    (rs_a, cs_a), (rs_b, cs_b) = a_strides[-2:], b_strides[-2:]
    return [f"    m{i} = {a_shape[-2]}", f"    k{i} = {a_shape[-1]}", f"    n{i} = {b_shape[-1]}",
            f"    csa{i} = 1 if k{i} == 1 else {cs_a}",
            f"    rsa{i} = (max(k{i}, 1) if csa{i} == 1 else 1) if m{i} == 1 else {rs_a}",
            f"    csb{i} = 1 if n{i} == 1 else {cs_b}",
            f"    rsb{i} = (max(n{i}, 1) if csb{i} == 1 else 1) if k{i} == 1 else {rs_b}"]


def ep_lines(i, ep, cols) -> tuple:
    """(lines, checks) of the epilogue operands' row / column strides over the output
    (matmul.geometry's) and of their column classes being `cols` (the compiled epilogue's)."""
    lines, checks = [], []
    for x, ((_, st), col) in enumerate(zip(ep, cols)):
        lines += [f"    rse{i}_{x} = {st[-2]} if m{i} > 1 else 0", f"    cse{i}_{x} = {st[-1]} if n{i} > 1 else 0"]
        checks.append(f"cse{i}_{x} == {col}" if col in (0, 1) else f"cse{i}_{x} != 0 and cse{i}_{x} != 1")
    return lines, checks


def problem_lines(i, a, b, ep, ep_cols, regime=None) -> tuple:
    """(lines, checks) every GEMM step's words start with: the 2-D problem's sizes and
    canonical strides, its epilogue operands' strides, and the checks that the structure
    holds (unit leading dims, the epilogue's column classes, `regime`'s backend decision)."""
    lines = canon_lines(i, a[0], a[1], b[0], b[1])
    more, checks = ep_lines(i, ep, ep_cols)
    checks = lead_checks(a[0], b[0], *(sh for sh, _ in ep)) + checks
    if regime is not None:
        checks += regime.checks(i)
    return lines + more, checks


class Regime:
    """The sizes of a 2-D problem that keep `backend` (the backend_for decision at geometry g):
    g's bucket of n, k and operand forms, and the row ranges of the buckets around g's (two
    powers of two each side) already decided the same way (in memory or on disk; a bucket not
    measured yet is left to the layered path, which measures it once, never the direct path)."""
    SPAN = 2

    def __init__(self, g, backend: str, setting: str, threads: int):
        from .matmul import backend_for
        self.bucket = matmul_auto.bucket(g, threads)
        bits = max(1, g.m.bit_length())
        ranges = []
        for b in range(max(1, bits - self.SPAN), bits + self.SPAN + 1):
            for lo, hi in _pieces(1 << (b - 1), (1 << b) - 1):
                if backend_for(replace(g, m=lo), setting, threads, measure=False) == backend:
                    if ranges and ranges[-1][1] == lo - 1:
                        ranges[-1] = (ranges[-1][0], hi)
                    else:
                        ranges.append((lo, hi))
        self.ranges = tuple(ranges)

    def checks(self, i) -> list:
        _, _, forms, _, bn, bk, _ = self.bucket
        rows = " or ".join(f"{lo} <= m{i} <= {hi}" for lo, hi in self.ranges) or "False"
        return [f"({rows})", f"{(1 << bn) >> 1} <= n{i} < {1 << bn}", f"{(1 << bk) >> 1} <= k{i} < {1 << bk}",
                f"(csa{i} == 1) == {forms[0]}", f"(csb{i} == 1) == {forms[1]}"]


def _pieces(lo, hi) -> list:
    """[lo, hi] cut after the row counts where the small-m decision changes within a bucket
    (its rule's and its measurement's limits): one decision per piece."""
    from .matmul_skinny import MEASURED_M, RULE_M
    out = []
    for cut in (RULE_M, MEASURED_M):
        if lo <= cut < hi:
            out.append((lo, cut))
            lo = cut + 1
    return out + [(lo, hi)]


def _check(lines, checks):
    if checks:
        lines.append(f"    if not ({' and '.join(checks)}):\n        return None")


def _up(x, mult) -> str:
    """Source of _round_up(x, mult) for a constant mult."""
    return f"(-(-({x}) // {mult}) * {mult})"


def two_d(plan) -> bool:
    g = plan.g
    return len(g.bshape) == 1 and g.nbatch == 1


class TiledWords:
    """A 2-D tiled plan's structure and its per-size words: the driver's parameter block, then
    RUN words (tasks, parallel flag, workspace bytes, workspace stride per part, task block,
    parts)."""
    RUN = ("ntask", "parallel", "ws_bytes", "ws_stride", "block", "parts")

    @staticmethod
    def applies(plan) -> bool:
        from . import matmul as M
        spec = M._tile_kernel(plan.g.dtype)[0]
        return two_d(plan) and not spec.amx and not plan.shared_rows and \
            (plan.threads == 1 or plan.g.flops < M.SHARED_B_MIN_FLOPS)

    def __init__(self, plan):
        from . import matmul as M
        self.M, self.plan, self.threads = M, plan, plan.threads
        self.spec, self.fn, self.ab, self.needs_w = M._tile_kernel(plan.g.dtype)
        self.ep_cols = tuple(gemm_epilogue.col_class(cs) for _, cs, _ in plan.g.ep)
        self.ep_fn = int(plan.params[M._EP_FN_SLOT])
        self.ep_esz = plan.ep_esz
        self.n_words = gemm.NPARAMS + len(self.RUN)
        self.fn_addr = ctypes.cast(self.fn, ctypes.c_void_p).value

    def lines(self, i, a, b, ep, regime=None) -> list:
        """Lines setting s<i> (the words), e<i> = 0, c<i> = 0.0 from the operands' (shape,
        strides) tokens `a`, `b` and `ep`, or returning None; `regime` (a Regime): also check
        that the backend decision holds."""
        M, spec = self.M, self.spec
        MR, NR, U, AB, T = spec.mr, spec.nr, spec.unroll, self.ab, self.threads
        L2, L3 = M.CACHES[2], M.CACHES[3]
        floor = 1024 if self.needs_w else 512
        kc_max = max(floor, L2 // 4 // ((MR + NR) * AB) // 8 * 8)
        pmin = M.PARALLEL_MIN_FLOPS
        lines, checks = problem_lines(i, a, b, ep, self.ep_cols, regime)
        m, n, k = f"m{i}", f"n{i}", f"k{i}"
        (fl, kb, kc, mc, nc, rows, cols, bym, byn, usem, small, mch, nch, wu, opb, opn, mt, nt, kce, ar, af, ak,
         bp, wo, we, nta, parts, par, blk, wsb) = (f"t{i}_{x}" for x in (
            "fl", "kb", "kc", "mc", "nc", "rows", "cols", "bym", "byn", "usem", "small", "mch", "nch", "wu", "opb",
            "opn", "mt", "nt", "kce", "ar", "af", "ak", "bp", "wo", "we", "nta", "parts", "par", "blk", "wsb"))
        lines.append(f"    {fl} = 2.0 * {m} * {n} * {k}")
        if T > 1:
            checks.append(f"{fl} < {M.SHARED_B_MIN_FLOPS!r}")
        _check(lines, checks)
        L = lines.append
        L(f"    {kb} = max(1, -(-{k} // {kc_max}))")                                   # _blocking
        L(f"    {kc} = {_up(f'max(1, -(-{k} // {kb}))', 8)}")
        L(f"    {mc} = max({MR}, ({L2 // 3} // ({kc} * {AB})) // {MR} * {MR})")
        L(f"    {nc} = max({NR}, {min(4 << 20, L3 // 2)} // ({kc} * {AB}) // {NR} * {NR})")
        L(f"    {kc} = {_up(kc, U)}")
        if T == 1:                                                                        # _chunks
            L(f"    {mch}, {nch} = {m}, {n}")
        else:
            L(f"    {rows} = -(-(-(-{m} // {MR})) // {T}) * {MR}")
            L(f"    {cols} = -(-(-(-{n} // {NR})) // {T}) * {NR}")
            L(f"    {bym} = min({rows}, {m}) * {n}")
            L(f"    {byn} = {m} * min({cols}, {n})")
            L(f"    {usem} = {bym} < {byn} or {bym} == {byn} and {n} < 2048")
            L(f"    {small} = {fl} < {pmin!r}")
            L(f"    {mch} = {m} if {small} else ({rows} if {usem} else {m})")
            L(f"    {nch} = {n} if {small} else ({n} if {usem} else {cols})")
        L(f"    {mch} = max({mch}, 1)")
        L(f"    {nch} = max({nch}, 1)")
        L(f"    {wu} = {k} > {kc}" if self.needs_w else f"    {wu} = False")
        most = f"max({NR}, {L2 // 2} // ({kc} * {AB}) // {NR} * {NR})"                 # _one_pass_nc
        L(f"    {opb} = -(-{nch} // {most})")
        L(f"    {opn} = {_up(f'-(-{nch} // {opb})', NR)}")
        L(f"    {nc} = min({nc}, {opn}) if {mch} <= {mc} else {nc}")
        if self.needs_w:
            L(f"    {mch} = min({mch}, {M._round_up(M.W_MAX_ROWS, MR)}) if {wu} else {mch}")
            L(f"    {nc} = min({nc}, max({NR}, {M.W_BYTES} // ({mch} * {AB}) // {NR} * {NR})) if {wu} else {nc}")
        L(f"    {mt} = -(-{m} // {mch})")
        L(f"    {nt} = -(-{n} // {nch})")
        L(f"    {kce} = {_up(f'max(1, min({kc}, {k}))', U)}")
        L(f"    {ar} = {_up(mch, MR)}")
        L(f"    {af} = {ar} * {_up(f'max({k}, 1)', U)}")
        L(f"    {ak} = 1 if ({nt} > 1 or {n} > {nc}) and {af} * {AB} <= {M.A_KEEP_BYTES} else 0")
        pack_a = f"{_up(f'min({mc}, {mch})', MR)} * {kce}"
        L(f"    {bp} = {_up(f'{af} if {ak} else {pack_a}', 16)}")
        bcols = _up(f"min({nc}, {nch})", NR)
        L(f"    {wo} = {_up(f'{bp} + {kce} * {bcols}', 16)}")
        L(f"    {we} = {_up(mch, MR)} * {bcols} if {wu} else 0")
        L(f"    {nta} = {mt} * {nt} if {m} and {n} else 0")
        L(f"    {parts} = min({T}, {nta})")
        L(f"    {par} = 1 if {parts} > 1 and {fl} >= {pmin!r} else 0")
        L(f"    {blk} = 1 if {nta} <= {parts} else max(1, {nta} // ({parts} * 4))")
        L(f"    {wsb} = ({wo} + {we}) * {AB}")
        words = ["0"] * gemm.NPARAMS
        for slot, val in zip(M._SIZE_SLOTS, (m, n, k, f"rsa{i}", f"csa{i}", f"rsb{i}", f"csb{i}", n, mc, kc, nc,
                                            mch, nch, mt, nt, bp, wo, "1", ak, ar)):
            words[slot] = val
        words[M._BATCH_SLOTS[0]] = "1"
        words[M._EP_FN_SLOT] = str(self.ep_fn)
        for x, (_, rse, cse, esz) in enumerate(M._EP_SLOTS[:len(self.ep_cols)]):
            words[rse], words[cse], words[esz] = f"rse{i}_{x}", f"cse{i}_{x}", str(self.ep_esz[x])
        words += [nta, par, wsb, _up(f"max({wsb}, 1)", 4096), blk, parts]
        L(f"    s{i} = ({', '.join(words)},)")
        L(f"    e{i} = 0")
        L(f"    c{i} = 0.0")
        return lines

    def item(self, bufs_at: int, sizes_at: int, n_extras: int, scalar_slots):
        """The step's run from a binding's words: `run(ptrs, sizes, scalars, nthreads)` as a
        segment function is called (addresses as ints or c_void_p; returns 0)."""
        M = self.M
        fn, threads, np_ = self.fn, self.threads, gemm.NPARAMS
        ia, ib, io = M._ABO_SLOTS
        e_slots = [e for e, _, _, _ in M._EP_SLOTS[:n_extras]]
        escal = M._ESCAL_SLOT
        run_at = np_
        gather, gathered = _gatherer(scalar_slots)
        job = []        # the pool job's words, made at the first parallel run (the pool entry compiles then)

        def job_words():
            bufs = (ctypes.c_uint64 * 7)(self.fn_addr, 0, 0, 0, 0, 0, 0)
            sizes = (ctypes.c_int64 * 4)()
            words = (ctypes.c_int64 * pool_ir.JOB_WORDS)(gemm_pool.entry_address(), ctypes.addressof(bufs),
                                                         ctypes.addressof(sizes), 0, 0, 0, 1, 0)
            counters = (ctypes.c_int64 * 3)()
            job[:] = [bufs, sizes, words, counters, ctypes.addressof(counters), ctypes.addressof(words)]
            return job
        workspace = M._workspace
        words_t = ctypes.c_int64 * (np_ + len(self.RUN))
        ptrs_t = ctypes.c_int64 * (3 + n_extras)

        def run(p, sz, sc, nthreads):
            p = p if p.__class__ is int else p.value
            sz = sz if sz.__class__ is int else sz.value
            w = words_t.from_address(sz + 8 * sizes_at)
            ntask = w[run_at]
            if not ntask:
                return 0
            ptr = ptrs_t.from_address(p + 8 * bufs_at)
            w[ia], w[ib], w[io] = ptr[0], ptr[1], ptr[2]
            for x, slot in enumerate(e_slots):
                w[slot] = ptr[3 + x]
            w[escal] = gather(sc) if gathered else 0
            params = sz + 8 * sizes_at
            if not w[run_at + 1]:
                fn(params, 0, ntask, workspace(w[run_at + 2]))
                return 0
            stride, parts = w[run_at + 3], w[run_at + 5]
            ws = workspace(stride * parts)
            job_bufs, job_sizes, words, counters, base, job_addr = job or job_words()
            job_sizes[0], job_sizes[1], job_sizes[2], job_sizes[3] = ntask, w[run_at + 4], stride, 0
            words[5] = words[7] = parts
            job_bufs[1], job_bufs[2], job_bufs[3], job_bufs[5], job_bufs[6] = params, ws, base, base + 8, base + 16
            counters[0] = counters[1] = counters[2] = 0
            native_pool.ensure(threads)
            native_pool.run_jobs(job_addr, 1, threads)
            return 0
        run.keep, run.words_item = job, True
        return run


def _gatherer(slots):
    """(gather(scalars address) -> address of the epilogue's own scalars, whether it has any)."""
    slots = tuple(slots)
    if not slots:
        return (lambda sc: 0), False
    mine = np.zeros(len(slots), np.int64)
    mine_addr = address(mine)
    top = max(slots) + 1
    src_t = ctypes.c_int64 * top

    def gather(sc):
        src = src_t.from_address(sc if sc.__class__ is int else sc.value)
        for j, s in enumerate(slots):
            mine[j] = src[s]
        return mine_addr
    gather.keep = mine
    return gather, True


class BlasWords:
    """A 2-D BLAS plan of one piece (no copies, one task): its task words per size, then the
    task count.  The epilogue, when the step has one, runs after it as the consumers'
    elementwise kernel (MatmulStep._epilogue_step), looked up per output geometry."""

    @staticmethod
    def applies(plan) -> bool:
        return two_d(plan) and plan.copy_a is None and plan.copy_b is None and plan.copy_out is None \
            and len(plan.jobs) <= 1

    def __init__(self, plan):
        from .matmul_blas import PARALLEL_MIN_FLOPS
        self.plan, self.threads = plan, plan.threads
        self.kind = plan.kind
        self.pmin2 = 2 * PARALLEL_MIN_FLOPS
        self.ep_cols = tuple(gemm_epilogue.col_class(cs) for _, cs, _ in plan.g.ep)
        self.n_words = 17 + 2 * len(self.ep_cols)       # task words, tasks, m, n, (rse, cse) per epilogue operand

    def lines(self, i, a, b, ep, regime=None) -> list:
        lines, checks = problem_lines(i, a, b, ep, self.ep_cols, regime)
        m, n, k = f"m{i}", f"n{i}", f"k{i}"
        mx = blas.BLASINT_MAX
        lines += [f"    pa{i} = csa{i} == 1 and max(1, {k}) <= rsa{i} <= {mx}",        # _blas_form of a, b
                  f"    qa{i} = rsa{i} == 1 and max(1, {m}) <= csa{i} <= {mx}",
                  f"    pb{i} = csb{i} == 1 and max(1, {n}) <= rsb{i} <= {mx}",
                  f"    qb{i} = rsb{i} == 1 and max(1, {k}) <= csb{i} <= {mx}"]
        checks += [f"(pa{i} or qa{i})", f"(pb{i} or qb{i})", f"{k} > 0", f"{m} <= {mx}", f"{n} <= {mx}"]
        if self.threads > 1:
            checks.append(f"2.0 * {m} * {n} * {k} < {self.pmin2!r}")      # _blas_parts: one piece
        _check(lines, checks)
        NT, TR = blas.NO_TRANS, blas.TRANS
        lines += [f"    lda{i} = rsa{i} if pa{i} else csa{i}", f"    ldb{i} = rsb{i} if pb{i} else csb{i}",
                  f"    ta{i} = {NT} if pa{i} else {TR}", f"    tb{i} = {NT} if pb{i} else {TR}",
                  f"    ntb{i} = {TR} if pb{i} else {NT}",
                  f"    g1{i} = {m} == 1", f"    g2{i} = {n} == 1 and not g1{i}"]

        def pick(row, col, gemm_):     # _task_words: m == 1 a GEMV over B, n == 1 over A, else a GEMM
            return f"({row} if g1{i} else ({col} if g2{i} else {gemm_}))"
        words = [pick(task_ir.GEMV, task_ir.GEMV, task_ir.GEMM),
                 pick(f"ntb{i}", f"ta{i}", f"ta{i}"), pick(0, 0, f"tb{i}"),
                 pick(f"({n} if not pb{i} else {k})", f"({k} if not pa{i} else {m})", m),
                 pick(f"({k} if not pb{i} else {n})", f"({m} if not pa{i} else {k})", n),
                 pick(0, 0, k), pick(1, 0, 0), "0",
                 pick(f"ldb{i}", f"lda{i}", f"lda{i}"), pick(0, 1, 1), "0",
                 pick(f"(1 if pa{i} else lda{i})", f"(ldb{i} if pb{i} else 1)", f"ldb{i}"), "0",
                 pick(1, n, n), f"1 if {m} and {n} else 0", m, n]
        for x in range(len(self.ep_cols)):
            words += [f"rse{i}_{x}", f"cse{i}_{x}"]
        lines += [f"    s{i} = ({', '.join(str(x) for x in words)},)", f"    e{i} = 0", f"    c{i} = 0.0"]
        return lines

    def item(self, bufs_at: int, sizes_at: int, epilogue=None):
        """As TiledWords.item; `epilogue(pointer words, words)` runs the step's epilogue after
        the GEMM (None: it has none)."""
        fn, fn_addr = native_pool.tasks()[f"lc_task_blas_{self.kind}"]
        n_extras = len(self.ep_cols)
        words_t = ctypes.c_int64 * self.n_words
        ptrs_t = ctypes.c_int64 * (3 + n_extras)
        bufs = (ctypes.c_void_p * 3)()
        bufs_addr = ctypes.addressof(bufs)
        single = blas.single_threaded

        def run(p, sz, sc, nthreads):
            p = p if p.__class__ is int else p.value
            sz = sz if sz.__class__ is int else sz.value
            at = sz + 8 * sizes_at
            w = words_t.from_address(at)
            if not w[14]:
                return 0
            ptr = ptrs_t.from_address(p + 8 * bufs_at)
            bufs[0], bufs[1], bufs[2] = ptr[0], ptr[1], ptr[2]
            with single():
                fn(bufs_addr, at, None, 0, 1)
            if epilogue is not None:
                epilogue(ptr, w)
            return 0
        run.keep, run.words_item = bufs, True
        return run


_ep_ids: dict = {}              # (epilogue spec, product input, scalar slots) -> a small int, hashed once per step
_ep_runs: dict = {}             # (that int, the output geometry's words) -> (Step, its sizes)
EP_RUNS_KEPT = 256


def blas_epilogue(step, n_extras: int, packed):
    """`run(pointer words, words)`: a BLAS step's epilogue -- the consumers' elementwise kernel
    over the output, in place -- at the output geometry of BlasWords' words (m, n, the epilogue
    operands' strides), its kernel and sizes kept per geometry for every step of the same
    epilogue; `packed()`: the program's packed scalars array."""
    ep = step.kernel.epilogue
    ident = _ep_ids.setdefault((ep.spec, ep.mm_input, tuple(ep.kernel.scalars)), len(_ep_ids))
    mm_input = ep.mm_input
    from ..ir.kernels import ew_loop, runtime_sizes, stride_class
    from ..layout import Layout
    forms = {}          # the merged loop's stride classes -> (Step, spec): the kernel of that form

    def sized_at(m, n, strides):
        strides.insert(mm_input, (n, 1))
        mshape, mstrides = ew_loop((m, n), strides)
        classes = tuple(tuple(stride_class(x) for x in st) for st in mstrides)
        form = forms.get(classes)
        if form is None:
            del strides[mm_input]
            ep_step, sized = step._epilogue_step((m, n), [Layout((m, n), st) for st in strides])
            forms[classes] = (ep_step, ep_step.spec)
            return ep_step, sized
        ep_step, spec = form
        sizes = runtime_sizes(mshape, mstrides)
        extent = spec.extent(sizes)
        return ep_step, (sizes, extent, spec.cost(sizes) / (extent or 1))

    def run(ptr, w):
        key = (ident, bytes(w)[8 * 15:])
        got = _ep_runs.get(key)
        if got is None:
            if len(_ep_runs) >= EP_RUNS_KEPT:
                _ep_runs.clear()
            got = _ep_runs[key] = sized_at(w[15], w[16], [(w[17 + 2 * x], w[18 + 2 * x]) for x in range(n_extras)])
        ep_step, sized = got
        if sized[1]:
            addrs = [ptr[3 + x] for x in range(n_extras)]
            addrs.insert(mm_input, ptr[2])
            ep_step.run(addrs + [ptr[2]], packed(), sized)
    return run


def form_of(plan):
    """The words form (TiledWords | BlasWords) of a step's plan at a program's binding, or None
    (the step runs in Python between segments)."""
    for cls, backend in ((TiledWords, "tiled"), (BlasWords, "blas")):
        if plan.backend == backend and cls.applies(plan):
            return cls(plan)
    return None


def form_key(plan, setting: str):
    """What a binding's words form is, for the program key (native_program.kernel_forms): the
    backend, the thread count and the backend setting its words are written for, or None."""
    if plan.backend == "tiled" and TiledWords.applies(plan) or plan.backend == "blas" and BlasWords.applies(plan):
        return plan.backend, plan.threads, setting
    return None


def layered(form, ranks):
    """`sized(layouts) -> (words, 0, 0.0) | None`: `form`'s lines as a function of a binding's
    Layouts of these ranks (a, b, the epilogue operands) (the layered path: no regime check,
    program_of picked the program by backend)."""
    a, b, *ep = [([f"l[{x}].shape[{d}]" for d in range(r)], [f"l[{x}].strides[{d}]" for d in range(r)])
                 for x, r in enumerate(ranks)]
    src = "def sized(l):\n" + "\n".join(form.lines(0, a, b, ep)) + "\n    return s0, e0, c0\n"
    scope: dict = {}
    exec(compile(src, "<matmul words>", "exec"), scope)
    return scope["sized"]
