"""A bounded pool of output buffers, each given back when the last array over it is gone.

Why: a fresh 64 MiB output costs its first-touch page faults (about as much as the
whole dequantization, on the machines measured), which ONNX Runtime's arena or
CuPy's memory pool never pay twice.  Reusing a freed buffer makes an allocating
call cost what an out= call does.

How a buffer comes back, by ownership (as CuPy's memory pointers do): each lent array
is made over a fresh memoryview of the pool's block, which becomes the root of the
array's chain of bases.  Everything that can reach the memory holds that root, through
the array or a view of it (slices, reshapes, .T, .view(...)), a memoryview or
np.frombuffer of it (which hold the array), or an `out=` of a later call.  A finalizer on
the root puts the block on a queue when the root dies, by object lifetime, whatever the
interpreter (reference counting or a cycle collector, free-threaded or not), never by
counting references; the next allocation takes the queue in.

    DYNDQ_BUFFER_POOL=0    turns the pool off (checked at each allocation)
    POOL.set_limit(bytes)  the most the pool holds, lent and idle (default 256 MiB)
    POOL.free_all_blocks() forgets every buffer: idle ones are freed at once, lent
                           ones when their arrays are dropped
"""
from __future__ import annotations

import collections
import math
import os
import threading
import weakref

import numpy as np

from .parallel import switched_off

__all__ = ["BufferPool", "POOL", "POOL_ENV", "empty", "free_all_blocks"]

POOL_ENV = "DYNDQ_BUFFER_POOL"


class BufferPool:
    """Idle blocks (oldest first) and the bytes lent out; thread-safe."""

    def __init__(self, limit: int = 256 << 20, min_bytes: int = 1 << 20):
        self.limit = int(limit)
        self.min_bytes = int(min_bytes)  # smaller arrays: NumPy's allocator is cheap enough
        self._idle: list[np.ndarray] = []  # uint8 blocks no array reaches
        self._lent = 0  # bytes of the blocks lent in this generation
        # (block, generation) of the lent blocks whose last array is gone: appended by the
        # finalizers (an atomic append, no lock: a finalizer may run inside the pool's own
        # code, wherever an array dies), taken in under the lock
        self._returned: collections.deque = collections.deque()
        self._generation = 0  # free_all_blocks starts a new one: older blocks are not taken back
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def empty(self, shape, dtype) -> np.ndarray:
        """An uninitialized C-contiguous array, like numpy.empty, on a reused buffer when one is free."""
        dtype = np.dtype(dtype)
        shape = tuple(shape)
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if nbytes < self.min_bytes or nbytes > self.limit or switched_off(POOL_ENV):
            return np.empty(shape, dtype)
        with self._lock:
            self._take_back()
            i = next((i for i, b in enumerate(self._idle) if b.nbytes == nbytes), None)
            if i is not None:  # (by position: list.remove would compare arrays element by element)
                block = self._idle.pop(i)
                self.hits += 1
            else:
                self._trim(self.limit - nbytes)
                if self._lent + self._idle_bytes() + nbytes > self.limit:  # lent buffers fill the pool
                    return np.empty(shape, dtype)
                block = np.empty(nbytes, np.uint8)
                self.misses += 1
            self._lent += nbytes
            generation = self._generation
        flat = np.frombuffer(memoryview(block), dtype, count)
        # flat.base is the memoryview NumPy made: the root that everything reaching the memory holds
        weakref.finalize(flat.base, self._returned.append, (block, generation)).atexit = False
        return flat.reshape(shape)

    def held_bytes(self) -> int:
        """Bytes held, lent and idle."""
        with self._lock:
            self._take_back()
            return self._lent + self._idle_bytes()

    def idle_bytes(self) -> int:
        with self._lock:
            self._take_back()
            return self._idle_bytes()

    def set_limit(self, nbytes: int) -> None:
        """Hold at most nbytes from now on; idle buffers beyond it are freed now."""
        with self._lock:
            self.limit = int(nbytes)
            self._take_back()
            self._trim(self.limit)

    def free_all_blocks(self) -> None:
        """Forget every buffer: idle ones are freed now, lent ones when their arrays are dropped."""
        with self._lock:
            self._take_back()
            self._idle.clear()
            self._lent = 0
            self._generation += 1

    def _take_back(self) -> None:
        """Lent blocks whose arrays are gone become idle (lock held); those of an older
        generation are let go."""
        while self._returned:
            block, generation = self._returned.popleft()
            if generation == self._generation:
                self._lent -= block.nbytes
                self._idle.append(block)

    def _idle_bytes(self) -> int:
        return sum(b.nbytes for b in self._idle)

    def _trim(self, keep: int) -> None:
        """Free idle buffers, oldest first, until at most `keep` bytes are held (lock held)."""
        held = self._lent + self._idle_bytes()
        while held > keep and self._idle:
            held -= self._idle.pop(0).nbytes

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


POOL = BufferPool()
empty = POOL.empty
free_all_blocks = POOL.free_all_blocks

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=POOL._after_fork)
