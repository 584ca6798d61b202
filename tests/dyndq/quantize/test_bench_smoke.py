"""benchmarks/bench_quantize.py runs end to end on a small model (its exactness check included);
its timings are never asserted."""
import importlib.util
import pathlib

BENCH = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "bench_quantize.py"


def test_bench_quantize_runs_small(capsys):
    spec = importlib.util.spec_from_file_location("bench_quantize", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--hidden", "128", "--layers", "1", "--intermediate", "256", "--vocab", "300", "--heads", "2",
                       "--sample-groups", "16", "--scales", "20", "--no-hqq"]) == 0
    text = capsys.readouterr().out
    assert "machine: " in text and "load average" in text
    assert "dyndq rtn gives ONNX Runtime's RTN weights, value for value: yes" in text
    assert "dyndq search" in text and "the bound on 16 sampled groups" in text
    assert "on the reference engine" in text and "dyndq quantize (rtn)" in text
