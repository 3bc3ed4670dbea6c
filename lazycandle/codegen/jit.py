"""The JIT: LLVM IR text -> optimised module (new pass manager, O3, loop + SLP vectorisation,
host CPU) -> object code -> linked into one long-lived ORC LLJIT.  Objects are cached in
memory by IR text and in the disk cache (lazycandle/diskcache.py, on by default), so a new
process skips LLVM's optimiser and code generator entirely.  Kernels of a KernelCache are also
found by their spec, so a warm process does not even build their IR.  Every disk key holds the
code generator's source hash and the host (triple, CPU, features, LLVM and llvmlite versions):
another CPU or version never loads these objects.  An entry that fails its checks or does not
link is deleted, recompiled and rewritten (one warning per process) -- never loaded as is.
llvmlite.binding is loaded on the first compile, not at import.  A compile streak that passes
a second says what it is compiling on stderr (codegen/progress.py).

Kernels compile on any thread, several at once: no lock is held while a kernel's IR is built,
optimised and emitted (codegen/llvm_work.py runs LLVM without llvmlite's global lock), one
thread per key does the work while others asking for it wait (`_once`), and only linking into
the LLJIT and the caches' updates are serialised.  `prefetch` (codegen/compile_pool.py) starts
the kernels of a new plan on the compile threads while the plan is still being built."""
from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import threading

import llvmlite

from .. import caches, config, diskcache
from . import llvm_work, progress

_lock = threading.RLock()
_state = {}

caches.renew_lock_after_fork(sys.modules[__name__], "_lock", threading.RLock)


def _host():
    """llvmlite.binding (imported here: loading it is a third of `import lazycandle`), the
    target machine, triple, data layout and LLJIT, created once per process."""
    if not _state:
        with _lock:
            if not _state:
                _state.update(_create_host())
    return _state


def _create_host() -> dict:
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    cpu = llvm.get_host_cpu_name()
    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features:
        features += ",-prefer-256-bit"   # explicit 512-bit vectors are our choice on AVX-512
    tm = target.create_target_machine(cpu=cpu, features=features, opt=3, codemodel="jitdefault", jit=True)
    return dict(llvm=llvm, target=target, cpu=cpu, features=features, tm=tm, triple=tm.triple,
                data_layout=str(tm.target_data), lljit=llvm.create_lljit_compiler(tm),
                llvm_version=".".join(map(str, llvm.llvm_version_info)))


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


_cache_sizes: dict = {}


def cache_bytes() -> dict:
    """{1: L1 data, 2: L2, 3: L3} bytes of cpu0 from sysfs, or typical sizes where it says
    nothing (non-Linux, containers that hide it); read once."""
    if _cache_sizes:
        return dict(_cache_sizes)
    got = {1: 32 << 10, 2: 512 << 10, 3: 8 << 20}
    for idx in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*"):
        try:
            with open(os.path.join(idx, "level")) as f:
                level = int(f.read())
            with open(os.path.join(idx, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(idx, "size")) as f:
                text = f.read().strip().upper()
            size = int(text.rstrip("KMG")) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        except (OSError, ValueError):
            continue
        if kind != "Instruction" and level in got and size > 0:
            got[level] = size
    _cache_sizes.update(got)
    return dict(got)


def triple_and_layout():
    h = _host()
    return h["triple"], h["data_layout"]


class CompiledModule:
    """Native code for one LLVM module; `address(name)` gives a callable function address.
    `ir_text` may be given as a function building it: a module loaded from the disk cache by
    its spec builds its IR only if a dump asks for it."""

    def __init__(self, name, ir_text, obj, lib):
        self.name, self._ir_text, self._obj, self._lib = name, ir_text, obj, lib
        self._opt_text = None

    @property
    def ir_text(self) -> str:
        if callable(self._ir_text):
            self._ir_text = self._ir_text()
        return self._ir_text

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


def _parse(ir_text: str):
    mod = _host()["llvm"].parse_assembly(ir_text)
    mod.verify()
    return mod


def _optimize(ir_text: str):
    h = _host()
    llvm = h["llvm"]
    mod = _parse(ir_text)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(h["tm"], pto)
    pb.getModulePassManager().run(mod, pb)
    return mod


class _Kernels:
    """The in-memory compile caches: modules by IR-text key and by kernel-spec key (one module
    may be in both); counted and cleared together as the registry's "kernels"."""

    def __init__(self):
        self.by_ir: dict = {}
        self.by_spec: dict = {}

    def modules(self) -> list:
        both = list(self.by_ir.values()) + list(self.by_spec.values())
        return list({id(cm): cm for cm in both}.values())

    def nbytes(self) -> int:
        return sum(len(cm._obj) + (len(cm._ir_text) if isinstance(cm._ir_text, str) else 0)
                   for cm in self.modules())

    def clear(self) -> None:
        self.by_ir.clear()
        self.by_spec.clear()

    def __len__(self):
        return len(self.modules())


_kernels = caches.register("kernels", _Kernels(), lambda: _kernels.nbytes())
_mem_cache = _kernels.by_ir          # IR compile key -> CompiledModule
_counter = [0]

DISK_FORMAT = 3          # bump when the on-disk entry layout changes


def _host_key() -> dict:
    h = _host()
    return {"triple": h["triple"], "cpu": h["cpu"], "features": h["features"],
            "llvm": h["llvm_version"], "llvmlite": llvmlite.__version__}


def _compile_key(ir_text: str) -> dict:
    """Everything the object code of an IR text depends on (the optimiser's settings are in
    the code generator's stamp); stored in each disk entry and checked on load."""
    return dict(_host_key(), format=DISK_FORMAT, codegen=_codegen_stamp(),
                ir_sha256=hashlib.sha256(ir_text.encode()).hexdigest())


def _spec_compile_key(spec_key: str) -> dict:
    """Everything the object code of a kernel spec depends on: the spec, the source of the code
    generator that turns it into IR, and the host."""
    return dict(_host_key(), format=DISK_FORMAT, codegen=_codegen_stamp(),
                spec_sha256=hashlib.sha256(spec_key.encode()).hexdigest())


def _disk_key(ckey: dict) -> str:
    return hashlib.sha256(json.dumps(ckey, sort_keys=True).encode()).hexdigest()


def remembered_choice(kind: str, ident: dict):
    """A measured choice (a short string) stored on disk by `remember_choice` for the same kind,
    identity (the caller's bucket, library versions ...), host and code generator; None when
    there is none (or no disk cache).  So a new process does not time its matmul backends again."""
    ckey = _choice_key(kind, ident)
    got = diskcache.read(_disk_key(ckey), ckey) if config.cache_dir() else None
    if got is None:
        return None
    try:
        return got[0].decode("ascii")
    except UnicodeDecodeError:
        return None


def remember_choice(kind: str, ident: dict, value: str) -> None:
    if config.cache_dir():
        ckey = _choice_key(kind, ident)
        diskcache.write(_disk_key(ckey), ckey, value.encode("ascii"))


def _choice_key(kind: str, ident: dict) -> dict:
    return dict(_host_key(), format=DISK_FORMAT, codegen=_codegen_stamp(), choice=kind,
                ident=json.dumps(ident, sort_keys=True, default=repr))


_stamp: list = []


def _codegen_stamp() -> str:
    """sha256 of the sources generated IR depends on (codegen/, ir/, dtypes, layouts), so a
    spec-keyed disk entry is never loaded after the code generator changed."""
    if not _stamp:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        files = [os.path.join(sub, f) for sub in ("codegen", "ir")
                 for f in sorted(os.listdir(os.path.join(root, sub))) if f.endswith(".py")]
        h = hashlib.sha256()
        for f in files + ["dtype.py", "layout.py"]:
            with open(os.path.join(root, f), "rb") as fh:
                h.update(f.encode() + b"\0" + fh.read() + b"\0")
        _stamp.append(h.hexdigest())
    return _stamp[0]


def compile_ir(ir_text: str, export: list, name: str = "kernel") -> CompiledModule:
    """Compile IR text exporting the named functions.  Cached in memory and on disk; a disk
    entry that fails verification or linking is dropped and the kernel compiled afresh."""
    ckey = _compile_key(ir_text)
    key = _disk_key(ckey)
    cm = _mem_cache.get(key)
    if cm is None:
        cm = _once(key, lambda: _mem_cache.get(key) or _keep(_mem_cache, key, _load_or_compile(
            key, ckey, lambda: (ir_text, list(export)), name, name)))
    return cm


def compile_spec(kind: str, spec, build):
    """(module, exported function name) for kernel `spec` of code generator `kind` (a value
    whose repr fully describes the kernel), found in memory and on disk by the spec itself, so
    a hit never builds the IR: building it is most of what a warm new process would otherwise
    spend on its first realize.  `build() -> (ir_text, function name)` or `(ir_text, function
    name, more exported names)` runs on a miss (or when a dump asks for the IR)."""
    spec_key = f"{kind}:{spec!r}"
    cm = _kernels.by_spec.get(spec_key)
    if cm is None:
        cm = _once(spec_key, lambda: _kernels.by_spec.get(spec_key) or
                   _keep(_kernels.by_spec, spec_key, _compile_spec(kind, spec, spec_key, build)))
    return cm, cm.name


def _compile_spec(kind: str, spec, spec_key: str, build) -> CompiledModule:
    what = _describe(kind, spec)
    if not config.cache_dir() or " at 0x" in spec_key:   # no disk, or no stable key
        with progress.compiling(what):
            text, export = _exports(build())
            return compile_ir(text, export, name=export[0])
    ckey = _spec_compile_key(spec_key)
    return _load_or_compile(_disk_key(ckey), ckey, lambda: _exports(build()), None, what)


class _Pending:
    """A compile under way on some thread: its result or error once `done` is set."""
    __slots__ = ("done", "value", "error")

    def __init__(self):
        self.done, self.value, self.error = threading.Event(), None, None


_inflight: dict = {}


def _once(key, make):
    """make() on the first thread to ask for `key`; a thread asking while it runs waits for its
    result (or its error).  Holds no lock while make() runs, so other keys compile meanwhile."""
    with _lock:
        pending = _inflight.get(key)
        mine = pending is None
        if mine:
            pending = _inflight[key] = _Pending()
    if not mine:
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.value
    try:
        pending.value = make()
    except BaseException as e:
        pending.error = e
        raise
    finally:
        with _lock:
            del _inflight[key]
        pending.done.set()
    return pending.value


def _keep(table: dict, key, cm):
    with _lock:
        return table.setdefault(key, cm)


def _after_fork():
    """A forked child has none of the threads whose compiles _inflight waits for."""
    _inflight.clear()


os.register_at_fork(after_in_child=_after_fork)


def _exports(built):
    """(ir_text, [function name, more exported names ...]) of a spec build's result."""
    text, name, *more = built
    return text, [name] + list(more[0] if more else ())


def _describe(kind: str, spec) -> str:
    """What a kernel is, in a few words, for the progress line of a long compile."""
    describe = getattr(spec, "describe", None)
    text = describe() if callable(describe) else f"{kind.rsplit('.', 1)[-1]} kernel"
    return text if len(text) <= 100 else text[:97] + "..."


def _load_or_compile(key, ckey, build, name, what) -> CompiledModule:
    """The module under disk key `key` (its entry verified against `ckey`), else
    `build() -> (ir_text, exported names)` optimised, compiled, linked and written to disk.
    `name` defaults to the first exported name; `what` names the kernel for the progress
    line.  Runs on any thread, without _lock (only the link takes it)."""
    got = diskcache.read(key, ckey)
    export = got[1].get("export") if got is not None else None
    if not (isinstance(export, list) and export and all(isinstance(n, str) for n in export)):
        if got is not None:
            diskcache.drop(key, "its header names no exported function")
    else:
        try:
            lib = _link(got[0], export, key)
        except RuntimeError as e:
            diskcache.drop(key, f"it does not link ({e})")
        else:
            _count("disk_hits", "compiled")
            return CompiledModule(name or export[0], lambda: build()[0], got[0], lib)
    with progress.compiling(what):
        ir_text, export = build()
        same = _mem_cache.get(_disk_key(_compile_key(ir_text))) if "spec_sha256" in ckey else None
        obj = same._obj if same is not None else llvm_work.object_code(_host(), ir_text)
    cm = CompiledModule(name or export[0], ir_text, obj, _link(obj, export, key))
    diskcache.write(key, dict(ckey, export=export), obj)
    if same is None and "spec_sha256" in ckey:
        _keep(_mem_cache, _disk_key(_compile_key(ir_text)), cm)   # another spec may build this IR
    _count("compiled")
    return cm


def _count(*names) -> None:
    with _lock:
        for n in names:
            stats[n] += 1


def _link(obj: bytes, export: list, key: str):
    builder = _host()["llvm"].JITLibraryBuilder().add_object_img(obj)
    for fn in export:
        builder.export_symbol(fn)
    with _lock:
        _counter[0] += 1
        return builder.link(_host()["lljit"], f"lc_{_counter[0]}_{key[:12]}")


def link_ir(ir_text: str, export: list, imports: dict | None = None, process: bool = False,
            optimize: bool = True):
    """Compile glue IR (the worker pool, whole-program modules) whose external functions are
    bound at link time: `imports` maps a declared name to an address (a kernel already
    compiled), `process` resolves the rest from the running process (libc, pthread).  The
    object code holds no address (they are bound at link), so it is cached by IR text in
    memory and on disk (not counted as a kernel compile in `stats`); the link is fresh per
    call, since the addresses are.  `optimize=False` skips the IR optimiser (for glue that is
    already what it should be)."""
    ckey = dict(_compile_key(ir_text), glue=True, optimize=bool(optimize))
    key = _disk_key(ckey)
    obj = _objects.get(key)
    if obj is None:
        obj = _once(key, lambda: _glue_object(key, ckey, ir_text, optimize))
    builder = _host()["llvm"].JITLibraryBuilder().add_object_img(obj)
    if process:
        builder.add_current_process()
    for name, addr in (imports or {}).items():
        builder.import_symbol(name, addr)
    for fn in export:
        builder.export_symbol(fn)
    with _lock:
        _counter[0] += 1
        lib = builder.link(_host()["lljit"], f"lc_{_counter[0]}_{key[:12]}")
    return CompiledModule(export[0], ir_text, obj, lib)


def _glue_object(key, ckey, ir_text: str, optimize: bool) -> bytes:
    """The object of glue IR: from memory, the disk cache, or LLVM (then stored in both)."""
    obj = _objects.get(key)
    if obj is None:
        got = diskcache.read(key, ckey) if config.cache_dir() else None
        if got is not None:
            obj = got[0]
            _count("glue_disk_hits")
        else:
            obj = llvm_work.object_code(_host(), ir_text, optimize)
            _count("glue_compiled")
            if config.cache_dir():
                diskcache.write(key, ckey, obj)
        with _lock:
            _objects.put(key, obj)
    return obj


_objects = caches.register("glue objects", caches.LRU(256))


stats = diskcache.stats          # one counter dict: compiles here, disk traffic there
stats.update(compiled=0, glue_compiled=0, glue_disk_hits=0)


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
            cm, name = compile_spec(self.build.__module__, spec, lambda: self.build(spec))
            with self._lock:
                fn = self._fns.get(spec)
                if fn is None:
                    fn = self.fntype(cm.address(name))
                    fn._module = cm
                    self._fns[spec] = fn
        return fn

    def ready(self, spec) -> bool:
        """Whether `spec`'s function is compiled (a dict lookup: prefetch's filter)."""
        return spec in self._fns

    def on_disk(self, spec) -> bool:
        """Whether `spec`'s object is in the disk cache (loading it takes ~1 ms: no need to
        do it ahead on another thread)."""
        return on_disk(self.build.__module__, spec)


def on_disk(kind: str, spec) -> bool:
    """Whether the disk cache holds an entry for kernel `spec` of `kind` (not verified)."""
    if not config.cache_dir():
        return False
    spec_key = f"{kind}:{spec!r}"
    if spec_key in _kernels.by_spec or " at 0x" in spec_key:
        return spec_key in _kernels.by_spec
    p = diskcache.path(_disk_key(_spec_compile_key(spec_key)))
    return p is not None and os.path.exists(p)
