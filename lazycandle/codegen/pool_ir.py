"""LLVM IR of the native worker pool (runtime/native_pool.py links it once per process).

A parallel section is a list of JOBS, each `JOB_WORDS` i64 words:

    [kernel fn, bufs, sizes, scalars, lo, hi, align, max parts]

where the kernel has the common ABI (codegen/loops.py KERNEL_FN).  Each job splits [lo, hi)
into min(nparts * CHUNKS_PER_THREAD, max parts, units) chunks on multiples of `align`; the
chunks of all jobs of a section are numbered in order (so independent kernels of one phase
share a single barrier) and cut into one contiguous HOME range per thread, thread t of
`nparts` owning the t-th.  A thread runs its own range first, front to back, taking chunks
from its range's counter (an atomic add), and then takes the chunks left in the others'
ranges the same way.  When every thread is there each runs exactly its home range, as a
static split would (the same thread reads the same region in consecutive phases); a worker
that is late -- parked, or descheduled by another process -- finds its range done or partly
done by the others, and the caller never waits for a thread that has not started: it
closes the section once every chunk is taken and waits only for the threads inside it.
The caller is thread 0; `lc_pool_run` returns when every chunk is done.  One section runs at
a time (callers from several threads queue on an entry mutex).

Waiting is spin-then-park in both directions (as OpenMP's blocktime, but short): a worker
that finished its chunk polls the section word for `spin` polls (calibrated by the runtime
to a few tens of microseconds) before it parks on `work_cv`; the caller polls `pending` the
same way before it parks on `done_cv`; both yield the core every YIELD_POLLS polls.  A
worker a section leaves out (a lower thread setting) parks at once.  Back-to-back sections
then never pay a futex sleep/wake (an IPI and a VM exit each on a VM), and an idle pool
still parks and uses no CPU.
`lc_pool_hush` makes spinning workers park at once (before a BLAS call that wants the cores).
`lc_pool_wake` wakes parked workers into that spin ahead of a section: a caller that knows a
big parallel section is coming (an eager realize, before its Python work) calls it, and the
worker's wake-up (tens of microseconds on a VM: futex, IPI, the idle vCPU scheduled again)
overlaps that work instead of delaying the section.  A worker parks on the section word and
the `wake` counter, both read under the mutex the waker holds, so no wake is lost.

Shared words:
- `section` = sequence << 32 | CLOSED | nparts, written (release) under the mutex after the
  job words, the chunk total and the counters, so a spinning worker's acquire load of it
  orders its loads of those; a worker outside the section (id >= nparts) learns so without
  reading any job word.  The caller sets CLOSED (seq_cst) once every chunk is taken.
- `active` counts the workers inside the section.  A worker increments it (seq_cst) and then
  re-reads `section` (seq_cst): if the section is CLOSED it leaves at once, touching nothing
  else.  The caller sets CLOSED and then reads `active`: one of the two sees the other, so
  the caller waits for every worker that could still take a chunk, and for no other.
- The caller sets `waiting` (seq_cst) under the mutex before it parks; a worker that takes
  `active` to zero reads `waiting` after its decrement and signals only then (under the
  mutex) -- one of the two always sees the other, so no wake-up is lost.
- a worker parks only after re-reading `section` under the mutex, which the caller holds
  while it publishes and broadcasts, so no wake-up is lost there either.
The words have external linkage and are accessed atomically so the optimiser can never
cache them across a wait.  The pthread objects are opaque byte blocks larger than any ABI's
(glibc x86-64: 40 and 48 bytes) and are initialised by pthread_*_init, so no layout is assumed."""
from __future__ import annotations

import llvmlite.ir as ir

from . import jit
from .llvmutil import I8, I32, I64, VOID
from .loops import new_module, counted_loop

JOB_WORDS = 8
CHUNKS_PER_THREAD = 4            # chunks of a job per thread: what a late thread's peers can take over
MAX_HOMES = 64                   # home ranges (one counter each); threads beyond only take others' chunks
SYNC_BYTES = 256                 # room for one pthread mutex / condition variable
YIELD_POLLS = 32                 # polls between sched_yield calls in a spin (a power of two)
PARTS_BITS = 31                  # low bits of the section word: the section's nparts ...
CLOSED = 1 << PARTS_BITS         # ... below the closed flag; the sequence is in the high 32 bits
SEQ_STEP = 1 << 32
EXPORTS = ("lc_pool_init", "lc_pool_run", "lc_pool_start", "lc_pool_reset", "lc_pool_ready",
           "lc_pool_set_spin", "lc_pool_spin", "lc_pool_hush", "lc_pool_wake")

I8P = I8.as_pointer()
I64P = I64.as_pointer()
KERNEL_T = ir.FunctionType(VOID, [I8P.as_pointer(), I64P, I64P, I64, I64])
WORDS = ("section", "active", "waiting", "hush", "spin", "ready", "created", "jobs", "njobs",
         "total", "probe", "wake")
LINE_WORDS = 8                   # i64 words per cache line: one home counter per line


class _Pool:
    def __init__(self, triple: str):
        self.m = m = new_module("lc_native_pool")
        self.words = {n: self._global(f"lc_pool_word_{n}", I64, 64 if n in ("section", "active") else 8)
                      for n in WORDS}
        self.next = self._global("lc_pool_home_next", ir.ArrayType(I64, MAX_HOMES * LINE_WORDS), 64)
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
        self.sched_yield = decl("sched_yield", I32, [])
        x86 = triple.startswith(("x86_64", "i386", "i486", "i586", "i686"))
        self.pause = decl("llvm.x86.sse2.pause", VOID, []) if x86 else None   # else: bare polls

    def _global(self, name, ty, align):
        g = ir.GlobalVariable(self.m, ty, name)
        g.initializer = ir.Constant(ty, None)
        g.align = align
        return g

    # ---- helpers ------------------------------------------------------------------------
    def ptr(self, b, name):
        return b.bitcast(self.sync[name], I8P)

    def get(self, b, name, order="monotonic"):
        return b.load_atomic(self.words[name], order, 8)

    def put(self, b, name, v, order="monotonic"):
        b.store_atomic(v, self.words[name], order, 8)

    @staticmethod
    def smin(b, x, y):
        return b.select(b.icmp_signed("<", x, y), x, y)

    def spin(self, b, polls, stop):
        """Poll `stop(b)` (an i1) at most `polls` times, pausing between polls and yielding
        the core every YIELD_POLLS polls (when the machine is oversubscribed the thread we
        wait for may be queued on this very core); falls through either way (the caller
        re-reads what it waits for)."""
        fn = b.block.function
        pre = b.block
        head, body, out = (fn.append_basic_block(f"spin.{s}") for s in ("head", "body", "out"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I64, name="polls")
        i.add_incoming(I64(0), pre)
        b.cbranch(b.or_(stop(b), b.icmp_signed(">=", i, polls)), out, body)
        b.position_at_end(body)
        if self.pause is not None:
            b.call(self.pause, [])
        with b.if_then(b.icmp_signed("==", b.and_(i, I64(YIELD_POLLS - 1)), I64(YIELD_POLLS - 1))):
            b.call(self.sched_yield, [])
        i.add_incoming(b.add(i, I64(1)), b.block)
        b.branch(head)
        b.position_at_end(out)

    def section_moved(self, seen, word="section"):
        """stop(b) for `spin`: the word no longer holds `seen`, or a hush asks to park."""
        def stop(b):
            moved = b.icmp_signed("!=", self.get(b, word, "acquire"), seen)
            return b.or_(moved, b.icmp_signed("!=", self.get(b, "hush"), I64(0)))
        return stop

    # ---- functions ----------------------------------------------------------------------
    def job_words(self, b, jobs, j):
        base = b.mul(j, I64(JOB_WORDS))
        return [b.load(b.gep(jobs, [b.add(base, I64(k))])) for k in range(JOB_WORDS)]

    def chunks_of(self, b, w, nparts):
        """How many chunks job words `w` split into at `nparts` threads (0 for an empty job)."""
        _, _, _, _, lo, hi, align, maxp = w
        n = b.sub(hi, lo)
        units = b.sdiv(b.add(n, b.sub(align, I64(1))), align)
        parts = self.smin(b, self.smin(b, b.mul(nparts, I64(CHUNKS_PER_THREAD)), maxp), units)
        return b.select(b.icmp_signed(">", n, I64(0)), parts, I64(0))

    def home_end(self, b, v, total, owners):
        """End (exclusive) of home range v of `owners` over `total` chunks (start: home_end(v - 1))."""
        return b.sdiv(b.mul(b.add(v, I64(1)), total), owners)

    def counter(self, b, v):
        return b.gep(self.next, [I64(0), b.mul(v, I64(LINE_WORDS))])

    def build_chunks(self):
        """lc_pool_run_chunk(jobs, njobs, c, nparts): chunk c of the section (numbered over
        the jobs in order); lc_pool_total(jobs, njobs, nparts): how many there are;
        lc_pool_run_all(jobs, njobs): every job whole, on the calling thread;
        lc_pool_claim(jobs, njobs, nparts, total, me): thread `me` runs chunks from its home
        range and then from the others' until every range's counter is past its end."""
        m = self.m
        run = ir.Function(m, ir.FunctionType(VOID, [I64P, I64, I64, I64]), "lc_pool_run_chunk")
        run.linkage = "internal"
        jobs, njobs, c, nparts = run.args
        entry, head, body, hit, nxt, out = (run.append_basic_block(n) for n in
                                            ("entry", "head", "body", "hit", "next", "out"))
        b = ir.IRBuilder(entry)
        b.branch(head)
        b.position_at_end(head)
        j, acc = b.phi(I64, name="j"), b.phi(I64, name="acc")
        j.add_incoming(I64(0), entry)
        acc.add_incoming(I64(0), entry)
        b.cbranch(b.icmp_signed("<", j, njobs), body, out)
        b.position_at_end(body)
        w = self.job_words(b, jobs, j)
        cnt = self.chunks_of(b, w, nparts)
        rel = b.sub(c, acc)
        b.cbranch(b.icmp_signed("<", rel, cnt), hit, nxt)
        b.position_at_end(nxt)
        j.add_incoming(b.add(j, I64(1)), nxt)
        acc.add_incoming(b.add(acc, cnt), nxt)
        b.branch(head)
        b.position_at_end(hit)
        f, bufs, sizes, scalars, lo, hi, align, _ = w
        n = b.sub(hi, lo)

        def bound(p):
            return b.add(lo, b.mul(b.sdiv(b.sdiv(b.mul(n, p), cnt), align), align))
        r1 = b.add(rel, I64(1))
        a = bound(rel)
        e = b.select(b.icmp_signed("==", r1, cnt), hi, bound(r1))
        with b.if_then(b.icmp_signed("<", a, e)):
            b.call(b.inttoptr(f, KERNEL_T.as_pointer()),
                   [b.inttoptr(bufs, I8P.as_pointer()), b.inttoptr(sizes, I64P), b.inttoptr(scalars, I64P), a, e])
        b.ret_void()
        b.position_at_end(out)
        b.ret_void()

        tot = ir.Function(m, ir.FunctionType(I64, [I64P, I64, I64]), "lc_pool_total")
        tot.linkage = "internal"
        jobs, njobs, nparts = tot.args
        b = ir.IRBuilder(tot.append_basic_block("entry"))
        sum_ = b.alloca(I64)
        b.store(I64(0), sum_)
        with counted_loop(b, I64(0), njobs, name="j") as jj:
            b.store(b.add(b.load(sum_), self.chunks_of(b, self.job_words(b, jobs, jj), nparts)), sum_)
        b.ret(b.load(sum_))

        whole = ir.Function(m, ir.FunctionType(VOID, [I64P, I64]), "lc_pool_run_all")
        whole.linkage = "internal"
        jobs, njobs = whole.args
        b = ir.IRBuilder(whole.append_basic_block("entry"))
        with counted_loop(b, I64(0), njobs, name="j") as jj:
            f, bufs, sizes, scalars, lo, hi, _, _ = self.job_words(b, jobs, jj)
            with b.if_then(b.icmp_signed("<", lo, hi)):
                b.call(b.inttoptr(f, KERNEL_T.as_pointer()),
                       [b.inttoptr(bufs, I8P.as_pointer()), b.inttoptr(sizes, I64P), b.inttoptr(scalars, I64P),
                        lo, hi])
        b.ret_void()

        claim = ir.Function(m, ir.FunctionType(VOID, [I64P, I64, I64, I64, I64]), "lc_pool_claim")
        claim.linkage = "internal"
        jobs, njobs, nparts, total, me = claim.args
        entry, take, hit, move, out = (claim.append_basic_block(n) for n in ("entry", "take", "hit", "move", "out"))
        b = ir.IRBuilder(entry)
        owners = self.smin(b, nparts, I64(MAX_HOMES))
        start = b.srem(me, owners)
        b.branch(take)
        b.position_at_end(take)
        k = b.phi(I64, name="k")                   # ranges tried: home first, then the next ones around
        k.add_incoming(I64(0), entry)
        v = b.srem(b.add(start, k), owners)
        got = b.atomic_rmw("add", self.counter(b, v), I64(1), "monotonic")
        b.cbranch(b.icmp_signed("<", got, self.home_end(b, v, total, owners)), hit, move)
        b.position_at_end(hit)
        b.call(run, [jobs, njobs, got, nparts])
        k.add_incoming(k, hit)
        b.branch(take)
        b.position_at_end(move)
        k1 = b.add(k, I64(1))
        k.add_incoming(k1, move)
        b.cbranch(b.icmp_signed("<", k1, owners), take, out)
        b.position_at_end(out)
        b.ret_void()
        self.total, self.run_all, self.claim = tot, whole, claim

    def build_worker(self):
        fn = ir.Function(self.m, ir.FunctionType(I8P, [I8P]), "lc_pool_worker")
        fn.linkage = "internal"
        blocks = {n: fn.append_basic_block(n) for n in ("entry", "idle", "park", "park.check",
                                                        "park.wait", "park.out", "work", "open", "enter",
                                                        "run", "leave")}
        b = ir.IRBuilder(blocks["entry"])
        mu = self.ptr(b, "mutex")
        seen = b.alloca(I64, name="seen")
        b.call(self.lock, [mu])           # id and first section word together, under the mutex
        me = b.add(self.get(b, "ready"), I64(1), name="me")     # ids are handed out in start order
        self.put(b, "ready", me)
        b.store(self.get(b, "section"), seen)
        b.call(self.unlock, [mu])
        b.branch(blocks["idle"])

        b.position_at_end(blocks["idle"])             # spin a while, then park
        old = b.load(seen)
        self.spin(b, self.get(b, "spin"), self.section_moved(old))
        b.cbranch(b.icmp_signed("!=", self.get(b, "section", "acquire"), old), blocks["work"], blocks["park"])

        b.position_at_end(blocks["park"])
        parked_on = b.load(seen)
        b.call(self.lock, [mu])
        woken_at = self.get(b, "wake")
        b.branch(blocks["park.check"])
        b.position_at_end(blocks["park.check"])
        moved = b.or_(b.icmp_signed("!=", self.get(b, "section", "acquire"), parked_on),
                      b.icmp_signed("!=", self.get(b, "wake"), woken_at))
        b.cbranch(moved, blocks["park.out"], blocks["park.wait"])
        b.position_at_end(blocks["park.wait"])
        b.call(self.wait, [self.ptr(b, "work_cv"), mu])
        b.branch(blocks["park.check"])
        b.position_at_end(blocks["park.out"])
        b.call(self.unlock, [mu])
        b.branch(blocks["work"])

        def parts_of(word):
            return b.and_(word, I64(CLOSED - 1))

        def is_open(word):
            return b.icmp_signed("==", b.and_(word, I64(CLOSED)), I64(0))

        b.position_at_end(blocks["work"])
        word = self.get(b, "section", "acquire")
        b.store(word, seen)
        # a worker the section leaves out is not wanted at the current thread setting: it
        # parks at once rather than spin against the threads that are
        b.cbranch(b.icmp_signed("<", me, parts_of(word)), blocks["open"], blocks["park"])
        b.position_at_end(blocks["open"])
        b.cbranch(is_open(word), blocks["enter"], blocks["idle"])     # closed: its chunks are all taken
        b.position_at_end(blocks["enter"])
        b.atomic_rmw("add", self.words["active"], I64(1), "seq_cst")
        word = self.get(b, "section", "seq_cst")      # (after entering: see the module docstring)
        b.store(word, seen)
        b.cbranch(b.and_(is_open(word), b.icmp_signed("<", me, parts_of(word))), blocks["run"], blocks["leave"])
        b.position_at_end(blocks["run"])
        b.call(self.claim, [b.inttoptr(self.get(b, "jobs"), I64P), self.get(b, "njobs"), parts_of(word),
                            self.get(b, "total"), me])
        b.branch(blocks["leave"])
        b.position_at_end(blocks["leave"])
        left = b.atomic_rmw("sub", self.words["active"], I64(1), "seq_cst")
        last = b.icmp_signed("==", left, I64(1))
        with b.if_then(b.and_(last, b.icmp_signed("!=", self.get(b, "waiting", "seq_cst"), I64(0)))):
            b.call(self.lock, [mu])
            b.call(self.signal, [self.ptr(b, "done_cv")])
            b.call(self.unlock, [mu])
        b.branch(blocks["idle"])
        self.worker = fn

    def build_run(self):
        """lc_pool_run(jobs, njobs, nthreads)."""
        fn = ir.Function(self.m, ir.FunctionType(VOID, [I64P, I64, I64]), "lc_pool_run")
        jobs, njobs, nthreads = fn.args
        blocks = {n: fn.append_basic_block(n) for n in ("entry", "serial", "pooled", "alone", "share",
                                                        "park", "park.check", "park.wait", "done")}
        b = ir.IRBuilder(blocks["entry"])
        b.cbranch(b.icmp_signed("<=", nthreads, I64(1)), blocks["serial"], blocks["pooled"])
        b.position_at_end(blocks["serial"])
        b.call(self.run_all, [jobs, njobs])
        b.ret_void()
        b.position_at_end(blocks["pooled"])
        mu, entry_mu = self.ptr(b, "mutex"), self.ptr(b, "entry")
        b.call(self.lock, [entry_mu])
        b.call(self.lock, [mu])
        nparts = self.smin(b, nthreads, b.add(self.get(b, "ready"), I64(1)))
        b.cbranch(b.icmp_signed("<=", nparts, I64(1)), blocks["alone"], blocks["share"])
        b.position_at_end(blocks["alone"])
        b.call(self.unlock, [mu])
        b.call(self.run_all, [jobs, njobs])
        b.call(self.unlock, [entry_mu])
        b.ret_void()

        b.position_at_end(blocks["share"])
        self.put(b, "jobs", b.ptrtoint(jobs, I64))
        self.put(b, "njobs", njobs)
        total = b.call(self.total, [jobs, njobs, nparts])
        self.put(b, "total", total)
        owners = self.smin(b, nparts, I64(MAX_HOMES))
        with counted_loop(b, I64(0), owners, name="v") as v:
            start = b.select(b.icmp_signed("==", v, I64(0)), I64(0),
                             self.home_end(b, b.sub(v, I64(1)), total, owners))
            b.store_atomic(start, self.counter(b, v), "monotonic", 8)
        self.put(b, "hush", I64(0))
        seq = b.and_(self.get(b, "section"), I64(-SEQ_STEP))
        self.put(b, "section", b.add(b.add(seq, I64(SEQ_STEP)), nparts), "release")
        b.call(self.broadcast, [self.ptr(b, "work_cv")])      # no syscall when nobody is parked
        b.call(self.unlock, [mu])
        b.call(self.claim, [jobs, njobs, nparts, total, I64(0)])
        b.atomic_rmw("or", self.words["section"], I64(CLOSED), "seq_cst")   # every chunk is taken
        self.spin(b, self.get(b, "spin"),
                  lambda b: b.icmp_signed("==", self.get(b, "active", "acquire"), I64(0)))
        b.cbranch(b.icmp_signed("==", self.get(b, "active", "seq_cst"), I64(0)), blocks["done"], blocks["park"])

        b.position_at_end(blocks["park"])
        b.call(self.lock, [mu])
        self.put(b, "waiting", I64(1), "seq_cst")
        b.branch(blocks["park.check"])
        b.position_at_end(blocks["park.check"])
        parked_done = b.append_basic_block("park.done")
        b.cbranch(b.icmp_signed("==", self.get(b, "active", "seq_cst"), I64(0)), parked_done, blocks["park.wait"])
        b.position_at_end(blocks["park.wait"])
        b.call(self.wait, [self.ptr(b, "done_cv"), mu])
        b.branch(blocks["park.check"])
        b.position_at_end(parked_done)
        self.put(b, "waiting", I64(0), "seq_cst")
        b.call(self.unlock, [mu])
        b.branch(blocks["done"])

        b.position_at_end(blocks["done"])
        b.call(self.unlock, [entry_mu])
        b.ret_void()

    def build_spin_controls(self):
        """lc_pool_set_spin(polls): the spin budget of both waits.  lc_pool_spin(polls): one
        worker-style spin on a word that never moves (the runtime times it to calibrate).
        lc_pool_hush(): spinning workers park now; the next section clears it.
        lc_pool_wake(): parked workers wake and spin once more, as after a section, so that
        a section published within the spin finds them running (see the module docstring)."""
        setter = ir.Function(self.m, ir.FunctionType(VOID, [I64]), "lc_pool_set_spin")
        b = ir.IRBuilder(setter.append_basic_block("entry"))
        self.put(b, "spin", setter.args[0])
        b.ret_void()
        probe = ir.Function(self.m, ir.FunctionType(VOID, [I64]), "lc_pool_spin")
        b = ir.IRBuilder(probe.append_basic_block("entry"))
        self.spin(b, probe.args[0], self.section_moved(I64(0), "probe"))
        b.ret_void()
        hush = ir.Function(self.m, ir.FunctionType(VOID, []), "lc_pool_hush")
        b = ir.IRBuilder(hush.append_basic_block("entry"))
        self.put(b, "hush", I64(1))
        b.ret_void()
        wake = ir.Function(self.m, ir.FunctionType(VOID, []), "lc_pool_wake")
        b = ir.IRBuilder(wake.append_basic_block("entry"))
        mu = self.ptr(b, "mutex")
        b.call(self.lock, [mu])
        self.put(b, "wake", b.add(self.get(b, "wake"), I64(1)))
        b.call(self.broadcast, [self.ptr(b, "work_cv")])      # no syscall when nobody is parked
        b.call(self.unlock, [mu])
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
        for n in ("active", "waiting", "hush", "ready", "created"):
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
    """The pool module's IR text for this host (`pause` in spin loops only on x86)."""
    p = _Pool(jit.host_info()["triple"])
    p.build_chunks()
    p.build_worker()
    p.build_run()
    p.build_spin_controls()
    p.build_init_reset()
    p.build_start()
    return str(p.m)
