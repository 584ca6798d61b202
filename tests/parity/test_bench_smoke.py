"""benchmarks/bench_parity.py runs end to end on a small model, as a script; its timings are never asserted."""
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_parity.py"


def test_bench_parity_runs_small(tmp_path):
    p = subprocess.run([sys.executable, str(BENCH), "--hidden", "64", "--layers", "1", "--repeats", "1"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "machine: " in p.stdout and "load average" in p.stdout
    assert "QDQ int4, hidden 64, 1 layer(s)" in p.stdout and "named: QDQSelectorActionTransformer" in p.stdout
