"""Command line: `lazycandle dump SCRIPT.py [--stage S] [--format F] [--out DIR]`,
`lazycandle info`, `lazycandle bench [...]`, `lazycandle cache info|clear`,
`lazycandle generate FOLDER --prompt TEXT [...]`, `lazycandle embed FOLDER TEXT... [--json]`."""
from __future__ import annotations

import argparse
import os
import runpy
import sys


def _dump(args) -> int:
    from .ir.printer import STAGES, FORMATS
    stages = args.stage.split(",") if args.stage else ["graph", "optimized", "schedule"]
    for s in stages:
        if s not in STAGES:
            print(f"lazycandle dump: unknown stage {s!r} (stages: {', '.join(STAGES)})", file=sys.stderr)
            return 2
    if args.format not in FORMATS:
        print(f"lazycandle dump: unknown format {args.format!r} (formats: {', '.join(FORMATS)})", file=sys.stderr)
        return 2
    if not os.path.isfile(args.script):
        why = "is not a file" if os.path.exists(args.script) else "does not exist"
        print(f"lazycandle dump: script {args.script!r} {why}", file=sys.stderr)
        return 2
    os.environ["LAZYCANDLE_DUMP"] = ",".join(stages)
    os.environ["LAZYCANDLE_DUMP_FORMAT"] = args.format
    if args.out:
        os.environ["LAZYCANDLE_DUMP_DIR"] = args.out
    sys.argv = [args.script] + args.args
    runpy.run_path(args.script, run_name="__main__")
    return 0


def _info(args) -> int:
    from . import config
    from .codegen import jit
    h = jit.host_info()
    feats = [f[1:] for f in h["features"].split(",") if f.startswith("+") and
             any(k in f for k in ("avx", "fma", "f16c", "sse4", "amx"))]
    print(f"cpu:            {h['cpu']} ({h['triple']})")
    print(f"vector bits:    {jit.vector_bits()}")
    print(f"cpu features:   {' '.join(sorted(feats))}")
    print(f"threads:        {config.get_num_threads()} (LAZYCANDLE_NUM_THREADS={os.environ.get('LAZYCANDLE_NUM_THREADS', '')!s}, "
          f"affinity {len(os.sched_getaffinity(0))} cpus)")
    print(f"matmul backend: {config.get_matmul_backend()}")
    from .codegen import gemm_amx
    print(f"amx:            {gemm_amx.status()}")
    try:
        from .runtime import blas
        print(f"BLAS library:   {_blas_words(blas.info())}")
    except Exception as e:  # BLAS is optional for info
        print(f"BLAS library:   unavailable ({type(e).__name__}: {e})")
    print(f"kernel cache:   {_cache_words()}")
    return 0


def _cache_words() -> str:
    from . import diskcache
    i = diskcache.info()
    if not i["dir"]:
        return "in memory only (LAZYCANDLE_CACHE_DIR=off)"
    return f"{i['dir']} ({i['entries']} objects, {i['bytes'] / 2**20:.1f} of {i['max'] / 2**20:.0f} MiB)"


def _cache(args) -> int:
    """`lazycandle cache info|clear`: show or empty the disk kernel cache."""
    from . import diskcache
    if args.action == "clear":
        n, freed = diskcache.clear()
        print(f"removed {n} objects ({freed / 2**20:.1f} MiB) from {diskcache.info()['dir'] or 'no disk cache (off)'}")
    else:
        print(f"kernel cache: {_cache_words()}")
    return 0


def _blas_words(info: dict) -> str:
    """`OpenBLAS 0.3.27, core SkylakeX, 2 threads (build: DYNAMIC_ARCH ...; /path/lib.so)` from
    blas.info()."""
    if not info.get("library"):
        return "none found (matmul uses the generated tiled kernels)"
    words = (info.get("config") or "").split()
    name = " ".join(words[:2]) if words else os.path.basename(info["library"])
    build = " ".join(w for w in words[2:] if w != info.get("corename"))
    parts = [name]
    if info.get("corename"):
        parts.append(f"core {info['corename']}")
    if info.get("threads") is not None:
        parts.append(f"{info['threads']} thread{'s' if info['threads'] != 1 else ''}")
    return ", ".join(parts) + f" ({'build: ' + build + '; ' if build else ''}{info['library']})"


def _bench(argv) -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isdir(os.path.join(root, "bench")) and root not in sys.path:
        sys.path.insert(0, root)
    try:
        import bench
    except ImportError:
        print("lazycandle bench: the bench/ suite is not importable (run from a source checkout)", file=sys.stderr)
        return 2
    return bench.run_cli(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    p = argparse.ArgumentParser(prog="lazycandle", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="run a script with IR dumping on")
    d.add_argument("script")
    d.add_argument("--stage", default=None, help="comma list of graph,optimized,schedule,llvm,asm")
    d.add_argument("--format", default="text", help="text | dot | mermaid")
    d.add_argument("--out", default=None, help="write dumps to files in this directory")
    sub.add_parser("info", help="CPU features, threads, BLAS, kernel cache")
    sub.add_parser("bench", help="run the benchmark suite")
    sub.add_parser("cache", help="the disk kernel cache: info | clear").add_argument("action", choices=("info", "clear"))
    from .models.commands import add_embed, run_embed
    add_embed(sub)
    from .models.textgen import add_generate, run_generate
    add_generate(sub)
    args, rest = p.parse_known_args(argv)
    if args.cmd == "embed" and not rest:
        return run_embed(args)
    if args.cmd == "generate" and not rest:
        return run_generate(args)
    if args.cmd == "dump":
        args.args = [a for a in rest if a != "--"]
        return _dump(args)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.cmd == "cache":
        return _cache(args)
    return _info(args)


if __name__ == "__main__":
    sys.exit(main())
