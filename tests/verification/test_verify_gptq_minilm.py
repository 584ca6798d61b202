"""dyndq.verify on a real GPTQ checkpoint: all-MiniLM-L6-v2's 36 MatMul weights rounded by GPTQ's
algorithm and packed in GPTQ's v1 layout (tests/gptq_minilm.py, act-order), against two ONNX models
made from it.  `dyndq import-weights` onto the MiniLM export verifies all `identical`; the route that
requantizes (the float model holding GPTQ's dequantization, quantized again by ONNX Runtime's
MatMulNBitsQuantizer, 4 bits, block 32, asymmetric) verifies `requantized`, its rule named and its
error against the checkpoint given (the figures docs/verify.md shows).  `make test-trained-export`
runs these; `make test` skips them, saying so, where the export is not there."""
from __future__ import annotations

import time

import numpy as np
import onnx
import pytest

import dyndq
import trained_models as tm

pytestmark = pytest.mark.skipif(tm.minilm_missing() is not None, reason=str(tm.minilm_missing()))
RULE = "ONNX Runtime's matmul rule (MlasQuantizeBlockwise), asymmetric, 4 bits, block 32"


@pytest.fixture(scope="module")
def routes(tmp_path_factory):
    """(the checkpoint's folder, the import, the requantizing route's model)."""
    import gptq_minilm

    quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    where = tmp_path_factory.mktemp("gptq")
    folder = where / "minilm-gptq"
    values = gptq_minilm.make(folder, act_order=True)
    model = onnx.load(str(tm.path_of("minilm")))
    imported, report = dyndq.import_weights(model, folder)
    other = onnx.ModelProto()
    other.CopyFrom(model)
    placed = {row.weight: values[row.tensor.removesuffix(".weight")] for row in report.imported}
    for t in other.graph.initializer:
        if t.name in placed:  # (MatMul's B: [in, out], GPTQ's float16 values widened exactly)
            t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(placed[t.name].astype(np.float32).T), t.name))
    q = quantizer.MatMulNBitsQuantizer(other, block_size=32, is_symmetric=False)
    q.process()
    return folder, imported, q.model.model


def counts(report) -> dict:
    out: dict = {}
    for w in report.weights:
        out[w.status] = out.get(w.status, 0) + 1
    return out


def test_the_import_of_a_real_gptq_checkpoint_verifies_identical(routes):
    folder, imported, _ = routes
    start = time.perf_counter()
    report = dyndq.verify(imported, folder)
    took = time.perf_counter() - start
    assert counts(report) == {"identical": 36, "float": 65}, report.summary()
    assert report.faithful and report.unused == [], report.summary()
    assert all(w.matched.startswith("by shape and closeness") for w in report.weights if w.status == "identical")
    assert took < 120, f"verify took {took:.0f} s"


def test_the_requantizing_route_verifies_requantized_with_its_rule_and_error(routes):
    folder, _, other = routes
    report = dyndq.verify(other, folder)
    assert counts(report) == {"requantized": 36, "float": 65}, report.summary()
    moved = [w for w in report.weights if w.status == "requantized"]
    assert {w.rule for w in moved} == {RULE}, {w.rule for w in moved}
    assert all(0.03 < w.error < 0.15 for w in moved), sorted(w.error for w in moved)  # (4-bit RTN's own, a second time)
    assert not report.faithful
