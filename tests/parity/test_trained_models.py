"""runtime_parity and the reference engine on trained models nobody here wrote (tests/trained_models.py),
on real inputs: PP-OCRv4's text recognizer and PP-OCR's direction classifier (paddle2onnx, opset 12
and 11: a momentum attribute on every BatchNormalization), magika 0.5.1 (tf2onnx, opset 13: a
OneHot whose depth is a one-element tensor, a BatchNormalization) and all-MiniLM-L6-v2 (torch's
exporter, opset 17).  The reference engine runs each (it is trusted for every op they hold), reads
them as ONNX Runtime does, and parity blames no engine.  Skipped, saying how to get them, where
they are not there (`make test-models`, `make test-trained-export`)."""
from __future__ import annotations

import numpy as np
import pytest

import dyndq
from dyndq.parity import engines, runtime_parity
from dyndq.parity.engines import OPENVINO_EXACT, Tweak
from dyndq.parity.metrics import compare

import trained_models as tm

needs_ppocr = pytest.mark.skipif(tm.missing() is not None, reason=str(tm.missing()))
needs_magika = pytest.mark.skipif(tm.magika_missing() is not None, reason=str(tm.magika_missing()))
needs_minilm = pytest.mark.skipif(tm.minilm_missing() is not None, reason=str(tm.minilm_missing()))

# model -> (file, feeds, what each feed is: the recognizer's text, the classifier's label, magika's label)
MODELS = [pytest.param("ppocr_rec", marks=needs_ppocr), pytest.param("ppocr_cls", marks=needs_ppocr),
          pytest.param("magika", marks=needs_magika), pytest.param("minilm", marks=needs_minilm)]
MAGIKA_LABELS = {72: "python", 8: "c", 48: "markdown", 47: "makefile", 41: "json"}  # (its model_config.json's)


def _feeds(name: str) -> list[dict]:
    if name == "ppocr_rec":
        return tm.recognizer_inputs(seed=0, count=2)[1]
    if name == "ppocr_cls":
        return tm.classifier_inputs(seed=0, count=2)[1]
    if name == "minilm":
        return tm.minilm_inputs("held", 2)
    return tm.magika_inputs()


@pytest.fixture(scope="module")
def models():
    return {}


def _model(models, name):
    if name not in models:
        models[name] = dyndq.load_model(tm.path_of(name))
    return models[name]


@pytest.mark.parametrize("name", MODELS)
def test_parity_blames_no_engine(models, name):
    """The reference engine is the meaning (not ONNX Runtime standing in) and every ONNX Runtime level
    agrees with it.  (Before the reference engine computed BatchNormalization as ONNX defines it, all
    four levels differed on both PP-OCR models, by up to the whole of the recognizer's output.)"""
    model = _model(models, name)
    report = runtime_parity(model, feeds=_feeds(name)[0])
    assert report.reference == "the reference engine (onnx.reference)", report.reference
    assert report.agrees and len(report.comparisons) == 4, report.lines()


@pytest.mark.parametrize("name", MODELS)
def test_the_reference_engine_reads_them_as_onnxruntime_does(models, name):
    """`dyndq run` (the reference engine) and `dyndq run --engine onnxruntime` give the same outputs
    (within parity's tolerance) and the same answers: the recognizer's text, the classifier's
    orientation, magika's file types (python, c, markdown, makefile, json for the files it reads);
    MiniLM's sentence embeddings."""
    model = _model(models, name)
    answers = []
    for feed in _feeds(name):
        ours, theirs = dyndq.run(model, feed), dyndq.run(model, feed, engine="onnxruntime")
        assert ours.keys() == theirs.keys()
        for out in ours:
            assert compare(out, theirs[out], ours[out]).agrees, (out, np.abs(ours[out] - theirs[out]).max())
        (out,) = ours
        if name == "minilm":
            continue
        if name == "ppocr_rec":
            chars = tm.characters(model)
            assert tm.decoded(ours[out], chars) == tm.decoded(theirs[out], chars)
        assert (ours[out].argmax(-1) == theirs[out].argmax(-1)).all()
        answers.append(int(ours[out].argmax()))
    if name == "magika":
        assert [MAGIKA_LABELS.get(a) for a in answers] == ["python", "c", "markdown", "makefile", "json"]


@pytest.mark.openvino
@pytest.mark.parametrize("name", MODELS)
def test_openvino_in_float32_computes_what_the_reference_engine_does(models, name):
    """OpenVINO's CPU with the settings that keep float32 (OPENVINO_EXACT) agrees with the reference engine
    on every output; with its defaults, parity's comparison agrees, or names only those settings as
    the cause (bfloat16 inference where the CPU has it: the engine's own arithmetic, truly)."""
    model = _model(models, name)
    feed = _feeds(name)[0]
    reference = engines.run_reference(model, feed)
    names = [o.name for o in model.graph.output]
    exact = engines.run_openvino(model, feed, names, Tweak(config=dict(OPENVINO_EXACT)))
    assert all(compare(n, exact[n], reference[n]).agrees for n in names)
    report = runtime_parity(model, feeds=feed, engines=["openvino"])
    assert report.reference == "the reference engine (onnx.reference)"
    for comparison in report.comparisons:
        assert comparison.agrees or (comparison.causes and {c.name for c in comparison.causes} <= set(OPENVINO_EXACT)), \
            comparison.lines()
