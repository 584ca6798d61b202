"""The command line at its edges: stdout closed early, exit codes (internal errors have their own),
wording of OS errors, the demo checking its folder first, the README's promises about all of it."""
from __future__ import annotations

import os

import numpy as np
import pytest

import dyndq
from cases import A, B, X, call, matmul_model, sequence_model


# -- stdout closed early ------------------------------------------------------------------------

def _run_with_stdout_closed(args, cwd):
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-m", "dyndq", *map(str, args)], cwd=cwd,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader is gone before the first line (as `| head -0`)
    err = p.stderr.read().decode()
    return p.wait(), err


def test_run_finishes_its_work_when_stdout_closes(tmp_path):
    from dyndq.model_files import save_model

    save_model(sequence_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "a.npy", A)
    np.save(tmp_path / "b.npy", B)
    code, err = _run_with_stdout_closed(["run", "m.onnx", "-i", "a=a.npy", "-i", "b=b.npy", "--output-dir", "out"],
                                        tmp_path)
    assert code == 0 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path / "out")) == ["seq.0.npy", "seq.1.npy"]


def test_demo_writes_its_files_when_stdout_closes(tmp_path):
    code, err = _run_with_stdout_closed(["demo", "--out", "d"], tmp_path)
    assert code == 0 and "Traceback" not in err, err
    assert sorted(os.listdir(tmp_path / "d")) == ["model.exported.onnx", "model.onnx", "x.npy"]


# -- internal errors have their own exit code -------------------------------------------------------

def test_internal_error_exit_code(capsys, monkeypatch):
    import dataclasses

    from dyndq import cli
    from dyndq.cli import exits

    def broken(args):
        raise RuntimeError("something we did not foresee")

    monkeypatch.setitem(cli.COMMANDS, "schema", dataclasses.replace(cli.COMMANDS["schema"], run=broken))
    code, out, err = call(capsys, "schema")
    assert code == exits.INTERNAL == 70
    assert "internal error: RuntimeError: something we did not foresee" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# -- wording --------------------------------------------------------------------------------------

def test_articles_and_flags():
    from dyndq.wording import a

    assert [a(w) for w in ("int8", "uint8", "INT", "float32", "int4[3]")] == ["an int8", "a uint8", "an INT", "a float32", "an int4[3]"]
    with pytest.raises(dyndq.ValidationError, match="an int8 array"):
        dyndq.run(matmul_model(), {"x": np.zeros((2, 3), np.int8)})
    import inspect

    from dyndq import exporter

    assert "pass opset= to" not in inspect.getsource(exporter)


def test_os_errors_without_errno(capsys, tmp_path, monkeypatch):
    from dyndq.model_files import save_model

    save_model(matmul_model(), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", X)

    def denied(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "makedirs", denied)
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}", "--output-dir", tmp_path / "o")
    assert code == 2 and "Permission denied" in err and "[Errno" not in err, err


def test_a_folder_as_input_is_named_a_folder(capsys, tmp_path):
    from dyndq.model_files import save_model

    save_model(matmul_model(), tmp_path / "m.onnx")
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={tmp_path}")
    assert code == 2 and "is a folder" in err, err


def test_demo_checks_its_folder_before_the_work(capsys, tmp_path, monkeypatch):
    from dyndq import demo

    def work(*args, **kwargs):
        raise AssertionError("the demo's work started")

    monkeypatch.setattr(demo, "quantized_model", work)  # (where its work starts)
    code, out, err = call(capsys, "demo", "--out", "/proc/dyndq-demo-out")  # no one can create a folder there
    assert code == 2 and "cannot write there" in err, err


# -- the README and docs/cli.md for a newcomer; their promises about exit codes ---------------------

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
CLI_PAGE = os.path.join(ROOT, "docs", "cli.md")


def test_readme_and_cli_page_tell_how_to_get_dyndq_on_the_path():
    for path in (README, CLI_PAGE):
        text = open(path).read()
        assert ". .venv/bin/activate" in text and ".venv/bin/dyndq" in text, path
    assert "build on each other" in open(os.path.join(ROOT, "docs", "graphs.md")).read()


def test_the_cli_page_gives_the_clis_exit_codes():
    from dyndq.cli import exits

    text = open(CLI_PAGE).read()
    for code in (exits.OK, exits.PROBLEMS, exits.USAGE, exits.INTERNAL, exits.INTERRUPTED):
        assert f"| {code} |" in text
