"""oneDNN example inputs through their .npy files (docs/onednn.md's transcripts are run by
tests/test_docs.py)."""
from pathlib import Path

from dyndq.cli import main

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
    """Through dyndq.files' atomic writer: a FIFO at the output path is refused, not replaced."""
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
