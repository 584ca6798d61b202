"""`dyndq quantize`'s peak memory against the float model's bytes, with and without evaluation.

    .venv/bin/python benchmarks/bench_quantize_memory.py [--gib 1.9] [--profile] [--case NAME ...]

Writes a float32 model of about `--gib` GiB with external data to a temporary folder, one
weight at a time (a token embedding, blocks of a MLP with a residual add, an LM head whose
logits the evaluation reads as logits), then runs each case in a fresh Python and reads its
peak resident memory (VmHWM, which ONNX Runtime's arena counts in, unlike tracemalloc):

- file, evaluate:     `dyndq quantize SRC DST` (evaluation on: the default under 2 GiB)
- file, no evaluate:  `dyndq quantize SRC DST --no-evaluate`
- memory, evaluate:   `dyndq.quantize(model)` on the model loaded whole (`load_model`)
- memory, no evaluate: the same with `evaluate=False`

Each is stated as peak / the float model's bytes, beside a fresh Python with dyndq and ONNX
Runtime imported.  `--profile` samples the resident memory in a thread every 5 ms and names,
for each step of the run (loading, quantizing, each model's session and runs), the memory on
entering it and the highest seen during it: where the peak comes from.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto as T, helper

from bench_quantize import machine as quantize_machine  # (beside this script: run as one, its folder is on sys.path)

CASES = ("file-evaluate", "file-no-evaluate", "memory-evaluate", "memory-no-evaluate", "imports")


def write_model(path: str, gib: float, hidden: int = 2048, intermediate: int = 8192, vocab: int = 32000,
                seed: int = 0) -> tuple[int, int]:
    """Write ids [1, S] -> logits [1, S, vocab] with as many MLP blocks as make about `gib` GiB of
    float32 weights, each weight written to the data file as it is made (one in memory at a
    time); (the weights' bytes, the largest weight's bytes)."""
    block = 2 * hidden * intermediate * 4
    ends = 2 * vocab * hidden * 4
    layers = max(1, round((gib * 2 ** 30 - ends) / block))
    rng = np.random.default_rng(seed)
    location = os.path.basename(path) + ".data"
    inits, nodes = [], []
    total = largest = 0
    with open(os.path.join(os.path.dirname(path), location), "wb") as data:
        def weight(name, shape, scale):
            nonlocal total, largest
            array = rng.standard_normal(shape, dtype=np.float32)
            array *= scale
            t = T(name=name, data_type=T.FLOAT, dims=shape)
            t.data_location = T.EXTERNAL
            for key, value in (("location", location), ("offset", str(data.tell())), ("length", str(array.nbytes))):
                t.external_data.add(key=key, value=value)
            data.write(array.tobytes())
            total += array.nbytes
            largest = max(largest, array.nbytes)
            inits.append(t)
            return name

        def node(op, inputs, name, **attrs):
            nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
            return name

        x = node("Gather", [weight("embed.weight", (vocab, hidden), 0.02), "ids"], "embed")
        for i in range(layers):
            up = node("MatMul", [x, weight(f"layers.{i}.up.weight", (hidden, intermediate), hidden ** -0.5)],
                      f"layers.{i}.up")
            act = node("Relu", [up], f"layers.{i}.act")
            down = node("MatMul", [act, weight(f"layers.{i}.down.weight", (intermediate, hidden), intermediate ** -0.5)],
                        f"layers.{i}.down")
            x = node("Add", [x, down], f"layers.{i}.residual")
        logits = node("MatMul", [x, weight("lm_head.weight", (hidden, vocab), hidden ** -0.5)], "logits")
    graph = helper.make_graph(nodes, "mlp_stack", [helper.make_tensor_value_info("ids", T.INT64, [1, "sequence"])],
                              [helper.make_tensor_value_info(logits, T.FLOAT, [1, "sequence", vocab])], inits)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
    return total, largest


# -- the child: one case in a fresh Python ----------------------------------------------------

_PROFILE = r"""
import functools, threading, time
_phases = [["start", 0, 0]]  # (name, resident bytes on entering, the highest seen in it)
_stack = [0]
_page = os.sysconf("SC_PAGE_SIZE")

def _rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _page

def _sample():
    while True:
        r = _rss()
        p = _phases[_stack[-1]]
        p[2] = max(p[2], r)
        time.sleep(0.005)

threading.Thread(target=_sample, daemon=True).start()

def _watch(owner, attr, name):
    fn = getattr(owner, attr)
    @functools.wraps(fn)
    def watched(*a, **k):
        _phases.append([name, _rss(), 0])
        _stack.append(len(_phases) - 1)
        try:
            return fn(*a, **k)
        finally:
            _stack.pop()
            p = _phases[_stack[-1]]
            p[2] = max(p[2], _rss())
    setattr(owner, attr, watched)

import dyndq.model_files, dyndq.runner, dyndq.ort_session, dyndq.run_outputs
import dyndq.quantization.quantizer as _qz, dyndq.quantization.on_disk as _od, dyndq.quantization.evaluate as _ev
_watch(dyndq.model_files, "read_model", "read_model")
_watch(_qz, "quantize_model", "quantize_model")
_watch(_od, "quantize_model", "quantize_model")
_watch(_ev, "seeded_samples", "seeded_samples")
_watch(dyndq.run_outputs, "exported_for_onnxruntime", "export for ORT")
_watch(dyndq.ort_session.OrtSession, "__init__", "OrtSession()")
_watch(dyndq.runner.Runner, "__call__", "run")
_watch(_ev.Evaluation, "__init__", "Evaluation: float model")
_watch(_ev.Evaluation, "measure", "Evaluation: quantized model")
_watch(_ev, "evaluate_into", "evaluate_into")
import atexit
atexit.register(lambda: print("@@phases " + json.dumps(_phases)))
"""

_CHILD = r"""
import json, os, sys, time
{profile}
t = time.perf_counter()
{body}
seconds = time.perf_counter() - t
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print("@@ " + json.dumps({{"seconds": seconds, "peak": hwm * 1024, "note": note}}))
"""

_BODIES = {
    "imports": "import dyndq, dyndq.quantization, onnxruntime\nnote = ''",
    "file-evaluate": "from dyndq.cli import main\nassert main(['quantize', SRC, DST, '--json']) == 0\nnote = ''",
    "file-no-evaluate": "from dyndq.cli import main\nassert main(['quantize', SRC, DST, '--no-evaluate']) == 0\nnote = ''",
    "memory-evaluate": "import dyndq\nfrom dyndq.model_files import load_model\nmodel = load_model(SRC)\n"
                       "out, report = dyndq.quantize(model)\nnote = report.outputs_note",
    "memory-no-evaluate": "import dyndq\nfrom dyndq.model_files import load_model\nmodel = load_model(SRC)\n"
                          "out, report = dyndq.quantize(model, evaluate=False)\nnote = report.outputs_note",
}


def run_case(case: str, src: str, dst: str, profile: bool) -> dict:
    body = f"SRC, DST = {src!r}, {dst!r}\n" + _BODIES[case]
    code = _CHILD.format(profile=_PROFILE if profile else "", body=body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{case}: {out.stderr[-3000:]}")
    result = {}
    for line in out.stdout.splitlines():
        if line.startswith("@@phases "):
            result["phases"] = json.loads(line[len("@@phases "):])
        elif line.startswith("@@ "):
            result.update(json.loads(line[3:]))
    if case == "file-evaluate":  # (the report's JSON, printed ahead of the @@ lines)
        result["note"] = json.loads(out.stdout[:out.stdout.index("\n@@")])["outputs_note"]
    return result


def machine() -> str:
    """bench_quantize's machine line, with the memory this machine has (what the peaks are held against)."""
    memory = next((line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemTotal")), None)
    return f"{quantize_machine()}; {int(memory) / 2**20:.0f} GiB of memory" if memory else quantize_machine()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.9, help="the float model's weights, in GiB (under 2: evaluated by default)")
    p.add_argument("--vocab", type=int, default=32000, help="rows of the embedding and the LM head")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--case", action="append", choices=CASES, help="the cases to run (default: all)")
    p.add_argument("--profile", action="store_true", help="the memory at each step of each case")
    p.add_argument("--folder", help="where to write the models (default: a temporary folder)")
    p.add_argument("--json", action="store_true", help="print one JSON document: the machine, the model's bytes, each case")
    args = p.parse_args(argv)
    say = (lambda *a: None) if args.json else print
    results = {"machine": machine(), "cases": {}}
    say(results["machine"])
    with tempfile.TemporaryDirectory(dir=args.folder) as d:
        src, dst = os.path.join(d, "float.onnx"), os.path.join(d, "q.onnx")
        floats, largest = write_model(src, args.gib, hidden=args.hidden, intermediate=args.intermediate, vocab=args.vocab)
        results.update(floats=floats, largest=largest)
        say(f"float model: {floats / 2**30:.2f} GiB of float32 weights (largest {largest / 2**20:.0f} MiB), external data")
        for case in ("imports", *(c for c in CASES if c != "imports" and (not args.case or c in args.case))):
            r = results["cases"][case] = run_case(case, src, dst, args.profile)
            say(f"{case:20s} {r['seconds']:6.1f} s  peak {r['peak'] / 2**20:7.0f} MiB = {r['peak'] / floats:.2f}x the float "
                  f"model (imports + {(r['peak'] - results['cases']['imports']['peak']) / largest:.2f}x the largest weight)  "
                f"{r.get('note', '')[:90]}")
            for name, entered, highest in r.get("phases", []):
                say(f"    {name:28s} entered at {entered / 2**20:7.0f} MiB, highest {highest / 2**20:7.0f} MiB")
            for f in os.listdir(d):
                if f.startswith("q.onnx"):
                    os.remove(os.path.join(d, f))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
