"""The command line's oneDNN commands and what runs on their files: import-onednn, export-onednn
(--weights-as-inputs), run --inputs-dir (every input from a folder, int4 .npy files included) and
run's count of infinities; every problem named, exit 1, nothing written."""
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dyndq
from cases import hand_model, weighted_model
from dyndq import onednn
from dyndq.cli import main

vi = helper.make_tensor_value_info

DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"

MHA = DATA / "complex_fusion/mha/sdpa-compressed-kv-implicit-causal-mask-int8-gs128.json"


def _doc(path=MHA):
    return json.loads(Path(path).read_text())


def _problems(source):
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(source)
    return e.value.problems


def test_cli_imports_runs_and_exports(tmp_path, capsys):
    out, inputs, back = tmp_path / "m.onnx", tmp_path / "in", tmp_path / "back.json"
    assert main(["import-onednn", str(MHA), str(out), "--inputs-dir", str(inputs)]) == 0
    files = sorted(inputs.glob("*.npy"))
    assert len(files) == 9
    args = [f"--input={f.stem}={f}" for f in files]
    assert main(["run", str(out), *args]) == 0
    assert main(["run", str(out), *args, "--engine", "onnxruntime"]) == 0
    assert main(["export-onednn", str(out), str(back)]) == 0
    kinds = lambda doc: sorted((op["id"], op["kind"]) for op in doc["graph"])  # noqa: E731
    assert kinds(json.loads(back.read_text())) == kinds(_doc())


def test_the_bad_example_of_the_readme_is_refused_whole():
    problems = _problems(str(DATA / "bad/unknown-kinds.json"))
    assert [(p.op_id, p.op, p.argument) for p in problems] == [(3, "GenIndexFancy", "kind"), (7, "SoftMax", "mode")]


def test_cli_export_onednn_refuses_with_every_problem(tmp_path, capsys):
    model = hand_model()
    model.graph.node.append(helper.make_node("LpNormalization", ["out"], ["n"], name="norm"))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["export-onednn", str(path), str(tmp_path / "m.json")]) == 1
    assert "'norm'" in capsys.readouterr().err and not (tmp_path / "m.json").exists()


def test_cli_names_every_problem_and_writes_nothing(tmp_path, capsys):
    doc = _doc()
    doc["graph"][3]["kind"] = "Frobnicate"
    doc["graph"][4]["kind"] = "Frobnicate"
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(doc))
    assert main(["import-onednn", str(src), str(tmp_path / "m.onnx")]) == 1
    err = capsys.readouterr().err
    assert "2 problems" in err and "genindex_row" in err and "genindex_col" in err
    assert not (tmp_path / "m.onnx").exists()
    assert main(["import-onednn", str(tmp_path / "missing.json"), str(tmp_path / "m.onnx")]) == 2


def test_run_takes_every_input_from_a_folder_and_names_the_missing(tmp_path, capsys):
    model, inputs = tmp_path / "m.onnx", tmp_path / "in"
    assert main(["import-onednn", str(MHA), str(model), "--inputs-dir", str(inputs)]) == 0
    capsys.readouterr()
    assert main(["run", str(model), "--inputs-dir", str(inputs)]) == 0
    by_folder = capsys.readouterr().out
    args = [f"--input={f.stem}={f}" for f in sorted(inputs.glob("*.npy"))]
    assert main(["run", str(model), *args]) == 0
    assert capsys.readouterr().out == by_folder
    (inputs / "div_src_1_4.npy").rename(tmp_path / "divisor.npy")
    (inputs / "stray.npy").write_bytes((tmp_path / "divisor.npy").read_bytes())
    assert main(["run", str(model), "--inputs-dir", str(inputs)]) == 2
    err = capsys.readouterr().err
    assert "no file for 1 input: div_src_1_4 (div_src_1_4.npy)" in err
    assert main(["run", str(model), "--inputs-dir", str(inputs), "--input", f"div_src_1_4={tmp_path / 'divisor.npy'}"]) == 0
    out, err = capsys.readouterr()
    assert out == by_folder and "stray.npy is for no input" in err


def test_export_onednn_weights_as_inputs_writes_them_beside_the_json_and_run_takes_them(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "m.json"
    onnx.save(weighted_model(), src)
    assert main(["export-onednn", str(src), str(out)]) == 1
    assert "--weights-as-inputs" in capsys.readouterr().err and not out.exists()
    assert main(["export-onednn", str(src), str(out), "--weights-as-inputs"]) == 0
    assert "wrote " + str(tmp_path / "m-weights" / "fc_weights_") in capsys.readouterr().out
    back = tmp_path / "back.onnx"
    assert main(["import-onednn", str(out), str(back)]) == 0
    x = tmp_path / "x"
    x.mkdir()
    np.save(x / "fc_src_1.npy", np.ones((2, 4), np.float32))
    capsys.readouterr()
    assert main(["run", str(back), "--inputs-dir", str(x), "--inputs-dir", str(tmp_path / "m-weights")]) == 0
    assert capsys.readouterr().out.startswith("quant_dst_")


@pytest.mark.filterwarnings("ignore:divide by zero", "ignore:invalid value")
def test_run_counts_infinities_and_nans(tmp_path, capsys):
    g = helper.make_graph([helper.make_node("Div", ["a", "b"], ["c"], name="div")], "g",
                          [vi("a", TensorProto.FLOAT, [4]), vi("b", TensorProto.FLOAT, [4])],
                          [vi("c", TensorProto.FLOAT, [4])])
    path = tmp_path / "m.onnx"
    onnx.save(dyndq.make_model(g), path)
    np.save(tmp_path / "a.npy", np.array([1, -1, 0, 2], np.float32))
    np.save(tmp_path / "b.npy", np.array([0, 0, 0, 4], np.float32))
    assert main(["run", str(path), "--inputs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "min 0.5  max 0.5  mean 0.5  (2 infinite, 1 NaN)  first" in out


ROOT = Path(__file__).resolve().parents[2]


def test_example_inputs_of_int4_run_from_their_npy_files(tmp_path, capsys):
    """int4/uint4 .npy files (raw bytes to NumPy) go straight back into `dyndq run`, on both engines."""
    graph = ROOT / "tests" / "data" / "onednn" / "op" / "f16" / "dynamicdq_u4.json"
    model, inputs = tmp_path / "m.onnx", tmp_path / "in"
    assert main(["import-onednn", str(graph), str(model), "--inputs-dir", str(inputs)]) == 0
    feeds = [f"{p.stem}={p}" for p in sorted(inputs.glob("*.npy"))]
    assert any("src" in f for f in feeds)
    outs = []
    for engine in ("reference", "onnxruntime"):
        out = tmp_path / engine
        argv = ["run", str(model), "--engine", engine, "--output-dir", str(out)]
        for f in feeds:
            argv += ["--input", f]
        assert main(argv) == 0, capsys.readouterr()
        [saved] = out.glob("*.npy")
        outs.append(saved.read_bytes())
    assert outs[0] == outs[1]


def test_export_onednn_writes_as_every_writer_does(tmp_path, capsys):
    """Through dyndq.atomic_writes' writer: a FIFO at the output path is refused, not replaced."""
    import os

    model = tmp_path / "m.onnx"
    assert main(["import-onednn", str(ROOT / "tests" / "data" / "onednn" / "op" / "f32" / "dynamicdq.json"),
                 str(model)]) == 0
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    assert main(["export-onednn", str(model), str(fifo)]) == 2
    assert "is a FIFO" in capsys.readouterr().err
    assert main(["export-onednn", str(model), str(tmp_path / "g.json")]) == 0
    assert (tmp_path / "g.json").read_text().endswith("}\n")
