"""The quantizer on trained models nobody here wrote (tests/trained_models.py: PP-OCR's text
recognizer and direction classifier, paddle2onnx exports, every weight a Constant node; and
sentence-transformers' all-MiniLM-L6-v2, exported by torch.onnx.export, every weight an
initializer), on real inputs (lines of text the float models read, English sentences): rtn is
ONNX Runtime's quantizer, search changes the answers no more often than rtn, int8 and int4 keep
the classifier's every answer, a size budget's widths err no more than uniform int4 at its size, gptq
calibrated on some sentences errs less than rtn on others.
Each model's tests are skipped, saying how to get it, where it is not there."""
from __future__ import annotations

import numpy as np
import pytest

import dyndq
from dyndq.runner import Runner

import trained_models as tm

needs_ppocr = pytest.mark.skipif(tm.missing() is not None, reason=str(tm.missing()))
needs_minilm = pytest.mark.skipif(tm.minilm_missing() is not None, reason=str(tm.minilm_missing()))

REC_OUTPUT, CLS_OUTPUT = "softmax_11.tmp_0", "save_infer_model/scale_0.tmp_1"


@pytest.fixture(scope="module")
def rec():
    if tm.missing():
        pytest.skip(tm.missing())
    return dyndq.load_model(tm.path_of("ppocr_rec"))


@pytest.fixture(scope="module")
def cls():
    if tm.missing():
        pytest.skip(tm.missing())
    return dyndq.load_model(tm.path_of("ppocr_cls"))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("name,quantized", [pytest.param("ppocr_rec", 9, marks=needs_ppocr),
                                            pytest.param("ppocr_cls", 1, marks=needs_ppocr),
                                            pytest.param("minilm", 36, marks=needs_minilm)])
def test_rtn_is_onnxruntimes_quantizer_on_every_weight_it_takes(name, quantized):
    """Its MatMulNBitsQuantizer (default configuration: MatMul only) on the model with its Constants
    as initializers (it reads no Constant node); ours on the model as written: the same weights,
    codes (MatMulNBits' bytes, K = 120 and 240 in blocks of 128 padded; MiniLM's K = 384 and 1536),
    scales and zero points.  (Ours also takes MiniLM's 3 Gather tables, which it leaves alone.)"""
    ort_quant = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    model = dyndq.load_model(tm.path_of(name))
    quantizer = ort_quant.MatMulNBitsQuantizer(tm.constants_as_initializers(model))
    quantizer.process()
    theirs = tm.weights(quantizer.model.model)
    out, report = dyndq.quantize(model, evaluate=False)
    ours = tm.weights(out)
    taken = sorted(n[: -len("_Q4")] for n in theirs if n.endswith("_Q4"))
    assert sorted(layer.name for layer in report.layers if layer.ops == ["MatMul"]) == taken and len(taken) == quantized
    assert all(layer.ops == ["Gather"] for layer in report.layers if layer.name not in taken)
    assert not report.left_alone
    for w in taken:
        k, n = tm.weights(model)[w].shape
        blocks = -(-k // 128)
        levels = ours[f"{w}_quantized"].view(np.uint8).T.reshape(n, blocks, 128)
        np.testing.assert_array_equal(levels[..., 0::2] | (levels[..., 1::2] << 4), theirs[f"{w}_Q4"])
        np.testing.assert_array_equal(ours[f"{w}_scales"].reshape(blocks, n), theirs[f"{w}_scales"].reshape(n, blocks).T)
        zps = theirs[f"{w}_zero_points"]
        zps = np.stack([zps & 15, zps >> 4], axis=-1).reshape(n, -1)[:, :blocks].T
        np.testing.assert_array_equal(ours[f"{w}_zero_points"].view(np.uint8).reshape(blocks, n), zps)


def _texts(model, feeds, chars) -> list[str]:
    run = Runner(model, "onnxruntime")
    return [tm.decoded(run(f)[REC_OUTPUT], chars) for f in feeds]


def test_search_changes_the_recognized_text_no_more_often_than_rtn(rec):
    texts, feeds = tm.recognizer_inputs(seed=0, count=10)
    chars = tm.characters(rec)
    read = _texts(rec, feeds, chars)
    assert sum(a == b for a, b in zip(read, texts)) >= len(texts) // 2  # (real inputs: the float model reads them)
    changed = {}
    for label, options in (("rtn", {}), ("search", dict(method="search")), ("int8", dict(bits=8))):
        out, _ = dyndq.quantize(rec, evaluate=False, **options)
        changed[label] = sum(a != b for a, b in zip(read, _texts(out, feeds, chars)))
    assert changed["search"] <= changed["rtn"], changed
    assert changed["int8"] <= changed["rtn"], changed


def test_the_report_measures_the_recognizers_distributions(rec):
    _, feeds = tm.recognizer_inputs(seed=1, count=3)
    _, report = dyndq.quantize(rec, inputs=feeds)
    (output,) = report.outputs
    assert output.name == REC_OUTPUT and output.task == "distribution" and output.top1_agreement > 0.9
    assert report.outputs_note.startswith("3 samples given: x float32[1, 3, 48, ")
    assert report.activations.startswith("4 MatMuls whose B is an activation")


@pytest.mark.parametrize("options", [{}, dict(method="search"), dict(bits=8)], ids=["rtn", "search", "int8"])
def test_the_classifier_keeps_every_answer(cls, options):
    labels, feeds = tm.classifier_inputs(seed=0, count=8)
    out, report = dyndq.quantize(cls, inputs=feeds, **options)
    (output,) = report.outputs
    assert output.task == "distribution" and output.top1_agreement == 1.0 and output.kl_divergence < 1e-3
    run = Runner(cls, "onnxruntime")
    assert sum(int(run(f)[CLS_OUTPUT].argmax()) == y for f, y in zip(feeds, labels)) >= 6  # (it orients real lines)


@pytest.fixture(scope="module")
def minilm():
    if tm.minilm_missing():
        pytest.skip(tm.minilm_missing())
    return dyndq.load_model(tm.path_of("minilm"))


def _embeddings(model, feeds) -> np.ndarray:
    run = Runner(model, "onnxruntime")
    return np.concatenate([run(f)[tm.MINILM_OUTPUT] for f in feeds]).astype(np.float64)


def _cosines(a, b) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _minilm_error(model, reference, feeds) -> float:
    """Relative Frobenius of the sentence embeddings (all feeds' together), as the report measures it."""
    want = _embeddings(reference, feeds)
    return float(np.linalg.norm(_embeddings(model, feeds) - want) / np.linalg.norm(want))


def test_minilm_at_uniform_int4s_size_errs_no_more_than_uniform_int4(minilm):
    """rtn, widths among int2/int4/int8 chosen on 2 sentences, at uniform int4's bits per weight:
    within them, and an error on those sentences no larger than uniform int4's (the allocation runs
    uniform int4 jointly and keeps the least; on this model with rtn it keeps it: the word
    embedding is half the weights, and int2 there costs more than the MatMuls' int8 saves)."""
    feeds = tm.minilm_inputs("chosen", 2)
    uniform, u = dyndq.quantize(minilm, inputs=feeds)
    bits = 8 * u.bytes_after / sum(int(np.prod(layer.shape)) for layer in u.layers)
    mixed, report = dyndq.quantize(minilm, inputs=feeds, budget=bits)
    assert report.budget.bits_per_weight <= bits and report.bytes_after <= u.bytes_after
    assert len(report.budget.weights) == 39
    errors = [_minilm_error(m, minilm, feeds) for m in (uniform, mixed)]
    assert errors[1] <= errors[0] * (1 + 1e-6), errors  # (ONNX Runtime's float sums, the same order both runs)
    assert report.outputs[0].relative_error == pytest.approx(errors[1], rel=1e-3)


def test_minilm_between_int2_and_int4_mixes_widths(minilm):
    """At 3.25 bits per weight, between uniform int2's and int4's: mixed widths within the budget,
    less than half uniform int2's error on the 2 sentences chosen on, and every held-out
    sentence's embedding still near the float model's (cosine > 0.85; uniform int2: about 0.2)."""
    feeds, held = tm.minilm_inputs("chosen", 2), tm.minilm_inputs("held", 4)
    two, _ = dyndq.quantize(minilm, inputs=feeds, bits=2)
    mixed, report = dyndq.quantize(minilm, inputs=feeds, budget=3.25)
    widths = {w.candidates[w.chosen].choice for w in report.budget.weights}
    assert report.budget.bits_per_weight <= 3.25 and len(widths) > 1, report.budget.kept
    errors = [_minilm_error(m, minilm, feeds) for m in (two, mixed)]
    assert errors[1] < errors[0] / 2, errors
    assert _cosines(_embeddings(mixed, held), _embeddings(minilm, held)).min() > 0.85


def test_minilm_gptq_errs_less_than_rtn_on_held_out_sentences(minilm):
    """GPTQ (4 bits, groups of 128, asymmetric) calibrated on the 32 "chosen" sentences errs less
    than rtn on the 16 held-out ones, which it never saw: the embeddings' relative error below
    0.9x rtn's (measured: 0.236 against 0.294, 0.80x; docs/quantize.md), the Gather tables rtn's
    in both (said in the notes)."""
    chosen, held = tm.minilm_inputs("chosen"), tm.minilm_inputs("held")
    rtn, _ = dyndq.quantize(minilm, evaluate=False)
    gptq, report = dyndq.quantize(minilm, method="gptq", inputs=chosen, evaluate=False)
    assert report.notes[0].startswith("gptq calibrated on 32 samples given")
    assert "3 weights rounded by rtn instead" in report.notes[1]
    errors = [_minilm_error(m, minilm, held) for m in (rtn, gptq)]
    assert errors[1] < 0.9 * errors[0], errors


def test_minilm_scale_estimation_errs_less_than_rtn_on_held_out_sentences(minilm):
    """rtn with scale estimation (4 bits, groups of 128, asymmetric) calibrated on the 32 "chosen"
    sentences errs less than rtn alone on the 16 held-out ones: below 0.9x rtn's (docs/quantize.md
    gives the figures)."""
    chosen, held = tm.minilm_inputs("chosen"), tm.minilm_inputs("held")
    rtn, _ = dyndq.quantize(minilm, evaluate=False)
    fitted, report = dyndq.quantize(minilm, scale_estimation=True, inputs=chosen, evaluate=False)
    assert report.notes[0].startswith("rtn with scale estimation calibrated on 32 samples given")
    errors = [_minilm_error(m, minilm, held) for m in (rtn, fitted)]
    assert errors[1] < 0.9 * errors[0], errors
