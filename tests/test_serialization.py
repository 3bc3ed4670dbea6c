"""safetensors and .npz: every dtype round-trips; our files are byte-for-byte what the
`safetensors` package writes and each side reads the other's; loading memory-maps (no copy) and
the engine computes on those unaligned-to-64 buffers; lazy and strided tensors save their values;
every kind of corrupt file raises SerializationError naming file and tensor (plus a fuzz)."""
from __future__ import annotations

import gc
import io
import json
import mmap
import os
import zipfile

import ml_dtypes
import numpy as np
import pytest
import safetensors
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.numpy import load_file, save_file

import lazycandle as lc
from conftest import ALL_DTYPES, ids as dt_ids, rng_for

PACKAGE_SAVES = [d for d in ALL_DTYPES if d not in (lc.f4, lc.f6e2m3, lc.f6e3m2)]   # it has no numpy dtype for packed F4/F6
CODE_BITS = {lc.f4: 4, lc.f6e2m3: 6, lc.f6e3m2: 6}


def sample(dt, shape, *key) -> np.ndarray:
    """Arbitrary bit patterns of `dt` (NaNs included), valid codes only for the sub-byte types."""
    rng = rng_for(dt.name, shape, *key)
    n = int(np.prod(shape, dtype=np.int64))
    if dt in CODE_BITS:
        raw = rng.integers(0, 1 << CODE_BITS[dt], n).astype(np.uint8)
    else:
        raw = rng.integers(0, 256, n * dt.size_in_bytes).astype(np.uint8)
    return raw.view(dt.numpy).reshape(shape)


def bits(a) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


def assert_same(t, exp):
    got = t.numpy()
    assert got.shape == exp.shape and got.dtype == exp.dtype, (got.shape, got.dtype, exp.shape, exp.dtype)
    np.testing.assert_array_equal(bits(got), bits(exp))


def header_of(raw: bytes) -> dict:
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n])


def handmade(entries: dict, data: bytes, metadata=None, pad=True) -> bytes:
    """A safetensors file from an explicit header (for layouts the writers never produce)."""
    h = dict(entries) if metadata is None else {"__metadata__": metadata, **entries}
    text = json.dumps(h).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data


# ---- round trips and interop -------------------------------------------------------------
@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dt_ids(ALL_DTYPES))
def test_every_dtype_round_trips_bit_exact(tmp_path, dt):
    shapes = [(2, 3, 4), (0, 5), (4,)] + ([] if dt in CODE_BITS else [()])   # packed F4/F6 fill whole bytes
    ts = {f"t{i}": sample(dt, s, i) for i, s in enumerate(shapes)}
    path = tmp_path / "x.safetensors"
    lc.save_safetensors({k: lc.tensor(v) for k, v in ts.items()}, path)
    back = lc.load_safetensors(path)
    assert sorted(back) == sorted(ts)
    for k, v in ts.items():
        assert back[k].dtype is dt and not back[k].is_lazy
        assert_same(back[k], v)


@pytest.mark.parametrize("with_meta", [False, True])
def test_files_are_byte_identical_to_the_safetensors_package(tmp_path, with_meta):
    arrays = {f"{dt.name}_{i}": sample(dt, s, i) for dt in PACKAGE_SAVES
              for i, s in enumerate([(3, 5), (), (0,), (7,)])}
    arrays["b"] = np.arange(6, dtype=np.float32).reshape(2, 3)
    arrays["a"] = np.arange(3, dtype=np.float32)        # same dtype: ordered by name
    meta = {"format": "pt"} if with_meta else None       # one key: the package's key order is random
    ours, theirs = tmp_path / "ours.st", tmp_path / "theirs.st"
    lc.save_safetensors({k: lc.tensor(v) for k, v in arrays.items()}, ours, metadata=meta)
    save_file(arrays, theirs, metadata=meta)
    assert ours.read_bytes() == theirs.read_bytes()


def test_package_reads_our_files_and_we_read_its_files(tmp_path):
    arrays = {dt.name: sample(dt, (3, 4), "interop") for dt in PACKAGE_SAVES}
    ours = tmp_path / "ours.st"
    lc.save_safetensors({k: lc.tensor(v) for k, v in arrays.items()}, ours)
    # the package parses every one of our tensors (raw bytes for the dtypes its numpy layer lacks)
    seen = dict(safetensors.deserialize(ours.read_bytes()))
    for k, v in arrays.items():
        assert seen[k]["shape"] == [3, 4]
        assert bytes(seen[k]["data"]) == v.tobytes()
    plain = {k: v for k, v in arrays.items() if k in ("u8", "u32", "i16", "i32", "i64", "f16", "f32", "f64")}
    lc.save_safetensors({k: lc.tensor(v) for k, v in plain.items()}, ours)
    for k, v in load_file(ours).items():
        np.testing.assert_array_equal(bits(v), bits(plain[k]))
    theirs = tmp_path / "theirs.st"
    save_file(arrays, theirs)
    for k, t in lc.load_safetensors(theirs).items():
        assert_same(t, arrays[k])


def test_packed_sub_byte_dtypes_follow_the_format(tmp_path):
    """F4 packs 2 per byte and F6 4 per 3 bytes, little-endian bits; the package accepts them."""
    codes4 = np.array([1, 2, 3, 15], np.uint8)
    codes6 = np.array([1, 2, 3, 63], np.uint8)
    path = tmp_path / "p.st"
    lc.save_safetensors({"a": lc.tensor(codes4.view(lc.f4.numpy)), "b": lc.tensor(codes6.view(lc.f6e2m3.numpy))}, path)
    raw = path.read_bytes()
    h = header_of(raw)
    assert h["a"]["dtype"] == "F4" and h["a"]["shape"] == [4] and h["a"]["data_offsets"][1] - h["a"]["data_offsets"][0] == 2
    assert h["b"]["dtype"] == "F6_E2M3" and h["b"]["shape"] == [4]
    data = dict(safetensors.deserialize(raw))
    assert bytes(data["a"]["data"]) == bytes([0x21, 0xF3])
    word = 1 | 2 << 6 | 3 << 12 | 63 << 18
    assert bytes(data["b"]["data"]) == word.to_bytes(3, "little")
    back = lc.load_safetensors(path)
    assert_same(back["a"], codes4.view(lc.f4.numpy))
    assert_same(back["b"], codes6.view(lc.f6e2m3.numpy))


def test_sub_byte_tensor_that_does_not_fill_whole_bytes_cannot_be_saved(tmp_path):
    with pytest.raises(lc.SerializationError, match="'odd'"):
        lc.save_safetensors({"odd": lc.tensor(np.zeros(3, np.uint8).view(lc.f4.numpy))}, tmp_path / "x.st")


def test_format_dtypes_lc_lacks_widen_exactly(tmp_path):
    vals = {"i8": np.array([-128, -1, 0, 127], np.int8), "u16": np.array([0, 1, 65535], np.uint16),
            "u64": np.array([0, 2 ** 63 - 1], np.uint64), "flag": np.array([True, False, True]),
            "e5m2": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2),
            "e4fnuz": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fnuz),
            "e5fnuz": np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e5m2fnuz)}
    want = {"i8": lc.i16, "u16": lc.u32, "u64": lc.i64, "flag": lc.u8, "e5m2": lc.f16, "e4fnuz": lc.f16,
            "e5fnuz": lc.f16}
    save_file(vals, tmp_path / "w.st")
    back = lc.load_safetensors(tmp_path / "w.st")
    for k, v in vals.items():
        assert back[k].dtype is want[k], k
        exp = v.astype(want[k].numpy)
        np.testing.assert_array_equal(back[k].numpy(), exp)
        finite = np.isfinite(v.astype(np.float64)) if v.dtype.kind not in "iub" else np.ones(v.shape, bool)
        np.testing.assert_array_equal(exp[finite].astype(np.float64), v[finite].astype(np.float64))


@pytest.mark.parametrize("arr, what", [(np.array([2 ** 63], np.uint64), "does not fit"),
                                       (np.ones(2, np.complex64), "C64")])
def test_unrepresentable_dtype_or_value_raises_naming_the_tensor(tmp_path, arr, what):
    save_file({"bad": arr, "fine": np.ones(2, np.float32)}, tmp_path / "c.st")
    with pytest.raises(lc.SerializationError, match=f"c.st.*'bad'.*{what}"):
        lc.load_safetensors(tmp_path / "c.st")


def test_metadata_round_trips_and_the_package_sees_it(tmp_path):
    meta = {"format": "pt", "note": "ünïcode \"quoted\" \n", "empty": ""}
    path = tmp_path / "m.st"
    lc.save_safetensors({"x": lc.ones((2,))}, path, metadata=meta)
    assert lc.load_safetensors_metadata(path) == meta
    with safetensors.safe_open(path, "np") as f:
        assert f.metadata() == meta
    save_file({"x": np.ones(2, np.float32)}, tmp_path / "p.st", metadata=meta)
    assert lc.load_safetensors_metadata(tmp_path / "p.st") == meta
    lc.save_safetensors({"x": lc.ones((2,))}, path)
    assert lc.load_safetensors_metadata(path) == {}


def test_bad_metadata_or_names_raise_at_save(tmp_path):
    with pytest.raises(lc.SerializationError, match="metadata"):
        lc.save_safetensors({"x": lc.ones((2,))}, tmp_path / "a.st", metadata={"k": 1})
    with pytest.raises(lc.SerializationError, match="__metadata__"):
        lc.save_safetensors({"__metadata__": lc.ones((2,))}, tmp_path / "a.st")
    with pytest.raises(lc.SerializationError, match="'x'.*ndarray"):
        lc.save_safetensors({"x": np.ones(2)}, tmp_path / "a.st")
    assert not (tmp_path / "a.st").exists()


def test_lazy_strided_and_broadcast_tensors_save_their_values(tmp_path):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    b = lc.tensor(base)
    ts = {"t": b.t(), "narrow": b.narrow(1, 1, 3), "bcast": lc.tensor(np.arange(3, dtype=np.float32)).broadcast_as((2, 3)),
          "lazy": (b * 2 + 1).exp().sum(1), "const": lc.full(7, (2, 2), lc.i32), "step": b[:, ::2]}
    exp = {"t": base.T, "narrow": base[:, 1:4], "bcast": np.broadcast_to(np.arange(3, dtype=np.float32), (2, 3)),
           "lazy": np.exp(base * 2 + 1).sum(1), "const": np.full((2, 2), 7, np.int32), "step": base[:, ::2]}
    path = tmp_path / "v.st"
    lc.save_safetensors(ts, path)
    back = load_file(path)
    for k, v in exp.items():
        np.testing.assert_allclose(back[k], v, rtol=1e-6)
        assert back[k].dtype == v.dtype


# ---- memory mapping ----------------------------------------------------------------------
def _owner(a):
    while isinstance(a, np.ndarray) and a.base is not None:
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_load_maps_the_file_without_copying(tmp_path):
    arr = np.arange(1 << 16, dtype=np.float32)
    path = tmp_path / "big.st"
    save_file({"x": arr, "y": arr[:5].copy()}, path)
    back = lc.load_safetensors(path)
    buf = back["x"]._node.buffer
    assert isinstance(_owner(buf), mmap.mmap)
    assert _owner(buf) is _owner(back["y"]._node.buffer)
    assert not buf.flags.writeable
    with pytest.raises(ValueError):
        back["x"].numpy()[0] = 1.0


def test_map_outlives_the_dict_and_saving_over_the_file(tmp_path):
    path = tmp_path / "w.st"
    lc.save_safetensors({"x": lc.tensor(np.arange(10.0)), "y": lc.ones((3,))}, path)
    x = lc.load_safetensors(path)["x"]
    gc.collect()
    lc.save_safetensors({"x": x * 2, "z": lc.zeros((1000,))}, path)     # replaces the file x maps
    np.testing.assert_array_equal(x.numpy(), np.arange(10.0))
    np.testing.assert_array_equal(lc.load_safetensors(path)["x"].numpy(), np.arange(10.0) * 2)
    os.unlink(path)
    np.testing.assert_array_equal((x + 1).numpy(), np.arange(10.0) + 1)


def test_kernels_compute_on_mapped_buffers_at_any_element_aligned_offset(tmp_path):
    """The writer packs tensors back to back, so most start at addresses that are not 64-byte
    aligned: elementwise, reductions, matmul (BLAS and tiled) and index ops must not care."""
    rng = rng_for("mapped")
    a = rng.standard_normal((37, 29)).astype(np.float32)
    b = rng.standard_normal((29, 13)).astype(np.float32)
    d = rng.standard_normal((5, 7))
    arrays = {"a": a, "b": b, "d": d, "pad1": np.zeros(1, np.float32), "pad3": np.zeros(3, np.float64),
              "ids": np.array([3, 0, 2], np.int64), "h": rng.standard_normal(9).astype(np.float16)}
    path = tmp_path / "k.st"
    save_file(arrays, path)
    t = lc.load_safetensors(path)
    offs = {k: t[k]._node.buffer.ctypes.data % 64 for k in ("a", "b", "d", "h")}
    assert any(offs.values()), offs
    np.testing.assert_allclose((t["a"].exp() * 2).numpy(), np.exp(a) * 2, rtol=1e-6)
    np.testing.assert_allclose(t["a"].sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(t["a"].t().max(1).numpy(), a.T.max(1))
    for backend in ("blas", "tiled"):
        lc.set_matmul_backend(backend)
        try:
            np.testing.assert_allclose((t["a"] @ t["b"]).numpy(), a @ b, rtol=1e-5, atol=1e-5)
        finally:
            lc.set_matmul_backend("auto")
    np.testing.assert_array_equal(t["d"].index_select(t["ids"], 0).numpy(), d[[3, 0, 2]])
    np.testing.assert_array_equal((t["h"] + t["h"]).numpy(), arrays["h"] + arrays["h"])


def test_tensor_not_aligned_to_its_element_size_is_copied_and_correct(tmp_path):
    x = np.arange(5, dtype=np.float32)
    data = b"\x07" + x.tobytes() + np.arange(3, dtype=np.float64).tobytes()
    raw = handmade({"u": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                    "x": {"dtype": "F32", "shape": [5], "data_offsets": [1, 21]},
                    "d": {"dtype": "F64", "shape": [3], "data_offsets": [21, 45]}}, data)
    path = tmp_path / "odd.st"
    path.write_bytes(raw)
    t = lc.load_safetensors(path)
    assert t["x"]._node.buffer.ctypes.data % 4 == 0
    np.testing.assert_array_equal((t["x"] * 3).numpy(), x * 3)
    np.testing.assert_array_equal(t["d"].sum_all().item(), 3.0)
    assert t["u"].item() == 7


def test_loaded_tensors_feed_a_small_model(tmp_path):
    rng = rng_for("model")
    w1 = rng.standard_normal((16, 8)).astype(np.float32)
    b1 = rng.standard_normal(16).astype(np.float32)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    save_file({"fc.weight": w1, "fc.bias": b1}, tmp_path / "m.st")
    p = lc.load_safetensors(tmp_path / "m.st")
    y = lc.nn.softmax_last_dim(lc.nn.linear(lc.tensor(x), p["fc.weight"], p["fc.bias"]).relu())
    z = np.maximum(x @ w1.T + b1, 0)
    ref = np.exp(z - z.max(-1, keepdims=True))
    np.testing.assert_allclose(y.numpy(), ref / ref.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


# ---- corrupt files -----------------------------------------------------------------------
GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}}
DATA = bytes(16)


def _with(name, **changes):
    e = {k: dict(v) for k, v in GOOD.items()}
    e[name].update(changes)
    return e


CORRUPT = {
    "empty file": (b"", "truncated"),
    "short length": (b"\x08\x00\x00", "truncated"),
    "length past end": ((1000).to_bytes(8, "little") + b"{}      ", "past the end"),
    "bad utf8": ((8).to_bytes(8, "little") + b"{\xff}     ", "UTF-8 JSON"),
    "bad json": ((8).to_bytes(8, "little") + b"{'a':1} ", "UTF-8 JSON"),
    "not an object": ((8).to_bytes(8, "little") + b"[1,2]   ", "not an object"),
    "truncated data": (handmade(GOOD, DATA[:12]), "'b'.*truncated"),        # issue 37: names the tensor
    "truncated in the first": (handmade(GOOD, DATA[:5]), "'a'.*truncated"),
    "truncated at a boundary": (handmade(GOOD, DATA[:8]), "'b'.*truncated"),
    "trailing data": (handmade(GOOD, DATA + b"x"), "file holds 17"),
    "unknown dtype": (handmade(_with("b", dtype="Q7"), DATA), "'b'.*unknown dtype"),
    "overlap": (handmade(_with("b", data_offsets=[4, 12]), DATA[:12]), "'b'.*overlap|'b'.*needs"),
    "overlap same size": (handmade(_with("b", dtype="I32", data_offsets=[4, 8]), DATA[:8]), "'b'.*overlap"),
    "gap": (handmade(_with("b", data_offsets=[9, 17]), DATA + b"x"), "'b'.*gap"),
    "offsets out of range": (handmade(_with("b", data_offsets=[8, 24]), DATA), "'b'.*needs"),
    "offsets reversed": (handmade(_with("a", data_offsets=[8, 0]), DATA), "'a'.*data_offsets"),
    "shape mismatch": (handmade(_with("a", shape=[3]), DATA), "'a'.*needs 12 bytes"),
    "negative dim": (handmade(_with("a", shape=[-2]), DATA), "'a'.*shape"),
    "float dim": (handmade(_with("a", shape=[2.0]), DATA), "'a'.*shape"),
    "missing key": (handmade({"a": {"dtype": "F32", "shape": [2]}}, DATA[:8]), "'a'.*data_offsets"),
    "entry not an object": (handmade({"a": [1]}, b""), "'a'"),
    "bad metadata": (handmade(GOOD, DATA, metadata={"k": 3}), "__metadata__"),
    "duplicate name": ((len(b'{"a":1,"a":2}   ').to_bytes(8, "little") + b'{"a":1,"a":2}   '), "'a'.*twice"),
    "f4 not whole bytes": (handmade({"f": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, bytes(2)), "'f'"),
}


@pytest.mark.parametrize("case", list(CORRUPT), ids=list(CORRUPT))
def test_corrupt_file_raises_serialization_error_naming_file_and_tensor(tmp_path, case):
    raw, msg = CORRUPT[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw)
    with pytest.raises(lc.SerializationError, match=f"bad.safetensors:.*({msg})") as e:
        lc.load_safetensors(path)
    assert isinstance(e.value, ValueError)


def test_missing_file_raises_serialization_error(tmp_path):
    with pytest.raises(lc.SerializationError, match="nope.st"):
        lc.load_safetensors(tmp_path / "nope.st")


def _fuzz_base():
    arrays = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "ids": np.array([1, 2], np.int64),
              "h": np.arange(5, dtype=np.float16), "u": np.arange(3, dtype=np.uint8)}
    buf = io.BytesIO(safetensors.numpy.save(arrays, metadata={"m": "v"}))
    return buf.getvalue()


FUZZ_BASE = _fuzz_base()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, len(FUZZ_BASE) - 1), st.integers(1, 255)), max_size=3),
       cut=st.one_of(st.none(), st.integers(0, len(FUZZ_BASE))))
def test_fuzzed_file_gives_the_packages_tensors_or_serialization_error(tmp_path, flips, cut):
    raw = bytearray(FUZZ_BASE)
    for pos, x in flips:
        raw[pos] ^= x
    raw = bytes(raw[:cut] if cut is not None else raw)
    path = tmp_path / "fuzz.st"
    path.write_bytes(raw)
    try:
        got = lc.load_safetensors(path)
    except lc.SerializationError:
        return
    ref = dict(safetensors.deserialize(raw))       # we accepted it: the package must agree exactly
    assert sorted(got) == sorted(ref)
    for k, t in got.items():
        assert list(t.shape) == ref[k]["shape"]
        code = lc.serialization.CODES[ref[k]["dtype"]]
        if code.lc is not t.dtype or code.bits in (4, 6):   # (a flipped name of another dtype; packed bits)
            continue
        stored = np.frombuffer(bytes(ref[k]["data"]), code.stored)
        if stored.dtype == t.dtype.numpy:
            assert t.numpy().tobytes() == stored.tobytes()
        else:           # a code lc widens (U16 -> u32, I8 -> i16, ...): the same values
            np.testing.assert_array_equal(t.numpy().reshape(-1), stored.astype(t.dtype.numpy))


# ---- npz ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dt", ALL_DTYPES, ids=dt_ids(ALL_DTYPES))
def test_npz_round_trip_keeps_every_dtype(tmp_path, dt):
    ts = {"m": sample(dt, (3, 4), "npz"), "s": sample(dt, (), "npz"), "e": sample(dt, (0, 2), "npz")}
    path = tmp_path / "x.npz"
    lc.save_npz({k: lc.tensor(v) for k, v in ts.items()}, path)
    back = lc.load_npz(path)
    assert sorted(back) == sorted(ts)
    for k, v in ts.items():
        assert back[k].dtype is dt
        assert_same(back[k], v)


def test_npz_from_numpy_savez_loads_with_numpy_dtypes(tmp_path):
    path = tmp_path / "n.npz"
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    np.savez(path, f=f, b=np.array([True, False]), i8=np.array([-3, 4], np.int8), u16=np.array([65535], np.uint16))
    back = lc.load_npz(path)
    assert back["f"].dtype is lc.f64 and back["b"].dtype is lc.u8 and back["i8"].dtype is lc.i16
    assert back["u16"].dtype is lc.u32
    np.testing.assert_array_equal(back["f"].numpy(), f)
    np.testing.assert_array_equal(back["i8"].numpy(), [-3, 4])


def test_npz_saved_file_is_plain_numpy(tmp_path):
    path = tmp_path / "p"          # no .npz suffix: still written exactly there
    lc.save_npz({"x": lc.tensor(np.arange(3, dtype=np.int32)), "h": lc.ones((2,), lc.bf16)}, path)
    z = np.load(path)
    np.testing.assert_array_equal(z["x"], [0, 1, 2])
    assert z["h"].dtype == np.uint16 and "h" in json.loads(str(z["__lazycandle_dtypes__"]))


@pytest.mark.parametrize("case", ["garbage", "truncated", "complex", "bad dtype table"])
def test_corrupt_npz_raises_serialization_error(tmp_path, case):
    path = tmp_path / "bad.npz"
    if case == "garbage":
        path.write_bytes(b"not a zip file at all")
    elif case == "complex":
        np.savez(path, c=np.ones(2, np.complex64))
    elif case == "bad dtype table":
        np.savez(path, x=np.ones(2, np.uint16), __lazycandle_dtypes__=np.array('{"x": "f99"}'))
    else:
        lc.save_npz({"x": lc.ones((1000,))}, path)
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(lc.SerializationError, match="bad.npz"):
        lc.load_npz(path)
