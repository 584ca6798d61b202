"""metrics.compare: an output against the reference's, within the tolerance for float sums in
another order; top-1 agreement and KL divergence for logits and distributions."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, strategies as st
from onnx import TensorProto, helper

from dyndq.parity.metrics import TOLERANCE, compare
from dyndq.reference_session import ReferenceSession
from dyndq.task_metrics import output_kind


def test_bfloat16_outputs_are_compared_as_floats():
    """Within the tolerance of max |b| (a sum reordered moves the last bit), not bit for bit."""
    b = np.array([1000.0, 0.001], ml_dtypes.bfloat16)
    a = b.copy()
    a.view(np.uint16)[1] += 1  # one bfloat16 ulp of 0.001 (2^-17), far below 1e-4 of 1000
    near = compare("d", a, b)
    assert near.agrees and near.max_abs == 2.0**-17 and near.scale == 1000.0
    a.view(np.uint16)[0] += 1  # one ulp of 1000 (4): beyond it
    assert not compare("d", a, b).agrees


@given(st.integers(1, 8), st.integers(1, 1024), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_a_matmul_summed_in_another_order_agrees(m, k, n, seed):
    """float32 MatMul (NumPy's order, BLAS's blocks) against the exact sum rounded once: within the tolerance."""
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    exact = (x.astype(np.float64) @ w.astype(np.float64)).astype(np.float32)
    assert compare("y", x @ w, exact).agrees
    assert compare("y", exact, exact).max_abs == 0


def test_metrics_of_a_known_difference():
    b = np.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], np.float32)
    a = b + np.array([[0.0, 0.0, 0.5], [0.0, 0.0, 0.0]], np.float32)
    got = compare("y", a, b)
    assert not got.agrees and got.max_abs == 0.5 and got.scale == 4.0 and got.relative == 0.125
    assert got.frobenius == pytest.approx(0.5 / np.linalg.norm(b))
    assert got.top1_agreement is None and got.kl is None  # (not said to be logits)


def test_top1_and_kl_of_logits():
    b = np.array([[2.0, 1.0, 0.0], [0.0, 1.0, 2.0]], np.float32)
    same = compare("logits", b, b, "logits")
    assert same.top1_agreement == 1.0 and same.kl == 0.0
    swapped = compare("logits", b[:, ::-1], b, "logits")
    assert swapped.top1_agreement == 0.0 and swapped.kl > 0.5
    p = np.exp(b) / np.exp(b).sum(-1, keepdims=True)
    q = p[:, ::-1]
    assert compare("probs", q, p, "distribution").kl == pytest.approx(float(np.mean(np.sum(p * np.log(p / q), -1))))


def test_non_float_outputs_agree_only_bit_for_bit():
    assert compare("i", np.array([1, 2]), np.array([1, 2])).agrees
    assert not compare("i", np.array([1, 3]), np.array([1, 2])).agrees
    assert not compare("s", np.zeros(2, np.float32), np.zeros(3, np.float32)).agrees


def test_nan_where_the_reference_has_none_differs():
    assert not compare("n", np.array([np.nan, 1.0]), np.array([0.0, 1.0])).agrees
    assert compare("n", np.array([np.nan, 1.0]), np.array([np.nan, 1.0])).agrees


def test_the_kind_of_a_last_axis():
    graph = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("LogSoftmax", ["x"], ["lp"]),
         helper.make_node("Softmax", ["x"], ["p0"], axis=0), helper.make_node("Identity", ["x"], ["next_logits"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("p", "lp", "p0", "next_logits")])
    model = helper.make_model(graph)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    values = ReferenceSession(model).values({"x": x})  # (parity judges on the meaning's values)
    assert [output_kind(model, n, [values[n]]) for n in ("p", "lp", "p0", "next_logits")] == \
        ["distribution", "log-distribution", None, "logits"]
