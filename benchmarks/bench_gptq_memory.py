"""`dyndq quantize --method gptq`'s peak memory and time against the float model's bytes, per calibration bound.

    .venv/bin/python benchmarks/bench_gptq_memory.py [--model FILE.onnx] [--layers 8 --hidden 2048
        --intermediate 5632] [--bound one-pass --bound default --bound one-layer --bound 64MiB ...]

The model: `--model` (a file, as MiniLM's export), or a decoder-like float32 model written with
external data, one weight at a time (x [1, 128, hidden] -> per layer LayerNormalization, q, k, v
[hidden, hidden], single-head attention, o, LayerNormalization, gate and up [hidden, intermediate],
SiLU, down [intermediate, hidden], residual adds): four distinct layer inputs per layer, the last
of K = intermediate.  Each bound runs `dyndq quantize SRC DST --method gptq --json` (calibrated on
--samples seeded samples; evaluated, as by default under 2 GiB) in a fresh Python and reads its
peak resident memory (VmHWM, ONNX Runtime's memory counted in), its seconds, and the report's
note of the passes.  Bounds: `one-pass` (every layer's statistics at once: what the calibration did
before it ran in passes), `default` (no --calibration-memory), `one-layer` (the largest weight's
statistics: one layer at a time), or a size.  `--profile`: the highest memory seen in each step
(the passes' collection, GPTQ's rounding, the evaluation), sampled every 5 ms.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from onnx import TensorProto as T, helper
import onnx

from bench_quantize_memory import machine  # (beside this script: run as one, its folder is on sys.path)

_CHILD = r"""
import json, sys, time, threading, functools, os
peaks = {}
stack = ["other"]
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
def sample():
    while True:
        peaks[stack[-1]] = max(peaks.get(stack[-1], 0), rss())
        time.sleep(0.005)
if PROFILE:
    threading.Thread(target=sample, daemon=True).start()
    def watch(owner, attr, name):
        fn = getattr(owner, attr)
        @functools.wraps(fn)
        def watched(*a, **k):
            stack.append(name)
            try:
                return fn(*a, **k)
            finally:
                stack.pop()
        setattr(owner, attr, watched)
    import dyndq.quantization.calibration as c, dyndq.quantization.evaluate as e
    watch(c, "collect", "collecting (ONNX Runtime passes)")
    watch(c, "gptq_weight", "GPTQ rounding")
    watch(e.Evaluation, "__init__", "evaluation: float model")
    watch(e.Evaluation, "measure", "evaluation: quantized model")
from dyndq.cli import main
import dyndq.quantization, onnxruntime
t = time.perf_counter()
import io, contextlib
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(ARGS) if ARGS else 0
seconds = time.perf_counter() - t
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print("@@ " + json.dumps({"code": code, "seconds": seconds, "peak": hwm * 1024, "report": out.getvalue(), "phases": peaks}))
"""


def write_decoder(path: str, layers: int, hidden: int, intermediate: int, sequence: int = 128, seed: int = 0) -> int:
    """Write the decoder-like model (module doc) with external data; its weights' bytes."""
    rng = np.random.default_rng(seed)
    location = os.path.basename(path) + ".data"
    inits, nodes = [], []
    total = 0
    with open(os.path.join(os.path.dirname(path), location), "wb") as data:
        def weight(name, shape, array=None):
            nonlocal total
            if array is None:
                array = rng.standard_normal(shape, dtype=np.float32)
                array *= shape[0] ** -0.5
            t = T(name=name, data_type=T.FLOAT, dims=shape)
            t.data_location = T.EXTERNAL
            for key, value in (("location", location), ("offset", str(data.tell())), ("length", str(array.nbytes))):
                t.external_data.add(key=key, value=value)
            data.write(array.tobytes())
            total += array.nbytes
            inits.append(t)
            return name

        def node(op, inputs, name, **attrs):
            nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
            return name

        ones, zeros = np.ones(hidden, np.float32), np.zeros(hidden, np.float32)
        h = "x"
        for i in range(layers):
            p = f"layers.{i}"
            n1 = node("LayerNormalization", [h, weight(f"{p}.ln1.weight", (hidden,), ones),
                                            weight(f"{p}.ln1.bias", (hidden,), zeros)], f"{p}.ln1", axis=-1)
            q, k, v = (node("MatMul", [n1, weight(f"{p}.{w}.weight", (hidden, hidden))], f"{p}.{w}") for w in "qkv")
            kt = node("Transpose", [k], f"{p}.kt", perm=[0, 2, 1])
            scores = node("MatMul", [q, kt], f"{p}.scores")
            scaled = node("Mul", [scores, weight(f"{p}.scale", (1,), np.array([hidden ** -0.5], np.float32))],
                          f"{p}.scaled")
            attn = node("MatMul", [node("Softmax", [scaled], f"{p}.softmax", axis=-1), v], f"{p}.attn")
            o = node("MatMul", [attn, weight(f"{p}.o.weight", (hidden, hidden))], f"{p}.o")
            h = node("Add", [h, o], f"{p}.residual1")
            n2 = node("LayerNormalization", [h, weight(f"{p}.ln2.weight", (hidden,), ones),
                                            weight(f"{p}.ln2.bias", (hidden,), zeros)], f"{p}.ln2", axis=-1)
            gate = node("MatMul", [n2, weight(f"{p}.gate.weight", (hidden, intermediate))], f"{p}.gate")
            up = node("MatMul", [n2, weight(f"{p}.up.weight", (hidden, intermediate))], f"{p}.up")
            silu = node("Mul", [gate, node("Sigmoid", [gate], f"{p}.sigmoid")], f"{p}.silu")
            down = node("MatMul", [node("Mul", [silu, up], f"{p}.gated"),
                                   weight(f"{p}.down.weight", (intermediate, hidden))], f"{p}.down")
            h = node("Add", [h, down], f"{p}.residual2")
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("x", T.FLOAT, [1, sequence, hidden])],
                              [helper.make_tensor_value_info(h, T.FLOAT, [1, sequence, hidden])], inits)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
    return total


def written_digest(folder: str) -> str:
    """SHA-256 of the files the run wrote (q.onnx and its data), removed after."""
    import hashlib

    digest = hashlib.sha256()
    for name in sorted(f for f in os.listdir(folder) if f.startswith("q.onnx")):
        with open(os.path.join(folder, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        os.remove(os.path.join(folder, name))
    return digest.hexdigest()


def weights_bytes(path: str) -> int:
    from dyndq.plumbing.light import nbytes

    return sum(nbytes(t) for t in onnx.load(path, load_external_data=False).graph.initializer)


def run(src: str, dst: str, bound: str | None, samples: int, profile: bool, imports: bool = False) -> dict:
    """One bound's run in a fresh Python (`imports`: none, the imports' memory alone)."""
    args = ["quantize", src, dst, "--method", "gptq", "--json", "--samples", str(samples)]
    if bound is not None:
        args += ["--calibration-memory", bound]
    if imports:
        args = []
    code = f"ARGS = {args!r}\nPROFILE = {profile!r}\n" + _CHILD
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    line = next((x for x in p.stdout.splitlines() if x.startswith("@@ ")), None)
    if p.returncode or line is None:
        raise RuntimeError(f"{args}: {p.stderr[-3000:]}")
    result = json.loads(line[3:])
    if imports:
        return result
    report = json.loads(result.pop("report"))
    result["passes"] = next((n for n in report["notes"] if "collected in" in n), "")
    result["outputs"] = report.get("outputs_note", "")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", help="a float model file (default: the decoder-like model, written to a temporary folder)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--samples", type=int, default=4, help="seeded calibration samples (default 4)")
    p.add_argument("--bound", action="append", help="one-pass, default, one-layer or a size (default: the first three)")
    p.add_argument("--profile", action="store_true", help="the highest memory in each step")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    args = p.parse_args(argv)
    say = (lambda *a: None) if args.json else print
    results = {"machine": machine(), "bounds": {}}
    say(results["machine"])
    with tempfile.TemporaryDirectory() as d:
        if args.model:
            src = args.model
            floats = weights_bytes(src)
            what = f"{os.path.basename(src)}: {floats / 2**20:.0f} MiB of weights"
        else:
            src = os.path.join(d, "float.onnx")
            floats = write_decoder(src, args.layers, args.hidden, args.intermediate)
            what = (f"decoder-like, {args.layers} layers, hidden {args.hidden}, intermediate {args.intermediate}: "
                    f"{floats / 2**20:.0f} MiB of float32 weights, external data")
        results["floats"] = floats
        say(f"float model: {what}")
        imports = results["imports"] = run(src, "", None, args.samples, False, imports=True)["peak"]
        say(f"a fresh Python with dyndq and ONNX Runtime imported: peak {imports / 2**20:.0f} MiB")
        one_layer = None
        for bound in args.bound or ["one-pass", "default", "one-layer"]:
            size = {"one-pass": "1TiB", "default": None}.get(bound, bound)
            if bound == "one-layer":
                if one_layer is None:
                    from dyndq.quantization.calibration import weight_bytes
                    from dyndq.quantization.activations import layer_inputs
                    from dyndq.quantization.plan import plan

                    model = onnx.load(src, load_external_data=False)
                    inputs, _ = layer_inputs(model, plan(model, ops=("MatMul", "Gemm"), exclude=()).targets)
                    one_layer = str(max(weight_bytes(found) for found in inputs.values()))
                size = one_layer
            r = results["bounds"][bound] = run(src, os.path.join(d, "q.onnx"), size, args.samples, args.profile)
            r["written"] = written_digest(d)
            first = next(iter(results["bounds"].values()))["written"]
            say(f"{bound:10s} {r['seconds']:7.1f} s  peak {r['peak'] / 2**20:7.0f} MiB = {r['peak'] / floats:.2f}x the "
                f"model (imports + {(r['peak'] - imports) / floats:.2f}x); {r['passes']}; the files written "
                f"{'identical to' if r['written'] == first else 'DIFFERENT from'} the first bound's")
            for name, peak in sorted(r["phases"].items(), key=lambda item: -item[1]):
                say(f"    {name:34s} highest {peak / 2**20:7.0f} MiB")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
