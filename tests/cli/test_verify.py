"""`dyndq verify`: exit 0 when every weight is faithful (ONNX Runtime's quantizer output against its
float model), 1 with the finding named (a planted nibble swap), 2 for usage (no --against, a
missing file, --weights-only beside --input, an unknown engine or level, an engine not installed);
the report as text and as JSON (docs/verify.md's keys); the user's inputs read from --input files;
a GGUF checkpoint as the source; each --level asked compared, and accuracy_level 4 planted on one
MatMulNBits node: exit 1, pinned on that node's setting and the node."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dyndq.cli import main
from dyndq.model_files import save_model

pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")  # (needs onnx_ir: the test extra)
from verify_models import accuracy_level_set, float_model, nbits, nibbles_swapped  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("verify")
    source = float_model()
    quantized = nbits(source)
    save_model(source, d / "float.onnx")
    save_model(quantized, d / "q.onnx")
    save_model(nibbles_swapped(quantized, "W2"), d / "swapped.onnx")
    save_model(accuracy_level_set(quantized, "W2"), d / "accuracy4.onnx")
    np.save(d / "ids.npy", np.array([0, 63, 7], np.int64))
    return d


def test_a_faithful_quantization_exits_0_with_each_weight_said(files, capsys):
    assert main(["verify", str(files / "q.onnx"), "--against", str(files / "float.onnx"), "--samples", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{files / 'q.onnx'} against {files / 'float.onnx'}: 4 weight(s): 3 rtn, 1 float; faithful")
    assert "exactly ONNX Runtime's matmul rule (MlasQuantizeBlockwise), asymmetric, 4 bits, block 32" in out
    assert "outputs on 1 seeded sample (seed 0)" in out
    assert "reference (our kernel) logits: cosine" in out and "onnxruntime (basic optimizations) logits: cosine" in out


def test_a_planted_fault_exits_1_naming_it(files, capsys):
    assert main(["verify", str(files / "swapped.onnx"), "--against", str(files / "float.onnx"), "--weights-only"]) == 1
    out = capsys.readouterr().out
    assert "1 finding(s)" in out.splitlines()[0]
    line = next(x for x in out.splitlines() if x.strip().startswith("layout"))
    assert "W2_Q4 <- W2" in line and "nibble-order" in line


def test_json_has_the_documented_schema(files, capsys):
    assert main(["verify", str(files / "q.onnx"), "--against", str(files / "float.onnx"), "--json",
                 "--input", f"ids={files / 'ids.npy'}"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {"quantized", "source", "weights", "outputs", "blame"} <= set(report)
    assert report["blame"] == [] and report["inputs"].startswith("1 sample given")
    assert {(w["source"], w["status"]) for w in report["weights"]} == {("W1", "rtn"), ("W2", "rtn"), ("W3", "rtn"),
                                                                       ("E", "float")}
    assert {(o["engine"], o["name"]) for o in report["outputs"]} == {("reference", "logits"), ("onnxruntime", "logits")}
    assert all(set(o) == {"engine", "setting", "name", "cosine", "relative", "top1", "kl", "within"}
               for o in report["outputs"])
    assert report["tolerance"] == 0.5 and all(o["within"] for o in report["outputs"])


def test_each_level_asked_is_compared_and_a_faithful_model_exits_0(files, capsys):
    assert main(["verify", str(files / "q.onnx"), "--against", str(files / "float.onnx"), "--samples", "1",
                 "--level", "off", "--level", "all"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime (optimizations off) logits: cosine" in out and "onnxruntime (all optimizations) logits" in out
    assert "basic optimizations" not in out and "setting " not in out


def test_accuracy_level_4_on_one_node_exits_1_pinned_on_it(files, capsys):
    assert main(["verify", str(files / "accuracy4.onnx"), "--against", str(files / "float.onnx"), "--samples", "1"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(": 4 weight(s): 3 rtn, 1 float; 1 finding(s)")
    assert "culprit: accuracy_level fc2_Q4: com.microsoft::MatMulNBits 'fc2_Q4' holds accuracy_level 4" in out
    assert "first divergence: node 'fc2_Q4' (MatMulNBits" in out
    assert main(["verify", str(files / "accuracy4.onnx"), "--against", str(files / "float.onnx"), "--samples", "1",
                 "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    [entry] = report["settings"]
    assert (entry["engine"], entry["setting"], entry["node"]["node"]) == ("onnxruntime", "basic", "fc2_Q4")
    assert [(c["kind"], c["name"]) for c in entry["culprits"]] == [("accuracy_level", "fc2_Q4")]
    assert report["faithful"] is False and {w["status"] for w in report["weights"]} == {"rtn", "float"}


def test_an_engine_not_installed_exits_2_saying_how_to_install_it(files, capsys, monkeypatch):
    from dyndq import openvino_session

    monkeypatch.setattr(openvino_session, "installed", lambda: False)
    assert main(["verify", str(files / "q.onnx"), "--against", str(files / "float.onnx"), "--engine", "openvino"]) == 2
    assert "OpenVINO is not installed (pip install 'openvino>=" in capsys.readouterr().err


def test_the_engines_and_levels_are_checked_once(files, capsys, monkeypatch):
    """verify checks them before any work, and its refusal is the usage error: the CLI asks no second time."""
    import dyndq.verification as V
    from dyndq.verification import settings

    calls = []
    was = settings.settings_asked
    monkeypatch.setattr(V, "settings_asked", lambda *a: calls.append(a) or was(*a))
    monkeypatch.setattr(settings, "settings_asked", V.settings_asked)
    assert main(["verify", str(files / "q.onnx"), "--against", str(files / "float.onnx"), "--weights-only"]) == 0
    assert main(["verify", str(files / "q.onnx"), "--against", str(files / "float.onnx"), "--engine", "reference",
                 "--level", "all"]) == 2
    assert "--engine/--level: a level is ONNX Runtime's" in capsys.readouterr().err
    assert calls == [(None, None), (["reference"], ["all"])]


def test_a_gguf_checkpoint_as_the_source(tmp_path, capsys):
    pytest.importorskip("gguf")
    import dyndq
    from gguf_models import float_model as llama_model, gguf_tensors, source_weights, write_gguf

    src = source_weights()
    write_gguf(tmp_path / "m.gguf", gguf_tensors(src))
    imported, _ = dyndq.import_weights(llama_model(src), tmp_path / "m.gguf")
    save_model(imported, tmp_path / "imported.onnx")
    assert main(["verify", str(tmp_path / "imported.onnx"), "--against", str(tmp_path / "m.gguf")]) == 0
    out = capsys.readouterr().out
    assert ": 7 weight(s): 6 identical, 1 float; faithful" in out.splitlines()[0]
    assert "outputs: not compared: the source is a GGUF checkpoint, not a model to run" in out


@pytest.mark.parametrize("argv,said", [
    (["verify", "{q}"], "the following arguments are required: --against"),
    (["verify", "{d}/missing.onnx", "--against", "{f}"], "missing.onnx"),
    (["verify", "{q}", "--against", "{d}/missing.gguf"], "missing.gguf: no such file"),
    (["verify", "{q}", "--against", "{f}", "--weights-only", "--input", "ids={d}/ids.npy"], "--weights-only compares none"),
    (["verify", "{q}", "--against", "{f}", "--samples", "0"], "--samples 0"),
    (["verify", "{q}", "--against", "{f}", "--engine", "cuda"], "argument --engine: invalid choice: 'cuda'"),
    (["verify", "{q}", "--against", "{f}", "--level", "disabled"], "argument --level: invalid choice: 'disabled'"),
    (["verify", "{q}", "--against", "{f}", "--engine", "reference", "--level", "all"], "a level is ONNX Runtime's"),
    (["verify", "{q}", "--against", "{f}", "--weights-only", "--level", "all"], "--engine and --level are for comparing"),
    (["verify", "{q}", "--against", "{f}", "--tolerance", "abc"], "--tolerance abc: a relative error"),
    (["verify", "{q}", "--against", "{f}", "--tolerance", "-0.1"], "--tolerance -0.1: a relative error"),
    (["verify", "{q}", "--against", "{f}", "--tolerance", "nan"], "--tolerance nan: a relative error"),
    (["verify", "{q}", "--against", "{f}", "--blame-top", "0"], "--blame-top 0"),
    (["verify", "{q}", "--against", "{f}", "--blame", "--weights-only"], "--weights-only runs nothing"),
    (["verify", "{q}", "--against", "{d}/m.gguf", "--blame"], "is a checkpoint, not an ONNX model to run"),
])
def test_usage_errors_exit_2(files, capsys, argv, said):
    argv = [a.format(q=files / "q.onnx", f=files / "float.onnx", d=files) for a in argv]
    assert main(argv) == 2
    assert said in capsys.readouterr().err


def test_a_planted_fault_moves_the_outputs_past_the_tolerance_and_is_blamed_first(files, capsys):
    assert main(["verify", str(files / "swapped.onnx"), "--against", str(files / "float.onnx"), "--samples", "2"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("; 1 finding(s), 2 output(s) beyond relative error 0.5")
    assert sum("beyond the tolerance 0.5" in x for x in out) == 2
    head = out.index(next(x for x in out if x.startswith("  to blame (")))
    assert out[head + 1].startswith("    W2_Q4 <- W2 read by fc2 (layout nibble-order): logits relative ")


def test_the_tolerance_alone_makes_exit_1_and_blame_asked_for_keeps_exit_0(files, capsys):
    q, f = str(files / "q.onnx"), str(files / "float.onnx")
    assert main(["verify", q, "--against", f, "--samples", "1", "--tolerance", "0.001"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("; 2 output(s) beyond relative error 0.001") and "  to blame (" in out
    assert main(["verify", q, "--against", f, "--samples", "1"]) == 0
    assert "to blame" not in capsys.readouterr().out
    assert main(["verify", q, "--against", f, "--samples", "1", "--blame", "--blame-top", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["faithful"] is True and len(report["blame"]) == 2
    assert report["blame"][0]["relative"] >= report["blame"][1]["relative"]
    assert {b["status"] for b in report["blame"]} == {"rtn"} and "2 largest shown" in report["blame_note"]


def test_the_help_says_the_defaults_verify_uses(capsys):
    import importlib

    cli = importlib.import_module("dyndq.cli.verify")  # (dyndq.cli.verify may name the command, not the module)
    from dyndq.verification import TOLERANCE
    from dyndq.verification.blame import TOP

    assert (float(cli.TOLERANCE_SAID), int(cli.TOP_SAID)) == (TOLERANCE, TOP)
    assert main(["verify", "--help"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert f"(default {TOLERANCE:g};" in said and f"(default {TOP})" in said
