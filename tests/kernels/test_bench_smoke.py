"""The benchmark runs end to end on a small size (its oracle checks included); timings are never asserted."""
import importlib.util
import pathlib

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_kernel.py"


@pytest.mark.parametrize("kernel,level", [pytest.param("compiled", None, marks=pytest.mark.native),
                                          pytest.param("compiled", 0, marks=pytest.mark.native), ("numpy", None)])
def test_bench_kernel_runs_small(capsys, kernel, level):
    pytest.importorskip("onnxruntime")
    spec = importlib.util.spec_from_file_location("bench_kernel", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    extra = [] if level is None else ["--level", str(level)]
    assert bench.main(["--size", "64", "--reps", "1", "--no-tiny", "--no-reference", "--kernel", kernel, *extra]) == 0
    text = capsys.readouterr().out
    assert f"our {kernel} kernel" in text
    if level is not None:
        assert f"at level {level} (scalar variant)" in text
    assert "machine: " in text and "NumPy" in text and "onnxruntime" in text
    assert "geometric means" in text and "targets:" in text
    assert text.count("| uint8 ") == 8 and text.count("| int8 ") == 6
    assert text.count("| uint4 ") == 24 and text.count("| int4 ") == 24
    assert text.count("[met]") + text.count("[MISSED]") == 7
