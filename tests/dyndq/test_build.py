"""make_node, opset_import and make_model."""
import onnx
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
    assert (imp.domain, imp.version) == (dyndq.DOMAIN, 2)  # the newest version
    graph = onnx.helper.make_graph([], "g", [], [])
    model = dyndq.make_model(graph, opset=21)
    assert {o.domain: o.version for o in model.opset_import} == {"": 21, dyndq.DOMAIN: 2}
    assert model.ir_version == 10  # what opset 21 needs; ONNX Runtime refuses newer IRs than it knows
