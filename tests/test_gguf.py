"""GGUF read / write: round trips, files of the `gguf` package read back (and ours read by it, byte
for byte what its writer writes), zero-copy loading, truncated / corrupt files."""
import struct

import numpy as np
import pytest

import lazycandle as lc

f32 = np.float32


def _tensors(rng):
    w = rng.standard_normal((8, 256)).astype(f32)
    out = {k: lc.quantize(lc.tensor(w), k) for k in ("q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k")}
    out["f32"] = lc.tensor(rng.standard_normal((3, 5)).astype(f32))
    out["f16"] = lc.tensor(w[:2, :7]).to_dtype(lc.f16)
    out["bf16"] = lc.tensor(w[:4, :3]).to_dtype(lc.bf16)
    out["f64"] = lc.tensor(np.arange(6.0).reshape(1, 2, 3))
    out["i32"] = lc.tensor(np.arange(-3, 4, dtype=np.int32))
    out["i64"] = lc.tensor(np.arange(4, dtype=np.int64).reshape(2, 1, 1, 2))
    out["scalar"] = lc.tensor(np.float32(2.5))
    return out


META = {"general.architecture": "llama", "llama.block_count": 16, "flag": True, "neg": -5, "big": 1 << 40,
        "llama.rope.freq_base": 10000.0, "u8": np.uint8(7), "f64": np.float64(0.1), "i16": np.int16(-2),
        "tokens": ["<s>", "héllo", ""], "scores": [0.5, -1.25], "ids": [1, 2, 3], "nested": [[1, 2], [3]],
        "arr": np.arange(5, dtype=np.int64)}


def _same(a, b):
    if isinstance(a, lc.QTensor):
        assert isinstance(b, lc.QTensor) and (a.kind, a.shape) == (b.kind, b.shape) and a.data() == b.data()
    else:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))


def test_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    ts = _tensors(rng)
    p = tmp_path / "m.gguf"
    lc.save_gguf(p, ts, META)
    got, meta = lc.load_gguf(p)
    assert list(got) == list(ts)
    for k in ts:
        _same(ts[k], got[k])
    assert meta["llama.block_count"] == 16 and meta["llama.block_count"].dtype == np.uint32
    assert meta["neg"].dtype == np.int32 and meta["big"].dtype == np.uint64 and meta["flag"] is True
    assert meta["llama.rope.freq_base"].dtype == np.float32 and meta["f64"].dtype == np.float64
    assert meta["tokens"] == META["tokens"] and [list(a) for a in meta["nested"]] == [[1, 2], [3]]
    np.testing.assert_array_equal(meta["scores"], np.array([0.5, -1.25], f32))
    np.testing.assert_array_equal(meta["arr"], META["arr"])
    lc.save_gguf(tmp_path / "again.gguf", got, meta)             # load -> save: the same bytes
    assert (tmp_path / "again.gguf").read_bytes() == p.read_bytes()
    assert got["q4_0"].dequantize().shape == (8, 256)


def test_zero_copy_views(tmp_path):
    rng = np.random.default_rng(1)
    p = tmp_path / "m.gguf"
    lc.save_gguf(p, {"w": lc.quantize(lc.tensor(rng.standard_normal((4, 64)).astype(f32)), "q8_0"),
                     "b": lc.tensor(np.ones(64, f32))})
    got, _ = lc.load_gguf(p)
    buf = got["w"].buffer()
    assert not buf.flags.writeable and not buf.flags.owndata
    assert not got["b"].numpy().flags.owndata


def test_alignment(tmp_path):
    p = tmp_path / "m.gguf"
    lc.save_gguf(p, {"a": lc.tensor(np.ones(3, f32)), "b": lc.tensor(np.arange(5, dtype=np.int32))},
                 {"general.alignment": 64})
    got, meta = lc.load_gguf(p)
    assert meta["general.alignment"] == 64
    np.testing.assert_array_equal(got["b"].numpy(), np.arange(5))
    with pytest.raises(lc.SerializationError, match="alignment"):
        lc.save_gguf(tmp_path / "x.gguf", {}, {"general.alignment": 48})


def test_gguf_package_interop(tmp_path):
    gguf = pytest.importorskip("gguf")
    from gguf import quants
    rng = np.random.default_rng(2)
    w = rng.standard_normal((16, 256)).astype(f32)
    p = tmp_path / "theirs.gguf"
    wr = gguf.GGUFWriter(str(p), "llama")
    wr.add_uint32("llama.block_count", 2)
    wr.add_float32("llama.rope.freq_base", 500000.0)
    wr.add_array("tokenizer.ggml.tokens", ["a", "b"])
    wr.add_array("tokenizer.ggml.token_type", [1, 3])
    wr.add_tensor("w.f32", w)
    wr.add_tensor("w.f16", w.astype(np.float16))
    wr.add_tensor("ids.i8", np.array([-128, 0, 127], np.int8))
    wr.add_tensor("ids.i32", np.arange(5, dtype=np.int32))
    qs = {}
    for k in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K"):
        qt = getattr(gguf.GGMLQuantizationType, k)
        raw = quants.quantize(w, qt) if k[-1] != "K" else np.frombuffer(
            lc.quantize(lc.tensor(w), k.lower()).data(), np.uint8).reshape(16, -1)
        qs[k] = raw
        wr.add_tensor(f"w.{k}", raw, raw_dtype=qt)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    got, meta = lc.load_gguf(p)
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 2
    assert meta["tokenizer.ggml.tokens"] == ["a", "b"]
    np.testing.assert_array_equal(got["w.f32"].numpy(), w)
    np.testing.assert_array_equal(got["w.f16"].numpy(), w.astype(np.float16))
    assert got["ids.i8"].dtype == lc.i16 and got["ids.i8"].numpy().tolist() == [-128, 0, 127]
    assert got["ids.i32"].dtype == lc.i32 and got["ids.i32"].numpy().tolist() == list(range(5))
    for k, raw in qs.items():
        q = got[f"w.{k}"]
        assert q.kind == k.lower() and q.shape == (16, 256)
        assert q.data() == raw.tobytes()
        np.testing.assert_array_equal(q.dequantize().numpy(), quants.dequantize(raw, getattr(gguf.GGMLQuantizationType, k)))
    ours = tmp_path / "ours.gguf"
    del got["ids.i8"]                                           # (loaded as i16: GGUF I16 on save)
    lc.save_gguf(ours, got, meta)
    r = gguf.GGUFReader(str(ours))
    assert [t.name for t in r.tensors] == list(got)
    same = tmp_path / "same.gguf"
    wr2 = gguf.GGUFWriter(str(same), "llama")
    for k, v in meta.items():
        if k != "general.architecture":
            {np.uint32: wr2.add_uint32, np.float32: wr2.add_float32}.get(type(v), wr2.add_array)(k, v if not
                isinstance(v, np.ndarray) else v.tolist())
    for name, t in got.items():
        if isinstance(t, lc.QTensor):
            wr2.add_tensor(name, np.frombuffer(t.data(), np.uint8).reshape(t.shape[0], -1),
                           raw_dtype=getattr(gguf.GGMLQuantizationType, t.kind.upper()))
        else:
            wr2.add_tensor(name, np.asarray(t.numpy()))
    wr2.write_header_to_file()
    wr2.write_kv_data_to_file()
    wr2.write_tensors_to_file()
    wr2.close()
    assert ours.read_bytes() == same.read_bytes()               # what GGUFWriter writes
    r = gguf.GGUFReader(str(ours))
    names = {t.name: t for t in r.tensors}
    np.testing.assert_array_equal(names["w.f32"].data, w)
    assert bytes(names["w.Q4_K"].data.reshape(-1)) == qs["Q4_K"].tobytes()


def _file(tmp_path):
    p = tmp_path / "m.gguf"
    lc.save_gguf(p, {"tok_embd": lc.tensor(np.ones((2, 32), f32)),
                     "blk.0.w": lc.quantize(lc.tensor(np.ones((2, 64), f32)), "q4_0")}, {"k": "v"})
    return p, bytearray(p.read_bytes())


def test_truncated_and_corrupt(tmp_path):
    p, raw = _file(tmp_path)
    bad = tmp_path / "bad.gguf"
    for cut in (0, 3, 10, 30, 60, 100, len(raw) - 40, len(raw) - 1):
        bad.write_bytes(raw[:cut])
        with pytest.raises(lc.SerializationError):
            lc.load_gguf(bad)
    bad.write_bytes(raw[:len(raw) - 1])
    with pytest.raises(lc.SerializationError, match="blk.0.w"):
        lc.load_gguf(bad)
    bad.write_bytes(b"GGML" + raw[4:])
    with pytest.raises(lc.SerializationError, match="magic"):
        lc.load_gguf(bad)
    at = raw.index(b"blk.0.w") + len(b"blk.0.w") + 4 + 16          # its ggml type
    for gtype, what in ((99, "unknown"), (10, "unknown")):        # 10: q2_K, not supported here
        b2 = bytearray(raw)
        b2[at:at + 4] = struct.pack("<I", gtype)
        bad.write_bytes(b2)
        with pytest.raises(lc.SerializationError, match=r"blk\.0\.w"):
            lc.load_gguf(bad)
    b2 = bytearray(raw)
    b2[at - 16:at - 8] = struct.pack("<Q", 48)                   # inner dim 48: not whole q4_0 blocks
    bad.write_bytes(b2)
    with pytest.raises(lc.SerializationError, match=r"blk\.0\.w.*|multiple"):
        lc.load_gguf(bad)
    b2 = bytearray(raw)
    b2[raw.index(b"k") + 1:raw.index(b"k") + 5] = struct.pack("<I", 77)   # unknown metadata type
    bad.write_bytes(b2)
    with pytest.raises(lc.SerializationError, match="type"):
        lc.load_gguf(bad)
    with pytest.raises(lc.SerializationError):
        lc.load_gguf(tmp_path / "missing.gguf")


def test_save_errors(tmp_path):
    with pytest.raises(lc.SerializationError, match="u8"):
        lc.save_gguf(tmp_path / "x.gguf", {"t": lc.tensor(np.ones(2, np.uint8))})
    with pytest.raises(lc.SerializationError, match="meta"):
        lc.save_gguf(tmp_path / "x.gguf", {}, {"meta": object()})
