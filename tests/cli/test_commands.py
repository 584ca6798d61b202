"""The dyndq command line, through its real entry points: `cli.main(argv)` for
every command and error path, and a few real subprocesses (`python -m dyndq`,
the `dyndq` console script)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
from cases import MATMUL_ATOL, MATMUL_RTOL, close_after_matmul, same_values
from dyndq.cli import main
from dyndq.demo import build_model, demo_input
from dyndq.model_files import save_model


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    model = build_model()
    save_model(model, d / "model.onnx")
    save_model(dyndq.export(model), d / "model.exported.onnx")
    np.save(d / "x.npy", demo_input())
    return d


@pytest.fixture
def models(demo_files, tmp_path):
    """A fresh copy of the demo files for each test, so tests never share outputs."""
    for f in os.listdir(demo_files):
        shutil.copy(demo_files / f, tmp_path / f)
    return tmp_path


def invalid_model() -> onnx.ModelProto:
    node = helper.make_node("DynamicDequantize", ["w", "s", "z"], ["d"], name="dq", domain=dyndq.DOMAIN,
                            qtype="per_channel", axis=2)
    graph = helper.make_graph(
        [node, helper.make_node("MatMul", ["x", "d"], ["y"], name="mm")],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [
            numpy_helper.from_array(np.zeros((4, 3), np.int8), "w"),
            numpy_helper.from_array(np.ones(3, np.float64), "s"),
            numpy_helper.from_array(np.zeros(3, np.int64), "z"),
        ],
    )
    return dyndq.make_model(graph)


def call(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_plain_error(err: str, *words: str, lines: int = 2):
    assert err.strip(), "expected a message on stderr"
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) <= lines, err
    for w in words:
        assert w in err, (w, err)


# -- schema ---------------------------------------------------------------------------------


def test_schema(capsys):
    code, out, err = call(capsys, "schema")
    assert code == 0 and err == ""
    assert out.startswith("org.dyndq::DynamicDequantize, version 1")
    for section in ("inputs", "outputs", "attributes", "type constraints"):
        assert f"\n{section}\n" in out
    op = dyndq.DYNAMIC_DEQUANTIZE_1
    for p in op.inputs + op.outputs:
        assert p.name in out
    assert "zps     T3    optional" in out
    assert '"per_tensor"' in out and '"per_channel"' in out  # qtype's default and allowed values
    for c in op.type_constraints:
        assert f"{c.name}    {', '.join(c.dtypes)}" in out


# -- check ----------------------------------------------------------------------------------


def test_check_valid(capsys, models):
    code, out, err = call(capsys, "check", models / "model.onnx")
    assert (code, err) == (0, "")
    assert out == f"{models / 'model.onnx'}: valid (no problems found)\n"


def test_check_valid_json(capsys, models):
    code, out, _ = call(capsys, "check", models / "model.onnx", "--json")
    assert code == 0
    assert json.loads(out) == {"model": str(models / "model.onnx"), "valid": True, "problems": []}


def test_check_problems(capsys, tmp_path):
    save_model(invalid_model(), tmp_path / "bad.onnx")
    code, out, err = call(capsys, "check", tmp_path / "bad.onnx")
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"{tmp_path / 'bad.onnx'}: 3 problems"
    assert all("node 0 'dq'" in line for line in lines[1:])
    assert any("scales: found dtype float64" in line for line in lines)
    assert any("zps: found dtype int64" in line for line in lines)
    assert any("axis: found 2" in line for line in lines)


def test_check_problems_json(capsys, tmp_path):
    save_model(invalid_model(), tmp_path / "bad.onnx")
    code, out, _ = call(capsys, "check", tmp_path / "bad.onnx", "--json")
    assert code == 1
    result = json.loads(out)
    assert result["valid"] is False
    assert {p["argument"] for p in result["problems"]} == {"scales", "zps", "axis"}
    assert all(p["node"] == "dq" and p["node_index"] == 0 and p["graph"] == "main" for p in result["problems"])
    assert set(result["problems"][0]) == {"argument", "found", "allowed", "op", "node", "node_index", "graph"}


def test_check_reports_onnx_checker_problems(capsys, tmp_path):
    model = build_model()
    next(n for n in model.graph.node if n.op_type == "MatMul").input[0] = "nowhere"  # reads a value nothing makes
    save_model(model, tmp_path / "m.onnx")
    code, out, _ = call(capsys, "check", tmp_path / "m.onnx")
    assert code == 1
    assert "onnx.checker" in out and "nowhere" in out


# -- file errors, for every command reading a model ----------------------------------------


@pytest.mark.parametrize("command", [["check"], ["export", "{out}"], ["lift", "{out}"], ["run"]])
@pytest.mark.parametrize(
    "content, words",
    [
        (None, "no such file"),
        (b"hello, I am not a model\n", "not an ONNX model"),
        (b"", "not an ONNX model"),
    ],
)
def test_unreadable_model(capsys, tmp_path, command, content, words):
    path = tmp_path / "m.onnx"
    if content is not None:
        path.write_bytes(content)
    argv = [command[0], path] + [a.format(out=tmp_path / "out.onnx") for a in command[1:]]
    code, out, err = call(capsys, *argv)
    assert code == 2 and out == ""
    assert_plain_error(err, str(path), words, lines=1)
    assert not (tmp_path / "out.onnx").exists()


def test_model_is_a_folder(capsys, tmp_path):
    code, _, err = call(capsys, "check", tmp_path)
    assert code == 2
    assert_plain_error(err, "is a folder")


def test_external_data_outside_folder_is_refused(capsys, tmp_path):
    inner = tmp_path / "inner"
    inner.mkdir()
    save_model(build_model(), inner / "m.onnx", external_data=True)
    os.replace(inner / "m.onnx.data", tmp_path / "elsewhere.data")
    m = onnx.load(inner / "m.onnx", load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../elsewhere.data"
    onnx.save_model(m, inner / "m.onnx")
    code, _, err = call(capsys, "check", inner / "m.onnx")
    assert code == 2
    assert_plain_error(err, "refused", "outside", lines=1)


# -- export ---------------------------------------------------------------------------------


def test_export(capsys, models):
    src = models / "model.onnx"
    before = src.read_bytes()
    code, out, err = call(capsys, "export", src, models / "out.onnx")
    assert (code, err) == (0, "")
    assert out == f"wrote {models / 'out.onnx'}: lowered 3 DynamicDequantize node(s); ai.onnx opset 21, IR version 10\n"
    assert src.read_bytes() == before  # the input is never modified
    exported = onnx.load(models / "out.onnx")
    onnx.checker.check_model(exported, full_check=True)
    assert not any(n.domain == dyndq.DOMAIN for n in exported.graph.node)
    assert [o.domain for o in exported.opset_import] == [""]
    x = demo_input()
    assert close_after_matmul(dyndq.run(exported, {"x": x}, engine="onnxruntime")["y"],
                              dyndq.run(build_model(), {"x": x})["y"])


def test_export_opset(capsys, models):
    # (the demo's int4 weights need opset 21: the conversion goes up)
    code, out, _ = call(capsys, "export", models / "model.onnx", models / "out.onnx", "--opset", "23")
    assert code == 0 and "ai.onnx opset 23 (converted from 21)" in out
    assert next(o.version for o in onnx.load(models / "out.onnx").opset_import if o.domain == "") == 23


def test_export_opset_too_low(capsys, models):
    code, out, err = call(capsys, "export", models / "model.onnx", models / "out.onnx", "--opset", "9")
    assert code == 2 and out == ""
    assert_plain_error(err, "opset 9 is too low", lines=1)
    assert not (models / "out.onnx").exists()


@pytest.mark.parametrize("opset", ["eleven", ""])
def test_export_opset_not_a_number(capsys, models, opset):
    code, _, err = call(capsys, "export", models / "model.onnx", models / "out.onnx", "--opset", opset)
    assert code == 2
    assert_plain_error(err, "--opset", "invalid int value")


def test_export_invalid_model(capsys, tmp_path):
    save_model(invalid_model(), tmp_path / "bad.onnx")
    code, out, err = call(capsys, "export", tmp_path / "bad.onnx", tmp_path / "out.onnx")
    assert code == 1 and out == ""
    assert "3 problems" in err and "Traceback" not in err
    assert not (tmp_path / "out.onnx").exists()


def test_export_in_place(capsys, models):
    path = models / "model.onnx"
    before = path.read_bytes()
    code, _, err = call(capsys, "export", path, path)  # (a model passed in is never modified, unless asked)
    assert code == 2 and path.read_bytes() == before
    assert_plain_error(err, "is the input model itself; write to another file, or add --overwrite", lines=1)
    code, _, _ = call(capsys, "export", path, path, "--overwrite")
    assert code == 0
    assert not any(n.domain == dyndq.DOMAIN for n in onnx.load(path).graph.node)
    assert sorted(os.listdir(models)) == ["model.exported.onnx", "model.onnx", "x.npy"]  # nothing left behind


def test_export_to_missing_folder(capsys, models):
    code, _, err = call(capsys, "export", models / "model.onnx", models / "no" / "out.onnx")
    assert code == 2
    assert_plain_error(err, "folder does not exist", lines=1)


def test_export_keeps_external_data(capsys, tmp_path):
    save_model(build_model(), tmp_path / "m.onnx", external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    code, _, _ = call(capsys, "export", tmp_path / "m.onnx", tmp_path / "e.onnx")
    assert code == 0
    assert sorted(os.listdir(tmp_path)) == ["e.onnx", "e.onnx.data", "m.onnx", "m.onnx.data"]
    exported = dyndq.load_model(tmp_path / "e.onnx")
    x = demo_input()
    assert close_after_matmul(dyndq.run(exported, {"x": x}, engine="onnxruntime")["y"], dyndq.run(build_model(), {"x": x})["y"])
    # Rewriting in place writes the data to a new file and keeps the old one (a copy of the
    # model made before may point into it), and says so.
    code, out, _ = call(capsys, "lift", tmp_path / "e.onnx", tmp_path / "e.onnx", "--overwrite")
    assert code == 0 and "kept e.onnx.data" in out
    assert sorted(os.listdir(tmp_path)) == ["e.onnx", "e.onnx.1.data", "e.onnx.data", "m.onnx", "m.onnx.data"]


# -- lift -----------------------------------------------------------------------------------


def _dequantize_linear_model() -> onnx.ModelProto:
    """Two DequantizeLinear: one DynamicDequantize can express, one it cannot (blocked, on an x
    fed at run time whose shape is not known: per_group needs exact division)."""
    inits = [
        numpy_helper.from_array(np.array([[1, -2], [3, 4]], np.int8), "q"),
        numpy_helper.from_array(np.array(0.5, np.float32), "s"),
        numpy_helper.from_array(np.array(1, np.int8), "z"),
        numpy_helper.from_array(np.array([[0.5, 0.25]], np.float32), "s16"),
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"], name="dql"),
        helper.make_node("DequantizeLinear", ["q16", "s16"], ["w16"], name="dql16", axis=0, block_size=2),
        helper.make_node("Add", ["w", "w16"], ["sum"], name="add"),
        helper.make_node("MatMul", ["x", "sum"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
         helper.make_tensor_value_info("q16", TensorProto.INT16, ["a", "b"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def test_lift(capsys, tmp_path):
    save_model(_dequantize_linear_model(), tmp_path / "dql.onnx")
    code, out, err = call(capsys, "lift", tmp_path / "dql.onnx", tmp_path / "lifted.onnx")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == (f"wrote {tmp_path / 'lifted.onnx'}: lifted 1 DequantizeLinear node(s); left 1 alone; "
                        "ai.onnx opset 21, IR version 10")
    assert "dql16" in lines[1] and "left alone" in lines[1]
    lifted = onnx.load(tmp_path / "lifted.onnx")
    assert [n.op_type for n in lifted.graph.node] == ["DynamicDequantize", "DequantizeLinear", "Add", "MatMul"]
    feeds = {"x": np.array([[1.5, -2.0]], np.float32), "q16": np.array([[1, 2], [3, 4]], np.int16)}
    ref = dyndq.run(lifted, feeds)
    assert close_after_matmul(ref["y"], dyndq.run(lifted, feeds, engine="onnxruntime")["y"])


def test_lift_of_export_round_trip(capsys, models):
    code, out, _ = call(capsys, "lift", models / "model.exported.onnx", models / "lifted.onnx")
    assert code == 0 and out.startswith(f"wrote {models / 'lifted.onnx'}: lifted 3 DequantizeLinear node(s)")
    x = demo_input()
    lifted = onnx.load(models / "lifted.onnx")
    assert same_values(dyndq.run(lifted, {"x": x})["y"], dyndq.run(build_model(), {"x": x})["y"])


# -- run ------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", [[], ["--engine", "reference"], ["--engine", "onnxruntime"]])
def test_run_prints_a_summary(capsys, models, engine):
    code, out, err = call(capsys, "run", models / "model.onnx", "--input", f"x={models / 'x.npy'}", *engine)
    assert (code, err) == (0, "")
    y = dyndq.run(build_model(), {"x": demo_input()})["y"]
    assert out.startswith("y: float32[4, 16]  min ")
    # y comes out of float32 MatMuls, summed in each engine's (and BLAS's) own order: its
    # figures are compared within the MatMul tolerance, not digit for digit
    shown_max = float(re.search(r"max (\S+)", out).group(1))
    assert np.isclose(shown_max, y.max(), rtol=MATMUL_RTOL * 10, atol=MATMUL_ATOL) and "first [" in out
    assert len(out.splitlines()) == 1


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_run_writes_outputs(capsys, models, engine):
    outdir = models / "outs" / "deeper"
    code, out, err = call(capsys, "run", models / "model.onnx", "-i", f"x={models / 'x.npy'}",
                          "--engine", engine, "--output-dir", outdir)
    assert (code, err) == (0, "")
    assert out == f"wrote {outdir / 'y.npy'}: float32[4, 16]\n"
    assert os.listdir(outdir) == ["y.npy"]
    expected = dyndq.run(build_model(), {"x": demo_input()})["y"]
    got = np.load(outdir / "y.npy")
    # the same engine gives the same bits; ONNX Runtime sums its MatMuls in its own order
    assert same_values(got, expected) if engine == "reference" else close_after_matmul(got, expected)


def test_run_output_names_are_made_safe(capsys, tmp_path):
    node = dyndq.make_node(["src", "scales"], ["out/with:odd name"], name="dq")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("src", TensorProto.UINT8, [3]),
         helper.make_tensor_value_info("scales", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("out/with:odd name", TensorProto.FLOAT, [3])],
    )
    save_model(dyndq.make_model(graph), tmp_path / "m.onnx")
    np.save(tmp_path / "src.npy", np.array([0, 10, 20], np.uint8))
    np.save(tmp_path / "scales.npy", np.array(0.5, np.float32))
    code, out, _ = call(capsys, "run", tmp_path / "m.onnx", "-i", f"src={tmp_path / 'src.npy'}",
                        "-i", f"scales={tmp_path / 'scales.npy'}", "--output-dir", tmp_path / "o")
    assert code == 0
    assert os.listdir(tmp_path / "o") == ["out_with_odd_name.npy"]
    assert np.load(tmp_path / "o" / "out_with_odd_name.npy").tolist() == [0.0, 5.0, 10.0]


def test_run_invalid_model(capsys, tmp_path):
    save_model(invalid_model(), tmp_path / "bad.onnx")
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
    code, out, err = call(capsys, "run", tmp_path / "bad.onnx", "-i", f"x={tmp_path / 'x.npy'}")
    assert code == 1 and out == ""
    assert "3 problems" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "spec, words",
    [
        ("x", "expected NAME=FILE.npy"),
        ("=x.npy", "expected NAME=FILE.npy"),
        ("x=", "expected NAME=FILE.npy"),
        ("x={dir}/missing.npy", "no such file"),
        ("x={dir}/model.onnx", "not a .npy file"),
        ("x={dir}/arrays.npz", ".npz archive"),
        ("x={dir}/truncated.npy", "cannot read it"),
        ("x={dir}/objects.npy", "cannot read it"),
    ],
)
def test_run_bad_input_spec(capsys, models, spec, words):
    np.savez(models / "arrays.npz", x=demo_input())
    (models / "truncated.npy").write_bytes((models / "x.npy").read_bytes()[:100])
    np.save(models / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    code, out, err = call(capsys, "run", models / "model.onnx", "--input", spec.format(dir=models))
    assert code == 2 and out == ""
    assert_plain_error(err, "--input", words, lines=1)


def test_run_input_given_twice(capsys, models):
    spec = f"x={models / 'x.npy'}"
    code, _, err = call(capsys, "run", models / "model.onnx", "-i", spec, "-i", spec)
    assert code == 2
    assert_plain_error(err, "given twice", lines=1)


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
@pytest.mark.parametrize(
    "array, name, words",
    [
        (np.zeros((4, 64), np.float64), "x", ["input x:", "float64", "float32[batch,64]"]),
        (np.zeros((4, 64, 1), np.float32), "x", ["input x:", "rank 3"]),
        (np.zeros((4, 63), np.float32), "x", ["input x:", "dimension 1 is 63"]),
    ],
)
def test_run_wrong_feed(capsys, models, engine, array, name, words):
    np.save(models / "bad.npy", array)
    code, out, err = call(capsys, "run", models / "model.onnx", "-i", f"{name}={models / 'bad.npy'}", "--engine", engine)
    assert code == 2 and out == ""
    assert_plain_error(err, str(models / "model.onnx"), *words, lines=1)


def test_run_unknown_and_missing_input(capsys, models):
    code, _, err = call(capsys, "run", models / "model.onnx", "-i", f"z={models / 'x.npy'}")
    assert code == 2
    assert_plain_error(err, "input z:", "no input of that name", "input x:", "no feed", lines=3)
    code, _, err = call(capsys, "run", models / "model.onnx")
    assert code == 2
    assert_plain_error(err, "input x: found no feed", lines=1)


def test_run_unknown_engine(capsys, models):
    code, out, err = call(capsys, "run", models / "model.onnx", "-i", f"x={models / 'x.npy'}", "--engine", "tvm")
    assert code == 2 and out == ""
    assert_plain_error(err, "invalid choice: 'tvm'", "reference", "onnxruntime")


def test_run_output_dir_is_a_file(capsys, models):
    code, _, err = call(capsys, "run", models / "model.onnx", "-i", f"x={models / 'x.npy'}", "--output-dir", models / "x.npy")
    assert code == 2
    assert_plain_error(err, "not a folder", lines=1)


# -- usage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, words",
    [
        ([], "COMMAND"),
        (["frob"], "invalid choice: 'frob'"),
        (["check"], "MODEL"),
        (["export", "a.onnx"], "OUT"),
        (["check", "m.onnx", "--frob"], "unrecognized arguments"),
    ],
)
def test_usage_errors(capsys, argv, words):
    code, out, err = call(capsys, *argv)
    assert code == 2 and out == ""
    assert_plain_error(err, words)


def test_help_and_version(capsys):
    code, out, _ = call(capsys, "--help")
    assert code == 0
    for command in ("demo", "check", "export", "lift", "run", "schema"):
        assert command in out
    assert "Exit codes" in out
    code, out, _ = call(capsys, "--version")
    assert code == 0 and out.strip() == f"dyndq {dyndq.__version__}"


def test_demo_out_is_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    code, _, err = call(capsys, "demo", "--out", tmp_path / "f")
    assert code == 2
    assert_plain_error(err, "not a folder", lines=1)


# -- real processes -----------------------------------------------------------------------------


def _process(*argv, cwd=None):
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=120)


def test_python_dash_m(models):
    p = _process(sys.executable, "-m", "dyndq", "check", str(models / "model.onnx"))
    assert (p.returncode, p.stderr) == (0, "")
    assert p.stdout.endswith("valid (no problems found)\n")
    p = _process(sys.executable, "-m", "dyndq", "check", str(models / "nope.onnx"))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == f"dyndq: {models / 'nope.onnx'}: no such file\n"


def test_console_script(models):
    script = os.path.join(os.path.dirname(sys.executable), "dyndq")
    if not os.path.exists(script):
        pytest.skip("the dyndq console script is not installed beside this Python")
    p = _process(script, "run", str(models / "model.onnx"), "-i", f"x={models / 'x.npy'}", "--engine", "onnxruntime")
    assert (p.returncode, p.stderr) == (0, "")
    assert p.stdout.startswith("y: float32[4, 16]")
    p = _process(script, "run", str(models / "model.onnx"), "-i", "x")
    assert p.returncode == 2 and p.stderr == "dyndq: --input 'x': expected NAME=FILE.npy\n"


def test_run_computes_batchnorm_with_momentum_as_inference(capsys, tmp_path):
    """paddle2onnx writes momentum on every BatchNormalization: `dyndq run` (the reference engine) gives
    ONNX's inference result for a node with one output, as ONNX's backend test expects it (its model
    carried to opset 12 with momentum=0.9), where onnx.reference gives training statistics."""
    from backend_cases import assert_as_expected, expected, feeds, node_cases, with_opset

    case = node_cases()["test_batchnorm_example"]
    (data_set,) = case.data_sets
    save_model(with_opset(case.model, 12, momentum=0.9), tmp_path / "bn.onnx")
    args = []
    for name, value in feeds(case, data_set).items():
        np.save(tmp_path / f"{name}.npy", value)
        args += ["-i", f"{name}={tmp_path / f'{name}.npy'}"]
    code, out, err = call(capsys, "run", tmp_path / "bn.onnx", *args, "--output-dir", tmp_path / "out")
    assert (code, err) == (0, "")
    assert_as_expected([np.load(tmp_path / "out" / "y.npy")], expected(data_set), case.rtol, case.atol, "dyndq run")


# -- what every command that writes a file refuses before any work ---------------------------

KIND_JSON = os.path.join(os.path.dirname(__file__), "..", "data", "onednn", "kinds", "DynamicDequantize.json")


def _writers(models):
    """(argv before OUT, argv after) of each command that writes one file, given its input."""
    m = str(models / "model.onnx")
    return {"export": (["export", m], []), "lift": (["lift", str(models / "model.exported.onnx")], []),
            "quantize": (["quantize", str(models / "float.onnx")], ["--no-evaluate"]),
            "import-onednn": (["import-onednn", KIND_JSON], []), "export-onednn": (["export-onednn", m], [])}


@pytest.mark.parametrize("command", ["export", "lift", "quantize", "import-onednn", "export-onednn"])
@pytest.mark.parametrize("out", ["new/", "{models}/", "new/.", "."])
def test_an_out_that_names_a_folder_is_refused_and_nothing_written(capsys, models, monkeypatch, command, out):
    """An OUT ending in "/" wrote a file named like the folder."""
    from quantize_models import mlp

    save_model(mlp(), models / "float.onnx")
    monkeypatch.chdir(models)
    before = sorted(os.listdir(models))
    head, tail = _writers(models)[command]
    out = out.format(models=models)
    code, printed, err = call(capsys, *head, out, *tail)
    assert code == 2 and printed == "", err
    assert_plain_error(err, f"{out}: names a folder, not a file; give the path of the file to write", lines=1)
    assert sorted(os.listdir(models)) == before


@pytest.mark.parametrize("command", ["export", "lift", "quantize"])
def test_the_input_as_out_is_refused_unless_asked(capsys, models, command):
    """A model passed in is never modified: OUT naming IN (or a link to it) is refused, exit 2,
    unless --overwrite."""
    from quantize_models import mlp

    save_model(mlp(), models / "float.onnx")
    head, tail = _writers(models)[command]
    given = head[-1]
    os.symlink(os.path.basename(given), models / "link.onnx")
    before = open(given, "rb").read()
    for out in (given, str(models / "link.onnx")):
        code, _, err = call(capsys, *head, out, *tail)
        assert code == 2
        assert_plain_error(err, "is the input model itself; write to another file, or add --overwrite", lines=1)
    assert open(given, "rb").read() == before
    code, _, err = call(capsys, *head, given, *tail, "--overwrite")
    assert code == 0, err


@pytest.mark.parametrize("command", ["import-onednn", "export-onednn"])
def test_a_graph_written_over_its_own_input_is_refused(capsys, tmp_path, command):
    """Those read one format and write the other: writing over the input is never meant."""
    given = tmp_path / ("g.json" if command == "import-onednn" else "m.onnx")
    if command == "import-onednn":
        shutil.copy(KIND_JSON, given)
    else:
        save_model(dyndq.onednn.load(KIND_JSON)[0], given)
    before = given.read_bytes()
    code, _, err = call(capsys, command, given, given)
    assert code == 2
    assert_plain_error(err, f"{given}: is the input itself; write to another file", lines=1)
    assert given.read_bytes() == before
