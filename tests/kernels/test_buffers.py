"""The output buffer pool: reuse after a drop, never while anything can reach the memory."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import dyndq
from dyndq.kernels import buffers
from dyndq.kernels.buffers import BufferPool

from cases import oracle_2, same_bits

MiB = 1 << 20


@pytest.fixture
def pool():
    return BufferPool(limit=16 * MiB, min_bytes=1024)


def addr(a) -> int:
    return a.__array_interface__["data"][0]


def test_a_dropped_array_gives_its_buffer_back(pool):
    a = pool.empty((64, 64), np.float32)
    where = addr(a)
    del a
    b = pool.empty((64, 64), np.float32)
    assert addr(b) == where and pool.hits == 1
    c = pool.empty((4096,), np.float32)  # same bytes, other shape: reused too, once b is gone
    assert addr(c) != where
    del b
    d = pool.empty((16384,), np.uint8)
    assert addr(d) == where and d.shape == (16384,) and d.dtype == np.uint8 and d.flags.c_contiguous


@pytest.mark.parametrize("keep", [
    lambda a: a[1:],  # a slice outlives the array (its base is the pool's buffer)
    lambda a: a.T,
    lambda a: a.view(np.uint32),
    lambda a: memoryview(a),
    lambda a: np.frombuffer(a, np.uint8),
    lambda a: a.reshape(-1)[::3],
    lambda a: [a],
])
def test_anything_that_reaches_the_memory_keeps_it(pool, keep):
    a = pool.empty((64, 64), np.float32)
    held = keep(a)
    del a
    b = pool.empty((64, 64), np.float32)
    target = held[0] if isinstance(held, list) else np.asarray(held)
    assert not np.shares_memory(b, target)
    del held, target, b
    c = pool.empty((64, 64), np.float32)
    assert pool.hits >= 1 and c.base is not None


def test_limit_and_free_all_blocks(pool):
    arrays = [pool.empty((MiB,), np.float32) for _ in range(4)]  # 4 x 4 MiB: the whole 16 MiB
    for k, a in enumerate(arrays):
        a.fill(k)
    assert pool.held_bytes() == 16 * MiB
    extra = pool.empty((MiB,), np.float32)  # over the limit: a plain array, not pooled
    assert pool.held_bytes() == 16 * MiB and extra.base is None
    del arrays[0]
    assert pool.idle_bytes() == 4 * MiB
    pool.set_limit(12 * MiB)  # frees the idle buffer
    assert pool.held_bytes() == 12 * MiB
    pool.free_all_blocks()
    assert pool.held_bytes() == 0 and pool.idle_bytes() == 0
    # lent arrays stay valid after free_all_blocks (filled before; empty memory may hold NaNs)
    assert all(np.all(a == k) for k, a in enumerate(arrays, start=1))
    big = pool.empty((5 * MiB,), np.float32)  # bigger than the limit: plain
    assert big.base is None


def test_other_sizes_evict_idle_buffers_oldest_first(pool):
    a = pool.empty((MiB,), np.float32)
    b = pool.empty((MiB,), np.float32)
    del a, b
    c = pool.empty((3 * MiB,), np.float32)  # 8 MiB idle + 12 MiB needed > 16 MiB: the oldest idle goes
    assert pool.held_bytes() <= 16 * MiB and c.base is not None


def test_small_arrays_and_the_environment_switch(pool, monkeypatch):
    small = pool.empty((10,), np.float32)
    assert small.base is None and pool.held_bytes() == 0
    monkeypatch.setenv(buffers.POOL_ENV, "0")
    a = pool.empty((64, 64), np.float32)
    assert a.base is None and pool.held_bytes() == 0
    monkeypatch.setenv(buffers.POOL_ENV, "1")
    a = pool.empty((64, 64), np.float32)
    assert a.base is not None and pool.held_bytes() == 64 * 64 * 4


def test_threads_never_get_one_buffer_at_once(pool):
    seen = []
    errors = []
    lock = threading.Lock()

    def grab(i):
        try:
            for _ in range(200):
                a = pool.empty((32, 32), np.float32)
                a.fill(i)
                with lock:
                    seen.append(addr(a))
                assert (a == i).all()  # nobody else wrote into it meanwhile
                del a
        except AssertionError as e:
            errors.append(e)

    workers = [threading.Thread(target=grab, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors
    assert pool.hits > 0 and pool.held_bytes() <= 8 * 32 * 32 * 4


def test_the_kernel_allocates_from_the_pool():
    buffers.POOL.free_all_blocks()
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (512, 1024), dtype=np.uint8)  # a 2 MiB float32 output
    scales = rng.random(1024, dtype=np.float32)
    first = dyndq.dynamic_dequantize(src, scales, qtype="per_channel", axis=1)
    where = addr(first)
    keep = first[:1]
    second = dyndq.dynamic_dequantize(src, scales, qtype="per_channel", axis=1)
    assert not np.shares_memory(second, keep)
    del first, keep
    src2 = src[::-1].copy()
    third = dyndq.dynamic_dequantize(src2, scales, qtype="per_channel", axis=1)
    assert addr(third) == where
    assert same_bits(third, oracle_2(src2, scales, None, "per_channel", 1))
    assert same_bits(second, oracle_2(src, scales, None, "per_channel", 1))
    f16 = dyndq.dynamic_dequantize(src, scales.astype(np.float16), qtype="per_channel", axis=1)
    assert same_bits(f16, oracle_2(src, scales.astype(np.float16), None, "per_channel", 1))
    buffers.POOL.free_all_blocks()


def test_a_pickled_copy_is_its_own_and_the_buffer_comes_back(pool):
    import pickle

    a = pool.empty((64, 64), np.float32)
    a.fill(3)
    copy = pickle.loads(pickle.dumps(a))
    del a
    b = pool.empty((64, 64), np.float32)  # the buffer, back: the copy holds memory of its own
    b.fill(7)
    assert pool.hits == 1 and not np.shares_memory(b, copy) and (copy == 3).all()


def test_np_asarray_of_a_result_keeps_it(pool):
    a = pool.empty((64, 64), np.float32)
    same = np.asarray(a)
    del a
    b = pool.empty((64, 64), np.float32)
    assert not np.shares_memory(b, same) and pool.hits == 0


def test_a_result_passed_back_as_out_is_held_while_anything_holds_it():
    buffers.POOL.free_all_blocks()
    src = np.zeros((512, 1024), np.uint8)  # 2 MiB float32 outputs: pooled
    first = dyndq.dynamic_dequantize(src, np.ones(1, np.float32))
    again = dyndq.dynamic_dequantize(src + 1, np.ones(1, np.float32), out=first)
    assert again is first
    del first
    other = dyndq.dynamic_dequantize(src, np.ones(1, np.float32))
    assert not np.shares_memory(other, again) and (again == 1).all()
    where = addr(again)
    del again
    assert addr(dyndq.dynamic_dequantize(src, np.ones(1, np.float32))) == where
    buffers.POOL.free_all_blocks()


def test_ownership_decides_not_reference_counts(pool, monkeypatch):
    """The pool never asks how many references a buffer has (CPython's counts change from one
    version to another, and free-threaded builds defer them): an array in a reference cycle
    keeps its buffer until the cycle collector frees the cycle."""
    import gc
    import sys

    def no(*a):
        raise AssertionError("the pool asked for a reference count")

    monkeypatch.setattr(sys, "getrefcount", no)
    gc.disable()
    try:
        a = pool.empty((64, 64), np.float32)
        cycle = [a]
        cycle.append(cycle)
        del a, cycle
        b = pool.empty((64, 64), np.float32)
        assert pool.hits == 0  # still reachable from the uncollected cycle
        del b
        gc.collect()
        assert pool.idle_bytes() == 2 * 64 * 64 * 4
    finally:
        gc.enable()


def test_an_idle_block_of_the_size_asked_is_found_behind_others(pool):
    """(list.remove compared arrays element by element: a ValueError once two idle blocks of
    other sizes stood before the one taken.)"""
    a, b, c = (pool.empty((n,), np.float32) for n in (1024, 2048, 4096))
    where = addr(c)
    del a, b, c
    d = pool.empty((4096,), np.float32)
    assert addr(d) == where and pool.hits == 1
