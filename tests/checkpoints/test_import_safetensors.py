"""dyndq.import_weights and `dyndq import-weights` with a safetensors checkpoint (GPTQ, AWQ): its
modules matched to the float model's weights by name (torch's module names), oriented as the graph
reads each one, and each imported weight exactly the format's own dequantization (float16, widened
exactly to the model's float32), on the reference engine and on ONNX Runtime."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dyndq
from dyndq.cli import main
from engines import run_onnxruntime
from safetensors_checkpoints import (GROUP, N_IN, O, OUT, Q, UP, awq_gemv_oracle, awq_gemv_tensors, awq_oracle,
                                     awq_tensors, float_model, gptq_oracle, gptq_tensors)

save_file = pytest.importorskip("safetensors.numpy").save_file



def probe(model: onnx.ModelProto, shapes: dict) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items())
    return out


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("fmt", ["gptq v1", "gptq v2 act-order", "awq"])
def test_each_module_is_its_formats_dequantization_on_both_engines(tmp_path, fmt):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    want, tensors = {}, {}
    for i, module in enumerate((UP, Q)):
        if fmt == "awq":
            t = awq_tensors(N_IN, OUT, GROUP, seed=i)
            want[f"{module}.weight"] = awq_oracle(t, GROUP)
            config = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm"}
        else:
            v1 = fmt == "gptq v1"
            t = gptq_tensors(N_IN, OUT, 4, GROUP, act_order=not v1, v1=v1, seed=i)
            want[f"{module}.weight"] = gptq_oracle(t, 4, v1=v1)
            config = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": not v1,
                      "checkpoint_format": "gptq" if v1 else "gptq_v2"}
        tensors.update({f"{module}.{k}": v for k, v in t.items()})
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"quantization_config": config}))
    model = float_model()
    before = model.SerializeToString()
    out, report = dyndq.import_weights(model, folder)
    assert model.SerializeToString() == before and dyndq.check(out) == []
    rows = {r.weight: r for r in report.imported}
    assert set(rows) == set(want) and all(r.how == "by name" for r in rows.values()), report.table()
    assert [w for w, *_ in report.left_float] == [f"{O}.weight"]
    assert all("cast to float" in r.note for r in rows.values())  # (float16 decode widened to the model's float32)
    shapes = {n: [OUT, N_IN] for n in want}
    check = probe(out, shapes)
    with np.errstate(all="ignore"):
        got = {"reference": dyndq.run(check, {"x": np.ones((2, N_IN), np.float32)}),
               "onnxruntime": dict(zip(shapes, run_onnxruntime(dyndq.export(check, target="onnxruntime"),
                                                               {"x": np.ones((2, N_IN), np.float32)})))}
    for engine, values in got.items():
        for name, value in want.items():
            wide = value.astype(np.float32)  # (float16 -> float32: exact, NaN payloads and signs kept)
            same = (bits(values[name]) == bits(wide)) | (np.isnan(values[name]) & np.isnan(wide))
            assert same.all(), f"{name} on {engine}: {np.count_nonzero(~same)} values differ"
            assert (np.signbit(values[name]) == np.signbit(wide)).all(), f"{name} on {engine}: signs"


def test_the_command_imports_a_gptq_folder_and_checks_the_file(tmp_path, capsys):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    t = gptq_tensors(N_IN, OUT, 4, GROUP, v1=False, seed=3)
    save_file({f"{UP}.{k}": v for k, v in t.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": GROUP, "checkpoint_format": "gptq_v2"}}))
    src = tmp_path / "m.onnx"
    onnx.save(float_model(), src)
    for emit in ("dyndq", "onnxruntime"):
        assert main(["import-weights", str(src), str(folder), "-o", str(tmp_path / f"{emit}.onnx"), "--emit", emit]) == 0
        said = capsys.readouterr().out
        assert f"{UP}.weight" in said and "gptq" in said, said
    # a safetensors file that matches nothing: exit 1, nothing written
    save_file({"other.qweight": t["qweight"], "other.qzeros": t["qzeros"], "other.scales": t["scales"]},
              str(tmp_path / "lone.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq", "bits": 4,
                                                                              "group_size": GROUP}}))
    assert main(["import-weights", str(src), str(tmp_path / "lone.safetensors"), "-o", str(tmp_path / "x.onnx")]) == 1
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("config_file", ["config.json", "quant_config.json"])
def test_an_awq_gemv_folder_imports_its_kernels_weights_on_both_engines(tmp_path, config_file):
    """AWQ's GEMV version (config.json's quantization_config, or AutoAWQ's own quant_config.json):
    each weight the float32 product its GEMV kernel multiplies by, bit for bit, the model's float32
    weight taking it as it is (no cast)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    want, tensors = {}, {}
    for i, module in enumerate((UP, Q)):
        t = awq_gemv_tensors(N_IN, OUT, GROUP, seed=10 + i)
        want[f"{module}.weight"] = awq_gemv_oracle(t, GROUP)
        tensors.update({f"{module}.{k}": v for k, v in t.items()})
    save_file(tensors, str(folder / "model.safetensors"))
    if config_file == "config.json":
        (folder / "config.json").write_text(json.dumps({"quantization_config": {
            "quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemv", "zero_point": True}}))
    else:
        (folder / "quant_config.json").write_text(json.dumps({"zero_point": True, "q_group_size": GROUP, "w_bit": 4,
                                                              "version": "GEMV"}))
    out, report = dyndq.import_weights(float_model(), folder)
    assert dyndq.check(out) == []
    rows = {r.weight: r for r in report.imported}
    assert set(rows) == set(want) and all("GEMV" in r.form and "cast to float" not in r.note for r in rows.values()), \
        report.table()
    shapes = {n: [OUT, N_IN] for n in want}
    check = probe(out, shapes)
    x = {"x": np.ones((2, N_IN), np.float32)}
    with np.errstate(all="ignore"):
        got = {"reference": dyndq.run(check, x),
               "onnxruntime": dict(zip(shapes, run_onnxruntime(dyndq.export(check, target="onnxruntime"), x)))}
    for engine, values in got.items():
        for name, value in want.items():
            assert (bits(values[name]) == bits(value)).all(), f"{name} on {engine}"
