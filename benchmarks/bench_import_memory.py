"""`dyndq import-weights`'s peak memory against the checkpoint's largest tensor, streamed from a
model with external data, beside the model loaded whole.

    .venv/bin/python benchmarks/bench_import_memory.py [--rows 4096 --cols 4096 --tensors 34]
        [--emit dyndq|onnx|onnxruntime|openvino] [--fuse exact|never] [--json]

Writes, one weight at a time, a float32 model with external data (`--tensors` weights of
[cols, rows], each read by a MatMul as torch exports a linear layer, and a small bias kept float)
and a GGUF file of a Q8_0 tensor of [rows, cols] for each weight, named as the weight (matched by
name: gguf's own quantizer, one matrix quantized once and written for every tensor: the bytes
measured are the same).  Then each case runs in a fresh Python, and its peak resident memory
during the import is read (VmHWM reset through /proc/self/clear_refs after a warm-up import of a
small model, so the imports and the interpreter are the baseline: `base`, the resident memory
then):

- stream: `dyndq import-weights SRC GGUF -o DST --emit EMIT` (`import_file`: the streamed import;
  for an emit other than dyndq the export streamed too, dyndq/checkpoints/streamed.py)
- whole:  `dyndq.import_weights(load_model(SRC), GGUF, emit=EMIT)` then `save_model`: the model held whole
- api:    `dyndq.import_weights(model, GGUF, emit=EMIT)` on a model already in memory, its base
  taken with the model loaded: what the import adds beyond the model given (`result`: the bytes
  of the model returned, which it holds)

The figures: peak - base against the checkpoint's largest tensor (its bytes in the GGUF file),
the whole checkpoint and the float model's weights; `before_check`: the peak before the written
file's check (`dyndq.written.verify_model`: for --emit onnxruntime an ONNX Runtime session of the
file, whose memory is ONNX Runtime's own, the session a user of the file makes).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import onnx
from onnx import TensorProto as T, helper

CASES = ("stream", "whole")
EXTRA_CASES = ("api",)


def write_case(folder: str, rows: int, cols: int, tensors: int, seed: int = 0) -> dict:
    """The float model (folder/float.onnx + its data) and the checkpoint (folder/q8.gguf), and a
    small pair of them for the warm-up (small.onnx, small.gguf); returns their sizes."""
    import gguf

    rng = np.random.default_rng(seed)
    matrix = (rng.standard_normal((rows, cols), dtype=np.float32) * cols ** -0.5)
    blocks = gguf.quants.quantize(matrix, gguf.GGMLQuantizationType.Q8_0)
    stored = np.ascontiguousarray(matrix.T)  # (MatMul's B: [in, out])
    del matrix
    sizes = {"floats": 0, "largest_float": stored.nbytes, "checkpoint": 0, "largest_tensor": blocks.nbytes,
             "tensors": tensors}
    for name, n, array, q in (("float", tensors, stored, blocks), ("small", 2, stored[:64, :64].copy(), None)):
        if q is None:
            q = gguf.quants.quantize(np.ascontiguousarray(array.T), gguf.GGMLQuantizationType.Q8_0)
        path = os.path.join(folder, f"{name}.onnx")
        location = f"{name}.onnx.data"
        inits, nodes, outputs = [], [], []
        with open(os.path.join(folder, location), "wb") as data:
            def external(tensor_name, values):
                t = T(name=tensor_name, data_type=T.FLOAT, dims=values.shape)
                t.data_location = T.EXTERNAL
                for key, value in (("location", location), ("offset", str(data.tell())), ("length", str(values.nbytes))):
                    t.external_data.add(key=key, value=value)
                data.write(values.tobytes())
                inits.append(t)

            for i in range(n):
                external(f"layers.{i}.weight", array)
                nodes.append(helper.make_node("MatMul", ["x", f"layers.{i}.weight"], [f"y{i}"]))
                outputs.append(helper.make_tensor_value_info(f"y{i}", T.FLOAT, [1, array.shape[1]]))
            external("kept.bias", np.linspace(-1, 1, array.shape[1], dtype=np.float32))  # (no tensor for it: kept float)
            nodes.append(helper.make_node("Add", ["y0", "kept.bias"], ["biased"]))
            outputs.append(helper.make_tensor_value_info("biased", T.FLOAT, [1, array.shape[1]]))
        graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", T.FLOAT, [1, array.shape[0]])],
                                  outputs, inits)
        onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), path)
        writer = gguf.GGUFWriter(os.path.join(folder, f"{name}.gguf"), "bench")
        for i in range(n):
            writer.add_tensor(f"layers.{i}.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        if name == "float":
            sizes["floats"] = n * array.nbytes
            sizes["checkpoint"] = n * q.nbytes
    return sizes


_CHILD = r"""
import json, os, sys, time
from dyndq.checkpoints import import_file, import_weights
from dyndq.model_files import load_model, save_model
D = {folder!r}
import_file(os.path.join(D, "small.onnx"), os.path.join(D, "small.gguf"), os.path.join(D, "warm", "small.onnx"))

def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))

import dyndq.written as written
from dyndq.plumbing.light import nbytes
real_verify, before_check = written.verify_model, {{}}

def verify_model(*args, **kwargs):  # (the peak before the file's check: import_file asks it at call time)
    before_check["peak"] = status("VmHWM")
    return real_verify(*args, **kwargs)

written.verify_model = verify_model
src, ckpt, dst = os.path.join(D, "float.onnx"), os.path.join(D, "q8.gguf"), os.path.join(D, {case!r}, "q.onnx")
emit, fuse = {emit!r}, {fuse!r}
model = load_model(src) if {case!r} == "api" else None
with open("/proc/self/clear_refs", "w") as f:  # (VmHWM from here: the import's peak)
    f.write("5")
base = status("VmRSS")
t = time.perf_counter()
result = None
if {case!r} == "stream":
    report = import_file(src, ckpt, dst, emit=emit, fuse=fuse)
elif {case!r} == "api":
    out, report = import_weights(model, ckpt, emit=emit, fuse=fuse)
    before_check["peak"] = status("VmHWM")
    result = sum(nbytes(t) for t in out.graph.initializer)
    save_model(out, dst, external_data=True)
else:
    out, report = import_weights(load_model(src), ckpt, emit=emit, fuse=fuse)
    before_check["peak"] = status("VmHWM")
    save_model(out, dst, external_data=True)
seconds = time.perf_counter() - t
print("@@ " + json.dumps({{"seconds": seconds, "base": base, "peak": status("VmHWM"), "imported": len(report.imported),
                          "before_check": before_check.get("peak"), "result": result,
                          "forms": sorted(set(f.split(" ")[0] for f in report.forms.values())),
                          "left_float": [w for w, _ in report.left_float], "written": os.path.getsize(dst)
                          + sum(os.path.getsize(os.path.join(os.path.dirname(dst), f)) for f in os.listdir(os.path.dirname(dst))
                                if f.endswith(".data"))}}))
"""


def run_case(case: str, folder: str, emit: str = "dyndq", fuse: str = "exact") -> dict:
    os.makedirs(os.path.join(folder, case), exist_ok=True)
    os.makedirs(os.path.join(folder, "warm"), exist_ok=True)
    out = subprocess.run([sys.executable, "-c", _CHILD.format(folder=folder, case=case, emit=emit, fuse=fuse)],
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{case}: {out.stderr[-3000:]}")
    return json.loads(next(line[3:] for line in out.stdout.splitlines() if line.startswith("@@ ")))


def measure(rows: int, cols: int, tensors: int, cases=CASES, folder: str | None = None, emits=("dyndq",),
            fuse: str = "exact") -> dict:
    """The sizes of the case written and each case's run: {"sizes": ..., "cases": {case: ...}} (with
    more than one emit, the cases named "case emit")."""
    with tempfile.TemporaryDirectory(dir=folder) as d:
        sizes = write_case(d, rows, cols, tensors)
        os.rename(os.path.join(d, "float.gguf"), os.path.join(d, "q8.gguf"))
        runs = {}
        for emit in emits:
            for case in cases:
                form, _, fused = emit.partition("/")  # ("onnxruntime/never": that emit with --fuse never)
                runs[case if len(emits) == 1 else f"{case} {emit}"] = run_case(case, d, form, fused or fuse)
                shutil.rmtree(os.path.join(d, case))  # (the next writes its own)
        return {"sizes": sizes, "cases": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--tensors", type=int, default=34, help="weights (34 of 4096 x 4096: 2.1 GiB of float32)")
    p.add_argument("--case", action="append", choices=CASES + EXTRA_CASES, help="the cases to run (default: stream, whole)")
    p.add_argument("--emit", action="append",
                   choices=("dyndq", "onnx", "onnxruntime", "openvino", "onnxruntime/exact", "onnxruntime/never"),
                   help="the forms written (default: dyndq; several: each case for each; onnxruntime/never: with --fuse never)")
    p.add_argument("--fuse", choices=("exact", "never"), default="exact")
    p.add_argument("--folder", help="where to write the models (default: a temporary folder)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = measure(args.rows, args.cols, args.tensors, args.case or CASES, args.folder, args.emit or ("dyndq",), args.fuse)
    if args.json:
        print(json.dumps(result))
        return 0
    s, mib = result["sizes"], 2 ** 20
    print(f"float model {s['floats'] / mib:.0f} MiB ({s['tensors']} weights of {s['largest_float'] / mib:.1f} MiB), "
          f"checkpoint {s['checkpoint'] / mib:.1f} MiB (largest tensor {s['largest_tensor'] / mib:.2f} MiB)")
    for case, r in result["cases"].items():
        extra = r["peak"] - r["base"]
        print(f"{case:7s} {r['seconds']:6.1f} s  base {r['base'] / mib:6.0f} MiB  peak {r['peak'] / mib:6.0f} MiB  "
              f"peak - base {extra / mib:7.1f} MiB = {extra / s['largest_tensor']:.2f}x the largest tensor, "
              f"{extra / s['checkpoint']:.2f}x the checkpoint, {extra / s['floats']:.2f}x the float weights"
              + (f"; before the check {(r['before_check'] - r['base']) / mib:.1f} MiB" if r.get("before_check") else "")
              + (f"; the model returned {r['result'] / mib:.1f} MiB" if r.get("result") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
