"""benchmarks/bench_quantize.py runs end to end on a small model, as a script (its exactness check
included); its timings are never asserted."""
import pathlib
import subprocess
import sys

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
