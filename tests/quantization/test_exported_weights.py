"""Weights where exporters put them: Constant nodes (every form of one that holds floats), behind
Identity nodes, beside MatMuls whose B is an activation; and a model with nothing to quantize."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.cli import main
from dyndq.model_files import save_model
from dyndq.quantization import NothingToQuantize
from dyndq.quantization.numerics import quantize_weight

from engines import run_onnxruntime
from quantize_models import dequantized, exported_attention, heavy


def with_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same model with its Constant nodes' tensors as initializers and its Identity gone."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = []
    for node in out.graph.node:
        if node.op_type == "Constant":
            out.graph.initializer.append(node.attribute[0].t)
        elif node.op_type != "Identity":
            keep.append(node)
    for node in keep:
        node.input[:] = [name[: -len("_id")] if name.endswith("_id") else name for name in node.input]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    return out


@pytest.mark.parametrize("opset", [12, 21])
def test_constant_node_weights_quantize_like_initializers(opset):
    """(paddle2onnx writes opset 11 and 12, whose Constant takes no int4 tensor: the codes are initializers)"""
    model = exported_attention(opset=opset)
    out, report = dyndq.quantize(model, evaluate=False)
    twin, twin_report = dyndq.quantize(with_initializers(model), evaluate=False)
    assert [layer.name for layer in report.layers] == ["E", "Wq", "Wk", "Wv", "Wo"]
    assert [(layer.form, layer.relative_error) for layer in report.layers] == \
        [(layer.form, layer.relative_error) for layer in twin_report.layers]
    assert not report.left_alone
    dyndq.quantize(model, evaluate=False, strict=True)  # (an activation is no weight left alone: strict passes)
    assert report.activations == ("2 MatMuls whose B is an activation (computed by the graph or fed at run time), "
                                  "not a weight: left as they are")
    ops = [n.op_type for n in out.graph.node]
    assert "Identity" not in ops  # (it passed the float weight on; nothing reads that any more)
    assert "Constant" not in ops  # (the float weights are gone; their codes are initializers, which any opset takes)
    assert {f"{w}_quantized" for w in ("E", "Wq", "Wk", "Wv", "Wo")} <= {t.name for t in out.graph.initializer}
    dyndq.check(out)
    onnx.checker.check_model(out, full_check=True)
    ids = np.array([[0, 7, 49, 3]], np.int64)
    got = run_onnxruntime(dyndq.export(out), {"ids": ids})
    want = run_onnxruntime(dyndq.export(twin), {"ids": ids})
    np.testing.assert_array_equal(got[0], want[0])  # (the same weights, the same graph of MatMuls: bit for bit)


def test_an_identity_also_read_as_a_float_keeps_the_weight_for_that_reader():
    model = exported_attention()
    model.graph.output.append(helper.make_tensor_value_info("Wq_id", T.FLOAT, [100, 100]))
    out, report = dyndq.quantize(model, evaluate=False)
    wq = next(layer for layer in report.layers if layer.name == "Wq")
    assert wq.notes == ["also read by graph output 'Wq_id': the float weight is kept for them"]
    assert [n.output[0] for n in out.graph.node if n.op_type == "Identity"] == ["Wq_id"]
    assert "Wq" in [n.output[0] for n in out.graph.node if n.op_type == "Constant"]
    onnx.checker.check_model(out, full_check=True)


@pytest.mark.parametrize("form", ["value", "value_floats"])
def test_every_float_form_of_a_constant_node_is_a_weight(form):
    w = heavy((40,), 3)
    attrs = {"value": nh.from_array(w.reshape(40), "w")} if form == "value" else {"value_floats": w.tolist()}
    g = helper.make_graph([helper.make_node("Constant", [], ["w"], **attrs), helper.make_node("MatMul", ["x", "w"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 40])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    out, report = dyndq.quantize(model, group_size=32, evaluate=False)
    assert [(layer.name, layer.shape) for layer in report.layers] == [("w", [40])]
    assert "padded 40 -> 64 + Slice" in report.layers[0].form
    assert "w" not in [n.output[0] for n in out.graph.node]


def test_an_integer_constant_node_is_named_not_quantized():
    g = helper.make_graph([helper.make_node("Constant", [], ["table"], value_ints=[1, 2, 3]),
                           helper.make_node("Gather", ["table", "i"], ["y"])],
                          "g", [helper.make_tensor_value_info("i", T.INT64, [2])], [helper.make_tensor_value_info("y", T.INT64, [2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    with pytest.raises(NothingToQuantize) as e:
        dyndq.quantize(model)
    assert "data ('table'): found an int64 tensor" in str(e.value)


def attention_only() -> onnx.ModelProto:
    """Q @ K^T and softmax @ V: MatMuls with no weight at all."""
    g = helper.make_graph([
        helper.make_node("Transpose", ["k"], ["kT"], perm=[1, 0]),
        helper.make_node("MatMul", ["q", "kT"], ["s"], name="scores"),
        helper.make_node("Softmax", ["s"], ["a"]),
        helper.make_node("MatMul", ["a", "v"], ["y"], name="attend"),
    ], "g", [helper.make_tensor_value_info(n, T.FLOAT, [4, 8]) for n in "qkv"], [helper.make_tensor_value_info("y", T.FLOAT, [4, 8])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_nothing_to_quantize_says_why_without_a_problem_about_activations():
    with pytest.raises(NothingToQuantize) as e:
        dyndq.quantize(attention_only())
    assert e.value.problems == []
    assert str(e.value) == ("nothing to quantize: no MatMul, Gemm or Gather node reads a constant float weight "
                            "(2 MatMuls whose B is an activation (computed by the graph or fed at run time), not a weight: "
                            "left as they are)")


def test_nothing_to_quantize_on_the_command_line_exits_1(tmp_path, capsys):
    save_model(attention_only(), tmp_path / "a.onnx")
    assert main(["quantize", str(tmp_path / "a.onnx"), str(tmp_path / "q.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{tmp_path / 'a.onnx'}: nothing to quantize (nothing written): no MatMul, Gemm or Gather node")
    assert "2 MatMuls whose B is an activation" in err and "Traceback" not in err and "problem" not in err
    assert not (tmp_path / "q.onnx").exists()


def _constants(model: onnx.ModelProto) -> dict:
    out = {t.name: nh.to_array(t) for t in model.graph.initializer}
    out.update({n.output[0]: nh.to_array(n.attribute[0].t) for n in model.graph.node if n.op_type == "Constant"})
    return out


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_constant_node_weights_written_for_onnxruntime_are_its_own_quantizers_bytes():
    """ONNX Runtime's quantizer (default configuration: MatMul; it reads initializers only) on the
    model with initializers, and ours on the model as the exporter wrote it (Constant nodes, an
    Identity, K = 100 < 128) written for ONNX Runtime: every MatMulNBits the same, byte for byte."""
    ort_quant = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    model = exported_attention()
    twin = with_initializers(model)
    quantizer = ort_quant.MatMulNBitsQuantizer(twin)
    quantizer.process()
    theirs_model = quantizer.model.model
    ours_model = dyndq.export(dyndq.quantize(model, evaluate=False)[0], target="onnxruntime")
    theirs, ours = _constants(theirs_model), _constants(ours_model)

    theirs_by_k = sorted((n for n in theirs_model.graph.node if n.op_type == "MatMulNBits"), key=lambda n: n.output[0])
    ours_by_k = sorted((n for n in ours_model.graph.node if n.op_type == "MatMulNBits"), key=lambda n: n.output[0])
    assert [n.output[0] for n in theirs_by_k] == [n.output[0] for n in ours_by_k] == ["k", "logits", "q", "v"]
    for t, o in zip(theirs_by_k, ours_by_k):
        attrs = lambda n: {a.name: a.i for a in n.attribute if a.name in ("K", "N", "bits", "block_size")}  # noqa: E731
        assert attrs(t) == attrs(o) and attrs(o)["K"] == 100 and attrs(o)["block_size"] == 128
        for i in (1, 2, 3):  # B, scales, zero points
            np.testing.assert_array_equal(ours[o.input[i]], theirs[t.input[i]].reshape(ours[o.input[i]].shape))


def test_constant_nodes_and_identities_in_nested_graphs():
    """A Constant of the main graph read in an If branch through the branch's own Identity, and
    a Constant inside the other branch: both quantized where they stand, the Identity gone."""
    outer, inner = heavy((64, 8), 1), heavy((64, 8), 2)
    then_branch = helper.make_graph(
        [helper.make_node("Identity", ["w_outer"], ["w_read"]), helper.make_node("MatMul", ["x", "w_read"], ["y_then"])],
        "then", [], [helper.make_tensor_value_info("y_then", T.FLOAT, [2, 8])])
    else_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["w_inner"], value=nh.from_array(inner, "w_inner")),
         helper.make_node("MatMul", ["x", "w_inner"], ["y_else"])],
        "else", [], [helper.make_tensor_value_info("y_else", T.FLOAT, [2, 8])])
    g = helper.make_graph(
        [helper.make_node("Constant", [], ["w_outer"], value=nh.from_array(outer, "w_outer")),
         helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "g", [helper.make_tensor_value_info("c", T.BOOL, []), helper.make_tensor_value_info("x", T.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 8])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    out, report = dyndq.quantize(model, group_size=32, evaluate=False)
    assert [(layer.name, layer.graph) for layer in report.layers] == [("w_outer", "main"), ("w_inner", "main/If#1.else_branch")]
    branches = {a.name: a.g for a in out.graph.node[-1].attribute}
    assert [n.op_type for n in branches["then_branch"].node] == ["MatMul"]
    assert "w_outer" not in [n.output[0] for n in out.graph.node]
    onnx.checker.check_model(out, full_check=True)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    for c, w in ((True, outer), (False, inner)):  # (each branch reads its own weight, quantized)
        got = dyndq.run(out, {"c": np.array(c), "x": x})["y"]
        want = x @ dequantized(quantize_weight(w, axis=0, group_size=32))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # (float sums in another order)
