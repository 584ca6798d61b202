"""The quantizer on trained models nobody here wrote (tests/trained_models.py: PP-OCR's text
recognizer and direction classifier, paddle2onnx exports, every weight a Constant node), on real
inputs (lines of text the float models read): rtn is ONNX Runtime's quantizer, search changes
the answers no more often than rtn, int8 and int4 keep the classifier's every answer."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper as nh

import dyndq
from dyndq.runner import Runner

import trained_models as tm

pytestmark = pytest.mark.skipif(tm.missing() is not None, reason=str(tm.missing()))

REC_OUTPUT, CLS_OUTPUT = "softmax_11.tmp_0", "save_infer_model/scale_0.tmp_1"


@pytest.fixture(scope="module")
def rec():
    return dyndq.load_model(tm.path_of("ppocr_rec"))


@pytest.fixture(scope="module")
def cls():
    return dyndq.load_model(tm.path_of("ppocr_cls"))


def _weights(model) -> dict:
    out = {t.name: nh.to_array(t) for t in model.graph.initializer}
    out.update({n.output[0]: nh.to_array(n.attribute[0].t) for n in model.graph.node
                if n.op_type == "Constant" and n.attribute[0].name == "value"})
    return out


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("name,quantized", [("ppocr_rec", 9), ("ppocr_cls", 1)])
def test_rtn_is_onnxruntimes_quantizer_on_every_weight_it_takes(name, quantized):
    """Its MatMulNBitsQuantizer (default configuration) on the model with its Constants as
    initializers (it reads no Constant node); ours on the model as paddle2onnx wrote it: the same
    weights, codes (MatMulNBits' bytes, K = 120 and 240 in blocks of 128 padded), scales and zero points."""
    ort_quant = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    model = dyndq.load_model(tm.path_of(name))
    quantizer = ort_quant.MatMulNBitsQuantizer(tm.constants_as_initializers(model))
    quantizer.process()
    theirs = _weights(quantizer.model.model)
    out, report = dyndq.quantize(model, evaluate=False)
    ours = _weights(out)
    taken = sorted(n[: -len("_Q4")] for n in theirs if n.endswith("_Q4"))
    assert sorted(layer.name for layer in report.layers) == taken and len(taken) == quantized
    assert not report.left_alone
    for w in taken:
        k, n = _weights(model)[w].shape
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
