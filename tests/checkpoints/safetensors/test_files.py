"""Safetensors files in: a folder with config.json (and a lone file beside it) read one module at
a time by the `safetensors` package, quantized tensors grouped under their module, others dense;
no quantization_config, or a format not taken, refused by name."""
from __future__ import annotations

import json

import numpy as np
import pytest

import dyndq
from dyndq.checkpoints import safetensors as ours
from safetensors_checkpoints import check_exact, gptq_oracle, gptq_tensors

st_numpy = pytest.importorskip("safetensors.numpy", reason="the `safetensors` package (the test extra installs it: make test)")

CONFIG = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False, "checkpoint_format": "gptq"}


def write_checkpoint(folder, config=CONFIG):
    t = gptq_tensors(64, 32, 4, 32, act_order=True, seed=11)
    tensors = {f"model.layers.0.self_attn.q_proj.{k}": v for k, v in t.items()}
    tensors["model.norm.weight"] = np.arange(32, dtype=np.float16)
    st_numpy.save_file(tensors, str(folder / "model-00001-of-00002.safetensors"))
    st_numpy.save_file({"lm_head.weight": np.ones((4, 32), np.float32)}, str(folder / "model-00002-of-00002.safetensors"))
    if config is not None:
        (folder / "config.json").write_text(json.dumps({"model_type": "llama", "quantization_config": config}))
    return t


def test_a_folders_modules_are_read_one_at_a_time_and_dequantize_exactly(tmp_path):
    t = write_checkpoint(tmp_path)
    read = ours.read(tmp_path)
    assert iter(read) is read
    modules = {m.weight_name: m for m in read}
    assert set(modules) == {"model.layers.0.self_attn.q_proj.weight", "model.norm.weight", "lm_head.weight"}
    q = modules["model.layers.0.self_attn.q_proj.weight"]
    assert q.format == "gptq" and set(q.tensors) == {"qweight", "qzeros", "scales", "g_idx"}
    check_exact(q, gptq_oracle(t, 4))
    placed = ours.nodes(modules["model.norm.weight"])
    assert placed.dtype == 10 and placed.form == "the float16 tensor itself"


def test_a_lone_file_takes_the_config_beside_it(tmp_path):
    write_checkpoint(tmp_path)
    assert [m.format for m in ours.read(tmp_path / "model-00001-of-00002.safetensors")] == ["gptq", "dense"]


def test_quantized_tensors_without_a_config_are_refused(tmp_path):
    write_checkpoint(tmp_path, config=None)
    with pytest.raises(dyndq.ValidationError, match="no quantization_config"):
        list(ours.read(tmp_path))


def test_a_format_not_taken_is_refused_naming_it(tmp_path):
    write_checkpoint(tmp_path, config={"quant_method": "awq", "version": "gemv_fast"})
    with pytest.raises(dyndq.ValidationError, match="version 'gemv_fast'"):
        list(ours.read(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "hqq"}}))
    with pytest.raises(dyndq.ValidationError, match="quant_method 'hqq'"):
        list(ours.read(tmp_path))


def test_autogptqs_own_config_file_is_taken_where_config_json_has_none(tmp_path):
    t = write_checkpoint(tmp_path, config=None)
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 32, "desc_act": True}))
    [q] = [m for m in ours.read(tmp_path) if m.format != "dense"]
    assert q.format == "gptq"
    check_exact(q, gptq_oracle(t, 4))


def test_float8_tensors_are_read_as_their_bytes(tmp_path):
    """(safetensors' NumPy framework has no float8: the file's own layout is read for them)"""
    import struct

    import ml_dtypes

    scale = np.arange(64, dtype=np.uint8).reshape(4, 16)
    header = json.dumps({"m.weight_scale": {"dtype": "F8_E4M3", "shape": [4, 16], "data_offsets": [0, 64]},
                         "m.bias": {"dtype": "F32", "shape": [2], "data_offsets": [64, 72]}}).encode()
    (tmp_path / "w.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + scale.tobytes() +
                                             np.array([1.5, -2], np.float32).tobytes())
    modules = {m.name: m for m in ours.read(tmp_path / "w.safetensors", config={"quant_method": "compressed-tensors"})}
    got = modules["m"].tensors["weight_scale"]
    assert got.dtype == ml_dtypes.float8_e4m3fn and got.shape == (4, 16) and got.view(np.uint8).tobytes() == scale.tobytes()
    assert modules["m.bias"].tensors[""].tolist() == [1.5, -2.0]
