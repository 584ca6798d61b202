"""The compiled RTN levels (kernels/_native.c rtn_levels, kernels/native.py) against the NumPy path
of dyndq/quantization/rtn.py's matmul_levels, byte for byte, each test checking which path ran.

Here, in tests/kernels, so that the Makefile's builds with Clang, without SIMD and with the
sanitizers (test-clang, test-nosimd, test-sanitize) run the C loop too.  That both paths give
ONNX Runtime's very codes is tests/quantization/test_rtn_exact.py's part (it runs the path
this machine takes; tests/quantization/test_quantize.py's rtn test runs both)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dyndq.kernels import native
from dyndq.kernels.parallel import tuned
from dyndq.quantization import rtn as rtn_module

F32 = np.float32
QMAX = [3, 15, 255]  # 2, 4 and 8 bits


class Spy:
    """native.rtn_levels, recording whether each call ran the compiled loop (not None) or left
    the work to NumPy (None)."""

    def __init__(self, monkeypatch):
        self.ran = []
        real = native.rtn_levels

        def spy(*args):
            out = real(*args)
            self.ran.append("compiled" if out is not None else "numpy")
            return out

        monkeypatch.setattr(native, "rtn_levels", spy)


def both_paths(monkeypatch, g, reciprocal, zero, qmax):
    """(compiled, NumPy) levels of matmul_levels, each checked to have run its path."""
    with monkeypatch.context() as patch, np.errstate(all="ignore"):  # (undone after each hypothesis example)
        spy = Spy(patch)
        with tuned(native=True):
            compiled = rtn_module.matmul_levels(g, reciprocal, zero, qmax)
        with tuned(native=False):
            numpy_path = rtn_module.matmul_levels(g, reciprocal, zero, qmax)
    assert spy.ran == ["compiled", "numpy"]
    return compiled, numpy_path


def around(values, spread: int = 1 << 12) -> np.ndarray:
    """Every float32 within `spread` steps of each value (ties and their neighbours)."""
    bits = np.asarray(values, F32).view(np.uint32).astype(np.int64)
    steps = np.arange(-spread, spread + 1)
    return ((bits[:, None] + steps[None, :]) % (1 << 32)).astype(np.uint32).view(F32).ravel()


@pytest.mark.native
@pytest.mark.parametrize("qmax", QMAX)
def test_every_tie_and_its_neighbours(monkeypatch, qmax):
    halves = np.arange(qmax + 2, dtype=F32) - F32(0.5)  # -0.5, 0.5, ..., qmax + 0.5
    x = np.concatenate([around(halves), around([0.0, -0.0, qmax, 1e-45]),
                        np.array([np.inf, -np.inf, np.nan, -np.nan, 3e38, -3e38], F32)])
    x = x[: x.size // 8 * 8].reshape(-1, 8)  # (groups of 8: reciprocal 1 and zero 0 keep x as it is)
    ones, zeros = np.ones(x.shape[0], F32), np.zeros(x.shape[0], F32)
    compiled, numpy_path = both_paths(monkeypatch, x, ones, zeros, qmax)
    np.testing.assert_array_equal(compiled, numpy_path)
    assert compiled.dtype == np.uint8 and compiled.max() == qmax and compiled.min() == 0


def float32s(**kw):
    return st.floats(width=32, allow_nan=True, allow_infinity=True, **kw)


@pytest.mark.native
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.integers(1, 6), group=st.integers(1, 40), qmax=st.sampled_from(QMAX), data=st.data())
def test_any_groups_scales_and_zero_points(monkeypatch, groups, group, qmax, data):
    g = np.array(data.draw(st.lists(float32s(), min_size=groups * group, max_size=groups * group)), F32)
    reciprocal = np.array(data.draw(st.lists(float32s(), min_size=groups, max_size=groups)), F32)
    zero = np.array(data.draw(st.lists(st.integers(0, qmax), min_size=groups, max_size=groups)), F32)
    compiled, numpy_path = both_paths(monkeypatch, g.reshape(groups, group), reciprocal, zero, qmax)
    np.testing.assert_array_equal(compiled, numpy_path)


@pytest.mark.native
def test_a_block_of_a_weight_and_strided_input(monkeypatch):
    rng = np.random.default_rng(0)
    w = (rng.standard_t(4, size=(64, 16, 128)) * 0.02).astype(F32)
    scale = (w.max(-1) - np.minimum(w.min(-1), 0)) / F32(15)
    reciprocal, zero = (F32(1) / scale).astype(F32), rng.integers(0, 16, (64, 16)).astype(F32)
    compiled, numpy_path = both_paths(monkeypatch, w, reciprocal, zero, 15)
    np.testing.assert_array_equal(compiled, numpy_path)
    strided = np.asfortranarray(w)  # (not C-contiguous: the wrapper hands the C loop a contiguous copy)
    compiled, numpy_path = both_paths(monkeypatch, strided, reciprocal, zero, 15)
    np.testing.assert_array_equal(compiled, numpy_path)


@pytest.mark.native
def test_wrong_arguments_are_refused_not_read_past():
    g = np.zeros((2, 4), F32)
    with pytest.raises(ValueError, match="whole groups"):
        native._native.rtn_levels(g, np.ones(3, F32), np.zeros(2, F32), np.empty(8, np.uint8), 4, 15)
    with pytest.raises(ValueError, match="whole groups"):
        native._native.rtn_levels(g, np.ones(2, F32), np.zeros(2, F32), np.empty(7, np.uint8), 4, 15)
    with pytest.raises(ValueError, match="qmax"):
        native._native.rtn_levels(g, np.ones(2, F32), np.zeros(2, F32), np.empty(8, np.uint8), 4, 256)


def test_switched_off_or_not_built_the_numpy_path_runs(monkeypatch):
    spy = Spy(monkeypatch)
    g = np.array([[0.5, 1.5, 2.5, 14.5, 15.5, -1.0, np.nan, np.inf]], F32)
    with tuned(native=False), np.errstate(all="ignore"):
        levels = rtn_module.matmul_levels(g, np.ones(1, F32), np.zeros(1, F32), 15)
    assert spy.ran == ["numpy"]
    np.testing.assert_array_equal(levels, [[1, 2, 3, 15, 15, 0, 0, 15]])
