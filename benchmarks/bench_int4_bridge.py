"""The int4 bridge's figures: what pre-fusing for ONNX Runtime saves at load, and MatMul latency.

    .venv/bin/python benchmarks/bench_int4_bridge.py [LAYERS]      (default 20: about 1.03 B weights)

1. Session init: a decoder-shaped chain of int4 MatMuls (hidden 2048, MLP 5632, as a 1 B LLM;
   per layer q, k, v, o, gate, up, down; LAYERS layers), built as DynamicDequantize-2 per_group
   (uint4 codes with zero points, groups of 32 along K) + MatMul, is exported twice: standard
   QDQ (`export`: DequantizeLinear-21 blocked + MatMul, which ONNX Runtime fuses into
   MatMulNBits at load at its default level) and pre-fused (`export(target="onnxruntime")`:
   MatMulNBits written).  Each is loaded by ONNX Runtime (CPU, default optimization level,
   and the QDQ one also with basic optimizations, unfused) in a fresh process: the time to
   create the session and the process's peak resident memory, median of REPEATS.
2. Batch-1 MatMul latency (M = 1, one token) of one 2048 x 5632 layer: MatMulNBits at
   accuracy_level 0 and 4 against DequantizeLinear + MatMul as written (basic optimizations) and
   as ONNX Runtime fuses it at its default level; one intra-op thread; median of RUNS calls.

The codes are random (seeded): what is measured does not depend on their values.
"""
from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import ml_dtypes
import numpy as np
from onnx import TensorProto, helper, numpy_helper

import dyndq

HIDDEN, FFN, BLOCK = 2048, 5632, 32
REPEATS, RUNS = 3, 200


def weight(rng, name, K, N):
    codes = rng.integers(0, 16, (K, N), dtype=np.uint8).astype(ml_dtypes.uint4)
    scales = (rng.random((K // BLOCK, N), dtype=np.float32) * 0.01 + 0.001).astype(np.float32)
    zps = rng.integers(0, 16, (K // BLOCK, N), dtype=np.uint8).astype(ml_dtypes.uint4)
    inits = [numpy_helper.from_array(codes, f"{name}_q"), numpy_helper.from_array(scales, f"{name}_s"),
             numpy_helper.from_array(zps, f"{name}_z")]
    node = dyndq.make_node([f"{name}_q", f"{name}_s", f"{name}_z"], [name], name=f"{name}_dq", qtype="per_group",
                           group_shape=[BLOCK, 1])
    return inits, node


def chain(layers: int, seed: int = 0):
    """x [1, HIDDEN] -> layers of q, k, v, o, gate, up (gate * up), down: int4 weights through DynamicDequantize."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        p = f"l{i}"
        for n, (K, N) in (("q", (HIDDEN, HIDDEN)), ("k", (HIDDEN, HIDDEN)), ("v", (HIDDEN, HIDDEN)), ("o", (HIDDEN, HIDDEN)),
                          ("gate", (HIDDEN, FFN)), ("up", (HIDDEN, FFN)), ("down", (FFN, HIDDEN))):
            w_inits, w_node = weight(rng, f"{p}_{n}_w", K, N)
            inits += w_inits
            nodes.append(w_node)
        for n in ("q", "k", "v", "o"):
            nodes.append(helper.make_node("MatMul", [x, f"{p}_{n}_w"], [f"{p}_{n}"]))
            x = f"{p}_{n}"
        nodes.append(helper.make_node("MatMul", [x, f"{p}_gate_w"], [f"{p}_gate"]))
        nodes.append(helper.make_node("MatMul", [x, f"{p}_up_w"], [f"{p}_up"]))
        nodes.append(helper.make_node("Mul", [f"{p}_gate", f"{p}_up"], [f"{p}_act"]))
        nodes.append(helper.make_node("MatMul", [f"{p}_act", f"{p}_down_w"], [f"{p}_down"]))
        x = f"{p}_down"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", HIDDEN])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["m", HIDDEN])], inits)
    return dyndq.make_model(graph, opset=21)


# The peak is the process's own high-water mark (VmHWM, which starts anew at exec), not ru_maxrss:
# Linux carries ru_maxrss over from the parent a subprocess was forked from.
_LOAD = """
import sys, time
import onnxruntime as ort

def hwm():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))

options = ort.SessionOptions()
options.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[sys.argv[2]]
options.log_severity_level = 3
before = hwm()
t = time.perf_counter()
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
seconds = time.perf_counter() - t
print(f"@@ {seconds:.3f} {hwm()} {before}")
"""


def load(path: str, level: str) -> tuple[float, int, int]:
    """(seconds to create the session, peak RSS in bytes, RSS before loading) in a fresh process."""
    r = subprocess.run([sys.executable, "-c", _LOAD, path, level], capture_output=True, text=True)
    line = next((l for l in r.stdout.splitlines() if l.startswith("@@ ")), None)
    if line is None:
        raise SystemExit(f"loading {path} failed:\n{r.stdout}{r.stderr}")
    _, seconds, peak, before = line.split()
    return float(seconds), int(peak), int(before)


def latency(model, level: str, config: dict | None = None) -> float:
    """Median seconds of one batch-1 call."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[level]
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    x = {"x": np.random.default_rng(1).standard_normal((1, HIDDEN)).astype(np.float32)}
    for _ in range(20):
        session.run(None, x)
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        session.run(None, x)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def machine() -> str:
    name = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
                 if l.startswith("Model name")), platform.processor())
    import onnxruntime as ort

    return f"{name}, {os.cpu_count()} cores; ONNX Runtime {ort.__version__}; load {os.getloadavg()[0]:.2f} (1 min)"


def main(layers: int = 20) -> None:
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        model = chain(layers)
        weights = layers * (4 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN)
        paths = {}
        for label, target in (("standard QDQ", "onnx"), ("pre-fused MatMulNBits", "onnxruntime")):
            t = time.perf_counter()
            out, report = dyndq.export_with_report(model, target=target)
            paths[label] = os.path.join(d, f"{target}.onnx")
            dyndq.save_model(out, paths[label], external_data=True)
            size = os.path.getsize(paths[label] + ".data")
            print(f"{label}: {report.summary()}; {size / 2**20:.0f} MiB of tensors; export {time.perf_counter() - t:.1f} s")
            del out
        del model
        print(f"\n1. session init, {weights / 1e9:.2f} B int4 weights in MatMuls ({layers} layers), "
              f"median of {REPEATS} fresh processes")
        print(f"   {'model':24s} {'ORT level':10s} {'init s':>8s} {'peak RSS GiB':>13s} {'(before load)':>14s}")
    # (ONNX Runtime maps external data files: what the basic level never touches is not resident)
        rows = [("standard QDQ", "all"), ("standard QDQ", "basic"), ("pre-fused MatMulNBits", "all")]
        for label, level in rows:
            runs = [load(paths[label], level) for _ in range(REPEATS)]
            seconds = statistics.median(r[0] for r in runs)
            peak = statistics.median(r[1] for r in runs)
            before = statistics.median(r[2] for r in runs)
            print(f"   {label:24s} {level:10s} {seconds:8.2f} {peak / 2**30:13.2f} {before / 2**30:14.2f}")

    rng = np.random.default_rng(0)
    inits, node = weight(rng, "w", HIDDEN, FFN)
    graph = helper.make_graph([node, helper.make_node("MatMul", ["x", "w"], ["y"])], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, HIDDEN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, FFN])], inits)
    single = dyndq.make_model(graph, opset=21)
    print(f"\n2. batch-1 MatMul latency, x [1, {HIDDEN}] @ W [{HIDDEN}, {FFN}] int4 (groups of {BLOCK}), "
          f"1 intra-op thread, median of {RUNS} calls")
    standard = dyndq.export(single)
    rows = [("MatMulNBits, accuracy_level 0", dyndq.export(single, target="onnxruntime", accuracy_level=0), "all", None),
            ("MatMulNBits, accuracy_level 4", dyndq.export(single, target="onnxruntime", accuracy_level=4), "all", None),
            ("DequantizeLinear + MatMul as written (basic)", standard, "basic", None),
            ("DequantizeLinear + MatMul fused at load (all)", standard, "all", None),
            ("  same, fused at accuracy_level 0", standard, "all", {"session.qdq_matmulnbits_accuracy_level": "0"})]
    base = None
    for label, m, level, config in rows:
        seconds = latency(m, level, config)
        base = base or seconds
        print(f"   {label:48s} {seconds * 1e3:8.3f} ms  ({seconds / base:5.2f} x the first)")
    print(f"\nload at the end: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
