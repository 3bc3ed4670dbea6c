"""Batched matmul over strided storage: plans cached per problem, run on BLAS
(runtime/matmul_blas.py), the generated tiled GEMM (lazycandle.codegen.gemm) or the small-m
kernel (runtime/matmul_skinny.py).  A parallel tiled GEMM is one job of the native pool
(runtime/native_pool.py, codegen/gemm_pool.py), so its threads hand off without the GIL; BLAS
pieces are native pool tasks too (codegen/task_ir.py).  One pool: the cores are not oversubscribed.

    matmul(a, a_layout, b, b_layout, out, dtype, backend="auto") -> "blas" | "tiled" | "skinny"

a_layout is (*batch, m, k), b_layout (*batch, k, n) with identical batch shapes (a broadcast
batch dim has stride 0 on either side); out is a contiguous buffer for (*batch, m, n).
Everything that depends only on shapes, strides, dtype, backend and thread count is worked out
once and cached as a plan; a call then only supplies the three addresses.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass, replace
from math import gcd, prod

import numpy as np

from .. import caches, config
from ..codegen import gemm, gemm_epilogue, gemm_pool, jit, pool_ir
from ..codegen.gemm_ir import acc_bytes as _acc_bytes
from ..dtype import DType
from ..layout import Layout, batch_offsets, contiguous_strides, merge_dims
from . import blas, matmul_auto, matmul_skinny, native_pool
from .buffers import DATA_AT, read_word
from .matmul_blas import PARALLEL_MIN_FLOPS, BlasPlan, blas_ok, blas_shape_ok
from .native_program import address

W_BYTES, W_MAX_ROWS = 4 << 20, 1024      # tiled scratch for 16/8-bit partial sums, per thread
A_KEEP_BYTES = 2 << 20                   # tiled: keep a task's packed A up to this size


# ---- geometry ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Geometry:
    """One batched GEMM in element units, without addresses: matrix strides (size-1 dims
    canonicalised), output row stride, batch dims merged as far as all three operands allow."""
    dtype: DType
    m: int
    n: int
    k: int
    rsa: int
    csa: int
    rsb: int
    csb: int
    ldo: int
    bshape: tuple
    bsa: tuple
    bsb: tuple
    bso: tuple
    ep: tuple = ()      # epilogue operands over the output: (row stride, col stride, batch strides)

    @property
    def nbatch(self) -> int:
        return prod(self.bshape)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def _canon(rows: int, cols: int, rs: int, cs: int) -> tuple:
    """A size-1 dim's stride does not matter: pick the one that makes the matrix look
    contiguous or transposed when possible."""
    if cols == 1:
        cs = 1
    if rows == 1:
        rs = max(cols, 1) if cs == 1 else 1
    return rs, cs


def geometry(a_layout: Layout, b_layout: Layout, dtype: DType, ep_layouts=()) -> Geometry:
    """The problem of a_layout @ b_layout; `ep_layouts`: the epilogue's operands as layouts over
    the (*batch, m, n) output (their batch dims merge along with the operands')."""
    *batch, m, k = a_layout.shape
    *batch_b, k2, n = b_layout.shape
    if tuple(batch) != tuple(batch_b) or k != k2:
        raise ValueError(f"matmul: incompatible layouts {a_layout.shape} @ {b_layout.shape}")
    rsa, csa = _canon(m, k, *a_layout.strides[-2:])
    rsb, csb = _canon(k, n, *b_layout.strides[-2:])
    if batch:
        so = contiguous_strides((*batch, m, n))[:-2]
        bshape, (bsa, bsb, bso, *bse) = merge_dims(tuple(batch), [a_layout.strides[:-2], b_layout.strides[:-2], so]
                                                   + [e.strides[:-2] for e in ep_layouts])
    else:
        bshape, bsa, bsb, bso, bse = (1,), (0,), (0,), (0,), [(0,)] * len(ep_layouts)
    if prod(batch) == 0:
        bshape, bsa, bsb, bso, bse = (0,), (0,), (0,), (0,), [(0,)] * len(ep_layouts)
    ep = tuple((e.strides[-2] if m > 1 else 0, e.strides[-1] if n > 1 else 0, tuple(bs))
               for e, bs in zip(ep_layouts, bse))
    return Geometry(dtype, m, n, k, rsa, csa, rsb, csb, n, bshape, bsa, bsb, bso, ep)


def _round_up(x: int, mult: int) -> int:
    return -(-x // mult) * mult


_tls = threading.local()


def _workspace(nbytes: int) -> int:
    """Address of a 64-byte aligned scratch area of `nbytes`, reused per thread (it only
    grows: a thread keeps the largest packing scratch it needed, ~10 MB at most, plus
    SHARED_B_MAX_BYTES at most for the shared B of a parallel plan)."""
    ws = getattr(_tls, "ws", None)
    if ws is None or ws[0] < nbytes:
        buf = np.empty(max(nbytes + 64, 1 << 16), np.uint8)
        ws = _tls.ws = (buf.nbytes - 64, (address(buf) + 63) & ~63, buf)
    return ws[1]


# ---- tiled ------------------------------------------------------------------------------
def _chunks(nb: int, m: int, n: int, mr: int, nr: int, flops: float, threads: int) -> tuple:
    """(rows, cols) of the output block one task computes.  Tasks are batches first; each
    matrix is split too (over m or n) only when the batch count does not divide evenly over the
    threads, along whichever dimension leaves the largest task smallest (whole register tiles
    per task: 256 rows of 14-row tiles split 140 / 116, its 256 columns of 32 split evenly).
    On a tie: m up to n ~ 2048, else n (each thread then packs only its own share of the big
    B block).  A problem of at least BALANCED_MIN_FLOPS is cut into blocks for about
    BALANCED_TASKS_PER_THREAD tasks a thread instead (see _balanced_chunks).  (The tiled
    result does not depend on the split.)"""
    split = threads // gcd(nb, threads) if threads > 1 else 1
    if split == 1 or flops * nb < PARALLEL_MIN_FLOPS:
        return m, n
    mblocks, nblocks = -(-m // mr), -(-n // nr)
    if flops * nb >= BALANCED_MIN_FLOPS:
        return _balanced_chunks(nb, m, n, mr, nr, threads)
    rows, cols = -(-mblocks // split) * mr, -(-nblocks // split) * nr
    by_m, by_n = min(rows, m) * n, m * min(cols, n)
    if by_m < by_n or (by_m == by_n and n < 2048):
        return rows, n
    return m, cols


# A parallel tiled GEMM this large whose B is not packed once for all threads (_shared_b_rows)
# is cut into about this many tasks a thread, taken from a counter: with one task a thread, a
# thread descheduled by another process holds the whole call up.
BALANCED_MIN_FLOPS = 2.0 * 1024 ** 3
BALANCED_TASKS_PER_THREAD = 4


def _balanced_chunks(nb: int, m: int, n: int, mr: int, nr: int, threads: int) -> tuple:
    """(rows, cols) blocks for at least BALANCED_TASKS_PER_THREAD * threads tasks in all
    (where the register tiles allow): of those grids of row x column cuts, the one that packs
    the least (each column block packs A's rows again, each row block B's columns: cost
    ~ m*k*ncuts + k*n*mcuts), whole register tiles each."""
    want = max(1, -(-BALANCED_TASKS_PER_THREAD * threads // nb))
    mblocks, nblocks = -(-m // mr), -(-n // nr)
    best = None
    for mcuts in range(1, min(want, mblocks) + 1):
        for ncuts in range(1, min(want, nblocks) + 1):
            rows, cols = -(-mblocks // mcuts) * mr, -(-nblocks // ncuts) * nr
            mt, nt = -(-m // rows), -(-n // cols)
            key = (min(mt * nt, want) < want, m * nt + n * mt)     # enough tasks first, then fewest packs
            if best is None or key < best[0]:
                best = (key, min(rows, m), min(cols, n))
    return best[1], best[2]


CACHES = jit.cache_bytes()    # {level: bytes} of the host's data caches
# tiled, parallel: pack B once for all threads when its packed copy takes at most this much
# scratch.  Each row task streams all of packed B but uses every element of it for a whole MC
# block of rows (~2.5 GB/s a core at 100 GFLOP/s: far under L3's or DRAM's bandwidth), and B
# and A are each packed once in all (the n split packs A again per column block).  Measured
# at 2048^2, 2 threads, rotating on a busy host: 64.8 ms best against 77.9 for the 2-task n
# split (torch 65.2)
SHARED_B_MAX_BYTES = 32 << 20
# ... and when the problem has at least this many flops: below it the pack tasks' barrier and
# the packed B moving between the cores cost more than packing A per thread (the n split).
# Eager (a @ b).numpy() at 2 threads, rotating with NumPy, torch and JAX, alternating trees:
# 256^2 139-147 -> 132-134 us, 320^2 232 -> 220-224; 384^2 and up equal
SHARED_B_MIN_FLOPS = 100e6
SHARED_TASKS_PER_THREAD = 8     # row tasks of a shared-B plan per thread
# ... on AMX (32-row blocks, each streaming all of B): 4 (128 rows at 1024^2), measured at 2
# threads on a busy host against 8: min 1.32 / 1.92 ms against 1.45 / 2.25, median 2.32 / 2.60
# against 2.88 / 6.97 (torch 2.39 / 2.68)
SHARED_TASKS_PER_THREAD_AMX = 4


def _blocking(spec: gemm.GemmSpec, acc_bytes: int, k: int) -> tuple:
    """(MC, KC, NC) from the host's caches.  KC covers all of K when an MR x KC panel of A and
    a KC x NR panel of B fit in a quarter of L2 (else K is cut into equal blocks that do): the
    micro-kernel streams both panels from L2 (~13 bytes a cycle for the 14 x 32 f32 tile, far
    under L2's bandwidth) and every C tile is written once, never read back.  Measured at 1
    thread, f32 14 x 32 tile, on CPU time: 2048^2 KC 2048 is 1.05x torch, KC 1024 0.91x, KC
    256 0.79x; 1024^2 KC 1024 0.92x, KC 256 0.80x.  (16/8-bit outputs: no partial sums
    through the scratch W for K up to 1024 at least.)  An MC x KC block of A takes a third of
    L2, a KC x NC block of B half of L3, at most 4 MB (L3 is shared)."""
    if spec.amx:
        return _amx_blocking(spec, k)
    floor = 1024 if _tile_kernel(spec.dtype)[3] else 512
    kc_max = max(floor, CACHES[2] // 4 // ((spec.mr + spec.nr) * acc_bytes) // 8 * 8)
    blocks = max(1, -(-k // kc_max))
    kc = _round_up(max(1, -(-k // blocks)), 8)
    mc = max(spec.mr, (CACHES[2] // 3 // (kc * acc_bytes)) // spec.mr * spec.mr)
    nc = max(spec.nr, min(4 << 20, CACHES[3] // 2) // (kc * acc_bytes) // spec.nr * spec.nr)
    return mc, kc, nc


def _amx_blocking(spec: gemm.GemmSpec, k: int) -> tuple:
    """(MC, KC, NC) of the AMX form: KC as the other forms (all of K up to ~2048 here: each C block
    is then stored once; KC 256, whose B panel stays in L1, measured no faster at 1024^2 and
    slower at 2048^2), MC and NC from the bf16 bytes packed (a third of L2, half of L3 up to 4
    MB: at 2048^2, 1 thread, 20.0-20.7 ms against 21.6-22.1 with f32-sized blocks).  A plan
    whose A the tiles read in place narrows NC (_amx_in_place_nc)."""
    kc_max = max(1024, CACHES[2] // 4 // ((spec.mr + spec.nr) * 4) // 8 * 8)
    blocks = max(1, -(-k // kc_max))
    kc = _round_up(max(1, -(-k // blocks)), spec.unroll)
    mc = max(spec.mr, (CACHES[2] // 3 // (kc * 2)) // spec.mr * spec.mr)
    nc = max(spec.nr, min(4 << 20, CACHES[3] // 2) // (kc * 2) // spec.nr * spec.nr)
    return mc, kc, nc


def _amx_in_place_nc(spec: gemm.GemmSpec, kc: int) -> int:
    """NC of the AMX form when the tiles read A in place (row-major, K in whole tile steps): a
    KC x NC block of B in a quarter of L2, so that B's panels come from L2 (A's rows read again
    per NC block cost no packing).  1 thread: 1024^2 NC 256 2.51-2.54 ms against 2.72-2.96 with
    NC 2048 (B from L3), 2048^2 NC 128 24.9 against 25.7."""
    return max(spec.nr, min(CACHES[2] // 4, CACHES[3] // 2) // (kc * 2) // spec.nr * spec.nr)


def _one_pass_nc(spec: gemm.GemmSpec, acc_bytes: int, kc: int, cols: int) -> int:
    """NC when a task's rows are one MC block, so each packed KC x NC block of B is read by one
    sweep of row tiles only: at most half of L2, so that it is still there for that sweep (an
    L3-sized block goes out to L3 and comes back), the task's `cols` cut into equal blocks.
    Measured at 1 thread, f32, rotating: 128 x 768 @ 768 x 3072 5.3 ms against 5.8 with NC
    1344, 128 x 768 @ 768 x 768 1.24 against 1.31."""
    most = max(spec.nr, CACHES[2] // 2 // (kc * acc_bytes) // spec.nr * spec.nr)
    blocks = -(-cols // most)
    return _round_up(-(-cols // blocks), spec.nr)


# parameter block positions (a plan is built per new GEMM shape: keep its construction cheap)
_tile_kernels: dict = caches.register("tiled gemm kernels by dtype", {})


_packers: dict = caches.register("tiled gemm shared-B packers", {})


def _packer(spec: gemm.GemmSpec):
    """The compiled "pack_b" role of `spec` (packs the shared B of a parallel tiled GEMM)."""
    got = _packers.get(spec)
    if got is None:
        got = _packers[spec] = gemm.get_kernel(replace(spec, role="pack_b"))
    return got


def _shared_b_rows(g: Geometry, spec: gemm.GemmSpec, mc: int, threads: int, w_used: bool) -> int:
    """Rows per task when a parallel tiled GEMM packs B once for all threads (0: it does not).
    Then tasks are blocks of rows (per batch element), about SHARED_TASKS_PER_THREAD per
    thread, taken from a counter: no thread packs B (or A) again, and a thread slowed down by
    another process gets fewer tasks (8 rather than 4 a thread, rotating at 2 threads on this
    busy host: 512^2 3.8-4.0 ms against 6.1, 1024^2 36.0 against 39.5 or equal; each task
    still reuses every B panel it streams from L3 over >= 5 row tiles at 1024^2).  Only
    when B is one matrix for every batch element, its packed copy fits SHARED_B_MAX_BYTES,
    there are row tiles for >= 8 tasks per thread (fewer: the n split keeps the threads busy
    and duplicates only a small A), the problem has SHARED_B_MIN_FLOPS and no partial-sum
    scratch is used."""
    nb, mr = g.nbatch, spec.mr
    if threads <= 1 or g.flops * nb < SHARED_B_MIN_FLOPS or w_used or min(g.m, g.n, g.k) <= 0 \
            or (nb > 1 and any(g.bsb)) or len(g.bshape) > gemm.MAX_BATCH_RANK:
        return 0
    tiles = -(-g.m // mr)
    if nb * tiles < 8 * threads or _round_up(g.k, spec.unroll) * _round_up(g.n, spec.nr) * _acc_bytes(g.dtype) \
            > SHARED_B_MAX_BYTES:
        return 0
    per_thread = SHARED_TASKS_PER_THREAD_AMX if spec.amx else SHARED_TASKS_PER_THREAD
    per_batch = -(-per_thread * threads // nb)
    return mr * min(max(1, -(-tiles // per_batch)), max(1, mc // mr))


def _tile_kernel(dt: DType) -> tuple:
    """(spec, compiled function, accumulator bytes, needs_w) of the tiled GEMM for `dt`."""
    got = _tile_kernels.get(dt.name)
    if got is None:
        spec = gemm.tiled_spec(dt)
        got = _tile_kernels[dt.name] = (spec, gemm.get_kernel(spec), _acc_bytes(dt), spec.needs_w)
    return got


_SIZE_SLOTS = tuple(gemm.param_index(f) for f in (
    "m", "n", "k", "rsa", "csa", "rsb", "csb", "ldo", "mc", "kc", "nc", "mchunk", "nchunk", "mtasks",
    "ntasks", "bp_off", "w_off", "rank", "a_keep", "a_rows"))
_BATCH_SLOTS = tuple(gemm.param_index(arr) for arr in gemm.BATCH_ARRAYS)
_EP_SLOTS = tuple((gemm.param_index(f"e{k}"), gemm.param_index(f"rse{k}"), gemm.param_index(f"cse{k}"),
                   gemm.param_index(f"esz{k}")) for k in range(gemm_epilogue.MAX_INPUTS))
_ABO_SLOTS = tuple(gemm.param_index(f) for f in ("a", "b", "o"))
_ESCAL_SLOT, _EP_FN_SLOT = gemm.param_index("escal"), gemm.param_index("ep_fn")
_BSHARED_SLOT, _BGROUP_SLOT = gemm.param_index("bshared"), gemm.param_index("bgroup")
_Params = ctypes.c_int64 * gemm.NPARAMS


class TiledPlan:
    """The generated kernel on one geometry: parameter block, task count, scratch size per
    thread.  Built for every new shape a program binds (a decode step meets a new L at every
    token), so it is plain arithmetic into one ctypes block: the kernel is looked up per dtype."""
    backend = "tiled"

    def __init__(self, g: Geometry, threads: int, epilogue: gemm_epilogue.Epilogue | None = None):
        self.g, self.threads = g, threads
        spec, self.fn, ab, needs_w = _tile_kernel(g.dtype)
        mc, kc, nc = _blocking(spec, ab, g.k)
        kc = _round_up(kc, spec.unroll)     # a KC block's panels are kbp <= KC deep (AMX: 32-k steps)
        if spec.amx and g.csa == 1 and g.k % spec.unroll == 0:
            nc = min(nc, _amx_in_place_nc(spec, kc))
        nb = g.nbatch
        nr, mr, unroll = spec.nr, spec.mr, spec.unroll
        mchunk, nchunk = _chunks(nb, g.m, g.n, mr, nr, g.flops, threads)
        mchunk, nchunk = max(mchunk, 1), max(nchunk, 1)
        w_used = needs_w and g.k > kc
        self.shared_rows = _shared_b_rows(g, spec, mc, threads, w_used)
        self.shared_bytes = 0
        if self.shared_rows:
            mchunk, nchunk, nc = self.shared_rows, g.n, _round_up(g.n, nr)
        elif mchunk <= mc:
            nc = min(nc, _one_pass_nc(spec, ab, kc, nchunk))
        if w_used:
            # partial sums live in scratch W of mchunk x NC: keep it within W_BYTES
            mchunk = min(mchunk, _round_up(W_MAX_ROWS, mr))
            nc = min(nc, max(nr, W_BYTES // (mchunk * ab) // nr * nr))
        mtasks, ntasks = -(-g.m // mchunk), -(-g.n // nchunk)
        kc_eff = _round_up(max(1, min(kc, g.k)), unroll)
        a_rows = _round_up(mchunk, mr)
        a_full = a_rows * _round_up(max(g.k, 1), unroll)
        reuse = (nb > 1 and not any(g.bsa)) or ntasks > 1 or g.n > nc
        a_keep = reuse and a_full * ab <= A_KEEP_BYTES and not self.shared_rows
        bp_off = _round_up(a_full if a_keep else _round_up(min(mc, mchunk), mr) * kc_eff, 16)
        w_off = bp_off if self.shared_rows else _round_up(bp_off + kc_eff * _round_up(min(nc, nchunk), nr), 16)
        w_elems = _round_up(mchunk, mr) * _round_up(min(nc, nchunk), nr) if w_used else 0   # (AMX: whole tiles)
        self.ws_bytes = (w_off + w_elems) * ab
        # batch dims beyond the kernel's limit (only with > 8 unmergeable dims) loop here
        lead = max(0, len(g.bshape) - gemm.MAX_BATCH_RANK)
        self.outer = batch_offsets(g.bshape[:lead], g.bsa[:lead], g.bsb[:lead], g.bso[:lead],
                                    *(bs[:lead] for _, _, bs in g.ep)) if lead else [(0,) * (3 + len(g.ep))]
        params = self.params = _Params()
        for slot, v in zip(_SIZE_SLOTS, (g.m, g.n, g.k, g.rsa, g.csa, g.rsb, g.csb, g.ldo, mc, kc, nc, mchunk,
                                         nchunk, mtasks, ntasks, bp_off, w_off, len(g.bshape) - lead,
                                         int(a_keep), a_rows)):
            params[slot] = v
        for base, src in zip(_BATCH_SLOTS, (g.bshape, g.bsa, g.bsb, g.bso) + tuple(bs for _, _, bs in g.ep)):
            params[base:base + len(src) - lead] = src[lead:]
        for (_, rse, cse, _), (rs, cs, _) in zip(_EP_SLOTS, g.ep):
            params[rse], params[cse] = rs, cs
        self.ep_esz, self.ep_kernel = (), None
        if epilogue is not None:        # compiled once per epilogue; the plan keeps its code alive
            self.ep_kernel = gemm_epilogue.get_kernel(epilogue)
            params[_EP_FN_SLOT] = ctypes.cast(self.ep_kernel, ctypes.c_void_p).value
            self.ep_esz = tuple(DType.from_name(epilogue.ew.inputs[x][0]).size_in_bytes for x in epilogue.extras)
            for (_, _, _, esz), size in zip(_EP_SLOTS, self.ep_esz):
                params[esz] = size
        self.params_addr = ctypes.addressof(params)
        self.busy = threading.Lock()     # guards self.params; a concurrent caller copies it
        self.ntask = prod(g.bshape[lead:]) * mtasks * ntasks
        self.cost = g.flops * nb / max(self.ntask * len(self.outer), 1)
        self.esz = g.dtype.size_in_bytes
        self.out_elems = nb * g.m * g.n
        self.ep_slots = tuple(e for e, _, _, _ in _EP_SLOTS[:len(g.ep)])
        if self.shared_rows:
            self._shared_setup(spec, kc, threads)
        self._native_setup()

    def _shared_setup(self, spec: gemm.GemmSpec, kc: int, threads: int) -> None:
        """Pack tasks of the shared B (codegen/gemm.py "pack_b" role): KC blocks x groups of
        whole panels, about 4 per thread per block; the buffer follows the parts' workspaces."""
        g, nr = self.g, spec.nr
        nblk = -(-g.k // kc)
        kbp_last = _round_up(g.k - (nblk - 1) * kc, spec.unroll)
        elems = gemm.shared_b_offset((nblk - 1) * kc, 0, g.n, kbp_last, nr) + kbp_last * _round_up(g.n, nr)
        self.shared_bytes = _round_up(elems * _acc_bytes(g.dtype), 64)
        panels = -(-g.n // nr)
        group = nr * max(1, -(-panels // (threads * 4)))
        self.params[_BGROUP_SLOT] = group
        self.npack = nblk * -(-g.n // group)
        self.packer = _packer(spec)

    def _native_setup(self) -> None:
        """The native pool job running every task (codegen/gemm_pool.py): `parts` threads, each
        with its own slice of the caller's workspace, taking blocks of tasks from a counter
        (after the shared B's pack tasks, when there is one)."""
        self.parts = min(self.threads, self.ntask)
        self.parallel = self.parts > 1 and self.ntask * self.cost >= PARALLEL_MIN_FLOPS
        if not self.parallel:
            return
        block = 1 if self.ntask <= self.parts or self.shared_rows else max(1, self.ntask // (self.parts * 4))
        self.ws_stride = _round_up(max(self.ws_bytes, 1), 4096)
        packer = ctypes.cast(self.packer, ctypes.c_void_p).value if self.shared_rows else 0
        self.job_bufs = (ctypes.c_uint64 * 7)(ctypes.cast(self.fn, ctypes.c_void_p).value, 0, 0, 0, packer, 0, 0)
        self.job_sizes = (ctypes.c_int64 * 4)(self.ntask, block, self.ws_stride, self.npack if self.shared_rows else 0)
        self.job = (ctypes.c_int64 * pool_ir.JOB_WORDS)(
            gemm_pool.entry_address(), ctypes.addressof(self.job_bufs), ctypes.addressof(self.job_sizes), 0,
            0, self.parts, 1, self.parts)
        self.counters = (ctypes.c_int64 * 3)()          # GEMM tasks taken, pack tasks taken, packs done
        self.job_addr = ctypes.addressof(self.job)

    def _run_native(self, params, pptr: int, own: bool) -> None:
        parts_bytes = self.ws_stride * self.parts
        ws = _workspace(parts_bytes + self.shared_bytes)
        if self.shared_rows:
            params[_BSHARED_SLOT] = ws + parts_bytes
        bufs, counters, job = self.job_bufs, self.counters, self.job_addr
        if not own:                                     # a concurrent caller: its own job words
            bufs, counters = type(bufs).from_buffer_copy(bufs), type(counters)()
            jb = type(self.job).from_buffer_copy(self.job)
            jb[1] = ctypes.addressof(bufs)
            job = ctypes.addressof(jb)
        base = ctypes.addressof(counters)
        bufs[1], bufs[2], bufs[3], bufs[5], bufs[6] = pptr, ws, base, base + 8, base + 16
        counters[0] = counters[1] = counters[2] = 0
        native_pool.ensure(self.threads)
        native_pool.run_jobs(job, 1, self.threads)

    def run(self, a: int, b: int, o: int, extras=(), scalars: int = 0) -> None:
        """extras: addresses of the epilogue's operands; scalars: address of its i64 scalars."""
        if self.out_elems == 0:
            return
        own = self.busy.acquire(blocking=False)
        try:
            params = self.params if own else type(self.params).from_buffer_copy(self.params)
            pptr = self.params_addr if own else ctypes.addressof(params)
            ia, ib, io = _ABO_SLOTS
            esz = self.esz
            params[_ESCAL_SLOT] = scalars
            for oa, ob, oo, *oe in self.outer:
                params[ia], params[ib], params[io] = a + oa * esz, b + ob * esz, o + oo * esz
                for slot, addr, off, ee in zip(self.ep_slots, extras, oe, self.ep_esz):
                    params[slot] = addr + off * ee      # the driver adds the batch offsets
                if self.parallel:
                    self._run_native(params, pptr, own)
                else:
                    self.fn(pptr, 0, self.ntask, _workspace(self.ws_bytes))
        finally:
            if own:
                self.busy.release()


# ---- entry point ------------------------------------------------------------------------
def choose_backend(g: Geometry, backend: str, threads: int, measure: bool = True):
    """"tiled" for integers, k == 0 and anything BLAS cannot take; "auto": whichever of the two
    measured faster on a problem of g's bucket at this thread count (runtime/matmul_auto.py;
    with `measure` False, None for a bucket not measured yet).  A bucket already decided for the
    tiled GEMM does not load the BLAS library to say so (blas.build_id)."""
    if backend == "tiled" or not blas_shape_ok(g):
        return "tiled"
    if backend == "auto" and matmul_auto.choose(g, threads, None, False) == "tiled":
        return "tiled"
    if not blas.available():
        return "tiled"
    if backend == "blas":
        return "blas"
    return matmul_auto.choose(g, threads, lambda p: _candidates(p, threads, True), measure)


def _candidates(g: Geometry, threads: int, with_blas: bool) -> dict:
    plans = {"tiled": TiledPlan(g, threads)}
    if with_blas:
        plans["blas"] = BlasPlan(g, threads)
    return plans


def backend_for(g: Geometry, backend: str, threads: int, measure: bool = True):
    """What plan_for runs g on: under "auto" the small-m kernel where it is chosen (by rule or
    measurement: runtime/matmul_skinny.py), else choose_backend's pick.  With `measure` False:
    None where a decision would be measured (matmul_words.Regime asks about nearby buckets)."""
    if backend == "auto":
        small = matmul_skinny.chosen(g, threads, lambda p: _candidates(p, threads, blas_ok(p)), measure)
        if small is None:
            return None
        if small:
            return "skinny"
    return choose_backend(g, backend, threads, measure)


def epilogue_spec(epilogue, g: Geometry) -> gemm_epilogue.Epilogue:
    """The codegen epilogue of (ew spec, index of the product among its inputs) on geometry g:
    the kernel is compiled for each operand's column stride class."""
    ew, mm_input = epilogue
    extras = [k for k in range(len(ew.inputs)) if k != mm_input]
    cols = [0] * len(ew.inputs)
    for k, (_, cs, _) in zip(extras, g.ep):
        cols[k] = gemm_epilogue.col_class(cs)
    inputs = tuple((dt, (gemm_epilogue.RUNTIME, c)) for (dt, _), c in zip(ew.inputs, cols))
    return gemm_epilogue.Epilogue(replace(ew, rank=2, inputs=inputs, tile=None), mm_input, tuple(cols))


_plans: dict = caches.register("matmul plans", {})
_plans_lock = threading.Lock()
caches.renew_lock_after_fork(sys.modules[__name__], "_plans_lock")
_MAX_PLANS = 512


def plan_for(a_layout: Layout, b_layout: Layout, dtype: DType, backend: str, threads: int,
             epilogue=None, ep_layouts=()):
    """The cached plan of one problem (on `backend_for`'s backend).  With `epilogue` (an
    ir/kernels.EwSpec over the output, and which of its inputs is the product: see
    `epilogue_spec`) and its other operands' layouts, a tiled or small-m plan applies it as it
    stores; a BLAS plan leaves it to the caller."""
    key = (dtype.name, a_layout.shape, a_layout.strides, b_layout.shape, b_layout.strides, backend, threads,
           epilogue, tuple((e.shape, e.strides) for e in ep_layouts) if ep_layouts else ())
    plan = _plans.get(key)
    if plan is None:
        g = geometry(a_layout, b_layout, dtype, ep_layouts)
        picked = backend_for(g, backend, threads)
        if picked == "skinny":
            plan = matmul_skinny.SkinnyPlan(g, threads, epilogue_spec(epilogue, g) if epilogue else None)
        elif picked == "blas":
            plan = BlasPlan(g, threads)
        else:
            plan = TiledPlan(g, threads, epilogue_spec(epilogue, g) if epilogue else None)
        with _plans_lock:
            if len(_plans) >= _MAX_PLANS:
                _plans.clear()
            _plans[key] = plan
    return plan


def matmul(a: np.ndarray, a_layout: Layout, b: np.ndarray, b_layout: Layout, out: np.ndarray,
           dtype: DType, backend: str | None = "auto") -> str:
    """out[..., m, n] = a[..., m, k] @ b[..., k, n] on storage buffers with strided layouts
    (offsets in elements).  backend "blas" | "tiled" | "auto" (None: the configured one);
    integer dtypes always run tiled.  Returns the backend actually used."""
    backend = backend or config.get_matmul_backend()
    if backend not in ("auto", "blas", "tiled"):
        raise ValueError(f"matmul: unknown backend {backend!r}; expected 'auto', 'blas' or 'tiled'")
    plan = plan_for(a_layout, b_layout, dtype, backend, config.get_num_threads())
    run_plan(plan, a, a_layout.offset, b, b_layout.offset, out)
    return plan.backend


def run_plan(plan, a: np.ndarray, a_offset: int, b: np.ndarray, b_offset: int, out: np.ndarray,
             *epilogue) -> None:
    """Run a plan of `plan_for` on storage buffers (operand offsets in elements): the executor
    keeps its step's plan and calls this, skipping the plan lookup.  `epilogue`: (operand
    addresses, scalars address) for a tiled plan made with one."""
    if out.size < plan.out_elems:
        g = plan.g
        raise ValueError(f"matmul: output buffer of {out.size} elements for {g.nbatch} x {g.m} x {g.n}")
    esz = plan.g.dtype.size_in_bytes
    if DATA_AT and a.__class__ is b.__class__ is out.__class__ is np.ndarray:    # (address() inline)
        pa, pb, po = read_word(id(a) + DATA_AT).value, read_word(id(b) + DATA_AT).value, read_word(id(out) + DATA_AT).value
    else:
        pa, pb, po = address(a), address(b), address(out)
    plan.run(pa + a_offset * esz, pb + b_offset * esz, po, *epilogue)
