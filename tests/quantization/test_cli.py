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
from dyndq.files import save_model

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
    assert any(line.strip().startswith("weights: 0.44 MiB -> 0.07 MiB") for line in printed)
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


@pytest.mark.parametrize("argv,why", [
    (["--group-size", "-1"], "not MatMulNBits: per_channel"),
    (["--scale-dtype", "bfloat16"], "scales is bfloat16"),
])
def test_emit_onnxruntime_says_why_each_weight_fell_back_to_standard_onnx(float_model, tmp_path, capsys, argv, why):
    out = str(tmp_path / "q.onnx")
    assert main(["quantize", float_model, out, "--emit", "onnxruntime", "--no-evaluate", *argv]) == 0
    printed = capsys.readouterr().out.splitlines()
    for weight in ("E", "W1", "W2"):
        line, = [p for p in printed if f"'{weight}_DynamicDequantize' -> " in p]
        assert why in line and "DequantizeLinear" in line, line


def test_layers_left_in_standard_onnx_are_not_fused_by_onnxruntime(float_model, tmp_path):
    """ONNX Runtime runs the weights `--emit onnxruntime` leaves in standard ONNX as they are
    written: it fuses none of them into MatMulNBits (which would run at accuracy_level 4, its
    activations quantized to int8) at its default optimization level."""
    import onnx
    import onnxruntime as ort

    for argv in (["--group-size", "-1"], ["--scale-dtype", "bfloat16"], ["--group-size", "96"],
                 ["--bits", "8", "--group-size", "-1"]):
        out = str(tmp_path / "q.onnx")
        assert main(["quantize", float_model, out, "--emit", "onnxruntime", "--no-evaluate", *argv]) == 0
        written = [n.op_type for n in dyndq.load_model(out).graph.node]
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
        ort.InferenceSession(out, options, providers=["CPUExecutionProvider"])
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
    (["--exclude", "E", "--exclude", "W1", "--exclude", "W2"], 1,
     "nothing to quantize (nothing written): no MatMul, Gemm or Gather node reads a constant float weight\n"),
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
