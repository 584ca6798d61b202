"""An engine that has no way to run a node is told as the node, the op it lacks and the way out,
by `dyndq run` and `dyndq check --runtime-parity` alike (never the engine's internals, never
advice to change the inputs): onnx.reference's Resize-10, ONNX Runtime's
DequantizeLinear-24 on MXFP4's float4 codes and float8e8m0 scales."""
from __future__ import annotations

import numpy as np
import onnx
from cases import call
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from quantize_models import mlp


def resize_10_model() -> onnx.ModelProto:
    """y = Resize-10(x, scales [1, 1, 2, 2], nearest): onnx.reference's Resize reads version 11's
    inputs (roi, scales, sizes) and finds neither scales nor sizes in version 10's two."""
    g = helper.make_graph([helper.make_node("Resize", ["x", "scales"], ["y"], name="rs", mode="nearest")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, ["n", 1, 3, 4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["n", 1, 6, 8])],
                          [nh.from_array(np.array([1, 1, 2, 2], np.float32), "scales")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 10)], ir_version=5)


def test_the_reference_engine_names_the_op_it_cannot_run_and_the_way_out(tmp_path, capsys):
    """(onnx.reference cannot run Resize-10, docs/running.md; should dyndq.reference_ops correct
    it, this test needs another op it fails on)"""
    dyndq.save_model(resize_10_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.arange(12, dtype=np.float32).reshape(1, 1, 3, 4))
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "--input", f"x={tmp_path / 'x.npy'}")
    assert code == 1 and out == "", err
    assert err.startswith(f"dyndq: {tmp_path / 'm.onnx'}: the reference engine failed: onnx.reference's Resize "
                          "cannot run node 'rs' (x float32[1, 1, 3, 4], scales float32[4]): "), err
    assert err.endswith("; instead, run it on ONNX Runtime (dyndq run --engine onnxruntime)\n"), err
    assert "Issues with types" not in err and "numpy.ndarray" not in err, err
    # the way out it names works
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "--input", f"x={tmp_path / 'x.npy'}",
                          "--engine", "onnxruntime")
    assert code == 0 and out.startswith("y: float32[1, 1, 6, 8]"), err
    # parity: ONNX Runtime stands in for the reference engine, saying which op of it failed
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx")
    assert code == 0 and ("(the reference engine cannot run it: onnx.reference's Resize cannot run node 'rs' "
                          "(x float32[4, 1, 3, 4], scales float32[4]): ") in out, (out, err)


def test_onnxruntime_names_the_kernel_it_lacks_and_the_way_out(tmp_path, capsys):
    """MXFP4 written as standard ONNX (DequantizeLinear-24 of float4e2m1 codes, float8e8m0
    scales), which ONNX Runtime has no kernel for: run and the parity check name the node, the op
    and its input types, and the way out; parity blames no example input (the model's batch
    dim is open, so it makes one up)."""
    model = tmp_path / "mx.onnx"
    dyndq.save_model(mlp(), tmp_path / "float.onnx")
    code, out, err = call(capsys, "quantize", tmp_path / "float.onnx", model, "--format", "mxfp4", "--emit", "onnx",
                          "--no-evaluate")
    assert code == 0, err
    np.save(tmp_path / "ids.npy", np.array([1, 2, 3], np.int64))
    lacks = ("ONNX Runtime {} has no kernel for DequantizeLinear-24 with the input types of node 'E_DynamicDequantize' "
             "(E_quantized float4_e2m1fn, E_scales float8_e8m0fnu); instead, run it on another engine (dyndq run "
             "--engine reference; OpenVINO: dyndq check --runtime-parity --engine openvino); or write it in a form "
             "ONNX Runtime runs: dyndq lift IN LIFTED.onnx, then dyndq export LIFTED.onnx OUT --target onnxruntime "
             "(dyndq quantize: --emit onnxruntime)")
    import onnxruntime

    lacks = lacks.format(onnxruntime.__version__)
    code, out, err = call(capsys, "run", model, "--input", f"ids={tmp_path / 'ids.npy'}", "--engine", "onnxruntime")
    assert code == 1 and err == f"dyndq: {model}: the onnxruntime engine cannot run this model: {lacks}\n", err
    code, out, err = call(capsys, "check", "--runtime-parity", model)
    assert code == 1 and "example inputs" not in err + out, (out, err)
    assert f"  onnxruntime off: cannot run: {lacks}" in out.splitlines(), out
    # each way out it names works
    code, out, err = call(capsys, "run", model, "--input", f"ids={tmp_path / 'ids.npy'}", "--engine", "reference")
    assert code == 0 and out.startswith("y: float32[3, 256]"), err
    assert call(capsys, "lift", model, tmp_path / "lifted.onnx")[0] == 0
    assert call(capsys, "export", tmp_path / "lifted.onnx", tmp_path / "ort.onnx", "--target", "onnxruntime")[0] == 0
    code, out, err = call(capsys, "run", tmp_path / "ort.onnx", "--input", f"ids={tmp_path / 'ids.npy'}",
                          "--engine", "onnxruntime")
    assert code == 0 and out.startswith("y: float32[3, 256]"), err
