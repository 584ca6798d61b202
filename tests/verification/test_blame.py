"""dyndq.verify's output tolerance and blame (dyndq/verification/blame.py): an output beyond the
tolerance is a finding; where one is (or when asked), each weight that differs from its source is
put alone into the float source and ranked by the output error it gives, so a planted fault is
the first line; a faithful model is faithful and unblamed unless blame is asked for."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper as nh

import dyndq

pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")  # (needs onnx_ir: the test extra)
from verify_models import copy_of, init, nibbles_swapped, node_of, replace  # noqa: E402


def scales_tripled(model, weight):
    """One weight's MatMulNBits scales multiplied by 3 (a wrong scale, codes kept): no known layout."""
    out = copy_of(model)
    name = node_of(out, weight).input[2]
    replace(out, name, nh.to_array(init(out, name)) * np.float32(3))
    return out


@pytest.mark.parametrize("plant,weight,status", [("nibbles", "W2", "layout"), ("scales", "W3", "differs")])
def test_a_planted_weight_moves_the_outputs_past_the_tolerance_and_is_blamed_first(source, quantized, plant, weight,
                                                                                    status):
    faulty = nibbles_swapped(quantized, weight) if plant == "nibbles" else scales_tripled(quantized, weight)
    report = dyndq.verify(faulty, source, samples=2)
    assert report.beyond and not report.faithful
    assert {o.engine for o in report.beyond} == {"reference", "onnxruntime"}
    assert f"output(s) beyond relative error {report.tolerance:g}" in report.summary()
    first = report.blame[0]
    assert (first.source, first.status) == (weight, status)
    assert first.output == "logits" and first.relative > report.tolerance
    assert [b.relative for b in report.blame] == sorted((b.relative for b in report.blame), reverse=True)
    assert {b.source for b in report.blame} == {"W1", "W2", "W3"}  # (E is the source's own: nothing to blame)
    assert first.share > 0.9  # (it alone moved the logits)
    others = [b for b in report.blame if b.source != weight]
    assert all(b.relative < 0.2 for b in others)  # (round to nearest's own error)
    line = next(x for x in report.table() if x.strip().startswith(first.weight))
    reader = {"W2": "fc2", "W3": "fc3"}[weight]  # (the source's node reading it: which layer, in the exporter's words)
    assert first.read_by == reader and first.as_dict()["read_by"] == reader
    assert line.startswith(f"    {first.weight} <- {weight} read by {reader} ({status}") and "logits relative" in line


def test_blame_is_the_float_source_with_that_one_weight_swapped(source, quantized):
    """The figure is what it says: the float source with W2 replaced by the quantized model's
    decoded W2, on ONNX Runtime, against the float source, summed over the samples."""
    from dyndq.lifter import lift_with_report
    from dyndq.runner import Runner
    from dyndq.verification.decodes import find, value_of

    feeds = [{"ids": np.array([1, 2, 3], np.int64)}, {"ids": np.array([60, 7], np.int64)}]
    report = dyndq.verify(quantized, source, inputs=feeds, blame=True)
    entry = next(b for b in report.blame if b.source == "W2")
    lifted, _ = lift_with_report(quantized)
    w2 = next(value_of(lifted, d) for d in find(lifted)[0] if d.codes_name == "W2_Q4")
    swapped = copy_of(source)
    replace(swapped, "W2", w2)
    f, q = Runner(source, "onnxruntime"), Runner(swapped, "onnxruntime")
    diff = sum(float(np.sum((f(x)["logits"].astype(np.float64) - q(x)["logits"]) ** 2)) for x in feeds)
    norm = sum(float(np.sum(f(x)["logits"].astype(np.float64) ** 2)) for x in feeds)
    assert entry.relative == pytest.approx(np.sqrt(diff / norm), rel=1e-6)
    assert "ONNX Runtime" in report.blame_note and "2 sample(s)" in report.blame_note


def test_a_faithful_model_is_within_the_tolerance_and_not_blamed(source, quantized):
    report = dyndq.verify(quantized, source, samples=2)
    assert report.faithful and report.beyond == [] and report.blame == [] and report.blame_note == ""
    assert report.summary().endswith("; faithful")


def test_blame_asked_for_ranks_a_faithful_model_and_keeps_it_faithful(source, quantized):
    report = dyndq.verify(quantized, source, samples=2, blame=True)
    assert report.faithful
    assert sorted(b.source for b in report.blame) == ["W1", "W2", "W3"]
    assert all(b.status == "rtn" and 0 < b.relative < report.tolerance for b in report.blame)
    assert sum(b.share for b in report.blame) == pytest.approx(1.0)
    assert len(dyndq.verify(quantized, source, samples=1, blame=True, blame_top=2).blame) == 2


def test_the_tolerance_alone_makes_outputs_a_finding(source, quantized):
    """Every weight faithful, the outputs held to 1e-3: the outputs are the finding, and blamed."""
    report = dyndq.verify(quantized, source, samples=2, tolerance=1e-3)
    assert report.findings == [] and not report.faithful and len(report.beyond) == 2
    assert report.summary().endswith("; 2 output(s) beyond relative error 0.001")
    assert report.blame and any("beyond the tolerance 0.001" in line for line in report.table())
    d = report.as_dict()
    assert d["tolerance"] == 1e-3 and [o["within"] for o in d["outputs"]] == [False, False]
    assert all({"weight", "source", "status", "output", "relative", "cosine", "share"} <= set(b) for b in d["blame"])
    assert d["faithful"] is False


@pytest.mark.parametrize("kw", [dict(tolerance=-0.1), dict(tolerance=float("nan")), dict(tolerance=float("inf")),
                                dict(tolerance="0.5"), dict(tolerance=True), dict(blame_top=0), dict(blame=True, outputs=False)])
def test_bad_settings_are_refused(source, quantized, kw):
    with pytest.raises(ValueError):
        dyndq.verify(quantized, source, samples=1, **kw)


def test_a_checkpoint_source_says_blame_was_not_measured(tmp_path):
    pytest.importorskip("gguf")
    from gguf_models import float_model as llama_model, gguf_tensors, source_weights, write_gguf

    src = source_weights()
    write_gguf(tmp_path / "m.gguf", gguf_tensors(src))
    imported, _ = dyndq.import_weights(llama_model(src), tmp_path / "m.gguf")
    report = dyndq.verify(imported, tmp_path / "m.gguf", blame=True)
    assert report.blame == [] and "not measured: the source is a GGUF checkpoint" in report.blame_note


def test_blame_runs_on_the_reference_engine_where_onnx_runtime_cannot_run_the_source():
    """ONNX Runtime has no bfloat16 MatMul: the swaps run on the reference engine, said."""
    import ml_dtypes
    from quantize_models import mlp

    source = mlp(k=64, n=32, dtype=ml_dtypes.bfloat16)
    ours, _ = dyndq.quantize(source, evaluate=False, bits=8, group_size=32)
    report = dyndq.verify(ours, source, samples=1, blame=True)
    assert report.blame and {b.status for b in report.blame} == {"rtn"}
    assert "on the reference engine (our kernel)" in report.blame_note
    assert "ONNX Runtime cannot run the source" in report.blame_note


def test_a_model_against_itself_has_nothing_to_blame(source):
    report = dyndq.verify(source, source, samples=1, blame=True)
    assert report.faithful and report.blame == [] and report.blame_note.endswith("none to blame")
    assert "  to blame: no weight differs from its source tensor: none to blame" in report.table()


def test_blame_takes_the_decodes_and_float_outputs_verify_already_has(source, quantized, monkeypatch):
    """No decode is computed again for the blame (the weights' one run holds them until the report
    is built), and the float source runs only with a weight swapped in: its float outputs are the
    ones outputs.compare computed.  Each counted where it is done."""
    from dyndq.quantization import swapped
    from dyndq.verification import decodes

    alone, runs = [], []
    was_alone, was_call = decodes.computed_alone, swapped.Swapped.__call__
    monkeypatch.setattr(decodes, "computed_alone", lambda model, d: alone.append(d.value) or was_alone(model, d))

    def call(self, feed, swap=None):
        runs.append(sorted(swap or {}))
        return was_call(self, feed, swap)

    monkeypatch.setattr(swapped.Swapped, "__call__", call)
    report = dyndq.verify(quantized, source, samples=2, blame=True)
    assert sorted(b.source for b in report.blame) == ["W1", "W2", "W3"]
    assert alone == []  # (before: one per blamed weight, after verify_weights let the values go)
    assert sorted(runs) == [["W1"], ["W1"], ["W2"], ["W2"], ["W3"], ["W3"]]  # (before: two more, nothing swapped)
    assert decodes._VALUES == {}  # (let go once the report is built)
