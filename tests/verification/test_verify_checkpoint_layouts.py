"""The layouts verify names against a checkpoint source (dyndq/verification/layouts.py): an import
made wrong in one known way, on one weight, is `layout` with that kind on that weight alone, and the
right import stays `identical`.

- rows-permuted: a llama GGUF file's Q imported with `unpermute=False` (llama.cpp's rotary row
  permutation left as stored), spliced into the right import of the rest.
- packing-order: an AWQ module's words read in plain nibble order, by the importer itself with its
  order made plain (qweight and qzeros both), and by the right import's codes reordered as a plain
  reading of qweight alone would have put them (qzeros right).
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import dyndq
from gguf_models import K, Q, float_model, llama_file, source_weights
from safetensors_checkpoints import AWQ_ORDER, GROUP, N_IN, OUT, UP, awq_tensors
from safetensors_checkpoints import Q as Q_PROJ
from safetensors_checkpoints import float_model as awq_float

pytest.importorskip("gguf")
save_file = pytest.importorskip("safetensors.numpy").save_file


def spliced(right: onnx.ModelProto, wrong: onnx.ModelProto, prefix: str) -> onnx.ModelProto:
    """`right` with the initializers whose names start with `prefix` (one weight's decode) taken from `wrong`."""
    out = onnx.ModelProto()
    out.CopyFrom(right)
    theirs = {t.name: t for t in wrong.graph.initializer}
    moved = [t for t in out.graph.initializer if t.name.startswith(prefix) and t.name in theirs]
    assert moved, [t.name for t in out.graph.initializer]
    for t in moved:
        t.CopyFrom(theirs[t.name])
    return out


def statuses(report) -> dict:
    return {w.source: (w.status, w.kind) for w in report.weights if w.status != "float"}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    _, _, path = llama_file(folder)
    right, _ = dyndq.import_weights(float_model(source_weights()), path)
    return path, right


def test_a_gguf_import_stays_identical(llama):
    path, right = llama
    report = dyndq.verify(right, path)
    assert report.faithful, report.summary()
    assert {s for s, _ in statuses(report).values()} == {"identical"}, report.summary()


def test_q_rows_left_permuted_is_named_rows_permuted_on_q_alone(llama):
    path, right = llama
    wrong, _ = dyndq.import_weights(float_model(source_weights()), path, unpermute=False)
    report = dyndq.verify(spliced(right, wrong, Q), path)
    got = statuses(report)
    assert got.pop("blk.0.attn_q.weight") == ("layout", "rows-permuted"), report.summary()
    assert {s for s, _ in got.values()} == {"identical"}, report.summary()
    assert len(report.findings) == 1 and "not undone" in report.findings[0].note
    # both Q and K left permuted: both named (K is read [in, out]: its columns are the rows moved)
    both = statuses(dyndq.verify(wrong, path))
    assert both["blk.0.attn_q.weight"] == both["blk.0.attn_k.weight"] == ("layout", "rows-permuted"), both


@pytest.fixture(scope="module")
def awq(tmp_path_factory):
    """An AWQ checkpoint of UP and Q_PROJ (AutoAWQ's GEMM layout), and its right import."""
    folder = tmp_path_factory.mktemp("awq")
    tensors = {f"{m}.{k}": v for i, m in enumerate((UP, Q_PROJ)) for k, v in awq_tensors(N_IN, OUT, GROUP, seed=i).items()}
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm"}}))
    right, _ = dyndq.import_weights(awq_float(), folder)
    return folder, right, awq_float


def test_an_awq_import_stays_identical(awq):
    folder, right, _ = awq
    report = dyndq.verify(right, folder)
    assert statuses(report) == {f"{UP}.weight": ("identical", None), f"{Q_PROJ}.weight": ("identical", None)}


def test_awq_words_read_in_plain_order_are_named_packing_order(awq, monkeypatch):
    """The importer's own reading with AWQ's order made plain (for qweight and qzeros), on UP alone."""
    folder, right, awq_float = awq
    import dyndq.checkpoints.safetensors.awq as awq_format

    monkeypatch.setattr(awq_format, "REVERSE", np.arange(8))
    wrong, _ = dyndq.import_weights(awq_float(), folder)
    monkeypatch.undo()
    report = dyndq.verify(spliced(right, wrong, f"{UP}.weight"), folder)
    assert statuses(report) == {f"{UP}.weight": ("layout", "packing-order"),
                                f"{Q_PROJ}.weight": ("identical", None)}, report.summary()
    assert "(qweight and qzeros)" in report.findings[0].note


def test_awq_qweight_alone_read_in_plain_order_is_named_packing_order(awq):
    """The right import's codes of UP ([out, in]) reordered as a plain reading of qweight puts them:
    column j of each 8 is the one AWQ puts at nibble j, order[j]; the zero points left right."""
    folder, right, _ = awq
    out = onnx.ModelProto()
    out.CopyFrom(right)
    codes = next(t for t in out.graph.initializer if t.name == f"{UP}.weight_quantized")
    c = numpy_helper.to_array(codes)
    plain = c.reshape(-1, 8, c.shape[1])[:, AWQ_ORDER, :].reshape(c.shape)
    codes.CopyFrom(numpy_helper.from_array(plain, codes.name))
    report = dyndq.verify(out, folder)
    assert statuses(report) == {f"{UP}.weight": ("layout", "packing-order"),
                                f"{Q_PROJ}.weight": ("identical", None)}, report.summary()
    assert "(qzeros read right)" in report.findings[0].note


def test_other_codes_changed_are_not_called_a_layout(awq):
    """(so that the tests above cannot pass by any change being called packing-order)"""
    folder, right, _ = awq
    out = onnx.ModelProto()
    out.CopyFrom(right)
    codes = next(t for t in out.graph.initializer if t.name == f"{UP}.weight_quantized")
    c = numpy_helper.to_array(codes)
    codes.CopyFrom(numpy_helper.from_array(c[::-1].copy(), codes.name))  # (rows reversed: no known reading)
    got = statuses(dyndq.verify(out, folder))
    assert got[f"{UP}.weight"][0] in ("differs", "requantized") and got[f"{UP}.weight"][1] is None, got


def test_an_awq_gemv_import_stays_identical_and_has_no_packing_order_reading(tmp_path):
    """GEMV packs in plain order: its import is identical, and its codes put in GEMM's order are no
    known layout (verify names packing-order for GEMM modules alone)."""
    from safetensors_checkpoints import awq_gemv_tensors

    tensors = {f"{m}.{k}": v for i, m in enumerate((UP, Q_PROJ)) for k, v in awq_gemv_tensors(N_IN, OUT, GROUP, seed=i).items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemv"}}))
    right, _ = dyndq.import_weights(awq_float(), tmp_path)
    report = dyndq.verify(right, tmp_path)
    assert statuses(report) == {f"{UP}.weight": ("identical", None), f"{Q_PROJ}.weight": ("identical", None)}, \
        report.summary()
    codes = next(t for t in right.graph.initializer if t.name == f"{UP}.weight_quantized")
    c = numpy_helper.to_array(codes)
    codes.CopyFrom(numpy_helper.from_array(c.reshape(c.shape[0], -1, 8)[:, :, AWQ_ORDER].reshape(c.shape), codes.name))
    got = statuses(dyndq.verify(right, tmp_path))
    assert got[f"{UP}.weight"][0] != "identical" and got[f"{UP}.weight"] != ("layout", "packing-order"), got
