"""`dyndq import-weights`'s peak memory against the checkpoint's largest tensor, streamed from a
model with external data, beside the model loaded whole.

    .venv/bin/python benchmarks/bench_import_memory.py [--rows 4096 --cols 4096 --tensors 34]
        [--emit dyndq|onnx|onnxruntime|openvino] [--fuse exact|never] [--format Q8_0|Q4_0|gptq] [--json]

Writes, one weight at a time, a float32 model with external data (`--tensors` weights of
[cols, rows], each read by a MatMul as torch exports a linear layer, and a small bias kept float)
and a GGUF file of a Q8_0 tensor of [rows, cols] for each weight, named as the weight (matched by
name: gguf's own quantizer, one matrix quantized once and written for every tensor: the bytes
measured are the same).  `--format Q4_0`: a GGUF of Q4_0 tensors; `--format gptq`: a GPTQ v2
folder (4-bit, groups of 128, float32 scales: the GPTQ form ONNX Runtime's MatMulNBits computes
exactly, so fused) of modules `layers.{i}`, its largest tensor a module's tensors together.  Then each case runs in a fresh Python, and its peak resident memory
during the import is read (VmHWM reset through /proc/self/clear_refs after a warm-up import of a
small model, so the imports and the interpreter are the baseline: `base`, the resident memory
then):

- stream: `dyndq import-weights SRC GGUF -o DST --emit EMIT` (`import_file`: the streamed import;
  for an emit other than dyndq the export streamed too, dyndq/checkpoints/streamed.py)
- whole:  `dyndq.import_weights(load_model(SRC), GGUF, emit=EMIT)` then `save_model`: the model held whole
- api:    `dyndq.import_weights(model, GGUF, emit=EMIT)` on a model already in memory, its base
  taken with the model loaded: what the import adds beyond the model given (`result`: the bytes
  of the model returned, which it holds)
- export: `dyndq.export(model, target=EMIT)` on the quantized model in memory (the import's with
  --emit dyndq, written streamed, then loaded whole before the base is taken): what the export
  adds beyond the model given
  (`result` as for api; EMIT an export target, fused unless --fuse never: not run for dyndq)

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
EXTRA_CASES = ("api", "export")


FORMATS = ("Q8_0", "Q4_0", "gptq")
GPTQ_GROUP = 128


def checkpoint_name(kind: str) -> str:
    """The checkpoint's name in the case's folder: a GGUF file, or a GPTQ folder."""
    return "q.gptq" if kind == "gptq" else "q.gguf"


def gptq_module(matrix: np.ndarray) -> dict:
    """A GPTQ v2 module (4-bit, groups of GPTQ_GROUP, float32 scales) of `matrix` [out, in]:
    qweight int32 [in/8, out], qzeros int32 [groups, out/8], scales float32 [groups, out], g_idx."""
    w = np.ascontiguousarray(matrix.T)  # [in, out]
    n_in, out = w.shape
    grouped = w.reshape(n_in // GPTQ_GROUP, GPTQ_GROUP, out)
    low, high = grouped.min(axis=1), grouped.max(axis=1)
    scales = np.maximum((high - low) / 15, 1e-8).astype(np.float32)
    zeros = np.clip(np.round(-low / scales), 0, 15).astype(np.uint32)
    q = np.clip(np.round(grouped / scales[:, None]) + zeros[:, None], 0, 15).astype(np.uint32).reshape(n_in, out)
    shifts = np.arange(0, 32, 4, dtype=np.uint32)
    qweight = (q.reshape(n_in // 8, 8, out) << shifts[None, :, None]).sum(axis=1, dtype=np.uint32)
    qzeros = (zeros.reshape(len(zeros), out // 8, 8) << shifts[None, None, :]).sum(axis=2, dtype=np.uint32)
    return {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32), "scales": scales,
            "g_idx": (np.arange(n_in) // GPTQ_GROUP).astype(np.int32)}


def write_checkpoint(path: str, names: list[str], matrix: np.ndarray, kind: str) -> int:
    """The checkpoint of `kind` at `path` holding `matrix` [out, in] quantized once for each name
    (GGUF: gguf's own writer and quantizer; gptq: safetensors' writer, one module at a time);
    returns its largest tensor's bytes."""
    if kind == "gptq":
        import safetensors.numpy

        os.makedirs(path, exist_ok=True)
        module = gptq_module(matrix)
        for i, name in enumerate(names):  # (a file per module, as sharded checkpoints hold them)
            safetensors.numpy.save_file({f"{name}.{k}": v for k, v in module.items()},
                                        os.path.join(path, f"model-{i:05d}.safetensors"))
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": GPTQ_GROUP,
                                               "checkpoint_format": "gptq_v2"}}, f)
        return sum(v.nbytes for v in module.values())
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    q = gguf.quants.quantize(matrix, qtype)
    writer = gguf.GGUFWriter(path, "bench")
    for name in names:
        writer.add_tensor(f"{name}.weight", q, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return q.nbytes


def write_case(folder: str, rows: int, cols: int, tensors: int, seed: int = 0, kind: str = "Q8_0") -> dict:
    """The float model (folder/float.onnx + its data) and the checkpoint of `kind` (folder/q.gguf,
    or the folder q.gptq), and a small pair of them for the warm-up (small.onnx, small.gguf or
    small.gptq); returns their sizes."""
    rng = np.random.default_rng(seed)
    matrix = (rng.standard_normal((rows, cols), dtype=np.float32) * cols ** -0.5)
    stored = np.ascontiguousarray(matrix.T)  # (MatMul's B: [in, out])
    sizes = {"floats": 0, "largest_float": stored.nbytes, "checkpoint": 0, "largest_tensor": 0,
             "tensors": tensors, "format": kind}
    small = 128 if kind == "gptq" else 64
    for name, n, array in (("float", tensors, stored), ("small", 2, stored[:small, :small].copy())):
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
        target = os.path.join(folder, "q.gptq" if kind == "gptq" else "q.gguf") if name == "float" else \
            os.path.join(folder, "small.gptq" if kind == "gptq" else "small.gguf")
        largest = write_checkpoint(target, [f"layers.{i}" for i in range(n)], np.ascontiguousarray(array.T), kind)
        if name == "float":
            sizes["floats"] = n * array.nbytes
            sizes["checkpoint"], sizes["largest_tensor"] = n * largest, largest
    del matrix
    return sizes


_CHILD = r"""
import json, os, sys, time
from dyndq.checkpoints import import_file, import_weights
from dyndq.model_files import load_model, save_model
D = {folder!r}
import_file(os.path.join(D, "small.onnx"), os.path.join(D, {small!r}), os.path.join(D, "warm", "small.onnx"))

def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))

import dyndq.written as written
from dyndq.plumbing.light import nbytes
real_verify, before_check = written.verify_model, {{}}

def verify_model(*args, **kwargs):  # (the peak before the file's check: import_file asks it at call time)
    before_check["peak"] = status("VmHWM")
    return real_verify(*args, **kwargs)

written.verify_model = verify_model
src, ckpt, dst = os.path.join(D, "float.onnx"), os.path.join(D, {ckpt!r}), os.path.join(D, {case!r}, "q.onnx")
emit, fuse = {emit!r}, {fuse!r}
model = load_model(src) if {case!r} == "api" else None
if {case!r} == "export":  # (the quantized model, made by another Python: read whole before the base)
    model = load_model(os.path.join(D, "quantized", "q.onnx"))
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
elif {case!r} == "export":
    from dyndq import export
    out, report = export(model, target=emit), None
    before_check["peak"] = status("VmHWM")
    result = sum(nbytes(t) for t in out.graph.initializer)
    save_model(out, dst, external_data=True)
else:
    out, report = import_weights(load_model(src), ckpt, emit=emit, fuse=fuse)
    before_check["peak"] = status("VmHWM")
    save_model(out, dst, external_data=True)
seconds = time.perf_counter() - t
print("@@ " + json.dumps({{"seconds": seconds, "base": base, "peak": status("VmHWM"), "imported": len(report.imported) if report else None,
                          "before_check": before_check.get("peak"), "result": result,
                          "forms": sorted(set(f.split(" ")[0] for f in report.forms.values())) if report else
                          sorted({{f"{{n.domain}}::{{n.op_type}}" for n in out.graph.node if n.domain == "com.microsoft"}}),
                          "left_float": [w for w, _ in report.left_float] if report else [], "written": os.path.getsize(dst)
                          + sum(os.path.getsize(os.path.join(os.path.dirname(dst), f)) for f in os.listdir(os.path.dirname(dst))
                                if f.endswith(".data"))}}))
"""


# the export case's input: the checkpoint imported fused (streamed), lifted to our op (DynamicDequantize
# on 2-D codes [K, N], blocks along K: what the export writes as MatMulNBits again), saved
_QUANTIZED = r"""
import os, dyndq
from dyndq.checkpoints import import_file
from dyndq.model_files import load_model, save_model
D = {folder!r}
import_file(os.path.join(D, "float.onnx"), os.path.join(D, {ckpt!r}), os.path.join(D, "fused", "q.onnx"), emit="onnxruntime")
save_model(dyndq.lift(load_model(os.path.join(D, "fused", "q.onnx"))), os.path.join(D, "quantized", "q.onnx"),
           external_data=True)
"""


def run_case(case: str, folder: str, emit: str = "dyndq", fuse: str = "exact", kind: str = "Q8_0") -> dict:
    os.makedirs(os.path.join(folder, case), exist_ok=True)
    os.makedirs(os.path.join(folder, "warm"), exist_ok=True)
    ckpt = checkpoint_name(kind)
    if case == "export" and not os.path.exists(os.path.join(folder, "quantized", "q.onnx")):
        for sub in ("fused", "quantized"):
            os.makedirs(os.path.join(folder, sub), exist_ok=True)
        made = subprocess.run([sys.executable, "-c", _QUANTIZED.format(folder=folder, ckpt=ckpt)], capture_output=True,
                              text=True)
        if made.returncode:
            raise RuntimeError(f"the quantized model for the export case: {made.stderr[-3000:]}")
    out = subprocess.run([sys.executable, "-c", _CHILD.format(folder=folder, case=case, emit=emit, fuse=fuse, ckpt=ckpt,
                                                              small=ckpt.replace("q.", "small."))],
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{case}: {out.stderr[-3000:]}")
    return json.loads(next(line[3:] for line in out.stdout.splitlines() if line.startswith("@@ ")))


def measure(rows: int, cols: int, tensors: int, cases=CASES, folder: str | None = None, emits=("dyndq",),
            fuse: str = "exact", kind: str = "Q8_0") -> dict:
    """The sizes of the case written and each case's run: {"sizes": ..., "cases": {case: ...}} (with
    more than one emit, the cases named "case emit")."""
    with tempfile.TemporaryDirectory(dir=folder) as d:
        sizes = write_case(d, rows, cols, tensors, kind=kind)
        runs = {}
        for emit in emits:
            for case in cases:
                form, _, fused = emit.partition("/")  # ("onnxruntime/never": that emit with --fuse never)
                if case == "export" and (form == "dyndq" or fused):  # (an export target, as export writes it)
                    continue
                runs[case if len(emits) == 1 else f"{case} {emit}"] = run_case(case, d, form, fused or fuse, kind)
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
    p.add_argument("--format", choices=FORMATS, default="Q8_0", help="the checkpoint's format (default: GGUF Q8_0)")
    p.add_argument("--folder", help="where to write the models (default: a temporary folder)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    result = measure(args.rows, args.cols, args.tensors, args.case or CASES, args.folder, args.emit or ("dyndq",), args.fuse,
                     args.format)
    if args.json:
        print(json.dumps(result))
        return 0
    s, mib = result["sizes"], 2 ** 20
    print(f"{s['format']}: float model {s['floats'] / mib:.0f} MiB ({s['tensors']} weights of {s['largest_float'] / mib:.1f} MiB), "
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
