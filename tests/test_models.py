"""The machinery under lc.models' causal LMs (the models themselves and their Hugging Face
folders are tested in test_hf_models.py): KV-cache decode steps write their new rows into the
cache's own buffers, seeded random presets (the `--random-weights` command lines) generate
deterministically, top-k / top-p sampling only picks allowed tokens, slice_set with a runtime
start (the compiled decode step's cache update), and bad input."""
from __future__ import annotations

import numpy as np
import pytest

import lazycandle as lc
from lazycandle.models import Sampler, Session, gpt2, llama
from lazycandle.models.generation import Step
from lazycandle.models.sampling import candidates
from lazycandle.models.textgen import random_model

RTOL, ATOL = 2e-4, 2e-4
PROMPT = [72, 101, 108, 108, 111, 33, 7]
NEXT = [200, 3, 77, 128, 9]


@pytest.fixture(scope="module")
def tiny_gpt2():
    return random_model(gpt2, gpt2.PRESETS["tiny"], seed=1)[0]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled-decode", "eager-decode"])
def test_kv_cache_steps_write_new_rows_into_the_same_buffers(tiny_gpt2, compiled):
    session = Session(tiny_gpt2, 1, 32, compiled=compiled)
    cache = session.cache
    addrs = [t._node.buffer.ctypes.data for t in cache.tensors()]
    session.prefill([PROMPT])
    for tok in NEXT:
        session.decode([tok])
    assert [t._node.buffer.ctypes.data for t in cache.tensors()] == addrs
    n = len(PROMPT) + len(NEXT)
    full = tiny_gpt2.new_cache(1, 32)
    tiny_gpt2.forward(lc.tensor(np.array([PROMPT + NEXT], np.int64)), full, Step(0, n))
    full.commit(0)
    for got, want in zip(cache.tensors(), full.tensors()):
        np.testing.assert_allclose(got.numpy()[:, :, :n], want.numpy()[:, :, :n], rtol=RTOL, atol=ATOL)
        assert not got.numpy()[:, :, n:].any()


def test_seeded_random_presets_repeat():
    a = random_model(llama, llama.PRESETS["tiny"], seed=3)[0]
    b = random_model(llama, llama.PRESETS["tiny"], seed=3)[0]
    s = Sampler(temperature=1.0, top_p=0.9, seed=7)
    first = a.generate(PROMPT, 6, s)
    assert first == b.generate(PROMPT, 6, Sampler(temperature=1.0, top_p=0.9, seed=7))
    assert len(first) == 6 and all(0 <= t < 320 for t in first)
    assert a.generate(PROMPT, 4) == b.generate(PROMPT, 4)


# ---- sampling ------------------------------------------------------------------------------
LOGITS = np.array([0.5, 3.0, -1.0, 2.5, 0.0, 2.9, -3.0, 1.0], np.float32)


def test_top_k_only_picks_the_k_largest():
    s = Sampler(temperature=1.5, top_k=3, seed=0)
    picks = {s(lc.tensor(LOGITS)) for _ in range(60)}
    assert picks <= {1, 3, 5} and len(picks) > 1


def test_top_p_only_picks_the_smallest_set_reaching_p():
    p = np.exp(LOGITS - LOGITS.max()) / np.exp(LOGITS - LOGITS.max()).sum()
    order = np.argsort(-p)
    before = np.cumsum(p[order]) - p[order]
    allowed = set(order[before < 0.6].tolist())
    s = Sampler(temperature=1.0, top_p=0.6, seed=1)
    picks = {s(lc.tensor(LOGITS)) for _ in range(60)}
    assert picks <= allowed and len(picks) > 1


def test_candidates_keep_sorted_probabilities_and_zero_outside_top_p():
    probs, ids = candidates(lc.tensor(LOGITS), 1.0, top_k=0, top_p=0.6)
    probs, ids = probs.numpy(), ids.numpy()
    assert ids.tolist() == np.argsort(-LOGITS, kind="stable").tolist()
    kept = probs > 0
    assert kept[0] and not kept[-1] and (np.diff(kept.astype(int)) <= 0).all()


def test_greedy_is_argmax_and_bad_sampler_settings_raise():
    assert Sampler()(lc.tensor(LOGITS)) == 1
    with pytest.raises(ValueError):
        Sampler(top_p=0.0)
    with pytest.raises(ValueError):
        Sampler(temperature=-1.0)


# ---- slice_set with a runtime start (the compiled decode step's cache update) ------------------
@pytest.mark.parametrize("n", [1, 3])
def test_slice_set_with_a_tensor_start_matches_numpy(n):
    a = np.arange(2 * 7 * 3, dtype=np.float32).reshape(2, 7, 3)
    src = -np.arange(2 * n * 3, dtype=np.float32).reshape(2, n, 3) - 1
    x, p = lc.placeholder("x", a.shape), lc.placeholder("p", (1,), lc.i64)
    prog = lc.compile([x.slice_set(lc.tensor(src), 1, p)])
    for start in range(0, 8 - n):
        ref = a.copy()
        ref[:, start:start + n] = src
        np.testing.assert_array_equal(prog.run(x=a, p=np.array([start]))[0], ref)
        np.testing.assert_array_equal(lc.tensor(a).slice_set(lc.tensor(src), 1, lc.tensor([start])).numpy(), ref)


def test_slice_set_one_position_reuses_its_kernels_for_new_starts():
    cache = lc.zeros((1, 2, 16, 4)).realize()
    row = lc.ones((1, 2, 1, 4))
    cache.slice_set(row, 2, 0).realize()
    before = lc.cache_info()["kernels"]
    for start in range(1, 16):
        got = cache.slice_set(row, 2, start).numpy()
        assert got[0, :, start].min() == 1 and got.sum() == 8
    assert lc.cache_info()["kernels"] == before


def test_slice_set_bad_tensor_start_is_a_type_error():
    with pytest.raises(TypeError):
        lc.zeros((4, 3)).slice_set(lc.ones((1, 3)), 0, lc.tensor([1.0]))
    with pytest.raises(lc.NarrowInvalidArgs):
        lc.zeros((2, 3)).slice_set(lc.ones((3, 3)), 0, lc.tensor([0]))


# ---- bad input and the command line --------------------------------------------------------------
def test_token_ids_out_of_range_raise_index_out_of_bounds_in_prefill_and_compiled_decode(tiny_gpt2):
    vocab = tiny_gpt2.config.vocab
    with pytest.raises(lc.IndexOutOfBounds):
        Session(tiny_gpt2, 1, 16).prefill([[1, vocab]])
    session = Session(tiny_gpt2, 1, 16)
    session.prefill([[1, 2]])
    with pytest.raises(lc.IndexOutOfBounds):
        session.decode([vocab + 3])


def test_decoding_past_the_cache_raises(tiny_gpt2):
    session = Session(tiny_gpt2, 1, 3)
    session.prefill([[1, 2, 3]])
    with pytest.raises(lc.IndexOutOfBounds, match="max_len"):
        session.decode([4])


@pytest.mark.parametrize("module", [gpt2, llama], ids=["gpt2", "llama"])
def test_command_line_prints_tokens_and_ms_per_token(module, capsys):
    assert module.main(["--random-weights", "--config", "tiny", "--tokens", "5", "--prompt", "hi"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hi")
    assert "prompt tokens: [104, 105]" in err and "new tokens:" in err
    assert "ms/token" in err and "prefill:" in err and "decode:" in err
