"""Files at their edges: external data never rewritten in place, one switching step and its
staging files, output paths that are links, FIFOs, sockets or devices, output names that clean
up to one file name, .npy headers checked against the file, files written with the modes models get.

Each of these failed on the code before its fix."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from cases import call, matmul_model


# -- output names that clean up to one file name ------------------------------------------------

def identity_model(names: list[str]) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Mul", ["x", "k"], [n]) for n in names] + [dyndq.make_node(["q", "s"], ["unused"])], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2]), helper.make_tensor_value_info("k", T.FLOAT, [1])],
        [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in names],
        [nh.from_array(np.array([1], np.int8), "q"), nh.from_array(np.array([1.0], np.float32), "s")])
    return dyndq.make_model(g)


@pytest.mark.parametrize("names", [["a/b", "a_b"], ["ä", "ö"], ["y", "..", "."]])
def test_every_output_gets_a_file_of_its_own(capsys, tmp_path, names):
    from dyndq.model_files import save_model

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


def test_names_equal_but_for_case_are_refused(capsys, tmp_path):
    from dyndq.model_files import save_model

    save_model(identity_model(["y", "Y"]), tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", np.array([1, 2], np.float32))
    np.save(tmp_path / "k.npy", np.array([3], np.float32))
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}",
                          "-i", f"k={tmp_path / 'k.npy'}", "--output-dir", tmp_path / "out")
    assert code == 2 and "'y' and 'Y'" in err, err
    assert not (tmp_path / "out").exists()  # (made, and found writable, before the run; nothing written: removed)


# -- external data: never rewritten, one switching step, cwd and subfolders ------------

def _weights_model(value: float, n: int = 64) -> onnx.ModelProto:
    w = nh.from_array(np.full((n, n), value, np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
                           dyndq.make_node(["q", "s"], ["unused"], name="dq")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [1, n])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, n])],
                          [w, nh.from_array(np.array([1], np.int8), "q"), nh.from_array(np.array([1.0], np.float32), "s")])
    return dyndq.make_model(g)


def _w(model) -> np.ndarray:
    return nh.to_array(next(t for t in model.graph.initializer if t.name == "w"))


@pytest.mark.parametrize("command", ["export", "lift"])
def test_rewriting_in_place_keeps_a_copy_made_before_loadable(capsys, tmp_path, command):
    import shutil

    from dyndq.demo import build_model, demo_input
    from dyndq.model_files import load_model

    source = tmp_path / "model.onnx"
    model = build_model() if command == "export" else dyndq.export(build_model())  # something to do
    # written by another tool (every tensor in the data file): our rewrite lays the data out otherwise
    onnx.save_model(model, source, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    shutil.copy(source, tmp_path / "backup.onnx")
    before = dyndq.run(load_model(tmp_path / "backup.onnx"), {"x": demo_input()})["y"]
    code, out, err = call(capsys, command, source, source, "--overwrite")
    assert code == 0, err
    assert np.array_equal(dyndq.run(load_model(tmp_path / "backup.onnx"), {"x": demo_input()})["y"], before)
    assert np.array_equal(dyndq.run(load_model(source), {"x": demo_input()})["y"], before)


def test_a_crash_between_the_renames_leaves_the_old_model_whole(tmp_path, monkeypatch):
    from dyndq import model_files
    from dyndq.atomic_writes import ModelFileError
    from dyndq.model_files import load_model, save_model

    target = tmp_path / "m.onnx"
    save_model(_weights_model(1.0), target, external_data=True)
    real, calls = os.replace, []

    def replace(src, dst):  # the process "dies" at the model's rename, after the data's
        calls.append(os.path.basename(dst))
        if os.path.basename(dst) == "m.onnx":
            raise OSError(5, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(model_files.os, "replace", replace)
    with pytest.raises(ModelFileError):
        save_model(_weights_model(2.0), target, external_data=True)
    assert calls[-1] == "m.onnx" and len(calls) == 2
    assert np.all(_w(load_model(target)) == 1.0)  # the old model with its old data
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]


_SLOW_SAVE = """
import sys, time
import numpy as np
from onnx import TensorProto as T, helper, numpy_helper as nh
import dyndq
from dyndq import model_files
w = nh.from_array(np.full((64, 64), 1.0, np.float32), "w")
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                      [helper.make_tensor_value_info("x", T.FLOAT, [1, 64])],
                      [helper.make_tensor_value_info("y", T.FLOAT, [1, 64])], [w])
def slow(model, path, **kw):
    open(path, "wb").write(b"half")
    print("writing", flush=True)
    time.sleep(60)
model_files.onnx.save_model = slow
model_files.save_model(dyndq.make_model(g), sys.argv[1], external_data=True)
"""


def test_sigterm_removes_the_staging_files(tmp_path):
    import signal
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    p = subprocess.Popen([sys.executable, "-c", _SLOW_SAVE, str(out / "m.onnx")], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "writing", p.stderr.read()
    assert any(f.endswith(".tmp") for f in os.listdir(out))
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    assert os.listdir(out) == []


def test_staging_left_by_a_killed_writer_is_removed_by_the_next_write(tmp_path):
    import subprocess
    import sys

    from dyndq.npy import save_array
    from dyndq.model_files import save_model

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale_dir = tmp_path / f".m.onnx.{dead.pid}.abcd1234.tmp"
    stale_dir.mkdir()
    (stale_dir / "m.onnx.data").write_bytes(b"partial")
    stale_file = tmp_path / f".y.npy.{dead.pid}.abcd1234.tmp"
    stale_file.write_bytes(b"partial")
    live = tmp_path / f".m.onnx.{os.getppid()}.abcd1234.tmp"  # a writer that still runs
    live.mkdir()
    save_model(_weights_model(1.0), tmp_path / "m.onnx", external_data=True)
    save_array(tmp_path / "y.npy", np.zeros(2))
    assert sorted(os.listdir(tmp_path)) == sorted(["m.onnx", "m.onnx.data", "y.npy", live.name])


def test_export_twice_from_the_models_folder(capsys, tmp_path, monkeypatch):
    from dyndq.model_files import save_model

    save_model(_weights_model(1.0), tmp_path / "m.onnx", external_data=True)
    monkeypatch.chdir(tmp_path)
    for _ in range(2):
        code, out, err = call(capsys, "export", "m.onnx", "e.onnx")
        assert code == 0, err
    assert np.all(_w(dyndq.load_model(tmp_path / "e.onnx")) == 1.0)


def test_in_place_export_with_data_in_a_subfolder(capsys, tmp_path):
    (tmp_path / "weights").mkdir()
    onnx.save_model(_weights_model(3.0), tmp_path / "m.onnx", save_as_external_data=True,
                    location="weights/w.data", size_threshold=0)
    code, out, err = call(capsys, "export", tmp_path / "m.onnx", tmp_path / "m.onnx", "--overwrite")
    assert code == 0, err
    assert np.all(_w(dyndq.load_model(tmp_path / "m.onnx")) == 3.0)
    assert os.path.exists(tmp_path / "weights" / "w.data")  # kept, as the CLI says
    assert "kept weights/w.data" in out


# -- what an output path may be -----------------------------------------------------------------

def test_a_symlink_is_written_through(tmp_path):
    from dyndq.model_files import load_model, save_model
    from dyndq.npy import save_array

    save_model(_weights_model(1.0), tmp_path / "real.onnx")
    os.symlink("real.onnx", tmp_path / "link.onnx")
    save_model(_weights_model(2.0), tmp_path / "link.onnx")
    assert os.path.islink(tmp_path / "link.onnx")
    assert np.all(_w(load_model(tmp_path / "real.onnx")) == 2.0)
    np.save(tmp_path / "real.npy", np.zeros(1))
    os.symlink("real.npy", tmp_path / "link.npy")
    save_array(tmp_path / "link.npy", np.ones(1))
    assert os.path.islink(tmp_path / "link.npy") and np.load(tmp_path / "real.npy")[0] == 1


@pytest.mark.parametrize("what", ["fifo", "socket", "dangling"])
def test_anything_but_a_regular_file_is_refused(capsys, tmp_path, what):
    from dyndq.model_files import save_model

    save_model(_weights_model(1.0), tmp_path / "m.onnx")
    if what == "fifo":
        out = tmp_path / "out.onnx"
        os.mkfifo(out)
        expected = "FIFO"
    elif what == "socket":
        import socket

        out = tmp_path / "out.onnx"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(out))
        expected = "socket"
    else:
        out = tmp_path / "out.onnx"
        os.symlink(tmp_path / "nowhere.onnx", out)
        expected = "does not exist"
    code, _, err = call(capsys, "export", tmp_path / "m.onnx", out)
    assert code == 2 and expected in err and "Traceback" not in err, err
    if what == "fifo":
        assert os.path.exists(out) and not os.path.isfile(out)
    code, _, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={_npy(tmp_path)}", "--output-dir", tmp_path)
    assert code == 0, err
    if what == "fifo":  # an output whose file would be a FIFO
        os.remove(tmp_path / "y.npy")
        os.mkfifo(tmp_path / "y.npy")
        code, _, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={_npy(tmp_path)}", "--output-dir", tmp_path)
        assert code == 2 and "FIFO" in err, err


def test_devices_are_refused():
    # Asked of the path check itself: a test that exports to /dev/null would, on code without
    # the check and run as root, replace the machine's /dev/null with a regular file.
    from dyndq.atomic_writes import ModelFileError, _writable_target

    for device in ("/dev/null", "/dev/zero"):
        with pytest.raises(ModelFileError, match="character device"):
            _writable_target(device)


def _npy(folder) -> str:
    path = os.path.join(folder, "x_in.npy")
    np.save(path, np.ones((1, 64), np.float32))
    return path


def test_npy_files_get_the_mode_models_get(tmp_path):
    from dyndq.npy import save_array
    from dyndq.model_files import save_model

    save_model(_weights_model(1.0), tmp_path / "m.onnx")
    save_array(tmp_path / "y.npy", np.zeros(2))
    assert os.stat(tmp_path / "y.npy").st_mode & 0o777 == os.stat(tmp_path / "m.onnx").st_mode & 0o777


# -- external data fields out of range -------------------------------------------------------

@pytest.mark.parametrize("key, value, words", [
    ("offset", "99999999", "exceeds file size"), ("offset", "-5", "not a non-negative"),
    ("length", "-1", "not a non-negative"), ("offset", "abc", "not a non-negative"),
    ("length", "99999999", "exceeds available data"), ("length", "1e3", "not a non-negative"),
])
def test_bad_external_data_fields_are_named(capsys, tmp_path, key, value, words):
    from dyndq.model_files import save_model

    save_model(_weights_model(1.0), tmp_path / "m.onnx", external_data=True)
    m = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    t = next(t for t in m.graph.initializer if t.name == "w")
    entry = next((e for e in t.external_data if e.key == key), None) or t.external_data.add(key=key)
    entry.value = value
    onnx.save(m, tmp_path / "m.onnx")
    for command in (["check"], ["export"], ["lift"]):
        code, out, err = call(capsys, *command, tmp_path / "m.onnx", *([tmp_path / "o.onnx"] if command != ["check"] else []))
        assert code == 2 and words in err and "'w'" in err and "Traceback" not in err, err


# -- an .npy header that declares a huge shape --------------------------------------------------

def test_npy_header_is_checked_against_the_file_size(capsys, tmp_path):
    from dyndq.model_files import save_model

    save_model(matmul_model(), tmp_path / "m.onnx")
    with open(tmp_path / "x.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (2**40, 2**20)})
        f.write(b"\0" * 24)
    code, out, err = call(capsys, "run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}")
    assert code == 2 and "header declares" in err and "24 bytes" in err, err


def test_a_model_with_external_data_written_through_a_link_in_another_folder_loads(tmp_path):
    from dyndq.model_files import load_model, save_model

    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    save_model(_weights_model(1.0), tmp_path / "real" / "m.onnx", external_data=True)
    os.symlink(tmp_path / "real" / "m.onnx", tmp_path / "links" / "m.onnx")
    save_model(_weights_model(2.0), tmp_path / "links" / "m.onnx", external_data=True)
    assert os.listdir(tmp_path / "links") == ["m.onnx"] and os.path.islink(tmp_path / "links" / "m.onnx")
    assert np.all(_w(load_model(tmp_path / "links" / "m.onnx")) == 2.0)
    assert np.all(_w(load_model(tmp_path / "real" / "m.onnx")) == 2.0)
