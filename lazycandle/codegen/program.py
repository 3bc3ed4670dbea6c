"""The whole-program module of a Plan: one LLVM function per native segment (a run of
consecutive generated kernels; a plan of kernels only has one, named `run`) that calls every
kernel of the segment over the native worker pool (codegen/pool_ir.py), phase by phase:

    i64 @run(i64* ptrs, i64* sizes, i64* scalars, i64 nthreads)

`ptrs` holds every kernel's buffer pointers back to back (a kernel's `i8** bufs` is a slice of
it), `sizes` per call two words -- its extent and its parts (SERIAL or PARALLEL) -- then its
runtime sizes, `scalars` the plan's packed scalar slots (each kernel's own slots are gathered
on the stack).  Kernels of one phase are independent and share one barrier (one
`lc_pool_run`); a phase whose calls are all SERIAL at this run is called directly on the
calling thread, each call skipped when its extent is 0.  A kernel with a status word (the
index kernels' bad-id flag) is checked after its phase; the function returns 1 + the failing
call's index, or 0.

Nothing size-dependent is in the IR: one module serves every binding of a plan's size class
(runtime/native_exec.py fills `ptrs` and `sizes` per binding).  The kernels are external
functions resolved at link time (`Call.symbol`), so the IR text holds no addresses either."""
from __future__ import annotations

from dataclasses import dataclass

import llvmlite.ir as ir

from . import pool_ir
from .llvmutil import I8, I64, VOID
from .loops import new_module

SERIAL, PARALLEL = 1, 1 << 40          # a call's max parts


@dataclass(frozen=True)
class Call:
    """One kernel call of a segment."""
    symbol: str             # the kernel's name in the module (bound to its address at link)
    word_at: int            # `sizes` position of its extent (it runs [0, extent)) and then its parts
    align: int              # chunk bounds are multiples of this
    bufs_at: int            # first of its pointers in `ptrs`
    sizes_at: int | None    # first of its sizes in `sizes` (None: it takes none)
    scalar_slots: tuple     # plan scalar slots it reads, in its order
    status_at: int | None   # ptrs position of its status word (i64 flag, i64 value), or None
    label: str = ""         # what the dump shows


I8PP = I8.as_pointer().as_pointer()
I64P = I64.as_pointer()
KERNEL_T = ir.FunctionType(VOID, [I8PP, I64P, I64P, I64, I64])
SEGMENT_T = ir.FunctionType(I64, [I64P, I64P, I64P, I64])


def segment_names(n: int) -> list:
    return ["run"] if n == 1 else [f"run_segment{i}" for i in range(n)]


def build(segments) -> str:
    """IR text of the module: `segments` is a list of segments, each a list of phases, each a
    list of Calls.  Call indices (for the status return) count over the whole segment."""
    m = new_module("lc_program")
    kernels = {}
    pool_run = ir.Function(m, ir.FunctionType(VOID, [I64P, I64, I64]), "lc_pool_run")
    for seg in segments:
        for phase in seg:
            for c in phase:
                if c.symbol not in kernels:
                    kernels[c.symbol] = ir.Function(m, KERNEL_T, c.symbol)
    for name, seg in zip(segment_names(len(segments)), segments):
        _segment(m, name, seg, kernels, pool_run)
    return str(m)


def _segment(m, name, phases, kernels, pool_run):
    fn = ir.Function(m, SEGMENT_T, name)
    ptrs, sizes, scalars, nthreads = fn.args
    for a, n in zip(fn.args, ("ptrs", "sizes", "scalars", "nthreads")):
        a.name = n
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    null64 = ir.Constant(I64P, None)
    args, jobs_of, index = {}, [], 0
    for p, phase in enumerate(phases):
        jobs_of.append(b.bitcast(b.alloca(ir.ArrayType(I64, pool_ir.JOB_WORDS * len(phase)), name=f"phase{p}.jobs"),
                                 I64P))
        for c in phase:
            bufs = b.bitcast(b.gep(ptrs, [I64(c.bufs_at)], inbounds=True), I8PP)
            sz = b.gep(sizes, [I64(c.sizes_at)], inbounds=True) if c.sizes_at is not None else null64
            sc = null64
            if c.scalar_slots:
                sc = b.bitcast(b.alloca(ir.ArrayType(I64, len(c.scalar_slots))), I64P)
                for k, slot in enumerate(c.scalar_slots):
                    b.store(b.load(b.gep(scalars, [I64(slot)], inbounds=True)), b.gep(sc, [I64(k)], inbounds=True))
            args[index] = (bufs, sz, sc)
            index += 1
    index = 0
    for p, phase in enumerate(phases):
        first = index
        words = [(b.load(b.gep(sizes, [I64(c.word_at)], inbounds=True)),
                  b.load(b.gep(sizes, [I64(c.word_at + 1)], inbounds=True))) for c in phase]
        pooled = b.icmp_unsigned("!=", words[0][1], I64(SERIAL))
        for _, parts in words[1:]:
            pooled = b.or_(pooled, b.icmp_unsigned("!=", parts, I64(SERIAL)))
        with b.if_else(pooled) as (on_pool, on_caller):
            with on_pool:
                jobs = jobs_of[p]
                for j, (c, (extent, parts)) in enumerate(zip(phase, words)):
                    bufs, sz, sc = args[index + j]
                    job = [b.ptrtoint(kernels[c.symbol], I64), b.ptrtoint(bufs, I64), b.ptrtoint(sz, I64),
                           b.ptrtoint(sc, I64), I64(0), extent, I64(c.align), parts]
                    for w, v in enumerate(job):
                        b.store(v, b.gep(jobs, [I64(j * pool_ir.JOB_WORDS + w)], inbounds=True))
                b.call(pool_run, [jobs, I64(len(phase)), nthreads])
            with on_caller:
                for j, (c, (extent, _)) in enumerate(zip(phase, words)):
                    bufs, sz, sc = args[index + j]
                    with b.if_then(b.icmp_signed(">", extent, I64(0))):
                        b.call(kernels[c.symbol], [bufs, sz, sc, I64(0), extent])
        index += len(phase)
        for k, c in enumerate(phase):
            if c.status_at is not None:
                word = b.inttoptr(b.load(b.gep(ptrs, [I64(c.status_at)], inbounds=True)), I64P)
                with b.if_then(b.icmp_unsigned("!=", b.load(word), I64(0)), likely=False):
                    b.ret(I64(first + k + 1))
    b.ret(I64(0))
