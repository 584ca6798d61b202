"""dyndq.check: every problem with our op in a model, each naming node, argument and what is allowed."""
import json

import onnx
import pytest
from cases import Case, VALID, case_model, vi
from onnx import TensorProto, helper

import dyndq


# (every row of the shared table through check, with scales/zps as inputs and as initializers, each
# invalid one naming node, argument and what is allowed: tests/test_opcheck.py)


def test_type_constraint_problems_say_the_allowed_types():
    [p] = dyndq.check(case_model(Case("x", ("float16", (2, 3)), ("float32", (1,)))))
    assert (p.argument, p.found, p.allowed) == ("src", "dtype float16", "T1 = int8 | uint8")
    [p] = dyndq.check(case_model(Case("x", ("int8", (2, 3)), ("float64", (1,)))))
    assert (p.argument, p.allowed) == ("scales", "T2 = float32")
    [p] = dyndq.check(case_model(Case("x", ("int8", (2, 3)), ("float32", (1,)), ("uint16", (1,)))))
    assert (p.argument, p.allowed) == ("zps", "T3 = int8 | uint8 | int32")


def test_all_problems_at_once_across_nodes():
    good = dyndq.make_node(["x", "s1"], ["y1"], name="ok")
    bad1 = dyndq.make_node(["x", "s3"], ["y2"], name="bad_len")              # per_tensor with 3 scales
    bad2 = dyndq.make_node(["x", "s3"], ["y3"], qtype="per_channel", axis=4, name="bad_axis")
    graph = helper.make_graph(
        [good, bad1, bad2], "g",
        [vi("x", TensorProto.INT8, [2, 3]), vi("s1", TensorProto.FLOAT, [1]), vi("s3", TensorProto.FLOAT, [3])],
        [vi(y, TensorProto.FLOAT, [2, 3]) for y in ("y1", "y2", "y3")])
    problems = dyndq.check(dyndq.make_model(graph))
    assert [(p.node, p.node_index, p.argument) for p in problems] == [("bad_len", 1, "scales"), ("bad_axis", 2, "axis")]


def test_missing_opset_import_for_our_domain():
    model = case_model(VALID[0])
    del model.opset_import[1]
    [p] = dyndq.check(model)
    assert p.argument == "opset_import" and dyndq.DOMAIN in p.found
    assert p.allowed == f"an opset import of {dyndq.DOMAIN!r} at version 1..3"


@pytest.mark.parametrize("version", [0, 4, 99])
def test_domain_version_we_do_not_have(version):
    model = case_model(VALID[0], domain_version=version)
    problems = dyndq.check(model)
    assert [p.argument for p in problems] == ["opset_import"]
    assert f"version {version}" in problems[0].found and problems[0].node == "dq"


def test_unknown_op_in_our_domain():
    node = helper.make_node("DynamicQuantize", ["x"], ["y"], domain=dyndq.DOMAIN, name="q")
    graph = helper.make_graph([node], "g", [vi("x", TensorProto.FLOAT, [2])], [vi("y", TensorProto.INT8, [2])])
    problems = dyndq.check(dyndq.make_model(graph))
    assert problems[0].argument == "op_type" and "DynamicDequantize" in problems[0].allowed


def test_attribute_of_wrong_type_and_unknown_attribute():
    node = helper.make_node("DynamicDequantize", ["x", "s"], ["y"], domain=dyndq.DOMAIN, name="dq",
                            qtype="per_channel", axis="1", group_shape=[1, 8])
    graph = helper.make_graph([node], "g", [vi("x", TensorProto.INT8, [2, 3]), vi("s", TensorProto.FLOAT, [3])],
                              [vi("y", TensorProto.FLOAT, [2, 3])])
    problems = dyndq.check(dyndq.make_model(graph, versions={dyndq.DOMAIN: 1}))  # group_shape: version 2's
    by_arg = {p.argument: p for p in problems}
    assert set(by_arg) == {"axis", "group_shape"}
    assert "STRING" in by_arg["axis"].found and by_arg["axis"].allowed == "type INT"
    assert by_arg["group_shape"].found == "an unknown attribute"


def test_wrong_number_of_inputs_and_outputs():
    node = helper.make_node("DynamicDequantize", ["x", "s", "z", "w"], ["y", "extra"], domain=dyndq.DOMAIN, name="dq")
    graph = helper.make_graph(
        [node], "g", [vi(n, TensorProto.INT8, [1]) for n in "xzw"] + [vi("s", TensorProto.FLOAT, [1])],
        [vi("y", TensorProto.FLOAT, [1]), vi("extra", TensorProto.FLOAT, [1])])
    args = {p.argument for p in dyndq.check(dyndq.make_model(graph))}
    assert {"inputs", "outputs"} <= args


def test_missing_required_input():
    node = helper.make_node("DynamicDequantize", ["x", ""], ["y"], domain=dyndq.DOMAIN, name="dq")
    graph = helper.make_graph([node], "g", [vi("x", TensorProto.INT8, [1])], [vi("y", TensorProto.FLOAT, [1])])
    problems = dyndq.check(dyndq.make_model(graph))
    assert any(p.argument == "scales" and p.found == "missing" for p in problems)


def _if_model(then_axis):
    """An If whose then-branch holds a DynamicDequantize reading the outer scope."""
    inner = dyndq.make_node(["x", "s"], ["y_then"], qtype="per_channel", axis=then_axis, name="inner_dq")
    then_g = helper.make_graph([inner], "then", [], [vi("y_then", TensorProto.FLOAT, [2, 3])])
    else_g = helper.make_graph([helper.make_node("Constant", [], ["y_else"], value=onnx.numpy_helper.from_array(
        __import__("numpy").zeros((2, 3), "float32")))], "else", [], [vi("y_else", TensorProto.FLOAT, [2, 3])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")
    graph = helper.make_graph([node], "g", [vi("c", TensorProto.BOOL, []), vi("x", TensorProto.UINT8, [2, 3]),
                                            vi("s", TensorProto.FLOAT, [3])], [vi("y", TensorProto.FLOAT, [2, 3])])
    return dyndq.make_model(graph)


def test_subgraph_nodes_are_checked_and_located():
    assert dyndq.check(_if_model(1)) == []
    [p] = dyndq.check(_if_model(0))
    assert (p.graph, p.node, p.node_index, p.argument) == ("main/branch.then_branch", "inner_dq", 0, "scales")


def test_model_local_functions_are_checked():
    body = helper.make_node("DynamicDequantize", ["a", "b"], ["c"], domain=dyndq.DOMAIN, name="f_dq", qtype="per_row")
    fn = helper.make_function("local", "Deq", ["a", "b"], ["c"], [body], [dyndq.opset_import()])
    call = helper.make_node("Deq", ["x", "s"], ["y"], domain="local", name="call")
    graph = helper.make_graph([call], "g", [vi("x", TensorProto.INT8, [2]), vi("s", TensorProto.FLOAT, [1])],
                              [vi("y", TensorProto.FLOAT, [2])])
    model = dyndq.make_model(graph, functions=[fn])
    model.opset_import.append(helper.make_opsetid("local", 1))
    [p] = dyndq.check(model)
    assert (p.graph, p.node, p.argument) == ("function local::Deq", "f_dq", "qtype")


def test_problems_elsewhere_in_the_model_come_from_onnx_checker():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                              [vi("x", TensorProto.FLOAT, [2])], [vi("y", TensorProto.FLOAT, None)])
    [p] = dyndq.check(dyndq.make_model(graph))
    assert p.argument == "model" and "onnx.checker" in p.found and "shape" in p.found


def test_validation_error_carries_every_problem():
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.validate(_if_model(0))
    assert isinstance(e.value, ValueError) and len(e.value.problems) == 1
    assert "inner_dq" in str(e.value)
    assert json.dumps([p.as_dict() for p in e.value.problems])  # serializable for --json


def test_check_does_not_mutate_the_model():
    model = _if_model(0)
    before = model.SerializeToString()
    dyndq.check(model)
    assert model.SerializeToString() == before


def test_check_refuses_what_is_not_a_model():
    with pytest.raises(TypeError, match="ModelProto"):
        dyndq.check(b"not a model")


def test_unloaded_external_data_is_not_a_problem_of_the_model(tmp_path, monkeypatch):
    """A ModelProto loaded without its external data does not know its folder: its data file
    is judged when it is loaded from its path, not by check (from whatever the current folder is)."""
    case = VALID[0]
    model = case_model(case, inputs_as="initializers", arrays=case.arrays())
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data", size_threshold=0)
    monkeypatch.chdir("/")
    lazy = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    assert any(t.data_location == TensorProto.EXTERNAL for t in lazy.graph.initializer)
    assert dyndq.check(lazy) == []
    assert dyndq.check(onnx.load(tmp_path / "m.onnx")) == []
