"""llama.cpp's rotary Q/K row permutation, undone for every architecture whose converter class
applies it (dyndq.checkpoints.gguf.checkpoint.ARCHITECTURES_PERMUTED), kept for those it does not,
and left as stored when asked (`unpermute=False`, `--no-unpermute`: a checkpoint converted as
llama that was never permuted).  Each imported Q and K is compared bit for bit with gguf's
dequantization un-permuted (or as stored) by the tests' own inverse reshape (gguf_models)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import dyndq
from dyndq.checkpoints.gguf.checkpoint import ARCHITECTURES_PERMUTED, GGUFCheckpoint
from dyndq.cli import main
from dyndq.model_files import load_model, save_model
from gguf_blocks import write_gguf as write_raw
from gguf_models import (HEADS, KV_HEADS, K, Q, dequantized, float_model, gguf_tensors, ids, source_weights,
                         unpermute, with_outputs)

QK = {"blk.0.attn_q.weight": Q, "blk.0.attn_k.weight": K}
PER_LAYER = {"deci", "granitehybrid"}  # their converters write a head count per layer


def qk_file(path, architecture: str, *, bias: bool = False) -> dict:
    """A GGUF file of `architecture` holding Q and K as llama.cpp's converter permutes them (gguf_models),
    heads written as one count or, for the per-layer architectures, a list of one per block."""
    tensors = {n: t for n, t in gguf_tensors(source_weights()).items() if n in QK}
    if bias:
        tensors["blk.0.attn_q.bias"] = ("F32", np.arange(256, dtype=np.float32))
    heads = ([HEADS], [KV_HEADS]) if architecture in PER_LAYER else (HEADS, KV_HEADS)
    write_raw(path, tensors, architecture, block_count=1, head_count=heads[0], head_count_kv=heads[1])
    return tensors


def imported_qk(model_or_path, path, **kw) -> dict:
    out, report = dyndq.import_weights(model_or_path, path, names=QK, **kw)
    values = dyndq.run(with_outputs(out, [Q, K]), ids())
    return values, report


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def undone(tensors) -> dict:
    return {Q: unpermute(dequantized(tensors, "blk.0.attn_q.weight"), HEADS),
            K: np.ascontiguousarray(unpermute(dequantized(tensors, "blk.0.attn_k.weight"), KV_HEADS).T)}


def as_stored(tensors) -> dict:
    return {Q: dequantized(tensors, "blk.0.attn_q.weight"),
            K: np.ascontiguousarray(dequantized(tensors, "blk.0.attn_k.weight").T)}


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES_PERMUTED))
def test_each_permuting_architecture_gets_its_rows_back(tmp_path, architecture):
    tensors = qk_file(tmp_path / "m.gguf", architecture)
    values, report = imported_qk(float_model(source_weights()), tmp_path / "m.gguf")
    want = undone(tensors)
    for name in (Q, K):
        assert (bits(values[name]) == bits(want[name])).all(), (architecture, name)
    assert all("rotary permutation" in r.note for r in report.imported)


@pytest.mark.parametrize("architecture", ["qwen2", "llama4", "gemma", "chameleon"])
def test_an_architecture_not_permuted_keeps_its_rows(tmp_path, architecture):
    """(llama4: `undo_permute = False`; chameleon: its norms are permuted another way, not taken)"""
    tensors = qk_file(tmp_path / "m.gguf", architecture)
    values, report = imported_qk(float_model(source_weights()), tmp_path / "m.gguf")
    want = as_stored(tensors)
    for name in (Q, K):
        assert (bits(values[name]) == bits(want[name])).all(), (architecture, name)
    assert not any("rotary permutation" in r.note for r in report.imported)


def test_biases_follow_their_converter_class(tmp_path):
    """llama's converter permutes Q's bias too, olmo's only the weights."""
    for architecture, permuted in (("granite", True), ("olmo", False)):
        qk_file(tmp_path / f"{architecture}.gguf", architecture, bias=True)
        got = {t.name: t for t in GGUFCheckpoint(tmp_path / f"{architecture}.gguf").tensors()}
        bias = got["blk.0.attn_q.bias"]
        assert ("rotary permutation" in bias.note) is permuted, architecture
        want = np.arange(256, dtype=np.float32)
        assert (bias.values() == (unpermute(want, HEADS) if permuted else want)).all(), architecture


def test_unpermute_off_leaves_the_rows_as_stored(tmp_path):
    tensors = qk_file(tmp_path / "m.gguf", "llama")
    values, report = imported_qk(float_model(source_weights()), tmp_path / "m.gguf", unpermute=False)
    want = as_stored(tensors)
    for name in (Q, K):
        assert (bits(values[name]) == bits(want[name])).all(), name
    assert not any("rotary permutation" in r.note for r in report.imported)
    assert any("unpermute off" in n for n in report.notes)
    # an open checkpoint: off by its constructor; off only in the call is refused, not ignored
    values, _ = imported_qk(float_model(source_weights()), GGUFCheckpoint(tmp_path / "m.gguf", unpermute=False))
    assert (bits(values[Q]) == bits(want[Q])).all()
    with pytest.raises(dyndq.ValidationError, match="unpermute"):
        imported_qk(float_model(source_weights()), GGUFCheckpoint(tmp_path / "m.gguf"), unpermute=False)


def test_the_command_takes_no_unpermute(tmp_path, capsys):
    tensors = qk_file(tmp_path / "m.gguf", "llama")
    save_model(float_model(source_weights()), tmp_path / "float.onnx")
    (tmp_path / "names.json").write_text(json.dumps(QK))
    for flag, want in (([], undone(tensors)), (["--no-unpermute"], as_stored(tensors))):
        assert main(["import-weights", str(tmp_path / "float.onnx"), str(tmp_path / "m.gguf"), "-o",
                     str(tmp_path / "out.onnx"), "--names", str(tmp_path / "names.json"), "--json", *flag]) == 0
        report = json.loads(capsys.readouterr().out)
        assert any("unpermute off" in n for n in report["notes"]) is bool(flag)
        values = dyndq.run(with_outputs(load_model(tmp_path / "out.onnx"), [Q, K]), ids())
        assert (bits(values[Q]) == bits(want[Q])).all() and (bits(values[K]) == bits(want[K])).all(), flag
