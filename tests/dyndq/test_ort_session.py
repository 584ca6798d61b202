"""dyndq.ort_session: graph inputs of the types ONNX Runtime's Python API takes no NumPy array of
(int2, uint2, float8e8m0, with int4, bfloat16 and float8) go in exactly: a Cast to float32 of each
gives the value of every code, bit for bit; a float8e8m0 output comes back as such."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from cases import same_bits

from dyndq.ort_session import OrtSession

# (ONNX type, ml_dtypes dtype, bits, the lowest opset whose Cast takes it): an oracle of the runner's own,
# written out here rather than read from the dtype table the runner reads
TYPES = {
    "int2": (TensorProto.INT2, ml_dtypes.int2, 2, 25),
    "uint2": (TensorProto.UINT2, ml_dtypes.uint2, 2, 25),
    "int4": (TensorProto.INT4, ml_dtypes.int4, 4, 21),
    "uint4": (TensorProto.UINT4, ml_dtypes.uint4, 4, 21),
    "float8e8m0": (TensorProto.FLOAT8E8M0, ml_dtypes.float8_e8m0fnu, 8, 24),
    "float8e4m3fn": (TensorProto.FLOAT8E4M3FN, ml_dtypes.float8_e4m3fn, 8, 19),
    "float8e5m2fnuz": (TensorProto.FLOAT8E5M2FNUZ, ml_dtypes.float8_e5m2fnuz, 8, 19),
    "bfloat16": (TensorProto.BFLOAT16, ml_dtypes.bfloat16, 16, 19),
}


def every_code(dtype, bits: int) -> np.ndarray:
    """Every bit pattern of the type (bfloat16: every one of its 65536), in a shape of rank 2 with an
    odd count of elements, so that the last byte of a packed type is partly filled."""
    codes = np.arange(2 ** bits, dtype=np.uint8 if bits <= 8 else np.uint16).view(dtype)
    return np.concatenate([codes, codes[:1]]).reshape(1, -1)


def cast_model(elem: int, opset: int, shape):
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "cast",
                              [helper.make_tensor_value_info("x", elem, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return model


@pytest.mark.parametrize("name", sorted(TYPES))
def test_every_code_goes_in_exactly(name):
    elem, dtype, bits, opset = TYPES[name]
    x = every_code(dtype, bits)
    (y,) = OrtSession(cast_model(elem, opset, x.shape)).run(["y"], {"x": x})
    assert same_bits(y, x.astype(np.float32))


@pytest.mark.parametrize("name", ["int2", "uint2"])
def test_an_empty_packed_input_goes_in(name):
    elem, dtype, _, opset = TYPES[name]
    x = np.zeros((0, 3), dtype)
    (y,) = OrtSession(cast_model(elem, opset, x.shape)).run(["y"], {"x": x})
    assert y.shape == (0, 3) and y.dtype == np.float32


def test_a_float8e8m0_output_comes_back_exactly():
    """(Cast to float32 inside the graph and back by value: every float8e8m0 value, 2^-127 and NaN
    included, is a float32 one.)"""
    x = np.array([2.0 ** -127, 1.0, 2.0 ** 127, np.nan, 0.25, 2.0 ** -100], np.float32)
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT8E8M0)], "cast",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT8E8M0, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    (y,) = OrtSession(model).run(["y"], {"x": x})
    assert y.dtype == ml_dtypes.float8_e8m0fnu
    assert y.view(np.uint8).tolist() == [0, 127, 254, 255, 125, 27]
