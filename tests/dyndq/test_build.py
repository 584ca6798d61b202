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


def _with_function(function_version, graph_version):
    """A graph whose own DynamicDequantize is of `graph_version` (uint2 codes: 3; uint8 beside a
    per_group: 2) calling local::Deq, a function importing org.dyndq at `function_version`."""
    import ml_dtypes
    import numpy as np

    fn = onnx.helper.make_function(
        "local", "Deq", ["q", "s"], ["w"], [dyndq.make_node(["q", "s"], ["w"], version=function_version)],
        [onnx.helper.make_opsetid("", 21), onnx.helper.make_opsetid(dyndq.DOMAIN, function_version)])
    codes = {3: TensorProto.UINT2, 2: TensorProto.UINT8}[graph_version]
    attrs = {"qtype": "per_group", "group_shape": [2]} if graph_version == 2 else {}
    t = onnx.helper.make_tensor_value_info
    graph = onnx.helper.make_graph(
        [dyndq.make_node(["a", "s2" if graph_version == 2 else "s"], ["b"], version=graph_version, **attrs),
         onnx.helper.make_node("Deq", ["a8", "s"], ["c"], domain="local")], "g",
        [t("a", codes, [4]), t("s2", TensorProto.FLOAT, [2]), t("a8", TensorProto.UINT8, [4]),
         t("s", TensorProto.FLOAT, [1])],
        [t("b", TensorProto.FLOAT, [4]), t("c", TensorProto.FLOAT, [4])])
    feeds = {"a": np.array([0, 1, 2, 3], ml_dtypes.uint2 if graph_version == 3 else np.uint8), "s2": np.array([0.5, 2], np.float32),
             "a8": np.array([0, 1, 2, 250], np.uint8), "s": np.array([0.25], np.float32)}
    return graph, fn, feeds


@pytest.mark.parametrize("function_version, graph_version", [(3, 2), (2, 3)])
def test_make_model_imports_our_domain_at_one_version_for_the_graph_and_its_functions(function_version, graph_version):
    """ONNX's checker resolves a function's nodes under the function's import and the model's, and
    refuses the model where they differ: both import the newer version (a superset of the older)."""
    import numpy as np

    graph, fn, feeds = _with_function(function_version, graph_version)
    before = fn.SerializeToString()
    model = dyndq.make_model(graph, functions=[fn], versions={"local": 1})
    assert fn.SerializeToString() == before  # (the function given is left as it was)
    assert {o.domain: o.version for o in model.opset_import} == {"": 21, dyndq.DOMAIN: 3, "local": 1}
    assert {o.domain: o.version for o in model.functions[0].opset_import} == {"": 21, dyndq.DOMAIN: 3}
    onnx.checker.check_model(model, full_check=True)
    assert dyndq.check(model) == []
    out = dyndq.run(model, feeds, engine="reference")
    assert out["b"].tolist() == ([0, 0.5, 4, 6] if graph_version == 2 else [0, 0.25, 0.5, 0.75])
    assert out["c"].tolist() == [0, 0.25, 0.5, 62.5]


def test_make_model_refuses_a_function_needing_a_newer_version_than_the_one_pinned_naming_it():
    graph, fn, _ = _with_function(3, 2)
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.make_model(graph, functions=[fn], versions={dyndq.DOMAIN: 2, "local": 1})
    [p] = e.value.problems
    assert p.graph == "function local::Deq" and "version 3" in str(p) and "version 2" in str(p)
