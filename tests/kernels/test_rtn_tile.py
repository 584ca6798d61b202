"""The compiled RTN tile (kernels/_native_quantize.h rtn_tile, kernels/native.py), both rules, against the NumPy
path of dyndq/quantization/numerics.py's quantize_weight: the same codes, scales and zero points,
byte for byte, and the same error sums to 1e-12 (float64 sums added in another order), each run
checked to take its path.

Here, in tests/kernels, so that the Makefile's builds with Clang, without SIMD and with the
sanitizers run the C loop too.  That the NumPy path gives ONNX Runtime's very codes is
tests/quantization/test_rtn_exact.py's part."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dyndq.kernels import native
from dyndq.kernels.parallel import tuned
from dyndq.quantization.numerics import quantize_weight

F32 = np.float32


class TileSpy:
    """native.rtn_tile, recording per call whether the tile was done in place ("tile"), handed
    back to NumPy's path ("handed back": a value beyond float32's range, a group of zeros with a
    -0), or not run at all ("numpy")."""

    def __init__(self, monkeypatch):
        self.ran = []
        real = native.rtn_tile

        def spy(*args):
            out = real(*args)
            self.ran.append("numpy" if out is None else "tile" if out[0] else "handed back")
            return out

        monkeypatch.setattr(native, "rtn_tile", spy)


def both_paths(monkeypatch, w, **kw):
    """(compiled, NumPy) quantize_weight on one thread, and what the compiled run's tiles did."""
    with monkeypatch.context() as patch, np.errstate(all="ignore"):  # (undone after each hypothesis example)
        spy = TileSpy(patch)
        with tuned(native=True, cores=1):
            compiled = quantize_weight(w, **kw)
        tiles = list(spy.ran)
        spy.ran.clear()
        with tuned(native=False, cores=1):
            numpy_path = quantize_weight(w, **kw)
        assert set(spy.ran) == {"numpy"}
    return compiled, numpy_path, tiles


def assert_same(a, b):
    for name in ("codes", "scales", "zero_points"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8), err_msg=name)
    for name in ("sq_error", "sq_weight", "sq_dequantized", "dot"):
        assert getattr(a.stats, name) == pytest.approx(getattr(b.stats, name), rel=1e-12, abs=1e-300), name
    assert a.stats.max_abs == b.stats.max_abs


SPECIAL = [0.0, -0.0, 1e-45, -1e-45, 1e-38, 1.0, -1.0, 0.5, 3e38, -3e38, 1.7e38, -1.7e38]


@pytest.mark.native
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outer=st.integers(1, 3), length=st.integers(1, 70), inner=st.integers(1, 20), group=st.integers(1, 80),
       bits=st.sampled_from([2, 4, 8]), symmetric=st.booleans(), rule=st.sampled_from(["matmul", "gather"]),
       data=st.data())
def test_any_weight_any_groups(monkeypatch, outer, length, inner, group, bits, symmetric, rule, data):
    """Finite weights of any shape and group (a group longer than the axis, a short last group),
    special values among them: zeros of both signs (a group of zeros with a -0 goes to NumPy's
    path), subnormals, values near float32's largest (whose groups' values overflow and go to
    NumPy's path, which steps them back)."""
    n = outer * length * inner
    finite = st.floats(width=32, allow_nan=False, allow_infinity=False)
    values = data.draw(st.lists(st.one_of(finite, st.sampled_from(SPECIAL)), min_size=n, max_size=n))
    w = np.array(values, F32).reshape(outer, length, inner)
    compiled, numpy_path, tiles = both_paths(monkeypatch, w, axis=1, group_size=group, bits=bits, symmetric=symmetric,
                                             scale_dtype=np.float32, rule=rule)
    assert tiles and set(tiles) <= {"tile", "handed back"}
    assert_same(compiled, numpy_path)


@pytest.mark.native
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("shape, axis, rule", [((2048, 700), 0, "matmul"), ((700, 2048), 1, "matmul"),
                                               ((3, 300, 260), 1, "matmul"), ((3000, 384), 1, "gather")])
def test_weights_of_a_model(monkeypatch, shape, axis, rule, symmetric):
    """Heavy-tailed weights in several tiles (a MatMul's B along K, a Gemm's transposed B along
    its last axis, a rank-3 weight, a Gather table along its rows), every tile done in place."""
    w = (np.random.default_rng(0).standard_t(4, size=shape) * 0.02).astype(F32)
    compiled, numpy_path, tiles = both_paths(monkeypatch, w, axis=axis, group_size=128, bits=4, symmetric=symmetric,
                                             rule=rule)
    assert len(tiles) > 1 and set(tiles) == {"tile"}
    assert_same(compiled, numpy_path)


@pytest.mark.native
def test_a_tile_whose_values_overflow_goes_to_numpy(monkeypatch):
    """A group spanning nearly float32's whole range: its scale is finite, but (level - zero) * scale
    of its largest level overflows; the tile says so (not finite) for NumPy's path to step it back,
    and quantize_weight's result is NumPy's."""
    w = np.array([[-3.4e38], [3.4e38], [1.0], [0.0]], F32)
    compiled, numpy_path, tiles = both_paths(monkeypatch, w, axis=0, group_size=4, bits=4)
    assert tiles == ["handed back"]
    assert_same(compiled, numpy_path)
    levels, scales, zeros = np.empty((1, 4, 1), np.uint8), np.empty((1, 1, 1), F32), np.empty((1, 1, 1), np.uint8)
    with np.errstate(all="ignore"):
        finite, *_ = native.rtn_tile(w.reshape(1, 4, 1), levels, scales, zeros, 4, 15, False, "matmul", (0, 1), (0, 4), (0, 1))
    assert finite is False and np.isfinite(scales).all()


@pytest.mark.native
@pytest.mark.parametrize("rule", ["matmul", "gather"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_groups_of_zeros(monkeypatch, rule, symmetric):
    """Groups of +0 only are done in place (an embedding's padding row); a group of zeros with a
    -0 is handed back, but under the matmul rule's symmetric scale (its first element's sign),
    and the bytes are NumPy's either way."""
    w = np.ones((8, 4), F32)
    w[:4, 0] = 0.0
    plus, _, tiles = both_paths(monkeypatch, w, axis=0, group_size=4, bits=4, symmetric=symmetric, rule=rule)
    assert tiles == ["tile"]
    w[1, 0] = -0.0
    compiled, numpy_path, tiles = both_paths(monkeypatch, w, axis=0, group_size=4, bits=4, symmetric=symmetric,
                                             rule=rule)
    assert tiles == ["tile" if symmetric and rule == "matmul" else "handed back"]
    assert_same(compiled, numpy_path)


@pytest.mark.native
def test_nan_and_infinity_make_the_sums_not_finite():
    """quantize refuses a weight with NaN or infinity by its error sums (quantizer._one_weight):
    the compiled tile's sums are not finite for either."""
    from dyndq.quantization.numerics import ErrorStats

    for bad in (np.nan, np.inf, -np.inf):
        w = np.ones((4, 3), F32)
        w[2, 1] = bad
        levels, scales, zeros = np.empty((1, 4, 3), np.uint8), np.empty((1, 1, 3), F32), np.empty((1, 1, 3), np.uint8)
        with np.errstate(all="ignore"):
            _, *sums = native.rtn_tile(w.reshape(1, 4, 3), levels, scales, zeros, 4, 15, False, "matmul", (0, 1), (0, 4), (0, 3))
        assert not ErrorStats(*sums).finite, bad


@pytest.mark.native
def test_wrong_arguments_are_refused_not_read_past():
    w = np.zeros((1, 8, 4), F32)
    levels, scales, zeros = np.empty((1, 8, 4), np.uint8), np.empty((1, 2, 4), F32), np.empty((1, 2, 4), np.uint8)
    ok = (w, levels, scales, zeros, 8, 8, 4, 4, 15, False, 0, 0, 1, 0, 8, 0, 4)
    assert native._native.rtn_tile(*ok)[0] is True
    wrong = {
        "levels too short": (w, np.empty((1, 7, 4), np.uint8), scales, zeros) + ok[4:],
        "scales too short": (w, levels, np.empty((1, 1, 4), F32), zeros) + ok[4:],
        "a tile past the axis": ok[:14] + (9,) + ok[15:],
        "a tile starting inside a group": ok[:13] + (2,) + ok[14:],
        "a tile past the columns": ok[:16] + (5,),
        "more outer rows than there are": ok[:12] + (2,) + ok[13:],
        "an unknown rule": ok[:10] + (2,) + ok[11:],
        "qmax beyond a byte": ok[:8] + (256,) + ok[9:],
        "padding of a whole group": ok[:5] + (12,) + ok[6:],
    }
    for what, args in wrong.items():
        with pytest.raises(ValueError, match="rtn_tile"):
            native._native.rtn_tile(*args)
        assert what


def test_switched_off_or_not_built_the_numpy_path_runs(monkeypatch):
    w = (np.random.default_rng(1).standard_normal((256, 64))).astype(F32)
    spy = TileSpy(monkeypatch)
    with tuned(native=False):
        quantize_weight(w, axis=0, group_size=128, bits=4)
    assert set(spy.ran) <= {"numpy"}  # (not built: not even called)
