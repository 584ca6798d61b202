"""dyndq.onednn's handlers: one per kind, in one table, each the single source of its kind's
attribute spec (the reader's validation and the writer's types), mapping, inverse and
example-input rule."""
import json

import numpy as np
import pytest
from onnx import TensorProto, helper

import dyndq
from dyndq import onednn
from dyndq.onednn import handler as handlers
from dyndq.onednn.handler import Attr, Handler, inverse_table
from dyndq.opdefs import DYNAMIC_DEQUANTIZE_2


def _one(kind, attrs, shape=(2, 3)):
    lt = lambda i: {"id": i, "dtype": "f32", "shape": list(shape), "stride": [], "layout_type": "strided",  # noqa: E731
                    "property_type": "variable"}
    return {"version": "3.7.0", "graph": [{"id": 9, "name": "op", "kind": kind, "attrs": attrs,
                                           "inputs": [lt(0)], "outputs": [lt(1)]}]}


def test_dynamic_dequantize_spec_is_its_opdefs_definition():
    spec = onednn.KINDS["DynamicDequantize"].spec
    assert [(a.name, a.type, a.default, a.allowed) for a in spec.values()] == [
        ("qtype", "string", "per_tensor", ("per_tensor", "per_channel", "per_group")),
        ("axis", "s64", 1, ()), ("group_shape", "s64[]", None, ())]
    assert list(spec) == [a.name for a in DYNAMIC_DEQUANTIZE_2.attributes]


def test_the_writer_takes_attribute_types_from_the_spec():
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=-1),
                           helper.make_node("Transpose", ["y"], ["z"], name="t", perm=[1, 0]),
                           dyndq.make_node(["q", "s"], ["w"], name="deq", qtype="per_channel", axis=0)], "g",
                          [vi("x", TensorProto.FLOAT, [2, 3]), vi("q", TensorProto.INT8, [4, 2]),
                           vi("s", TensorProto.FLOAT, [4])],
                          [vi("z", TensorProto.FLOAT, [3, 2]), vi("w", TensorProto.FLOAT, [4, 2])])
    doc = onednn.dump(dyndq.make_model(g))
    attrs = {op["kind"]: op["attrs"] for op in doc["graph"]}
    for kind, written in attrs.items():
        spec = onednn.KINDS[kind].spec
        assert all(a["type"] == spec[name].type for name, a in written.items()), kind
    assert attrs["SoftMax"]["axis"] == {"type": "s64", "value": 1}
    assert attrs["DynamicDequantize"]["qtype"] == {"type": "string", "value": "per_channel"}


@pytest.mark.parametrize("kind, attrs, argument, allowed", [
    ("SoftMax", {"mode": {"type": "string", "value": "sideways"}}, "mode", "'none' or 'inf_as_zero'"),
    ("SoftMax", {"axis": {"type": "s64", "value": "one"}}, "axis", "an s64 integer"),
    ("Pow", {}, "beta", "an f32 number (required)"),
    ("GELU", {"mode": {"type": "string", "value": 3}}, "mode", "'gelu_erf' or 'gelu_tanh'"),
    ("ReLU", {"alpha": {"type": "f32", "value": 0.1}}, "alpha", "the attributes this mapping honours: none"),
    ("StaticReshape", {"shape": {"type": "s64[]", "value": [6]}, "special_zero": {"type": "bool", "value": "maybe"}},
     "special_zero", "a bool (true/false or 0/1)"),
])
def test_the_reader_validates_attributes_from_the_spec(kind, attrs, argument, allowed):
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(_one(kind, attrs))
    [p] = e.value.problems
    assert (p.op_id, p.op, p.argument, p.allowed) == (9, kind, argument, allowed)
    assert p.node_index is None and "node 9 'op'" in str(p)


def test_every_inverse_op_type_belongs_to_one_handler():
    table = inverse_table()
    assert {"MatMul", "Add", "Softmax", "Where", "Identity", "DynamicDequantize"} <= set(table)
    assert all(h.from_onnx is not None for h in table.values())


def test_a_new_kind_is_one_handler(monkeypatch):
    """A kind registered alone (mapping, spec, inverse, example rule) loads, runs, dumps and
    gets its example inputs, with no other file touched."""
    def negate(e, attrs):
        e.float_op("Neg", [0])

    monkeypatch.setitem(handlers.KINDS, "Negate", Handler(
        "Negate", negate, attrs=(Attr("flavour", "string", "plain", ("plain",)),), onnx_types=("Neg",),
        from_onnx=lambda w: {"flavour": "plain"}, example=lambda i, draw: draw.floats(5.0, 6.0)))
    model, report = onednn.load(_one("Negate", {"flavour": {"type": "string", "value": "plain"}}))
    feeds = onednn.example_inputs(model, 0)
    [x] = feeds.values()
    assert ((x >= 5) & (x < 6)).all()
    [y] = dyndq.run(model, feeds).values()
    assert np.array_equal(y, -x)
    bare = dyndq.make_model(helper.make_graph(
        [helper.make_node("Neg", ["a"], ["b"], name="n")], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [2])]))
    doc = onednn.dump(bare)
    assert doc["graph"][0]["kind"] == "Negate" and doc["graph"][0]["attrs"] == {
        "flavour": {"type": "string", "value": "plain"}}
    assert json.dumps(doc)
