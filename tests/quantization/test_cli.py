"""`dyndq quantize`: the table, --json, progress on a terminal only, the forms it emits, and
mistakes told in plain lines with the CLI's exit codes."""
from __future__ import annotations

import io
import json
import os

import numpy as np
import onnx
import pytest

import dyndq
from dyndq.cli import main
from dyndq.model_files import save_model

from quantize_models import mlp


@pytest.fixture
def float_model(tmp_path):
    save_model(mlp(), tmp_path / "float.onnx")
    return str(tmp_path / "float.onnx")


def test_prints_a_table_and_writes_the_model(float_model, tmp_path, capsys):
    out = str(tmp_path / "q.onnx")
    assert main(["quantize", float_model, out, "--method", "search"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"wrote {out}: quantized 3 weights to uint4 (groups of 128, asymmetric, search)"
    assert printed[1].split() == ["weight", "op", "shape", "form", "rel.", "error", "max", "abs", "cosine"]
    assert printed[3].split()[:4] == ["E", "Gather", "64x256", "uint4"]
    assert any(line.strip().startswith("weights quantized: 0.44 MiB -> 0.07 MiB") for line in printed)
    assert any(line.strip().startswith("y: rel. error") for line in printed)
    assert dyndq.check(dyndq.load_model(out)) == []


def test_json_for_tools(float_model, tmp_path, capsys):
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--json", "--bits", "8", "--group-size", "-1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["bits"] == 8 and doc["settings"]["group_size"] == -1
    assert [layer["form"] for layer in doc["layers"]] == ["uint8 per_channel (axis 0)", "uint8 per_channel (axis 1)",
                                                          "uint8 per_channel (axis 0)"]
    assert doc["outputs"][0]["name"] == "y" and 0 < doc["size_ratio"] < 0.3


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_on_a_terminal_and_quiet_when_piped(float_model, tmp_path, capsys, monkeypatch):
    assert main(["quantize", float_model, str(tmp_path / "a.onnx"), "--no-evaluate"]) == 0
    assert capsys.readouterr().err == ""
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["quantize", float_model, str(tmp_path / "b.onnx"), "--no-evaluate"]) == 0
    lines = terminal.getvalue().splitlines()
    assert [line.split()[:2] for line in lines] == [["[1/3]", "E"], ["[2/3]", "W1"], ["[3/3]", "W2"]]


def test_emit_standard_onnx(float_model, tmp_path, capsys):
    out = str(tmp_path / "q.onnx")
    assert main(["quantize", float_model, out, "--emit", "onnx"]) == 0
    model = dyndq.load_model(out)
    assert "DequantizeLinear" in {n.op_type for n in model.graph.node}
    assert "org.dyndq" not in {o.domain for o in model.opset_import}
    ids = np.array([1, 2], np.int64)
    y = dyndq.run(model, {"ids": ids}, engine="onnxruntime")["y"]
    assert y.shape == (2, 256)


def test_emit_onednn_json_writes_the_weights_beside(tmp_path, capsys):
    from onnx import TensorProto as T, helper, numpy_helper as nh

    from quantize_models import heavy

    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [2, 256])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 64])], [nh.from_array(heavy((256, 64)), "w")])
    save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), tmp_path / "m.onnx")
    assert main(["quantize", str(tmp_path / "m.onnx"), str(tmp_path / "m.json"), "--emit", "onednn-json", "--no-evaluate"]) == 0
    doc = json.loads((tmp_path / "m.json").read_text())
    assert [op["kind"] for op in doc["graph"]] == ["DynamicDequantize", "MatMul"]
    assert len(os.listdir(tmp_path / "m-weights")) == 3
    assert "wrote " + str(tmp_path / "m-weights") in capsys.readouterr().out


def test_emit_onnxruntime(float_model, tmp_path, capsys):
    out = str(tmp_path / "q.onnx")
    assert main(["quantize", float_model, out, "--emit", "onnxruntime"]) == 0
    ops = {n.op_type for n in dyndq.load_model(out).graph.node}
    assert {"MatMulNBits", "GatherBlockQuantized"} <= ops
    # which weights fell back to standard ONNX, and why: the Gemm's (MatMulNBits is a MatMul)
    printed = capsys.readouterr().out
    assert "\n  written for onnxruntime: wrote 2 " in printed
    fell_back = [line for line in printed.splitlines() if "'W2_DynamicDequantize' -> DequantizeLinear" in line]
    assert len(fell_back) == 1 and ": not MatMulNBits: " in fell_back[0], printed


def test_emit_openvino_writes_the_openvino_export(float_model, tmp_path, capsys, monkeypatch):
    """--emit openvino, a form of the engine table's: export(target="openvino") of the model quantized,
    valid, checked before it is put in place (on OpenVINO where installed: said where it is not), its
    weights the kernel's on the reference engine and its outputs measured as written."""
    from dyndq import openvino_session
    from dyndq.quantization import EMITS

    assert "openvino" in EMITS
    monkeypatch.setattr(openvino_session, "installed", lambda: False)
    out = str(tmp_path / "q.onnx")
    assert main(["quantize", float_model, out, "--emit", "openvino"]) == 0
    printed = capsys.readouterr().out
    assert "\n  written for openvino: lowered 3 DynamicDequantize node(s)" in printed
    assert "note: not loaded on OpenVINO: it is not installed here (make test-openvino installs it)" in printed
    assert "onnxruntime, the file as written" in printed  # (measured: the file as written)
    written = dyndq.load_model(out)
    onnx.checker.check_model(written, full_check=True)
    assert "org.dyndq" not in {o.domain for o in written.opset_import}
    quantized, _ = dyndq.quantize(dyndq.load_model(float_model), evaluate=False)
    assert [n.op_type for n in written.graph.node] == [n.op_type for n in dyndq.export(quantized, target="openvino").graph.node]
    ids = np.arange(64, dtype=np.int64)  # (every row of the embedding: its dequantized weights)
    want = dyndq.run(quantized, {"ids": ids}, outputs=["x"])["x"]
    assert dyndq.run(written, {"ids": ids}, outputs=["x"])["x"].tobytes() == want.tobytes()


@pytest.mark.openvino
def test_emit_openvino_loads_on_openvino_and_gives_the_kernels_weights():
    """The file --emit openvino writes loads on OpenVINO (its check made a session there) and gives
    the dequantized weights bit for bit: a MatMul of identity(K) by the quantized W."""
    import tempfile

    from onnx import TensorProto, helper

    from engines import needs_openvino, run_openvino
    from quantize_models import heavy

    needs_openvino()
    k, n = 256, 96
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
                              [onnx.numpy_helper.from_array(heavy((k, n), 3), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    eye = np.eye(k, dtype=np.float32)
    with tempfile.TemporaryDirectory() as folder:
        src, out = os.path.join(folder, "f.onnx"), os.path.join(folder, "q.onnx")
        save_model(model, src)
        for argv in ([], ["--bits", "8", "--group-size", "-1"], ["--format", "mxfp4"], ["--bits", "2", "--symmetric"]):
            assert main(["quantize", src, out, "--emit", "openvino", "--overwrite", *argv]) == 0, argv
            quantized, _ = dyndq.quantize(model, evaluate=False, **_options(argv))
            want = dyndq.run(quantized, {"x": eye})["y"]  # (the kernel's weights)
            [got] = run_openvino(dyndq.load_model(out), {"x": eye})
            assert got.tobytes() == want.tobytes(), argv


def _options(argv: list[str]) -> dict:
    """quantize's keywords for the CLI options used above."""
    out, i = {}, 0
    while i < len(argv):
        if argv[i] == "--symmetric":
            out["symmetric"], i = True, i + 1
        else:
            key, value = argv[i][2:].replace("-", "_"), argv[i + 1]
            out[key], i = (value if key == "format" else int(value)), i + 2
    return out


@pytest.mark.parametrize("argv,why,fell_back", [
    # (one scale per column: MatMul's W1 is a MatMulNBits of one block per column; Gemm's transposed W2 is not)
    (["--group-size", "-1"], "not MatMulNBits: per_channel along axis 0", ("E", "W2")),
    (["--scale-dtype", "bfloat16"], "scales is bfloat16", ("E", "W1", "W2")),
])
def test_emit_onnxruntime_says_why_each_weight_fell_back_to_standard_onnx(float_model, tmp_path, capsys, argv, why,
                                                                         fell_back):
    out = str(tmp_path / "q.onnx")
    assert main(["quantize", float_model, out, "--emit", "onnxruntime", "--no-evaluate", *argv]) == 0
    printed = capsys.readouterr().out.splitlines()
    for weight in ("E", "W1", "W2"):
        line, = [p for p in printed if f"'{weight}_DynamicDequantize' -> " in p]
        if weight in fell_back:
            assert why in line and "DequantizeLinear" in line, line
        else:
            assert "-> com.microsoft::MatMulNBits" in line, line


def test_layers_left_in_standard_onnx_are_not_fused_by_onnxruntime(float_model, tmp_path):
    """ONNX Runtime runs the weights `--emit onnxruntime` leaves in standard ONNX as they are
    written: it fuses none of them into MatMulNBits (which would run at accuracy_level 4, its
    activations quantized to int8) at its default optimization level."""
    import onnx

    from dyndq.ort_session import OrtSession

    for argv in (["--group-size", "-1"], ["--scale-dtype", "bfloat16"], ["--group-size", "96"],
                 ["--bits", "8", "--group-size", "-1"]):
        out = str(tmp_path / "q.onnx")
        assert main(["quantize", float_model, out, "--emit", "onnxruntime", "--no-evaluate", *argv]) == 0
        written = [n.op_type for n in dyndq.load_model(out).graph.node]
        OrtSession(onnx.load(out, load_external_data=False), level="all", path=out,  # (at its defaults)
                   optimized_model_path=str(tmp_path / "optimized.onnx"))
        optimized = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
        assert optimized.count("MatMulNBits") == written.count("MatMulNBits"), (argv, written, optimized)


@pytest.mark.parametrize("argv,code,said", [
    (["--group-size", "0"], 2, "dyndq: --group-size: found 0; allowed: a whole number >= 1, or -1"),
    (["--group-size", "-3"], 2, "dyndq: --group-size: found -3; allowed: a whole number >= 1, or -1"),
    (["--ops", "Conv"], 2, "dyndq: --ops: found 'Conv'; allowed: MatMul, Gemm, Gather"),
    (["--ops", ","], 2, "dyndq: --ops: found no op; allowed: one or more of MatMul, Gemm, Gather"),
    (["--exclude", "nope"], 2, "dyndq: --exclude: found 'nope'; allowed: the name of a node or a weight"),
    (["--seed", "-1"], 2, "dyndq: --seed: found -1; allowed: a whole number >= 0"),
    (["--ops", "Conv", "--exclude", "nope"], 2, "dyndq: --ops: found 'Conv'; allowed: MatMul, Gemm, Gather\n"
                                                "dyndq: --exclude: found 'nope'"),
    (["--bits", "3"], 2, "argument --bits: invalid choice"),
    (["--format", "mxfp4", "--group-size", "64"], 2,
     "dyndq: --group-size: found 64 with format 'mxfp4'; allowed: 32 (its blocks) or none given\n"),
    (["--format", "nvfp4", "--bits", "2", "--method", "search"], 2,
     "dyndq: --bits: found 2 with format 'nvfp4'; allowed: 4 (its codes are float4e2m1) or none given\n"
     "dyndq: --method: found 'search' with format 'nvfp4'; allowed: 'rtn' (the format's rule is the only method)\n"),
    (["--format", "mxfp4", "--scale-dtype", "float16"], 2, "dyndq: --scale-dtype: found 'float16' with format 'mxfp4'"),
    (["--format", "fp8"], 2, "argument --format: invalid choice"),
    # every weight excluded: said so, naming the flag (not "no node reads a weight")
    (["--exclude", "E", "--exclude", "W1", "--exclude", "W2"], 1,
     "nothing to quantize (nothing written): every MatMul, Gemm or Gather node's weight is excluded by --exclude "
     "(3 nodes: 'embed', 'fc1', 'fc2')\n"),
    # a budget chooses bits and format: either given is refused, its default value too
    (["--budget", "4.3", "--bits", "4"], 2, "dyndq: --bits: found 4 with a budget; allowed: none given"),
    (["--budget", "4.3", "--bits", "2"], 2, "dyndq: --bits: found 2 with a budget; allowed: none given"),
    (["--budget", "4.3", "--format", "int"], 2, "dyndq: --format: found 'int' with a budget; allowed: none given"),
])
def test_mistakes_are_told_plainly(float_model, tmp_path, capsys, argv, code, said):
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), *argv]) == code
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "q.onnx")


def test_a_model_with_nothing_to_quantize_says_so(tmp_path, capsys):
    from onnx import TensorProto as T, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), tmp_path / "relu.onnx")
    assert main(["quantize", str(tmp_path / "relu.onnx"), str(tmp_path / "q.onnx")]) == 1
    err = capsys.readouterr().err
    assert err == (f"{tmp_path / 'relu.onnx'}: nothing to quantize (nothing written): no MatMul, Gemm or Gather node "
                   "reads a constant float weight\n")
    assert not os.path.exists(tmp_path / "q.onnx")


def test_an_already_quantized_model_has_nothing_to_quantize(float_model, tmp_path, capsys):
    once = str(tmp_path / "once.onnx")
    assert main(["quantize", float_model, once, "--no-evaluate"]) == 0
    capsys.readouterr()
    assert main(["quantize", once, str(tmp_path / "twice.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{once}: nothing to quantize (nothing written): 3 weights left alone\n")
    assert "B ('W1_dequantized'): found the output of DynamicDequantize 'W1_DynamicDequantize'" in err


def test_no_evaluate_says_why_nothing_was_measured(float_model, tmp_path, capsys):
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--no-evaluate"]) == 0
    assert "  output error: not measured (--no-evaluate)" in capsys.readouterr().out.splitlines()


def test_quantizing_a_model_onto_itself_says_which_data_file_it_keeps(tmp_path, capsys):
    model = str(tmp_path / "m.onnx")
    save_model(mlp(), model, external_data=True)
    assert main(["quantize", model, model, "--no-evaluate", "--overwrite"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"wrote {model}: quantized 3 weights")
    assert out[1:3] == ["  its tensors are in m.onnx.1.data, beside it",
                        "  kept m.onnx.data, the data of the model it replaced: other copies of that model may point "
                        "into it; delete it when none does"]
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.1.data", "m.onnx.data"]
    assert dyndq.check(dyndq.load_model(model)) == []


def test_a_file_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "x.onnx").write_text("hello")
    assert main(["quantize", str(tmp_path / "x.onnx"), str(tmp_path / "q.onnx")]) == 2
    assert "not an ONNX model" in capsys.readouterr().err


def test_strict_refuses_to_leave_a_weight_alone(float_model, tmp_path, capsys):
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--scale-dtype", "float16"]) == 0
    assert "left alone" not in capsys.readouterr().out
    huge = str(tmp_path / "huge.onnx")
    model = dyndq.load_model(float_model)
    model.graph.initializer[1].CopyFrom(onnx.numpy_helper.from_array(np.full((256, 192), 1e6, np.float32), "W1"))
    onnx.save(model, huge)
    assert main(["quantize", huge, str(tmp_path / "q.onnx"), "--scale-dtype", "float16"]) == 0
    assert "left alone: 1 weight" in capsys.readouterr().out
    assert main(["quantize", huge, str(tmp_path / "r.onnx"), "--scale-dtype", "float16", "--strict"]) == 1
    assert "scales beyond the largest float16" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "r.onnx")


@pytest.mark.parametrize("argv,form,settings", [
    (["--bits", "2", "--group-size", "32"], "uint2 per_group [32, 1]", dict(format="int", bits=2, group_size=32)),
    (["--format", "mxfp4"], "mxfp4 per_group [32, 1]", dict(format="mxfp4", bits=4, group_size=32)),
    (["--format", "nvfp4", "--group-size", "16"], "nvfp4 per_group [16, 1]", dict(format="nvfp4", bits=4, group_size=16)),
])
def test_two_bits_and_the_fp4_formats(float_model, tmp_path, capsys, argv, form, settings):
    out = tmp_path / "q.onnx"
    assert main(["quantize", float_model, str(out), "--json", "--ops", "MatMul", *argv]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {k: doc["settings"][k] for k in settings} == settings
    assert [layer["form"].startswith(form) for layer in doc["layers"]] == [True]
    model = onnx.load(out)
    assert {o.domain: o.version for o in model.opset_import}["org.dyndq"] == 3


def conv_model(with_matmul: bool) -> onnx.ModelProto:
    """x [1, 3, 8, 8] -> Conv(C [16, 3, 3, 3]) -> (with_matmul: Flatten -> MatMul(W [576, 32]))."""
    from onnx import TensorProto as T, helper, numpy_helper as nh

    from quantize_models import heavy

    nodes = [helper.make_node("Conv", ["x", "C"], ["c"], name="conv")]
    inits = [nh.from_array(heavy((16, 3, 3, 3), 3), "C")]
    out = helper.make_tensor_value_info("c", T.FLOAT, [1, 16, 6, 6])
    if with_matmul:
        nodes += [helper.make_node("Flatten", ["c"], ["f"], name="flatten"),
                  helper.make_node("MatMul", ["f", "W"], ["y"], name="fc")]
        inits.append(nh.from_array(heavy((576, 32), 4), "W"))
        out = helper.make_tensor_value_info("y", T.FLOAT, [1, 32])
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])], [out], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_conv_weights_are_said_to_be_left_as_they_are(tmp_path, capsys):
    """A Conv-only model has nothing to quantize, and says its Conv weights are not of the ops
    quantize takes; with a MatMul beside, the report gives the quantized weights' size and the
    whole model's, the Conv weight in it."""
    save_model(conv_model(False), tmp_path / "conv.onnx")
    assert main(["quantize", str(tmp_path / "conv.onnx"), str(tmp_path / "q.onnx")]) == 1
    err = capsys.readouterr().err
    assert err == (f"{tmp_path / 'conv.onnx'}: nothing to quantize (nothing written): no MatMul, Gemm or Gather node "
                   "reads a constant float weight (1 Conv node reads a constant float weight, which quantize does not "
                   "quantize: it quantizes the weights of MatMul, Gemm and Gather only)\n")
    save_model(conv_model(True), tmp_path / "both.onnx")
    assert main(["quantize", str(tmp_path / "both.onnx"), str(tmp_path / "q.onnx"), "--no-evaluate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    conv, matmul = 16 * 3 * 3 * 3 * 4, 576 * 32 * 4
    assert doc["bytes_before"] == matmul and doc["model_bytes_before"] == conv + matmul
    assert doc["model_bytes_after"] == conv + doc["bytes_after"]
    assert doc["other_weights"].startswith("1 Conv node reads a constant float weight, which quantize does not")
    assert main(["quantize", str(tmp_path / "both.onnx"), str(tmp_path / "q.onnx"), "--no-evaluate"]) == 0
    printed = capsys.readouterr().out.splitlines()
    ratio = (conv + doc["bytes_after"]) / (conv + matmul)
    assert f"  weights quantized: 0.07 MiB -> 0.01 MiB ({doc['size_ratio']:.3f}x; the codes alone would be 4/32 = " \
           "0.125x of float32)" in printed
    assert ("  the whole model's constants (initializers and Constant nodes, quantized or not): 0.07 MiB -> 0.01 MiB "
            f"({ratio:.3f}x)") in printed
    assert "  not quantized: 1 Conv node reads a constant float weight, which quantize does not quantize: it " \
           "quantizes the weights of MatMul, Gemm and Gather only" in printed


def test_made_up_inputs_are_said_to_be_made_up(float_model, tmp_path, capsys):
    """Measured on seeded samples, the table and the JSON say the inputs are made up, what the
    figures are worth and how to give real ones; measured on the user's inputs, they do not."""
    out = str(tmp_path / "q.onnx")
    assert main(["quantize", float_model, out]) == 0
    note, = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  note: ")]
    assert note.startswith("  note: these inputs are made up (seeded random values, not data the model was made "
                           "for): the figures say how far the quantized model strays from the float one on them, "
                           "not how well it does its task")
    assert "--input NAME=FILE.npy or --inputs-dir DIR" in note
    assert main(["quantize", float_model, out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["inputs_note"] == note[len("  note: "):]
    np.save(tmp_path / "ids.npy", np.arange(10, dtype=np.int64))
    assert main(["quantize", float_model, out, "--json", "--input", f"ids={tmp_path / 'ids.npy'}"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["inputs"]["source"] == "given" and doc["inputs_note"] is None


def test_the_default_form_says_where_it_runs(float_model, tmp_path, capsys):
    """The DynamicDequantize model (--emit dyndq) does not load in ONNX Runtime: the report says
    so, and which engines and forms do; a form ONNX Runtime loads says nothing of the kind."""
    from dyndq.ort_session import user_session

    out = str(tmp_path / "q.onnx")
    assert main(["quantize", float_model, out, "--no-evaluate"]) == 0
    where, = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  where it runs: ")]
    assert "ONNX Runtime and OpenVINO cannot load" in where and "dyndq run" in where
    assert "--emit onnxruntime" in where and "dyndq export OUT FILE --target onnxruntime" in where
    with pytest.raises(Exception, match="DynamicDequantize"):  # (what the note says, measured)
        user_session(out)
    assert main(["quantize", float_model, out, "--no-evaluate", "--emit", "onnxruntime", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["where_it_runs"] is None
    assert main(["quantize", float_model, out, "--no-evaluate", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["where_it_runs"] == where[len("  where it runs: "):]


# -- the files quantize writes -------------------------------------------------------------------

def test_the_input_itself_as_out_is_refused_without_overwrite(float_model, tmp_path, capsys):
    """The README: a model passed in is never modified. `quantize M M` replaced the float original."""
    before = open(float_model, "rb").read()
    assert main(["quantize", float_model, float_model]) == 2
    err = capsys.readouterr().err
    assert err == f"dyndq: {float_model}: is the input model itself; write to another file, or add --overwrite to replace it\n"
    assert open(float_model, "rb").read() == before
    assert main(["quantize", float_model, float_model, "--overwrite", "--no-evaluate"]) == 0
    assert open(float_model, "rb").read() != before


def test_an_out_ending_in_a_slash_is_refused_before_any_work(float_model, tmp_path, capsys):
    for out in (tmp_path / "new", tmp_path):
        assert main(["quantize", float_model, f"{out}/", "--no-evaluate"]) == 2
        assert capsys.readouterr().err == (f"dyndq: {out}/: names a folder, not a file; give the path of the file "
                                           f"to write (e.g. {out}/model.onnx)\n")
    assert sorted(os.listdir(tmp_path)) == ["float.onnx"]


def test_an_interrupt_while_methods_are_ranked_leaves_out_unwritten(float_model, tmp_path, monkeypatch, capsys):
    import dyndq.quantization

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(dyndq.quantization, "rank_methods", interrupted)
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--rank-methods", "--report",
                 str(tmp_path / "r.md")]) == 130
    assert capsys.readouterr().err == "dyndq: interrupted\n"
    assert sorted(os.listdir(tmp_path)) == ["float.onnx"]


def test_the_markdown_report_holds_the_budget(float_model, tmp_path, capsys):
    md = tmp_path / "r.md"
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--budget", "4.5", "--samples", "2",
                 "--report", str(md)]) == 0
    printed = capsys.readouterr().out
    text = md.read_text()
    assert "\n## Budget\n" in text and "Budget 4.5 bits per weight" in text
    for weight in ("E", "W1", "W2"):
        row, = [line for line in text.splitlines() if line.startswith(f"| {weight} | int")]
        assert "int2 " in row and "int8 " in row, row  # (each candidate, with its bits and output error)
    assert "budget 4.5 bits per weight" in printed  # (as the printed report says it)


# -- no internal error ---------------------------------------------------------------------------

def test_an_empty_input_is_measured_as_empty_not_an_internal_error(float_model, tmp_path, capsys):
    empty = tmp_path / "empty.npy"
    np.save(empty, np.zeros(0, np.int64))
    for extra in ([], ["--rank-methods"]):
        assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--input", f"ids={empty}", "--overwrite",
                     *extra]) == 0
        out = capsys.readouterr().out
        assert "  output error: not measured: no float output to compare (1 sample given: ids int64[0]; " in out
        assert "left out: y, empty on these inputs" in out
    assert "  methods: not ranked: no float output to compare" in out


def test_rank_methods_where_onnxruntime_refuses_a_feed_says_so(float_model, tmp_path, capsys):
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([1000, 3], np.int64))  # (beyond the 64 rows of the table)
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--input", f"ids={ids}", "--rank-methods"]) == 0
    out = capsys.readouterr().out
    assert "  output error: not measured: [ONNXRuntimeError]" in out and "idx=1000" in out
    assert "  methods: not ranked: [ONNXRuntimeError]" in out


def test_a_group_longer_than_every_weight_is_an_option_error(float_model, tmp_path, capsys):
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--group-size", str(2**40)]) == 2
    assert capsys.readouterr().err == (
        "dyndq: --group-size: found 1099511627776; allowed: a whole number up to 256 (the longest axis a weight is "
        "grouped along here), or -1 for one group per whole axis (per channel)\n")
    assert sorted(os.listdir(tmp_path)) == ["float.onnx"]
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--group-size", "256", "--no-evaluate"]) == 0


def test_a_report_written_over_out_is_refused(float_model, tmp_path, capsys):
    out = str(tmp_path / "q.md")
    assert main(["quantize", float_model, out, "--report", out]) == 2
    assert capsys.readouterr().err == f"dyndq: --report {out}: is OUT itself; write the report to a file of its own\n"
    assert sorted(os.listdir(tmp_path)) == ["float.onnx"]
