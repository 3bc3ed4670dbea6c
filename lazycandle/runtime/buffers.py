"""Buffer allocation.  Buffers are 1-D numpy arrays (numpy is the storage container)."""
from __future__ import annotations

import numpy as np


def alloc(n: int, dtype) -> np.ndarray:
    return np.empty(n, dtype=dtype.numpy)
