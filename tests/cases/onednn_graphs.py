"""oneDNN graphs written as JSON documents (`lt`, `op`, `graph`), and the small ONNX models the
oneDNN tests share."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

import dyndq


def lt(i, dtype, shape, prop="variable"):
    """A oneDNN logical tensor: id, dtype ("f32", "s8", ...), shape, strided."""
    return {"id": i, "dtype": dtype, "shape": list(shape), "stride": [], "layout_type": "strided", "property_type": prop}


def graph(*ops, inputs=None, outputs=None):
    doc = {"version": "3.9.0", "graph": list(ops)}
    if inputs is not None:
        doc["input_ports"] = inputs
    if outputs is not None:
        doc["output_ports"] = outputs
    return doc


def op(i, kind, ins, outs, **attrs):
    types = {bool: "bool", int: "s64", float: "f32", str: "string"}
    typed = {k: {"type": (("f32[]" if isinstance(v[0], float) else "s64[]") if isinstance(v, list) else types[type(v)]),
                 "value": v} for k, v in attrs.items()}
    return {"id": i, "name": f"{kind.lower()}_{i}", "kind": kind, "attrs": typed, "inputs": ins, "outputs": outs}


def both(model, feeds):
    return dyndq.run(model, feeds), dyndq.run(model, feeds, engine="onnxruntime")


def weighted_model():
    """MatMul with weights, Reshape, ReduceSum, ReduceMax and QuantizeLinear, all with constants."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
             helper.make_node("Reshape", ["y", "shape"], ["r"], name="flat"),
             helper.make_node("ReduceMax", ["r", "axes"], ["m"], name="top", keepdims=1),
             helper.make_node("Sub", ["r", "m"], ["d"], name="shift"),
             helper.make_node("ReduceSum", ["d", "axes"], ["s"], name="total", keepdims=0),
             helper.make_node("QuantizeLinear", ["s", "scale", "zp"], ["q"], name="quant")]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([3, 2], np.int64), "shape"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
             numpy_helper.from_array(np.array(-3, np.int8), "zp")]
    g = helper.make_graph(nodes, "weighted", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])], [helper.make_tensor_value_info("q", onnx.TensorProto.INT8, [3])],
                          inits)
    return dyndq.make_model(g)


def hand_model():
    """DynamicDequantize feeding a MatMul and an Add, in plain ONNX (no oneDNN metadata)."""
    vi = helper.make_tensor_value_info
    nodes = [dyndq.make_node(["w", "s", "z"], ["wd"], name="deq", qtype="per_channel", axis=1),
             helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm"),
             helper.make_node("Add", ["y", "b"], ["out"], name="bias")]
    g = helper.make_graph(nodes, "hand", [vi("x", onnx.TensorProto.FLOAT, [2, 4]), vi("w", onnx.TensorProto.INT8, [4, 3]),
                                          vi("s", onnx.TensorProto.FLOAT, [3]), vi("z", onnx.TensorProto.INT8, [3]),
                                          vi("b", onnx.TensorProto.FLOAT, [3])],
                          [vi("out", onnx.TensorProto.FLOAT, [2, 3])])
    return dyndq.make_model(g)
