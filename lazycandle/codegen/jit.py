"""The JIT: LLVM IR text -> optimised module (new pass manager, O3, loop + SLP vectorisation,
host CPU) -> object code -> linked into one long-lived ORC LLJIT.  Objects are cached in
memory by IR text and, with LAZYCANDLE_CACHE_DIR, on disk, so a new process skips LLVM's
optimiser and code generator entirely."""
from __future__ import annotations

import hashlib
import os
import threading

import llvmlite
import llvmlite.binding as llvm

from .. import config

llvm.initialize_native_target()
llvm.initialize_native_asmprinter()

_lock = threading.RLock()
_state = {}


def _host():
    """Target machine, triple, data layout and LLJIT, created once per process."""
    if not _state:
        target = llvm.Target.from_triple(llvm.get_process_triple())
        cpu = llvm.get_host_cpu_name()
        features = llvm.get_host_cpu_features().flatten()
        if "+avx512f" in features:
            features += ",-prefer-256-bit"   # explicit 512-bit vectors are our choice on AVX-512
        tm = target.create_target_machine(cpu=cpu, features=features, opt=3, codemodel="jitdefault", jit=True)
        _state.update(target=target, cpu=cpu, features=features, tm=tm, triple=tm.triple,
                      data_layout=str(tm.target_data), lljit=llvm.create_lljit_compiler(tm))
    return _state


def host_info() -> dict:
    h = _host()
    return {"cpu": h["cpu"], "triple": h["triple"], "features": h["features"]}


def has_feature(name: str) -> bool:
    return f"+{name}" in _host()["features"].split(",")


def vector_bits() -> int:
    """Widest vector register we emit explicit vector code for (asked per kernel spec, so
    computed once)."""
    bits = _state.get("vector_bits")
    if bits is None:
        bits = 512 if has_feature("avx512f") else 256 if has_feature("avx2") or has_feature("avx") else 128
        _state["vector_bits"] = bits
    return bits


def triple_and_layout():
    h = _host()
    return h["triple"], h["data_layout"]


class CompiledModule:
    """Native code for one LLVM module; `address(name)` gives a callable function address."""

    def __init__(self, name, ir_text, obj, lib):
        self.name, self.ir_text, self._obj, self._lib = name, ir_text, obj, lib
        self._opt_text = None

    def address(self, fn_name: str) -> int:
        return self._lib[fn_name]

    def optimized_ir(self) -> str:
        if self._opt_text is None:
            with _lock:
                self._opt_text = str(_optimize(self.ir_text))
        return self._opt_text

    def asm(self) -> str:
        with _lock:
            return _host()["tm"].emit_assembly(_optimize(self.ir_text))


def _optimize(ir_text: str):
    h = _host()
    mod = llvm.parse_assembly(ir_text)
    mod.verify()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(h["tm"], pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


_mem_cache: dict = {}
_counter = [0]


def _cache_key(ir_text: str) -> str:
    h = _host()
    blob = "\0".join([ir_text, h["triple"], h["cpu"], h["features"], llvmlite.__version__, "v1"])
    return hashlib.sha256(blob.encode()).hexdigest()


def compile_ir(ir_text: str, export: list, name: str = "kernel") -> CompiledModule:
    """Compile IR text exporting the named functions.  Cached in memory and on disk."""
    key = _cache_key(ir_text)
    cm = _mem_cache.get(key)
    if cm is not None:
        return cm
    with _lock:
        cm = _mem_cache.get(key)
        if cm is not None:
            return cm
        obj = _disk_get(key)
        if obj is None:
            mod = _optimize(ir_text)
            obj = _host()["tm"].emit_object(mod)
            _disk_put(key, obj)
        builder = llvm.JITLibraryBuilder().add_object_img(obj)
        for fn in export:
            builder.export_symbol(fn)
        _counter[0] += 1
        lib = builder.link(_host()["lljit"], f"lc_{_counter[0]}_{key[:12]}")
        cm = CompiledModule(name, ir_text, obj, lib)
        _mem_cache[key] = cm
        stats["compiled"] += 1
        return cm


stats = {"compiled": 0, "disk_hits": 0}


def _disk_path(key):
    d = config.cache_dir()
    return os.path.join(d, key[:2], key + ".o") if d else None


def _disk_get(key):
    p = _disk_path(key)
    if p and os.path.exists(p):
        try:
            with open(p, "rb") as f:
                data = f.read()
            stats["disk_hits"] += 1
            return data
        except OSError:
            return None
    return None


def _disk_put(key, obj):
    p = _disk_path(key)
    if not p:
        return
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        tmp = p + f".{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(obj)
        os.replace(tmp, p)
    except OSError:
        pass


class KernelCache:
    """Compiled kernels by spec: `build(spec) -> (ir_text, function name)` runs once per spec;
    calling the cache returns the function wrapped as the ctypes type `fntype` (its module is
    kept alive on the wrapper as `_module`)."""

    def __init__(self, build, fntype):
        self.build, self.fntype = build, fntype
        self._fns: dict = {}
        self._lock = threading.Lock()

    def __call__(self, spec):
        fn = self._fns.get(spec)
        if fn is None:
            with self._lock:
                fn = self._fns.get(spec)
                if fn is None:
                    text, name = self.build(spec)
                    cm = compile_ir(text, [name], name=name)
                    fn = self.fntype(cm.address(name))
                    fn._module = cm
                    self._fns[spec] = fn
        return fn
