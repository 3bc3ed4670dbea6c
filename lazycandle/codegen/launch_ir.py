"""LLVM IR of the eager launcher: one CPython builtin (METH_FASTCALL) that fills a native
program's input and output pointers from the arrays of an eager call, packs its scalars and
makes its one native call (runtime/launch.py wraps it; runtime/native_exec.py calls it).

Why: an eager `x.sum(0).numpy()` usually runs on caches the previous kernel streamed out,
where each Python-level step costs misses.  Reading each array's data pointer through ctypes,
a ctypes store per pointer, the program lock and the ctypes call are one builtin call here:
25-45 us less per cold eager call (python -m bench.eager_launch).

    lc_launch(desc, args = (nthreads, out, in_bufs, offsets, lock, scalars)) -> int

`desc` (the function's `self`) is an int64 ndarray, the launch descriptor: DESC_* words, then
per feed FEED_WORDS words (pointer position, index into in_bufs, index into offsets, item
size), per output pointer OUT_WORDS words (pointer position, byte offset from `out`'s data),
per scalar slot its packing (SCALAR_F64 / SCALAR_I64 / SCALAR_U64) and then the slots
themselves, where each call packs `scalars` ((value, dtype) pairs) and from where the program
reads them.  Returns the segment's status (0: done; k > 0: call k - 1 reported a bad index)
or DECLINED, having called nothing, when an argument is not what the descriptor expects (not
an exact ndarray, list, tuple or lock, an index out of range, a value its slot does not take
as the Python path's struct packing would) or `lock`, the program's threading.Lock, is held: a
Python path holding it may be running the program with the GIL released.  The launcher keeps
the GIL while the program runs, so no Python thread can take the lock or fill the pointers
meanwhile (the native threads need no GIL)."""
from __future__ import annotations

import llvmlite.ir as ir

from .llvmutil import F64, I8, I64, VOID
from .loops import counted_loop, new_module

DECLINED = -1
DESC_FN, DESC_PTRS, DESC_SIZES, DESC_STATUS, DESC_STATUS_WORDS, DESC_NDARRAY, DESC_LIST, DESC_TUPLE, \
    DESC_LOCK, DESC_NFEED, DESC_NOUT, DESC_NSCALAR = range(12)
DESC_WORDS = 12
FEED_WORDS = 4
OUT_WORDS = 2
SCALAR_F64, SCALAR_I64, SCALAR_U64 = range(3)
NARGS = 6
EXPORT = "lc_launch"

_P = I8.as_pointer()
_API = {    # the C API the launcher calls: name -> (return type, argument types)
    "PyLong_FromLongLong": (_P, [I64]),
    "PyLong_AsSsize_t": (I64, [_P]),
    "PyLong_AsLongLong": (I64, [_P]),
    "PyLong_AsUnsignedLongLong": (I64, [_P]),
    "PyFloat_AsDouble": (F64, [_P]),
    "PyErr_Occurred": (_P, []),
    "PyErr_Clear": (VOID, []),
    "PyList_GetItem": (_P, [_P, I64]),
    "PyTuple_GetItem": (_P, [_P, I64]),
}
C_API = tuple(_API)


class _Launcher:
    """The function being built: its blocks, the descriptor and the checks that decline."""

    def __init__(self, data_at: int, type_at: int):
        self.m = m = new_module("lc_launch")
        self.api = {name: ir.Function(m, ir.FunctionType(ret, args), name) for name, (ret, args) in _API.items()}
        self.fn = fn = ir.Function(m, ir.FunctionType(_P, [_P, _P.as_pointer(), I64]), EXPORT)
        self.b = ir.IRBuilder(fn.append_basic_block("entry"))
        self.decline = fn.append_basic_block("decline")
        self.error = fn.append_basic_block("error")
        self.data_at, self.type_at = data_at, type_at
        self.desc = self.b.inttoptr(self.word_at(fn.args[0], data_at), I64.as_pointer())

    def word_at(self, obj, offset):
        """The i64 at byte `offset` of object `obj`."""
        b = self.b
        return b.load(b.bitcast(b.gep(obj, [I64(offset)]), I64.as_pointer()))

    def d(self, i):
        """Descriptor word i (an int or an i64 value)."""
        return self.b.load(self.b.gep(self.desc, [i if isinstance(i, ir.Value) else I64(i)]))

    def arg(self, i):
        return self.b.load(self.b.gep(self.fn.args[1], [I64(i)]))

    def _then(self, bad, where):
        nxt = self.fn.append_basic_block("ok")
        self.b.cbranch(bad, where, nxt)
        self.b.position_at_end(nxt)

    def check(self, ok):
        """Go on when `ok`, else decline."""
        self._then(self.b.not_(ok), self.decline)

    def is_type(self, obj, word):
        return self.b.icmp_unsigned("==", self.word_at(obj, self.type_at), self.d(word))

    def call(self, name, *args):
        return self.b.call(self.api[name], list(args))

    def failed(self, value, sentinel):
        """Decline (clearing the error) when a C API conversion returned `sentinel` with an
        error set."""
        b = self.b
        cmp = b.fcmp_ordered("==", value, sentinel) if value.type == F64 else b.icmp_signed("==", value, sentinel)
        self._then(b.and_(cmp, b.icmp_unsigned("!=", self.call("PyErr_Occurred"), ir.Constant(_P, None))),
                   self.error)

    def item(self, api, seq, i):
        """Borrowed seq[i] (PyList_GetItem / PyTuple_GetItem); an index out of range declines."""
        v = self.call(api, seq, i)
        self._then(self.b.icmp_unsigned("==", v, ir.Constant(_P, None)), self.error)
        return v

    def as_int(self, obj):
        v = self.call("PyLong_AsSsize_t", obj)
        self.failed(v, I64(-1))
        return v


def build(data_at: int, type_at: int, locked_at: int) -> str:
    """The launcher's IR text: `data_at`, `type_at` and `locked_at` are the byte offsets of an
    ndarray's data pointer, of an object's type pointer and of a threading.Lock's held flag (a
    byte) in this process's NumPy and CPython."""
    L = _Launcher(data_at, type_at)
    b, d = L.b, L.d
    L.check(b.icmp_signed("==", L.fn.args[2], I64(NARGS)))
    out, in_bufs, offsets, lock, scalars = (L.arg(i) for i in range(1, NARGS))
    L.check(L.is_type(lock, DESC_LOCK))
    L.check(b.icmp_unsigned("==", b.load(b.gep(lock, [I64(locked_at)])), I8(0)))
    L.check(L.is_type(out, DESC_NDARRAY))
    L.check(b.and_(L.is_type(in_bufs, DESC_LIST), L.is_type(offsets, DESC_LIST)))
    nthreads = L.as_int(L.arg(0))
    L.check(b.icmp_signed(">", nthreads, I64(0)))
    ptrs = b.inttoptr(d(DESC_PTRS), I64.as_pointer())
    nfeed, nout, nscalar = d(DESC_NFEED), d(DESC_NOUT), d(DESC_NSCALAR)
    with counted_loop(b, I64(0), nfeed, 1, "feed") as f:
        at = b.add(I64(DESC_WORDS), b.mul(f, I64(FEED_WORDS)))
        buf = L.item("PyList_GetItem", in_bufs, d(b.add(at, I64(1))))
        L.check(L.is_type(buf, DESC_NDARRAY))
        off = L.as_int(L.item("PyList_GetItem", offsets, d(b.add(at, I64(2)))))
        b.store(b.add(L.word_at(buf, data_at), b.mul(off, d(b.add(at, I64(3))))), b.gep(ptrs, [d(at)]))
    codes_at = _pack_scalars(L, scalars, nfeed, nout, nscalar)
    base = L.word_at(out, data_at)
    out_at = b.add(I64(DESC_WORDS), b.mul(nfeed, I64(FEED_WORDS)))
    with counted_loop(b, I64(0), nout, 1, "out") as g:
        at = b.add(out_at, b.mul(g, I64(OUT_WORDS)))
        b.store(b.add(base, d(b.add(at, I64(1)))), b.gep(ptrs, [d(at)]))
    status = b.inttoptr(d(DESC_STATUS), I64.as_pointer())
    with counted_loop(b, I64(0), d(DESC_STATUS_WORDS), 1, "status") as s:
        b.store(I64(0), b.gep(status, [s]))
    seg_t = ir.FunctionType(I64, [I64.as_pointer()] * 3 + [I64])
    slots = b.gep(L.desc, [b.add(codes_at, nscalar)])
    rc = b.call(b.inttoptr(d(DESC_FN), seg_t.as_pointer()),
                [ptrs, b.inttoptr(d(DESC_SIZES), I64.as_pointer()), slots, nthreads])
    b.ret(L.call("PyLong_FromLongLong", rc))

    b.position_at_end(L.error)              # a conversion or index error: cleared, then declined
    L.call("PyErr_Clear")
    b.branch(L.decline)
    b.position_at_end(L.decline)
    b.ret(L.call("PyLong_FromLongLong", I64(DECLINED)))
    return str(L.m)


def _pack_scalars(L: _Launcher, scalars, nfeed, nout, nscalar):
    """Each scalars[k][0] converted by its slot's packing into the descriptor's slot k, as
    struct packs it on the Python path ('d', 'q', 'Q'); returns where the packings start."""
    b, d = L.b, L.d
    codes_at = b.add(I64(DESC_WORDS), b.add(b.mul(nfeed, I64(FEED_WORDS)), b.mul(nout, I64(OUT_WORDS))))
    with b.if_then(b.icmp_signed(">", nscalar, I64(0))):
        L.check(L.is_type(scalars, DESC_LIST))
        with counted_loop(b, I64(0), nscalar, 1, "scalar") as k:
            pair = L.item("PyList_GetItem", scalars, k)
            L.check(L.is_type(pair, DESC_TUPLE))
            value = L.item("PyTuple_GetItem", pair, I64(0))
            code = d(b.add(codes_at, k))
            slot = b.gep(L.desc, [b.add(b.add(codes_at, nscalar), k)])
            done = L.fn.append_basic_block("packed")
            cases = {c: L.fn.append_basic_block(f"pack{c}") for c in (SCALAR_F64, SCALAR_I64, SCALAR_U64)}
            sw = b.switch(code, L.decline)
            for c, block in cases.items():
                sw.add_case(I64(c), block)
                b.position_at_end(block)
                if c == SCALAR_F64:
                    v = L.call("PyFloat_AsDouble", value)
                    L.failed(v, ir.Constant(F64, -1.0))
                    v = b.bitcast(v, I64)
                else:
                    v = L.call("PyLong_AsLongLong" if c == SCALAR_I64 else "PyLong_AsUnsignedLongLong", value)
                    L.failed(v, I64(-1))
                b.store(v, slot)
                b.branch(done)
            b.position_at_end(done)
    return codes_at
