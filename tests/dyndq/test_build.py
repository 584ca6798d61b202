"""make_node, opset_import and make_model."""
import onnx
from onnx import TensorProto
import pytest

import dyndq


def test_make_node_in_our_domain_with_attributes():
    node = dyndq.make_node(["x", "s", "z"], ["y"], qtype="per_channel", axis=-1, name="dq")
    assert (node.op_type, node.domain, node.name) == ("DynamicDequantize", dyndq.DOMAIN, "dq")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {"qtype": b"per_channel", "axis": -1}
    assert dyndq.make_node(["x", "s"], ["y"]).input == ["x", "s"]


@pytest.mark.parametrize("kwargs, arg", [
    ({"qtype": "per_group"}, "qtype"), ({"qtype": None}, "qtype"),
    ({"axis": 1.0}, "axis"), ({"axis": "1"}, "axis"), ({"axis": True}, "axis"),
])
def test_make_node_refuses_bad_attributes_at_once(kwargs, arg):
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.make_node(["x", "s"], ["y"], name="dq", version=1, **kwargs)
    [p] = e.value.problems
    assert p.argument == arg and p.node == "dq"


@pytest.mark.parametrize("inputs, outputs", [(["x"], ["y"]), (["x", "s", "z", "w"], ["y"]), (["x", "s"], [])])
def test_make_node_refuses_wrong_arity(inputs, outputs):
    with pytest.raises(dyndq.ValidationError):
        dyndq.make_node(inputs, outputs)


def test_opset_import_and_ir_version():
    imp = dyndq.opset_import()
    assert (imp.domain, imp.version) == (dyndq.DOMAIN, 3)  # the newest version
    graph = onnx.helper.make_graph([], "g", [], [])
    model = dyndq.make_model(graph, opset=21)
    assert {o.domain: o.version for o in model.opset_import} == {"": 21, dyndq.DOMAIN: 3}
    assert model.ir_version == 10  # what opset 21 needs; ONNX Runtime refuses newer IRs than it knows


@pytest.mark.parametrize("src, scales, attrs, version", [
    (TensorProto.INT8, TensorProto.FLOAT, {}, 1),
    (TensorProto.INT8, TensorProto.FLOAT, {"qtype": "per_group", "group_shape": [4]}, 2),
    (TensorProto.INT4, TensorProto.FLOAT16, {}, 2),
    (TensorProto.INT2, TensorProto.FLOAT, {}, 3),
    (TensorProto.FLOAT4E2M1, TensorProto.FLOAT8E8M0, {"output_dtype": TensorProto.FLOAT}, 3),
    (TensorProto.INT8, TensorProto.FLOAT, {"output_dtype": TensorProto.FLOAT16}, 3),
    (None, TensorProto.FLOAT, {}, 3),  # src's type not declared: the newest version holds whatever it is
])
def test_make_model_imports_the_version_its_nodes_need(src, scales, attrs, version):
    node = dyndq.make_node(["x", "s"], ["y"], **attrs)
    inputs = [onnx.helper.make_tensor_value_info("s", scales, [1])]
    nodes = [node]
    if src is None:
        nodes.insert(0, onnx.helper.make_node("Identity", ["x0"], ["x"]))
        inputs.append(onnx.helper.make_tensor_value_info("x0", TensorProto.INT8, [4]))
    else:
        inputs.append(onnx.helper.make_tensor_value_info("x", src, [4]))
    graph = onnx.helper.make_graph(nodes, "g", inputs, [onnx.helper.make_tensor_value_info("y", 0, None)])
    model = dyndq.make_model(graph)
    assert {o.domain: o.version for o in model.opset_import}[dyndq.DOMAIN] == version
