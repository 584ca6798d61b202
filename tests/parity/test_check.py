"""runtime_parity: each engine setting against the model's meaning (the reference engine), the
transformer responsible and the first node that differs, on ONNX Runtime's own QDQ int4 models.

The axis=0 class (onnxsim/onnxsim#749, reported on ONNX Runtime 1.29: DequantizeLinear(axis=0,
block_size) on a [K, N] int4 weight + MatMul/Gemm, fused into MatMulNBits at the default level,
said to miscompute) is built as that report describes it: symmetric int4 codes in [-7, 7], no zero
point, blocks of 32 along K.  On ONNX Runtime 1.32 the fusion happens and the outputs move by the
accuracy_level 4 effect only: with the session option that sets the fused node's accuracy_level
to 0, the fused model agrees with the graph's meaning within the tolerance.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from decoder import decoder_model, ort_quantize
from onnx import TensorProto, helper, numpy_helper
from parity_models import our_int4_matmul

import dyndq
from dyndq.parity import ORT_LEVELS, example_feeds, runtime_parity
from dyndq.parity import engines
from dyndq.parity.engines import Tweak
from dyndq.parity.metrics import compare
from dyndq.parity.ort_rewrites import transformers


def axis0_model(op="MatMul", K=256, N=64, block=32, seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(-7, 8, (K, N)).astype(ml_dtypes.int4)
    scales = (rng.random((K // block, N)) * 0.02 + 0.005).astype(np.float32)
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "w_s"], ["w"], axis=0, block_size=block, name="dq")]
    if op == "MatMul":
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"))
    else:
        nodes.append(helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="gemm"))
    graph = helper.make_graph(nodes, "axis0", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, N])],
                              [numpy_helper.from_array(codes, "w_q"), numpy_helper.from_array(scales, "w_s"),
                               numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.fixture(scope="module")
def qdq_model():
    """ONNX Runtime's own quantizer (MatMulNBitsQuantizer, QDQ form): DequantizeLinear(int4, blocks of 32) + MatMul."""
    return ort_quantize(decoder_model(hidden=128, layers=2, vocab=512), "QDQ", 4, 32, False)


def first_quantized_matmul(model):
    made_by_dq = {o for n in model.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return next(n for n in model.graph.node if n.op_type == "MatMul" and set(n.input) & made_by_dq)


def test_onnxruntimes_qdq_int4_model_names_the_transformer_and_the_first_fused_matmul(qdq_model):
    report = runtime_parity(qdq_model)
    by_level = {c.setting.name: c for c in report.comparisons}
    assert list(by_level) == list(ORT_LEVELS) and report.reference.startswith("the reference engine")
    assert by_level["off"].agrees and by_level["basic"].agrees
    for level in ("extended", "all"):
        c = by_level[level]
        assert not c.agrees and [o.name for o in c.outputs] == ["logits"]
        assert [(k.kind, k.name) for k in c.causes] == [("transformer", "QDQSelectorActionTransformer")]
        what = c.causes[0].what
        assert "com.microsoft::MatMulNBits 0 -> 15 (accuracy_level 4)" in what and "DequantizeLinear 15 -> 0" in what
        assert "session.qdq_matmulnbits_accuracy_level=0 it agrees (measured)" in what
        mm = first_quantized_matmul(qdq_model)
        d = c.first_divergence
        assert (d.node, d.op_type, d.output, d.inputs) == (mm.name, "MatMul", mm.output[0], tuple(mm.input))
        assert d.became == "com.microsoft::MatMulNBits" and not d.parity.agrees
        n = len(transformers(level))
        assert c.bisection["sessions"] <= math.ceil(math.log2(n)) + 2, c.bisection
    assert report.cost["compared_sessions"] == 5 and not report.agrees


def test_disabling_the_named_transformer_is_what_makes_it_agree(qdq_model):
    """Measured directly: QDQSelectorActionTransformer disabled agrees; a name ONNX Runtime does not
    know changes nothing (it takes unknown names silently)."""
    feeds = example_feeds(qdq_model)
    reference = engines.run_reference(qdq_model, feeds)["logits"]

    def at_all(disabled=()):
        return engines.run_onnxruntime(qdq_model, "all", feeds, ["logits"], Tweak(disabled=disabled))["logits"]

    assert not compare("logits", at_all(), reference).agrees
    assert compare("logits", at_all(("QDQSelectorActionTransformer",)), reference).agrees
    assert not compare("logits", at_all(("NoSuchTransformer",)), reference).agrees


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_axis0_blocked_int4_is_flagged_at_the_default_level_for_its_accuracy_level_4(op):
    report = runtime_parity(axis0_model(op), levels=["basic", "all"])
    basic, full = report.comparisons
    assert basic.agrees and not full.agrees
    assert [k.name for k in full.causes] == ["QDQSelectorActionTransformer"]
    assert "com.microsoft::MatMulNBits 0 -> 1 (accuracy_level 4)" in full.causes[0].what
    assert "it agrees (measured)" in full.causes[0].what  # (1.32 fuses axis=0 correctly apart from the accuracy level)
    assert (full.first_divergence.node, full.first_divergence.op_type) == ("mm", "MatMul") if op == "MatMul" else \
        (full.first_divergence.node, full.first_divergence.op_type) == ("gemm", "Gemm")


def test_without_diagnosis_only_the_compared_sessions_run(qdq_model):
    report = runtime_parity(qdq_model, levels=["all"], diagnose=False)
    c, = report.comparisons
    assert not c.agrees and c.causes == [] and c.first_divergence is None and c.bisection is None
    assert report.cost["diagnosis_sessions"] == 0 and report.cost["compared_sessions"] == 2


def test_a_float_model_agrees_at_every_level():
    report = runtime_parity(decoder_model(hidden=64, layers=1, vocab=128))
    assert report.agrees and len(report.comparisons) == 4, report.lines()
    assert "every engine setting (4) agrees with the reference engine" in report.summary()


def test_example_feeds_index_within_the_gathered_axis():
    feeds = example_feeds(decoder_model(hidden=64, layers=1, vocab=7), seed=3)
    ids = feeds["input_ids"]
    assert ids.shape == (4, 4) and ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 7


def test_a_model_with_our_op_is_checked_through_both_exports():
    """Export target "onnx" writes DequantizeLinear + MatMul, which ONNX Runtime's default level fuses at
    accuracy_level 4; target "onnxruntime" writes MatMulNBits itself, at accuracy_level 0: exact."""
    report = runtime_parity(our_int4_matmul(), levels=["off", "all"])
    assert [(c.setting.export, c.setting.name, c.agrees) for c in report.comparisons] == \
        [("onnx", "off", True), ("onnx", "all", False), ("onnxruntime", "off", True), ("onnxruntime", "all", True)]
    assert "our kernel" in report.reference
    fused = report.comparisons[1]
    assert [k.name for k in fused.causes] == ["QDQSelectorActionTransformer"]
    assert (fused.first_divergence.node, fused.first_divergence.became) == ("mm", "com.microsoft::MatMulNBits")
    assert [c["export"] for c in report.as_dict()["comparisons"]] == ["onnx", "onnx", "onnxruntime", "onnxruntime"]


def test_an_mxfp4_model_is_exported_in_a_form_onnxruntime_runs():
    """float4e2m1 codes and float8e8m0 scales (version 3): ONNX Runtime has no float4 tensors; the
    export for it writes the codes as their bits and a table, and compares as for any model."""
    codes = (np.arange(64) % 16).astype(np.uint8).reshape(16, 4).view(ml_dtypes.float4_e2m1fn)
    scales = np.full((1, 4), 126, np.uint8).view(ml_dtypes.float8_e8m0fnu)
    graph = helper.make_graph(
        [dyndq.make_node(["q", "s"], ["w"], qtype="per_group", group_shape=[16, 1], output_dtype=TensorProto.FLOAT),
         helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(codes, "q"), numpy_helper.from_array(scales, "s")])
    report = runtime_parity(dyndq.make_model(graph, opset=21), levels=["basic"])
    assert report.agrees and [o.name for o in report.comparisons[0].outputs] == ["y"], report.lines()


def test_the_demo_model_agrees():
    """Its uint4 weights have zero points of another dtype (integer route)."""
    from dyndq.demo import build_model

    report = runtime_parity(build_model(), levels=["off", "all"])
    assert report.agrees and report.comparisons[0].outputs, report.lines()


def test_a_model_the_reference_engine_cannot_run_is_compared_with_onnxruntime_off():
    """com.microsoft::FusedMatMul (no lift, no onnx.reference kernel): ONNX Runtime with optimizations
    off stands in for the meaning, and is not compared with itself."""
    graph = helper.make_graph(
        [helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", alpha=0.5, name="fused")], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    report = runtime_parity(model)
    assert report.reference.startswith("ONNX Runtime") and "with graph optimizations off" in report.reference
    assert [c.setting.name for c in report.comparisons] == ["basic", "extended", "all"] and report.agrees


@pytest.mark.parametrize("opset, op, outputs, words", [
    (10, "Dropout", ["y", "mask"], "is not trusted for Dropout-10 (node 'n'): ONNX does not define the mask output's "
                                   "values outside training before opset 12"),
    (12, "BatchNormalization", ["y", "running_mean", "running_var", "saved_mean", "saved_var"],
     "is not trusted for BatchNormalization-9 (node 'n'): in training mode (more than one output) before opset 14 "
     "ONNX does not define saved_mean and saved_var")])
def test_an_op_the_reference_is_not_trusted_for_is_said_and_onnxruntime_off_stands_in(opset, op, outputs, words):
    """dyndq.reference_ops.UNTRUSTED: the meaning is ONNX Runtime with optimizations off, the report names
    the op, its node and why, and no engine is blamed for the reference engine's values."""
    inputs = ["x"] if op == "Dropout" else ["x", "s", "b", "m", "v"]
    shapes = {"x": [2, 3, 4, 4]}
    graph = helper.make_graph(
        [helper.make_node(op, inputs, outputs, name="n")], "g",
        [helper.make_tensor_value_info(i, TensorProto.FLOAT, shapes.get(i, [3])) for i in inputs],
        [helper.make_tensor_value_info(o, TensorProto.BOOL if o == "mask" else TensorProto.FLOAT, None)
         for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)}
    if op != "Dropout":
        feeds.update(s=np.ones(3, np.float32), b=np.zeros(3, np.float32), m=np.zeros(3, np.float32),
                     v=np.ones(3, np.float32))
    report = runtime_parity(model, feeds=feeds)
    assert report.reference.startswith("ONNX Runtime") and words in report.reference, report.reference
    assert [c.setting.name for c in report.comparisons] == ["basic", "extended", "all"] and report.agrees, report.lines()


@pytest.mark.parametrize("bad, words", [(dict(levels=["fast"]), "unknown level 'fast'"),
                                        (dict(engines=["tvm"]), "unknown engine 'tvm'")])
def test_an_unknown_level_or_engine_is_refused(bad, words):
    with pytest.raises(ValueError, match=words):
        runtime_parity(axis0_model(), **bad)


# -- feeds: as `dyndq run --engine onnxruntime` feeds them --------------------------------------


def narrow_input_model(rows=2):
    """d = DynamicDequantize(w4 uint4[rows, 4], s bfloat16[rows, 2]) per group of [1, 2], both graph inputs."""
    graph = helper.make_graph(
        [dyndq.make_node(["w4", "s"], ["d"], qtype="per_group", group_shape=[1, 2], name="dq4")], "g",
        [helper.make_tensor_value_info("w4", TensorProto.UINT4, [rows, 4]),
         helper.make_tensor_value_info("s", TensorProto.BFLOAT16, [rows, 2])],
        [helper.make_tensor_value_info("d", TensorProto.BFLOAT16, [rows, 4])])
    return dyndq.make_model(graph, opset=21)


def bfloat16_cast_model():
    """Standard ONNX (nothing to export): y = Cast(x bfloat16[2, 4]) to float32."""
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("model", [narrow_input_model(), narrow_input_model("rows"), bfloat16_cast_model()],
                         ids=["int4-bfloat16", "int4-symbolic-dim", "bfloat16-standard"])
def test_int4_and_bfloat16_graph_inputs_are_fed(model):
    report = runtime_parity(model)
    assert report.agrees and all(len(c.outputs) == 1 for c in report.comparisons), report.lines()
    assert {i["dtype"] for i in report.inputs} <= {"uint4", "bfloat16"}


def test_given_feeds_are_fed_with_their_bits():
    """A given int4/bfloat16 feed reaches every engine setting as it is (NaN payload included)."""
    w4 = np.array([[1, 15, 0, 7], [8, 3, 2, 9]], ml_dtypes.uint4)
    s = np.array([[0.5, 0.25], [1.0, np.nan]], ml_dtypes.bfloat16)
    s.view(np.uint16)[1, 1] = 0x7FC5
    report = runtime_parity(narrow_input_model(), feeds={"w4": w4, "s": s})
    assert report.agrees and all(i["given"] for i in report.inputs), report.lines()


def test_runtime_parity_raises_a_feed_error_naming_the_input():
    from dyndq.runner import FeedError

    with pytest.raises(FeedError, match="x: found a float64 array"):
        runtime_parity(bfloat16_cast_model(), feeds={"x": np.zeros((2, 4))})


def test_the_model_given_is_not_changed(qdq_model):
    before = qdq_model.SerializeToString()
    runtime_parity(qdq_model, levels=["all"])
    assert qdq_model.SerializeToString() == before


def test_a_search_that_fails_leaves_the_comparison_and_says_why(qdq_model, monkeypatch):
    from dyndq.parity import check

    def broken(*args, **kwargs):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : a session the search made failed")

    monkeypatch.setattr(check, "_ort_causes", broken)
    report = runtime_parity(qdq_model, levels=["all"])
    c, = report.comparisons
    assert not c.agrees and c.outputs[0].name == "logits" and c.causes == []
    assert c.notes == ["the search for the cause stopped: a session the search made failed"]


def test_the_summary_says_how_many_settings_cannot_run():
    from dyndq.parity.engines import Setting
    from dyndq.parity.metrics import OutputParity
    from dyndq.parity.report import Comparison, ParityReport

    same = OutputParity("y", True, 0.0, 1.0, 0.0)
    moved = OutputParity("y", False, 0.5, 1.0, 0.5)
    report = ParityReport("m.onnx", "the reference engine", comparisons=[
        Comparison(Setting("onnxruntime", "disabled"), [same]), Comparison(Setting("onnxruntime", "all"), [moved]),
        Comparison(Setting("openvino", "default", "openvino"), error="no kernel for Foo")])
    assert report.summary().startswith("2 of 3 engine settings differ with the reference engine")
    assert report.summary().endswith("; 1 of them cannot run")
    report.comparisons[2] = Comparison(Setting("openvino", "default", "openvino"), [same])
    assert "cannot run" not in report.summary() and report.summary().startswith("1 of 3 engine settings differ")


def test_a_matmulnbits_nodes_own_accuracy_level_4_is_named_by_halves():
    """ONNX Runtime's MatMulNBitsQuantizer output with accuracy_level 1, 4 and 2 set on its three nodes:
    no rewrite is to blame (the model carries the setting, and every level runs it, "off" too); the
    search over the nodes that set one names the node at 4 alone (1 and 2, float32 and float16 on a
    CPU, compute as 0 does here, measured) and the first node whose output differs is that one."""
    pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")  # (needs onnx_ir: the test extra)
    from verify_models import nbits, node_of

    model = nbits()
    for weight, level in (("W1", 1), ("W2", 4), ("W3", 2)):
        node_of(model, weight).attribute.append(helper.make_attribute("accuracy_level", level))
    report = runtime_parity(model, levels=["off", "basic"])
    for c in report.comparisons:
        assert not c.agrees and [(k.kind, k.name) for k in c.causes] == [("accuracy_level", "fc2_Q4")], c.lines()
        assert "holds accuracy_level 4" in c.causes[0].what and "accuracy_level 0 there it agrees" in c.causes[0].what
        assert (c.first_divergence.node, c.first_divergence.op_type, c.first_divergence.output) == \
            ("fc2_Q4", "MatMulNBits", "h2")
    assert "cause: accuracy_level fc2_Q4: " in "\n".join(report.lines())
    assert report.as_dict()["comparisons"][1]["causes"][0]["kind"] == "accuracy_level"
