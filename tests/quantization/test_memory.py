"""`dyndq quantize`'s peak memory on a 1 GiB float model, measured in a fresh process (VmHWM,
which counts ONNX Runtime's memory too): with evaluation on, under 2.5 times the float model's
bytes from a file with external data and from the model loaded in memory; without evaluation,
from external data, near the largest weight plus the imports.  `big`: the model and the runs
take several GiB (`make test-big`); the figures are benchmarks/bench_quantize_memory.py's."""
from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.big

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_quantize_memory.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_quantize_memory", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory")
    src = str(folder / "float.onnx")
    floats, largest = _bench().write_model(src, 1.0)
    return src, str(folder / "q.onnx"), floats, largest


def test_with_evaluation_the_peak_stays_under_two_and_a_half_times_the_float_model(model):
    src, dst, floats, _ = model
    bench = _bench()
    for case in ("file-evaluate", "memory-evaluate"):
        run = bench.run_case(case, src, dst, profile=False)
        # (the evaluation ran: on the seeded samples, both models)
        assert run["note"].startswith("4 seeded samples (seed 0; token ids across each embedding's rows)"), run["note"]
        assert ", 8 runs in " in run["note"], run["note"]
        assert run["peak"] < 2.5 * floats, f"{case}: {run['peak'] / floats:.2f}x the float model"


def test_from_external_data_without_evaluation_the_peak_is_near_one_largest_weight(model):
    src, dst, floats, largest = model
    bench = _bench()
    imports = bench.run_case("imports", src, dst, profile=False)["peak"]
    run = bench.run_case("file-no-evaluate", src, dst, profile=False)
    assert run["peak"] < imports + 2.5 * largest, \
        f"imports + {(run['peak'] - imports) / largest:.2f}x the largest weight"
    assert run["peak"] < 0.5 * floats
