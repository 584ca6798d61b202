"""Small float models for the quantizer's tests, with seeded heavy-tailed weights (loaded by
conftest.py as the module `quantize_models`)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper as nh


def heavy(shape, seed=0, df=4, scale=0.02, dtype=np.float32) -> np.ndarray:
    """Student-t weights, the shape real LLM weights have."""
    return (np.random.default_rng(seed).standard_t(df, size=shape) * scale).astype(dtype)


def mlp(k=256, n=192, vocab=64, dtype=np.float32, seed=0, opset=21) -> onnx.ModelProto:
    """ids -> Gather(E [vocab, k]) -> MatMul(W1 [k, n]) -> Relu -> Gemm(W2 [k, n], transB=1) -> y [batch, k]."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["x"], name="embed"),
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "W2"], ["y"], name="fc2", transB=1),
    ]
    inits = [nh.from_array(heavy((vocab, k), seed, dtype=dtype), "E"), nh.from_array(heavy((k, n), seed + 1, dtype=dtype), "W1"),
             nh.from_array(heavy((k, n), seed + 2, dtype=dtype), "W2")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("ids", T.INT64, ["batch"])],
                          [helper.make_tensor_value_info("y", elem, ["batch", k])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
