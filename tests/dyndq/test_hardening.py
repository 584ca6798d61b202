"""Findings of the adversarial trial (issue 11), one test (or a few) per numbered point.
Each failed on the code before its fix."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.cli import main


def call(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def matmul_model() -> onnx.ModelProto:
    """y = x @ DynamicDequantize(w, s): x float32[2, 3], w int8[3, 2]."""
    node = dyndq.make_node(["w", "s"], ["wf"], name="dq")
    g = helper.make_graph(
        [node, helper.make_node("MatMul", ["x", "wf"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 2])],
        [nh.from_array(np.arange(6, dtype=np.int8).reshape(3, 2), "w"), nh.from_array(np.array([0.5], np.float32), "s")])
    return dyndq.make_model(g)


def dq_input_model() -> onnx.ModelProto:
    """y = DynamicDequantize(w, s) with both as graph inputs of free shape."""
    g = helper.make_graph(
        [dyndq.make_node(["w", "s"], ["y"], name="dq")], "g",
        [helper.make_tensor_value_info("w", T.INT8, [None, None]), helper.make_tensor_value_info("s", T.FLOAT, [1])],
        [helper.make_tensor_value_info("y", T.FLOAT, [None, None])])
    return dyndq.make_model(g)


X = np.arange(6, dtype=np.float32).reshape(2, 3)
Y = X @ (np.arange(6, dtype=np.float32).reshape(3, 2) * np.float32(0.5))


# -- 1. non-native byte order ------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_1_big_endian_feeds_give_the_right_answer(engine):
    y = dyndq.run(matmul_model(), {"x": X.astype(">f4")}, engine=engine)["y"]
    assert np.array_equal(y, Y)


def test_1_big_endian_npy_through_the_cli(capsys, tmp_path):
    from dyndq.files import save_model

    save_model(matmul_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", X.astype(">f4"))
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}",
                          "--engine", "onnxruntime", "--output-dir", tmp_path / "out")
    assert code == 0, err
    assert np.array_equal(np.load(tmp_path / "out" / "y.npy"), Y)


# -- 16. np.matrix feeds -------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_16_matrix_feed_runs(engine):
    w = np.matrix(np.ones((2, 2**18), np.int8))
    y = dyndq.run(dq_input_model(), {"w": w, "s": np.array([0.5], np.float32)}, engine=engine)["y"]
    assert type(y) is np.ndarray and y.shape == (2, 2**18) and np.all(y == 0.5)


# -- 2. types per graph scope ------------------------------------------------------------------

def _branch(name: str, zp_dtype, n: int, axis: int) -> onnx.GraphProto:
    """A body that makes its own `zp` and `sc` (the same names in both branches)."""
    nodes = [helper.make_node("Constant", [], ["zp"], value=nh.from_array(np.arange(n).astype(zp_dtype))),
             helper.make_node("Constant", [], ["sc"], value=nh.from_array(np.full(n, 0.5, np.float32))),
             dyndq.make_node(["w", "sc", "zp"], [f"o_{name}"], name=f"dq_{name}", qtype="per_channel", axis=axis)]
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"o_{name}", T.FLOAT, [4, 3])])


def if_model(then_branch, else_branch) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch)], "g",
        [helper.make_tensor_value_info("c", T.BOOL, []), helper.make_tensor_value_info("w", T.INT8, [4, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [4, 3])])
    return dyndq.make_model(g)


W43 = np.arange(12, dtype=np.int8).reshape(4, 3)


def _expected(zp_dtype, n, axis):
    shape = (n, 1) if axis == 0 else (1, n)
    return ((W43.astype(np.int64) - np.arange(n).astype(zp_dtype).astype(np.int64).reshape(shape))
            .astype(np.float32) * np.float32(0.5))


@pytest.mark.parametrize("then_, else_", [
    ((np.int32, 4, 0), (np.int8, 4, 0)),   # zp int32 in one branch, int8 in the other
    ((np.int8, 4, 0), (np.int32, 4, 0)),
    ((np.int8, 3, 1), (np.int8, 4, 0)),    # sc with 3 elements in one, 4 in the other
])
def test_2_sibling_branches_keep_their_own_types(then_, else_):
    m = if_model(_branch("then", *then_), _branch("else", *else_))
    assert dyndq.check(m) == []
    exported = dyndq.export(m)
    onnx.checker.check_model(exported, full_check=True)
    for c, spec in ((True, then_), (False, else_)):
        for engine in ("reference", "onnxruntime"):
            y = dyndq.run(m, {"c": np.array(c), "w": W43}, engine=engine)["y"]
            assert np.array_equal(y, _expected(*spec)), (c, engine)


def test_2_a_body_still_sees_outer_values():
    from dyndq.scopes import value_types

    m = if_model(_branch("then", np.int8, 4, 0), _branch("else", np.int32, 3, 1))
    types = value_types(m)
    then_, else_ = types.at("main/if.then_branch"), types.at("main/if.else_branch")
    assert then_["w"].tensor_type.elem_type == else_["w"].tensor_type.elem_type == T.INT8  # from main
    assert then_["zp"].tensor_type.elem_type == T.INT8 and else_["zp"].tensor_type.elem_type == T.INT32
    assert "zp" not in types.at("main")


# -- 3. Loop with its cond omitted ---------------------------------------------------------------

def loop_model(with_cond: bool) -> onnx.ModelProto:
    """acc = sum over 3 iterations of DynamicDequantize(w, s), with Loop's cond given or omitted."""
    body = helper.make_graph(
        [dyndq.make_node(["w", "s"], ["d"], name="dq"),
         helper.make_node("Add", ["acc_in", "d"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond_in", T.BOOL, []),
         helper.make_tensor_value_info("acc_in", T.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), helper.make_tensor_value_info("acc_out", T.FLOAT, [3])])
    inits = [nh.from_array(np.array(3, np.int64), "M"), nh.from_array(np.zeros(3, np.float32), "acc0"),
             nh.from_array(np.array([1, -2, 3], np.int8), "w"), nh.from_array(np.array([0.5], np.float32), "s")]
    if with_cond:
        inits.append(nh.from_array(np.array(True), "c"))
    g = helper.make_graph([helper.make_node("Loop", ["M", "c" if with_cond else "", "acc0"], ["acc"], body=body)], "g",
                          [], [helper.make_tensor_value_info("acc", T.FLOAT, [3])], inits)
    return dyndq.make_model(g)


@pytest.mark.parametrize("with_cond", [True, False])
@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_3_loop_without_cond_runs_its_iterations(engine, with_cond):
    acc = dyndq.run(loop_model(with_cond), {}, engine=engine)["acc"]
    assert np.array_equal(acc, np.array([1.5, -3.0, 4.5], np.float32))


# -- 4. sequence outputs ------------------------------------------------------------------------

def sequence_model() -> onnx.ModelProto:
    g = helper.make_graph(
        [dyndq.make_node(["a", "s"], ["da"], name="dqa"), dyndq.make_node(["b", "s"], ["db"], name="dqb"),
         helper.make_node("SequenceConstruct", ["da", "db"], ["seq"])], "g",
        [helper.make_tensor_value_info("a", T.INT8, [2]), helper.make_tensor_value_info("b", T.INT8, [None])],
        [helper.make_tensor_sequence_value_info("seq", T.FLOAT, None)],
        [nh.from_array(np.array([0.5], np.float32), "s")])
    return dyndq.make_model(g)


A, B = np.array([1, 2], np.int8), np.array([3, 4, 5], np.int8)


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
@pytest.mark.parametrize("b", [B, np.array([3, 4], np.int8)])  # shapes that differ, and shapes that stack
def test_4_sequence_output_is_a_list(engine, b):
    seq = dyndq.run(sequence_model(), {"a": A, "b": b}, engine=engine)["seq"]
    assert isinstance(seq, list) and len(seq) == 2
    assert np.array_equal(seq[0], A * np.float32(0.5)) and np.array_equal(seq[1], b * np.float32(0.5))


def test_4_cli_saves_and_summarizes_each_item(capsys, tmp_path):
    from dyndq.files import save_model

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


# -- 7. output names that clean up to one file name ------------------------------------------------

def identity_model(names: list[str]) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], [n]) for n in names] + [dyndq.make_node(["q", "s"], ["unused"])], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2]), helper.make_tensor_value_info("k", T.FLOAT, [1])],
        [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in names],
        [nh.from_array(np.array([1], np.int8), "q"), nh.from_array(np.array([1.0], np.float32), "s")])
    return dyndq.make_model(g)


@pytest.mark.parametrize("names", [["a/b", "a_b"], ["ä", "ö"], ["y", "..", "."]])
def test_7_every_output_gets_a_file_of_its_own(capsys, tmp_path, names):
    from dyndq.files import save_model

    save_model(identity_model(names), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.array([1, 2], np.float32))
    np.save(tmp_path / "k.npy", np.array([3], np.float32))
    out_dir = tmp_path / "out"
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}",
                          "-i", f"k={tmp_path / 'k.npy'}", "--output-dir", out_dir)
    assert code == 0, err
    files = sorted(os.listdir(out_dir))
    assert len(files) == len(names), files
    assert all(f.endswith(".npy") and not f.startswith(".") for f in files), files


def test_7_names_equal_but_for_case_are_refused(capsys, tmp_path):
    from dyndq.files import save_model

    save_model(identity_model(["y", "Y"]), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.array([1, 2], np.float32))
    np.save(tmp_path / "k.npy", np.array([3], np.float32))
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}",
                          "-i", f"k={tmp_path / 'k.npy'}", "--output-dir", tmp_path / "out")
    assert code == 2 and "'y' and 'Y'" in err, err
    assert not os.path.exists(tmp_path / "out")


# -- 8. stdout closed early ------------------------------------------------------------------------

def _run_with_stdout_closed(args, cwd):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "dyndq", *map(str, args)], cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first line (as `| head -0`)
    err = p.stderr.read().decode()
    return p.wait(), err


def test_8_run_finishes_its_work_when_stdout_closes(tmp_path):
    from dyndq.files import save_model

    save_model(sequence_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "a.npy", A)
    np.save(tmp_path / "b.npy", B)
    code, err = _run_with_stdout_closed(["run", "m.onnx", "-i", "a=a.npy", "-i", "b=b.npy", "--output-dir", "out"],
                                        tmp_path)
    assert code == 0 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path / "out")) == ["seq.0.npy", "seq.1.npy"]


def test_8_demo_writes_its_files_when_stdout_closes(tmp_path):
    code, err = _run_with_stdout_closed(["demo", "--out", "d"], tmp_path)
    assert code == 0 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path / "d")) == ["model.exported.onnx", "model.onnx", "x.npy"]
