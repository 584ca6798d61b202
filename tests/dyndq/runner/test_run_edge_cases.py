"""Running at its edges: feeds of another byte order or np.matrix, sequence outputs, engines that
cannot be built (one line), a bad feed found while running named with its node, ONNX Runtime
logging nothing to stderr.

Each of these failed on the code before its fix."""
from __future__ import annotations


import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from cases import A, B, X, Y, call, dq_input_model, matmul_model, sequence_model


# -- non-native byte order ------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_big_endian_feeds_give_the_right_answer(engine):
    y = dyndq.run(matmul_model(), {"x": X.astype(">f4")}, engine=engine)["y"]
    assert np.array_equal(y, Y)


def test_big_endian_npy_through_the_cli(capsys, tmp_path):
    from dyndq.model_files import save_model

    save_model(matmul_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", X.astype(">f4"))
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}",
                          "--engine", "onnxruntime", "--output-dir", tmp_path / "out")
    assert code == 0, err
    assert np.array_equal(np.load(tmp_path / "out" / "y.npy"), Y)


# -- np.matrix feeds -------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_matrix_feed_runs(engine):
    w = np.matrix(np.ones((2, 2**18), np.int8))
    y = dyndq.run(dq_input_model(), {"w": w, "s": np.array([0.5], np.float32)}, engine=engine)["y"]
    assert type(y) is np.ndarray and y.shape == (2, 2**18) and np.all(y == 0.5)


# -- sequence outputs ------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
@pytest.mark.parametrize("b", [B, np.array([3, 4], np.int8)])  # shapes that differ, and shapes that stack
def test_sequence_output_is_a_list(engine, b):
    seq = dyndq.run(sequence_model(), {"a": A, "b": b}, engine=engine)["seq"]
    assert isinstance(seq, list) and len(seq) == 2
    assert np.array_equal(seq[0], A * np.float32(0.5)) and np.array_equal(seq[1], b * np.float32(0.5))


def test_cli_saves_and_summarizes_each_item(capsys, tmp_path):
    from dyndq.model_files import save_model

    save_model(sequence_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "a.npy", A)
    np.save(tmp_path / "b.npy", B)
    inputs = ["-i", f"a={tmp_path / 'a.npy'}", "-i", f"b={tmp_path / 'b.npy'}"]
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", *inputs)
    assert code == 0, err
    assert "seq: a sequence of 2 tensors" in out and "seq[0]: float32[2]" in out and "seq[1]: float32[3]" in out
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", *inputs, "--output-dir", tmp_path / "out")
    assert code == 0, err
    assert np.array_equal(np.load(tmp_path / "out" / "seq.0.npy"), A * np.float32(0.5))
    assert np.array_equal(np.load(tmp_path / "out" / "seq.1.npy"), B * np.float32(0.5))


# -- engines that cannot be built -------------------------------------------------------------

def test_engine_build_failures_are_one_line(capsys, tmp_path):
    from dyndq.model_files import save_model

    g = helper.make_graph([helper.make_node("FastGelu", ["y0"], ["y"], domain="com.microsoft"),
                           dyndq.make_node(["w", "s"], ["y0"], name="dq")], "g",
                          [helper.make_tensor_value_info("w", T.INT8, [3])], [helper.make_tensor_value_info("y", T.FLOAT, [3])],
                          [nh.from_array(np.array([0.5], np.float32), "s")])
    m = dyndq.make_model(g)
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    save_model(m, tmp_path / "ms.onnx")
    m.graph.node[0].domain = "acme"  # an op nobody has
    m.opset_import[-1].domain = "acme"
    save_model(m, tmp_path / "acme.onnx")
    np.save(tmp_path / "w.npy", np.ones(3, np.int8))
    for model, engine in (("ms.onnx", "reference"), ("acme.onnx", "onnxruntime"), ("acme.onnx", "reference")):
        code, out, err = call(capsys, "run", tmp_path / model, "-i", f"w={tmp_path / 'w.npy'}", "--engine", engine)
        assert code == 1 and "Traceback" not in err and "[ONNXRuntimeError]" not in err, err
        if engine == "reference":  # (ONNX Runtime's engine is an export first, which lists the problems)
            assert "cannot run this model" in err and len(err.strip().splitlines()) == 1, err


def test_an_engine_error_of_many_lines_is_told_by_the_line_that_says_what_failed(capsys, tmp_path, monkeypatch):
    from dyndq import runner
    from dyndq.model_files import save_model

    def refuses(*args, **kwargs):  # (as OpenVINO words it: where it was thrown first, what failed last)
        raise RuntimeError("Exception from src/inference/src/cpp/core.cpp:112:\n"
                           "OpenVINO does not support the following ONNX operations: acme.Quarter\n")

    save_model(matmul_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", X)
    monkeypatch.setattr(runner, "runner", refuses)
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}")
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith("cannot run this model: OpenVINO does not support the following ONNX "
                                "operations: acme.Quarter"), err


# -- run names the node and the value; one exit code for both engines; no ORT log lines ------------

def _scales_too_long(tmp_path):
    """m.onnx, a per_channel node 'dq' whose scales 's' have a free length, with feeds w.npy
    and s.npy: 5 scales for 3 channels, found only while running."""
    from dyndq.model_files import save_model

    g = helper.make_graph([dyndq.make_node(["w", "s"], ["y"], name="dq", qtype="per_channel", axis=0)], "g",
                          [helper.make_tensor_value_info("w", T.INT8, [3, 2]), helper.make_tensor_value_info("s", T.FLOAT, ["n"])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [3, 2])])
    save_model(dyndq.make_model(g), tmp_path / "m.onnx")
    np.save(tmp_path / "w.npy", np.ones((3, 2), np.int8))
    np.save(tmp_path / "s.npy", np.ones(5, np.float32))


def test_a_bad_feed_found_while_running(capsys, tmp_path):
    _scales_too_long(tmp_path)
    codes = set()
    for engine in ("reference", "onnxruntime"):
        code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"w={tmp_path / 'w.npy'}",
                              "-i", f"s={tmp_path / 's.npy'}", "--engine", engine)
        codes.add(code)
        assert "'dq'" in err and len(err.strip().splitlines()) == 1 and "\x1b[" not in err, err
        if engine == "reference":
            assert "(value 's')" in err and "input scales" not in err
    assert codes == {1}


def test_onnxruntime_logs_nothing_to_stderr(tmp_path):
    import subprocess
    import sys

    _scales_too_long(tmp_path)
    r = subprocess.run([sys.executable, "-m", "dyndq", "run", "m.onnx", "-i", "w=w.npy", "-i", "s=s.npy", "--engine", "onnxruntime"],
                       cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and "\x1b[" not in r.stderr, r.stderr


# -- run --output-dir leaves no folder of its own behind when it fails ------------------------------

def test_a_failed_run_leaves_no_output_folder_it_made(capsys, tmp_path):
    _scales_too_long(tmp_path)
    run = ("run", tmp_path / "m.onnx", "-i", f"w={tmp_path / 'w.npy'}")
    bad_feed = ("-i", f"s={tmp_path / 'w.npy'}")  # int8 where the graph takes float32: exit 2
    found_while_running = ("-i", f"s={tmp_path / 's.npy'}")  # 5 scales for 3 channels: exit 1
    for extra, expected in ((bad_feed, 2), (found_while_running, 1)):
        for engine in ("reference", "onnxruntime"):
            code, out, err = call(capsys, *run, *extra, "--engine", engine, "--output-dir", tmp_path / "new" / "deeper")
            assert code == expected, err
            assert not (tmp_path / "new").exists()
    (tmp_path / "mine").mkdir()  # a folder that was there before is left as it was
    code, out, err = call(capsys, *run, *bad_feed, "--output-dir", tmp_path / "mine" / "new")
    assert code == 2 and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "mine", "s.npy", "w.npy"]
    assert list((tmp_path / "mine").iterdir()) == []
    np.save(tmp_path / "s3.npy", np.ones(3, np.float32))
    code, out, err = call(capsys, *run, "-i", f"s={tmp_path / 's3.npy'}", "--output-dir", tmp_path / "new")
    assert code == 0 and (tmp_path / "new" / "y.npy").is_file(), err
