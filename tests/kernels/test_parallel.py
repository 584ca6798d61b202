"""The op-agnostic blocks and threads of kernels/parallel.py."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import dyndq
from dyndq.kernels import parallel
from dyndq.kernels.parallel import TUNING, tuned


def test_tuned_restores_and_refuses_unknown_knobs():
    before = TUNING.chunk
    with tuned(chunk=7, cores=3):
        assert TUNING.chunk == 7 and parallel.cores() == 3
    assert TUNING.chunk == before and TUNING.cores is None
    with pytest.raises(TypeError, match="chunk_size"):
        with tuned(chunk_size=1):
            pass


def test_run_covers_every_block_once_and_propagates_errors():
    seen = []
    lock = threading.Lock()

    def work(a, b):
        with lock:
            seen.extend(range(a, b))

    for count in (0, 1, 2, 7, 64):
        for n in (1, 2, 5):
            seen.clear()
            parallel.run(work, count, n)
            assert sorted(seen) == list(range(count))

    def bad(a, b):
        if a > 0:
            raise ValueError("block failed")

    with pytest.raises(ValueError, match="block failed"):
        parallel.run(bad, 8, 4)


def test_threads_env_variable_caps(monkeypatch):
    monkeypatch.setenv(parallel.THREADS_ENV, "1")
    assert parallel.threads_for(10**8, 100, None) == 1
    monkeypatch.setenv(parallel.THREADS_ENV, "64")
    with tuned(cores=2):
        assert parallel.threads_for(10**8, 100, None) == 2
        assert parallel.threads_for(10**8, 100, 1) == 1
        assert parallel.threads_for(100, 100, 2) == 1  # small tensors: no pool


def test_blocks_cover_the_array():
    for shape, chunk in [((10,), 3), ((4, 5, 6), 7), ((3, 1, 2), 100), ((2, 9), 1)]:
        seen = np.zeros(shape, int)
        for idx in parallel.blocks(shape, chunk):
            seen[idx] += 1
        assert (seen == 1).all()


def test_pool_growth_races_no_caller():
    """8 threads dequantize tensors of different sizes, each asking for a different number of
    threads, while the machine reports 16 cores: each call that needs more workers grows the
    shared pool.  Growing it once shut the old pool down while another caller was about to
    submit to it: RuntimeError('cannot schedule new futures after shutdown') in most rounds."""
    errors = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: the window between getting the pool and submitting opens
    try:
        with tuned(cores=16, chunk=1 << 12):
            src = np.zeros(TUNING.parallel_min * 2, np.uint8)
            for _ in range(30):
                parallel.reset_pool()  # a fresh pool each round: it has to grow again
                barrier = threading.Barrier(8)

                def hammer(i):
                    barrier.wait()
                    try:
                        for k in range(3):
                            n = TUNING.parallel_min + 4096 * (i + 1)
                            got = dyndq.dynamic_dequantize(src[:n], np.array([0.5], np.float32), threads=2 + (i + k) % 8)
                            assert got.shape == (n,) and not got.any()
                    except Exception as e:  # noqa: BLE001  (collected and reported below)
                        errors.append(repr(e))

                workers = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
    finally:
        sys.setswitchinterval(old)
    assert not errors, f"{len(errors)} failed calls, e.g. {errors[0]}"
