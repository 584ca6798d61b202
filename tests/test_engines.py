"""tests/engines.py, the engines' runners for tests (dyndq's own runners: dyndq.ort_session,
dyndq.openvino_session): a float32 DequantizeLinear gives the reference engine's bits on ONNX Runtime
and on OpenVINO, and every type each engine takes goes in and comes out exactly.  These check the
runners themselves, so their oracles are their own: onnx's ReferenceEvaluator as it is (not dyndq's
reference runner) and the arrays fed.  The OpenVINO tests are marked `openvino` (skipped, saying why,
where it is not installed: `make test-openvino` installs it and runs them)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import engines
from cases import same_values
from engines import run_onnxruntime, run_openvino


def finish(graph):
    """A model of the lowest opset that holds the graph's types, and the IR version that opset needs."""
    elems = {vi.type.tensor_type.elem_type for vi in list(graph.input) + list(graph.output)}
    elems |= {t.data_type for t in graph.initializer}
    opset = max([19] + [OPSET.get(e, 19) for e in elems])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return model


OPSET = {TensorProto.INT4: 21, TensorProto.UINT4: 21, TensorProto.FLOAT4E2M1: 23, TensorProto.FLOAT8E8M0: 24}


def dequantize_linear(codes_as: str):
    """int8 codes (every one, twice) times per-axis float32 scales (no subnormal among them: OpenVINO
    zeroes subnormal float32 constants), no zero point; codes as a graph input or an initializer."""
    x = np.concatenate([np.arange(-128, 128), np.arange(127, -129, -1)]).astype(np.int8).reshape(16, 32)
    scale = np.array([0.0371, -0.5, 3.1415927, 1e-3, 1e30, -7.77e-6, 0.1, 2.0 ** -20] * 4, np.float32)
    scale[5] = np.float32(np.inf)
    node = helper.make_node("DequantizeLinear", ["x", "scale"], ["y"], axis=1)
    inits = [numpy_helper.from_array(scale, "scale")]
    inputs = []
    if codes_as == "input":
        inputs.append(helper.make_tensor_value_info("x", TensorProto.INT8, x.shape))
    else:
        inits.append(numpy_helper.from_array(x, "x"))
    graph = helper.make_graph([node], "dql", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
                              initializer=inits)
    model = finish(graph)
    feeds = {"x": x} if codes_as == "input" else {}
    return model, feeds, ReferenceEvaluator(model).run(None, feeds)[0]


@pytest.mark.parametrize("level", ["off", "basic", "all"])
@pytest.mark.parametrize("codes_as", ["input", "initializer"])
def test_a_float32_dequantize_linear_gives_the_reference_bits_on_onnxruntime(codes_as, level):
    model, feeds, want = dequantize_linear(codes_as)
    (got,) = run_onnxruntime(model, feeds, level=level)
    assert same_values(got, want)


@pytest.mark.openvino
@pytest.mark.parametrize("codes_as", ["input", "initializer"])
def test_a_float32_dequantize_linear_gives_the_reference_bits_on_openvino(codes_as):
    model, feeds, want = dequantize_linear(codes_as)
    (got,) = run_openvino(model, feeds)
    assert same_values(got, want)


def every_code(dtype, bits: int) -> np.ndarray:
    """Every bit pattern of a type, and one more (an odd count: a packed type's last byte half full)."""
    codes = np.arange(2 ** bits, dtype={8: np.uint8, 16: np.uint16}[max(bits, 8)]).view(dtype)
    return np.concatenate([codes, codes[:1]]).reshape(1, -1)


def identity(elem: int, shape):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity",
                              [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", elem, shape)])
    return finish(graph)


FLOAT32 = np.array([0x80000000, 0x00000001, 0x807FFFFF, 0x7FC01234, 0xFF800001, 0x7F7FFFFF, 0x3F800000],
                   np.uint32).view(np.float32)  # -0, subnormals, NaN payloads (a signalling one), the largest
# what OpenVINO takes, and the array of each that must go in and come back as it is
OPENVINO_TYPES = {
    TensorProto.FLOAT: FLOAT32,
    TensorProto.FLOAT16: every_code(np.float16, 16),
    TensorProto.BFLOAT16: every_code(ml_dtypes.bfloat16, 16),
    TensorProto.FLOAT8E4M3FN: every_code(ml_dtypes.float8_e4m3fn, 8),
    TensorProto.FLOAT8E5M2: every_code(ml_dtypes.float8_e5m2, 8),
    TensorProto.FLOAT8E8M0: every_code(ml_dtypes.float8_e8m0fnu, 8),
    TensorProto.FLOAT4E2M1: every_code(ml_dtypes.float4_e2m1fn, 4),
    TensorProto.INT4: every_code(ml_dtypes.int4, 4),
    TensorProto.UINT4: every_code(ml_dtypes.uint4, 4),
    TensorProto.INT8: every_code(np.int8, 8),
    TensorProto.UINT8: every_code(np.uint8, 8),
    TensorProto.INT16: every_code(np.int16, 16),
    TensorProto.UINT16: every_code(np.uint16, 16),
    TensorProto.INT32: np.array([-(2 ** 31), -1, 0, 2 ** 31 - 1], np.int32),
    TensorProto.BOOL: np.array([True, False, True]),
}


@pytest.mark.openvino
@pytest.mark.parametrize("elem", sorted(OPENVINO_TYPES), ids=TensorProto.DataType.Name)
def test_every_type_openvino_has_goes_in_and_comes_out_exactly(elem):
    x = OPENVINO_TYPES[elem]
    (got,) = run_openvino(identity(elem, x.shape), {"x": x})
    assert same_values(got, x)


@pytest.mark.openvino
def test_openvino_runs_float32_as_float32():
    """The largest float32 constant comes back as it is: with the bf16 inference precision (the CPU
    plugin's default on a processor with bfloat16 units) it would be clamped to bfloat16's largest."""
    big = np.array([np.finfo(np.float32).max, -np.finfo(np.float32).max], np.float32)
    graph = helper.make_graph([helper.make_node("Identity", ["c"], ["y"])], "constant", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, big.shape)],
                              initializer=[numpy_helper.from_array(big, "c")])
    (got,) = run_openvino(finish(graph), {})
    assert same_values(got, big)


@pytest.mark.openvino
def test_run_openvino_refuses_an_array_of_a_type_openvino_lacks():
    model = identity(TensorProto.FLOAT, [2])
    with pytest.raises(ValueError, match="OpenVINO takes no array of int2"):
        run_openvino(model, {"x": np.zeros(2, ml_dtypes.int2)})


def test_the_openvino_tests_say_how_to_run_them_where_it_is_missing(monkeypatch):
    monkeypatch.setattr(engines, "openvino_available", lambda: False)
    with pytest.raises(pytest.skip.Exception, match=r"^OpenVINO is not installed: `make test-openvino` installs it"):
        engines.needs_openvino()
