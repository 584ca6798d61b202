"""The streamed import onto a float model over 2 GiB with external data (34 float32 weights of
4096 x 4096: 2.1 GiB), from a GGUF of their Q8_0 tensors (17 MiB each, 578 MiB): external data
out, and the peak resident memory of the import over a fresh Python's after a warm-up import
under 1.5x the largest tensor, the graph (a few KiB) and 4 MiB of the allocator's and the
interpreter's slack (benchmarks/bench_import_memory.py measures it).  `big`: 2.7 GiB of files
(`make test-big`)."""
from __future__ import annotations

import pathlib
import sys

import pytest

pytestmark = pytest.mark.big

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_model_over_2_gib_is_imported_streamed_within_the_bound(tmp_path):
    pytest.importorskip("gguf", reason="the `gguf` package (the test extra installs it: make test)")
    sys.path.insert(0, str(BENCH))
    try:
        import bench_import_memory as bench
    finally:
        sys.path.remove(str(BENCH))
    result = bench.measure(rows=4096, cols=4096, tensors=34, cases=("stream",), folder=str(tmp_path))
    sizes, run = result["sizes"], result["cases"]["stream"]
    assert sizes["floats"] > 2 ** 31
    assert run["imported"] == 34 and run["left_float"] == ["kept.bias"]
    assert 0.9 * sizes["checkpoint"] < run["written"] < 1.1 * sizes["checkpoint"]  # (external data out: the codes once)
    extra = run["peak"] - run["base"]
    bound = 1.5 * sizes["largest_tensor"] + (4 << 20)
    print(f"peak - base {extra / 2**20:.1f} MiB = {extra / sizes['largest_tensor']:.2f}x the largest tensor "
          f"({sizes['largest_tensor'] / 2**20:.1f} MiB); checkpoint {sizes['checkpoint'] / 2**20:.0f} MiB, "
          f"float weights {sizes['floats'] / 2**30:.2f} GiB; {run['seconds']:.0f} s")
    assert extra < bound, f"peak - base {extra / 2**20:.1f} MiB, bound {bound / 2**20:.1f} MiB"
