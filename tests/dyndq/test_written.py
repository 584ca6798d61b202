"""dyndq.written: every file a command writes is checked where it is staged (`dyndq check`, and it
loads on the engine it is written for) before it is put in place; one that fails is told, with the
checker's or the engine's words, and never reaches OUT."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from cases import call
from dyndq import written
from dyndq.demo import build_model
from dyndq.model_files import save_model
from dyndq.written import InheritedProblem, WrittenFileError, verify_model

from quantize_models import mlp

KIND = os.path.join(os.path.dirname(__file__), "..", "data", "onednn", "kinds", "DynamicDequantize.json")


def _files(folder) -> list[str]:
    return sorted(os.listdir(folder))


@pytest.mark.parametrize("form", ["dyndq", "onnx", "onnxruntime"])
def test_a_good_file_passes_on_its_engine(tmp_path, form):
    model = build_model() if form == "dyndq" else dyndq.export(build_model(), target=form)
    save_model(model, tmp_path / "m.onnx")
    assert verify_model(tmp_path / "m.onnx", form) == []


def test_a_model_with_external_data_loads_on_the_reference_engine_without_its_data_read(tmp_path):
    save_model(build_model(), tmp_path / "m.onnx", external_data=True)
    assert verify_model(tmp_path / "m.onnx", "dyndq") == []


def test_openvino_is_tried_where_installed_and_said_where_not(tmp_path):
    save_model(dyndq.export(build_model(), target="openvino"), tmp_path / "m.onnx")
    notes = verify_model(tmp_path / "m.onnx", "openvino")
    from dyndq.openvino_session import installed

    assert notes == ([] if installed() else
                     ["not loaded on OpenVINO: it is not installed here (make test-openvino installs it)"])


def _unloadable_for_onnxruntime() -> onnx.ModelProto:
    """A MatMulNBits whose K disagrees with its B: onnx.checker knows no com.microsoft op and passes
    it; ONNX Runtime refuses to make a session of it."""
    b = nh.from_array(np.zeros((4, 1, 16), np.uint8), "B")
    s = nh.from_array(np.ones(4, np.float32), "S")
    node = helper.make_node("MatMulNBits", ["x", "B", "S"], ["y"], domain="com.microsoft", name="mm",
                            K=7, N=4, bits=4, block_size=32)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, 32])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, 4])], [b, s])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def test_a_file_its_engine_refuses_is_a_bug_told_in_the_engines_words(tmp_path, capsys, monkeypatch):
    """The export of a good model writes a file ONNX Runtime refuses (as the bias Constant once made
    it): exit 70 with ONNX Runtime's own message, and nothing at OUT."""
    from dyndq import model_files

    save_model(build_model(), tmp_path / "m.onnx")
    real = model_files.write_staged
    monkeypatch.setattr(model_files, "write_staged", lambda model, stage: real(_unloadable_for_onnxruntime(), stage))
    code, out, err = call(capsys, "export", tmp_path / "m.onnx", tmp_path / "e.onnx", "--target", "onnxruntime")
    assert code == 70 and out == ""
    assert f"{tmp_path / 'e.onnx'}: not written: ONNX Runtime cannot load the model made" in err
    assert "MatMulNBits" in err or "K" in err, err
    assert "a bug in dyndq" in err and "Traceback" not in err
    assert _files(tmp_path) == ["m.onnx"]  # (no staging file either)


def test_a_file_that_fails_dyndq_check_is_a_bug_told_with_its_problems(tmp_path, capsys, monkeypatch):
    from dyndq import lifter

    save_model(dyndq.export(build_model()), tmp_path / "m.onnx")
    bad = build_model()
    next(n for n in bad.graph.node if n.domain == dyndq.DOMAIN).attribute.append(helper.make_attribute("axis", 7))
    real = lifter.lift_with_report
    monkeypatch.setattr(lifter, "lift_with_report", lambda model: (bad, real(model)[1]))
    code, out, err = call(capsys, "lift", tmp_path / "m.onnx", tmp_path / "l.onnx")
    assert code == 70 and out == ""
    assert "not written: the model made fails `dyndq check`" in err and "axis" in err
    assert _files(tmp_path) == ["m.onnx"]


def test_a_file_that_fails_as_its_input_does_is_the_models_problem(tmp_path, capsys):
    """A model holding an op no engine here has (a domain of its own): its export for ONNX Runtime
    cannot load there, and neither can the input as dyndq runs it there: exit 1, nothing written."""
    model = build_model()
    model.graph.node.append(helper.make_node("Frobnicate", ["y"], ["z"], domain="example.custom", name="frob"))
    z = model.graph.output.add()
    z.CopyFrom(model.graph.output[0])
    z.name = "z"
    model.opset_import.append(helper.make_opsetid("example.custom", 1))
    save_model(model, tmp_path / "m.onnx")
    code, out, err = call(capsys, "export", tmp_path / "m.onnx", tmp_path / "e.onnx", "--target", "onnxruntime")
    assert code == 1 and out == "", err
    assert "not written: ONNX Runtime cannot load the model made, nor the input" in err and "Frobnicate" in err
    assert _files(tmp_path) == ["m.onnx"]
    with pytest.raises(InheritedProblem):
        verify_model(_saved(tmp_path / "again.onnx", dyndq.export(model, target="onnxruntime")), "onnxruntime",
                     source=str(tmp_path / "m.onnx"))
    with pytest.raises(WrittenFileError):  # (without the input, nothing tells it is the model's)
        verify_model(tmp_path / "again.onnx", "onnxruntime")


def _saved(path, model) -> str:
    save_model(model, path)
    return str(path)


# -- every command that writes a model checks it where it is staged, before it is put in place -----

def _commands(tmp_path):
    """(argv, OUT, the forms checked) of every command that writes a model file."""
    f, d = str(tmp_path / "float.onnx"), str(tmp_path / "dq.onnx")
    return {
        "quantize": (["quantize", f, "OUT", "--no-evaluate"], ["dyndq"]),
        "quantize --emit onnx": (["quantize", f, "OUT", "--emit", "onnx"], ["onnx"]),
        "quantize --emit onnxruntime": (["quantize", f, "OUT", "--emit", "onnxruntime", "--no-evaluate"], ["onnxruntime"]),
        "export": (["export", d, "OUT"], ["onnx"]),
        "export --target onnxruntime": (["export", d, "OUT", "--target", "onnxruntime"], ["onnxruntime"]),
        "export --target openvino": (["export", d, "OUT", "--target", "openvino"], ["openvino"]),
        "lift": (["lift", str(tmp_path / "std.onnx"), "OUT"], ["dyndq"]),
        "import-onednn": (["import-onednn", KIND, "OUT"], ["dyndq"]),
        "demo": (["demo", "--out", "OUT"], ["dyndq", "onnx"]),
    }


@pytest.mark.parametrize("name", list(_commands(__import__("pathlib").Path("."))))
def test_every_command_checks_the_file_it_writes_before_putting_it_in_place(tmp_path, capsys, monkeypatch, name):
    save_model(mlp(), tmp_path / "float.onnx")
    save_model(build_model(), tmp_path / "dq.onnx")
    save_model(dyndq.export(build_model()), tmp_path / "std.onnx")
    argv, forms = _commands(tmp_path)[name]
    out = str(tmp_path / ("demo" if name == "demo" else "out.onnx"))
    argv = [out if a == "OUT" else a for a in argv]
    checked, real = [], written.verify_model

    def spy(path, form, **kw):
        shown = kw.get("shown_as")
        checked.append((form, os.path.exists(shown), os.path.abspath(path) != os.path.abspath(shown)))
        return real(path, form, **kw)

    monkeypatch.setattr(written, "verify_model", spy)
    code, _, err = call(capsys, *argv)
    assert code == 0, err
    # each checked once, where it was staged, while nothing was at OUT yet
    assert checked == [(form, False, True) for form in forms]


def test_export_onednn_reads_back_the_graph_it_writes_before_putting_it_in_place(tmp_path, capsys, monkeypatch):
    save_model(dyndq.onednn.load(KIND)[0], tmp_path / "m.onnx")
    checked, real = [], written.verify_onednn_json

    def spy(path, folder=None, ports=(), **kw):
        checked.append(os.path.exists(kw["shown_as"]))
        return real(path, folder, ports, **kw)

    monkeypatch.setattr(written, "verify_onednn_json", spy)
    code, _, err = call(capsys, "export-onednn", tmp_path / "m.onnx", tmp_path / "g.json")
    assert code == 0 and checked == [False], err


def test_an_export_onednn_graph_the_reader_refuses_is_never_put_in_place(tmp_path, capsys, monkeypatch):
    from dyndq import onednn

    save_model(onednn.load(KIND)[0], tmp_path / "m.onnx")
    real = onednn.dump
    monkeypatch.setattr(onednn, "dump", lambda *a, **kw: {**real(*a, **kw), "graph": [{"kind": "NoSuchKind"}]})
    code, _, err = call(capsys, "export-onednn", tmp_path / "m.onnx", tmp_path / "g.json")
    assert code == 70 and "not written: dyndq's oneDNN reader refuses the graph made" in err, err
    assert _files(tmp_path) == ["m.onnx"]


@pytest.mark.parametrize("evaluate", [[], ["--no-evaluate"]])
def test_quantize_never_puts_in_place_a_file_its_engine_refuses(tmp_path, capsys, monkeypatch, evaluate):
    """Measured or not: the evaluation's own session is the file's load on ONNX Runtime, and a
    file that does not load there is told as such, never measured as "not measured"."""
    from dyndq import model_files

    save_model(mlp(), tmp_path / "float.onnx")
    real = model_files.write_staged
    monkeypatch.setattr(model_files, "write_staged", lambda model, stage: real(_unloadable_for_onnxruntime(), stage))
    code, out, err = call(capsys, "quantize", tmp_path / "float.onnx", tmp_path / "q.onnx", "--emit", "onnxruntime",
                          *evaluate)
    assert code == 70 and "not written: ONNX Runtime cannot load the model made" in err, (out, err)
    assert _files(tmp_path) == ["float.onnx"]


def test_standard_onnx_that_onnxruntime_has_no_kernel_for_loads_on_onnx_reference(tmp_path, capsys):
    """Valid standard ONNX is the target onnx's whatever ONNX Runtime lacks (DequantizeLinear-28 at
    --opset 28; float4 codes): loaded on onnx.reference instead, and said."""
    save_model(build_model(), tmp_path / "m.onnx")
    code, out, err = call(capsys, "export", tmp_path / "m.onnx", tmp_path / "e.onnx", "--opset", "28")
    assert code == 0, err
    assert ("  note: not loaded on ONNX Runtime, which has no kernel for DequantizeLinear(28): loaded on "
            "onnx.reference instead (the target onnxruntime writes forms ONNX Runtime runs)") in out.splitlines()
    # (for its own engine, an opset past what ONNX Runtime runs is refused before any work)
    code, out, err = call(capsys, "export", tmp_path / "m.onnx", tmp_path / "r.onnx", "--opset", "28", "--target",
                          "onnxruntime")
    assert code == 2 and err == (f"dyndq: {tmp_path / 'm.onnx'}: opset 28 is newer than ONNX Runtime runs (26); the "
                                 "target onnxruntime is written for it: an opset up to 26, or none\n")
    assert not os.path.exists(tmp_path / "r.onnx")
    save_model(mlp(), tmp_path / "float.onnx")
    code, out, err = call(capsys, "quantize", tmp_path / "float.onnx", tmp_path / "q.onnx", "--emit", "onnx",
                          "--format", "mxfp4", "--samples", "1")
    assert code == 0, err
    assert "; onnx.reference, the file as written (ONNX Runtime has no kernel for DequantizeLinear(" in out


def test_a_lifted_model_holding_a_contrib_op_left_alone_loads_on_onnxruntime_instead(tmp_path, capsys):
    """`dyndq lift` keeps a MatMulNBits it cannot lift (float zero points): the reference engine has
    no way to run it, ONNX Runtime through the export does, as `dyndq run --engine onnxruntime`
    runs it; said, and written."""
    rng = np.random.default_rng(0)
    k, n, block = 64, 3, 16
    inits = [nh.from_array(rng.integers(0, 256, (n, k // block, block // 4), dtype=np.uint8), "B"),
             nh.from_array(np.full(n * k // block, 0.5, np.float32), "S"),
             nh.from_array(np.full(n * k // block, 0.25, np.float32), "Z")]
    node = helper.make_node("MatMulNBits", ["x", "B", "S", "Z"], ["y"], domain="com.microsoft", name="mm",
                            K=k, N=n, bits=2, block_size=block)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, n])], inits)
    save_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                                 ir_version=10), tmp_path / "m.onnx")
    code, out, err = call(capsys, "lift", tmp_path / "m.onnx", tmp_path / "l.onnx")
    assert code == 0, err
    note, = [line for line in out.splitlines() if line.startswith("  note: not loaded on the reference engine")]
    assert note.endswith("loaded on ONNX Runtime through its export instead, as dyndq run --engine onnxruntime runs it")
    assert _files(tmp_path) == ["l.onnx", "m.onnx"]
