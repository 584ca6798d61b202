"""Models over 2 GiB: time and peak memory of `dyndq check`, `export`, `lift` and `run`.

    .venv/bin/python benchmarks/bench_big_model.py [GIB]      (default 2.1)

Builds a model whose int8 weights (GIB GiB, kept as external data, as such models
are) feed Gather -> DynamicDequantize, then runs each command in a fresh process
and reports its wall time and peak resident memory (ru_maxrss) against the model's
size.  The data file is written sparse (all zeros): fast to make, real to read.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import dyndq

COLS = 64


def big_model(folder: str, gib: float) -> str:
    """model.onnx + model.onnx.data in `folder`: w int8[rows, 64] (gib GiB) -> Gather(idx) -> DynamicDequantize."""
    rows = int(gib * 2**30) // COLS
    w = TensorProto(name="w", data_type=TensorProto.INT8, dims=[rows, COLS])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "model.onnx.data"), ("offset", "0"), ("length", str(rows * COLS))):
        w.external_data.add(key=key, value=value)
    with open(os.path.join(folder, "model.onnx.data"), "wb") as f:
        f.truncate(rows * COLS)
    nodes = [
        helper.make_node("Gather", ["w", "idx"], ["rows"], name="pick"),
        dyndq.make_node(["rows", "scales", "zps"], ["y"], name="dq", qtype="per_channel", axis=1),
    ]
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("idx", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, COLS])],
        [w, numpy_helper.from_array(np.full(COLS, 0.5, np.float32), "scales"),
         numpy_helper.from_array(np.arange(COLS, dtype=np.int8), "zps")])
    model = dyndq.make_model(graph)
    onnx.save_model(model, os.path.join(folder, "model.onnx"))  # small: the weights are in the data file
    np.save(os.path.join(folder, "idx.npy"), np.array([0, rows - 1], np.int64))
    return os.path.join(folder, "model.onnx")


_MEASURE = """
import resource, sys, time
from dyndq.cli import main
t = time.perf_counter()
code = main(sys.argv[1:])
print(f"@@ {code} {time.perf_counter() - t:.2f} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}")
"""


def measure(argv: list[str], cwd: str) -> tuple[int, float, int, str]:
    """(exit code, seconds, peak RSS in bytes, output) of `dyndq ARGV` in a fresh process."""
    r = subprocess.run([sys.executable, "-c", _MEASURE, *argv], cwd=cwd, capture_output=True, text=True)
    line = next((l for l in r.stdout.splitlines() if l.startswith("@@ ")), None)
    if line is None:
        raise SystemExit(f"dyndq {' '.join(argv)} failed:\n{r.stdout}{r.stderr}")
    _, code, seconds, rss = line.split()
    return int(code), float(seconds), int(rss), (r.stdout + r.stderr).replace(line, "").strip()


def main(gib: float = 2.1) -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        big_model(d, gib)
        size = os.path.getsize(os.path.join(d, "model.onnx.data"))
        baseline = measure(["schema"], d)[2]
        print(f"model: {size / 2**30:.2f} GiB of int8 weights in external data; "
              f"python + dyndq + onnx + onnxruntime alone: {baseline / 2**30:.2f} GiB resident")
        for argv in (["check", "model.onnx"], ["export", "model.onnx", "exported.onnx"],
                     ["lift", "exported.onnx", "lifted.onnx"],
                     ["run", "model.onnx", "-i", "idx=idx.npy"], ["run", "exported.onnx", "-i", "idx=idx.npy", "--engine", "onnxruntime"]):
            code, seconds, rss, out = measure(argv, d)
            print(f"dyndq {' '.join(argv):60s} exit {code}  {seconds:6.1f} s  peak {rss / 2**30:5.2f} GiB "
                  f"= {rss / size:4.2f} x model   ({(rss - baseline) / size:4.2f} x above the baseline)")
            if code != 0:
                print("   ", out.replace("\n", "\n    "))


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else 2.1)
