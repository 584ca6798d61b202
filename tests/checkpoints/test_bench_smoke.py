"""benchmarks/bench_import.py runs end to end on a tiny model (two formats: a GGUF K-quant and GPTQ
with act-order), as a script; its figures are never asserted."""
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_import.py"


def test_bench_import_runs_small(tmp_path):
    p = subprocess.run([sys.executable, str(BENCH), "--mb", "0.5", "--runs", "3", "--repeats", "1",
                        "--formats", "Q4_K,GPTQ act-order"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    text = p.stdout
    assert "machine: " in text and "load at the end" in text and "model: hidden 256" in text
    assert "ORT int4 (MatMulNBitsQuantizer" in text and "MatMulNBits:7" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| format")]
    assert [r.split(" | ")[0:4:3] for r in rows] == [["| Q4_K", "dyndq (as onnx)"], ["| Q4_K", "onnxruntime"],
                                                     ["| GPTQ act-order", "dyndq (as onnx)"],
                                                     ["| GPTQ act-order", "onnxruntime"]]
    assert all(r.rstrip().endswith("|") and "MatMul:7" in r for r in rows)


def test_bench_import_refuses_an_unknown_format(tmp_path):
    p = subprocess.run([sys.executable, str(BENCH), "--formats", "Q4_0,Q9_9"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "unknown formats ['Q9_9']" in p.stderr


def test_bench_import_fused_measures_the_scales_cast_small(tmp_path):
    """benchmarks/bench_import_fused.py's `scales-cast` (docs/import.md's figures of the Cast of a
    fused weight's float16 d), as a script, on a small MatMulNBits: the float16 d through a Cast
    gives the bits of float32 scales stored, 4- and 8-bit, with ONNX Runtime's optimisations on and off."""
    pytest.importorskip("onnxruntime")
    p = subprocess.run([sys.executable, str(BENCH.with_name("bench_import_fused.py")), "scales-cast", "128", "10", "1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 8 and all("same bits True" in line for line in lines), lines
    assert sum("float16 + Cast" in line for line in lines) == 4
