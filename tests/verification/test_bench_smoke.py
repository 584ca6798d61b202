"""benchmarks/bench_verify.py runs end to end on a small made model, as a script; its timings are never asserted."""
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_verify.py"


def test_bench_verify_runs_small(tmp_path):
    p = subprocess.run([sys.executable, str(BENCH), "--only", "made", "--layers", "3"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "made (3 MatMul layers of 64 x 64): 3 weights; both models once on each engine" in p.stdout, p.stdout
    assert "x), its weights alone" in p.stdout and "cores, load" in p.stdout
