"""`dyndq demo`: what it prints, the files it writes, and that they hold what it says."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest

import dyndq
from dyndq.cli import main
from dyndq.demo import LAYERS, build_model, demo_input, float_model

W1, W2, W3 = "w1_dequantized", "w2_dequantized", "w3_DynamicDequantize_out"  # the dequantized weights (w3's float16)


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
    assert [(n.name, n.op_type) for n in ours] == [("w1_DynamicDequantize", "DynamicDequantize"),
                                                   ("w2_DynamicDequantize", "DynamicDequantize"),
                                                   ("w3_DynamicDequantize", "DynamicDequantize")]
    assert not any(n.domain == dyndq.DOMAIN for n in exported.graph.node)
    assert {o.domain for o in exported.opset_import} == {""}
    assert exported.ir_version >= 10  # int4 tensors
    assert dyndq.check(model) == []
    assert model == build_model()  # deterministic: the same model every run


def test_the_weight_only_int4_mlp(demo):
    """dyndq.quantize's forms: uint8 per_channel (a version-1 form), then uint4 per_group (groups of
    32 along the input dim) with float32 and float16 scales and uint4 zero points, each feeding a
    MatMul, in place of the float MLP's weights."""
    model = onnx.load(demo[3] / "model.onnx")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    assert sorted(inits) == sorted(["b1", "b2", "b3"] + [f"w{i}_{part}" for i in (1, 2, 3)
                                                         for part in ("quantized", "scales", "zero_points")])
    assert inits["w1_quantized"].dtype == np.uint8 and inits["w1_zero_points"].dtype == np.uint8
    assert inits["w1_scales"].shape == (128,) and inits["w1_zero_points"].shape == (128,)
    assert (inits["w2_quantized"].dtype.name, inits["w2_quantized"].shape) == ("uint4", (128, 64))
    assert (inits["w2_scales"].dtype, inits["w2_scales"].shape) == (np.float32, (4, 64))
    assert (inits["w2_zero_points"].dtype.name, inits["w2_zero_points"].shape) == ("uint4", (4, 64))
    assert (inits["w3_quantized"].dtype.name, inits["w3_quantized"].shape) == ("uint4", (64, 16))
    assert (inits["w3_scales"].dtype, inits["w3_scales"].shape) == (np.float16, (2, 16))
    assert (inits["w3_zero_points"].dtype.name, inits["w3_zero_points"].shape) == ("uint4", (2, 16))
    assert [n.op_type for n in model.graph.node] == [
        "DynamicDequantize", "DynamicDequantize", "DynamicDequantize", "Cast",
        "MatMul", "Add", "Relu", "MatMul", "Add", "Relu", "MatMul", "Add"]
    attrs = {n.name: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in model.graph.node}
    assert attrs["w1_DynamicDequantize"] == {"qtype": b"per_channel", "axis": 1}
    assert attrs["w2_DynamicDequantize"] == attrs["w3_DynamicDequantize"] == {"qtype": b"per_group",
                                                                              "group_shape": [32, 1]}
    # each is what dyndq.quantize makes of the float weight with that layer's options
    floats = float_model()
    for weight, node, options in LAYERS:
        others = [n for _, n, _ in LAYERS if n != node]
        alone, _ = dyndq.quantize(floats, exclude=others, evaluate=False, **options)
        made = {t.name: onnx.numpy_helper.to_array(t) for t in alone.graph.initializer}
        for part in ("quantized", "scales", "zero_points"):
            assert made[f"{weight}_{part}"].tobytes() == inits[f"{weight}_{part}"].tobytes(), (weight, part)
    # exported, the first is a per-axis DequantizeLinear, the others blocked ones
    report = dyndq.export_with_report(model)[1]
    assert [(x.node, x.form) for x in report.lowered] == [("w1_DynamicDequantize", "DequantizeLinear"),
                                                          ("w2_DynamicDequantize", "DequantizeLinear (blocked)"),
                                                          ("w3_DynamicDequantize", "DequantizeLinear (blocked)")]
    # the quantization is close to the float weights it came from (the scales are sensible)
    w2 = dyndq.dynamic_dequantize(inits["w2_quantized"], inits["w2_scales"], inits["w2_zero_points"],
                                  qtype="per_group", group_shape=[32, 1])
    w2_float = next(onnx.numpy_helper.to_array(t) for t in floats.graph.initializer if t.name == "w2")
    assert np.abs(w2 - w2_float).max() < 0.02


def test_weights_size_is_printed_and_true(demo):
    text = demo[1]
    model = onnx.load(demo[3] / "model.onnx")
    inits = {t.name: t for t in model.graph.initializer}
    stored = sum(len(inits[n].raw_data) for n in inits if n.startswith("w"))
    # uint8 64x128 + uint4 128x64 packed + uint4 64x16 packed, float32/float32/float16 scales, uint8/uint4/uint4 zps
    assert stored == 8192 + 128 * 4 + 128 + 4096 + 4 * 64 * 4 + 4 * 64 // 2 + 512 + 2 * 16 * 2 + 2 * 16 // 2
    as_float = 4 * (64 * 128 + 128 * 64 + 64 * 16)
    assert (f"weights: {stored} bytes as stored (uint8 and packed uint4 values, scales, zero points) "
            f"against {as_float} bytes as float32: {as_float / stored:.2f}x smaller") in text


def test_every_dequantized_weight_agrees_to_the_bit_as_printed(demo):
    """Both engines' dequantized weights, compared here independently of the demo: ORT on the
    exported file (with the dequantized weights as extra outputs), and our kernel."""
    from dyndq.demo import with_weights_as_outputs
    from dyndq.ort_session import OrtSession

    code, text, _, out = demo
    model = onnx.load(out / "model.onnx")
    x = np.load(out / "x.npy")
    assert np.array_equal(x, demo_input())
    exported = dyndq.export(with_weights_as_outputs(model))
    got = dict(zip(["y", W1, W2, W3], OrtSession(exported, level="basic").run(["y", W1, W2, W3], {"x": x})))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}

    def parts(w):
        return inits[f"{w}_quantized"], inits[f"{w}_scales"], inits[f"{w}_zero_points"]

    want = {
        W1: dyndq.dynamic_dequantize(*parts("w1"), qtype="per_channel", axis=1),
        W2: dyndq.dynamic_dequantize(*parts("w2"), qtype="per_group", group_shape=[32, 1]),
        W3: dyndq.dynamic_dequantize(*parts("w3"), qtype="per_group", group_shape=[32, 1]),
    }
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].tobytes() == w.tobytes(), name
    assert want[W3].dtype == np.float16
    printed = re.search(r"agree bit for bit on every dequantized weight: (\w+) \((\d+) of (\d+) values identical", text)
    assert printed and printed.groups() == ("yes", "17408", "17408"), text
    # y: within the stated tolerance (not promised to the bit), and the printed values are the reference's
    y_ref = dyndq.run(model, {"x": x})["y"]
    assert np.allclose(got["y"], y_ref, rtol=1e-5, atol=1e-6)
    assert "both engines agree on y within rtol 1e-05, atol 1e-06: yes" in text
    assert f"y[0,:4] = {np.array2string(y_ref[0, :4], precision=6)}" in text


def test_what_it_prints(demo):
    code, text, _, out = demo
    assert text.startswith("dyndq demo: a weight-only int4 MLP, x[batch,64] -> 128 -> 64 -> 16")
    # the graph before export, and after
    # how dyndq.quantize made it, layer by layer
    assert "quantized by dyndq.quantize, one call per layer (rtn: ONNX Runtime's rounding):" in text
    assert re.search(r"  w1 \(fc1_matmul; bits=8, group_size=-1\): uint8 per_channel \(axis 1\), rel. error 0\.0\d+\n", text)
    assert re.search(r"  w3 \(fc3_matmul; bits=4, group_size=32, scale_dtype='float16'\): uint4 per_group \[32, 1\] "
                     r"\+ Cast to float32, rel. error 0\.\d+\n", text)
    assert "graph 'weight_only_int4_mlp': 12 nodes (opsets: ai.onnx 21, org.dyndq 3; IR 10)" in text
    assert ("org.dyndq::DynamicDequantize(w1_quantized uint8[64,128], w1_scales float32[128], w1_zero_points uint8[128])"
            " -> w1_dequantized  axis=1 qtype=per_channel") in text
    assert ("org.dyndq::DynamicDequantize(w2_quantized uint4[128,64], w2_scales float32[4,64], w2_zero_points uint4[4,64])"
            " -> w2_dequantized  group_shape=(32, 1) qtype=per_group") in text
    assert re.search(r"exported to standard ONNX: 3 DynamicDequantize lowered; \d+ nodes \(opset 21, IR 10\)", text)
    assert "w2_DynamicDequantize: DequantizeLinear (blocked), 1 node\n" in text
    assert ("DequantizeLinear(w2_quantized uint4[128,64], w2_scales float32[4,64], w2_zero_points uint4[4,64]) "
            "-> w2_dequantized  axis=0 block_size=32") in text
    # checked, and shapes inferred
    assert "check: valid" in text
    assert (f"shape inference: {W1} float32[64,128], {W2} float32[128,64], {W3} float16[64,16], "
            "output y float32[batch,16]") in text
    # timings of both engines
    assert re.search(r"reference evaluator .* first +[\d.]+ ms +then +[\d.]+ ms", text)
    assert re.search(r"ONNX Runtime .* first +[\d.]+ ms +then +[\d.]+ ms", text)
    assert re.search(r"y on this CPU: max \|difference\| \S+, \d+ of 64 values bit-identical", text)
    assert f"wrote {out / 'model.onnx'}" in text


def test_its_second_line_names_the_kernel_and_why(demo):
    from dyndq.kernels import native

    line = demo[1].splitlines()[1]
    assert line == native.summary()
    if native.info()["kernel"] == "compiled":
        assert line.startswith(f"kernel: compiled, {native.info()['entries']['dequantize']} variant")
    else:
        assert line.startswith("kernel: NumPy (the compiled kernel is ")


@pytest.mark.parametrize("env,shown", [
    ({"DYNDQ_NATIVE": "0"}, "kernel: NumPy (the compiled kernel is switched off"),
    ({"DYNDQ_NATIVE_MODULE": "/nowhere/_native.so"}, "kernel: NumPy (the compiled kernel is not loadable ("),
])
def test_without_the_compiled_kernel_it_says_so(tmp_path, env, shown):
    from dyndq.kernels import native

    if not native.built() and "DYNDQ_NATIVE" in env:
        shown = "kernel: NumPy (the compiled kernel is not built ("
    p = subprocess.run([sys.executable, "-m", "dyndq", "demo", "--out", "d"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env=dict(os.environ, **env))
    assert p.returncode == 0 and p.stdout.splitlines()[1].startswith(shown), p.stdout[:300]
    assert "both engines agree bit for bit on every dequantized weight: yes" in p.stdout


def test_a_weight_that_differs_is_reported_as_such(monkeypatch, tmp_path):
    """The agreement line is computed, not printed: a wrong bit in one engine's weight says NO."""
    import io

    import dyndq.demo as demo_module

    real_run = dyndq.run

    def tampered(model, feeds, *, engine="reference"):
        out = real_run(model, feeds, engine=engine)
        if engine == "onnxruntime" and W2 in out:
            out[W2] = out[W2].copy()
            out[W2].view(np.uint32)[0, 0] ^= 1
        return out

    monkeypatch.setattr(dyndq, "run", tampered)
    stream = io.StringIO()
    result = demo_module.run_demo(str(tmp_path / "out"), stream=stream)
    assert not result.agree and result.identical == result.total - 1
    assert "agree bit for bit on every dequantized weight: NO (17407 of 17408 values identical)" in stream.getvalue()


def test_default_folder_and_python_dash_m(tmp_path):
    """`python -m dyndq demo` in a fresh folder writes ./dyndq-demo, quickly."""
    p = subprocess.run([sys.executable, "-m", "dyndq", "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr) == (0, "")
    assert "both engines agree bit for bit on every dequantized weight: yes" in p.stdout
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
