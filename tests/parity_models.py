"""Small models the parity tests share (tests do not import one another)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import dyndq


def our_int4_matmul() -> onnx.ModelProto:
    """y = x @ DynamicDequantize(int4 codes -8..7 down each of 4 columns, scale 0.5 per group of 16)."""
    src = np.arange(-8, 8, dtype=np.int8).astype(ml_dtypes.int4).reshape(16, 1).repeat(4, axis=1)
    graph = helper.make_graph(
        [dyndq.make_node(["q", "s"], ["w"], qtype="per_group", group_shape=[16, 1], name="dq"),
         helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(src, "q"), numpy_helper.from_array(np.full((1, 4), 0.5, np.float32), "s")])
    return dyndq.make_model(graph, opset=21)
