"""dyndq.lift: DequantizeLinear nodes that DynamicDequantize expresses become DynamicDequantize;
the rest are left alone and reported."""
import logging

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from cases import backend_case, backend_case_names, run_ort, same_values as same, vi

import dyndq
from dyndq.plumbing.opsets import ORT_MAX_OPSET

BACKEND = backend_case_names()
# version 1 takes the first two; version 2 also int4/uint4 and blocked (exact division); version 3 the rest
# (int2 to int16, float8, float4): every case onnx ships
NOT_LIFTABLE: set[str] = set()
ORT_LACKS = {"test_dequantizelinear_float4e2m1"}  # no float4e2m1 tensors in ONNX Runtime: a graph input cannot run


def test_onnx_backend_cases_are_there():
    assert "test_dequantizelinear_int2" in BACKEND and "test_dequantizelinear_float4e2m1" in BACKEND
    assert {backend_case(name).name for name in BACKEND} == set(BACKEND)


@pytest.mark.parametrize("name", BACKEND)
def test_onnx_backend_cases_lift_when_they_fit_and_are_left_alone_otherwise(name):
    case = backend_case(name)
    lifted, report = dyndq.lift_with_report(case.model)
    if case.name in NOT_LIFTABLE:
        assert report.count == 0 and len(report.skipped) == 1
        assert lifted.SerializeToString() == case.model.SerializeToString()
        return
    assert report.count == 1 and not report.skipped
    assert [(n.domain, n.op_type) for n in lifted.graph.node] == [(dyndq.DOMAIN, "DynamicDequantize")]
    assert dyndq.check(lifted) == []
    for inputs, outputs in case.data_sets:
        # (ONNX's int4 test data are TensorProtos)
        feeds = {i.name: numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else np.asarray(v)
                 for i, v in zip(lifted.graph.input, inputs)}
        got = dyndq.reference_evaluator(lifted).run(None, feeds)  # our kernel
        assert all(same(g, w) for g, w in zip(got, outputs))
        exported = dyndq.export(lifted)  # the cases use an opset newer than ONNX Runtime's: it comes down
        assert next(o.version for o in exported.opset_import if o.domain == "") <= ORT_MAX_OPSET
        got = dyndq.run(exported, feeds, engine="reference")  # standard ONNX on ONNX's own engine
        assert all(same(g, w) for g, w in zip(got.values(), outputs))
        if case.name in ORT_LACKS:
            with pytest.raises(dyndq.ValidationError, match="computed at run time"):
                dyndq.export(lifted, target="onnxruntime")
            continue
        # ONNX Runtime on the export, int4 feeds included (the runner feeds them through exact Casts)
        got = dyndq.run(dyndq.export(lifted, target="onnxruntime"), feeds, engine="onnxruntime")
        assert all(same(g, w) for g, w in zip(got.values(), outputs))
        got = dyndq.run(lifted, feeds, engine="onnxruntime")
        assert all(same(g, w) for g, w in zip(got.values(), outputs))


def _dql_model(x, s, z=None, *, opset=21, **attrs):
    names = ["x", "s"] + (["z"] if z is not None else [])
    inputs = [vi("x", *x), vi("s", *s)] + ([vi("z", *z)] if z is not None else [])
    graph = helper.make_graph([helper.make_node("DequantizeLinear", names, ["y"], name="dql", **attrs)], "g",
                              inputs, [vi("y", "float32", list(x[1]))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=onnx.helper.find_min_ir_version_for([helper.make_opsetid("", opset)]))


def test_lifted_nodes_keep_name_inputs_outputs_and_write_axis():
    model = _dql_model(("int8", [2, 3]), ("float32", [3]), ("int8", [3]), axis=-1)
    model.graph.node[0].doc_string = "weights"
    lifted = dyndq.lift(model)
    [node] = lifted.graph.node
    assert (node.name, list(node.input), list(node.output), node.doc_string) == ("dql", ["x", "s", "z"], ["y"], "weights")
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == {"qtype": b"per_channel", "axis": -1}
    assert (dyndq.DOMAIN, 1) in [(o.domain, o.version) for o in lifted.opset_import]
    assert dyndq.check(lifted) == []


def test_lift_never_mutates_and_logs_what_it_left_alone(caplog):
    model = _dql_model(("int32", ["n"]), ("float32", ["m"]), ("int32", ["m"]), axis=0, block_size=2)
    before = model.SerializeToString()
    with caplog.at_level(logging.INFO, logger="dyndq.lift"):
        lifted = dyndq.lift(model)
    assert model.SerializeToString() == before
    assert lifted.SerializeToString() == before  # nothing lifted: the copy is the same model
    assert "'dql'" in caplog.text and "x's shape is not fully known" in caplog.text


def test_lift_report_lists_every_skipped_node_with_its_reason_in_every_graph():
    then = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "s"], ["t"], name="in_then")], "then", [],
                             [vi("t", "float32", [4])])
    els = helper.make_graph([helper.make_node("DequantizeLinear", ["xn", "sb"], ["e"], name="in_else", axis=0,
                                              block_size=2)], "else", [], [vi("e", "float32", [4])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els, name="pick")],
                              "g", [vi("c", "bool", []), vi("x", "uint8", [4]), vi("xn", "int16", ["n"]),
                                    vi("s", "float32", []), vi("sb", "float32", ["m"])], [vi("y", "float32", [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    lifted, report = dyndq.lift_with_report(model)
    assert report.lifted == [("main/pick.then_branch", "in_then", "per_tensor")]
    assert [(s.graph, s.node) for s in report.skipped] == [("main/pick.else_branch", "in_else")]
    assert "x's shape is not fully known" in report.skipped[0].reason
    assert report.summary() == "lifted 1 DequantizeLinear node(s); left 1 alone"
    exported = dyndq.export(lifted)
    feeds = {"x": np.array([0, 1, 128, 255], np.uint8), "xn": np.arange(4, dtype=np.int16),
             "s": np.array(0.5, np.float32), "sb": np.array([0.5, 0.25], np.float32)}
    for c in (True, False):
        feeds["c"] = np.array(c)
        assert same(run_ort(exported, feeds)[0], run_ort(model, feeds)[0])


@st.composite
def dql_graphs(draw):
    dtype = draw(st.sampled_from(["int8", "uint8"]))
    opset = draw(st.sampled_from([10, 13, 19, 21]))
    rank = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank))
    per_channel = opset >= 13 and draw(st.booleans())
    axis = draw(st.integers(-rank, rank - 1)) if per_channel else None
    sshape = [shape[axis]] if per_channel else draw(st.sampled_from([[], [1]] if opset >= 13 else [[]]))
    with_zp = draw(st.booleans())
    as_init = draw(st.booleans())
    return dtype, opset, shape, axis, sshape, with_zp, as_init, draw(st.integers(0, 2**32 - 1))


@settings(max_examples=80, deadline=None)
@given(dql_graphs())
def test_export_of_lift_runs_the_same_as_the_original_in_onnxruntime(p):
    dtype, opset, shape, axis, sshape, with_zp, as_init, seed = p
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = np.asarray(rng.integers(info.min, info.max, shape, endpoint=True), dtype)
    s = np.asarray(rng.standard_normal(sshape) * 0.1, np.float32)
    z = np.asarray(rng.integers(info.min, info.max, sshape, endpoint=True), dtype) if with_zp else None
    attrs = {} if axis is None else {"axis": axis}
    names = ["x", "s"] + (["z"] if with_zp else [])
    arrays = {"x": x, "s": s, "z": z}
    inputs, inits, feeds = [vi("x", dtype, shape)], [], {"x": x}
    for name in names[1:]:
        if as_init:
            inits.append(numpy_helper.from_array(arrays[name], name))
        else:
            inputs.append(vi(name, arrays[name].dtype, list(arrays[name].shape)))
            feeds[name] = arrays[name]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", names, ["y"], name="dql", **attrs),
         helper.make_node("Relu", ["y"], ["r"], name="relu")], "g", inputs,
        [vi("y", "float32", shape), vi("r", "float32", shape)], initializer=inits)
    imports = [helper.make_opsetid("", opset)]
    model = helper.make_model(graph, opset_imports=imports, ir_version=onnx.helper.find_min_ir_version_for(imports))
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1, report.skipped
    assert dyndq.check(lifted) == []
    exported = dyndq.export(lifted)
    onnx.checker.check_model(exported, full_check=True)
    want = run_ort(model, feeds)
    assert all(same(g, w) for g, w in zip(run_ort(exported, feeds), want))
    # and our kernel on the lifted graph agrees too: y to the bit; r (Relu) by value, since
    # onnx.reference's Relu and ONNX Runtime's disagree on the sign of Relu(-0.0)
    y, r = dyndq.reference_evaluator(lifted).run(None, feeds)
    assert same(y, want[0]) and np.array_equal(r, want[1])


def test_lift_of_export_gives_back_the_op():
    graph = helper.make_graph([dyndq.make_node(["q", "s", "z"], ["d"], qtype="per_channel", axis=0, name="w")], "g",
                              [vi("q", "uint8", [3, 2]), vi("s", "float32", [3]), vi("z", "uint8", [3])],
                              [vi("d", "float32", [3, 2])])
    model = dyndq.make_model(graph)
    again = dyndq.lift(dyndq.export(model))
    [node] = again.graph.node
    assert (node.domain, node.op_type, node.name, list(node.input)) == (dyndq.DOMAIN, "DynamicDequantize", "w", ["q", "s", "z"])


def test_lift_refuses_what_is_not_a_model():
    with pytest.raises(TypeError):
        dyndq.lift(onnx.GraphProto())
