"""dyndq.export of version-2 graphs: If/Loop bodies, model-local functions, the opset raised
with onnx.version_converter, IR 10 for int4, and ORT running every export with the kernel's bits."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cases import same_bits, vi

import dyndq
from dyndq.runner import runner

IMPORTS_21 = [helper.make_opsetid("", 21), dyndq.opset_import(2)]


def ai_onnx(model):
    return next(o.version for o in model.opset_import if o.domain == "")


def both(model, feeds):
    """Both engines' outputs, checked to be the same arrays (dtype and bits)."""
    ref = dyndq.run(model, feeds)
    got = dyndq.run(model, feeds, engine="onnxruntime")
    assert list(ref) == list(got)
    for name in ref:
        assert same_bits(ref[name], got[name]), name
    return ref


W = np.random.default_rng(1).integers(0, 16, (4, 64)).astype(ml_dtypes.uint4)
S16 = (np.random.default_rng(2).standard_normal((4, 2)) * 0.01).astype(np.float16)
Z = np.random.default_rng(3).integers(0, 16, (4, 2)).astype(ml_dtypes.uint4)
SB = (np.random.default_rng(4).standard_normal(4) * 0.1).astype(ml_dtypes.bfloat16)
ZI = np.random.default_rng(5).integers(-2**31, 2**31 - 1, 4, endpoint=True).astype(np.int32)


def _blocked_node(out, name):
    return dyndq.make_node(["w", "s", "z"], [out], name=name, version=2, qtype="per_group", group_shape=[1, 32])


def test_in_if_branches():
    then = helper.make_graph([_blocked_node("t", "in_then")], "then", [], [vi("t", "float16", [4, 64])])
    els = helper.make_graph(
        [dyndq.make_node(["w", "sb", "zi"], ["e16"], name="in_else", version=2, qtype="per_channel", axis=0),
         helper.make_node("Cast", ["e16"], ["e"], to=TensorProto.FLOAT16, name="to_half")],
        "else", [], [vi("e", "float16", [4, 64])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els, name="pick")], "g",
        [vi("c", "bool", []), vi("w", "uint4", [4, 64])], [vi("y", "float16", [4, 64])],
        [numpy_helper.from_array(a, n) for n, a in (("s", S16), ("z", Z), ("sb", SB), ("zi", ZI))])
    model = helper.make_model(graph, opset_imports=IMPORTS_21, ir_version=10)
    exported, report = dyndq.export_with_report(model)
    onnx.checker.check_model(exported, full_check=True)
    assert sorted((n.graph, n.form) for n in report.lowered) == [
        ("main/pick.else_branch", "integer arithmetic"), ("main/pick.then_branch", "DequantizeLinear (blocked)")]
    for c in (True, False):
        out = both(model, {"c": np.array(c), "w": W})["y"]
        want = (dyndq.dynamic_dequantize(W, S16, Z, qtype="per_group", group_shape=[1, 32]) if c else
                dyndq.dynamic_dequantize(W, SB, ZI, qtype="per_channel", axis=0).astype(np.float16))
        assert same_bits(out, want)


def test_in_a_loop_body():
    """Each iteration dequantizes the outer-scope int4 weights and accumulates them."""
    body = helper.make_graph(
        [_blocked_node("d", "in_loop"), helper.make_node("Cast", ["d"], ["d32"], to=TensorProto.FLOAT),
         helper.make_node("Add", ["acc", "d32"], ["acc_out"]), helper.make_node("Identity", ["cond"], ["cond_out"])],
        "body", [vi("i", "int64", []), vi("cond", "bool", []), vi("acc", "float32", [4, 64])],
        [vi("cond_out", "bool", []), vi("acc_out", "float32", [4, 64])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "go", "init"], ["y"], body=body, name="loop")], "g",
        [vi("n", "int64", []), vi("go", "bool", []), vi("w", "uint4", [4, 64]), vi("s", "float16", [4, 2]), vi("z", "uint4", [4, 2]),
         vi("init", "float32", [4, 64])], [vi("y", "float32", [4, 64])])
    model = helper.make_model(graph, opset_imports=IMPORTS_21, ir_version=10)
    exported = dyndq.export(model)
    onnx.checker.check_model(exported, full_check=True)
    init = np.zeros((4, 64), np.float32)
    out = both(model, {"n": np.array(3, np.int64), "go": np.array(True), "w": W, "s": S16, "z": Z, "init": init})["y"]
    d = dyndq.dynamic_dequantize(W, S16, Z, qtype="per_group", group_shape=[1, 32]).astype(np.float32)
    assert same_bits(out, ((init + d) + d) + d)


@pytest.mark.parametrize("scales, zps, attrs", [
    (S16, Z, {"qtype": "per_group", "group_shape": [1, 32]}),
    (SB, ZI, {"qtype": "per_channel", "axis": 0}),
    (np.array([0.5], ml_dtypes.bfloat16), np.array([3], ml_dtypes.uint4), {"qtype": "per_tensor"}),
    ((np.arange(8, dtype=np.float32) / 7).reshape(2, 4).astype(ml_dtypes.bfloat16), None,
     {"qtype": "per_group", "group_shape": [2, 16]}),
])
def test_in_a_model_local_function(scales, zps, attrs):
    """Nothing is typed inside a function: the lowering takes the integer route and CastLike."""
    names = ["w", "s"] + ([] if zps is None else ["z"])
    f = helper.make_function(
        "local", "Deq", names, ["y"],
        [dyndq.make_node(names, ["y"], name="in_function", version=2, **attrs)],
        opset_imports=[helper.make_opsetid("", 21), dyndq.opset_import(2)])
    t2 = scales.dtype.name
    graph = helper.make_graph(
        [helper.make_node("Deq", names, ["y"], domain="local", name="call")], "g",
        [vi("w", "uint4", [4, 64]), vi("s", t2, list(scales.shape))] + ([] if zps is None else
                                                                      [vi("z", zps.dtype.name, list(zps.shape))]),
        [vi("y", t2, [4, 64])])
    model = helper.make_model(graph, opset_imports=IMPORTS_21 + [helper.make_opsetid("local", 1)], functions=[f],
                              ir_version=10)
    exported, report = dyndq.export_with_report(model)
    onnx.checker.check_model(exported, full_check=True)
    assert report.lowered[0].graph == "function local::Deq"
    assert not any(o.domain == dyndq.DOMAIN for o in exported.functions[0].opset_import)
    feeds = {"w": W, "s": scales, **({} if zps is None else {"z": zps})}
    out = both(model, feeds)["y"]
    assert same_bits(out, dyndq.dynamic_dequantize(W, scales, zps, **attrs))


def test_opset_raised_by_the_version_converter_for_the_other_nodes():
    """A model at opset 17 with a ReduceMean (axes an attribute before 18, an input after):
    export raises it to 21 for the int4 blocks and converts the ReduceMean."""
    graph = helper.make_graph(
        [_blocked_node("d", "dq"), helper.make_node("Cast", ["d"], ["d32"], to=TensorProto.FLOAT),
         helper.make_node("ReduceMean", ["d32"], ["y"], axes=[1], keepdims=0, name="sum")],
        "g", [vi("w", "uint4", [4, 64]), vi("s", "float16", [4, 2]), vi("z", "uint4", [4, 2])], [vi("y", "float32", [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), dyndq.opset_import(2)], ir_version=10)
    exported, report = dyndq.export_with_report(model)
    assert (report.opset_before, report.opset, report.converted) == (17, 21, True)
    assert exported.ir_version == 10
    onnx.checker.check_model(exported, full_check=True)
    [reduce] = [n for n in exported.graph.node if n.op_type == "ReduceMean"]
    assert len(reduce.input) == 2 and not any(a.name == "axes" for a in reduce.attribute)
    both(model, {"w": W, "s": S16, "z": Z})


def test_int4_export_has_ir_10_even_at_a_newer_opset_than_needed():
    graph = helper.make_graph([_blocked_node("d", "dq")], "g",
                              [vi("w", "uint4", [4, 64]), vi("s", "float16", [4, 2]), vi("z", "uint4", [4, 2])],
                              [vi("d", "float16", [4, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), dyndq.opset_import(2)], ir_version=11)
    exported = dyndq.export(model)
    assert (ai_onnx(exported), exported.ir_version) == (23, onnx.helper.find_min_ir_version_for(exported.opset_import))
    assert exported.ir_version >= 10


def test_export_error_for_a_too_low_opset_names_the_nodes_in_subgraphs_too():
    then = helper.make_graph([_blocked_node("t", "in_then")], "then", [], [vi("t", "float16", [4, 64])])
    els = helper.make_graph([_blocked_node("e", "in_else")], "else", [], [vi("e", "float16", [4, 64])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els, name="pick")],
                              "g", [vi("c", "bool", []), vi("w", "uint4", [4, 64]), vi("s", "float16", [4, 2]),
                                    vi("z", "uint4", [4, 2])], [vi("y", "float16", [4, 64])])
    model = helper.make_model(graph, opset_imports=IMPORTS_21, ir_version=10)
    with pytest.raises(dyndq.ExportError) as e:
        dyndq.export(model, opset=19)
    assert "main/pick.then_branch: DynamicDequantize 'in_then' needs 21 (blocked DequantizeLinear" in str(e.value)
    assert "main/pick.else_branch: DynamicDequantize 'in_else' needs 21" in str(e.value)


def test_the_runner_exports_once_and_keeps_it():
    graph = helper.make_graph([_blocked_node("d", "dq")], "g",
                              [vi("w", "uint4", [4, 64]), vi("s", "float16", [4, 2]), vi("z", "uint4", [4, 2])],
                              [vi("d", "float16", [4, 64])])
    model = helper.make_model(graph, opset_imports=IMPORTS_21, ir_version=10)
    r = runner(model, "onnxruntime")
    assert "DequantizeLinear" in [n.op_type for n in r.exported.graph.node]
    assert runner(model, "onnxruntime") is r


def test_a_function_at_a_low_opset_given_int4_is_raised_to_21():
    """Inside a function src's dtype is unknown: it may be int4 (here it is), whose Cast needs 21."""
    names = ["w", "s"]
    f = helper.make_function("local", "Deq", names, ["y"],
                             [dyndq.make_node(names, ["y"], name="in_function", version=2, qtype="per_tensor")],
                             opset_imports=[helper.make_opsetid("", 15), dyndq.opset_import(2)])
    graph = helper.make_graph([helper.make_node("Deq", names, ["y"], domain="local", name="call")], "g",
                              [vi("w", "int4", [4]), vi("s", "float32", [1])], [vi("y", "float32", [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15), dyndq.opset_import(2),
                                                    helper.make_opsetid("local", 1)], functions=[f], ir_version=10)
    exported, report = dyndq.export_with_report(model)
    assert (report.opset, exported.ir_version) == (21, 10)
    onnx.checker.check_model(exported, full_check=True)
    feeds = {"w": np.array([1, -2, 3, 7], ml_dtypes.int4), "s": np.array([0.5], np.float32)}
    assert same_bits(both(model, feeds)["y"], np.array([0.5, -1, 1.5, 3.5], np.float32))


def test_ir_version_covers_int4_tensors_the_op_does_not_touch():
    """A version-1 form (needs opset 10) at opset 13 beside an int4 initializer that is a graph
    output: the opsets alone would give IR 7, the int4 tensor needs 10."""
    graph = helper.make_graph(
        [dyndq.make_node(["q", "s"], ["d"], name="dq", qtype="per_tensor")], "g",
        [vi("q", "int8", [3]), vi("s", "float32", [1])], [vi("d", "float32", [3]), vi("packed", "int4", [2])],
        [numpy_helper.from_array(np.array([-8, 7], ml_dtypes.int4), "packed")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), dyndq.opset_import(2)],
                              ir_version=10)
    exported = dyndq.export(model)
    assert (ai_onnx(exported), exported.ir_version) == (13, 10)
    onnx.checker.check_model(exported, full_check=True)
