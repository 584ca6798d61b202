"""dyndq.converters.walker, called directly (no rule table): what its docstring promises.

`rewrite_model` offers every node of every scope (the main graph, If bodies, a model-local
function) with bodies before the graph holding them, edits the model in place (a body rewritten
before its If node is kept once the If's graph is rewritten too), shares equal tensors derived
from one source, gives the source's name and place back to the one tensor derived in role "",
imports the domains a rewrite names and refuses one needing a newer ai.onnx than its scope's.
`rewrite_constants` offers every constant in the model's order through a store; `settle` passes
in the constants a function's opset cannot hold, aligns our domain and raises the IR version.
(Rules of constants in a graph, a function and a body, as quantize uses them: test_constant_rules.py.)
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.converters.rewrite import Rewrite
from dyndq.converters.walker import Store, rewrite_constants, rewrite_model, settle
from dyndq.opdefs import Refusal
from dyndq.plumbing.function_inputs import PASSED_IN
from dyndq.plumbing.names import NameScope, all_names
from dyndq.plumbing.opsets import scope_opsets

TOY = "test.walker"


class Untyped:
    """The value types `rewrite_model` asks: nothing is known (the rules here ask nothing)."""

    def specs_at(self, path):
        return lambda name: None


def vi(name, t=T.FLOAT, shape=(2,)):
    return helper.make_tensor_value_info(name, t, list(shape))


def f32(values, name):
    return nh.from_array(np.asarray(values, np.float32), name)


def nested_model():
    """main: If "branch" (then: Neg of the main graph's w; else: Neg of its own e), Abs(w) "abs",
    Add; a function local::F (Constant k, Neg) called last."""
    then = helper.make_graph([helper.make_node("Neg", ["w"], ["t"], name="then_neg")], "then", [], [vi("t")])
    other = helper.make_graph([helper.make_node("Neg", ["e"], ["o"], name="else_neg")], "else", [], [vi("o")],
                              [f32([5, 6], "e")])
    f = helper.make_function("local", "F", ["a"], ["b"], [
        helper.make_node("Constant", [], ["k"], value=f32([1, 1], "k")),
        helper.make_node("Neg", ["k"], ["kn"], name="f_neg"), helper.make_node("Add", ["a", "kn"], ["b"])],
        [helper.make_opsetid("", 18)])
    nodes = [helper.make_node("If", ["c"], ["y0"], name="branch", then_branch=then, else_branch=other),
             helper.make_node("Abs", ["w"], ["w_abs"], name="abs"), helper.make_node("Add", ["y0", "w_abs"], ["y1"]),
             helper.make_node("F", ["y1"], ["y"], domain="local")]
    graph = helper.make_graph(nodes, "g", [vi("c", T.BOOL, ())], [vi("y")], [f32([3, 4], "w")])
    return helper.make_model(graph, functions=[f], ir_version=10,
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)])


def to_toy(node, view, source=None):
    """Replace a Neg by test.walker::Negate (reading, when `source` is given, a tensor derived from it)."""
    inputs = list(node.input)
    rw = Rewrite([node], [], domains={TOY: 1})
    if source is not None:
        made = view.names.fresh(f"{source}_neg")
        rw.initializers.append(nh.from_array(-view.constant(source), made))
        rw.derived[made] = (source, "")
        inputs = [made]
    rw.nodes.append(helper.make_node("Negate" if source is None else "Copy", inputs, list(node.output),
                                     name=f"{node.name}_toy", domain=TOY))
    return rw


def test_every_scope_is_offered_bodies_and_functions_before_the_main_graph_and_told_in_the_models_order():
    model = nested_model()
    asked = []

    def convert(node, view):
        asked.append((node.name or node.op_type, view.in_function))
        return to_toy(node, view) if node.op_type == "Neg" else None

    outcomes = rewrite_model(model, convert, Untyped(), NameScope(all_names(model)))
    assert asked == [("Constant", True), ("f_neg", True), ("Add", True), ("then_neg", False), ("else_neg", False),
                     ("branch", False), ("abs", False), ("Add", False), ("F", False)]
    assert [(o.graph, o.name) for o in outcomes] == [
        ("main/branch.else_branch", "else_neg"), ("main/branch.then_branch", "then_neg"), ("function local::F", "f_neg")]
    branch = model.graph.node[0]
    bodies = {a.name: [(n.op_type, n.domain) for n in a.g.node] for a in branch.attribute}
    assert bodies == {"then_branch": [("Negate", TOY)], "else_branch": [("Negate", TOY)]}
    assert [n.op_type for n in model.functions[0].node] == ["Constant", "Negate", "Add"]
    # each scope holding a new node imports its domain (the function beside its own ai.onnx 18)
    assert scope_opsets(model.opset_import)[TOY] == 1
    assert scope_opsets(model.functions[0].opset_import) == {"": 18, TOY: 1}


def test_a_body_rewritten_first_is_kept_when_the_graph_holding_it_is_rewritten_in_place():
    model = nested_model()
    branch = model.graph.node[0]

    def convert(node, view):
        if node.op_type == "Neg":
            return to_toy(node, view)
        if node.name == "abs":  # (the main graph changes after its If's bodies did)
            return Rewrite([node], [helper.make_node("Relu", list(node.input), list(node.output), name="relu")])
        return None

    rewrite_model(model, convert, Untyped(), NameScope(all_names(model)))
    assert [n.name for n in model.graph.node[:2]] == ["branch", "relu"]
    assert model.graph.node[0] is branch  # (never copied: the body edited before is the model's)
    assert [n.op_type for a in branch.attribute for n in a.g.node] == ["Negate", "Negate"]


def test_equal_derived_tensors_are_one_and_the_one_in_role_value_takes_its_sources_name_and_place():
    model = nested_model()
    model.graph.node[1].CopyFrom(helper.make_node("Neg", ["w"], ["w_abs"], name="main_neg"))  # (w read twice, by Negs)

    def convert(node, view):
        return to_toy(node, view, source="w") if node.name in ("then_neg", "main_neg") else None

    outcomes = rewrite_model(model, convert, Untyped(), NameScope(all_names(model)))
    assert len([o for o in outcomes if o.rewrite]) == 2
    [w] = model.graph.initializer  # (one tensor for both, in the main graph that holds w; w itself gone)
    assert w.name == "w" and nh.to_array(w).tolist() == [-3, -4]
    then = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
    assert [list(n.input) for n in then.node] == [["w"]] and list(model.graph.node[1].input) == ["w"]


def test_a_rewrite_needing_a_newer_ai_onnx_than_its_scope_imports_is_refused_naming_both():
    model = nested_model()
    before = model.SerializeToString()

    def convert(node, view):
        if node.name != "f_neg":
            return None
        rw = to_toy(node, view)
        rw.domains[""], rw.needs_why = 21, "a made-up need"
        return rw

    [said] = rewrite_model(model, convert, Untyped(), NameScope(all_names(model)))
    assert said.rewrite is None and said.graph == "function local::F"
    assert "opset 21 (a made-up need)" in said.reason and "the function imports 18" in said.reason
    assert model.SerializeToString() == before


class Recording(Store):
    def __init__(self):
        self.calls = []

    def array(self, tensor):
        self.calls.append(("read", tensor.name))
        return super().array(tensor)

    def put(self, tensor):
        self.calls.append(("put", tensor.name))
        return tensor

    def keep(self, tensor):
        self.calls.append(("keep", tensor.name))


def test_rewrite_constants_offers_every_constant_in_the_models_order_through_the_store():
    model = nested_model()
    model.graph.initializer.append(f32([7, 8], "unread"))
    model.graph.node.insert(0, helper.make_node("Constant", [], ["kc"], value=f32([0, 0], "kc")))
    store, offered = Recording(), []

    def convert(held, view):
        offered.append((held.scope.path, held.name, held.node is not None))
        if held.name != "w":
            return Refusal("not mine", mine=False)
        half = nh.from_array(view.read(held.tensor).astype(np.float16), "w_half")
        back = helper.make_node("Cast", ["w_half"], ["w_back"], to=T.FLOAT)
        readers = [(n, i, "w_back") for n in (model.graph.node[2],) for i, x in enumerate(n.input) if x == "w"]
        return Rewrite([], [back], [half], rewires=readers)

    outcomes = rewrite_constants(model, convert, NameScope(all_names(model)), store)
    assert offered == [("main", "w", False), ("main", "unread", False), ("main", "kc", True),
                       ("main/branch.else_branch", "e", False), ("function local::F", "k", True)]
    assert [o.name for o in outcomes if o.rewrite] == ["w"]
    assert store.calls == [("read", "w"), ("put", "w_half"), ("keep", "w"), ("keep", "unread"), ("keep", "e")]
    # the new tensor before its constant, which stays (the then body reads it); the Cast first in the graph
    assert [t.name for t in model.graph.initializer] == ["w_half", "w", "unread"]
    assert [n.op_type for n in model.graph.node][:3] == ["Cast", "Constant", "If"]
    assert list(model.graph.node[3].input) == ["w_back"]


def test_settle_passes_in_what_a_function_cannot_hold_aligns_our_domain_and_raises_the_ir_version():
    f = helper.make_function("local", "F", ["a"], ["b"], [
        helper.make_node("Constant", [], ["q"], value=helper.make_tensor("q", T.INT2, [2], [1, -1])),
        dyndq.make_node(["q", "a"], ["b"])], [helper.make_opsetid("", 21), helper.make_opsetid(dyndq.DOMAIN, 2)])
    graph = helper.make_graph([helper.make_node("F", ["s"], ["y"], domain="local")], "g", [vi("s", shape=(1,))], [vi("y")])
    model = helper.make_model(graph, functions=[f], ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("local", 1), helper.make_opsetid(dyndq.DOMAIN, 1)])
    settle(model)
    f = model.functions[0]
    assert [t.name for t in model.graph.initializer] == ["q"] and list(f.input) == ["a", "q"]
    assert [n.op_type for n in f.node] == ["DynamicDequantize"] and PASSED_IN in {p.key for p in f.metadata_props}
    assert scope_opsets(model.opset_import)[dyndq.DOMAIN] == scope_opsets(f.opset_import)[dyndq.DOMAIN] == 2
    assert model.ir_version == 13
    onnx.checker.check_model(model)
