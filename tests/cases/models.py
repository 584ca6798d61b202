"""Small models tests share and the helpers that build and run them: `vi` (a value info), `run_ort`
(ONNX Runtime through dyndq's runner of it), `call` (the CLI), and the models of the edge-case
tests (tests/dyndq/*/test_*_edge_cases.py)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import dyndq
from dyndq.plumbing.types import elem_type


def run_ort(model, feeds: dict, *, level: str = "all", outputs=None) -> list:
    """Run a model (a ModelProto, or a path: external data is found beside it) in ONNX Runtime, CPU,
    one thread, through dyndq's runner of it (`dyndq.ort_session.OrtSession`); `level` by the house's
    name (ONNX Runtime's default: "all"), `outputs` the names to fetch (default: the graph's outputs)."""
    from dyndq.ort_session import OrtSession

    if isinstance(model, onnx.ModelProto):
        return OrtSession(model, level=level, threads=1).run(outputs, feeds)
    path = str(model)
    return OrtSession(onnx.load(path, load_external_data=False), level=level, threads=1, path=path).run(outputs, feeds)


def vi(name: str, dtype, shape) -> onnx.ValueInfoProto:
    """A tensor value info; dtype is an ONNX element type or anything NumPy names."""
    return helper.make_tensor_value_info(name, dtype if isinstance(dtype, int) else elem_type(dtype), shape)


def call(capsys, *argv):
    """dyndq's CLI on argv (str()'d), through its real entry point: (exit code, stdout, stderr)."""
    from dyndq.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def matmul_model() -> onnx.ModelProto:
    """y = x @ DynamicDequantize(w, s): x float32[2, 3], w int8[3, 2]."""
    node = dyndq.make_node(["w", "s"], ["wf"], name="dq")
    g = helper.make_graph(
        [node, helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 2])],
        [numpy_helper.from_array(np.arange(6, dtype=np.int8).reshape(3, 2), "w"), numpy_helper.from_array(np.array([0.5], np.float32), "s")])
    return dyndq.make_model(g)


def dq_input_model() -> onnx.ModelProto:
    """y = DynamicDequantize(w, s) with both as graph inputs of free shape."""
    g = helper.make_graph(
        [dyndq.make_node(["w", "s"], ["y"], name="dq")], "g",
        [helper.make_tensor_value_info("w", onnx.TensorProto.INT8, [None, None]), helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, None])])
    return dyndq.make_model(g)


X = np.arange(6, dtype=np.float32).reshape(2, 3)
Y = X @ (np.arange(6, dtype=np.float32).reshape(3, 2) * np.float32(0.5))


def sequence_model() -> onnx.ModelProto:
    g = helper.make_graph(
        [dyndq.make_node(["a", "s"], ["da"], name="dqa"), dyndq.make_node(["b", "s"], ["db"], name="dqb"),
         helper.make_node("SequenceConstruct", ["da", "db"], ["seq"])], "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.INT8, [2]), helper.make_tensor_value_info("b", onnx.TensorProto.INT8, [None])],
        [helper.make_tensor_sequence_value_info("seq", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([0.5], np.float32), "s")])
    return dyndq.make_model(g)


A, B = np.array([1, 2], np.int8), np.array([3, 4, 5], np.int8)
