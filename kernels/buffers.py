"""A bounded pool of output buffers, reused once the arrays handed out are dropped.

Why: a fresh 64 MiB output costs its first-touch page faults (about as much as the
whole dequantization, on the machines measured), which ONNX Runtime's arena or
CuPy's memory pool never pay twice.  Reusing a freed buffer makes an allocating
call cost what an out= call does.

How a buffer is known to be free: each buffer is a 1-D uint8 array that owns its
memory, and every array handed out is a view of it.  NumPy points every view of a
view (and every memoryview, frombuffer, ...) back at that owner, so while anything
can still reach the memory, the owner's reference count is above the pool's own
references.  A weakref finalizer on the handed-out array would not do: a slice of it
outlives it while pointing at the owner only.

    DYNDQ_BUFFER_POOL=0    turns the pool off (checked at each allocation)
    POOL.set_limit(bytes)  the most the pool holds, lent and idle (default 256 MiB)
    POOL.free_all_blocks() forgets every buffer: idle ones are freed at once, lent
                           ones when their arrays are dropped
"""
from __future__ import annotations

import math
import os
import sys
import threading

import numpy as np

from .parallel import switched_off

__all__ = ["BufferPool", "POOL", "POOL_ENV", "empty", "free_all_blocks"]

POOL_ENV = "DYNDQ_BUFFER_POOL"


def _refs(blocks: list, i: int) -> int:
    return sys.getrefcount(blocks[i])


# what _refs says of a buffer only the pool's list holds (measured: it differs by Python version)
_IDLE_REFS = _refs([np.empty(1, np.uint8)], 0)


class BufferPool:
    """Idle and lent buffers, oldest first; thread-safe."""

    def __init__(self, limit: int = 256 << 20, min_bytes: int = 1 << 20):
        self.limit = int(limit)
        self.min_bytes = int(min_bytes)  # smaller arrays: NumPy's allocator is cheap enough
        self._blocks: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialized C-contiguous array, like numpy.empty, on a reused buffer when one is free."""
        dtype = np.dtype(dtype)
        shape = tuple(shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.min_bytes or nbytes > self.limit or switched_off(POOL_ENV):
            return np.empty(shape, dtype)
        with self._lock:  # the view is made before the lock is let go: no other caller sees it idle
            blocks = self._blocks
            for i in range(len(blocks)):
                if blocks[i].nbytes == nbytes and _refs(blocks, i) <= _IDLE_REFS:
                    block = blocks.pop(i)
                    blocks.append(block)  # most recently used last
                    self.hits += 1
                    return block.view(dtype).reshape(shape)
            self._trim(self.limit - nbytes)
            if self.held_bytes() + nbytes > self.limit:  # lent buffers fill the pool
                return np.empty(shape, dtype)
            block = np.empty(nbytes, np.uint8)
            blocks.append(block)
            self.misses += 1
            return block.view(dtype).reshape(shape)

    def held_bytes(self) -> int:
        return sum(b.nbytes for b in self._blocks)

    def idle_bytes(self) -> int:
        with self._lock:
            return sum(self._blocks[i].nbytes for i in range(len(self._blocks)) if _refs(self._blocks, i) <= _IDLE_REFS)

    def set_limit(self, nbytes: int) -> None:
        """Hold at most nbytes from now on; idle buffers beyond it are freed now."""
        with self._lock:
            self.limit = int(nbytes)
            self._trim(self.limit)

    def free_all_blocks(self) -> None:
        """Forget every buffer: idle ones are freed now, lent ones when their arrays are dropped."""
        with self._lock:
            self._blocks.clear()

    def _trim(self, keep: int) -> None:
        """Free idle buffers, oldest first, until at most `keep` bytes are held (lock held)."""
        blocks = self._blocks
        held = self.held_bytes()
        i = 0
        while held > keep and i < len(blocks):
            if _refs(blocks, i) <= _IDLE_REFS:
                held -= blocks.pop(i).nbytes
            else:
                i += 1

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


POOL = BufferPool()
empty = POOL.empty
free_all_blocks = POOL.free_all_blocks

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL._after_fork)
