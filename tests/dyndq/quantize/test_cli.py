"""`dyndq quantize`: the table, --json, progress on a terminal only, the forms it emits, and
mistakes told in plain lines with the CLI's exit codes."""
from __future__ import annotations

import io
import json
import os

import numpy as np
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


@pytest.mark.parametrize("argv,code,said", [
    (["--group-size", "0"], 1, "group_size: found 0; allowed: a whole number >= 1, or -1"),
    (["--ops", "Conv"], 1, "ops: found 'Conv'"),
    (["--exclude", "nope"], 1, "exclude: found 'nope'"),
    (["--group-size", "512"], 1, "is shorter than the group size 512"),
    (["--bits", "3"], 2, "argument --bits: invalid choice"),
])
def test_mistakes_are_told_plainly(float_model, tmp_path, capsys, argv, code, said):
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), *argv]) == code
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "q.onnx")


def test_a_file_that_is_not_a_model(tmp_path, capsys):
    (tmp_path / "x.onnx").write_text("hello")
    assert main(["quantize", str(tmp_path / "x.onnx"), str(tmp_path / "q.onnx")]) == 2
    assert "not an ONNX model" in capsys.readouterr().err


def test_strict_refuses_to_leave_a_weight_alone(float_model, tmp_path, capsys):
    assert main(["quantize", float_model, str(tmp_path / "q.onnx"), "--group-size", "200"]) == 0
    assert "left alone: 1 weight" in capsys.readouterr().out
    assert main(["quantize", float_model, str(tmp_path / "r.onnx"), "--group-size", "200", "--strict"]) == 1
    assert "shorter than the group size 200" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "r.onnx")
