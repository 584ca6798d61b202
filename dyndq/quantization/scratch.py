"""Per-thread scratch arrays, reused from block to block of a weight.

Why: a block's temporaries (a few hundred KiB each) are above the C library's threshold for
mapping fresh pages, so NumPy's new arrays are mapped and unmapped at every block, and every
page touched faults (on a shared virtual machine the faults cost more than the arithmetic:
`dyndq quantize --method rtn` spent most of its time in them).  A block's passes write into
these instead, `out=`.  Each thread has its own, so blocks run at once; the arrays live as
long as their thread (the quantizer's pool ends with each weight), and each holds at most one
block.
"""
from __future__ import annotations

import math
import threading

import numpy as np

_local = threading.local()


def scratch(name: str, shape, dtype) -> np.ndarray:
    """A contiguous array of `shape` and `dtype`, this thread's `name`, contents undefined:
    the same memory as the last call with that name, grown when it is too small.  A caller
    never holds two arrays of one name at once, nor returns one (it is overwritten later)."""
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    pool = getattr(_local, "arrays", None)
    if pool is None:
        pool = _local.arrays = {}
    raw = pool.get(name)
    if raw is None or raw.size < size:
        raw = pool[name] = np.empty(max(size, 1), np.uint8)
    return raw[:size].view(dtype).reshape(shape)


def release() -> None:
    """Drop this thread's scratch arrays (a caller's own thread, once its weight is done)."""
    _local.arrays = {}
