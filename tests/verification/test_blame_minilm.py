"""Blame on a real model (`make test-trained-export`: all-MiniLM-L6-v2's ONNX export, tests/trained_models.py):
ONNX Runtime's 4-bit quantizer output is faithful at the default tolerance (its outputs within it),
and with one weight's nibbles swapped (layer 3's value projection) the sentence embedding moves past
it and the first line of the blame names that weight and the node reading it.  `make test` skips
this, saying so, where the export is not there."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import dyndq
import trained_models

VALUE_3 = "/bert/encoder/layer.3/attention/self/value/MatMul"


@pytest.fixture(scope="module")
def minilm():
    if (why := trained_models.minilm_missing()) is not None:
        pytest.skip(why)
    quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    model = onnx.load(str(trained_models.path_of("minilm")))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # (ONNX Runtime's quantizer changes the model it is given)
    q = quantizer.MatMulNBitsQuantizer(copy, block_size=32, is_symmetric=False)
    q.process()
    return model, q.model.model


def test_onnxruntimes_4_bit_minilm_is_within_the_default_tolerance(minilm):
    model, q4 = minilm
    report = dyndq.verify(q4, model, samples=2)
    assert report.faithful and report.blame == [], report.summary()
    assert all(0.05 < o.relative < report.tolerance for o in report.outputs), [o.relative for o in report.outputs]


def test_a_swapped_weight_in_layer_3_is_the_first_line_of_the_blame(minilm):
    model, q4 = minilm
    faulty = onnx.ModelProto()
    faulty.CopyFrom(q4)
    reads = next(n for n in model.graph.node if n.name == VALUE_3).input[1]
    node = next(n for n in faulty.graph.node if n.op_type == "MatMulNBits" and n.input[1] == reads + "_Q4")
    b = next(t for t in faulty.graph.initializer if t.name == node.input[1])
    codes = onnx.numpy_helper.to_array(b)
    b.CopyFrom(onnx.numpy_helper.from_array(((codes >> 4) | (codes << 4)).astype(np.uint8), b.name))
    report = dyndq.verify(faulty, model, samples=2)
    assert len(report.beyond) == 2 and [w.source for w in report.findings] == [reads]
    first = report.blame[0]
    assert (first.source, first.read_by, first.status, first.kind) == (reads, VALUE_3, "layout", "nibble-order")
    assert first.share > 0.5 and all(b.relative < 0.3 for b in report.blame[1:])
    assert len(report.blame) == 10 and "each of 36 weight(s)" in report.blame_note
