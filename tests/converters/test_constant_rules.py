"""Rules of constants (kind QUANTIZE), applied by the walker's `rewrite_constants`.

A made-up rule: every float32 constant named W* becomes a float16 copy and a Cast back to
float32 (`W_half` -> Cast -> `W_back`), its readers pointed at the Cast's output.  What the
walker does with it is what quantize relies on: the constants of every scope offered in the
model's order, the new tensors in the constant's place (a Constant node in a function, first
there), the nodes first in the scope holding the constant, the readers pointed at them, the
constant and its Identity gone once nothing else reads it, the store handed every initializer
in order, the opset imports of the scope (and the model, for a function).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

from dyndq.converters.rewrite import Rewrite
from dyndq.converters.rules import QUANTIZE, Rule, apply
from dyndq.converters.walker import Store
from dyndq.opdefs import Refusal
from dyndq.plumbing.names import NameScope, all_names
from dyndq.plumbing.walk import scopes

TOY = "test.half"


def _readers(model):
    """(scope path, node, input index) of every input of the model's own nodes reading a W* name, by name."""
    return {(s.path, n.name, k): x for s in scopes(model) for n in s.nodes for k, x in enumerate(n.input)
            if x.startswith("W") and not n.name.endswith(("_Cast", "_mark"))}


class Halves:
    """The rule: check reads the constant through the view's store; rewrite makes W_half + Cast."""

    def __init__(self, model, keep_identities=False):
        self.offered, self.model = [], model
        self.every = {s.path: s for s in scopes(model)}

    def rule(self):
        return Rule("float32 -> float16 + Cast", QUANTIZE, (None, None), self.check, self.rewrite)

    def check(self, held, view):
        self.offered.append((held.scope.path, held.name))
        if not held.name.startswith("W") or held.tensor.data_type != T.FLOAT:
            return Refusal("not mine", mine=False)
        return view.read(held.tensor)

    def rewrite(self, value, held, view):
        half = view.names.fresh(f"{held.name}_half")
        back = view.names.fresh(f"{held.name}_back")
        cast = helper.make_node("Cast", [half], [back], name=f"{held.name}_Cast", to=T.FLOAT)
        mark = helper.make_node("Identity", [back], [view.names.fresh(f"{held.name}_mark")], name=f"{held.name}_mark",
                                domain=TOY)
        rewires, replaces = [], [held.node] if held.node is not None else []
        for s in self.every.values():
            for n in s.nodes:
                for k, x in enumerate(n.input):
                    if x == held.name and n.op_type == "Identity" and n.domain == "":
                        replaces.append(n)
                        rewires += [(r, j, back) for r in s.nodes for j, y in enumerate(r.input) if y == n.output[0]]
                    elif x == held.name and n.op_type == "MatMul":
                        rewires.append((n, k, back))
        return Rewrite(replaces, [cast, mark], [nh.from_array(value.astype(np.float16), half)], "half",
                       domains={TOY: 1}, rewires=rewires)


class Recording(Store):
    def __init__(self):
        self.calls = []

    def put(self, tensor):
        self.calls.append(("put", tensor.name))
        return tensor

    def keep(self, tensor):
        self.calls.append(("keep", tensor.name))


def run(model, store=None):
    rule = Halves(model)
    outcomes = apply(model, [rule.rule()], None, NameScope(all_names(model)), store=store)
    return rule, outcomes


def graph_model():
    """x -> MatMul(W1) -> MatMul(Identity(W2)) -> Add(B) -> y, and W3 read by MatMul and an Add (kept)."""
    w = lambda s, name: nh.from_array(np.random.default_rng(s).standard_normal((4, 4)).astype(np.float32), name)  # noqa: E731
    g = helper.make_graph(
        [helper.make_node("Identity", ["W2"], ["W2_id"], name="id"),
         helper.make_node("MatMul", ["x", "W1"], ["a"], name="mm1"), helper.make_node("MatMul", ["a", "W2_id"], ["b"], name="mm2"),
         helper.make_node("MatMul", ["b", "W3"], ["c"], name="mm3"), helper.make_node("Add", ["c", "W3"], ["y"], name="add")],
        "g", [helper.make_tensor_value_info("x", T.FLOAT, [4, 4])], [helper.make_tensor_value_info("y", T.FLOAT, [4, 4])],
        [nh.from_array(np.ones(2, np.int64), "shape"), w(1, "W1"), w(2, "W2"), w(3, "W3")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_the_walker_places_a_constant_rules_tensors_and_nodes_and_points_the_readers_at_them():
    model = graph_model()
    store = Recording()
    rule, outcomes = run(model, store)
    assert [o.name for o in outcomes if o.rewrite] == ["W1", "W2", "W3"]
    assert rule.offered == [("main", n) for n in ("shape", "W1", "W2", "W3")]
    # the store sees every initializer in the model's order: new ones put, the others kept
    assert store.calls == [("keep", "shape"), ("put", "W1_half"), ("put", "W2_half"), ("put", "W3_half"), ("keep", "W3")]
    assert [t.name for t in model.graph.initializer] == ["shape", "W1_half", "W2_half", "W3_half", "W3"]
    assert [n.name for n in model.graph.node] == ["W1_Cast", "W1_mark", "W2_Cast", "W2_mark", "W3_Cast", "W3_mark",
                                                  "mm1", "mm2", "mm3", "add"]  # (the Identity gone with W2)
    assert _readers(model) == {("main", "mm1", 1): "W1_back", ("main", "mm2", 1): "W2_back", ("main", "mm3", 1): "W3_back",
                               ("main", "add", 1): "W3"}  # (W3 is kept for the Add)
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 21), (TOY, 1)}


def function_model():
    """x -> local::F (Constant W [4, 4], Identity, MatMul) -> y."""
    f = helper.make_function("local", "F", ["a"], ["b"], [
        helper.make_node("Constant", [], ["W"], value=nh.from_array(np.eye(4, dtype=np.float32), "W")),
        helper.make_node("MatMul", ["a", "W"], ["b"], name="mm")], [helper.make_opsetid("", 21)])
    g = helper.make_graph([helper.make_node("F", ["x"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [4, 4])], [helper.make_tensor_value_info("y", T.FLOAT, [4, 4])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)],
                             functions=[f], ir_version=10)


def test_in_a_function_the_new_constants_are_constant_nodes_first_and_the_model_imports_the_domain():
    model = function_model()
    run(model)
    f = model.functions[0]
    assert [(n.op_type, list(n.output)) for n in f.node] == [
        ("Constant", ["W_half"]), ("Cast", ["W_back"]), ("Identity", ["W_mark"]), ("MatMul", ["b"])]
    assert f.node[-1].input == ["a", "W_back"]
    assert (TOY, 1) in {(o.domain, o.version) for o in f.opset_import}
    assert (TOY, 1) in {(o.domain, o.version) for o in model.opset_import}


def test_a_reader_in_a_body_is_pointed_at_the_outer_nodes():
    w = nh.from_array(np.eye(4, dtype=np.float32), "W")
    branch = lambda name: helper.make_graph(  # noqa: E731
        [helper.make_node("MatMul", ["x", "W"], [f"{name}_y"], name=f"{name}_mm")], name, [],
        [helper.make_tensor_value_info(f"{name}_y", T.FLOAT, [4, 4])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch("then"),
                                            else_branch=branch("else"))], "g",
                          [helper.make_tensor_value_info("c", T.BOOL, []), helper.make_tensor_value_info("x", T.FLOAT, [4, 4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [4, 4])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    run(model)
    assert [t.name for t in model.graph.initializer] == ["W_half"]
    assert [n.op_type for n in model.graph.node] == ["Cast", "Identity", "If"]
    assert set(_readers(model).values()) == {"W_back"}


def test_rules_of_constants_and_of_nodes_are_applied_apart():
    model = graph_model()
    node_rule = Rule("any", "lift", (None, None), lambda node, view: Refusal("no"), lambda *a: None)
    with pytest.raises(ValueError, match="apart"):
        apply(model, [Halves(model).rule(), node_rule], None, NameScope(all_names(model)))


def test_a_model_without_any_rewrite_is_left_as_it_was():
    model = graph_model()
    held = {t.name for t in model.graph.initializer}
    for t in model.graph.initializer:
        t.name = "V" + t.name
    for n in model.graph.node:
        n.input[:] = ["V" + x if x in held else x for x in n.input]
    before = model.SerializeToString()
    _, outcomes = run(model)
    assert outcomes == [] and model.SerializeToString() == before
    onnx.checker.check_model(model)
