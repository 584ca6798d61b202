"""Blocks and threads for NumPy kernels, with nothing particular to any op.

A kernel cuts its work into blocks of about `TUNING.chunk` elements (small enough
to stay in a core's cache between its passes), and `run` shares the blocks among
threads: NumPy's loops release the GIL, so the threads really run at once.

Every knob lives in the one `TUNING` object; tests and benchmarks change it for a
while with `tuned(...)` instead of patching a module's private names.
"""
from __future__ import annotations

import dataclasses
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

__all__ = ["Tuning", "TUNING", "tuned", "cores", "threads_for", "blocks", "bufsize_for", "run", "reset_pool", "THREADS_ENV",
           "NATIVE_ENV", "switched_off"]

THREADS_ENV = "DYNDQ_NUM_THREADS"
NATIVE_ENV = "DYNDQ_NATIVE"


def switched_off(env: str) -> bool:
    """Whether the environment variable `env` turns its switch off ("0", "off", "false", "no")."""
    return os.environ.get(env, "").lower() in {"0", "off", "false", "no"}


@dataclasses.dataclass
class Tuning:
    """The knobs of the blocked, threaded kernels (read at every call)."""

    chunk: int = 1 << 18  # elements per block: 1 MiB of float32 output, resident in a core's L2
    parallel_min: int = 1 << 18  # below this many elements, no thread pool
    narrow_chunk: int = 1 << 16  # elements per block with float16/bfloat16 output (more passes, in L2)
    small: int = 1 << 15  # up to this many elements: one shot, no blocks
    cores: int | None = None  # None: the cores this process may run on (sched_getaffinity)
    # outputs of at least this many bytes are written past the cache (kernels/_native.c, emit)
    stream_min: int = 8 << 20
    # the compiled kernel (kernels/native.py) when built; DYNDQ_NATIVE=0 starts with it off
    native: bool = dataclasses.field(default_factory=lambda: not switched_off(NATIVE_ENV))


TUNING = Tuning()


@contextmanager
def tuned(**changes):
    """Change some knobs of TUNING for the duration of a `with` block (not thread-local:
    meant for tests and benchmarks)."""
    fields = {f.name for f in dataclasses.fields(Tuning)}
    unknown = set(changes) - fields
    if unknown:
        raise TypeError(f"unknown tuning knob(s) {sorted(unknown)}; known: {sorted(fields)}")
    saved = {k: getattr(TUNING, k) for k in changes}
    for k, v in changes.items():
        setattr(TUNING, k, v)
    try:
        yield TUNING
    finally:
        for k, v in saved.items():
            setattr(TUNING, k, v)


def cores() -> int:
    if TUNING.cores is not None:
        return max(1, int(TUNING.cores))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_for(size: int, n_blocks: int, threads: int | None) -> int:
    """How many threads (the caller's included) share `n_blocks` blocks of a `size`-element job."""
    if size < TUNING.parallel_min or n_blocks < 2:
        return 1
    n = cores()
    if threads is None:
        env = os.environ.get(THREADS_ENV)
        if env:
            try:
                threads = max(1, int(env))
            except ValueError:
                threads = None
    if threads is not None:
        n = min(n, int(threads))
    return max(1, min(n, n_blocks))


def blocks(shape, chunk: int) -> list[tuple]:
    """Index tuples cutting an array of `shape` into blocks of about `chunk` elements."""
    r = len(shape)
    k, inner = r - 1, 1
    while k > 0 and inner * shape[k] <= chunk:
        inner *= shape[k]
        k -= 1
    # now inner = prod(shape[k+1:]) <= chunk (or k == r - 1 and inner == 1)
    step = max(1, chunk // inner)
    starts = range(0, shape[k], step)
    return [outer + (slice(s, s + step),) for outer in np.ndindex(*shape[:k]) for s in starts]


def bufsize_for(row: int) -> int:
    """NumPy buffers a broadcast operand across rows shorter than its buffer, slowly;
    a buffer no longer than a row keeps every inner loop a plain 1-D loop."""
    return max(16, min(8192, row // 16 * 16))


def run(work, count: int, n_threads: int) -> None:
    """work(start, stop) over blocks [0, count), in n_threads contiguous ranges: the
    first on the calling thread, the others on the shared pool. Exceptions propagate."""
    if n_threads <= 1 or count < 2:
        work(0, count)
        return
    per = -(-count // n_threads)
    bounds = [(i, min(i + per, count)) for i in range(0, count, per)]
    futures = _submit([(work, a, b) for a, b in bounds[1:]])
    try:
        work(*bounds[0])
    finally:
        for f in futures:
            f.result()


# -- the shared pool ---------------------------------------------------------------------------

_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _submit(jobs):
    """Submit every job to a pool with at least len(jobs) workers, under the lock.

    Growing the pool replaces it; the old one is shut down (its queued work still
    runs). The lock is held from choosing the pool to the last submit, so no caller
    ever submits to a pool another caller has just shut down."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < len(jobs):
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="dyndq")
            _pool_size = len(jobs)
            if old is not None:
                old.shutdown(wait=False)
        return [_pool.submit(fn, *args) for fn, *args in jobs]


def reset_pool() -> None:
    """Forget the shared pool (its threads end once idle); the next parallel call makes a
    new one. Done in a forked child, whose copy of the pool has no threads."""
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=reset_pool)
