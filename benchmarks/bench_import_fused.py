"""`import-weights --emit onnxruntime`, fused against the composition: the file's bytes and one
MatMul's latency on ONNX Runtime, for a GGUF Q4_0 and Q8_0 weight (docs/import.md's figures).

    .venv/bin/python benchmarks/bench_import_fused.py [SIZE] [M]   (default 4096 x 4096, M = 1 and 32 rows)
    .venv/bin/python benchmarks/bench_import_fused.py scales-cast [SIZE [RUNS [MEMORY_REPEATS]]]

A float32 model x [M, SIZE] @ w [SIZE, SIZE] (w: a MatMul's B) and a GGUF file holding w's
transpose quantized by gguf's own quantizer (Q4_0, Q8_0) are imported with `--emit onnxruntime`
(MatMulNBits 4/8-bit block 32, the float16 d through a Cast to float32) and, for the composition, with the fused rewrite
turned off (the decode: DynamicDequantize + Reshape + Transpose, then the MatMul).  Each model is
written to a file (its size), loaded by one ONNX Runtime CPU session (default options, intra-op
threads 2) and run REPEATS times after a warm-up: the median.  The GGUF tensor's own bytes beside.

`scales_cast()`: what the Cast of the float16 d costs on ONNX Runtime against float32 scales
stored: one MatMulNBits [SIZE, SIZE] (4- and 8-bit, block 32) with each form, at ORT_ENABLE_ALL
(the Cast folded at load) and with graph optimisations off (the Cast run at every call): whether
the outputs are the same bits, the session's memory (resident memory after the session is made and
run once, minus before, a fresh process each, median of 5) and one call's latency (one intra-op
thread, M = 1, the sessions called in turn: min and median of CAST_RUNS).
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq.checkpoints import fused

REPEATS = 20


def model(size: int) -> onnx.ModelProto:
    w = np.zeros((size, size), np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", size])],
                              [numpy_helper.from_array(w, "w")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def latency(path: str, x: np.ndarray) -> float:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    session.run(None, {"x": x})
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(size: int = 4096, rows=(1, 32)) -> None:
    import gguf

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((size, size)) * 0.05).astype(np.float32)  # [out, in]
    print(f"onnxruntime {ort.__version__}, a {size} x {size} weight, median of {REPEATS} runs")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("Q4_0", "Q8_0"):
            data = gguf.quants.quantize(weight, gguf.GGMLQuantizationType[kind])
            path = os.path.join(tmp, f"{kind}.gguf")
            writer = gguf.GGUFWriter(path, "llama")
            writer.add_tensor("blk.0.ffn_down.weight", data, raw_dtype=gguf.GGMLQuantizationType[kind])
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            forms = {}
            for form in ("fused", "composition"):
                rewrite = fused._rewrite
                if form == "composition":
                    fused._rewrite = lambda *a: (None, "off")
                try:
                    out, report = dyndq.import_weights(model(size), path, names={"blk.0.ffn_down.weight": "w"},
                                                       emit="onnxruntime")
                finally:
                    fused._rewrite = rewrite
                file = os.path.join(tmp, f"{kind}_{form}.onnx")
                onnx.save(out, file)
                ops = sorted({n.op_type for n in out.graph.node})
                forms[form] = (os.path.getsize(file), [latency(file, rng.standard_normal((m, size)).astype(np.float32))
                                                       for m in rows], ops)
            print(f"{kind}: GGUF tensor {data.nbytes} bytes")
            for form, (nbytes, times, ops) in forms.items():
                shown = ", ".join(f"M={m}: {t * 1e3:.2f} ms" for m, t in zip(rows, times))
                print(f"  {form:12s} file {nbytes} bytes ({nbytes / data.nbytes:.3f}x the GGUF tensor); {shown}; ops {ops}")


def tied(vocab: int = 8192, width: int = 1024) -> None:
    """A tied Q4_0 embedding [vocab, width] read by a Gather and (Transpose) the output projection:
    the file as written (GatherBlockQuantized and MatMulNBits sharing one set of initializers),
    with the rewrite off (one decode, the composition), and untied (the same values in two GGUF
    tensors: each fused op with its own codes); the logits of one row (M = 1) on ONNX Runtime,
    median of REPEATS."""
    import gguf

    rng = np.random.default_rng(1)
    embed = (rng.standard_normal((vocab, width)) * 0.05).astype(np.float32)
    data = gguf.quants.quantize(embed, gguf.GGMLQuantizationType.Q4_0)
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {}
        for form in ("tied", "tied composition", "untied"):
            path = os.path.join(tmp, f"{form}.gguf")
            writer = gguf.GGUFWriter(path, "llama")
            writer.add_tensor("token_embd.weight", data, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
            if form == "untied":
                writer.add_tensor("output.weight", data, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            head = "lm_head.weight" if form == "untied" else "model.embed_tokens.weight"
            inits = [numpy_helper.from_array(np.zeros_like(embed), "model.embed_tokens.weight")]
            if form == "untied":
                inits.append(numpy_helper.from_array(np.zeros_like(embed), "lm_head.weight"))
            graph = helper.make_graph(
                [helper.make_node("Gather", ["model.embed_tokens.weight", "ids"], ["h"]),
                 helper.make_node("Transpose", [head], ["headT"], perm=[1, 0]),
                 helper.make_node("MatMul", ["h", "headT"], ["logits"])], "tied",
                [helper.make_tensor_value_info("ids", TensorProto.INT64, ["m"])],
                [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["m", vocab])], inits)
            float_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
            rewrite = fused._rewrite
            if form == "tied composition":  # (the rewrite turned off: one decode, the composition)
                fused._rewrite = lambda *a: (None, "off")
            try:
                out, report = dyndq.import_weights(float_model, path, emit="onnxruntime")
            finally:
                fused._rewrite = rewrite
            file = os.path.join(tmp, f"{form}.onnx")
            onnx.save(out, file)
            options = ort.SessionOptions()
            options.intra_op_num_threads = 2
            session = ort.InferenceSession(file, options, providers=["CPUExecutionProvider"])
            ids = np.array([3], np.int64)
            session.run(None, {"ids": ids})
            times = []
            for _ in range(REPEATS):
                start = time.perf_counter()
                session.run(None, {"ids": ids})
                times.append(time.perf_counter() - start)
            sizes[form] = os.path.getsize(file)
            print(f"tied Q4_0 [{vocab}, {width}] {form}: file {sizes[form]} bytes ({sizes[form] / data.nbytes:.3f}x the GGUF "
                  f"tensor), one row's logits {statistics.median(times) * 1e3:.2f} ms; "
                  f"ops {sorted({n.op_type for n in out.graph.node})}")


CAST_RUNS = 200
MEMORY_REPEATS = 5
_SESSION_MEMORY = r"""
import sys, numpy as np, onnxruntime as ort
def rss():
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS"))
path, level, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
before = rss()
ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(None, {"A": np.ones((1, k), np.float32)})
print(rss() - before)
"""


def matmul_nbits(size: int, bits: int, cast: bool) -> onnx.ModelProto:
    """One MatMulNBits [size, size], block 32, float32 A; its scales float32, or float16 through a Cast."""
    rng = np.random.default_rng(bits)
    b = rng.integers(0, 256, (size, size // 32, 32 * bits // 8), dtype=np.uint8)
    d = (rng.standard_normal((size, size // 32)) * 0.01).astype(np.float16)
    nodes = [helper.make_node("Cast", ["d"], ["scales"], to=TensorProto.FLOAT)] if cast else []
    nodes.append(helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft", K=size, N=size,
                                  bits=bits, block_size=32, accuracy_level=0))
    graph = helper.make_graph(nodes, "one", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["m", size])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["m", size])],
                              [numpy_helper.from_array(b, "B"),
                               numpy_helper.from_array(d if cast else d.astype(np.float32), "d" if cast else "scales")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def scales_cast(size: int = 4096) -> None:
    import subprocess

    levels = {"all": "ORT_ENABLE_ALL", "off": "ORT_DISABLE_ALL"}
    a = np.random.default_rng(1).standard_normal((1, size)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        for bits in (4, 8):
            sessions, rows = {}, {}
            for form in ("float32 scales", "float16 + Cast"):
                path = os.path.join(tmp, f"{bits}_{form[:7]}.onnx")
                onnx.save(matmul_nbits(size, bits, form != "float32 scales"), path)
                for level, name in levels.items():
                    options = ort.SessionOptions()
                    options.intra_op_num_threads = 1
                    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, name)
                    sessions[form, level] = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
                    memory = [int(subprocess.run([sys.executable, "-c", _SESSION_MEMORY, path, name, str(size)],
                                                 capture_output=True, text=True, check=True).stdout)
                              for _ in range(MEMORY_REPEATS)]
                    rows[form, level] = statistics.median(memory)
            outputs = {k: s.run(None, {"A": a})[0].view(np.uint32) for k, s in sessions.items()}
            times = {k: [] for k in sessions}
            for _ in range(CAST_RUNS if bits == 4 else CAST_RUNS // 10):
                for k, s in sessions.items():
                    start = time.perf_counter()
                    s.run(None, {"A": a})
                    times[k].append(time.perf_counter() - start)
            want = outputs["float32 scales", "all"]
            for (form, level), t in times.items():
                print(f"MatMulNBits {bits}-bit [{size}, {size}] {form:14s} {level}: same bits "
                      f"{np.array_equal(outputs[form, level], want)}; session {rows[form, level] / 2**20:.1f} MiB; "
                      f"min {min(t) * 1e3:.2f} ms, median {statistics.median(t) * 1e3:.2f} ms")


if __name__ == "__main__":
    if sys.argv[1:2] == ["scales-cast"]:  # scales-cast [SIZE [RUNS [MEMORY_REPEATS]]]: that measurement alone
        size, CAST_RUNS, MEMORY_REPEATS = ([int(a) for a in sys.argv[2:5]] + [4096, CAST_RUNS, MEMORY_REPEATS][len(sys.argv[2:5]):])
        scales_cast(size)
    else:
        main(*(int(a) for a in sys.argv[1:2]))
        tied()
        scales_cast(*(int(a) for a in sys.argv[1:2]))
