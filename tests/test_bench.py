"""The benchmark suite's runner (bench/): it runs end to end on tiny sizes, reports a wrong
lazycandle result as WRONG (never timed) and a raising op as ERROR.  No timing is asserted."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import bench  # noqa: E402
from bench import cases as C  # noqa: E402
from bench.runner import _aligned, check, run_case  # noqa: E402
from bench.timing import round_orders, time_alternating  # noqa: E402

CHEAP = "add,fma_chain,sum_last"


def test_tiny_run_end_to_end(tmp_path, capsys):
    import lazycandle as lc
    threads_before = lc.get_num_threads()
    js, md = tmp_path / "rows.json", tmp_path / "report.md"
    rc = bench.main(["--tiny", "--peers", "none", "--only", CHEAP, "--repeats", "2", "--threads", "1,2",
                     "--json", str(js), "--md", str(md)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert lc.get_num_threads() == threads_before                    # the thread setting is restored
    data = json.loads(js.read_text())
    rows = data["rows"]
    assert sorted({r["name"] for r in rows}) == sorted(CHEAP.split(","))
    assert {r["threads"] for r in rows} == {1, 2}
    for r in rows:
        assert r["status"] == "ok", r
        assert set(r["impls"]) == {"lazycandle", "numpy"}
        assert r["impls"]["lazycandle"]["n"] == 2
        assert r["x_numpy"] > 0 and r["rate"] > 0
    assert "## All cases" in out and "× NumPy" in out and "## Method" in out
    assert "## The seed's cpu_bench table" in out                   # "add" is a seed case
    assert md.read_text() == out
    assert err.count("[") >= len(rows)                               # one progress line per case
    assert set(data["peaks"]["bandwidth_gbs"]) == {"1", "2"}


@pytest.mark.parametrize("dt", [np.float32, np.float64, np.uint8, "bfloat16"])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (33, 5)])
def test_case_inputs_are_aligned_copies(dt, shape):
    """Every implementation reads the same 64-byte aligned input (jax's DLPack view needs it)."""
    import ml_dtypes
    dt = ml_dtypes.bfloat16 if dt == "bfloat16" else dt
    a = (np.arange(int(np.prod(shape)), dtype=np.float64) % 200).reshape(shape).astype(dt)
    out = _aligned(a[..., ::-1] if a.ndim else a)
    assert (out.ctypes.data % 64 == 0 or not out.size) and out.flags.c_contiguous and out.dtype == a.dtype
    np.testing.assert_array_equal(out, a[..., ::-1] if a.ndim else a)


def test_wrong_result_is_reported_and_not_timed(capsys):
    rc = bench.main(["--tiny", "--peers", "none", "--no-peaks", "--only", "add", "--repeats", "2"],
                    lc_impls={"add": lambda lc, a, b: a - b})
    out, _ = capsys.readouterr()
    assert rc == 1
    assert "**WRONG**" in out
    row = run_case(C.select(C.ALL_CASES, "add")[0], 64, 1, {}, repeats=2, lc_impl=lambda lc, a, b: a * b)
    assert row["status"] == "WRONG" and row["impls"] == {} and "elements off" in row["error"]


def test_raising_op_is_reported_as_error():
    def boom(lc, a, b):
        raise NotImplementedError("op not landed yet")
    row = run_case(C.select(C.ALL_CASES, "mul")[0], 64, 1, {}, repeats=2, lc_impl=boom)
    assert row["status"] == "ERROR" and "op not landed yet" in row["error"] and row["impls"] == {}


def test_wrong_dtype_or_shape_is_wrong():
    base = np.ones((2, 3), np.float32)
    assert check(base.copy(), base, base.astype(np.float64), 1e-5, 1e-6) == (True, "")
    assert not check(base.astype(np.float64), base, base, 1e-5, 1e-6)[0]
    assert not check(base.T, base, base, 1e-5, 1e-6)[0]
    nan = base.copy()
    nan[0, 0] = np.nan
    assert not check(nan, base, base, 1e-5, 1e-6)[0]
    assert check(nan, nan, nan.astype(np.float64), 1e-5, 1e-6)[0]


def test_check_allows_numpy_sized_rounding_error():
    exact = np.array([1.0, 2.0, 3.0])
    base = exact.astype(np.float32)
    close = (exact * (1 + 1e-6)).astype(np.float32)
    assert check(close, base, exact, 1e-5, 0)[0]
    assert not check((exact * 1.01).astype(np.float32), base, exact, 1e-5, 0)[0]


def test_select_patterns():
    names = lambda only: [c.name for c in C.select(C.ALL_CASES, only)]  # noqa: E731
    assert names("exp") == ["exp"]                                   # exact name wins
    assert set(names("matmul")) == {c.name for c in C.ALL_CASES if "matmul" in c.name}
    assert names("bmm*") == ["bmm", "bmm_bcast"]
    assert len(names("")) == len(C.ALL_CASES)


def test_time_alternating_counts_and_warmup():
    calls = []
    st = time_alternating({"x": lambda: calls.append("x"), "y": lambda: calls.append("y")}, repeats=3, warmup=1)
    assert calls.count("x") == 4 and calls.count("y") == 4
    assert st["x"].n == 3 and st["x"].min <= st["x"].median <= st["x"].max


def test_round_orders_put_every_implementation_after_every_other_equally_often():
    for n in range(1, 8):
        names = [f"i{k}" for k in range(n)]
        orders = round_orders(names)
        assert all(sorted(o) == names for o in orders)
        follows = {}
        for o in orders:
            for a, b in zip(o, o[1:]):
                follows[a, b] = follows.get(a, 0) + 1
        if n > 1:
            assert len(follows) == n * (n - 1) and len(set(follows.values())) == 1, (n, follows)


def test_time_alternating_runs_setup_untimed_right_before_each_call():
    calls = []
    st = time_alternating({"x": lambda: calls.append("x"), "y": lambda: calls.append("y")}, repeats=2, warmup=1,
                          setup={"x": lambda: calls.append("sx")})
    assert calls == ["sx", "x", "y", "sx", "x", "y", "y", "sx", "x"]
    assert st["x"].n == 2 and st["y"].n == 2


def test_every_case_has_all_modes_and_work():
    for c in C.ALL_CASES:
        assert set(c.sizes) == set(C.MODES), c.name
        flops, nbytes = c.work(c.sizes["tiny"])
        assert flops > 0 and nbytes > 0
        assert c.metric in ("flops", "bytes")


def test_list_and_bad_arguments(capsys):
    assert bench.main(["--list"]) == 0
    assert "softmax" in capsys.readouterr().out
    assert bench.main(["--only", "no_such_case"]) == 2
    assert bench.main(["--threads", "0", "--only", "add"]) == 2


def test_backbone_script_runs_tiny(capsys):
    import lazycandle as lc
    from bench import backbone
    before = lc.get_num_threads()
    assert backbone.main(["--tiny", "--no-cold", "--repeats", "2", "--threads", "1"]) == 0
    assert lc.get_num_threads() == before                            # the thread setting is restored
    out = capsys.readouterr().out
    assert "(a*b + c)*d - a" in out and "(A.t() + B) * 2" in out and "5-op chain" in out


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "bmm_bcast"])
def test_more_cases_check_at_tiny_size(name):
    case = C.select(C.ALL_CASES, name)[0]
    row = run_case(case, case.sizes["tiny"], 1, {}, repeats=1)
    assert row["status"] in ("ok", "ERROR"), row              # ERROR only if the op has not landed


@pytest.mark.parametrize("name", ["log_softmax", "rms_norm", "sum_first", "attn_softmax"])
def test_issue10_cases_are_right_at_tiny_size(name):
    case = C.select(C.ALL_CASES, name)[0]
    row = run_case(case, case.sizes["tiny"], 1, {}, repeats=2)
    assert row["status"] == "ok", row
    assert row["loadavg"] >= 0 and row["spread"] >= 1.0


def test_widely_spread_samples_are_timed_again():
    import time
    from bench.runner import MAX_SPREAD, _timed_with_retries
    calls = []

    def jumpy():                       # one slow call among the first round's samples only
        calls.append(1)
        time.sleep(0.06 if len(calls) == 3 else 0.005)
    row = {"threads": 1, "notes": []}
    stats = _timed_with_retries({"f": jumpy}, 4, row)
    assert len(calls) > 5 + 4                                        # a second round ran
    assert row["spread"] <= MAX_SPREAD and stats["f"].n == 4
    assert any("timed 2 times" in n for n in row["notes"])


def test_fair_env_keeps_the_users_setting_and_names_the_rest():
    from bench.peers import FAIR_ENV, fair_env_missing
    assert fair_env_missing({}) == FAIR_ENV
    assert "OMP_WAIT_POLICY" not in fair_env_missing({"OMP_WAIT_POLICY": "ACTIVE"})


def test_command_line_restarts_with_idle_threads_set_to_yield():
    import subprocess
    from bench.peers import FAIR_ENV
    env = {k: v for k, v in os.environ.items() if k not in FAIR_ENV and k != "LAZYCANDLE_BENCH_FAIR_ENV"}
    out = subprocess.run([sys.executable, "-m", "lazycandle", "bench", "--tiny", "--peers", "none", "--no-peaks",
                          "--only", "add", "--repeats", "1", "--threads", "1"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "OMP_WAIT_POLICY=PASSIVE" in out.stdout and "OPENBLAS_THREAD_TIMEOUT=4" in out.stdout


def test_plot_is_skipped_with_a_note_without_matplotlib(tmp_path, monkeypatch):
    from bench.report import plot
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # makes `import matplotlib` fail
    note = plot(str(tmp_path / "p.png"), [], [1])
    assert "matplotlib is not installed" in note and not (tmp_path / "p.png").exists()


def test_plot_is_written_with_matplotlib(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.report import plot
    row = {"name": "add", "threads": 1, "status": "ok", "x_numpy": 2.0, "x_best_peer": 0.5}
    assert "written" in plot(str(tmp_path / "p.png"), [row], [1])
    assert (tmp_path / "p.png").stat().st_size > 0


def test_progress_lines_name_the_sizes_that_run(capsys):
    case = C.select(C.ALL_CASES, "matmul_f32_1024")[0]
    rc = bench.main(["--tiny", "--peers", "none", "--no-peaks", "--only", case.name, "--repeats", "1",
                     "--threads", "1"])
    err = capsys.readouterr().err
    assert rc == 0
    line = next(ln for ln in err.splitlines() if ln.startswith("[1/1]"))
    n = case.sizes["tiny"]
    assert f"{n}x{n}" in line and "1024" not in line, line


def test_stream_peak_kernel_reads_every_block():
    from bench.bandwidth import BLOCK, Stream
    x = np.zeros(5 * BLOCK, np.float32).view(np.int32)
    x[3 * BLOCK + BLOCK - 1] = 6                       # the last word of block 3
    x[1 * BLOCK] = 1
    out = np.full(5, -1, np.int32)
    Stream().run(x, out, threads=2)
    assert out.tolist() == [0, 1, 0, 6, 0]


def test_bandwidth_python_split_times_each_implementation_warm_and_after_a_big_kernel(capsys):
    from bench import bandwidth
    assert bandwidth.main(["--python", "--threads", "1", "--reps", "3"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ")]
    header, warm, cold = rows[0], rows[1], rows[2]
    assert all(n in header for n in ("eager", "Program.run", "numpy"))
    assert warm.startswith("| warm |") and cold.startswith("| after 16 MiB |")
    for row in (warm, cold):
        cells = [c.strip() for c in row.strip("|").split("|")[1:]]
        assert len(cells) == header.count("|") - 2 and all(float(c) > 0 for c in cells)
