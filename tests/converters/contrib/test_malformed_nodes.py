"""Malformed contrib nodes are named, never a crash: MatMulNBits and GatherBlockQuantized with
attributes of another kind (K as a list, accuracy_level as a string, ...), missing ones, inputs
of any dtype and shape (scalars among them), in a model below the opset their lifted form needs.
lift and export (both targets) leave such a node as it is and say why; the CLI exits 0 or 1,
never 70 (a bug of ours)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import dyndq
from dyndq.cli import main
from dyndq.converters.contrib import shared as foreign
from dyndq.model_files import save_model

MS = "com.microsoft"
KINDS = {"int": lambda v: v, "ints": lambda v: [v, v], "float": float, "string": str}


def attribute(name, kind, value):
    a = helper.make_attribute(name, KINDS[kind](value))
    assert a.type in (AttributeProto.INT, AttributeProto.INTS, AttributeProto.FLOAT, AttributeProto.STRING)
    return a


@st.composite
def arrays(draw, name):
    dtype = draw(st.sampled_from(["uint8", "int8", "float32", "float16", "int32", "int64"]))
    shape = draw(st.lists(st.integers(0, 4), min_size=0, max_size=3))
    return numpy_helper.from_array(np.ones(shape, dtype), name)


@st.composite
def contrib_models(draw):
    op = draw(st.sampled_from(["MatMulNBits", "GatherBlockQuantized"]))
    names = (["K", "N", "bits", "block_size", "accuracy_level"] if op == "MatMulNBits"
             else ["bits", "block_size", "quantize_axis", "gather_axis"])
    values = {"K": 32, "N": 2, "bits": 4, "block_size": 16, "accuracy_level": 4, "quantize_axis": 1, "gather_axis": 0}
    node = helper.make_node(op, [], ["y"], name="contrib", domain=MS)
    for name in names:
        kind = draw(st.sampled_from(["int", "int", "absent", "ints", "float", "string"]))
        if kind != "absent":
            node.attribute.append(attribute(name, kind, draw(st.sampled_from([values[name], 0, -1, 2**62]))))
    if op == "MatMulNBits":
        good = [numpy_helper.from_array(foreign.pack(np.zeros((2, 32), np.int64), 4).reshape(2, 2, 8), "B"),
                numpy_helper.from_array(np.ones((2, 2), np.float32), "scales")]
        node.input.extend(["a", "B", "scales"])
        extra = ["zero_points", "g_idx"]
        inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 32])]
    else:
        good = [numpy_helper.from_array(np.zeros((4, 16), np.uint8), "data"),
                numpy_helper.from_array(np.ones((4, 2), np.float32), "scales")]
        node.input.extend(["data", "ids", "scales"])
        extra = ["zero_points"]
        inputs = [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])]
    inits = [draw(st.sampled_from([t, draw(arrays(t.name))])) for t in good]
    for name in extra:
        if draw(st.booleans()):
            node.input.append(name)
            inits.append(draw(arrays(name)))
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    opset = draw(st.sampled_from([6, 9, 21]))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                             ir_version=10)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contrib_models())
def test_malformed_contrib_nodes_are_left_alone_and_named(model):
    before = model.SerializeToString()
    lifted, report = dyndq.lift_with_report(model)
    assert model.SerializeToString() == before
    assert report.count + len(report.skipped) == 1
    if report.skipped:
        assert report.skipped[0].reason and lifted.SerializeToString() == before
    for target in ("onnx", "onnxruntime"):
        try:
            dyndq.export_with_report(model, target=target)
        except dyndq.ValidationError as e:  # (onnx.checker's word on the model, named)
            assert e.problems


@pytest.mark.parametrize("change, reason", [
    (dict(K=[32]), "attribute K is INTS, not INT"),
    (dict(accuracy_level="4"), "attribute accuracy_level is STRING, not INT"),
    (dict(bits=4.0), "attribute bits is FLOAT, not INT"),
])
def test_matmul_nbits_attributes_of_another_kind(tmp_path, capsys, change, reason):
    attrs = {"K": 32, "N": 2, "bits": 4, "block_size": 16, **change}
    node = helper.make_node("MatMulNBits", ["a", "B", "scales"], ["y"], name="mm", domain=MS, **attrs)
    inits = [numpy_helper.from_array(foreign.pack(np.zeros((2, 32), np.int64), 4).reshape(2, 2, 8), "B"),
             numpy_helper.from_array(np.ones((2, 2), np.float32), "scales")]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    _, report = dyndq.lift_with_report(model)
    assert reason in report.skipped[0].reason
    path = str(tmp_path / "m.onnx")
    save_model(model, path)
    # ONNX Runtime's own schema, lent to ONNX's checker by `dyndq check`, refuses the attribute: lift
    # (which keeps the node as it is) refuses to write a file failing the check as the input does,
    # export refuses the input; the model's problem (exit 1), named by node and attribute, nothing written
    name = next(iter(change))
    said = f"Mismatched attribute type in 'mm : {name}'"
    for argv, whose in ((["lift", path, str(tmp_path / "l.onnx")], "fails `dyndq check`, as the input does"),
                        (["export", path, str(tmp_path / "e.onnx")], "1 problem"),
                        (["export", path, str(tmp_path / "o.onnx"), "--target", "onnxruntime"], "1 problem")):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert whose in err and said in err, (argv, err)
        assert os.listdir(tmp_path) == ["m.onnx"]


@pytest.mark.parametrize("what", ["data", "zero_points"])
def test_gather_block_quantized_with_a_scalar_is_named(what):
    data = np.zeros((4, 16), np.uint8) if what != "data" else np.array(3, np.uint8)
    inits = [numpy_helper.from_array(data, "data"), numpy_helper.from_array(np.ones((4, 2), np.float32), "scales")]
    inputs = ["data", "ids", "scales"]
    if what == "zero_points":
        inits.append(numpy_helper.from_array(np.array(8, np.uint8), "zp"))
        inputs.append("zp")
    node = helper.make_node("GatherBlockQuantized", inputs, ["y"], name="gbq", domain=MS, block_size=16, bits=4)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    _, report = dyndq.lift_with_report(model)
    assert report.count == 0 and ("scalar" in report.skipped[0].reason or "rank" in report.skipped[0].reason)


@pytest.mark.parametrize("opset, bias, K, need", [(9, False, 40, 10), (6, True, 32, 7)])
def test_a_lift_needing_a_newer_opset_than_the_model_imports_is_refused(opset, bias, K, need):
    """A padded K needs Slice with its bounds as inputs (opset 10), a bias Add NumPy's broadcasting
    (opset 7): below those, the node is left alone, naming what to do (the rest of the model
    would be converted by raising it here)."""
    blocks = -(-K // 32)
    inputs = ["a", "B", "scales"] + (["", "", "bias"] if bias else [])
    inits = [numpy_helper.from_array(foreign.pack(np.zeros((2, blocks * 32), np.int64), 4).reshape(2, blocks, 16), "B"),
             numpy_helper.from_array(np.ones((2, blocks), np.float32), "scales")]
    if bias:
        inits.append(numpy_helper.from_array(np.ones(2, np.float32), "bias"))
    node = helper.make_node("MatMulNBits", inputs, ["y"], name="mm", domain=MS, K=K, N=2, bits=4, block_size=32)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 0
    assert f"needs ai.onnx opset {need}" in report.skipped[0].reason and f"imports {opset}" in report.skipped[0].reason
    assert dyndq.check(lifted) == [] or all("MatMulNBits" not in str(p) for p in dyndq.check(lifted))
    raised = onnx_version_converted(model, need)
    assert dyndq.lift_with_report(raised)[1].count == 1


def onnx_version_converted(model, opset):
    import onnx

    return onnx.version_converter.convert_version(model, opset)
