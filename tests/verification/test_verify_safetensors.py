"""dyndq.verify of an import from each safetensors format (GPTQ with and without act-order, AWQ,
compressed-tensors pack-quantized int4 and int8) against the checkpoint it was imported from: every
imported weight `identical` (its decode is, bit for bit, the format's own dequantization), the weight
left float `float` with no finding; and the same import with one weight's codes changed is found."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import dyndq
from safetensors_checkpoints import GROUP, N_IN, O, OUT, Q, UP, awq_tensors, float_model, gptq_tensors, pack_bits

save_file = pytest.importorskip("safetensors.numpy").save_file



def compressed_tensors(bits: int, seed: int) -> dict:
    """pack-quantized symmetric group weights (compressed-tensors stores q + 2^(bits-1)), float16 scales."""
    rng = np.random.default_rng(seed)
    q = rng.integers(-(1 << bits - 1), 1 << bits - 1, (OUT, N_IN))
    return {"weight_packed": pack_bits((q + (1 << bits - 1)).astype(np.uint8), bits),
            "weight_scale": (rng.random((OUT, N_IN // GROUP)) * 0.01 + 1e-3).astype(np.float16),
            "weight_shape": np.array([OUT, N_IN], np.int64)}


def checkpoint(folder, fmt: str):
    """A folder holding UP's and Q's modules in format `fmt` and its config.json."""
    folder.mkdir()
    tensors = {}
    for i, module in enumerate((UP, Q)):
        if fmt == "awq":
            t = awq_tensors(N_IN, OUT, GROUP, seed=i)
            config = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm"}
        elif fmt.startswith("gptq"):
            v1, act_order = "v1" in fmt, "act-order" in fmt
            t = gptq_tensors(N_IN, OUT, 4, GROUP, act_order=act_order, v1=v1, seed=i)
            config = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": act_order,
                      "checkpoint_format": "gptq" if v1 else "gptq_v2"}
        else:
            bits = int(fmt.split("int")[1])
            t = compressed_tensors(bits, seed=i)
            config = {"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
                "targets": ["Linear"], "weights": {"num_bits": bits, "type": "int", "symmetric": True,
                                                   "strategy": "group", "group_size": GROUP}}}}
        tensors.update({f"{module}.{k}": v for k, v in t.items()})
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"quantization_config": config}))
    return folder


FORMATS = ["gptq v1", "gptq v1 act-order", "gptq v2 act-order", "awq", "compressed-tensors int4", "compressed-tensors int8"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_import_verifies_identical_against_its_checkpoint(tmp_path, fmt):
    folder = checkpoint(tmp_path / "ckpt", fmt)
    imported, _ = dyndq.import_weights(float_model(), folder)
    report = dyndq.verify(imported, folder)
    got = {w.source: (w.status, w.error) for w in report.weights if w.status != "float"}
    assert got == {f"{UP}.weight": ("identical", 0.0), f"{Q}.weight": ("identical", 0.0)}, report.summary()
    assert [(w.weight, w.status) for w in report.weights if w.source is None] == [(f"{O}.weight", "float")]  # (not in it)
    assert report.faithful and report.source_kind == "safetensors", report.summary()


@pytest.mark.parametrize("fmt", ["gptq v2 act-order", "awq", "compressed-tensors int4"])
def test_one_weights_codes_changed_is_found(tmp_path, fmt):
    """(so that the test above cannot pass by verify calling anything identical)"""
    folder = checkpoint(tmp_path / "ckpt", fmt)
    imported, _ = dyndq.import_weights(float_model(), folder)
    up_codes = [t for t in imported.graph.initializer if t.name == f"{UP}.weight_quantized"]  # (the import's codes)
    assert len(up_codes) == 1, [t.name for t in imported.graph.initializer]
    codes = numpy_helper.to_array(up_codes[0])
    flipped = codes ^ np.ones_like(codes)  # (every code: one alone may sit under a zero or NaN scale of the extremes)
    up_codes[0].CopyFrom(numpy_helper.from_array(flipped, up_codes[0].name))
    report = dyndq.verify(imported, folder)
    got = {w.source: w.status for w in report.weights if w.status != "float"}
    assert got[f"{Q}.weight"] == "identical" and got[f"{UP}.weight"] != "identical", report.summary()
    assert not report.faithful
