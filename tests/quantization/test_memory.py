"""`dyndq quantize`'s peak memory on a 1 GiB float model, measured in fresh processes by
benchmarks/bench_quantize_memory.py (VmHWM, which counts ONNX Runtime's memory too): with
evaluation on, under 2.5 times the float model's bytes from a file with external data and from
the model loaded in memory; without evaluation, from external data, near the largest weight plus
the imports.  `big`: the model and the runs take several GiB (`make test-big`)."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.big

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_quantize_memory.py"


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    p = subprocess.run([sys.executable, str(BENCH), "--gib", "1.0", "--json"], cwd=tmp_path_factory.mktemp("memory"),
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


def test_with_evaluation_the_peak_stays_under_two_and_a_half_times_the_float_model(measured):
    floats = measured["floats"]
    assert floats > 0.9 * 2**30
    for case in ("file-evaluate", "memory-evaluate"):
        run = measured["cases"][case]
        # (the evaluation ran: both models on the 4 seeded samples)
        assert run["note"].startswith("4 seeded samples (seed 0; token ids across each embedding's rows)"), run["note"]
        assert ", 8 runs in " in run["note"], run["note"]
        assert run["peak"] < 2.5 * floats, f"{case}: {run['peak'] / floats:.2f}x the float model"


def test_from_external_data_without_evaluation_the_peak_is_near_one_largest_weight(measured):
    imports, largest = measured["cases"]["imports"]["peak"], measured["largest"]
    run = measured["cases"]["file-no-evaluate"]
    assert run["peak"] < imports + 2.5 * largest, f"imports + {(run['peak'] - imports) / largest:.2f}x the largest weight"
    assert run["peak"] < 0.5 * measured["floats"]
    assert measured["cases"]["memory-no-evaluate"]["note"] == "not measured (evaluate=False)"
