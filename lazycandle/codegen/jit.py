"""The JIT: LLVM IR text -> optimised module (new pass manager, O3, loop + SLP vectorisation,
host CPU) -> object code -> linked into one long-lived ORC LLJIT.  Objects are cached in
memory by IR text and, with LAZYCANDLE_CACHE_DIR, on disk, so a new process skips LLVM's
optimiser and code generator entirely.  Each disk entry carries the sha256 of its object bytes
and its full compile key; an entry that fails either check, cannot be read or does not link is
deleted, recompiled and rewritten (with one warning per process) — never loaded as is."""
from __future__ import annotations

import hashlib
import json
import os
import threading
import warnings

import llvmlite
import llvmlite.binding as llvm

from .. import caches, config

llvm.initialize_native_target()
llvm.initialize_native_asmprinter()

_lock = threading.RLock()
_state = {}


def _new_lock_after_fork():
    """A forked child has only the forking thread: a lock another thread held stays held."""
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_new_lock_after_fork)


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


def _code_bytes() -> int:
    return sum(len(cm._obj) + len(cm.ir_text) for cm in list(_mem_cache.values()))


_mem_cache: dict = caches.register("kernels", {}, _code_bytes)   # compile key -> CompiledModule
_counter = [0]

DISK_FORMAT = 2          # bump when the on-disk entry layout changes
_MAGIC = b"LCKOBJ\n"


def _compile_key(ir_text: str) -> dict:
    """Everything the object code depends on; stored in each disk entry and checked on load."""
    h = _host()
    return {"format": DISK_FORMAT, "ir_sha256": hashlib.sha256(ir_text.encode()).hexdigest(),
            "triple": h["triple"], "cpu": h["cpu"], "features": h["features"],
            "llvmlite": llvmlite.__version__}


def _cache_key(ir_text: str) -> str:
    return hashlib.sha256(json.dumps(_compile_key(ir_text), sort_keys=True).encode()).hexdigest()


def compile_ir(ir_text: str, export: list, name: str = "kernel") -> CompiledModule:
    """Compile IR text exporting the named functions.  Cached in memory and on disk; a disk
    entry that fails verification or linking is dropped and the kernel compiled afresh."""
    key = _cache_key(ir_text)
    cm = _mem_cache.get(key)
    if cm is not None:
        return cm
    with _lock:
        cm = _mem_cache.get(key)
        if cm is not None:
            return cm
        ckey = _compile_key(ir_text)
        obj = _disk_get(key, ckey)
        lib = None
        if obj is not None:
            try:
                lib = _link(obj, export, key)
                stats["disk_hits"] += 1
            except RuntimeError as e:
                _disk_drop(key, f"it does not link ({e})")
        if lib is None:
            obj = _host()["tm"].emit_object(_optimize(ir_text))
            lib = _link(obj, export, key)
            _disk_put(key, ckey, obj)
        cm = CompiledModule(name, ir_text, obj, lib)
        _mem_cache[key] = cm
        stats["compiled"] += 1
        return cm


def _link(obj: bytes, export: list, key: str):
    builder = llvm.JITLibraryBuilder().add_object_img(obj)
    for fn in export:
        builder.export_symbol(fn)
    _counter[0] += 1
    return builder.link(_host()["lljit"], f"lc_{_counter[0]}_{key[:12]}")


stats = {"compiled": 0, "disk_hits": 0, "disk_dropped": 0}
_warned = [False]


def _disk_path(key):
    d = config.cache_dir()
    return os.path.join(d, key[:2], key + ".o") if d else None


def _encode_entry(ckey: dict, obj: bytes) -> bytes:
    """A disk entry: magic line, one JSON header line (compile key, object sha256 and length),
    then the object bytes."""
    head = dict(ckey, obj_sha256=hashlib.sha256(obj).hexdigest(), obj_len=len(obj))
    return _MAGIC + json.dumps(head, sort_keys=True, separators=(",", ":")).encode() + b"\n" + obj


def _decode_entry(data: bytes, ckey: dict):
    """The object bytes of a disk entry, or a string saying why the entry is not usable."""
    if not data.startswith(_MAGIC):
        return "it has no lazycandle header"
    nl = data.find(b"\n", len(_MAGIC))
    if nl < 0:
        return "its header is cut off"
    try:
        head = json.loads(data[len(_MAGIC):nl])
    except ValueError:
        return "its header is unreadable"
    if not isinstance(head, dict):
        return "its header is unreadable"
    for field, want in ckey.items():
        if head.get(field) != want:
            return f"its compile key differs ({field})"
    obj = data[nl + 1:]
    if head.get("obj_len") != len(obj):
        return f"it holds {len(obj)} object bytes, its header says {head.get('obj_len')}"
    if head.get("obj_sha256") != hashlib.sha256(obj).hexdigest():
        return "its object bytes do not match their sha256"
    return obj


def _disk_get(key, ckey):
    p = _disk_path(key)
    if not p or not os.path.exists(p):
        return None
    try:
        with open(p, "rb") as f:
            data = f.read()
    except OSError as e:
        _disk_drop(key, f"it is unreadable ({e.strerror})")
        return None
    obj = _decode_entry(data, ckey)
    if isinstance(obj, str):
        _disk_drop(key, obj)
        return None
    return obj


def _disk_drop(key, why):
    """Delete a bad disk entry (it is rewritten after the recompile) and warn once per process."""
    p = _disk_path(key)
    stats["disk_dropped"] += 1
    try:
        os.remove(p)
    except OSError:
        pass
    if not _warned[0]:
        _warned[0] = True
        warnings.warn(f"lazycandle: dropped kernel cache entry {p}: {why}; recompiling it "
                      f"(further bad entries in this process are replaced without a warning)",
                      RuntimeWarning, stacklevel=2)


def _disk_put(key, ckey, obj):
    p = _disk_path(key)
    if not p:
        return
    tmp = p + f".{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(_encode_entry(ckey, obj))
        os.replace(tmp, p)
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass


class KernelCache:
    """Compiled kernels by spec: `build(spec) -> (ir_text, function name)` runs once per spec;
    calling the cache returns the function wrapped as the ctypes type `fntype` (its module is
    kept alive on the wrapper as `_module`).  Each instance is in the cache registry."""

    def __init__(self, build, fntype):
        self.build, self.fntype = build, fntype
        self._fns: dict = {}
        self._lock = threading.Lock()
        caches.register(f"kernel functions of {build.__module__}", self)

    def clear(self) -> None:
        with self._lock:
            self._fns.clear()

    def __len__(self):
        return len(self._fns)

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
