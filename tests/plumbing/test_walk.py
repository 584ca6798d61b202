"""dyndq.plumbing.walk: every node of every scope, named as messages name it, and the scopes a rewrite
edits, each resolving names as ONNX does (its own values, else the enclosing scope's)."""
import numpy as np
from onnx import TensorProto as T, helper, numpy_helper as nh

from dyndq.plumbing.walk import graphs, is_constant_node, scopes, walk, with_nested


def nested_model():
    """main: Constant c, If "branch" (then: Neg of the main graph's w; else: Identity of its own
    initializer e), Abs; a function local::F importing ai.onnx 18 (a Constant k, Add)."""
    then = helper.make_graph([helper.make_node("Neg", ["w"], ["t"], name="neg")], "then", [],
                             [helper.make_tensor_value_info("t", T.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["e"], ["o"], name="id")], "else", [],
                              [helper.make_tensor_value_info("o", T.FLOAT, [2])], [nh.from_array(np.ones(2, np.float32), "e")])
    nodes = [helper.make_node("Constant", [], ["c"], name="c_const", value=nh.from_array(np.array(True), "c")),
             helper.make_node("If", ["c"], ["y0"], name="branch", then_branch=then, else_branch=other),
             helper.make_node("Abs", ["y0"], ["y"], name="abs")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2])],
                              [nh.from_array(np.full(2, 3.0, np.float32), "w"), nh.from_array(np.zeros(2, np.float32), "x")])
    f = helper.make_function("local", "F", ["a"], ["b"], [
        helper.make_node("Constant", [], ["k"], value=nh.from_array(np.ones(2, np.float32), "k")),
        helper.make_node("Add", ["a", "k"], ["b"])], [helper.make_opsetid("", 18)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)],
                             functions=[f])


def test_walk_gives_each_node_before_its_bodies_then_the_functions_with_their_own_imports():
    model = nested_model()
    sites = list(walk(model))
    assert [(s.graph, s.index, s.node.op_type) for s in sites] == [
        ("main", 0, "Constant"), ("main", 1, "If"), ("main/branch.else_branch", 0, "Identity"),
        ("main/branch.then_branch", 0, "Neg"), ("main", 2, "Abs"),
        ("function local::F", 0, "Constant"), ("function local::F", 1, "Add")]
    assert [s.opsets[""] for s in sites] == [21] * 5 + [18] * 2
    assert [s.in_function for s in sites] == [False] * 5 + [True] * 2
    assert {s.scope for s in sites} == {"main", "function local::F"}
    sites[-1].node.op_type = "Sub"  # the protos are the model's own
    assert model.functions[0].node[1].op_type == "Sub"


def test_graphs_and_with_nested_reach_every_body():
    model = nested_model()
    assert [g.name for g in graphs(model.graph)] == ["g", "else", "then"]  # (make_node sorts attributes by name)
    assert [n.op_type for n in with_nested(model.graph.node[1])] == ["If", "Identity", "Neg"]


def test_scopes_come_in_pre_order_so_that_reversed_every_body_comes_before_its_graph():
    paths = [s.path for s in scopes(nested_model())]
    assert paths == ["main", "main/branch.else_branch", "main/branch.then_branch", "function local::F"]
    reversed_paths = paths[::-1]
    assert reversed_paths.index("main/branch.then_branch") < reversed_paths.index("main")


def test_a_scope_resolves_names_as_onnx_does():
    main, other, then, function = scopes(nested_model())
    assert then.parent is main and then.top is main and function.parent is None and function.in_function
    assert then.resolve("w") is main and then.resolve("t") is then and then.resolve("nothing") is None
    assert other.constant("e") is not None and other.resolve("e") is other
    # an initializer that is also a graph input is fed, not a constant; a Constant node's value is one
    assert main.fed("x") and main.constant("x") is None
    assert main.constant("w") is not None and not main.constant_node("w")
    assert main.constant_node("c") and main.constant("c").data_type == T.BOOL
    assert function.constant_node("k") and function.fed("a") and function.outputs == ["b"]
    assert main.maker("y0")[0] == 1 and main.maker("y0")[1].op_type == "If"


def test_a_scope_sees_an_edit_once_told_it_changed():
    model = nested_model()
    main = scopes(model)[0]
    assert "z" not in main.defines()
    main.nodes.append(helper.make_node("Relu", ["y"], ["z"]))
    assert "z" not in main.defines()  # (cached)
    main.changed()
    assert "z" in main.defines()


def test_a_constant_node_is_one_output_and_one_value():
    value = nh.from_array(np.ones(1, np.float32), "v")
    assert is_constant_node(helper.make_node("Constant", [], ["v"], value=value))
    assert is_constant_node(helper.make_node("Constant", [], ["v"], domain="ai.onnx", value=value))
    assert not is_constant_node(helper.make_node("Constant", [], ["v"], domain="other", value=value))
    assert not is_constant_node(helper.make_node("Identity", ["a"], ["v"]))
