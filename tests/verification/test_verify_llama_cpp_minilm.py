"""dyndq.verify on a real model: llama.cpp's Q8_0 file of all-MiniLM-L6-v2 (tests/llama_cpp_ggufs.py)
against two ONNX models made from it.  The exact route, `dyndq.import_weights` onto the MiniLM ONNX
export, verifies all `identical` against the GGUF; the other route (the float model holding
gguf.quants.dequantize's weights, quantized again by ONNX Runtime's MatMulNBitsQuantizer at 4 bits)
verifies `requantized`, its rule named, and its outputs move away from the float model's where the
import's barely do (the figures docs/verify.md shows).  `make test-gguf-real` runs these; `make test`
skips them, saying so, where the files are not there."""
from __future__ import annotations

import time

import numpy as np
import onnx
import pytest

import dyndq
import llama_cpp_ggufs as made
import trained_models

pytestmark = pytest.mark.llama_cpp
RULE = "ONNX Runtime's matmul rule (MlasQuantizeBlockwise), asymmetric, 4 bits, block 32"


def why_not() -> str | None:
    return made.missing() or trained_models.minilm_missing()


@pytest.fixture(scope="module")
def routes():
    """(the float export, the import of the Q8_0 file, the other route's model, the Q8_0 file)."""
    if (why := why_not()) is not None:
        pytest.skip(why)
    gguf = pytest.importorskip("gguf")
    quantizer = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    path = made.path_of("Q8_0")
    model = onnx.load(str(trained_models.path_of("minilm")))
    imported, report = dyndq.import_weights(model, path)
    raw = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    other = onnx.ModelProto()
    other.CopyFrom(model)
    placed = {}
    for row in report.imported:  # (each weight where the import put it, oriented as the graph reads it)
        t = raw[row.tensor]
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(tuple(reversed(t.shape.tolist())))
        placed[row.weight] = values.T if row.orientation == "transposed" else values
    for t in other.graph.initializer:
        if t.name in placed:
            t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(placed[t.name]), t.name))
    q = quantizer.MatMulNBitsQuantizer(other, block_size=32, is_symmetric=False)
    q.process()
    return model, imported, q.model.model, path


def counts(report) -> dict:
    out = {}
    for w in report.weights:
        out[w.status] = out.get(w.status, 0) + 1
    return out


def test_the_import_of_llama_cpps_q8_0_file_verifies_identical_against_it(routes):
    _, imported, _, path = routes
    start = time.perf_counter()
    report = dyndq.verify(imported, path)
    took = time.perf_counter() - start
    assert counts(report) == {"identical": 37, "float": 64}, report.summary()  # (37: 36 MatMul weights, the token table)
    assert report.faithful and report.unused == [], report.summary()
    assert took < 120, f"verify took {took:.0f} s"  # (about 20 s on a busy 2-core machine: minutes would be a regression)


def test_the_other_route_verifies_requantized_with_its_rule(routes):
    _, _, other, path = routes
    report = dyndq.verify(other, path)
    assert counts(report) == {"requantized": 36, "float": 65}, report.summary()
    moved = [w for w in report.weights if w.status == "requantized"]
    assert {w.rule for w in moved} == {RULE}
    assert all(0.05 < w.error < 0.12 for w in moved), sorted(w.error for w in moved)  # (4-bit RTN's own: about 0.08)
    assert not report.faithful
    assert [w.status for w in report.weights if w.source == "token_embd.weight"] == ["float"]  # (left float, its values)


def test_against_the_float_model_the_import_moves_the_outputs_less(routes):
    model, imported, other, _ = routes
    pytest.importorskip("tokenizers")  # (the sentences' ids: trained_models tokenizes them)
    feeds = [trained_models.batched(trained_models.minilm_inputs("held", 4))]
    cosine = {}
    for name, quantized in (("import", imported), ("other route", other)):
        report = dyndq.verify(quantized, model, inputs=feeds)
        assert {o.engine for o in report.outputs} == {"reference", "onnxruntime"}, report.outputs_note
        cosine[name] = min(o.cosine for o in report.outputs)
    assert cosine["import"] > 0.999 and 0.9 < cosine["other route"] < 0.99, cosine


# (the file's quantized types, by gguf's reader: MiniLM's rows of 384 and 1536 are not all whole
# 256-element super-blocks, so llama.cpp falls back to Q5_0 / Q8_0 for some of a K-quant file's tensors)
KINDS = {"Q4_K_M": {"Q5_0": 28, "Q4_K": 4, "Q8_0": 3, "Q6_K": 2}, "Q6_K": {"Q8_0": 31, "Q6_K": 6},
         "IQ4_NL": {"IQ4_NL": 36, "Q8_0": 1}}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_import_of_llama_cpps_k_quant_and_iq_files_verifies_identical(kind):
    """Every quantized tensor of llama.cpp's Q4_K_M, Q6_K and IQ4_NL files, imported, is bit for bit
    gguf's dequantization of it (a K-quant's decode, several DynamicDequantize nodes, by its values)."""
    if (why := why_not()) is not None:
        pytest.skip(why)
    gguf = pytest.importorskip("gguf")
    path = made.path_of(kind)
    types: dict = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.tensor_type.name != "F32":
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    assert types == KINDS[kind], types
    imported, _ = dyndq.import_weights(onnx.load(str(trained_models.path_of("minilm"))), path)
    report = dyndq.verify(imported, path)
    assert counts(report) == {"identical": 37, "float": 64}, report.summary()
    assert report.faithful and report.unused == [], report.summary()
