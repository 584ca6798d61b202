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
    assert [(n.name, n.op_type) for n in ours] == [("fc1_dequantize", "DynamicDequantize"),
                                                   ("fc2_dequantize", "DynamicDequantize"),
                                                   ("fc3_dequantize", "DynamicDequantize")]
    assert not any(n.domain == dyndq.DOMAIN for n in exported.graph.node)
    assert {o.domain for o in exported.opset_import} == {""}
    assert exported.ir_version >= 10  # int4 tensors
    assert dyndq.check(model) == []
    assert model == build_model()  # deterministic: the same model every run


def test_the_weight_only_int4_mlp(demo):
    """uint4 weights per_group (groups of 32 along the input dim) with float32 and float16 scales
    and uint4 and uint8 zero points feeding MatMuls, beside a version-1 form (int8, int32 zps)."""
    model = onnx.load(demo[3] / "model.onnx")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    assert inits["w1_q"].dtype == np.int8 and inits["w1_zps"].dtype == np.int32
    assert inits["w1_scales"].shape == (128,) and inits["w1_zps"].shape == (128,)
    assert (inits["w2_q"].dtype.name, inits["w2_q"].shape) == ("uint4", (128, 64))
    assert (inits["w2_scales"].dtype, inits["w2_scales"].shape) == (np.float32, (4, 64))
    assert (inits["w2_zps"].dtype.name, inits["w2_zps"].shape) == ("uint4", (4, 64))
    assert (inits["w3_q"].dtype.name, inits["w3_q"].shape) == ("uint4", (64, 16))
    assert (inits["w3_scales"].dtype, inits["w3_scales"].shape) == (np.float16, (2, 16))
    assert (inits["w3_zps"].dtype, inits["w3_zps"].shape) == (np.uint8, (2, 16))
    assert [n.op_type for n in model.graph.node] == [
        "DynamicDequantize", "MatMul", "Add", "Relu", "DynamicDequantize", "MatMul", "Add", "Relu",
        "DynamicDequantize", "Cast", "MatMul", "Add"]
    attrs = {n.name: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in model.graph.node}
    assert attrs["fc1_dequantize"] == {"qtype": b"per_channel", "axis": 1}
    assert attrs["fc2_dequantize"] == attrs["fc3_dequantize"] == {"qtype": b"per_group", "group_shape": [32, 1]}
    # version 1 expresses the first node (it is lowered as version 1 lowers it), not the others
    from dyndq.converters.dynamic_dequantize import _route
    from dyndq.opdefs import TensorSpec

    def spec(name):
        return TensorSpec(inits[name].dtype.name, inits[name].shape)

    routes = [_route(spec(f"{w}_q"), spec(f"{w}_scales"), spec(f"{w}_zps"), a["qtype"].decode(), a.get("group_shape"))
              for w, a in (("w1", attrs["fc1_dequantize"]), ("w2", attrs["fc2_dequantize"]),
                           ("w3", attrs["fc3_dequantize"]))]
    assert routes == ["v1", "block", "integer"]
    # the quantization is close to the float weights it came from (the scales are sensible)
    w2 = dyndq.dynamic_dequantize(inits["w2_q"], inits["w2_scales"], inits["w2_zps"], qtype="per_group",
                                  group_shape=[32, 1])
    assert np.abs(w2).max() < 1


def test_weights_size_is_printed_and_true(demo):
    text = demo[1]
    model = onnx.load(demo[3] / "model.onnx")
    inits = {t.name: t for t in model.graph.initializer}
    stored = sum(len(inits[n].raw_data) for n in inits if n.startswith("w"))
    # int8 64x128 + uint4 128x64 packed + uint4 64x16 packed, float32/float16 scales, int32/uint4/uint8 zps
    assert stored == 8192 + 128 * 4 + 128 * 4 + 4096 + 4 * 64 * 4 + 4 * 64 // 2 + 512 + 2 * 16 * 2 + 2 * 16
    as_float = 4 * (64 * 128 + 128 * 64 + 64 * 16)
    assert (f"weights: {stored} bytes as stored (int8 and packed uint4 values, scales, zero points) "
            f"against {as_float} bytes as float32: {as_float / stored:.2f}x smaller") in text


def test_every_dequantized_weight_agrees_to_the_bit_as_printed(demo):
    """Both engines' dequantized weights, compared here independently of the demo: ORT on the
    exported file (with w1, w2, w3 as extra outputs), and our kernel."""
    from dyndq.demo import with_weights_as_outputs
    from dyndq.runner import OrtBoundary

    code, text, _, out = demo
    model = onnx.load(out / "model.onnx")
    x = np.load(out / "x.npy")
    assert np.array_equal(x, demo_input())
    exported = dyndq.export(with_weights_as_outputs(model))
    boundary = OrtBoundary(exported)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(boundary.model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    got = dict(zip(["y", "w1", "w2", "w3"], boundary.run(session, ["y", "w1", "w2", "w3"], {"x": x})))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    want = {
        "w1": dyndq.dynamic_dequantize(inits["w1_q"], inits["w1_scales"], inits["w1_zps"], qtype="per_channel", axis=1),
        "w2": dyndq.dynamic_dequantize(inits["w2_q"], inits["w2_scales"], inits["w2_zps"], qtype="per_group",
                                       group_shape=[32, 1]),
        "w3": dyndq.dynamic_dequantize(inits["w3_q"], inits["w3_scales"], inits["w3_zps"], qtype="per_group",
                                       group_shape=[32, 1]),
    }
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].tobytes() == w.tobytes(), name
    assert want["w3"].dtype == np.float16
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
    assert "graph 'weight_only_int4_mlp': 12 nodes (opsets: ai.onnx 21, org.dyndq 2; IR 10)" in text
    assert ("org.dyndq::DynamicDequantize(w1_q int8[64,128], w1_scales float32[128], w1_zps int32[128]) -> w1"
            "  axis=1 qtype=per_channel") in text
    assert ("org.dyndq::DynamicDequantize(w2_q uint4[128,64], w2_scales float32[4,64], w2_zps uint4[4,64]) -> w2"
            "  group_shape=(32, 1) qtype=per_group") in text
    assert re.search(r"exported to standard ONNX: 3 DynamicDequantize lowered; \d+ nodes \(opset 21, IR 10\)", text)
    assert "fc2_dequantize: DequantizeLinear (blocked), 1 node\n" in text
    assert "DequantizeLinear(w2_q uint4[128,64], w2_scales float32[4,64], w2_zps uint4[4,64]) -> w2  axis=0 block_size=32" in text
    # checked, and shapes inferred
    assert "check: valid" in text
    assert "shape inference: w1 float32[64,128], w2 float32[128,64], w3 float16[64,16], output y float32[batch,16]" in text
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
        if engine == "onnxruntime" and "w2" in out:
            out["w2"] = out["w2"].copy()
            out["w2"].view(np.uint32)[0, 0] ^= 1
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
