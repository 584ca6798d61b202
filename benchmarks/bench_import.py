"""What `dyndq import-weights` costs, per checkpoint format, against ONNX Runtime side by side.

    .venv/bin/python benchmarks/bench_import.py [--mb 24] [--runs 200] [--repeats 3] [--formats Q4_0,GPTQ ...]

A drawn decoder-like float model (one layer, torch's names, MatMul weights stored [in, out] as
exporters fold torch's Transpose: q, k, v, o of hidden x hidden, gate and up of hidden x 2 hidden,
gate * up, down; hidden a multiple of 256 chosen so that a 4-bit checkpoint of its seven weights
is about --mb MB) and, per format, a checkpoint of its weights as that format's tool lays it out:

- GGUF Q4_0, Q8_0, Q4_K, Q6_K, IQ4_NL, MXFP4 (llama.cpp's names, Q and K rows permuted as its
  converter does; gguf's own quantizer where it has one, else drawn blocks with small float16 scales:
  the output says which);
- GPTQ 4-bit, groups of 128, v1 zero points, without and with act-order (a drawn column order);
  AWQ GEMM 4-bit, groups of 128; compressed-tensors pack-quantized int4 symmetric groups of 128
  and int8 symmetric channels: round-to-nearest codes of the float weights, packed here in each
  format's published layout (docs/import.md: the layouts; the tests check the reader against each
  format's own dequantization).

Per format: `dyndq import-weights` run in a fresh process (--emit dyndq and --emit onnxruntime):
its wall time and the process's peak resident memory (VmHWM: ru_maxrss would carry the parent's
over) and its rise during the import (peak minus the process before it, Python and dyndq loaded), against the checkpoint's quantized bytes; the written file's bytes (model and external
data) over those bytes; the node types of each written file (what the import writes, whatever it
is: MatMulNBits where `--emit onnxruntime` fuses); then on ONNX Runtime (CPU, default optimization
level, one intra-op thread for latency): the session's memory (peak minus the process before
loading, a fresh process, median of --repeats) and the latency of one token (x [1, hidden]) through
the model's seven MatMuls (median of --runs calls) of the onnxruntime file and of the dyndq file
exported to standard ONNX (`dyndq.export(target="onnx")`), as ratios against the float model and
against ONNX Runtime's own int4 (`MatMulNBitsQuantizer`, blocks of 32, symmetric, on the float
model), all measured in this one run.  The codes' values do not change what is measured.
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import dyndq
from bench_int4_bridge import load, machine  # (beside this script: run as one, its folder is on sys.path)

GROUP = 128
GGUF_TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_NL", "MXFP4")
SAFETENSORS = ("GPTQ", "GPTQ act-order", "AWQ", "CT int4 group", "CT int8 channel")
FORMATS = GGUF_TYPES + SAFETENSORS
# module name -> (rows out, rows in) as multiples of hidden
SHAPES = {"self_attn.q_proj": (1, 1), "self_attn.k_proj": (1, 1), "self_attn.v_proj": (1, 1),
          "self_attn.o_proj": (1, 1), "mlp.gate_proj": (2, 1), "mlp.up_proj": (2, 1), "mlp.down_proj": (1, 2)}
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
HEAD_DIM = 64


def hidden_for(mb: float) -> int:
    """The hidden size (a multiple of 256) whose seven weights (10 hidden^2 values) at 4.5 bits are about `mb` MB."""
    return max(256, int(round((mb * 1e6 / (10 * 0.5625)) ** 0.5 / 256)) * 256)


def source_weights(hidden: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {m: (rng.standard_normal((o * hidden, i * hidden), np.float32) * 0.02).astype(np.float32)
            for m, (o, i) in SHAPES.items()}


def weight_name(module: str) -> str:
    return f"model.layers.0.{module}.weight"


def float_model(src: dict, hidden: int) -> onnx.ModelProto:
    """x [m, hidden] -> q, k, v, o in a chain -> gate, up -> gate * up -> down; B stored [in, out]."""
    nodes, x = [], "x"
    for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"):
        nodes.append(helper.make_node("MatMul", [x, weight_name(m)], [m]))
        x = m
    nodes += [helper.make_node("MatMul", [x, weight_name("mlp.gate_proj")], ["gate"]),
              helper.make_node("MatMul", [x, weight_name("mlp.up_proj")], ["up"]),
              helper.make_node("Mul", ["gate", "up"], ["act"]),
              helper.make_node("MatMul", ["act", weight_name("mlp.down_proj")], ["y"])]
    inits = [numpy_helper.from_array(np.ascontiguousarray(w.T), weight_name(m)) for m, w in src.items()]
    graph = helper.make_graph(nodes, "decoder_like", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


# ---- GGUF: llama.cpp's names and Q/K row permutation, gguf's quantizer or drawn blocks

# where each drawn block's scale fields are (byte offset, kind): set to small values so the weights are weights
_SCALE_FIELDS = {"Q4_K": ((0, "f16"), (2, "f16")), "Q6_K": ((208, "f16"),), "IQ4_NL": ((0, "f16"),),
                 "Q4_0": ((0, "f16"),), "Q8_0": ((0, "f16"),), "MXFP4": ((0, "e8m0"),)}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:  # llama.cpp's converter's Q/K row order
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_blocks(w: np.ndarray, kind: str, rng) -> tuple[np.ndarray, str]:
    """(GGUF bytes of w, how they were made)."""
    import gguf

    qt = gguf.GGMLQuantizationType[kind]
    try:
        return gguf.quants.quantize(w, qt), "gguf's quantizer"
    except NotImplementedError:
        pass
    block, size = gguf.GGML_QUANT_SIZES[qt]
    data = rng.integers(0, 256, (w.shape[0], w.shape[1] // block, size), dtype=np.uint8)
    for offset, field in _SCALE_FIELDS[kind]:
        if field == "f16":
            data[..., offset:offset + 2] = np.array([1e-3], np.float16).view(np.uint8)
        else:
            data[..., offset] = 120
    return data.reshape(w.shape[0], -1), "drawn blocks"


def write_gguf(path: str, src: dict, kind: str, hidden: int) -> str:
    import gguf

    rng = np.random.default_rng(1)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_head_count(hidden // HEAD_DIM)
    writer.add_head_count_kv(hidden // HEAD_DIM)
    how = set()
    for m, w in src.items():
        if m in ("self_attn.q_proj", "self_attn.k_proj"):
            w = _permute(w, hidden // HEAD_DIM)
        data, made = gguf_blocks(w, kind, rng)
        how.add(made)
        writer.add_tensor(f"blk.0.{GGUF_NAMES[m]}.weight", data, raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return ", ".join(sorted(how))


# ---- safetensors: round-to-nearest codes packed in each format's layout

def _pack_along_last(codes: np.ndarray, bits: int) -> np.ndarray:
    """int32 words of `codes` (uint, [..., n]): 32/bits codes a word, code j at bits j*bits (GPTQ's,
    compressed-tensors' order)."""
    per = 32 // bits
    c = codes.astype(np.uint32).reshape(*codes.shape[:-1], -1, per)
    return (c << (bits * np.arange(per, dtype=np.uint32))).sum(-1, dtype=np.uint32).view(np.int32)


def _asymmetric_groups(w_in_out: np.ndarray, group_rows: np.ndarray, groups: int):
    """4-bit asymmetric RTN of w [in, out] by the group of each input row: (q [in, out], scales, zeros [groups, out])."""
    lo = np.stack([w_in_out[group_rows == g].min(0) for g in range(groups)])
    hi = np.stack([w_in_out[group_rows == g].max(0) for g in range(groups)])
    scale = np.maximum(hi - lo, 1e-8) / 15
    zero = np.clip(np.round(-lo / scale), 1, 15)  # (1..15: GPTQ v1 stores zero - 1)
    s16 = scale.astype(np.float16)
    q = np.clip(np.round(w_in_out / s16.astype(np.float32)[group_rows]) + zero[group_rows], 0, 15).astype(np.uint8)
    return q, s16, zero.astype(np.uint8)


def gptq_module(w: np.ndarray, act_order: bool, rng) -> dict[str, np.ndarray]:
    n_in = w.shape[1]
    groups = n_in // GROUP
    order = rng.permutation(n_in) if act_order else np.arange(n_in)
    g_idx = np.empty(n_in, np.int32)
    g_idx[order] = np.arange(n_in) // GROUP  # (act-order: groups in the order the columns were quantized)
    q, scales, zeros = _asymmetric_groups(np.ascontiguousarray(w.T), g_idx, groups)
    return {"qweight": np.ascontiguousarray(_pack_along_last(q.T, 4).T), "qzeros": _pack_along_last(zeros - 1, 4),
            "scales": scales, "g_idx": g_idx}


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def awq_module(w: np.ndarray) -> dict[str, np.ndarray]:
    n_in = w.shape[1]
    q, scales, zeros = _asymmetric_groups(np.ascontiguousarray(w.T), np.arange(n_in) // GROUP, n_in // GROUP)

    def pack(codes):  # AutoAWQ's: nibble i of word c holds column 8c + AWQ_ORDER[i]
        words = np.zeros((codes.shape[0], codes.shape[1] // 8), np.uint32)
        for i, col in enumerate(AWQ_ORDER):
            words |= codes[:, col::8].astype(np.uint32) << np.uint32(4 * i)
        return words.view(np.int32)
    return {"qweight": pack(q), "qzeros": pack(zeros), "scales": scales}


def ct_module(w: np.ndarray, bits: int, group: int | None) -> dict[str, np.ndarray]:
    """compressed-tensors pack-quantized, symmetric: codes q + 2^(b-1) along the inputs, scales [out, groups]."""
    out, n_in = w.shape
    g = group or n_in
    half = 1 << (bits - 1)
    scale = (np.abs(w.reshape(out, n_in // g, g)).max(-1) / (half - 1)).astype(np.float16)
    s = np.maximum(scale.astype(np.float32), 1e-8)
    q = np.clip(np.round(w.reshape(out, n_in // g, g) / s[..., None]), -half, half - 1).reshape(out, n_in)
    return {"weight_packed": _pack_along_last((q + half).astype(np.uint8), bits), "weight_scale": scale,
            "weight_shape": np.array([out, n_in], np.int64)}


def write_safetensors(folder: str, src: dict, kind: str) -> str:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(2)
    os.makedirs(folder, exist_ok=True)
    tensors = {}
    for m, w in src.items():
        module = (gptq_module(w, kind == "GPTQ act-order", rng) if kind.startswith("GPTQ") else awq_module(w)
                  if kind == "AWQ" else ct_module(w, 4, GROUP) if kind == "CT int4 group" else ct_module(w, 8, None))
        tensors.update({f"model.layers.0.{m}.{k}": v for k, v in module.items()})
    save_file(tensors, os.path.join(folder, "model.safetensors"))
    if kind.startswith("GPTQ"):
        config = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": kind != "GPTQ", "sym": False,
                  "checkpoint_format": "gptq"}
    elif kind == "AWQ":
        config = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm", "zero_point": True}
    else:
        bits, strategy = (4, "group") if kind == "CT int4 group" else (8, "channel")
        weights = {"num_bits": bits, "type": "int", "symmetric": True, "strategy": strategy}
        if strategy == "group":
            weights["group_size"] = GROUP
        config = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights}}}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"quantization_config": config}, f)
    return "round to nearest, packed here"


# ---- measuring

_IMPORT = """
import sys, time
def hwm():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
from dyndq.checkpoints import import_file
before = hwm()
t = time.perf_counter()
import_file(sys.argv[1], sys.argv[2], sys.argv[3], emit=sys.argv[4])
print(f"@@ {time.perf_counter() - t:.3f} {hwm()} {before}")
"""


def run_import(model: str, checkpoint: str, out: str, emit: str) -> tuple[float, int, int]:
    """(seconds, peak RSS, RSS before the import) of the import in a fresh process."""
    r = subprocess.run([sys.executable, "-c", _IMPORT, model, checkpoint, out, emit], capture_output=True, text=True)
    line = next((l for l in r.stdout.splitlines() if l.startswith("@@ ")), None)
    if line is None:
        raise SystemExit(f"importing {checkpoint} failed:\n{r.stdout}{r.stderr}")
    _, seconds, peak, before = line.split()
    return float(seconds), int(peak), int(before)


def file_bytes(path: str) -> int:
    return os.path.getsize(path) + (os.path.getsize(path + ".data") if os.path.exists(path + ".data") else 0)


def node_types(model: onnx.ModelProto) -> str:
    counts = collections.Counter(n.op_type for n in model.graph.node)
    return " ".join(f"{op}:{n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def quantized_bytes(checkpoint: str) -> int:
    from dyndq.checkpoints.source import open_checkpoint

    return sum(t.nbytes for t in open_checkpoint(checkpoint).tensors())


def latency(path: str, hidden: int, runs: int) -> float:
    """Median seconds of one call, x [1, hidden], one intra-op thread, default optimizations."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    x = {"x": np.random.default_rng(1).standard_normal((1, hidden)).astype(np.float32)}
    for _ in range(10):
        session.run(None, x)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        session.run(None, x)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def session(path: str, hidden: int, runs: int, repeats: int) -> tuple[float, float]:
    """(session memory in bytes, median of `repeats` fresh processes; latency in seconds)."""
    loads = [load(path, "all") for _ in range(repeats)]
    return statistics.median(peak - before for _, peak, before in loads), latency(path, hidden, runs)


def ort_int4(float_path: str, out: str) -> float:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    t = time.perf_counter()
    quant = MatMulNBitsQuantizer(onnx.load(float_path), block_size=32, is_symmetric=True)
    quant.process()
    onnx.save(quant.model.model, out)
    return time.perf_counter() - t


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=float, default=24.0, help="about how many MB a 4-bit checkpoint of the model is")
    p.add_argument("--runs", type=int, default=50, help="calls a latency is the median of")
    p.add_argument("--repeats", type=int, default=3, help="fresh processes a session's memory is the median of")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated, of: " + ", ".join(FORMATS))
    args = p.parse_args(argv)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        p.error(f"unknown formats {unknown}; known: {', '.join(FORMATS)}")
    hidden = hidden_for(args.mb)
    for chatty in ("gguf", "onnxruntime.quantization"):  # (each says every file or weight it writes)
        logging.getLogger(chatty).setLevel(logging.WARNING)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as d:
        src = source_weights(hidden)
        float_path = os.path.join(d, "float.onnx")
        dyndq.save_model(float_model(src, hidden), float_path)
        n_weights = sum(w.size for w in src.values())
        print(f"model: hidden {hidden}, 7 MatMuls, {n_weights / 1e6:.1f} M weights, float file "
              f"{file_bytes(float_path) / 1e6:.1f} MB; latency: x [1, {hidden}], median of {args.runs} calls, "
              f"1 intra-op thread; session memory: median of {args.repeats} fresh processes")
        int4_path = os.path.join(d, "ort_int4.onnx")
        int4_seconds = ort_int4(float_path, int4_path)
        base = {"float": session(float_path, hidden, args.runs, args.repeats),
                "ORT int4": session(int4_path, hidden, args.runs, args.repeats)}
        print(f"ONNX Runtime alone: float {base['float'][0] / 2**20:.0f} MiB, {base['float'][1] * 1e3:.3f} ms; "
              f"ORT int4 (MatMulNBitsQuantizer, blocks of 32, {int4_seconds:.1f} s to quantize; "
              f"{node_types(onnx.load(int4_path, load_external_data=False))}) {file_bytes(int4_path) / 1e6:.1f} MB, "
              f"{base['ORT int4'][0] / 2**20:.0f} MiB, {base['ORT int4'][1] * 1e3:.3f} ms")
        print("\nimport: a fresh process each; ratios: /ckpt over the checkpoint's quantized bytes, "
              "x float / x int4 over ONNX Runtime's float model / its own int4, both measured above")
        head = (f"| format | checkpoint | ckpt MB | emit | import s | peak MiB (before) | rise/ckpt | file/ckpt | "
                f"ORT MiB | x float | x int4 | ms/token | x float | x int4 | nodes written |")
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for kind in formats:
            if kind in GGUF_TYPES:
                ckpt = os.path.join(d, f"{kind}.gguf")
                made = write_gguf(ckpt, src, kind, hidden)
            else:
                ckpt = os.path.join(d, kind.replace(" ", "_"))
                made = write_safetensors(ckpt, src, kind)
            qbytes = quantized_bytes(ckpt)
            for emit in ("dyndq", "onnxruntime"):
                out = os.path.join(d, f"out_{emit}.onnx")
                seconds, peak, before = run_import(float_path, ckpt, out, emit)
                written = file_bytes(out)
                model = onnx.load(out, load_external_data=False)
                nodes = node_types(model)
                if emit == "dyndq":  # (on ONNX Runtime: exported to standard ONNX)
                    ort_path = os.path.join(d, "out_onnx.onnx")
                    dyndq.save_model(dyndq.export(dyndq.load_model(out), target="onnx"), ort_path)
                    label = "dyndq (as onnx)"
                else:
                    ort_path, label = out, emit
                memory, seconds_call = session(ort_path, hidden, args.runs, args.repeats)
                print(f"| {kind} | {made} | {qbytes / 1e6:.1f} | {label} | {seconds:.2f} | {peak / 2**20:.0f} "
                      f"({before / 2**20:.0f}) | {(peak - before) / qbytes:.2f} | {written / qbytes:.3f} | "
                      f"{memory / 2**20:.0f} | {memory / base['float'][0]:.2f} | {memory / base['ORT int4'][0]:.2f} | "
                      f"{seconds_call * 1e3:.3f} | {seconds_call / base['float'][1]:.2f} | "
                      f"{seconds_call / base['ORT int4'][1]:.2f} | {nodes} |")
                for f in (out, out + ".data", ort_path, ort_path + ".data"):
                    if os.path.exists(f):
                        os.remove(f)
            if os.path.isdir(ckpt):
                for f in os.listdir(ckpt):
                    os.remove(os.path.join(ckpt, f))
                os.rmdir(ckpt)
            else:
                os.remove(ckpt)
    print(f"\nload at the end: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
