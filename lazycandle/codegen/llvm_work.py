"""LLVM's optimiser and code generator on any thread, several at once: IR text -> object bytes.

llvmlite wraps every call into LLVM in one process-wide lock (ffi.lib), so its own
`ModulePassManager.run` and `TargetMachine.emit_object` never overlap on two threads (measured:
0.00 s of overlap for GPT-2's 31 kernels on 2 threads).  LLVM itself is thread safe when each
thread has its own LLVMContext and TargetMachine, so each compiling thread gets its own pair
here, and the two long calls (the new pass manager's run, the emit to memory) go through the
same C entry points of libllvmlite without that lock; every short call (parse, verify, pass
builder, buffers) stays on llvmlite's locked API.  The object bytes are the same as llvmlite's
own calls give (tests/test_parallel_compile.py).  The first compile of a process runs fully
locked (one-time initialisation inside LLVM happens on one thread), and when the library does
not expose its entry points as expected, every compile does (correct, just serial)."""
from __future__ import annotations

import ctypes
import os
import threading

_tls = threading.local()          # .ctx, .tm: this thread's LLVMContext and TargetMachine
_first = threading.Lock()
_ready = threading.Event()        # set once the process's first compile is done
_raw: dict = {}                   # the unlocked C entry points (empty: not available)
_raw_lock = threading.Lock()


def _after_fork():
    global _first, _raw_lock
    _first, _raw_lock = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def _entry_points(llvm) -> dict:
    """{name: ctypes function} of the two long calls, without llvmlite's lock; {} when the
    library does not expose them as llvmlite 0.4x-0.5x does."""
    if not _raw:
        with _raw_lock:
            if not _raw:
                try:
                    from llvmlite.binding import ffi
                    lib = ctypes.CDLL(ffi.lib._name)
                    for name in ("LLVMPY_RunNewModulePassManager", "LLVMPY_TargetMachineEmitToMemory"):
                        locked = getattr(ffi.lib, name)
                        fn = getattr(lib, name)
                        fn.argtypes, fn.restype = locked.argtypes, locked.restype
                        _raw[name] = fn
                except (AttributeError, OSError, ImportError):
                    _raw.clear()
                    _raw["none"] = None
    return {} if "none" in _raw else _raw


def _thread_state(h):
    """This thread's (context, target machine), made like the host's (jit._create_host)."""
    st = getattr(_tls, "state", None)
    if st is None:
        llvm = h["llvm"]
        tm = h["target"].create_target_machine(cpu=h["cpu"], features=h["features"], opt=3,
                                               codemodel="jitdefault", jit=True)
        st = _tls.state = (llvm.create_context(), tm)
    return st


def object_code(h, ir_text: str, optimize: bool = True) -> bytes:
    """Object code of `ir_text` (optimised at O3 with loop and SLP vectorisation unless
    `optimize` is False) for host `h` (jit._host()), on the calling thread."""
    llvm = h["llvm"]
    ctx, tm = _thread_state(h)
    mod = llvm.parse_assembly(ir_text, context=ctx)
    mod.verify()
    if not _ready.is_set():
        with _first:
            if not _ready.is_set():
                obj = _compile(llvm, tm, mod, optimize, {})
                _ready.set()
                return obj
    return _compile(llvm, tm, mod, optimize, _entry_points(llvm))


def _compile(llvm, tm, mod, optimize: bool, raw: dict) -> bytes:
    """Optimise and emit `mod`; through `raw`'s unlocked entry points when given."""
    if optimize:
        pto = llvm.create_pipeline_tuning_options(speed_level=3)
        pto.loop_vectorization = True
        pto.slp_vectorization = True
        pb = llvm.create_pass_builder(tm, pto)
        mpm = pb.getModulePassManager()
        if raw:
            raw["LLVMPY_RunNewModulePassManager"](mpm, mod, pb)
        else:
            mpm.run(mod, pb)
    if not raw:
        return tm.emit_object(mod)
    from llvmlite.binding import ffi
    with ffi.OutputString() as err:
        buf = raw["LLVMPY_TargetMachineEmitToMemory"](tm, mod, 1, err)
        if not buf:
            raise RuntimeError(str(err))
    try:
        return ctypes.string_at(ffi.lib.LLVMPY_GetBufferStart(buf), ffi.lib.LLVMPY_GetBufferSize(buf))
    finally:
        ffi.lib.LLVMPY_DisposeMemoryBuffer(buf)
