"""Every rewrite reaches every graph: lift, export (both targets) and quantize on a model whose
weights stand in the main graph, in both branches of an If (one branch's own, one read from the
main graph), in a Loop body, in a Scan body and in a model-local function (as Constant nodes,
the only constants a function holds); and shared weights stay one copy both ways.

Each layer maps [.., 1, 48] to [.., 1, 48], so that the Loop carries it; K = 48 with blocks of
32 is padded to whole blocks (a Slice, or DequantizeLinear's short last block).  Outputs of the
float MatMuls are compared with parity.TOLERANCE of their largest magnitude; dequantized weights
are compared exactly where a test says so."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cases import run_ort

import dyndq
from dyndq.converters.contrib import shared as foreign
from dyndq.plumbing.walk import scopes
from dyndq.parity import TOLERANCE

K = N = 48
BLOCK = 32
BLOCKS = -(-K // BLOCK)
PLACES = ("main", "then", "else", "loop", "scan", "function")


def float_layer(tag, x, y, rng):
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    return [helper.make_node("MatMul", [x, f"w_{tag}"], [y], name=f"mm_{tag}")], [numpy_helper.from_array(w, f"w_{tag}")]


def nbits_layer(tag, x, y, rng, accuracy_level=0):
    q = rng.integers(0, 16, (N, BLOCKS * BLOCK))
    tensors = [numpy_helper.from_array(foreign.pack(q, 4).reshape(N, BLOCKS, BLOCK // 2), f"B_{tag}"),
               numpy_helper.from_array((rng.uniform(0.01, 0.05, (N, BLOCKS))).astype(np.float32), f"s_{tag}"),
               numpy_helper.from_array(foreign.pack(rng.integers(0, 16, (N, BLOCKS)), 4).reshape(-1), f"z_{tag}")]
    node = helper.make_node("MatMulNBits", [x, f"B_{tag}", f"s_{tag}", f"z_{tag}"], [y], name=f"mm_{tag}",
                            domain="com.microsoft", K=K, N=N, bits=4, block_size=BLOCK, accuracy_level=accuracy_level)
    return [node], tensors


def qdq_layer(tag, x, y, rng):
    codes = rng.integers(-8, 8, (K, N)).astype(ml_dtypes.int4)
    tensors = [numpy_helper.from_array(codes, f"q_{tag}"),
               numpy_helper.from_array(rng.uniform(0.01, 0.05, (BLOCKS, N)).astype(np.float32), f"s_{tag}"),
               numpy_helper.from_array(rng.integers(-8, 8, (BLOCKS, N)).astype(ml_dtypes.int4), f"z_{tag}")]
    nodes = [helper.make_node("DequantizeLinear", [f"q_{tag}", f"s_{tag}", f"z_{tag}"], [f"w_{tag}"], name=f"dq_{tag}",
                              axis=0, block_size=BLOCK),
             helper.make_node("MatMul", [x, f"w_{tag}"], [y], name=f"mm_{tag}")]
    return nodes, tensors


def as_constant_nodes(tensors):
    return [helper.make_node("Constant", [], [t.name], name=f"{t.name}_const", value=t) for t in tensors]


def nested_model(layer, seed=0, outer=True):
    """x [2, 1, 48] -> main layer -> If (then: own weights; else: the main graph's, or its own
    with outer=False) -> Loop of 2 (body weights) -> Scan over rows (body weights) -> local::Proj
    (Constant-node weights) -> y."""
    rng = np.random.default_rng(seed)
    t = lambda name, shape=None: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    main_nodes, main_inits = layer("main", "x", "h0", rng)
    then_nodes, then_inits = layer("then", "h0", "h1_then", rng)
    else_nodes, else_inits = layer("else", "h0", "h1_else", rng)
    if outer:
        main_inits += else_inits  # (read from inside the else branch, through the main graph's scope)
    branches = {"then_branch": helper.make_graph(then_nodes, "then", [], [t("h1_then", [2, 1, N])], then_inits),
                "else_branch": helper.make_graph(else_nodes, "else", [], [t("h1_else", [2, 1, N])],
                                                 [] if outer else else_inits)}
    loop_nodes, loop_inits = layer("loop", "h_in", "h_out", rng)
    loop_body = helper.make_graph(
        loop_nodes + [helper.make_node("Identity", ["c_in"], ["c_out"])], "loop_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         t("h_in", [2, 1, N])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), t("h_out", [2, 1, N])], loop_inits)
    scan_nodes, scan_inits = layer("scan", "row", "row_out", rng)
    scan_body = helper.make_graph(scan_nodes, "scan_body", [t("row", [1, K])], [t("row_out", [1, N])], scan_inits)
    fn_nodes, fn_tensors = layer("function", "fx", "fy", rng)
    imports = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    fn = helper.make_function("local", "Proj", ["fx"], ["fy"], as_constant_nodes(fn_tensors) + fn_nodes, imports)
    nodes = main_nodes + [
        helper.make_node("If", ["cond"], ["h1"], name="branch", **branches),
        helper.make_node("Loop", ["trips", "", "h1"], ["h2"], name="loop", body=loop_body),
        helper.make_node("Scan", ["h2"], ["h3"], name="scan", body=scan_body, num_scan_inputs=1),
        helper.make_node("Proj", ["h3"], ["y"], name="proj", domain="local")]
    main_inits.append(numpy_helper.from_array(np.array(2, np.int64), "trips"))
    graph = helper.make_graph(nodes, "nested", [t("x", [2, 1, K]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [t("y", [2, 1, N])], main_inits)
    return helper.make_model(graph, opset_imports=imports + [helper.make_opsetid("local", 1)], functions=[fn],
                             ir_version=10)


def feeds(cond):
    return {"x": np.random.default_rng(1).standard_normal((2, 1, K)).astype(np.float32), "cond": np.array(cond)}


def on_ort(model, cond, level="basic"):
    return run_ort(model, feeds(cond), level=level)[0]


def close(got, want):
    return np.abs(got.astype(np.float64) - want).max() <= TOLERANCE * np.abs(want).max()


def nodes_everywhere(model):
    return [(scope.path, n) for scope in scopes(model) for n in scope.nodes]


def op_types_in(model, place):
    """The op types of the scope a place's weights are read in."""
    path = {"main": "main", "then": "main/branch.then_branch", "else": "main/branch.else_branch",
            "loop": "main/loop.body", "scan": "main/scan.body", "function": "function local::Proj"}[place]
    return [n.op_type for s in scopes(model) if s.path == path for n in s.nodes]


def constants_of(model):
    """Every constant of every scope, by (scope path, name): initializers' bytes and Constant nodes' values."""
    out = {}
    for scope in scopes(model):
        if scope.graph is not None:
            out.update({(scope.path, t.name): t.SerializeToString() for t in scope.graph.initializer})
        out.update({(scope.path, n.output[0]): n.attribute[0].t.SerializeToString() for n in scope.nodes
                    if n.op_type == "Constant"})
    return out


@pytest.fixture(scope="module")
def contrib_model():
    return nested_model(nbits_layer)


@pytest.mark.parametrize("cond", [True, False])
def test_lift_reaches_every_graph_and_computes_what_onnxruntime_does(contrib_model, cond):
    lifted, report = dyndq.lift_with_report(contrib_model)
    assert report.count == len(PLACES) and not report.skipped
    assert not [n for _, n in nodes_everywhere(lifted) if n.domain == "com.microsoft"]
    for place in PLACES:
        assert "DynamicDequantize" in op_types_in(lifted, place), place
    assert dyndq.check(lifted) == []
    got = dyndq.run(lifted, feeds(cond), engine="reference")["y"]
    assert close(got, on_ort(contrib_model, cond))


@pytest.mark.parametrize("cond", [True, False])
def test_standard_export_holds_no_contrib_op_in_any_graph(contrib_model, cond):
    exported, report = dyndq.export_with_report(contrib_model)
    assert not [(p, n.op_type) for p, n in nodes_everywhere(exported) if n.domain == "com.microsoft"]
    assert not any(o.domain == "com.microsoft" for o in exported.opset_import)
    assert len(report.foreign) == len(PLACES) and all(f.form != "kept" for f in report.foreign)
    assert dyndq.check(exported) == []
    assert close(on_ort(exported, cond), on_ort(contrib_model, cond))


def test_lift_then_export_for_onnxruntime_gives_every_graph_back_byte_for_byte(contrib_model):
    back, report = dyndq.export_with_report(dyndq.lift(contrib_model), target="onnxruntime")
    assert len(report.foreign) == len(PLACES)
    assert constants_of(back) == constants_of(contrib_model)
    for (path, a), (_, b) in zip(nodes_everywhere(back), nodes_everywhere(contrib_model), strict=True):
        if a.op_type in ("If", "Loop", "Scan"):
            assert (a.op_type, list(a.input), list(a.output)) == (b.op_type, list(b.input), list(b.output))
        else:
            assert a.SerializeToString() == b.SerializeToString(), path
    assert np.array_equal(on_ort(back, True), on_ort(contrib_model, True))


def test_accuracy_level_asked_reaches_every_graph():
    model = nested_model(lambda *a: nbits_layer(*a, accuracy_level=4))
    back, report = dyndq.export_with_report(dyndq.lift(model), target="onnxruntime", accuracy_level=0)
    levels = [a.i for _, n in nodes_everywhere(back) if n.op_type == "MatMulNBits" for a in n.attribute
              if a.name == "accuracy_level"]
    assert levels == [0] * len(PLACES)
    assert all("accuracy_level 0" in f.form for f in report.foreign)


def test_qdq_lift_then_standard_export_gives_every_graph_back():
    """DequantizeLinear-21 with a short last block (K = 48, blocks of 32): lifted to codes padded
    to whole blocks + Slice, and written back as the DequantizeLinear it was, in every graph."""
    model = nested_model(qdq_layer)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == len(PLACES) and not report.skipped
    assert all("Slice" in op_types_in(lifted, place) for place in PLACES)
    back = dyndq.export(lifted)
    assert constants_of(back) == constants_of(model)
    for (path, a), (_, b) in zip(nodes_everywhere(back), nodes_everywhere(model), strict=True):
        if a.op_type not in ("If", "Loop", "Scan"):
            assert a.SerializeToString() == b.SerializeToString(), path
    assert np.array_equal(on_ort(back, True, "off"), on_ort(model, True, "off"))


@pytest.mark.parametrize("level", ["off", "basic", "all"])
def test_qdq_lift_then_standard_export_computes_the_same_bits_on_onnxruntime_at_every_level(level):
    """The same bits as the model lifted, at every level: where ONNX Runtime fuses DequantizeLinear
    + MatMul into MatMulNBits it fuses both alike.  (Each branch holds its own weights here: ONNX
    Runtime 1.32's fusion fails on a branch reading the main graph's: "Missing required weight".)"""
    model = nested_model(qdq_layer, outer=False)
    back = dyndq.export(dyndq.lift(model))
    for cond in (True, False):
        assert np.array_equal(on_ort(back, cond, level), on_ort(model, cond, level))


@pytest.mark.parametrize("cond", [True, False])
def test_quantize_reaches_every_graph(cond):
    model = nested_model(float_layer)
    quantized, report = dyndq.quantize(model, bits=8, group_size=16, evaluate=False)
    assert sorted(layer.name for layer in report.layers) == sorted(f"w_{p}" for p in PLACES)
    assert not report.left_alone
    for place in PLACES:  # (the else branch's weight is the main graph's: quantized there)
        assert "DynamicDequantize" in op_types_in(quantized, "main" if place == "else" else place), place
    assert not {name for _, name in constants_of(quantized)} & {f"w_{p}" for p in PLACES}
    assert dyndq.check(quantized) == []
    got = dyndq.run(quantized, feeds(cond), engine="reference")["y"]
    want = on_ort(model, cond)
    assert np.linalg.norm(got - want) <= 0.02 * np.linalg.norm(want)  # (8 bits: the quantization error itself)
    for target in ("onnx", "onnxruntime"):
        exported = dyndq.export(quantized, target=target)
        assert dyndq.check(exported) == []
        assert close(on_ort(exported, cond), got), target


def test_shared_weights_stay_one_copy_both_ways():
    """Two MatMulNBits reading one B, scales and zero points: one set of codes when lifted (under
    the original names), one again when written back."""
    rng = np.random.default_rng(0)
    nodes, tensors = nbits_layer("shared", "x", "y1", rng)
    second = onnx.NodeProto()
    second.CopyFrom(nodes[0])
    second.name, second.output[0] = "mm_second", "y2"
    second.input[0] = "y1"
    t = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    model = helper.make_model(helper.make_graph(nodes + [second], "g", [t("x", [2, K])], [t("y2", [2, N])], tensors),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    lifted = dyndq.lift(model)
    codes = [t for t in lifted.graph.initializer if t.data_type == TensorProto.UINT4]
    assert [t.name for t in lifted.graph.initializer] == ["B_shared", "s_shared", "z_shared"]
    assert len(codes) == 2  # the codes and the zero points, once each
    ddq = [n for n in lifted.graph.node if n.op_type == "DynamicDequantize"]
    assert len(ddq) == 2 and ddq[0].input == ddq[1].input
    back = dyndq.export(lifted, target="onnxruntime")
    assert constants_of(back) == constants_of(model)
    assert [n.op_type for n in back.graph.node] == ["MatMulNBits", "MatMulNBits"]


def test_a_weight_shared_by_the_main_graph_and_a_branch_stays_one_copy():
    rng = np.random.default_rng(0)
    nodes, tensors = nbits_layer("shared", "x", "h", rng)
    inner = onnx.NodeProto()
    inner.CopyFrom(nodes[0])
    inner.name, inner.input[0], inner.output[0] = "mm_inner", "h", "y_then"
    t = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)  # noqa: E731
    branch = helper.make_graph([inner], "then", [], [t("y_then", [2, N])])
    other = helper.make_graph([helper.make_node("Identity", ["h"], ["y_else"])], "else", [], [t("y_else", [2, N])])
    graph = helper.make_graph(nodes + [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=branch,
                                                        else_branch=other)], "g",
                              [t("x", [2, K]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [t("y", [2, N])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 2
    assert [t.name for s in scopes(lifted) if s.graph is not None for t in s.graph.initializer] == \
        ["B_shared", "s_shared", "z_shared"]
    assert dyndq.check(lifted) == []
    for cond in (True, False):
        got = dyndq.run(lifted, {"x": feeds(cond)["x"][:, 0], "cond": np.array(cond)}, engine="reference")["y"]
        want = run_ort(model, {"x": feeds(cond)["x"][:, 0], "cond": np.array(cond)})[0]
        assert close(got, want)
    assert constants_of(dyndq.export(lifted, target="onnxruntime")) == constants_of(model)


def biased_layer(tag, x, y, rng):
    """MatMul + Add of a bias held in a Constant node (as paddle2onnx, tf2onnx and jax2tf write it)."""
    nodes, tensors = float_layer(tag, x, f"{y}_unbiased", rng)
    bias = numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), f"b_{tag}")
    return [helper.make_node("Constant", [], [bias.name], name=f"b_{tag}_const", value=bias), *nodes,
            helper.make_node("Add", [f"{y}_unbiased", bias.name], [y], name=f"add_{tag}")], tensors


@pytest.mark.parametrize("cond", [True, False])
def test_a_bias_made_by_a_constant_node_stays_for_the_matmul_nbits_reading_it(cond):
    """The bias Add folds into MatMulNBits in every graph; the Constant node making the bias is
    still read (by MatMulNBits), so it stays, and ONNX Runtime loads the file."""
    model = nested_model(biased_layer)
    quantized, _ = dyndq.quantize(model, bits=4, group_size=16, evaluate=False)
    exported = dyndq.export(quantized, target="onnxruntime")
    # (but for the else branch: its weight is the main graph's, quantized there, its MatMul the branch's)
    for place in [p for p in PLACES if p != "else"]:
        found = [n for s in scopes(exported) for n in s.nodes if n.op_type == "MatMulNBits" and n.name == f"add_{place}"]
        assert len(found) == 1 and found[0].input[5] == f"b_{place}", place
    onnx.checker.check_model(exported, full_check=True)
    assert dyndq.check(exported) == []
    want = dyndq.run(quantized, feeds(cond), engine="reference")["y"]
    assert close(on_ort(exported, cond), want)


def test_indices_made_by_a_constant_node_stay_for_the_gather_block_quantized_reading_them():
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "E")
    ids = numpy_helper.from_array(np.array([3, 0, 63], np.int64), "ids")
    graph = helper.make_graph([helper.make_node("Constant", [], ["ids"], name="ids_const", value=ids),
                               helper.make_node("Gather", ["E", "ids"], ["y"], name="embed")], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 32])], [table])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    quantized, _ = dyndq.quantize(model, bits=4, group_size=16, evaluate=False)
    exported = dyndq.export(quantized, target="onnxruntime")
    assert [n.op_type for n in exported.graph.node] == ["Constant", "GatherBlockQuantized"]
    onnx.checker.check_model(exported, full_check=True)
    assert np.array_equal(run_ort(exported, {})[0], dyndq.run(quantized, {}, engine="reference")["y"])
