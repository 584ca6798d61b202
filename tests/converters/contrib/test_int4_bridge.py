"""The int4 bridge on models nobody here wrote: ONNX Runtime's own MatMulNBitsQuantizer (QOperator
and QDQ formats, 4 and 8 bits, blocks of 16, 32 and 128, symmetric and asymmetric, MatMul and
Gather) applied to an LLM-shaped float model (tests/decoder.py), then lifted and exported.

- Weights: every dequantized weight is the same in value on every path: ONNX Runtime's
  MatMulNBits (its effective weights, read by a run with A = identity(K)) or DequantizeLinear,
  our kernel on the lifted DynamicDequantize, and ONNX Runtime on the standard export.
- Outputs (ONNX Runtime, basic optimizations, so that DequantizeLinear + MatMul is not fused into
  MatMulNBits at accuracy_level 4): identical bits where the same kernels run (the contrib ops
  written back; the QDQ model and its standard export), within parity.TOLERANCE of the output's
  largest magnitude where MatMulNBits and MatMul sum in different orders.
- QOperator models come back byte for byte from lift -> export(target="onnxruntime").
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from decoder import decoder_model, ort_quantize as quantize
from onnx import TensorProto, helper, numpy_helper

from cases import run_ort

import dyndq
from dyndq.cli import main
from dyndq.parity import TOLERANCE

CONFIGS = [(fmt, bits, block, sym)
           for fmt in ("QOperator", "QDQ") for bits in (4, 8) for block in (16, 32, 128) for sym in (True, False)
           if not (fmt == "QDQ" and bits == 8)]  # (ONNX Runtime's quantizer writes 8 bits in QOperator format only)


@pytest.fixture(scope="module")
def float_model():
    return decoder_model(hidden=128, layers=2, vocab=512)


def on_ort(model, feeds, outputs=None):
    got = run_ort(model, feeds, level="basic", outputs=outputs)
    return dict(zip(outputs or [o.name for o in model.graph.output], got))


def with_outputs(model, names):
    """A copy of the model that also returns the values `names` (float32, shape left open)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    return out


def effective_weights(model, node):
    """MatMulNBits' weights as ONNX Runtime computes them: the node alone, run with A = identity(K)."""
    K = next(a.i for a in node.attribute if a.name == "K")
    used = set(node.input)
    single = onnx.ModelProto()
    single.CopyFrom(model)
    del single.graph.node[:]
    single.graph.node.append(node)
    keep = [t for t in model.graph.initializer if t.name in used]
    del single.graph.initializer[:]
    single.graph.initializer.extend(keep)
    del single.graph.input[:]
    single.graph.input.append(helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT, [K, K]))
    del single.graph.output[:]
    single.graph.output.append(helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None))
    return on_ort(single, {node.input[0]: np.eye(K, dtype=np.float32)})[node.output[0]]


def weight_values(lifted):
    """node name -> the value it reads as its weight (a MatMul's B, a Gather's table), for each
    MatMul or Gather reading a lifted weight."""
    made = {o for n in lifted.graph.node if n.op_type in ("DynamicDequantize", "Slice") for o in n.output}
    return {n.name: n.input[1] if n.op_type == "MatMul" else n.input[0] for n in lifted.graph.node
            if n.op_type in ("MatMul", "Gather") and (n.input[1] if n.op_type == "MatMul" else n.input[0]) in made}


NO_IDS = {"input_ids": np.zeros((1, 1), np.int64)}


@pytest.mark.parametrize("fmt, bits, block, sym", CONFIGS, ids=[f"{f}-{b}bit-b{k}-{'sym' if s else 'asym'}"
                                                                for f, b, k, s in CONFIGS])
def test_onnxruntime_quantizer_models_lift_and_export_exactly(float_model, fmt, bits, block, sym):
    model = quantize(float_model, fmt, bits, block, sym)
    lifted, report = dyndq.lift_with_report(model)
    kinds = {n.op_type for n in model.graph.node}
    quantized = [n for n in model.graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized", "DequantizeLinear")]
    assert len(quantized) == (16 if "GatherBlockQuantized" in kinds else 15)
    assert report.count == len(quantized) and not report.skipped and dyndq.check(lifted) == []
    assert not any(n.domain == "com.microsoft" for n in lifted.graph.node)

    # weights: the same values on every path (ours: our kernel; standard: ONNX Runtime on the standard export)
    values = weight_values(lifted)
    names = list(values.values())
    ours = dyndq.run(with_outputs(lifted, names), NO_IDS, engine="reference")
    standard = dyndq.export(lifted)
    theirs_std = on_ort(with_outputs(standard, names), NO_IDS, names)
    for node in quantized:
        if node.op_type == "MatMulNBits":
            theirs = effective_weights(model, node)
            name = values[node.name]
        elif node.op_type == "DequantizeLinear":
            reader = next(n for n in model.graph.node if node.output[0] in n.input)
            theirs = on_ort(with_outputs(model, [node.output[0]]), NO_IDS, [node.output[0]])[node.output[0]]
            name = values[reader.name]
        else:  # GatherBlockQuantized: every row of the table, gathered by ONNX Runtime
            rows = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == node.input[0])).shape[0]
            single = with_outputs(model, [node.output[0]])
            theirs = on_ort(single, {"input_ids": np.arange(rows, dtype=np.int64)[None]}, [node.output[0]])[node.output[0]][0]
            name = values[node.name]
        assert np.array_equal(ours[name], theirs), node.name
        assert np.array_equal(theirs_std[name], theirs), node.name

    # outputs
    ids = np.random.default_rng(0).integers(0, 512, (2, 7)).astype(np.int64)
    original = on_ort(model, {"input_ids": ids})["logits"]
    written = dyndq.export(lifted, target="onnxruntime")
    scale = float(np.abs(original).max())
    if fmt == "QOperator":
        assert np.array_equal(on_ort(written, {"input_ids": ids})["logits"], original)
        assert np.abs(on_ort(standard, {"input_ids": ids})["logits"] - original).max() <= TOLERANCE * scale
        assert {t.name: t.SerializeToString() for t in written.graph.initializer} == \
            {t.name: t.SerializeToString() for t in model.graph.initializer}
        for a, b in zip(model.graph.node, written.graph.node):
            assert a.name == b.name and a.op_type == b.op_type and list(a.input) == list(b.input)
    else:
        assert np.array_equal(on_ort(standard, {"input_ids": ids})["logits"], original)
        assert sum(n.op_type == "MatMulNBits" for n in written.graph.node) == 15
        assert np.abs(on_ort(written, {"input_ids": ids})["logits"] - original).max() <= TOLERANCE * scale


@pytest.fixture(scope="module")
def float_model_1024():
    return decoder_model(hidden=1024, layers=2, vocab=2048)


@pytest.mark.big  # (about 2.3 GiB at peak, 75 s: make test-big)
@pytest.mark.parametrize("fmt, bits, block, sym", CONFIGS, ids=[f"{f}-{b}bit-b{k}-{'sym' if s else 'asym'}"
                                                                for f, b, k, s in CONFIGS])
def test_the_same_at_hidden_1024(float_model_1024, fmt, bits, block, sym):
    test_onnxruntime_quantizer_models_lift_and_export_exactly(float_model_1024, fmt, bits, block, sym)


def test_qdq_padded_k_is_lifted_with_its_padding_and_becomes_matmul_nbits(float_model):
    """K = 336 (the MLP's down projection) is not a multiple of 32: ONNX Runtime's QDQ form rounds the
    block count up; the lift pads the codes to whole blocks and slices back, exactly."""
    model = quantize(float_model, "QDQ", 4, 32, False)
    lifted, report = dyndq.lift_with_report(model)
    padded = [form for _, node, form in report.lifted if "w_down" in node or "down" in node]
    assert padded and all("(padded) + Slice" in f for f in padded)
    written = dyndq.export(lifted, target="onnxruntime")
    down = next(n for n in written.graph.node if n.output[0] == "layer0/down")
    assert down.op_type == "MatMulNBits" and next(a.i for a in down.attribute if a.name == "K") == 336


def build_ddq_matmul(src_type="int4", block=32, K=64, N=24, bias=True, scales_type="float32", feeds_mul=False):
    """What a quantizer of ours hands export: DynamicDequantize-2 per_group on a constant [K, N] weight
    feeding MatMul's B (and an Add of a constant bias)."""
    rng = np.random.default_rng(1)
    lo, hi = (-8, 7) if src_type == "int4" else (0, 15) if src_type == "uint4" else (-128, 127)
    codes = rng.integers(lo, hi + 1, (K, N)).astype(getattr(ml_dtypes, src_type, None) or np.dtype(src_type))
    scales = (rng.random((K // block, N)) * 0.05 + 0.01).astype(getattr(ml_dtypes, scales_type, None) or scales_type)
    inits = [numpy_helper.from_array(codes, "w_codes"), numpy_helper.from_array(scales, "w_scales"),
             numpy_helper.from_array(rng.standard_normal(N).astype(np.float32).astype(scales.dtype), "b")]
    t = TensorProto.FLOAT if scales_type == "float32" else TensorProto.BFLOAT16
    nodes = [dyndq.make_node(["w_codes", "w_scales"], ["w"], name="dq", qtype="per_group", group_shape=[block, 1])]
    if feeds_mul:
        nodes.append(helper.make_node("Mul", ["x", "w"], ["y"], name="mul"))
    else:
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["xw" if bias else "y"], name="mm"))
        if bias:
            nodes.append(helper.make_node("Add", ["xw", "b"], ["y"], name="bias"))
    shape = [K, N] if feeds_mul else [3, K]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", t, shape)],
                              [helper.make_tensor_value_info("y", t, [shape[0], N])], inits)
    return dyndq.make_model(graph, opset=21)


@pytest.mark.parametrize("src_type", ["int4", "uint4", "int8"])
def test_a_dynamic_dequantize_on_constant_weights_becomes_matmul_nbits(src_type):
    model = build_ddq_matmul(src_type)
    written, report = dyndq.export_with_report(model, target="onnxruntime")
    (node,) = written.graph.node
    assert node.op_type == "MatMulNBits" and node.input[5] == "b"
    attrs = {a.name: a.i for a in node.attribute}
    assert attrs == {"K": 64, "N": 24, "bits": 4 if "4" in src_type else 8, "block_size": 32, "accuracy_level": 0}
    assert "accuracy_level 0: the graph's float meaning" in report.foreign[0].form and "with bias" in report.foreign[0].form
    if src_type == "int4":  # symmetric int4: shifted by 8, which is MatMulNBits' absent zero point
        assert len([i for i in node.input if i]) == 4
    x = np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32)
    expected = dyndq.run(model, {"x": x}, engine="reference")["y"]
    got = on_ort(written, {"x": x})["y"]
    assert np.abs(got - expected).max() <= TOLERANCE * np.abs(expected).max()
    ddq = dyndq.run(build_ddq_matmul(src_type, bias=False), {"x": np.eye(64, dtype=np.float32)[:3]}, engine="reference")["y"]
    eff = effective_weights(written, onnx.helper.make_node("MatMulNBits", list(node.input[:4]) if len(node.input) > 3 else
                                                         list(node.input[:3]), ["y"], domain="com.microsoft", **attrs))
    assert np.array_equal(eff[:3], ddq)


@pytest.mark.parametrize("change, why", [
    (dict(feeds_mul=True), "not MatMulNBits: its output feeds Mul 'mul', not the B of a MatMul"),
    (dict(scales_type="bfloat16"), "scales is bfloat16: ONNX Runtime's CPU MatMulNBits takes float32 and float16"),
    (dict(block=8, K=64), "group_shape [8, 1]: MatMulNBits takes [block, 1] with block a power of two from 16"),
])
def test_a_node_no_contrib_op_expresses_is_lowered_the_standard_way_and_says_why(change, why):
    written, report = dyndq.export_with_report(build_ddq_matmul(**change), target="onnxruntime")
    assert not report.foreign and not any(n.domain == "com.microsoft" for n in written.graph.node)
    (lowered,) = report.lowered
    assert why in lowered.why
    assert any(why in line for line in report.lines())


def test_cli_export_target_and_accuracy_level(tmp_path, capsys):
    onnx.save(build_ddq_matmul(), tmp_path / "m.onnx")
    assert main(["export", str(tmp_path / "m.onnx"), str(tmp_path / "ort.onnx"), "--target", "onnxruntime",
                 "--accuracy-level", "4"]) == 0
    out = capsys.readouterr().out
    assert "wrote 1 MatMulNBits node(s)" in out and "accuracy_level 4: asked" in out
    assert onnx.load(tmp_path / "ort.onnx").graph.node[0].op_type == "MatMulNBits"
    assert main(["export", str(tmp_path / "m.onnx"), str(tmp_path / "x.onnx"), "--accuracy-level", "4"]) == 2
    assert "--accuracy-level goes with --target onnxruntime" in capsys.readouterr().err


def test_cli_lift_names_what_it_left_alone(tmp_path, capsys):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(0, 256, (4, 2, 4)).astype(np.uint8), "B"),
             numpy_helper.from_array(np.ones((4, 2), np.float32), "s"), numpy_helper.from_array(np.full(8, 0.25, np.float32), "zp")]
    node = helper.make_node("MatMulNBits", ["A", "B", "s", "zp"], ["Y"], name="quarter", domain="com.microsoft",
                            K=32, N=4, bits=2, block_size=16)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                                ir_version=10), tmp_path / "m.onnx")
    assert main(["lift", str(tmp_path / "m.onnx"), str(tmp_path / "l.onnx")]) == 0
    out = capsys.readouterr().out
    assert "lifted 0" in out and "left 1 alone" in out
    assert ("main: com.microsoft::MatMulNBits 'quarter' left alone: zero_points (float32) hold values that are neither "
            "integers nor half-integers") in out


def test_runtime_parity_flags_the_qdq_int4_model_at_the_default_level_only(float_model, tmp_path, capsys):
    onnx.save(quantize(float_model, "QDQ", 4, 32, False), tmp_path / "qdq.onnx")
    assert main(["check", "--runtime-parity", "--level", "all", str(tmp_path / "qdq.onnx")]) == 1
    out = capsys.readouterr().out
    assert "1 of 1 engine settings differ with the reference engine" in out and "logits: differs" in out
    assert "com.microsoft::MatMulNBits 0 -> 15 (accuracy_level 4)" in out
    assert "cause: transformer QDQSelectorActionTransformer" in out
    assert main(["check", "--runtime-parity", "--level", "basic", str(tmp_path / "qdq.onnx")]) == 0
    out = capsys.readouterr().out
    assert "every engine setting (1) agrees" in out
