"""`dyndq demo`: what it prints, the files it writes, and that they hold what it says."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import dyndq
from dyndq.cli import main
from dyndq.demo import build_model, demo_input


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    import io
    from contextlib import redirect_stderr, redirect_stdout

    stdout, stderr = io.StringIO(), io.StringIO()
    with redirect_stdout(stdout), redirect_stderr(stderr):
        code = main(["demo", "--out", str(out)])
    return code, stdout.getvalue(), stderr.getvalue(), out


def test_exit_code_and_files(demo):
    code, text, err, out = demo
    assert code == 0 and err == ""
    assert sorted(os.listdir(out)) == ["model.exported.onnx", "model.onnx", "x.npy"]


def test_files_pass_the_full_checker(demo):
    out = demo[3]
    for name in ("model.onnx", "model.exported.onnx"):
        onnx.checker.check_model(onnx.load(out / name), full_check=True)
        onnx.checker.check_model(str(out / name), full_check=True)


def test_the_model_holds_the_op_and_the_export_does_not(demo):
    out = demo[3]
    model = onnx.load(out / "model.onnx")
    exported = onnx.load(out / "model.exported.onnx")
    ours = [n for n in model.graph.node if n.domain == dyndq.DOMAIN]
    assert [(n.name, n.op_type) for n in ours] == [("fc1_dequantize", "DynamicDequantize"), ("fc2_dequantize", "DynamicDequantize")]
    assert not any(n.domain == dyndq.DOMAIN for n in exported.graph.node)
    assert {o.domain for o in exported.opset_import} == {""}
    assert dyndq.check(model) == []
    assert model == build_model()  # deterministic: the same model every run


def test_the_realistic_mlp(demo):
    """int8 per-channel weights with int32 zero points, a Relu, uint8 per-tensor weights."""
    model = onnx.load(demo[3] / "model.onnx")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    assert inits["w1_q"].dtype == np.int8 and inits["w1_zps"].dtype == np.int32
    assert inits["w1_scales"].shape == (128,) and inits["w1_zps"].shape == (128,)
    assert inits["w2_q"].dtype == np.uint8 and inits["w2_zp"].dtype == np.uint8 and inits["w2_scale"].shape == (1,)
    assert [n.op_type for n in model.graph.node] == [
        "DynamicDequantize", "MatMul", "Add", "Relu", "DynamicDequantize", "MatMul", "Add"]
    attrs = {n.name: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in model.graph.node}
    assert attrs["fc1_dequantize"] == {"qtype": b"per_channel", "axis": 1}
    assert attrs["fc2_dequantize"] == {"qtype": b"per_tensor"}


def test_exported_file_runs_in_ort_as_printed(demo):
    """The exported file, in a plain ONNX Runtime session of ours, gives the reference
    engine's outputs on the original model bit for bit, as the demo printed."""
    code, text, _, out = demo
    x = np.load(out / "x.npy")
    assert np.array_equal(x, demo_input())
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(str(out / "model.exported.onnx"), options, providers=["CPUExecutionProvider"])
    (y_ort,) = session.run(None, {"x": x})
    y_ref = dyndq.run(onnx.load(out / "model.onnx"), {"x": x})["y"]
    identical = int((y_ort.view(np.uint32) == y_ref.view(np.uint32)).sum())
    printed = re.search(r"both engines agree bit for bit: (\w+) \((\d+) of (\d+) output values identical", text)
    assert printed, text
    assert printed.groups() == ("yes", str(identical), str(y_ref.size))
    assert identical == y_ref.size == 64
    # and the printed values are those outputs
    assert f"y[0,:4] = {np.array2string(y_ref[0, :4], precision=6)}" in text


def test_what_it_prints(demo):
    code, text, _, out = demo
    assert text.startswith("dyndq demo: a weight-only-quantized MLP, x[batch,64] -> 128 -> 16")
    # the graph before export, and after
    assert "graph 'weight_only_quantized_mlp': 7 nodes (opsets: ai.onnx 21, org.dyndq 2; IR 10)" in text
    assert ("org.dyndq::DynamicDequantize(w1_q int8[64,128], w1_scales float32[128], w1_zps int32[128]) -> w1"
            "  axis=1 qtype=per_channel") in text
    assert re.search(r"exported to standard ONNX: 2 DynamicDequantize lowered; \d+ nodes \(opset 21, IR 10\)", text)
    assert "DequantizeLinear(w2_q uint8[128,16]" in text
    # checked, and shapes inferred
    assert "check: valid" in text
    assert "output y float32[batch,16]" in text
    # timings of both engines
    assert re.search(r"reference evaluator .* first +[\d.]+ ms +then +[\d.]+ ms", text)
    assert re.search(r"ONNX Runtime .* first +[\d.]+ ms +then +[\d.]+ ms", text)
    assert f"wrote {out / 'model.onnx'}" in text


def test_default_folder_and_python_dash_m(tmp_path):
    """`python -m dyndq demo` in a fresh folder writes ./dyndq-demo, quickly."""
    p = subprocess.run([sys.executable, "-m", "dyndq", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr) == (0, "")
    assert "both engines agree bit for bit: yes" in p.stdout
    assert sorted(os.listdir(tmp_path / "dyndq-demo")) == ["model.exported.onnx", "model.onnx", "x.npy"]
    # running it again overwrites its own files and leaves nothing else behind
    p = subprocess.run([sys.executable, "-m", "dyndq", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0
    assert sorted(os.listdir(tmp_path / "dyndq-demo")) == ["model.exported.onnx", "model.onnx", "x.npy"]


def test_try_line_works(demo, capsys):
    """The command the demo suggests runs."""
    text = demo[1]
    line = next(l for l in text.splitlines() if l.startswith("try:"))
    argv = line.split()[2:]  # after "try:  dyndq"
    assert argv[0] == "run"
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("y: float32[4, 16]")
