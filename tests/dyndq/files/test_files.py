"""dyndq.model_files and dyndq.atomic_writes: loading with external data, refusing unsafe data paths, atomic saves."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from dyndq import atomic_writes, model_files
from dyndq.atomic_writes import ModelFileError
from dyndq.model_files import load_model, read_model, save_model


def _model(n=64) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.arange(n * n, dtype=np.float32).reshape(n, n), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
        [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def _weights(model) -> np.ndarray:
    return numpy_helper.to_array(model.graph.initializer[0])


def test_round_trip(tmp_path):
    m = _model()
    save_model(m, tmp_path / "m.onnx")
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]  # no temporary left behind
    loaded = read_model(tmp_path / "m.onnx")
    assert not loaded.external_data
    assert loaded.model == m


def test_save_does_not_modify_the_model(tmp_path):
    m = _model()
    before = m.SerializeToString()
    save_model(m, tmp_path / "m.onnx", external_data=True)
    assert m.SerializeToString() == before


def test_external_data_round_trip(tmp_path):
    m = _model()
    save_model(m, tmp_path / "m.onnx", external_data=True)
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]
    assert os.path.getsize(tmp_path / "m.onnx") < 1000  # the weights are not in the model file
    loaded = read_model(tmp_path / "m.onnx")
    assert loaded.external_data and loaded.locations == ["m.onnx.data"]
    np.testing.assert_array_equal(_weights(loaded.model), _weights(m))
    # Loaded data is held in memory: saving elsewhere (even inline) keeps it.
    save_model(loaded.model, tmp_path / "copy.onnx")
    np.testing.assert_array_equal(_weights(load_model(tmp_path / "copy.onnx")), _weights(m))


def test_external_data_written_by_onnx_loads(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    onnx.save_model(_model(), sub / "m.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    loaded = read_model(sub / "m.onnx")
    assert loaded.locations == ["weights.bin"]
    np.testing.assert_array_equal(_weights(loaded.model), _weights(_model()))


def _point_data_at(model_path, location):
    m = onnx.load(model_path, load_external_data=False)
    for t in m.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = location
    onnx.save_model(m, model_path)


@pytest.mark.parametrize("where", ["dotdot", "absolute", "symlink"])
def test_external_data_outside_the_folder_is_refused(tmp_path, where):
    inner = tmp_path / "inner"
    inner.mkdir()
    save_model(_model(), inner / "m.onnx", external_data=True)
    secret = tmp_path / "secret.data"
    os.replace(inner / "m.onnx.data", secret)
    if where == "dotdot":
        _point_data_at(inner / "m.onnx", "../secret.data")
    elif where == "absolute":
        _point_data_at(inner / "m.onnx", str(secret))
    else:
        os.symlink(secret, inner / "m.onnx.data")
    with pytest.raises(ModelFileError, match="refused"):
        load_model(inner / "m.onnx")


def test_missing_external_data_file(tmp_path):
    save_model(_model(), tmp_path / "m.onnx", external_data=True)
    os.remove(tmp_path / "m.onnx.data")
    with pytest.raises(ModelFileError, match="m.onnx"):
        load_model(tmp_path / "m.onnx")


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "not an ONNX model"),
        (b"hello world\n", "not an ONNX model"),
        (b"\x93NUMPY\x01\x00v\x00{'descr': '<i8'}", "not an ONNX model"),
        (bytes(range(256)) * 4, "not an ONNX model"),
    ],
)
def test_not_onnx(tmp_path, content, match):
    (tmp_path / "x.onnx").write_bytes(content)
    with pytest.raises(ModelFileError, match=match):
        load_model(tmp_path / "x.onnx")


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(ModelFileError, match="no such file"):
        load_model(tmp_path / "nope.onnx")
    with pytest.raises(ModelFileError, match="folder"):
        load_model(tmp_path)
    with pytest.raises(ModelFileError, match="folder does not exist"):
        save_model(_model(), tmp_path / "no" / "m.onnx")


def _fail_after(monkeypatch, n_replaces):
    """Make the n-th os.replace in dyndq.atomic_writes fail, as if the process died there."""
    real = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == n_replaces:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(model_files.os, "replace", replace)
    return calls


def test_failed_write_leaves_original_untouched(tmp_path, monkeypatch):
    target = tmp_path / "m.onnx"
    save_model(_model(8), target)
    original = target.read_bytes()

    def broken_save(model, path, **kw):
        with open(path, "wb") as f:
            f.write(b"half a mod")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model_files.onnx, "save_model", broken_save)
    with pytest.raises(ModelFileError, match="No space left"):
        save_model(_model(64), target)
    assert target.read_bytes() == original
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]  # the staging folder is gone


def test_failed_rename_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "new.onnx"
    _fail_after(monkeypatch, 1)
    with pytest.raises(ModelFileError):
        save_model(_model(), target)
    assert os.listdir(tmp_path) == []


def test_interrupted_external_save_keeps_old_model_consistent(tmp_path, monkeypatch):
    """Data file replaced, then failure before the model is: the old model still loads."""
    target = tmp_path / "m.onnx"
    save_model(_model(64), target, external_data=True)
    calls = _fail_after(monkeypatch, 2)
    with pytest.raises(ModelFileError):
        save_model(_model(64), target, external_data=True)
    # the data goes to a new name (the old model's data file is never rewritten), removed again
    assert [os.path.basename(c) for c in calls] == ["m.onnx.1.data", "m.onnx"]
    np.testing.assert_array_equal(_weights(load_model(target)), _weights(_model(64)))
    assert sorted(os.listdir(tmp_path)) == ["m.onnx", "m.onnx.data"]


def test_keyboard_interrupt_cleans_up(tmp_path, monkeypatch):
    def interrupted(model, path, **kw):
        open(path, "wb").close()
        raise KeyboardInterrupt

    monkeypatch.setattr(model_files.onnx, "save_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_model(_model(), tmp_path / "m.onnx")
    assert os.listdir(tmp_path) == []


def test_location_must_be_a_plain_name(tmp_path):
    with pytest.raises(ModelFileError, match="plain file name"):
        save_model(_model(), tmp_path / "m.onnx", external_data=True, location="../w.data")


# -- write_together: a file and a folder of files, all or nothing ---------------------------------


def _writer(text: bytes):
    return lambda f: f.write(text)


def _failing_after(n: int):
    """File writers of which the n-th (counting from 1) fails as a full disk does."""
    def write(f):
        raise OSError(28, "No space left on device")
    return {f"w{i}.npy": (_writer(b"new %d" % i) if i != n else write) for i in range(1, 4)}


def _tree(folder) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else {}


def test_write_together_writes_the_file_and_the_folder(tmp_path):
    written = atomic_writes.write_together(tmp_path / "g.json", _writer(b"{}"), tmp_path / "g-weights",
                                   {"a.npy": _writer(b"A"), "b.npy": _writer(b"B")})
    assert (tmp_path / "g.json").read_bytes() == b"{}" and _tree(tmp_path / "g-weights") == {"a.npy": b"A", "b.npy": b"B"}
    assert sorted(written) == [str(tmp_path / "g-weights" / n) for n in ("a.npy", "b.npy")]
    assert oct((tmp_path / "g-weights").stat().st_mode & 0o777) == oct(0o777 & ~atomic_writes._umask())
    assert sorted(os.listdir(tmp_path)) == ["g-weights", "g.json"]


@pytest.mark.parametrize("before", [False, True], ids=["new", "over-a-previous-write"])
def test_a_failure_midway_leaves_nothing_new_and_nothing_damaged(tmp_path, before):
    path, folder = tmp_path / "g.json", tmp_path / "g-weights"
    if before:
        atomic_writes.write_together(path, _writer(b"old"), folder, {"w1.npy": _writer(b"old 1"), "mine.txt": _writer(b"x")})
    was = (path.read_bytes() if before else None, _tree(folder))
    with pytest.raises(ModelFileError, match="No space left"):
        atomic_writes.write_together(path, _writer(b"new"), folder, _failing_after(2))
    assert (path.read_bytes() if path.exists() else None, _tree(folder)) == was
    assert sorted(os.listdir(tmp_path)) == (["g-weights", "g.json"] if before else [])  # no staging file left


@pytest.mark.parametrize("before", [False, True], ids=["new", "over-a-previous-write"])
def test_a_failure_of_the_last_rename_puts_the_folder_back(tmp_path, monkeypatch, before):
    path, folder = tmp_path / "g.json", tmp_path / "g-weights"
    if before:
        atomic_writes.write_together(path, _writer(b"old"), folder, {"w1.npy": _writer(b"old 1")})
    was = (path.read_bytes() if before else None, _tree(folder))
    replace = os.replace

    def failing_replace(src, dst):
        if os.fspath(dst) == str(path):
            raise OSError(5, "Input/output error", str(path))
        return replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(ModelFileError, match="Input/output error"):
        atomic_writes.write_together(path, _writer(b"new"), folder, _failing_after(0))
    assert (path.read_bytes() if path.exists() else None, _tree(folder)) == was
    assert sorted(os.listdir(tmp_path)) == (["g-weights", "g.json"] if before else [])


def test_an_interrupt_midway_leaves_nothing(tmp_path):
    def interrupted(f):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        atomic_writes.write_together(tmp_path / "g.json", _writer(b"{}"), tmp_path / "g-weights",
                             {"a.npy": _writer(b"A"), "b.npy": interrupted})
    assert os.listdir(tmp_path) == []


def test_write_together_refuses_a_folder_that_is_a_file_and_names_that_are_paths(tmp_path):
    (tmp_path / "g-weights").write_bytes(b"not a folder")
    with pytest.raises(ModelFileError, match="is not a folder"):
        atomic_writes.write_together(tmp_path / "g.json", _writer(b"{}"), tmp_path / "g-weights", {"a.npy": _writer(b"A")})
    with pytest.raises(ModelFileError, match="not a plain file name"):
        atomic_writes.write_together(tmp_path / "g.json", _writer(b"{}"), tmp_path / "w", {"../a.npy": _writer(b"A")})
    assert sorted(os.listdir(tmp_path)) == ["g-weights"]
