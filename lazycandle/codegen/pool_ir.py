"""LLVM IR of the native worker pool (runtime/native_pool.py links it once per process).

Workers are pthreads parked on a condition variable: an idle pool uses no CPU.  A parallel
section is a list of JOBS, each `JOB_WORDS` i64 words:

    [kernel fn, bufs, sizes, scalars, lo, hi, align, max parts]

where the kernel has the common ABI (codegen/loops.py KERNEL_FN).  Thread t of `nparts`
runs chunk t of every job (chunks split [lo, hi) on multiples of `align`, at most `max parts`
of them), so independent kernels of one phase share a single barrier.  The caller is thread
0; `lc_pool_run` returns when every chunk is done.  One section runs at a time (callers from
several threads queue on an entry mutex).

All shared words are read and written under the pool mutex; they have external linkage and
are loaded atomically so the optimiser can never cache them across a wait.  The pthread
objects are opaque byte blocks larger than any ABI's (glibc x86-64: 40 and 48 bytes) and are
initialised by pthread_*_init, so no layout is assumed."""
from __future__ import annotations

import llvmlite.ir as ir

from .llvmutil import I8, I32, I64, VOID
from .loops import new_module, counted_loop

JOB_WORDS = 8
SYNC_BYTES = 256                 # room for one pthread mutex / condition variable
EXPORTS = ("lc_pool_init", "lc_pool_run", "lc_pool_start", "lc_pool_reset", "lc_pool_ready")

I8P = I8.as_pointer()
I64P = I64.as_pointer()
KERNEL_T = ir.FunctionType(VOID, [I8P.as_pointer(), I64P, I64P, I64, I64])


class _Pool:
    def __init__(self):
        self.m = m = new_module("lc_native_pool")
        self.words = {n: self._global(f"lc_pool_word_{n}", I64, 8)
                      for n in ("gen", "pending", "ready", "created", "jobs", "njobs", "nparts")}
        self.sync = {n: self._global(f"lc_pool_sync_{n}", ir.ArrayType(I8, SYNC_BYTES), 64)
                     for n in ("mutex", "entry", "work_cv", "done_cv")}

        def decl(name, ret, args):
            f = ir.Function(m, ir.FunctionType(ret, args), name)
            f.attributes.add("nounwind")
            return f
        self.lock = decl("pthread_mutex_lock", I32, [I8P])
        self.unlock = decl("pthread_mutex_unlock", I32, [I8P])
        self.mutex_init = decl("pthread_mutex_init", I32, [I8P, I8P])
        self.cond_init = decl("pthread_cond_init", I32, [I8P, I8P])
        self.wait = decl("pthread_cond_wait", I32, [I8P, I8P])
        self.broadcast = decl("pthread_cond_broadcast", I32, [I8P])
        self.signal = decl("pthread_cond_signal", I32, [I8P])
        worker_t = ir.FunctionType(I8P, [I8P])
        self.create = decl("pthread_create", I32, [I64P, I8P, worker_t.as_pointer(), I8P])
        self.detach = decl("pthread_detach", I32, [I64])

    def _global(self, name, ty, align):
        g = ir.GlobalVariable(self.m, ty, name)
        g.initializer = ir.Constant(ty, None)
        g.align = align
        return g

    # ---- helpers ------------------------------------------------------------------------
    def ptr(self, b, name):
        return b.bitcast(self.sync[name], I8P)

    def get(self, b, name):
        return b.load_atomic(self.words[name], "monotonic", 8)

    def put(self, b, name, v):
        b.store_atomic(v, self.words[name], "monotonic", 8)

    @staticmethod
    def smin(b, x, y):
        return b.select(b.icmp_signed("<", x, y), x, y)

    # ---- functions ----------------------------------------------------------------------
    def build_run_part(self):
        """run_part(jobs, njobs, t, nparts): thread t's chunk of every job."""
        fn = ir.Function(self.m, ir.FunctionType(VOID, [I64P, I64, I64, I64]), "lc_pool_run_part")
        fn.linkage = "internal"
        jobs, njobs, t, nparts = fn.args
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        with counted_loop(b, I64(0), njobs, name="j") as j:
            base = b.mul(j, I64(JOB_WORDS))
            w = [b.load(b.gep(jobs, [b.add(base, I64(k))])) for k in range(JOB_WORDS)]
            f, bufs, sizes, scalars, lo, hi, align, maxp = w
            n = b.sub(hi, lo)
            units = b.sdiv(b.add(n, b.sub(align, I64(1))), align)
            parts = self.smin(b, self.smin(b, nparts, maxp), units)
            with b.if_then(b.and_(b.icmp_signed(">", n, I64(0)), b.icmp_signed("<", t, parts))):
                def bound(p):
                    return b.add(lo, b.mul(b.sdiv(b.sdiv(b.mul(n, p), parts), align), align))
                t1 = b.add(t, I64(1))
                a = bound(t)
                e = b.select(b.icmp_signed("==", t1, parts), hi, bound(t1))
                with b.if_then(b.icmp_signed("<", a, e)):
                    b.call(b.inttoptr(f, KERNEL_T.as_pointer()),
                           [b.inttoptr(bufs, I8P.as_pointer()), b.inttoptr(sizes, I64P),
                            b.inttoptr(scalars, I64P), a, e])
        b.ret_void()
        self.run_part = fn

    def build_worker(self):
        fn = ir.Function(self.m, ir.FunctionType(I8P, [I8P]), "lc_pool_worker")
        fn.linkage = "internal"
        entry = fn.append_basic_block("entry")
        head = fn.append_basic_block("head")
        park = fn.append_basic_block("park")
        work = fn.append_basic_block("work")
        b = ir.IRBuilder(entry)
        mu = self.ptr(b, "mutex")
        seen = b.alloca(I64, name="seen")
        b.call(self.lock, [mu])
        me = b.add(self.get(b, "ready"), I64(1), name="me")     # ids are handed out in start order
        self.put(b, "ready", me)
        b.store(self.get(b, "gen"), seen)
        b.branch(head)
        b.position_at_end(head)
        g = self.get(b, "gen")
        b.cbranch(b.icmp_signed("==", g, b.load(seen)), park, work)
        b.position_at_end(park)
        b.call(self.wait, [self.ptr(b, "work_cv"), mu])
        b.branch(head)
        b.position_at_end(work)
        b.store(g, seen)
        jobs, njobs, nparts = (self.get(b, n) for n in ("jobs", "njobs", "nparts"))
        with b.if_then(b.icmp_signed("<", me, nparts)):
            b.call(self.unlock, [mu])
            b.call(self.run_part, [b.inttoptr(jobs, I64P), njobs, me, nparts])
            b.call(self.lock, [mu])
            left = b.sub(self.get(b, "pending"), I64(1))
            self.put(b, "pending", left)
            with b.if_then(b.icmp_signed("==", left, I64(0))):
                b.call(self.signal, [self.ptr(b, "done_cv")])
        b.branch(head)
        self.worker = fn

    def build_run(self):
        """lc_pool_run(jobs, njobs, nthreads)."""
        fn = ir.Function(self.m, ir.FunctionType(VOID, [I64P, I64, I64]), "lc_pool_run")
        jobs, njobs, nthreads = fn.args
        entry = fn.append_basic_block("entry")
        serial = fn.append_basic_block("serial")
        pooled = fn.append_basic_block("pooled")
        alone = fn.append_basic_block("alone")
        share = fn.append_basic_block("share")
        wait_head = fn.append_basic_block("wait.head")
        wait_park = fn.append_basic_block("wait.park")
        done = fn.append_basic_block("done")
        b = ir.IRBuilder(entry)
        b.cbranch(b.icmp_signed("<=", nthreads, I64(1)), serial, pooled)
        b.position_at_end(serial)
        b.call(self.run_part, [jobs, njobs, I64(0), I64(1)])
        b.ret_void()
        b.position_at_end(pooled)
        mu, entry_mu = self.ptr(b, "mutex"), self.ptr(b, "entry")
        b.call(self.lock, [entry_mu])
        b.call(self.lock, [mu])
        nparts = self.smin(b, nthreads, b.add(self.get(b, "ready"), I64(1)))
        b.cbranch(b.icmp_signed("<=", nparts, I64(1)), alone, share)
        b.position_at_end(alone)
        b.call(self.unlock, [mu])
        b.call(self.run_part, [jobs, njobs, I64(0), I64(1)])
        b.call(self.unlock, [entry_mu])
        b.ret_void()
        b.position_at_end(share)
        self.put(b, "jobs", b.ptrtoint(jobs, I64))
        self.put(b, "njobs", njobs)
        self.put(b, "nparts", nparts)
        self.put(b, "pending", b.sub(nparts, I64(1)))
        self.put(b, "gen", b.add(self.get(b, "gen"), I64(1)))
        b.call(self.broadcast, [self.ptr(b, "work_cv")])
        b.call(self.unlock, [mu])
        b.call(self.run_part, [jobs, njobs, I64(0), nparts])
        b.call(self.lock, [mu])
        b.branch(wait_head)
        b.position_at_end(wait_head)
        b.cbranch(b.icmp_signed("==", self.get(b, "pending"), I64(0)), done, wait_park)
        b.position_at_end(wait_park)
        b.call(self.wait, [self.ptr(b, "done_cv"), mu])
        b.branch(wait_head)
        b.position_at_end(done)
        b.call(self.unlock, [mu])
        b.call(self.unlock, [entry_mu])
        b.ret_void()

    def build_init_reset(self):
        """lc_pool_init(): the pthread objects.  lc_pool_reset(): the same in a forked child,
        which has no workers (and may have copied a locked mutex): counts restart at zero."""
        init = ir.Function(self.m, ir.FunctionType(VOID, []), "lc_pool_init")
        b = ir.IRBuilder(init.append_basic_block("entry"))
        null = ir.Constant(I8P, None)
        for n in ("mutex", "entry"):
            b.call(self.mutex_init, [self.ptr(b, n), null])
        for n in ("work_cv", "done_cv"):
            b.call(self.cond_init, [self.ptr(b, n), null])
        b.ret_void()
        reset = ir.Function(self.m, ir.FunctionType(VOID, []), "lc_pool_reset")
        b = ir.IRBuilder(reset.append_basic_block("entry"))
        b.call(init, [])
        for n in ("pending", "ready", "created"):
            self.put(b, n, I64(0))
        b.ret_void()

    def build_start(self):
        """lc_pool_start(n): start workers until n - 1 exist (the caller is the n-th thread);
        returns how many were started in all.  Called under the Python side's lock."""
        fn = ir.Function(self.m, ir.FunctionType(I64, [I64]), "lc_pool_start")
        entry = fn.append_basic_block("entry")
        head = fn.append_basic_block("head")
        body = fn.append_basic_block("body")
        done = fn.append_basic_block("done")
        b = ir.IRBuilder(entry)
        tid = b.alloca(I64, name="tid")
        b.branch(head)
        b.position_at_end(head)
        made = self.get(b, "created")
        b.cbranch(b.icmp_signed("<", b.add(made, I64(1)), fn.args[0]), body, done)
        b.position_at_end(body)
        rc = b.call(self.create, [tid, ir.Constant(I8P, None), self.worker, ir.Constant(I8P, None)])
        ok = b.append_basic_block("ok")
        b.cbranch(b.icmp_signed("==", rc, I32(0)), ok, done)     # no thread: run with fewer
        b.position_at_end(ok)
        b.call(self.detach, [b.load(tid)])
        self.put(b, "created", b.add(made, I64(1)))
        b.branch(head)
        b.position_at_end(done)
        b.ret(self.get(b, "created"))
        ready = ir.Function(self.m, ir.FunctionType(I64, []), "lc_pool_ready")
        b = ir.IRBuilder(ready.append_basic_block("entry"))
        b.call(self.lock, [self.ptr(b, "mutex")])
        r = self.get(b, "ready")
        b.call(self.unlock, [self.ptr(b, "mutex")])
        b.ret(r)


def build() -> str:
    """The pool module's IR text."""
    p = _Pool()
    p.build_run_part()
    p.build_worker()
    p.build_run()
    p.build_init_reset()
    p.build_start()
    return str(p.m)
