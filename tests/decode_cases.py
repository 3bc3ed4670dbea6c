"""The decode step the named-dim binding tests run: attention of q (m, D) against a KV cache
K, V of ("L", D), and feeds for one (m, L)."""
import numpy as np

import lazycandle as lc

D = 64


def attention(q, k, v):
    return lc.nn.softmax_last_dim((q @ k.transpose(0, 1)) * 0.125) @ v


def decode_program(rows="m"):
    return lc.compile(attention(lc.placeholder("q", (rows, D)), lc.placeholder("k", ("L", D)),
                                lc.placeholder("v", ("L", D))))


def decode_feeds(m, L, seed=0):
    r = np.random.default_rng(seed + 1000 * m + L)
    return {"q": r.standard_normal((m, D)).astype(np.float32), "k": r.standard_normal((L, D)).astype(np.float32),
            "v": r.standard_normal((L, D)).astype(np.float32)}
