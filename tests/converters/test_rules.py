"""The one rewrite registry: what it holds, and a rule added by one decorator reaching every command."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import dyndq
from dyndq.converters import rules
from dyndq.converters.rewrite import Rewrite, context, inputs_of, stand_in
from dyndq.opdefs import DOMAIN, Refusal


def test_every_conversion_is_one_registered_rule():
    held = {(r.kind, r.name) for r in rules.rules()}
    assert held == {
        ("lift", "DequantizeLinear (short last block) -> DynamicDequantize (padded) + Slice"),
        ("lift", "MatMulNBits -> DynamicDequantize + MatMul"),
        ("lift", "GatherBlockQuantized -> DynamicDequantize + Gather"),
        ("lift", "a standard node -> one of ours, by the op version's lifting"),
        ("write", "DynamicDequantize + MatMul -> MatMulNBits"),
        ("write", "DynamicDequantize + Gather -> GatherBlockQuantized"),
        ("lower", "DynamicDequantize (padded) + Slice -> DequantizeLinear (short last block)"),
        ("lower", "one of ours -> standard ONNX, by the op version's lowering"),
    }
    assert [r.name for r in rules.rules("write", "onnxruntime")] == [
        "DynamicDequantize + MatMul -> MatMulNBits", "DynamicDequantize + Gather -> GatherBlockQuantized"]
    assert rules.foreign_forms() == {("com.microsoft", "MatMulNBits"), ("com.microsoft", "GatherBlockQuantized")}
    assert [[r.order for r in p] for p in rules.passes("lower", "onnx")] == [[0], [1]]


def test_a_rule_of_a_bad_kind_or_target_is_refused_at_registration():
    with rules.scope():
        with pytest.raises(ValueError, match="kind 'sideways'"):
            rules.rule("x", kind="sideways", pattern=(None, None), check=lambda n, v: None)
        with pytest.raises(ValueError, match="unknown targets"):
            rules.rule("x", kind=rules.WRITE, pattern=(None, None), check=lambda n, v: None, targets=("tvm",))


# A made-up foreign form, the smallest real rule: test.engine::HalfInt8(x) = float32(x) * 0.5,
# lifted into DynamicDequantize-1 per_tensor with a scale of 0.5.

def _check(node, view):
    x = inputs_of(node, 1)[0]
    spec = view.spec(x)
    if spec is None or spec.dtype != "int8":
        return Refusal(f"x is {spec.dtype if spec else 'of unknown type'}, not int8")
    return x


def _lift(x, node, view) -> Rewrite:
    ctx = context(view, node.name or node.output[0])
    half = ctx.const(np.array([0.5], np.float32), "half")
    dst = ctx.op("DynamicDequantize", x, half, domain=DOMAIN, qtype="per_tensor")
    ctx.output_as(dst, node.output[0])
    stand_in(ctx.nodes[-1], node)
    return Rewrite([node], list(ctx.nodes), form="DynamicDequantize per_tensor", domains={DOMAIN: 1})


def _model(x_type):
    graph = helper.make_graph(
        [helper.make_node("HalfInt8", ["x"], ["y"], name="halve", domain="test.engine")], "g",
        [helper.make_tensor_value_info("x", x_type, [3])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("test.engine", 1)],
                             ir_version=10)


def test_a_rule_added_by_one_decorator_is_applied_by_lift_and_by_export():
    with rules.scope():
        rules.rule("HalfInt8 -> DynamicDequantize", kind=rules.LIFT, pattern=("test.engine", "HalfInt8"),
                   check=_check, targets=("onnx",))(_lift)
        lifted, report = dyndq.lift_with_report(_model(TensorProto.INT8))
        assert [n.op_type for n in lifted.graph.node] == ["Constant", "DynamicDequantize"]
        assert report.lifted == [("main", "halve", "DynamicDequantize per_tensor")]
        x = np.array([-3, 0, 5], np.int8)
        assert dyndq.run(lifted, {"x": x})["y"].tolist() == [-1.5, 0.0, 2.5]
        # export to standard ONNX lifts the foreign form through the rule, then lowers it
        exported, report = dyndq.export_with_report(_model(TensorProto.INT8))
        assert {n.domain for n in exported.graph.node} == {""}
        assert (report.foreign[0].op, report.foreign[0].form) == ("test.engine::HalfInt8", "DequantizeLinear")
        # a refusal names the node and the reason
        _, report = dyndq.lift_with_report(_model(TensorProto.UINT8))
        assert [str(s) for s in report.skipped] == ["main: test.engine::HalfInt8 'halve' left alone: x is uint8, not int8"]
    assert all(r.pattern != ("test.engine", "HalfInt8") for r in rules.rules())


def test_options_are_checked_by_the_rules_that_declare_them():
    assert rules.option_problems({"accuracy_level": None}) == []
    assert "MatMulNBits takes 0 (unset)" in rules.option_problems({"accuracy_level": 7})[0]
    assert rules.option_problems({"colour": "red"}) == ["colour: no rewrite rule takes this option"]
