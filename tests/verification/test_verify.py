"""dyndq.verify: ONNX Runtime's own quantizer outputs (MatMulNBits 4-bit, DequantizeLinear 8-bit)
verify as round to nearest with no false alarm; copies with one planted fault each (nibbles
swapped, zero points plus one, blocks reversed, a square weight quantized transposed, one weight
requantized) name that weight and that fault, and nothing else; an import of a GGUF checkpoint
verifies identical against the GGUF; the outputs are compared on both engines."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh

import dyndq

ort_quant = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")  # (needs onnx_ir: the test extra)
from onnxruntime.quantization import QuantFormat  # noqa: E402

from verify_models import (blocks_reversed, copy_of, init, nbits, nibbles_swapped, ort_quantized,  # noqa: E402
                           replace, requantized, transposed_square, zero_points_plus_one)

def qdq8(model, folder, per_channel: bool, quant_format=QuantFormat.QDQ) -> onnx.ModelProto:
    """ONNX Runtime's static QDQ quantizer (int8 weights, its default symmetric; the activations
    quantized too, calibrated on two samples): DequantizeLinear per tensor or per channel + MatMul
    (QuantFormat.QOperator: QLinearMatMul)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize_static

    class Samples(CalibrationDataReader):
        def __init__(self):
            self.left = iter([{"ids": np.array([1, 2, 3], np.int64)}, {"ids": np.array([5, 63], np.int64)}])

        def get_next(self):
            return next(self.left, None)

    onnx.save(model, folder / "float.onnx")
    quantize_static(folder / "float.onnx", folder / "qdq.onnx", Samples(), quant_format=quant_format,
                    weight_type=QuantType.QInt8, per_channel=per_channel, op_types_to_quantize=["MatMul"])
    return onnx.load(folder / "qdq.onnx")


def test_onnxruntimes_matmulnbits_output_verifies_as_round_to_nearest(source, quantized):
    report = dyndq.verify(quantized, source, outputs=False)
    got = {w.source: w for w in report.weights}
    assert {k: (w.status, w.kind) for k, w in got.items()} == {
        "W1": ("rtn", None), "W2": ("rtn", None), "W3": ("rtn", None), "E": ("float", None)}
    assert report.faithful and report.unused == []
    assert "matmul rule" in got["W2"].rule and "asymmetric" in got["W2"].rule and "block 32" in got["W2"].rule
    assert got["E"].error == 0.0


@pytest.mark.parametrize("per_channel", [False, True])
def test_onnxruntimes_qdq_8bit_output_verifies_as_its_rule(source, tmp_path, per_channel):
    model = qdq8(source, tmp_path, per_channel)
    assert sum(n.op_type == "DequantizeLinear" for n in model.graph.node) > 3  # (weights and activations)
    report = dyndq.verify(model, source, samples=1)
    assert {w.source: w.status for w in report.weights} == {"W1": "rtn", "W2": "rtn", "W3": "rtn", "E": "float"}
    form = "per channel" if per_channel else "per tensor"
    assert all(w.rule == f"ONNX Runtime's qdq rule (quant_utils.quantize_data), symmetric, 8 bits, {form}"
               for w in report.weights if w.status == "rtn")
    assert {w.weight for w in report.weights} == {"W1_DequantizeLinear_Output", "W2_DequantizeLinear_Output",
                                                  "W3_DequantizeLinear_Output", "E"}  # (the values the MatMuls read)
    assert [o.top1 for o in report.outputs] == [1.0, 1.0]  # (both engines)


def test_onnxruntimes_qdq_4bit_output_verifies_as_round_to_nearest(source):
    model = ort_quantized(source, bits=4, block_size=32, is_symmetric=False, quant_format=QuantFormat.QDQ)
    assert any(n.op_type == "DequantizeLinear" for n in model.graph.node)
    report = dyndq.verify(model, source, outputs=False)
    assert {w.source: w.status for w in report.weights} == {"W1": "rtn", "W2": "rtn", "W3": "rtn", "E": "float"}
    assert all("matmul rule" in w.rule and "asymmetric, 4 bits, block 32" in w.rule
               for w in report.weights if w.status == "rtn")


@pytest.mark.parametrize("symmetric", [False, True])
def test_onnxruntimes_gatherblockquantized_verifies_by_its_gather_rule(source, symmetric):
    model = ort_quantized(source, bits=4, block_size=32, is_symmetric=symmetric, op_types_to_quantize=("MatMul", "Gather"))
    assert "GatherBlockQuantized" in [n.op_type for n in model.graph.node]
    report = dyndq.verify(model, source, outputs=False)
    got = {w.source: w for w in report.weights}
    assert {k: w.status for k, w in got.items()} == {"E": "rtn", "W1": "rtn", "W2": "rtn", "W3": "rtn"}
    assert got["E"].rule.startswith("ONNX Runtime's gather rule (quantize_ndarray), " +
                                    ("symmetric" if symmetric else "asymmetric"))
    assert got["E"].weight == "E_Q4"


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_onnxruntimes_dynamic_qoperator_weights_are_judged_rtn(source, tmp_path, per_channel, reduce_range):
    """quantize_dynamic (QOperator: MatMulInteger on int8 weights, the scale multiplied into the int32
    product; Olive's OnnxDynamicQuantization calls it): each MatMulInteger weight whose float input
    a DynamicQuantizeLinear quantizes is decoded (decodes.prepared) and judged: rtn, exactly ONNX
    Runtime's qdq rule (with reduce_range: its 7-bit codes, named so), W1 too, whose input is the
    embedding's codes gathered, and that embedding table (its scale the other factor of W1's
    product, its zero point W1's a_zero_point): no false alarm.  Before, no weight was listed and
    the report was "faithful" on weights never compared; then each was said unmatched."""
    from onnxruntime.quantization import quantize_dynamic

    onnx.save(source, tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "dynamic.onnx", per_channel=per_channel,
                     reduce_range=reduce_range)
    model = onnx.load(tmp_path / "dynamic.onnx")
    assert "MatMulInteger" in {n.op_type for n in model.graph.node}
    report = dyndq.verify(model, source, outputs=False)
    by = {w.weight: w for w in report.weights}
    rule = "qdq-reduced rule (quant_utils.quantize_data with reduce_range)" if reduce_range else \
        "qdq rule (quant_utils.quantize_data)"
    for name in ("W1_quantized", "W2_quantized", "W3_quantized"):
        assert by[name].status == "rtn" and rule in by[name].rule, report.table()
        assert ("per channel" if per_channel else "per tensor") in by[name].rule
    # (the table at the full 8 bits even with reduce_range, which ONNX Runtime gives its MatMul weights)
    assert by["E_quantized"].status == "rtn" and "quant_utils.quantize_data" in by["E_quantized"].rule, report.table()
    assert report.faithful and not [w for w in report.weights if w.status in ("float", "unmatched")], report.table()


def test_a_qoperator_weight_not_decoded_is_unmatched_among_unnamed_nodes(tmp_path):
    """Nodes without names, two MatMulIntegers: the one whose scale is found is judged rtn; the one
    whose product is multiplied by a stored constant (no scale of its own to find) stays unmatched,
    never left out (the decoded codes are told apart by their names, not by their nodes')."""
    from onnx import TensorProto as T, helper
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"], name="fc2")]
    inits = [nh.from_array(rng.standard_normal((16, 32)).astype(np.float32), "W1"),
             nh.from_array(rng.standard_normal((32, 8)).astype(np.float32), "W2")]
    float_model = helper.make_model(helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", T.FLOAT, [2, 16])],
                                                      [helper.make_tensor_value_info("y", T.FLOAT, [2, 8])], inits),
                                    opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(float_model, tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "dynamic.onnx")
    model = onnx.load(tmp_path / "dynamic.onnx")
    last = next(n for n in model.graph.node if n.output[0] == "y")  # (W2's product times a stored constant)
    product = next(i for i in last.input if "scales_mul" in i)
    model.graph.initializer.append(nh.from_array(np.array(0.01, np.float32), "stored_product"))
    last.input[list(last.input).index(product)] = "stored_product"
    for n in model.graph.node:
        n.name = ""
    report = dyndq.verify(model, float_model, outputs=False)
    by = {w.weight: w for w in report.weights}
    assert by["W1_quantized"].status == "rtn", report.table()
    assert by["W2_quantized"].status == "unmatched" and "a form verify does not decode" in by["W2_quantized"].note


@pytest.mark.parametrize("per_channel", [False, True])
def test_onnxruntimes_static_qoperator_weights_are_judged_rtn_and_a_planted_zero_point_named(source, tmp_path,
                                                                                            per_channel):
    """quantize_static with QuantFormat.QOperator: QLinearMatMul on int8 weights, its scale and zero
    point its own inputs; each weight is decoded and judged rtn (ONNX Runtime's qdq rule), the
    outputs of both engines agree; a zero point plus one planted in one weight's is named on that
    weight alone."""
    model = qdq8(source, tmp_path, per_channel, QuantFormat.QOperator)
    assert "QLinearMatMul" in {n.op_type for n in model.graph.node}
    report = dyndq.verify(model, source, outputs=False)
    judged = {w.weight: w for w in report.weights if w.weight.endswith("_quantized")}
    assert judged and all(w.status == "rtn" and "quant_utils.quantize_data" in w.rule for w in judged.values()), \
        report.table()
    bad = copy_of(model)
    name = sorted(judged)[-1]
    zp = next(t for t in bad.graph.initializer if t.name == name.replace("_quantized", "_zero_point"))
    zp.CopyFrom(nh.from_array((nh.to_array(zp).astype(np.int16) + 1).astype(nh.to_array(zp).dtype), zp.name))
    planted = dyndq.verify(bad, source, outputs=False)
    off = [(w.weight, w.kind) for w in planted.weights if w.status not in ("rtn", "float")]
    assert off == [(name, "zero-point-off-by-one")], planted.table()


def test_an_output_the_quantizer_renamed_is_compared_by_its_place_and_said(source, quantized):
    """Olive 0.13's RTN pass renames a quantized MatMul's output, the graph's own ("logits_Q4"): its
    outputs are still compared, with the source's output at the same place, and that is said; an
    output with no counterpart is said, not compared (before: nothing compared, nothing said)."""
    renamed = copy_of(quantized)
    renamed.graph.output[0].name = "logits_Q4"
    next(n for n in renamed.graph.node if "logits" in n.output).output[0] = "logits_Q4"
    report = dyndq.verify(renamed, source, samples=1)
    assert [(o.engine, o.name) for o in report.outputs] == [("reference", "logits"), ("onnxruntime", "logits")]
    assert report.faithful and "the quantized model's output 'logits_Q4' is compared with the source's 'logits'" \
        in report.outputs_note
    from dyndq.verification.outputs import paired

    two = copy_of(renamed)
    two.graph.output.append(onnx.helper.make_tensor_value_info("r1", onnx.TensorProto.FLOAT, None))
    pairs, notes = paired(two, source)
    assert pairs == {} and notes == ["the source's output 'logits' is not compared: the quantized model has no output "
                                     "of that name"]


def test_a_zero_point_off_by_one_in_a_qdq_8bit_model_is_named(source, tmp_path):
    """ONNX Runtime's static QDQ quantizer, per channel: one weight's zero points (0, symmetric) made 1."""
    model = qdq8(source, tmp_path, per_channel=True)
    zp = init(model, "W3_zero_point")
    replace(model, "W3_zero_point", nh.to_array(zp) + np.int8(1))
    report = dyndq.verify(model, source, outputs=False)
    [finding] = report.findings
    assert (finding.source, finding.status, finding.kind) == ("W3", "layout", "zero-point-off-by-one")
    assert "64 of 64 zero points +1" in finding.note


def test_a_symmetric_quantization_is_named_symmetric(source):
    model = ort_quantized(source, bits=4, block_size=16, is_symmetric=True)
    report = dyndq.verify(model, source, outputs=False)
    rtn = [w for w in report.weights if w.status == "rtn"]
    assert len(rtn) == 3 and all(", symmetric, 4 bits, block 16" in w.rule for w in rtn)


@pytest.mark.parametrize("plant,weight,status,kind", [
    ("nibbles", "W2", "layout", "nibble-order"),
    ("zero points", "W3", "layout", "zero-point-off-by-one"),
    ("blocks", "W3", "layout", "block-order"),
    ("transposed", "W1", "layout", "transposed"),
    ("requantized", "W2", "requantized", None),
])
def test_a_planted_fault_is_named_and_only_that_one(source, quantized, plant, weight, status, kind):
    faulty = {"nibbles": lambda: nibbles_swapped(quantized, weight),
              "zero points": lambda: zero_points_plus_one(quantized, weight),
              "blocks": lambda: blocks_reversed(quantized, weight),
              "transposed": lambda: transposed_square(quantized, weight, source),
              "requantized": lambda: requantized(quantized, weight, source)}[plant]()
    report = dyndq.verify(faulty, source, outputs=False)
    found = {w.source: w for w in report.weights}
    assert (found[weight].status, found[weight].kind) == (status, kind), found[weight]
    assert sorted(w.source for w in report.findings) == [weight]
    assert {k: w.status for k, w in found.items() if k != weight} == {
        k: v for k, v in {"W1": "rtn", "W2": "rtn", "W3": "rtn", "E": "float"}.items() if k != weight}
    if status == "requantized":
        assert found[weight].codes_off in (1, 2) and 0 < found[weight].error < 0.2
    assert not report.faithful


def test_a_float_weight_changed_is_a_finding(source, quantized):
    changed = copy_of(quantized)
    e = nh.to_array(init(changed, "E")).copy()
    e[3, 5] += 1.0
    replace(changed, "E", e)
    report = dyndq.verify(changed, source, outputs=False)
    bad = report.findings
    assert [(w.weight, w.status) for w in bad] == [("E", "float")] and bad[0].error > 0


def test_outputs_are_compared_on_both_engines_with_logits_metrics(source, quantized):
    report = dyndq.verify(quantized, source, samples=2)
    assert {(o.engine, o.name) for o in report.outputs} == {("reference", "logits"), ("onnxruntime", "logits")}
    for o in report.outputs:
        assert 0.98 < o.cosine <= 1.0 + 1e-9 and 0 < o.relative < 0.3
        assert 0.5 <= o.top1 <= 1.0 and 0 <= o.kl < 0.05
    assert "2 seeded samples (seed 0" in report.inputs
    # the engines agree on a quantized model's outputs (the same dequantized weights) to float rounding
    ref, ort = sorted(report.outputs, key=lambda o: o.engine != "reference")
    assert abs(ref.relative - ort.relative) < 1e-4


def test_the_users_inputs_are_used_when_given(source, quantized):
    feeds = {"ids": np.array([0, 63, 5], np.int64)}
    report = dyndq.verify(quantized, source, inputs=feeds)
    assert report.inputs.startswith("1 sample given")


def test_the_report_as_json_has_the_documented_keys(source, quantized):
    d = dyndq.verify(quantized, source, samples=1).as_dict()
    assert {"quantized", "source", "weights", "outputs", "blame"} <= set(d)
    assert all({"weight", "source", "status"} <= set(w) for w in d["weights"])
    assert all({"engine", "setting", "name", "cosine", "relative", "top1", "kl"} <= set(o) for o in d["outputs"])


def test_a_model_passed_in_is_not_modified(source, quantized):
    before = (source.SerializeToString(), quantized.SerializeToString())
    dyndq.verify(quantized, source, samples=1)
    assert (source.SerializeToString(), quantized.SerializeToString()) == before


# -- a checkpoint as the source ---------------------------------------------------------------------

def test_an_import_of_a_gguf_checkpoint_verifies_identical_against_it(tmp_path):
    pytest.importorskip("gguf")
    from gguf_models import float_model as llama_model, gguf_tensors, source_weights, write_gguf

    src = source_weights()
    tensors = gguf_tensors(src)
    write_gguf(tmp_path / "m.gguf", tensors)
    imported, _ = dyndq.import_weights(llama_model(src), tmp_path / "m.gguf")
    report = dyndq.verify(imported, tmp_path / "m.gguf")
    assert report.faithful and len(report.weights) == 7
    assert {w.source: w.status for w in report.weights if w.status != "identical"} == {"output_norm.weight": "float"}
    assert report.unused == ["blk.0.attn_v.weight"]
    assert report.outputs == [] and "checkpoint" in report.outputs_note
    # one weight's decode changed: no longer the checkpoint's own dequantization
    broken = copy_of(imported)
    ddq = next(n for n in broken.graph.node if n.op_type == "DynamicDequantize")
    codes = init(broken, ddq.input[0])
    arr = nh.to_array(codes).copy()
    arr.reshape(-1)[0] = arr.reshape(-1)[1] if arr.reshape(-1)[0] != arr.reshape(-1)[1] else arr.reshape(-1)[0] ^ 1
    codes.CopyFrom(nh.from_array(arr, codes.name))
    report = dyndq.verify(broken, tmp_path / "m.gguf")
    assert len(report.findings) == 1 and report.findings[0].status in ("requantized", "differs")


def test_an_import_for_onnxruntime_verifies_identical_through_its_fused_ops(tmp_path):
    """`--emit onnxruntime`: the fused Q4_0/Q8_0 weights (MatMulNBits and GatherBlockQuantized whose
    scales are the checkpoint's float16 d through a Cast to float32) are decoded by the lift and
    judged identical to the checkpoint's, as the composition's are."""
    pytest.importorskip("gguf")
    from gguf_models import float_model as llama_model, gguf_tensors, source_weights, write_gguf

    src = source_weights()
    write_gguf(tmp_path / "m.gguf", gguf_tensors(src))
    imported, imported_report = dyndq.import_weights(llama_model(src), tmp_path / "m.gguf", emit="onnxruntime")
    fused = [n for n in imported.graph.node if n.domain == "com.microsoft"]
    assert len(fused) == 3 and all(imported_report.forms[w].endswith("1.000x the checkpoint's bytes")
                                   for w in imported_report.forms if not imported_report.forms[w].startswith("composition"))
    report = dyndq.verify(imported, tmp_path / "m.gguf")
    assert report.faithful and len(report.weights) == 7
    assert {w.source: w.status for w in report.weights if w.status != "identical"} == {"output_norm.weight": "float"}


# -- dyndq's own quantizer, in each form it writes -----------------------------------------------------

@pytest.mark.parametrize("dtype,options", [("float32", {}), ("float32", dict(symmetric=True, group_size=32)),
                                           ("float16", {}), ("bfloat16", dict(bits=8)), ("float32", dict(bits=2))])
@pytest.mark.parametrize("form", ["dyndq", "onnx", "onnxruntime"])
def test_dyndqs_own_round_to_nearest_verifies_as_rtn_in_each_form_it_writes(dtype, options, form):
    """dyndq.quantize(method="rtn") gives ONNX Runtime's codes: verify says rtn for every weight, in our
    op, exported to standard ONNX (DequantizeLinear, and float16 NaN quieting after it) and to ONNX
    Runtime's contrib ops; a weight whose last group is padded (k=200) too."""
    import ml_dtypes
    from quantize_models import mlp

    source = mlp(k=200, n=96, dtype={"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype])
    ours, _ = dyndq.quantize(source, evaluate=False, **options)
    model = ours if form == "dyndq" else dyndq.export(ours, target=form)
    report = dyndq.verify(model, source, outputs=False)
    assert [(w.source, w.status) for w in report.weights] == [("E", "rtn"), ("W1", "rtn"), ("W2", "rtn")], report.table()


def test_an_engine_that_cannot_run_a_model_is_said_not_raised():
    """ONNX Runtime has no bfloat16 MatMul: the outputs are compared on the reference engine alone."""
    import ml_dtypes
    from quantize_models import mlp

    source = mlp(k=64, n=32, dtype=ml_dtypes.bfloat16)
    ours, _ = dyndq.quantize(source, evaluate=False, bits=8, group_size=32)
    report = dyndq.verify(ours, source, samples=1)
    assert {o.engine for o in report.outputs} == {"reference"}
    assert report.outputs_note.startswith("onnxruntime (basic optimizations): not compared: the source does not run there")


def test_a_gguf_checkpoint_requantized_by_another_route_shows_requantized(tmp_path):
    """The GGUF's dequantization put into the float model, then ONNX Runtime's quantizer: the MatMul
    weights it quantized are requantized (round to nearest of the checkpoint's values, named), the
    weights it left float are the checkpoint's own values."""
    pytest.importorskip("gguf")
    from gguf_models import (DOWN, K, expected, float_model as llama_model, gguf_tensors, source_weights, with_weights,
                             write_gguf)

    src = source_weights()
    tensors = gguf_tensors(src)
    write_gguf(tmp_path / "m.gguf", tensors)
    other_route = nbits(with_weights(llama_model(src), expected(tensors)))
    report = dyndq.verify(other_route, tmp_path / "m.gguf")
    got = {w.source: w for w in report.weights}
    requantized = {k: w for k, w in got.items() if w.status == "requantized"}
    assert set(requantized) == {"blk.0.attn_k.weight", "blk.0.ffn_down.weight"}
    for w in requantized.values():
        assert "matmul rule" in w.rule and 0.01 < w.error < 0.2 and "checkpoint's dequantization" in w.note
    assert {w.status for k, w in got.items() if k not in requantized} == {"float"}
    assert all(w.error == 0.0 for w in got.values() if w.status == "float")
    assert sorted(w.source for w in report.findings) == sorted(requantized)
    assert {w.weight for w in requantized.values()} == {K + "_Q4", DOWN + "_Q4"}  # (its MatMulNBits' B, named after them)


def test_dyndq_verify_is_the_function_after_its_package_is_imported():
    """The package is named otherwise (verification/, as quantization/ is for dyndq.quantize): importing
    it would otherwise make `dyndq.verify` the module, and every call a TypeError."""
    import subprocess
    import sys

    code = ("import dyndq.verification.weights, dyndq.cli.verify, dyndq\n"
            "print(callable(dyndq.verify), dyndq.verify.__module__, dyndq.VerifyReport.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "dyndq.verification", "VerifyReport"]
