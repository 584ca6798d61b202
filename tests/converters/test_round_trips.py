"""Lift then export gives the model back: for every standard model in the test data (ONNX's
backend cases of DequantizeLinear) and every output of ONNX Runtime's own quantizer (QDQ and
QOperator, 4 and 8 bits, blocks of 16 to 128, symmetric or not, K a multiple of the block or not),
the nodes and constants come back as they were, and ONNX Runtime computes the same bits on
both at every optimization level (DequantizeLinear + MatMul fused into MatMulNBits alike)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from decoder import decoder_model, ort_quantize

from cases import backend_case, backend_case_names, run_ort

import dyndq

LEVELS = ["off", "basic", "all"]
# hidden 128: K 128 and 336 (the MLP's width, a multiple of 16 only); hidden 80: K 80 and 208
CONFIGS = [(hidden, fmt, bits, block, sym) for hidden in (128, 80) for fmt in ("QOperator", "QDQ") for bits in (4, 8)
           for block in (16, 32, 64, 128) for sym in (True, False) if not (fmt == "QDQ" and bits == 8)]


@pytest.fixture(scope="module")
def float_models():
    return {hidden: decoder_model(hidden=hidden, layers=1, vocab=256) for hidden in (128, 80)}


def node_bytes(node: onnx.NodeProto, drop=()) -> bytes:
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    kept = [a for a in copy.attribute if a.name not in drop]
    del copy.attribute[:]
    copy.attribute.extend(sorted(kept, key=lambda a: a.name))
    return copy.SerializeToString()


def assert_given_back(back: onnx.ModelProto, model: onnx.ModelProto, drop=()):
    assert [node_bytes(n, drop) for n in back.graph.node] == [node_bytes(n, drop) for n in model.graph.node]
    assert [t.SerializeToString() for t in back.graph.initializer] == [t.SerializeToString() for t in model.graph.initializer]
    assert {o.domain: o.version for o in back.opset_import} == {o.domain: o.version for o in model.opset_import}


@pytest.mark.parametrize("hidden, fmt, bits, block, sym", CONFIGS,
                         ids=[f"h{h}-{f}-{b}bit-b{k}-{'sym' if s else 'asym'}" for h, f, b, k, s in CONFIGS])
def test_onnxruntime_quantizer_outputs_come_back(float_models, hidden, fmt, bits, block, sym):
    model = ort_quantize(float_models[hidden], fmt, bits, block, sym)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count and not report.skipped
    target = "onnxruntime" if fmt == "QOperator" else "onnx"
    back = dyndq.export(lifted, target=target)
    # (export writes MatMulNBits' accuracy_level explicitly, its default 0 where the original left it out)
    assert_given_back(back, model, drop=("accuracy_level",) if fmt == "QOperator" else ())
    ids = {"input_ids": np.random.default_rng(0).integers(0, 256, (2, 5)).astype(np.int64)}
    for level in LEVELS:
        assert np.array_equal(run_ort(back, ids, level=level)[0], run_ort(model, ids, level=level)[0]), level


@pytest.mark.parametrize("name", ["test_dequantizelinear", "test_dequantizelinear_axis", "test_dequantizelinear_int4",
                                  "test_dequantizelinear_uint4", "test_dequantizelinear_blocked"])
def test_onnx_backend_cases_come_back(name):
    """ONNX's own DequantizeLinear cases (opset 28: exported at it, ONNX Runtime being no judge there)."""
    model = backend_case(name).model
    back = dyndq.export(dyndq.lift(model), opset=28)
    expected = model.graph.node[0]
    got = back.graph.node[0]
    assert len(back.graph.node) == 1 and (got.op_type, list(got.input), list(got.output)) == \
        (expected.op_type, list(expected.input), list(expected.output))
    # the attributes mean what they meant: the default axis (1) is written out, as export always
    # writes it; beside a one-element scale (per tensor) an axis means nothing, and is not kept
    per_tensor = not [i for i in model.graph.input if i.name == expected.input[1]][0].type.tensor_type.shape.dim
    attrs = lambda n: {k: v for k, v in {"axis": 1, **{a.name: onnx.helper.get_attribute_value(a)  # noqa: E731
                                                      for a in n.attribute}}.items() if not (per_tensor and k == "axis")}
    assert attrs(got) == attrs(expected)
    assert backend_case_names()  # (the cases are there)
