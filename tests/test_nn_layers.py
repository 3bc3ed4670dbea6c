"""Layers (Linear, Embedding, LayerNorm, RmsNorm, Conv1d, Conv2d), VarBuilder and VarMap against
NumPy."""
import math
import os

import numpy as np
import pytest

import lazycandle as lc

RNG = np.random.default_rng(7)


def f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a, np.float64), b, rtol=tol, atol=tol)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 6), (2, 3, 6), (0, 6), (6,)])
def test_linear(bias, shape):
    lin = lc.nn.Linear(6, 4, bias=bias)
    names = [n for n, _ in lin.named_parameters()]
    assert names == (["weight", "bias"] if bias else ["weight"])
    w = lin.weight.numpy().astype(np.float64)
    assert w.shape == (4, 6) and np.abs(w).max() <= 1 / math.sqrt(6)
    x = f32(*shape)
    ref = x @ w.T + (lin.bias.numpy() if bias else 0)
    close(lin(lc.tensor(x)).numpy(), ref)


def test_linear_params_are_trainable():
    lin = lc.nn.Linear(3, 2)
    x = lc.tensor(f32(4, 3))
    grads = lin(x).sum_all().backward()
    assert len(lin.parameters()) == 2
    close(grads[lin.bias].numpy(), np.full(2, 4.0))
    close(grads[lin.weight].numpy(), np.tile(x.numpy().sum(0), (2, 1)))


def test_embedding():
    emb = lc.nn.Embedding(10, 3)
    w = emb.weight.numpy()
    assert w.shape == (10, 3) and 0.3 < w.std() < 3
    ids = np.array([[1, 9, 0], [3, 3, 2]])
    close(emb(lc.tensor(ids)).numpy(), w[ids], 0)
    with pytest.raises(IndexError):
        emb(lc.tensor([10])).numpy()
    padded = lc.nn.Embedding(5, 3, padding_idx=-1).weight.numpy()
    assert not padded[4].any() and padded[:4].all()


def test_layer_norm_and_rms_norm():
    ln = lc.nn.LayerNorm(8, eps=1e-3)
    close(ln.weight.numpy(), np.ones(8), 0)
    close(ln.bias.numpy(), np.zeros(8), 0)
    x = f32(3, 8).astype(np.float64)
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-3)
    close(ln(lc.tensor(x.astype(np.float32))).numpy(), ref)
    assert [n for n, _ in lc.nn.LayerNorm(8, bias=False).named_parameters()] == ["weight"]
    assert lc.nn.LayerNorm(8, elementwise_affine=False).parameters() == []
    rn = lc.nn.RmsNorm(8)
    close(rn(lc.tensor(x.astype(np.float32))).numpy(), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5))


def np_conv2d(x, w, b, stride, padding, dilation, groups):
    n, c, h, wd = x.shape
    co, cg, kh, kw = w.shape
    x = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    oh = (x.shape[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (x.shape[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, co, oh, ow))
    per = co // groups
    for o in range(co):
        g = o // per
        for i in range(oh):
            for j in range(ow):
                patch = x[:, g * cg:(g + 1) * cg, i * stride[0]:i * stride[0] + dilation[0] * (kh - 1) + 1:dilation[0],
                          j * stride[1]:j * stride[1] + dilation[1] * (kw - 1) + 1:dilation[1]]
                out[:, o, i, j] = (patch * w[o]).sum((1, 2, 3))
    return out + (0 if b is None else b[None, :, None, None])


@pytest.mark.parametrize("kw", [dict(), dict(stride=2, padding=1), dict(padding="same", dilation=2, groups=2),
                                dict(bias=False)])
def test_conv1d(kw):
    conv = lc.nn.Conv1d(4, 6, 3, **kw)
    w = conv.weight.numpy().astype(np.float64)
    assert w.shape == (6, 4 // conv.groups, 3)
    assert np.abs(w).max() <= 1 / math.sqrt(4 // conv.groups * 3)
    x = f32(2, 4, 9)
    b = None if conv.bias is None else conv.bias.numpy()
    ref = np_conv2d(x[:, :, None], w[:, :, None], b, (1, conv.stride[0]), (0, conv.padding[0]),
                    (1, conv.dilation[0]), conv.groups)[:, :, 0]
    close(conv(lc.tensor(x)).numpy(), ref)
    close(conv(lc.tensor(x[0])).numpy(), ref[0])


@pytest.mark.parametrize("kw", [dict(), dict(stride=(2, 1), padding=(1, 0)), dict(groups=2, dilation=2)])
def test_conv2d(kw):
    conv = lc.nn.Conv2d(2, 4, (3, 2), **kw)
    x = f32(2, 2, 7, 6)
    ref = np_conv2d(x, conv.weight.numpy().astype(np.float64), conv.bias.numpy(), conv.stride, conv.padding,
                    conv.dilation, conv.groups)
    close(conv(lc.tensor(x)).numpy(), ref)


def test_conv_bad_arguments():
    with pytest.raises(ValueError, match="groups"):
        lc.nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="padding_mode"):
        lc.nn.Conv1d(3, 4, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="same"):
        lc.nn.Conv1d(3, 4, 2, padding="same")


# ---- VarBuilder / VarMap ------------------------------------------------------------------
def write(path, tensors):
    lc.save_safetensors({k: lc.tensor(v) for k, v in tensors.items()}, path)
    return str(path)


def test_varbuilder_loads_layers_and_records_use(tmp_path):
    w, b = f32(3, 5), f32(3)
    p = write(tmp_path / "m.safetensors", {"enc.lin.weight": w, "enc.lin.bias": b, "extra": f32(2)})
    vb = lc.nn.VarBuilder.from_safetensors(p)
    assert vb.contains("enc.lin.weight") and not vb.contains("nope")
    lin = lc.nn.Linear(5, 3, vb=vb.pp("enc").pp("lin"))
    close(lin.weight.numpy(), w, 0)
    x = f32(2, 5)
    close(lin(lc.tensor(x)).numpy(), x.astype(np.float64) @ w.T + b)
    assert vb.unused() == ["extra"]


def test_varbuilder_errors_name_tensor_and_file(tmp_path):
    p = write(tmp_path / "m.safetensors", {"a.weight": f32(3, 5)})
    vb = lc.nn.VarBuilder.from_safetensors(p)
    with pytest.raises(lc.SerializationError, match=r"a\.bias.*missing") as e:
        vb.pp("a").get((3,), "bias")
    assert "m.safetensors" in str(e.value)
    with pytest.raises(lc.SerializationError, match=r"a\.weight.*\(3, 5\).*\(5, 3\)") as e:
        lc.nn.Linear(3, 5, vb=vb.pp("a"))
    assert "m.safetensors" in str(e.value)
    with pytest.raises(ValueError):                   # SerializationError is a ValueError
        vb.get_unchecked("zzz")


def test_varbuilder_shards_dtype_and_laziness(tmp_path):
    p1 = write(tmp_path / "s1.safetensors", {"x": f32(4)})
    p2 = write(tmp_path / "s2.safetensors", {"y": f32(2, 2), "ids": np.arange(3, dtype=np.int64)})
    vb = lc.nn.VarBuilder.from_safetensors([p1, p2], dtype=lc.bf16)
    assert vb.get((2, 2), "y").dtype is lc.bf16
    assert vb.get_unchecked("ids").dtype is lc.i64                # integers keep their dtype
    assert vb.unused() == ["x"]
    assert lc.nn.VarBuilder.from_safetensors(p1).get((4,), "x").dtype is lc.f32
    p3 = write(tmp_path / "s3.safetensors", {"x": f32(4)})
    with pytest.raises(lc.SerializationError, match="'x'.*also in"):
        lc.nn.VarBuilder.from_safetensors([p1, p3])
    with pytest.raises(lc.SerializationError, match="nothere"):
        lc.nn.VarBuilder.from_safetensors(tmp_path / "nothere.safetensors")


def test_varmap_builder_creates_vars_and_roundtrips(tmp_path):
    vm = lc.nn.VarMap()
    vb = lc.nn.VarBuilder.from_varmap(vm)
    lin = lc.nn.Linear(4, 2, vb=vb.pp("fc"))
    ln = lc.nn.LayerNorm(2, vb=vb.pp("ln"))
    assert sorted(vm.data()) == ["fc.bias", "fc.weight", "ln.bias", "ln.weight"]
    assert lc.nn.Linear(4, 2, vb=vb.pp("fc")).weight is lin.weight       # same Var on a second get
    x = lc.tensor(f32(3, 4))
    grads = ln(lin(x)).sqr().sum_all().backward()
    assert all(grads.get(v) is not None for v in vm.all_vars())
    path = tmp_path / "vm.safetensors"
    vm.save(path)
    saved = {k: v.numpy().copy() for k, v in vm.data().items()}
    vm2 = lc.nn.VarMap()
    lin2 = lc.nn.Linear(4, 2, vb=lc.nn.VarBuilder.from_varmap(vm2).pp("fc"))
    vm2.load(path)
    close(lin2.weight.numpy(), saved["fc.weight"], 0)                # updated in place
    assert sorted(vm2.data()) == sorted(saved)
    grads = lin2(x).sum_all().backward()                               # still trainable after load
    assert grads.get(lin2.weight) is not None
    bad = lc.nn.VarMap()
    lc.nn.Linear(3, 2, vb=lc.nn.VarBuilder.from_varmap(bad).pp("fc"))
    with pytest.raises(lc.SerializationError, match="fc.weight"):
        bad.load(path)
    assert os.path.getsize(path) > 0
