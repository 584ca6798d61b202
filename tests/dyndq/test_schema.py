"""The schema inside ONNX: registry, checker and shape inference understand the op."""
import subprocess
import sys

import onnx
import onnx.defs
from onnx import TensorProto, helper

import dyndq


def test_schema_is_registered_with_onnx():
    s = onnx.defs.get_schema("DynamicDequantize", 1, dyndq.DOMAIN)
    assert s.since_version == 1 and s.domain == dyndq.DOMAIN
    assert [(i.name, i.type_str, i.option.name) for i in s.inputs] == [
        ("src", "T1", "Single"), ("scales", "T2", "Single"), ("zps", "T3", "Optional")]
    assert [(o.name, o.type_str) for o in s.outputs] == [("dst", "T2")]
    assert {c.type_param_str: sorted(c.allowed_type_strs) for c in s.type_constraints} == {
        "T1": ["tensor(int8)", "tensor(uint8)"], "T2": ["tensor(float)"],
        "T3": ["tensor(int32)", "tensor(int8)", "tensor(uint8)"]}
    assert s.attributes["qtype"].default_value.s == b"per_tensor"
    assert s.attributes["axis"].default_value.i == 1
    assert s.has_type_and_shape_inference_function


def test_importing_twice_and_from_two_modules_is_harmless():
    code = (
        "import importlib, onnx.defs, dyndq, dyndq.schema\n"
        "importlib.reload(dyndq)\n"
        "dyndq.schema.register_all()\n"
        "import dyndq.checker\n"
        "print(len([s for s in onnx.defs.get_all_schemas_with_history() if s.domain == dyndq.DOMAIN]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(len(dyndq.opdefs.versions_of(dyndq.DOMAIN, "DynamicDequantize")))


# (every valid row fully checked and strictly inferred, every invalid one refused naming the node:
# tests/test_opcheck.py)


def test_inference_keeps_symbolic_dims():
    node = dyndq.make_node(["x", "s"], ["y"], qtype="per_channel", axis=1, name="dq")
    relu = helper.make_node("Relu", ["y"], ["r"])
    graph = helper.make_graph(
        [node, relu], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT8, ["N", 16]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [16])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)])
    inferred = onnx.shape_inference.infer_shapes(dyndq.make_model(graph), strict_mode=True)
    y = next(v for v in inferred.graph.value_info if v.name == "y")
    assert y.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_param or d.dim_value for d in y.type.tensor_type.shape.dim] == ["N", 16]


def test_a_process_that_registered_the_schema_ends():
    """Our schemas hold a Python inference function; they are deregistered at exit, or with
    some onnx versions (1.19) the interpreter hangs while shutting down."""
    code = "import dyndq, onnx.defs; assert onnx.defs.has('DynamicDequantize', 1, dyndq.DOMAIN)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
