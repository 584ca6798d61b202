"""benchmarks/bench_lift_2bit.py runs end to end on a small weight, as a script in its own
process, and both its models come back byte for byte; timings are never asserted."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
BENCH = ROOT / "benchmarks" / "bench_lift_2bit.py"


def test_bench_lift_2bit_runs_small():
    out = subprocess.run([sys.executable, str(BENCH), "256"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout
    assert "machine: " in text and "onnxruntime" in text
    assert text.count("lifted 1, left 0 alone; way back byte for byte: True") == 2
    assert "initializers: 25088 B as MatMulNBits, 25088 B lifted (1.000x)" in text  # (uint2 packed as ONNX stores it)
    assert "half-integer zero points lifted exactly as codes 2q (uint4), zero points 2zp (uint4)" in text
