"""`dyndq check --runtime-parity`: the text report, --json's shape, exit codes (0 all agree, 1 one
differs, 2 a usage error), --input/--inputs-dir, --engine, and progress on a terminal only."""
from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import pytest
from cases import call
from decoder import decoder_model, ort_quantize
from onnx import TensorProto, helper

import dyndq


@pytest.fixture(scope="module")
def qdq_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("qdq") / "qdq.onnx"
    onnx.save(ort_quantize(decoder_model(hidden=64, layers=1, vocab=128), "QDQ", 4, 32, False), path)
    return path


def bfloat16_cast_model():
    """y = Cast(x bfloat16[2, 4]) to float32."""
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT, name="cast")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_the_text_report_names_the_transformer_and_the_node(qdq_path, capsys):
    code, out, err = call(capsys, "check", "--runtime-parity", qdq_path, "--level", "basic", "--level", "all")
    assert code == 1 and err == "", err
    lines = out.splitlines()
    assert lines[0] == (f"{qdq_path}: 1 of 2 engine settings differ with the reference engine (onnx.reference) "
                        f"(max |a - b| <= 0.0001 * max |b|)")
    assert "  onnxruntime basic: agrees" in lines and "  onnxruntime all: differs" in lines
    assert any(line.startswith("    logits: differs: max |a - b| ") and "top-1 agreement" in line for line in lines)
    assert any(line.startswith("    cause: transformer QDQSelectorActionTransformer: ") for line in lines)
    assert any(line.startswith("    first divergence: node 'layer0/q_matmul_Q4' (MatMul, inputs layer0/ln1, ")
               and "run as com.microsoft::MatMulNBits" in line for line in lines), out


def test_json_has_the_shape_the_check_promises(qdq_path, capsys):
    code, out, err = call(capsys, "check", "--runtime-parity", qdq_path, "--level", "all", "--json")
    assert code == 1
    got = json.loads(out)
    assert {"model", "inputs", "comparisons"} <= set(got) and got["model"] == str(qdq_path)
    c, = got["comparisons"]
    assert {"engine", "setting", "agrees", "outputs", "causes", "first_divergence"} <= set(c)
    assert (c["engine"], c["setting"], c["agrees"]) == ("onnxruntime", "all", False)
    o, = c["outputs"]
    assert {"name", "agrees", "max_abs", "relative", "top1_agreement", "kl"} <= set(o) and o["relative"] > 1e-3
    assert [(k["kind"], k["name"]) for k in c["causes"]] == [("transformer", "QDQSelectorActionTransformer")]
    assert set(c["causes"][0]) == {"kind", "name", "what"}
    assert {"node", "op_type", "output"} <= set(c["first_divergence"])
    assert c["first_divergence"]["op_type"] == "MatMul"
    assert got["inputs"] == [{"name": "input_ids", "dtype": "int64", "shape": [4, 4], "given": False}]


def test_a_float_model_exits_0(tmp_path, capsys):
    onnx.save(decoder_model(hidden=64, layers=1, vocab=128), tmp_path / "f.onnx")
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "f.onnx")
    assert code == 0 and "every engine setting (4) agrees" in out, out + err


def test_inputs_come_from_a_folder(tmp_path, capsys):
    dyndq.save_model(bfloat16_cast_model(), tmp_path / "m.onnx")
    (tmp_path / "in").mkdir()
    import ml_dtypes

    np.save(tmp_path / "in" / "x.npy", np.arange(8, dtype=np.float32).reshape(2, 4).astype(ml_dtypes.bfloat16))
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx", "--inputs-dir", tmp_path / "in",
                          "--json")
    assert code == 0, err
    assert json.loads(out)["inputs"] == [{"name": "x", "dtype": "bfloat16", "shape": [2, 4], "given": True}]
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx", "--inputs-dir", tmp_path / "none")
    assert code == 2 and "--inputs-dir" in err and "no such folder" in err, err


@pytest.mark.parametrize("feed, words", [
    ({"x": np.zeros((2, 4), np.float64)}, ["input x:", "float64", "bfloat16[2,4]"]),
    ({"x": np.zeros((3, 4), np.float32)}, ["input x:"]),
    ({"nosuch": np.zeros((2, 4), np.float32)}, ["input nosuch:", "the graph's inputs: 'x'"]),
])
def test_a_given_feed_that_does_not_fit_is_a_usage_error_naming_the_input(tmp_path, capsys, feed, words):
    dyndq.save_model(bfloat16_cast_model(), tmp_path / "m.onnx")
    (name, value), = feed.items()
    np.save(tmp_path / "f.npy", value)
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx", "-i", f"{name}={tmp_path / 'f.npy'}")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (code, err)
    assert all(w in err for w in words), err


def related_dims_model():
    """Groups of 2 rows: w int8["r", 4] needs s float32["q", 4] with r = 2q, which example inputs
    (every open dim 4) do not give."""
    graph = helper.make_graph(
        [dyndq.make_node(["w", "s"], ["d"], qtype="per_group", group_shape=[2, 1], name="dq")], "g",
        [helper.make_tensor_value_info("w", TensorProto.INT8, ["r", 4]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, ["q", 4])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, ["r", 4])])
    return dyndq.make_model(graph, opset=21)


def test_example_inputs_that_do_not_fit_are_named_with_the_way_out(tmp_path, capsys):
    dyndq.save_model(related_dims_model(), tmp_path / "m.onnx")
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx")
    assert code == 2 and len(err.strip().splitlines()) == 1, (code, err)
    assert "example inputs made for 'w', 's'" in err and "--input NAME=FILE.npy" in err, err
    np.save(tmp_path / "w.npy", np.ones((4, 4), np.int8))
    np.save(tmp_path / "s.npy", np.full((2, 4), 0.5, np.float32))
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx", "-i", f"w={tmp_path / 'w.npy'}",
                          "-i", f"s={tmp_path / 's.npy'}")
    assert code == 0 and "every engine setting (8) agrees" in out, err


def unknown_op_model(dims):
    graph = helper.make_graph([helper.make_node("Quarter", ["x"], ["y"], domain="acme")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("acme", 1)])


def test_a_model_no_engine_runs_is_told_so_not_blamed_on_example_inputs(tmp_path, capsys):
    """Example inputs whose sizes were all given by the model (no open dim) cannot be why an
    engine fails, nor can any inputs be why it lacks an op: the failure is the engine's, exit 1,
    naming the op; with an open dim and a failure of another kind the user is asked for inputs,
    exit 2 (test_example_inputs_that_do_not_fit_are_named_with_the_way_out)."""
    import onnxruntime

    for dims in ([3], ["n"]):
        dyndq.save_model(unknown_op_model(dims), tmp_path / "m.onnx")
        code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx")
        assert code == 1 and err == (f"dyndq: {tmp_path / 'm.onnx'}: cannot run this model: ONNX Runtime "
                                     f"{onnxruntime.__version__} does not know the op acme::Quarter; it runs only the "
                                     "ops it has, and those a custom op library registers with it\n"), (code, err)


def test_openvino_asked_for_where_it_is_not_installed_is_a_usage_error(tmp_path, capsys, monkeypatch):
    from dyndq import openvino_session

    monkeypatch.setattr(openvino_session, "installed", lambda: False)
    dyndq.save_model(bfloat16_cast_model(), tmp_path / "m.onnx")
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx", "--engine", "openvino")
    assert code == 2 and "OpenVINO is not installed" in err, err
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx", "--engine", "all")
    assert code == 0 and "openvino default" not in out and "OpenVINO is not installed: ONNX Runtime only" in err, err


def test_parity_options_without_runtime_parity_are_a_usage_error(tmp_path, capsys):
    dyndq.save_model(bfloat16_cast_model(), tmp_path / "m.onnx")
    for option in (["--engine", "all"], ["--level", "all"], ["--no-diagnosis"], ["--inputs-dir", str(tmp_path)]):
        code, out, err = call(capsys, "check", tmp_path / "m.onnx", *option)
        assert code == 2 and "go with --runtime-parity" in err, (option, err)


def test_progress_goes_to_a_terminal_only(qdq_path, capsys, monkeypatch):
    code, out, err = call(capsys, "check", "--runtime-parity", qdq_path, "--level", "all")
    assert code == 1 and err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = call(capsys, "check", "--runtime-parity", qdq_path, "--level", "all")
    assert code == 1 and "onnxruntime all: bisecting 60 transformers" in err and "\r" in err
    assert "bisecting" not in out


def test_given_values_our_kernel_refuses_are_named_not_compared(tmp_path, capsys):
    """Scales that do not fit the codes, given by the user: the reference engine's kernel names the
    problem (exit 1), rather than the check comparing engines on values the op does not define."""
    dyndq.save_model(related_dims_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "w.npy", np.ones((4, 4), np.int8))
    np.save(tmp_path / "s.npy", np.full((3, 4), 0.5, np.float32))
    code, out, err = call(capsys, "check", "--runtime-parity", tmp_path / "m.onnx", "-i", f"w={tmp_path / 'w.npy'}",
                          "-i", f"s={tmp_path / 's.npy'}")
    assert code == 1 and out == "" and "scales" in err and "agrees" not in err, err
