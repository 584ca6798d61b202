"""oneDNN graph import at scale: `dyndq.onednn.load` of a chain of N ops, and of the anchors.

    .venv/bin/python benchmarks/bench_onednn_import.py [N ...]      (default 1000 5000 20000)

A chain of N ReLU ops (tensor i -> ReLU -> tensor i+1, f32 [2, 8]) written in file order
and reversed (every consumer before its producer), each loaded 5 times in this process:
the median wall time is printed with the JSON's size.  Then the largest anchor of
tests/data/onednn (by op count) the same way.  Import should grow linearly with N: the
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


def median_load(doc, rounds: int = 5) -> float:
    text = json.dumps(doc)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        onednn.load(text)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def largest_anchor() -> Path:
    anchors = [p for p in (ROOT / "tests" / "data" / "onednn").rglob("*.json") if "bad" not in p.parts]
    return max(anchors, key=lambda p: len(json.loads(p.read_text())["graph"]))


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [1000, 5000, 20000]
    for n in sizes:
        for reverse in (False, True):
            doc = chain(n, reverse)
            seconds = median_load(doc, 5 if n <= 5000 else 3)
            print(f"chain of {n:>6} ops ({'reversed' if reverse else 'in order'}, {len(json.dumps(doc)) / 1e6:.1f} MB): "
                  f"load {seconds:.3f} s median ({seconds / n * 1e6:.0f} us per op)")
    anchor = largest_anchor()
    doc = json.loads(anchor.read_text())
    seconds = median_load(doc, 9)
    print(f"largest anchor {anchor.relative_to(ROOT)} ({len(doc['graph'])} ops): load {seconds * 1e3:.1f} ms median")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
