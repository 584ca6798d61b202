"""dyndq.verify's engine settings (verification/settings.py): the outputs compared on each engine and
setting asked (the reference engine, ONNX Runtime's levels, OpenVINO where installed); a setting whose
quantized outputs move from the reference engine's more than the float model's do is a finding,
pinned by parity's search on the setting and the first node.  The planted fault: ONNX Runtime's
quantizer output with accuracy_level 4 set on one MatMulNBits node (its tensors untouched), which
ONNX Runtime 1.32's CPU kernel computes with its input quantized to int8 (measured here: the logits
move by about 6e-3 of their largest, where float32 reordering moves them by 5e-7)."""
from __future__ import annotations

import numpy as np
import pytest

import dyndq
from dyndq.parity import EngineMissing
from dyndq.parity.metrics import TOLERANCE
from dyndq.verification import settings
from dyndq.verification.settings import EngineSetting, settings_asked, unexplained

pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")  # (needs onnx_ir: the test extra)
from verify_models import accuracy_level_set, float_model, nbits  # noqa: E402

EXPECTED = {"W1": "rtn", "W2": "rtn", "W3": "rtn", "E": "float"}


@pytest.fixture(scope="module")
def source():
    return float_model()


@pytest.fixture(scope="module")
def quantized(source):
    return nbits(source)


def test_the_unmodified_quantizer_output_has_no_setting_finding_at_any_level(source, quantized):
    report = dyndq.verify(quantized, source, samples=2, levels=["off", "basic", "extended", "all"])
    assert [(o.engine, o.setting) for o in report.outputs] == [
        ("reference", "our kernel"), ("onnxruntime", "off"), ("onnxruntime", "basic"), ("onnxruntime", "extended"),
        ("onnxruntime", "all")]
    assert report.settings == [] and report.faithful, report.table()
    assert report.as_dict()["settings"] == []


def test_accuracy_level_4_on_one_node_is_pinned_on_that_node_and_nothing_else(source, quantized):
    planted = accuracy_level_set(quantized, "W2")
    before = planted.SerializeToString()
    report = dyndq.verify(planted, source, samples=2)
    assert planted.SerializeToString() == before  # (parity's search sets accuracy_level 0 on copies)
    assert {w.source: w.status for w in report.weights} == EXPECTED and report.findings == []  # (every weight rtn)
    found, = report.settings
    assert (found.engine, found.setting, found.output) == ("onnxruntime", "basic", "logits")
    assert [(c.kind, c.name) for c in found.culprits] == [("accuracy_level", "fc2_Q4")]
    assert "holds accuracy_level 4" in found.culprits[0].what and "accuracy_level 0 there it agrees" in found.culprits[0].what
    assert (found.node.node, found.node.op_type, found.node.output) == ("fc2_Q4", "MatMulNBits", "h2")
    # the figures the rule decided by: int8 activations against float32 reordering
    assert found.difference > 1e-3 and found.float_difference < 1e-5 and found.allowance == TOLERANCE
    assert not report.faithful and report.summary().endswith("; 1 finding(s)")
    text = "\n".join(report.table())
    assert "setting      onnxruntime (basic optimizations): logits moved" in text
    assert "culprit: accuracy_level fc2_Q4: com.microsoft::MatMulNBits 'fc2_Q4' holds accuracy_level 4" in text
    assert "first divergence: node 'fc2_Q4' (MatMulNBits" in text
    entry, = report.as_dict()["settings"]
    assert set(entry) == {"engine", "setting", "culprits", "node", "figures", "notes"}
    assert entry["culprits"][0]["kind"] == "accuracy_level" and entry["node"]["node"] == "fc2_Q4"
    assert set(entry["figures"]) == {"output", "difference", "float_difference", "allowance"}


def test_accuracy_level_4_is_pinned_at_every_level_since_the_model_carries_it(source, quantized):
    report = dyndq.verify(accuracy_level_set(quantized, "W3"), source, samples=1, levels=["off", "all"])
    assert [(s.setting, [c.name for c in s.culprits], s.node.node) for s in report.settings] == [
        ("off", ["fc3_Q4"], "fc3_Q4"), ("all", ["fc3_Q4"], "fc3_Q4")]


def test_the_reference_engine_alone_judges_no_setting(source, quantized):
    report = dyndq.verify(accuracy_level_set(quantized, "W2"), source, samples=1, engines=["reference"])
    assert [o.engine for o in report.outputs] == ["reference"] and report.settings == [] and report.faithful


def _runs(float_moved: float, quantized_moved: float):
    """Made-up runs of one output on the reference engine and one ONNX Runtime setting: the engine moves
    the float model's output and the quantized model's by the given share of their largest value."""
    y = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
    ort = EngineSetting("onnxruntime", "basic")
    moved = lambda by: [{"y": y + np.float32(by) * (y > 0.9)}]  # noqa: E731  (max |y| is 1)
    return {settings.REFERENCE: ([{"y": y}], [{"y": y}]), ort: (moved(float_moved), moved(quantized_moved))}


@pytest.mark.parametrize("float_moved,quantized_moved,finding", [
    (0.0, 5e-5, False),  # within parity's tolerance (float32 sums in another order)
    (0.0, 5e-3, True),
    (1e-2, 1.5e-2, False),  # the engine moves the float model as much: its own arithmetic (bfloat16, say)
    (1e-2, 3e-2, True),  # more than twice the float model's: not the engine's arithmetic alone
])
def test_the_rule_allows_the_float_models_own_difference(monkeypatch, float_moved, quantized_moved, finding):
    diagnosed = []
    monkeypatch.setattr(settings, "_diagnose", lambda model, setting, feed, verdict: diagnosed.append(setting))
    found, notes = unexplained(None, _runs(float_moved, quantized_moved), [{}])
    assert bool(found) == finding and notes == []
    if finding:
        assert found[0].allowance == pytest.approx(max(TOLERANCE, settings.SLACK * float_moved))
        assert found[0].difference == pytest.approx(quantized_moved, rel=1e-5)
        assert diagnosed == [EngineSetting("onnxruntime", "basic")]


def test_settings_asked_are_checked():
    assert settings_asked() == [settings.REFERENCE, EngineSetting("onnxruntime", "basic")]
    assert settings_asked(["onnxruntime"], ["all", "off"]) == [
        settings.REFERENCE, EngineSetting("onnxruntime", "all"), EngineSetting("onnxruntime", "off")]
    with pytest.raises(ValueError, match="unknown engine 'cuda'"):
        settings_asked(["cuda"])
    with pytest.raises(ValueError, match="unknown level 'disabled'; choose one of: off, basic, extended, all"):
        settings_asked(None, ["disabled"])
    with pytest.raises(ValueError, match="a level is ONNX Runtime's"):
        settings_asked(["reference"], ["all"])


def test_an_engine_not_installed_is_refused_by_name(monkeypatch, source, quantized):
    from dyndq import openvino_session

    monkeypatch.setattr(openvino_session, "installed", lambda: False)
    with pytest.raises(EngineMissing, match=r"OpenVINO is not installed \(pip install 'openvino>="):
        dyndq.verify(quantized, source, engines=["openvino"])


@pytest.mark.openvino
def test_openvino_is_compared_and_the_accuracy_level_pinned_on_onnxruntime_only(source, quantized):
    """OpenVINO runs ONNX Runtime's MatMulNBits as the reference engine does (its accuracy_level is
    ONNX Runtime's setting): the planted fault is a finding on ONNX Runtime's setting alone."""
    engines = ["reference", "onnxruntime", "openvino"]
    clean = dyndq.verify(quantized, source, samples=1, engines=engines)
    assert [(o.engine, o.setting) for o in clean.outputs] == [
        ("reference", "our kernel"), ("onnxruntime", "basic"), ("openvino", "defaults")]
    assert clean.settings == [] and clean.faithful, clean.table()
    ref, _, ov = clean.outputs
    assert abs(ov.cosine - ref.cosine) < 1e-6 and "openvino (CPU defaults) logits: cosine" in "\n".join(clean.table())
    planted = dyndq.verify(accuracy_level_set(quantized, "W2"), source, samples=1, engines=engines)
    assert [(s.engine, [c.name for c in s.culprits]) for s in planted.settings] == [("onnxruntime", ["fc2_Q4"])]


def test_a_rewrite_at_one_level_is_pinned_on_its_transformer(source):
    """ONNX Runtime's 4-bit QDQ output (DequantizeLinear + MatMul): the basic level runs it as written;
    from the extended level on ONNX Runtime fuses DequantizeLinear + MatMul into MatMulNBits at
    accuracy_level 4 (parity's known case; 1.32 fuses fc3's, K 128, and leaves the two of K 64): the
    finding is that level's alone, on the transformer, at the fused MatMul."""
    from onnxruntime.quantization import QuantFormat
    from verify_models import ort_quantized

    model = ort_quantized(source, bits=4, block_size=32, is_symmetric=False, quant_format=QuantFormat.QDQ)
    report = dyndq.verify(model, source, samples=1, levels=["basic", "all"])
    assert report.findings == []
    found, = report.settings
    assert found.setting == "all" and [(c.kind, c.name) for c in found.culprits] == [
        ("transformer", "QDQSelectorActionTransformer")], report.table()
    assert (found.node.node, found.node.op_type, found.node.became) == ("fc3_matmul_Q4", "MatMul",
                                                                        "com.microsoft::MatMulNBits")


def test_a_float16_output_is_held_to_one_unit_in_its_last_place():
    """A float16 output one unit apart between engines (ONNX Runtime's float16 MatMulNBits against our
    kernel, summing in another order, where the float16 MatMul agreed exactly: Olive's float16 output
    showed 6.2e-4) is no setting's fault: the allowance is at least the output type's epsilon."""
    ours = np.array([1.0, 0.5, -0.25], np.float16)
    moved = ours.copy()
    moved[0] = np.nextafter(ours[0], np.float16(2))  # (one unit above 1: 9.8e-4 relative)
    runs = {settings.REFERENCE: ([{"y": ours}], [{"y": ours}]),
            EngineSetting("onnxruntime", "basic"): ([{"y": ours}], [{"y": moved}])}
    assert settings.differences([{"y": moved}], [{"y": ours}])["y"][0] > TOLERANCE
    assert unexplained(float_model(), runs, [{}]) == ([], [])
    assert settings._ulp(moved) == 2.0 ** -10 and settings._ulp(moved.astype(np.float32)) == 2.0 ** -23
    assert settings._ulp(np.int64(3)) == 0.0
