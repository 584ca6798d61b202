"""oneDNN graph import at scale: `dyndq.onednn.load` of a chain of N ops, and of the anchors.

    .venv/bin/python benchmarks/bench_onednn_import.py [N ...]      (default 1000 5000 20000)

A chain of N ReLU ops (tensor i -> ReLU -> tensor i+1, f32 [2, 8]) written in file order
and reversed (every consumer before its producer), each loaded 5 times in this process:
the median wall and CPU times are printed with the JSON's size (on a shared machine the CPU
time is what the load costs; the wall time adds the waits for a core).  Then the slowest to load of the 12
anchors (tests/data/onednn), 9 loads each.  Import should grow linearly with N: the
reader sorts ops with a ready queue and counts duplicate ids in one pass.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from dyndq import onednn

ROOT = Path(__file__).resolve().parents[1]


def chain(n: int, reverse: bool = False) -> dict:
    """A oneDNN graph of n ReLU ops in a row."""
    def lt(i):
        return {"id": i, "dtype": "f32", "shape": [2, 8], "stride": [8, 1], "layout_type": "strided",
                "property_type": "undef"}
    ops = [{"id": i, "name": f"relu_{i}", "kind": "ReLU", "attrs": {}, "inputs": [lt(i)], "outputs": [lt(i + 1)]}
           for i in range(n)]
    return {"version": "3.7.0", "engine_kind": "cpu", "fpmath_mode": "strict", "input_ports": [0],
            "output_ports": [n], "graph": ops[::-1] if reverse else ops}


def median_load(doc, rounds: int = 5) -> tuple[float, float]:
    """(wall, CPU) seconds of `onednn.load`, medians: on a shared machine the wall time includes
    the waits for a core, the CPU time what the load itself costs."""
    text = json.dumps(doc)
    wall, cpu = [], []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        onednn.load(text)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def anchors() -> list[Path]:
    """The 12 anchors: oneDNN's benchdnn graphs that hold DynamicDequantize."""
    data = ROOT / "tests" / "data" / "onednn"
    return sorted(p for p in data.rglob("*.json") if not {"bad", "kinds", "upstream"} & set(p.relative_to(data).parts))


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [1000, 5000, 20000]
    for n in sizes:
        for reverse in (False, True):
            doc = chain(n, reverse)
            wall, cpu = median_load(doc, 5 if n <= 5000 else 3)
            print(f"chain of {n:>6} ops ({'reversed' if reverse else 'in order'}, {len(json.dumps(doc)) / 1e6:.1f} MB): "
                  f"load {wall:.3f} s wall, {cpu:.3f} s CPU, medians ({cpu / n * 1e6:.0f} us CPU per op)")
    (wall, cpu), path = max((median_load(json.loads(p.read_text()), 9), p) for p in anchors())
    doc = json.loads(path.read_text())
    print(f"slowest of the 12 anchors to load: {path.relative_to(ROOT)} ({len(doc['graph'])} ops): "
          f"{wall * 1e3:.1f} ms wall, {cpu * 1e3:.1f} ms CPU, medians")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
