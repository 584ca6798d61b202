"""benchmarks/bench_quantize.py runs end to end on a small model, as a script (its exactness check
included); its timings are never asserted.  benchmarks/bench_data_aware.py too, on its synthetic
MLP: without NNCF (hidden) in the default suite, with it under `-m nncf` (make test-nncf)."""
import pathlib
import subprocess
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_quantize.py"
SMALL = ["--hidden", "128", "--layers", "1", "--intermediate", "256", "--vocab", "300", "--heads", "2",
         "--sample-groups", "16", "--scales", "20", "--no-hqq"]


def test_bench_quantize_runs_small(tmp_path):
    p = subprocess.run([sys.executable, str(BENCH), *SMALL], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    text = p.stdout
    assert "machine: " in text and "load average" in text
    assert "quantize time (4 bits, groups of 128, asymmetric" in text and "ORT RTN (MatMulNBits, GatherBlockQuantized)" in text
    assert "dyndq rtn gives ONNX Runtime's RTN weights, value for value: yes" in text
    assert "dyndq search" in text and "the bound on 16 sampled groups" in text
    assert "on the reference engine" in text and "dyndq quantize (rtn)" in text
    assert "dyndq rtn at 2 bits gives ONNX Runtime's 2-bit RTN weights, value for value: yes" in text
    assert "dyndq search, 2 bits" in text and "dyndq mxfp4" in text and "dyndq nvfp4" in text
    assert "mixed widths, the model as is" in text and "dyndq --budget (int2,int4,int8)" in text


def test_bench_quantize_memory_runs_small(tmp_path):
    """benchmarks/bench_quantize_memory.py end to end on a tiny model, every case profiled (its
    figures are never asserted here: tests/quantization/test_memory.py bounds them, `big`)."""
    bench = BENCH.parent / "bench_quantize_memory.py"
    p = subprocess.run([sys.executable, str(bench), "--gib", "0.005", "--hidden", "64", "--intermediate", "128",
                        "--vocab", "200", "--profile"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    text = p.stdout
    assert "load average" in text and "float model: " in text
    for case in ("file-evaluate", "file-no-evaluate", "memory-evaluate", "memory-no-evaluate"):
        assert f"\n{case} " in text
    assert text.count("4 seeded samples (seed 0; token ids across each embedding's rows)") == 2
    assert "Evaluation: float model" in text and "Evaluation: quantized model" in text


def test_bench_quantize_mixed_only_runs_small(tmp_path):
    p = subprocess.run([sys.executable, str(BENCH), *SMALL, "--mixed-only"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "mixed widths, the model with outlier input channels in attn.o_proj and mlp.down_proj" in p.stdout
    assert "dyndq --budget (+ mxfp4)" in p.stdout


def test_bench_gptq_memory_runs_small(tmp_path):
    """benchmarks/bench_gptq_memory.py end to end on a tiny decoder-like model: one pass, the default
    bound and one layer at a time, each profiled (its figures are never asserted)."""
    import json

    bench = BENCH.parent / "bench_gptq_memory.py"
    p = subprocess.run([sys.executable, str(bench), "--layers", "2", "--hidden", "32", "--intermediate", "64",
                        "--samples", "2", "--profile", "--json"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    measured = json.loads(p.stdout)
    assert "load average" in measured["machine"] and measured["floats"] > 0
    bounds = measured["bounds"]
    assert bounds["one-pass"]["passes"].startswith("the layers' inputs collected in 1 pass over the samples")
    assert bounds["one-layer"]["passes"].startswith("the layers' inputs collected in 4 passes over the samples")
    for run in bounds.values():
        assert run["code"] == 0 and run["peak"] > 0 and "GPTQ rounding" in run["phases"]
        assert run["written"] == bounds["one-pass"]["written"]  # (the same file, whatever the passes)


# -- benchmarks/bench_data_aware.py: the peers and every method of dyndq, side by side -----------------

DATA_AWARE_BENCH = BENCH.parent / "bench_data_aware.py"
TINY = ["--model", "synthetic", "--samples", "2", "--held-out", "2"]


def _rows(text: str) -> dict:
    """{method: its table row's cells} of the script's printed table."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.strip().startswith("| ") and len(cells) == 8 and cells[0] not in ("method", "---"):
            rows[cells[0]] = cells
    return rows


def _run_data_aware(tmp_path, env=None):
    p = subprocess.run([sys.executable, str(DATA_AWARE_BENCH), *TINY], cwd=tmp_path, capture_output=True, text=True,
                       timeout=900, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def _check_ours_and_onnxruntime(text: str) -> dict:
    from dyndq.quantization.numerics import METHODS

    assert "machine: " in text and "load average" in text
    assert "synthetic MLP (seeded, for the tests): 3 MatMul weights at 4 bits, groups of 128" in text
    assert "calibrated on 2 inputs, held out 2" in text
    rows = _rows(text)
    base = rows["ONNX Runtime RTN (MatMulNBits' default)"]
    assert base[3] == "1.000x" and base[1] == "data-free", base
    for m in METHODS:  # every method this dyndq has, a row each with a held-out error, bytes, time and memory
        cells = rows[f"dyndq {m}"]
        assert float(cells[2]) > 0 and cells[3].endswith("x") and int(cells[5]) > 0 and float(cells[6]) >= 0, cells
        assert "(" in cells[7], cells
    # (rtn is ONNX Runtime's RTN, code for code: the same error but for the engines' float sums, run apart)
    assert abs(float(rows["dyndq rtn"][2]) / float(base[2]) - 1) < 1e-3, (rows["dyndq rtn"], base)
    for label in ("ONNX Runtime GPTQWeightOnlyQuantConfig", "ONNX Runtime RTNWeightOnlyQuantConfig", "dyndq gptq act_order"):
        assert float(rows[label][2]) > 0, rows[label]
    # (its GPTQ feeds no error forward: RTN's codes but for its own ties, so about RTN's error; test_gptq_onnxruntime.py)
    gptq, rtn = (float(rows[f"ONNX Runtime {c}WeightOnlyQuantConfig"][2]) for c in ("GPTQ", "RTN"))
    assert abs(gptq / rtn - 1) < 0.05, (gptq, rtn)
    assert "best of ours: dyndq " in text
    return rows


def test_bench_data_aware_runs_small_without_nncf(tmp_path):
    """The default suite: NNCF hidden (a stand-in package whose import fails), so its rows are
    skipped, saying why; ONNX Runtime's and every dyndq method's rows are there."""
    import os

    hide = tmp_path / "hide"
    (hide / "nncf").mkdir(parents=True)
    (hide / "nncf" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")])))
    text = _run_data_aware(tmp_path, env)
    rows = _check_ours_and_onnxruntime(text)
    assert "NNCF rows skipped: NNCF is not installed (ImportError: hidden by the test)" in text
    assert not any(label.startswith("NNCF") for label in rows)


@pytest.mark.nncf
def test_bench_data_aware_runs_small_with_nncf(tmp_path):
    """`make test-nncf`: NNCF's data-free and data-aware rows run; gptq and lora_correction are
    refused by its ONNX backend, and the row says so."""
    pytest.importorskip("nncf", reason="NNCF is not installed (an optional extra): make test-nncf installs it")
    text = _run_data_aware(tmp_path)
    rows = _check_ours_and_onnxruntime(text)
    assert "NNCF rows skipped" not in text
    for label in ("NNCF INT4_ASYM (data-free)", "NNCF INT4_SYM (data-free)", "NNCF INT4_ASYM awq",
                  "NNCF INT4_ASYM scale_estimation", "NNCF INT4_ASYM awq + scale_estimation"):
        assert float(rows[label][2]) > 0, rows[label]
    assert rows["NNCF INT4_ASYM awq"][1] == "calibrated"
    for label in ("NNCF INT4_ASYM gptq", "NNCF INT4_ASYM lora_correction"):
        assert rows[label][2].startswith("refused: ParameterNotSupportedError: ONNX backend does not support"), rows[label]
    assert "best data-aware peer: " in text
