"""The on-disk kernel cache (SPEC "Caches"): one file per compiled object under
`config.cache_dir()`, on by default.

* An entry is a magic line, one JSON header line (the caller's compile key plus the object's
  sha256 and length) and the object bytes.  `read` checks all of it against the key the caller
  wants; an entry that fails is deleted (the caller recompiles and rewrites it), never loaded.
* Writes go to a temp file and `os.replace`, so concurrent processes never see a torn entry
  (two writing the same key both leave a whole, equal entry).
* Bounded to `config.cache_max()` bytes, least recently used out first: a hit touches the
  entry's mtime (the LRU clock); each write adds its size to the `usage` file under an
  advisory lock, and only when that total passes the bound is the directory scanned and the
  oldest entries deleted, down to 90% of the bound (so a scan pays for many writes).
* Nothing here raises: a read-only, full or vanished directory warns once per process and kind
  of trouble, and the kernel is simply compiled (and kept in memory)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import warnings

from . import config

MAGIC = b"LCKOBJ\n"
LOW_WATER = 0.9          # eviction deletes down to this fraction of the bound
STALE_TMP_SECONDS = 3600  # a temp file this old belongs to a process that died mid-write

# counters of the process's disk traffic and kernel compiles (codegen/jit.py adds its keys and
# counts a hit once the entry has linked)
stats = {"disk_hits": 0, "disk_dropped": 0, "disk_writes": 0, "disk_evicted": 0}
_warned: set = set()
_TAG = b"Signature: 8a477f597d28d172789f06886806bc55\n# lazycandle's kernel cache (see lazycandle cache info)\n"


def path(key: str):
    d = config.cache_dir()
    return os.path.join(d, key[:2], key + ".o") if d else None


def encode(head: dict, obj: bytes) -> bytes:
    head = dict(head, obj_sha256=hashlib.sha256(obj).hexdigest(), obj_len=len(obj))
    return MAGIC + json.dumps(head, sort_keys=True, separators=(",", ":")).encode() + b"\n" + obj


def decode(data: bytes, want: dict):
    """(object bytes, header) of an entry whose header matches `want` field by field and whose
    bytes match their length and sha256; else a string saying why it is not usable."""
    if not data.startswith(MAGIC):
        return "it has no lazycandle header"
    nl = data.find(b"\n", len(MAGIC))
    if nl < 0:
        return "its header is cut off"
    try:
        head = json.loads(data[len(MAGIC):nl])
    except ValueError:
        return "its header is unreadable"
    if not isinstance(head, dict):
        return "its header is unreadable"
    for field, value in want.items():
        if head.get(field) != value:
            return f"its compile key differs ({field})"
    obj = data[nl + 1:]
    if head.get("obj_len") != len(obj):
        return f"it holds {len(obj)} object bytes, its header says {head.get('obj_len')}"
    if head.get("obj_sha256") != hashlib.sha256(obj).hexdigest():
        return "its object bytes do not match their sha256"
    return obj, head


def read(key: str, want: dict):
    """(object bytes, header) of the verified entry under `key`, touched as just used; None on
    a miss or a bad entry (which is dropped)."""
    p = path(key)
    if not p:
        return None
    try:
        with open(p, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        drop(key, f"it is unreadable ({e.strerror})")
        return None
    got = decode(data, want)
    if isinstance(got, str):
        drop(key, got)
        return None
    try:
        os.utime(p)                  # the LRU clock; a read-only cache just keeps its order
    except OSError:
        pass
    return got


def drop(key: str, why: str) -> None:
    """Delete a bad entry (the caller recompiles and rewrites it); warn once per process."""
    p = path(key)
    stats["disk_dropped"] += 1
    with contextlib.suppress(OSError):
        if os.path.isdir(p) and not os.path.islink(p):
            os.rmdir(p)
        else:
            os.remove(p)
    warn_once("bad entry", f"dropped kernel cache entry {p}: {why}; recompiling it (further bad "
                           f"entries in this process are replaced without a warning)")


def write(key: str, head: dict, obj: bytes) -> None:
    """Store an entry atomically and account for its size (evicting when over the bound)."""
    p = path(key)
    if not p:
        return
    data = encode(head, obj)
    tmp = f"{p}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        root = os.path.dirname(os.path.dirname(p))
        fresh = not os.path.isdir(root)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if fresh:
            _write_file(os.path.join(root, "CACHEDIR.TAG"), _TAG)
        with open(tmp, "wb") as f:
            f.write(data)
        try:
            old = os.stat(p).st_size
        except OSError:
            old = 0
        os.replace(tmp, p)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        warn_once("write", f"cannot write to the kernel cache {config.cache_dir()} ({e.strerror or e}); "
                           f"kernels compiled by this process are kept in memory only")
        return
    stats["disk_writes"] += 1
    _account(root, len(data) - old)


def _write_file(p: str, data: bytes) -> None:
    tmp = f"{p}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, p)


@contextlib.contextmanager
def _locked(root: str):
    """An exclusive advisory lock on the cache directory (between processes and threads); no
    lock where the file system has none (the usage total may then drift until the next scan)."""
    try:
        fd = os.open(os.path.join(root, "lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            pass
        yield
    finally:
        os.close(fd)


def _account(root: str, delta: int) -> None:
    """Add `delta` bytes to the directory's usage total; past the bound, evict."""
    try:
        with _locked(root):
            total = _read_usage(root)
            total = _scan(root)[1] if total is None else total + delta
            limit = config.cache_max()
            if total > limit:
                total = _evict(root, int(limit * LOW_WATER))
            _write_file(os.path.join(root, "usage"), str(max(0, total)).encode())
    except OSError as e:
        warn_once("write", f"cannot keep the kernel cache {root} within its bound ({e.strerror or e})")


def _read_usage(root: str):
    try:
        with open(os.path.join(root, "usage"), "rb") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _scan(root: str):
    """([(mtime, size, path)] of the entries, their total bytes); temp files of writers that
    died long ago are deleted on the way."""
    entries, total, now = [], 0, time.time()
    try:
        subdirs = [e.path for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return [], 0
    for sub in subdirs:
        try:
            listing = list(os.scandir(sub))
        except OSError:
            continue
        for e in listing:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if e.name.endswith(".o"):
                entries.append((st.st_mtime, st.st_size, e.path))
                total += st.st_size
            elif e.name.endswith(".tmp") and now - st.st_mtime > STALE_TMP_SECONDS:
                with contextlib.suppress(OSError):
                    os.remove(e.path)
    return entries, total


def _evict(root: str, target: int) -> int:
    """Delete the least recently used entries until at most `target` bytes remain; the total."""
    entries, total = _scan(root)
    entries.sort()
    for _, size, p in entries:
        if total <= target:
            break
        try:
            os.remove(p)
        except FileNotFoundError:
            pass
        except OSError:
            continue
        total -= size
        stats["disk_evicted"] += 1
    return total


def info() -> dict:
    """{"dir": the directory or None when off, "entries", "bytes", "max"} (a full scan)."""
    d = config.cache_dir()
    entries, total = _scan(d) if d and os.path.isdir(d) else ([], 0)
    return {"dir": d, "entries": len(entries), "bytes": total, "max": config.cache_max()}


def clear() -> tuple:
    """Delete every entry; (entries, bytes) deleted."""
    d = config.cache_dir()
    if not d or not os.path.isdir(d):
        return 0, 0
    n = freed = 0
    with _locked(d):
        entries, _ = _scan(d)
        for _, size, p in entries:
            with contextlib.suppress(OSError):
                os.remove(p)
                n, freed = n + 1, freed + size
        with contextlib.suppress(OSError):
            _write_file(os.path.join(d, "usage"), str(_scan(d)[1]).encode())
    return n, freed


def warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(f"lazycandle: {message}", RuntimeWarning, stacklevel=3)
