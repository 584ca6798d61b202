"""benchmarks/bench_kernel.py and benchmarks/bench_types.py run end to end on a small size (their
oracle checks included), as scripts in their own processes; timings are never asserted."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_kernel.py"
BENCH_TYPES = ROOT / "benchmarks" / "bench_types.py"


@pytest.mark.parametrize("kernel,level", [pytest.param("compiled", None, marks=pytest.mark.native),
                                          pytest.param("compiled", 0, marks=pytest.mark.native), ("numpy", None)])
def test_bench_kernel_runs_small(kernel, level):
    pytest.importorskip("onnxruntime")
    extra = [] if level is None else ["--level", str(level)]
    out = subprocess.run([sys.executable, str(BENCH), "--size", "64", "--reps", "1", "--no-tiny", "--no-reference",
                          "--kernel", kernel, *extra], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout
    assert f"our {kernel} kernel" in text
    if level is not None:
        assert f"at level {level} (scalar variant)" in text
    assert "machine: " in text and "NumPy" in text and "onnxruntime" in text
    assert "geometric means" in text and "targets:" in text
    assert text.count("| uint8 ") == 8 and text.count("| int8 ") == 6
    assert text.count("| uint4 ") == 24 and text.count("| int4 ") == 24
    assert text.count("[met]") + text.count("[MISSED]") == 7


@pytest.mark.native
@pytest.mark.parametrize("level", [None, 0])
def test_bench_types_runs_small(level):
    """Every code type, both outputs, both thread settings; ONNX Runtime where it has a kernel."""
    pytest.importorskip("onnxruntime")
    extra = [] if level is None else ["--level", str(level)]
    out = subprocess.run([sys.executable, str(BENCH_TYPES), "--size", "64", "--reps", "1", *extra], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout
    assert "machine: " in text and "onnxruntime" in text and "goals:" in text
    if level is not None:
        assert f"at level {level} (scalar variant" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and " ms" not in line and "codes " not in line]
    assert len(rows) == 2 * (16 * 2 + 2)  # two thread settings; 16 types, float4 twice, two outputs each
    assert sum("no kernel" in r for r in rows) == 2 * 8  # float4 (both scales) and float6: ORT has none
    assert text.count("[met]") + text.count("[MISSED]") == 4
