"""Weights verify finds outside the main graph (decodes.scopes): a decode inside an If branch (its
codes in the branch, or in the main graph and decoded in the branch), and a decode in a model-local
function (its codes held as Constants in the function, or given to it as inputs by its call), each
judged as in the main graph, its note saying where it is; and a fault planted in a branch is found
on that weight alone."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq.quantization.numerics import quantize_weight

K, N, BLOCK = 64, 32, 32
OPSET = [helper.make_opsetid("", 21)]


def weights() -> dict:
    rng = np.random.default_rng(1)
    return {f"W{i}": (rng.standard_normal((K, N)) * 0.1).astype(np.float32) for i in range(1, 6)}


def source_model() -> onnx.ModelProto:
    """x -> MatMul(W1); then MatMul of W2 or W3 by a condition; and MatMul(W4) + MatMul(W5): all main initializers."""
    w = weights()
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then", "W2"), else_branch=_branch("else", "W3")),
             helper.make_node("MatMul", ["x", "W4"], ["a"]), helper.make_node("MatMul", ["x", "W5"], ["b"])]
    graph = helper.make_graph(nodes, "source", _inputs(), _outputs(), [numpy_helper.from_array(v, k) for k, v in w.items()])
    return helper.make_model(graph, opset_imports=OPSET, ir_version=10)


def _inputs():
    return [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, K]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, [])]


def _outputs():
    return [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, N]) for n in ("y", "a", "b")] + \
        [helper.make_tensor_value_info("h", TensorProto.FLOAT, [2, N])]


def _branch(label: str, weight: str, nodes=(), inits=()) -> onnx.GraphProto:
    """A branch computing MatMul(x, weight) (x and, unless `nodes` make it, the weight read from outside)."""
    return helper.make_graph(list(nodes) + [helper.make_node("MatMul", ["x", weight], [f"{label}_y"])], label, [],
                             [helper.make_tensor_value_info(f"{label}_y", TensorProto.FLOAT, [2, N])], list(inits))


def rtn(w: np.ndarray, name: str) -> list[onnx.TensorProto]:
    """ONNX Runtime's matmul rule, 4 bits asymmetric, blocks of 32 along K: codes, scales, zero points."""
    q = quantize_weight(w, axis=0, group_size=BLOCK, bits=4, symmetric=False, scale_dtype=np.float32, rule="matmul")
    codes, zeros = np.asarray(q.codes, np.uint8), np.asarray(q.zero_points, np.uint8)
    return [helper.make_tensor(f"{name}_q", TensorProto.UINT4, codes.shape, codes.reshape(-1).tolist()),
            numpy_helper.from_array(np.asarray(q.scales, np.float32), f"{name}_s"),
            helper.make_tensor(f"{name}_z", TensorProto.UINT4, zeros.shape, zeros.reshape(-1).tolist())]


def dq(name: str, out: str | None = None) -> onnx.NodeProto:
    return helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [out or name], axis=0,
                            block_size=BLOCK)


def quantized_model(*, swapped_w2: bool = False) -> onnx.ModelProto:
    """W1 decoded in the main graph; W2's codes and decode in the then branch; W3's codes in the main
    graph, decoded in the else branch; W4 by function local::Linear given its codes by its call;
    W5 by function local::Fixed holding its codes as Constants."""
    w = weights()
    w2 = rtn(w["W2"], "W2")
    if swapped_w2:  # (each pair of neighbouring codes swapped along the blocks: a nibble-order fault)
        codes = numpy_helper.to_array(w2[0]).astype(np.uint8)
        swapped = codes.reshape(K // 2, 2, N)[:, ::-1, :].reshape(K, N)
        w2[0] = helper.make_tensor("W2_q", TensorProto.UINT4, swapped.shape, swapped.reshape(-1).tolist())
    then = _branch("then", "W2", [dq("W2")], w2)
    otherwise = _branch("else", "W3", [dq("W3")])
    linear = helper.make_function("local", "Linear", ["x", "W4_q", "W4_s", "W4_z"], ["out"],
                                  [dq("W4", "w"), helper.make_node("MatMul", ["x", "w"], ["out"])], OPSET)
    fixed_nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in rtn(w["W5"], "W5")]
    fixed = helper.make_function("local", "Fixed", ["x"], ["out"],
                                 fixed_nodes + [dq("W5", "w5"), helper.make_node("MatMul", ["x", "w5"], ["out"])], OPSET)
    nodes = [dq("W1"), helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("If", ["cond"], ["y"], name="choose", then_branch=then, else_branch=otherwise),
             helper.make_node("Linear", ["x", "W4_q", "W4_s", "W4_z"], ["a"], domain="local", name="call_linear"),
             helper.make_node("Fixed", ["x"], ["b"], domain="local", name="call_fixed")]
    inits = rtn(w["W1"], "W1") + rtn(w["W3"], "W3") + rtn(w["W4"], "W4")
    graph = helper.make_graph(nodes, "quantized", _inputs(), _outputs(), inits)
    return helper.make_model(graph, opset_imports=OPSET + [helper.make_opsetid("local", 1)], ir_version=10,
                             functions=[linear, fixed])


def by_source(report) -> dict:
    return {w.source: w for w in report.weights}


def test_every_weight_is_found_in_branches_and_functions():
    report = dyndq.verify(quantized_model(), source_model(), outputs=False)
    got = by_source(report)
    assert sorted(got) == ["W1", "W2", "W3", "W4", "W5"], report.table()
    assert {w.status for w in report.weights} == {"rtn"}, report.table()
    assert all("matmul rule" in w.rule for w in report.weights)
    assert got["W1"].note == ""  # (not placed)
    assert got["W2"].note.startswith("in main/choose.then_branch"), got["W2"].note
    assert got["W3"].note.startswith("in main/choose.else_branch"), got["W3"].note
    assert got["W4"].note.startswith("in function local::Linear (its input 'W4_q', given by call 'call_linear')"), \
        got["W4"].note
    assert got["W5"].note.startswith("in function local::Fixed (inlined at its call)"), got["W5"].note
    assert report.faithful and not report.unused


def test_a_fault_in_a_branch_is_found_on_that_weight_alone():
    report = dyndq.verify(quantized_model(swapped_w2=True), source_model(), outputs=False)
    got = by_source(report)
    assert (got["W2"].status, got["W2"].kind) == ("layout", "nibble-order"), report.table()
    assert [w.source for w in report.findings] == ["W2"]


def test_the_model_passed_in_is_not_changed():
    model = quantized_model()
    before = model.SerializeToString()
    dyndq.verify(model, source_model(), outputs=False)
    assert model.SerializeToString() == before


@pytest.mark.parametrize("engine", ["onnxruntime"])
def test_the_outputs_are_compared_through_branches_and_functions(engine):
    """(the models run: the quantized model made here is a valid one)"""
    feeds = {"x": np.random.default_rng(2).standard_normal((2, K)).astype(np.float32), "cond": np.array(True)}
    report = dyndq.verify(quantized_model(), source_model(), inputs=feeds)
    cosines = {(o.engine, o.name): o.cosine for o in report.outputs}
    assert (engine, "y") in cosines and cosines[(engine, "y")] > 0.99, (report.outputs, report.outputs_note)


def loop_and_scan(*, quantized: bool) -> onnx.ModelProto:
    """x -> a Loop of 2 iterations whose body adds MatMul(x, W1) to its carried value, and a Scan over
    the rows of x whose body is MatMul(row, W2): W1 and W2 main initializers, decoded (quantized) in
    the bodies from codes the main graph holds (W1) and the body holds (W2)."""
    w = weights()
    loop_nodes = ([dq("W1")] if quantized else []) + [helper.make_node("MatMul", ["x", "W1"], ["m"]),
                                                      helper.make_node("Add", ["acc", "m"], ["acc_out"]),
                                                      helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    loop_body = helper.make_graph(loop_nodes, "loop_body", [
        helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        helper.make_tensor_value_info("acc", TensorProto.FLOAT, [2, N])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, N])])
    scan_nodes = ([dq("W2")] if quantized else []) + [helper.make_node("MatMul", ["row", "W2"], ["row_out"])]
    scan_body = helper.make_graph(scan_nodes, "scan_body", [helper.make_tensor_value_info("row", TensorProto.FLOAT, [K])],
                                  [helper.make_tensor_value_info("row_out", TensorProto.FLOAT, [N])],
                                  rtn(w["W2"], "W2") if quantized else [])
    nodes = [helper.make_node("Loop", ["trips", "", "zeros"], ["looped"], name="repeat", body=loop_body),
             helper.make_node("Scan", ["x"], ["scanned"], name="rows", body=scan_body, num_scan_inputs=1)]
    inits = [numpy_helper.from_array(np.array(2, np.int64), "trips"), numpy_helper.from_array(np.zeros((2, N), np.float32), "zeros")]
    inits += rtn(w["W1"], "W1") if quantized else [numpy_helper.from_array(w["W1"], "W1")]
    if not quantized:
        inits.append(numpy_helper.from_array(w["W2"], "W2"))
    graph = helper.make_graph(nodes, "loop_scan", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, K])],
                              [helper.make_tensor_value_info("looped", TensorProto.FLOAT, [2, N]),
                               helper.make_tensor_value_info("scanned", TensorProto.FLOAT, [2, N])], inits)
    return helper.make_model(graph, opset_imports=OPSET, ir_version=10)


def test_weights_in_loop_and_scan_bodies_are_found():
    report = dyndq.verify(loop_and_scan(quantized=True), loop_and_scan(quantized=False),
                          inputs={"x": np.random.default_rng(3).standard_normal((2, K)).astype(np.float32)})
    got = by_source(report)
    assert {k: w.status for k, w in got.items()} == {"W1": "rtn", "W2": "rtn", "zeros": "float"}, report.table()
    assert report.faithful  # (the Loop's float start, "zeros", is the source's)
    assert got["W1"].note.startswith("in main/repeat.body") and got["W2"].note.startswith("in main/rows.body")
    assert {(o.engine, o.name) for o in report.outputs} >= {("onnxruntime", "looped"), ("onnxruntime", "scanned")}, \
        report.outputs_note


def source_holding_its_own_nested_weights() -> onnx.ModelProto:
    """The source with W2 an initializer of its then branch and W5 a Constant of a function local::Fixed
    (what a float source holding its weights outside the main graph looks like)."""
    w = weights()
    then = _branch("then", "W2", inits=[numpy_helper.from_array(w["W2"], "W2")])
    fixed = helper.make_function("local", "Fixed", ["x"], ["out"], [
        helper.make_node("Constant", [], ["W5"], value=numpy_helper.from_array(w["W5"], "W5")),
        helper.make_node("MatMul", ["x", "W5"], ["out"])], OPSET)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]),
             helper.make_node("If", ["cond"], ["y"], name="choose", then_branch=then, else_branch=_branch("else", "W3")),
             helper.make_node("MatMul", ["x", "W4"], ["a"]),
             helper.make_node("Fixed", ["x"], ["b"], domain="local", name="call_fixed")]
    inits = [numpy_helper.from_array(w[k], k) for k in ("W1", "W3", "W4")]
    graph = helper.make_graph(nodes, "source", _inputs(), _outputs(), inits)
    return helper.make_model(graph, opset_imports=OPSET + [helper.make_opsetid("local", 1)], ir_version=10,
                             functions=[fixed])


def test_a_float_sources_weights_in_branches_and_functions_are_read():
    report = dyndq.verify(quantized_model(), source_holding_its_own_nested_weights(), outputs=False)
    got = by_source(report)
    assert got["W2"].matched == "by name" and got["W2"].status == "rtn", report.table()
    assert {w.status for w in report.weights} == {"rtn"} and len(report.weights) == 5, report.table()
    assert report.faithful and not report.unused, report.table()
