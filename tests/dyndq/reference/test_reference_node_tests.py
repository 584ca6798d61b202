"""The reference engine (`dyndq.reference_evaluator`: onnx.reference with our kernel, our Loop and
dyndq.reference_ops' corrections) on every node test of ONNX's backend (tests/backend_cases.py),
against the outputs ONNX expects, each compared as ONNX's backend runner compares them.

The cases where it does not give them are named in KNOWN with why, and must still fail: a new
onnx that fixes one (or breaks another) fails this test until the list says so.  The pools'
cases are not generated (backend_cases.LEFT_OUT: their expected outputs are onnx.reference's own,
and they would take 16 s of the suite's time).  Other generators (AffineGrid, Attention, Resize,
RMSNormalization, RotaryEmbedding ...) also compute theirs with onnx.reference's helpers: for those
ops agreement is no evidence (docs/running.md says what was checked otherwise).
"""
from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
from backend_cases import assert_as_expected, expected, feeds, node_cases

from dyndq.reference import reference_evaluator

_RANDOM = "random: the expected values are one draw of NumPy's generator, no engine's meaning (UNTRUSTED)"

KNOWN = {
    **{f"test_bernoulli{kind}{expanded}": _RANDOM
       for kind in ("", "_double", "_seed") for expanded in ("", "_expanded")},
    "test_scan_sum": "Scan-8 (opset 8): onnx.reference runs Scan-9's meaning and fails (UNTRUSTED)",
    "test_scatter_with_axis": "Scatter (opset 9 and 10, deprecated for ScatterElements): onnx.reference has none",
    "test_scatter_without_axis": "Scatter (opset 9 and 10, deprecated for ScatterElements): onnx.reference has none",
    "test_if_opt": "an If whose output is an optional sequence: onnx.reference returns the sequence wrapped in one "
                   "more list ([[x]] for [x]): a representation of optional values, no tensor differs",
}

# needs a package dyndq does not depend on: run where it is installed, left out (said) where not
NEEDS_PILLOW = {f"test_image_decoder_decode_{kind}" for kind in (
    "jpeg_rgb", "jpeg_grayscale", "jpeg_bgr", "jpeg2k_rgb", "bmp_rgb", "png_rgb", "tiff_rgb", "webp_rgb", "pnm_rgb")}

def _outcome(case) -> str | None:
    """None when the reference engine gives every data set's expected outputs; else what it did."""
    try:
        for data_set in case.data_sets:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                got = reference_evaluator(case.model).run(None, feeds(case, data_set))
            assert_as_expected(list(got), expected(data_set), case.rtol, case.atol, case.name)
    except Exception as e:  # (an error or a difference: either is not ONNX's expected output)
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
    return None


@pytest.fixture(scope="module")
def outcomes():
    pillow = importlib.util.find_spec("PIL") is not None
    cases = node_cases()
    return {name: _outcome(case) for name, case in cases.items() if pillow or name not in NEEDS_PILLOW}


def test_the_reference_engine_gives_what_onnx_expects_on_every_node_test(outcomes):
    results = outcomes
    assert len(results) > 1500, len(results)  # (the generators ran: onnx 1.23 has 1884, 1837 without the pools)
    wrong = {name: what for name, what in results.items() if what is not None and name not in KNOWN}
    assert not wrong, "\n".join(f"{name}: {what}" for name, what in sorted(wrong.items()))


def test_each_known_exception_still_differs(outcomes):
    """A case named in KNOWN that now passes (a new onnx fixed it) is taken off the list."""
    results = outcomes
    absent = [name for name in KNOWN if name not in results]
    assert not absent, f"no longer among ONNX's node tests: {absent}"
    fixed = [name for name in KNOWN if results[name] is None]
    assert not fixed, f"now give ONNX's expected outputs: {fixed}"


def test_the_pillow_cases_are_left_out_only_where_pillow_is_missing():
    names = set(node_cases())
    assert NEEDS_PILLOW <= names
    if importlib.util.find_spec("PIL") is None:
        pytest.skip("Pillow is not installed: the 9 ImageDecoder node tests are left out (onnx.reference needs it)")
