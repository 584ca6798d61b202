"""dyndq quantize against ONNX Runtime's own quantizer, on an LLM-shaped float model, in one run.

    .venv/bin/python benchmarks/bench_quantize.py [--hidden 2048] [--layers 2] [--repeat 1] ...

Builds a decoder-like float32 model (token embedding, blocks of RMSNorm, attention with q/k/v/o
projections, a SiLU-gated MLP, residual adds, an LM head; Student-t weights with 4 degrees of
freedom, seeded) and measures, side by side:
- quantize time: dyndq (rtn, search) and ONNX Runtime's MatMulNBitsQuantizer (its default RTN,
  and HQQ when torch is installed: `make test-torch` installs it), 4 bits, groups of 128, asymmetric,
  MatMul and Gather (HQQ: MatMul only, it quantizes no Gather);
- that dyndq's rtn gives ONNX Runtime's very codes, scales and zero points;
- the size ratio, the reconstruction error over the MatMul weights (relative Frobenius, max
  abs, cosine) and the output error (logits on seeded token ids) of each;
- how close each method gets to the exhaustive per-group bound, on a sample of groups;
- the external-data path (`dyndq quantize` on the model saved with external data, in a
  fresh process): its time, peak memory (ru_maxrss) and files, beside ONNX Runtime's;
- that the quantized model runs on ONNX Runtime and on the reference engine, and agrees.
Timings are medians of --repeat runs; the machine and its load are printed with them.
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.model_files import save_model
from dyndq.quantization.numerics import ErrorStats
from dyndq.plumbing.light import stored_bytes
from dyndq.quantization.rtn import rtn
from dyndq.quantization.search import exhaustive, search, squared_error

GROUP = 128


# -- the model -------------------------------------------------------------------------------


OUTLIER_LAYERS = ("attn.o_proj", "mlp.down_proj")  # (--outliers: the layers given outlier input channels)


def decoder(hidden: int, layers: int, intermediate: int, vocab: int, heads: int, seed: int = 0,
            outliers: bool = False) -> onnx.ModelProto:
    """ids [1, S] -> logits [1, S, vocab]: an LLM-shaped float32 graph with seeded heavy-tailed weights.
    outliers: o_proj's and down_proj's weights get outlier input channels, as LLMs' layers fed by
    attention and the gated MLP have: one row in every 128 (row 5 of each group) 60 times the others."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def weight(name, shape, scale):
        w = (rng.standard_t(4, size=shape) * scale).astype(np.float32)
        if outliers and any(f".{layer}." in name for layer in OUTLIER_LAYERS):
            w[5::GROUP] *= 60
        inits.append(nh.from_array(w, name))
        return name

    def const(name, value):
        inits.append(nh.from_array(np.asarray(value), name))
        return name

    def node(op, inputs, name, **attrs):
        nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def rms_norm(x, prefix):
        sq = node("Mul", [x, x], f"{prefix}.sq")
        mean = node("ReduceMean", [sq, "axes_last"], f"{prefix}.mean", keepdims=1)
        root = node("Sqrt", [node("Add", [mean, "eps"], f"{prefix}.add_eps")], f"{prefix}.rms")
        scaled = node("Div", [x, root], f"{prefix}.normed")
        return node("Mul", [scaled, const(f"{prefix}.weight", np.ones(hidden, np.float32))], f"{prefix}.out")

    head = hidden // heads
    const("axes_last", np.array([-1], np.int64))
    const("eps", np.array(1e-6, np.float32))
    const("split_heads", np.array([0, 0, heads, head], np.int64))
    const("merge_heads", np.array([0, 0, hidden], np.int64))
    const("inv_sqrt_head", np.array(1 / np.sqrt(head), np.float32))
    x = node("Gather", [weight("embed.weight", (vocab, hidden), 0.02), "ids"], "embed")
    for i in range(layers):
        p = f"layers.{i}"
        n1 = rms_norm(x, f"{p}.input_norm")
        qkv = [node("MatMul", [n1, weight(f"{p}.attn.{w}.weight", (hidden, hidden), hidden ** -0.5)], f"{p}.attn.{w}")
               for w in ("q_proj", "k_proj", "v_proj")]
        q, k, v = [node("Transpose", [node("Reshape", [t, "split_heads"], f"{t}.heads")], f"{t}.t", perm=[0, 2, 1, 3])
                   for t in qkv]
        kt = node("Transpose", [k], f"{p}.attn.kT", perm=[0, 1, 3, 2])
        scores = node("Mul", [node("MatMul", [q, kt], f"{p}.attn.qk"), "inv_sqrt_head"], f"{p}.attn.scores")
        probs = node("Softmax", [scores], f"{p}.attn.probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, v], f"{p}.attn.ctx")], f"{p}.attn.ctx.t", perm=[0, 2, 1, 3])
        merged = node("Reshape", [ctx, "merge_heads"], f"{p}.attn.merged")
        o = node("MatMul", [merged, weight(f"{p}.attn.o_proj.weight", (hidden, hidden), hidden ** -0.5)], f"{p}.attn.o_proj")
        x = node("Add", [x, o], f"{p}.attn.residual")
        n2 = rms_norm(x, f"{p}.post_norm")
        gate = node("MatMul", [n2, weight(f"{p}.mlp.gate_proj.weight", (hidden, intermediate), hidden ** -0.5)], f"{p}.mlp.gate")
        up = node("MatMul", [n2, weight(f"{p}.mlp.up_proj.weight", (hidden, intermediate), hidden ** -0.5)], f"{p}.mlp.up")
        act = node("Mul", [gate, node("Sigmoid", [gate], f"{p}.mlp.sigmoid")], f"{p}.mlp.silu")
        down_in = node("Mul", [act, up], f"{p}.mlp.gated")
        down = node("MatMul", [down_in, weight(f"{p}.mlp.down_proj.weight", (intermediate, hidden), intermediate ** -0.5)],
                    f"{p}.mlp.down")
        x = node("Add", [x, down], f"{p}.mlp.residual")
    logits = node("MatMul", [rms_norm(x, "final_norm"), weight("lm_head.weight", (hidden, vocab), hidden ** -0.5)], "logits")
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("ids", T.INT64, [1, "sequence"])],
                              [helper.make_tensor_value_info(logits, T.FLOAT, [1, "sequence", vocab])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


# -- ONNX Runtime's quantizer ----------------------------------------------------------------


def ort_quantize(model: onnx.ModelProto, algorithm: str, bits: int = 4) -> onnx.ModelProto:
    from onnxruntime.quantization import matmul_nbits_quantizer as q

    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # (it changes the model it is given)
    if algorithm == "hqq":
        config = q.HQQWeightOnlyQuantConfig(block_size=GROUP, bits=bits, op_types_to_quantize=("MatMul",))
        quantizer = q.MatMulNBitsQuantizer(copy, algo_config=config)
    else:  # (at 2 bits it quantizes MatMul only, and says it refuses Gather)
        quantizer = q.MatMulNBitsQuantizer(copy, block_size=GROUP, bits=bits, op_types_to_quantize=("MatMul", "Gather"))
    quantizer.process()
    return quantizer.model.model


def matmulnbits_weights(model: onnx.ModelProto) -> dict:
    """float weight name -> a function giving the weight its MatMulNBits node dequantizes to,
    (q - zp) * scale, [K, N] (one weight in memory at a time): our kernel on its codes, scales
    and integer zero points (RTN's); HQQ's float zero points, which our op has no form for, by
    MatMulNBits' own arithmetic."""
    inits = {t.name: t for t in model.graph.initializer}

    def unpacked(packed, bits):  # (8 / bits codes a byte, lowest bits first)
        return np.stack([(packed >> s) & ((1 << bits) - 1) for s in range(0, 8, bits)], axis=-1)

    def weight(n):
        attrs = {a.name: a.i for a in n.attribute}
        k, cols, bs, bits = attrs["K"], attrs["N"], attrs["block_size"], attrs.get("bits", 4)
        packed = nh.to_array(inits[n.input[1]])
        blocks = packed.shape[1]
        codes = unpacked(packed, bits).reshape(cols, blocks * bs)
        scales = nh.to_array(inits[n.input[2]]).astype(np.float32).reshape(cols, blocks)
        if len(n.input) > 3 and n.input[3]:
            zp = nh.to_array(inits[n.input[3]])
            if zp.dtype == np.uint8:  # (packed 8 / bits to a byte, each row to whole bytes)
                zp = np.ascontiguousarray(unpacked(zp, bits).reshape(cols, -1)[:, :blocks])
        else:
            zp = np.full((cols, blocks), 1 << (bits - 1), np.uint8)
        if zp.dtype == np.uint8:
            w = dyndq.dynamic_dequantize(codes, scales, zp, qtype="per_group", group_shape=[1, bs])
        else:
            zp = zp.reshape(cols, blocks).astype(np.float32)
            w = (codes.astype(np.float32) - np.repeat(zp, bs, axis=1)) * np.repeat(scales, bs, axis=1)
        return np.ascontiguousarray(w[:, :k].T)

    return {n.input[1].rsplit("_Q", 1)[0]: (lambda n=n: weight(n)) for n in model.graph.node if n.op_type == "MatMulNBits"}


def dyndq_weights(model: onnx.ModelProto) -> dict:
    """float weight name -> a function giving the weight its DynamicDequantize node gives back
    (our kernel on the node's inputs)."""
    from dyndq.plumbing.types import attribute_values

    inits = {t.name: t for t in model.graph.initializer}

    produced = {n.output[0]: n for n in model.graph.node}

    def value(name):  # (an initializer, or the output of a DynamicDequantize: NVFP4's block scales)
        if name in inits:
            return nh.to_array(inits[name])
        return weight(produced[name])

    def weight(n):
        return dyndq.dynamic_dequantize(*[value(i) for i in n.input], **attribute_values(n))

    # (the node writing W_dequantized: every weight here, whose axes are whole groups; NVFP4's
    # node dequantizing block scales writes W_scales)
    return {n.output[0].removesuffix("_dequantized"): (lambda n=n: weight(n))
            for n in model.graph.node if n.op_type == "DynamicDequantize" and n.output[0].endswith("_dequantized")}


# -- the low-bit formats ---------------------------------------------------------------------


def low_bit(model: onnx.ModelProto, matmuls: list, floats: int, repeat: int, slow_rounds: int, hqq: bool) -> None:
    """2 bits in groups of 128 (dyndq rtn and search, ONNX Runtime's 2-bit RTN and, with torch, its
    2-bit HQQ: MatMul only, as it quantizes no Gather at 2 bits), MXFP4 and NVFP4 (MatMul only, to
    compare like with like; search and HQQ timed in `slow_rounds` runs, the others in `repeat`): time,
    the model's tensors after / before, the reconstruction error over the MatMul weights, whether
    dyndq's 2-bit rtn is ONNX Runtime's value for value, and the output error."""
    from dyndq.runner import clear_cache

    only = dict(ops=("MatMul",), evaluate=False)
    runs = {
        "ORT RTN, 2 bits": lambda: ort_quantize(model, "rtn", bits=2),
        "dyndq rtn, 2 bits": lambda: dyndq.quantize(model, bits=2, **only)[0],
        "dyndq search, 2 bits": lambda: dyndq.quantize(model, bits=2, method="search", **only)[0],
        **({"ORT HQQ, 2 bits": lambda: ort_quantize(model, "hqq", bits=2)} if hqq else {}),
        "dyndq mxfp4": lambda: dyndq.quantize(model, format="mxfp4", **only)[0],
        "dyndq nvfp4": lambda: dyndq.quantize(model, format="nvfp4", **only)[0],
        "dyndq rtn, 4 bits (beside)": lambda: dyndq.quantize(model, **only)[0],
    }
    inits = {t.name: t for t in model.graph.initializer}
    ids = np.random.default_rng(2).integers(0, inits["embed.weight"].dims[0], size=(1, 16), dtype=np.int64)
    want = ort_session(model).run(None, {"ids": ids})[0]
    print("\nlow-bit formats, MatMul weights only (groups of 128 for the integer codes; MXFP4 blocks of 32, NVFP4 of 16):")
    print(f"  {'':28s} {'time':>8s}  {'tensors':>8s}  {'rel. error':>10s}  {'max abs':>8s}  {'cosine':>8s}  output rel. / cosine")
    theirs_2 = None  # (ONNX Runtime's 2-bit model, until dyndq's 2-bit rtn is compared with it)
    for label, run in runs.items():
        t, quantized = timed(run, slow_rounds if "search" in label or "HQQ" in label else repeat)
        ratio = sum(stored_bytes(x) for x in quantized.graph.initializer) / floats
        weights = matmulnbits_weights(quantized) if label.startswith("ORT") else dyndq_weights(quantized)
        stats = ErrorStats()
        same = True
        for name in matmuls:  # (one float weight in memory at a time)
            w, dq = nh.to_array(inits[name]), weights[name]()
            stats.add(w.ravel(), dq.ravel())
            if label == "dyndq rtn, 2 bits":
                same &= bool(np.array_equal(theirs_2[name](), dq))
            del w, dq
        if label.startswith("ORT"):
            got = ort_session(quantized).run(None, {"ids": ids})[0]
        else:
            got = dyndq.run(quantized, {"ids": ids}, engine="onnxruntime")["logits"]
            clear_cache()
        out = compare(want, got)
        print(f"  {label:28s} {t:7.2f}s  {ratio:7.3f}x  {stats.relative:10.5f}  {stats.max_abs:8.4g}  {stats.cosine:.6f}"
              f"  {out.relative:.4f} / {out.cosine:.4f}")
        if label == "ORT RTN, 2 bits":
            theirs_2 = weights
        elif label == "dyndq rtn, 2 bits":
            print(f"  {'':28s} (dyndq rtn at 2 bits gives ONNX Runtime's 2-bit RTN weights, value for value: "
                  f"{'yes' if same else 'NO'})")
            theirs_2 = None
        del quantized, weights, got


# -- mixed widths under a budget -------------------------------------------------------------


def mixed_widths(model: onnx.ModelProto, matmuls: list, floats: int, repeat: int, label: str) -> None:
    """`quantize --budget` at uniform 4-bit search's own bits per weight (int2/int4/int8, and with
    mxfp4 too), beside uniform 4-bit search, RTN and ONNX Runtime's RTN (MatMul and Gather): time,
    bits per weight over the weights quantized, the model's tensors after / before, the
    reconstruction error over the MatMul weights, and the output error on the logits: on the
    inputs the allocation was chosen on (the evaluation's seeded ones, seed 0, 4 tokens) and on 16
    other seeded token ids (held out)."""
    from dyndq.runner import clear_cache

    inits = {t.name: t for t in model.graph.initializer}
    ids = np.random.default_rng(2).integers(0, inits["embed.weight"].dims[0], size=(1, 16), dtype=np.int64)
    want = ort_session(model).run(None, {"ids": ids})[0]
    t_u, (uniform, u) = timed(lambda: dyndq.quantize(model, method="search"), repeat)
    elements = sum(int(np.prod(layer.shape)) for layer in u.layers)
    bits = 8 * u.bytes_after / elements
    runs = {"ORT RTN, 4 bits": None, "dyndq rtn, 4 bits": lambda: dyndq.quantize(model),
            "dyndq search, 4 bits": lambda: (uniform, u),
            "dyndq --budget (int2,int4,int8)": lambda: dyndq.quantize(model, budget=bits, method="search"),
            "dyndq --budget (+ mxfp4)": lambda: dyndq.quantize(model, budget=bits, method="search",
                                                               format_choices="int2,int4,int8,mxfp4")}
    print(f"\nmixed widths, {label}: the budget {bits:.4f} bits per weight = uniform 4-bit search's (groups of 128, "
          "MatMul and Gather)")
    print(f"  {'':34s} {'time':>8s}  {'bits/w':>6s}  {'tensors':>7s}  {'rel. error':>10s}  {'cosine':>8s}  "
          "output rel.: chosen on / held out")
    for name, run in runs.items():
        if run is None:
            t, quantized = timed(lambda: ort_quantize(model, "rtn"), repeat)
            report = None
        else:
            t, (quantized, report) = timed(run, repeat) if "search" not in name else (t_u, run())
        tensors = sum(stored_bytes(x) for x in quantized.graph.initializer) / floats
        weights = matmulnbits_weights(quantized) if run is None else dyndq_weights(quantized)
        stats = ErrorStats()
        for w_name in matmuls:  # (one float weight in memory at a time)
            w, dq = nh.to_array(inits[w_name]), weights[w_name]()
            stats.add(w.ravel(), dq.ravel())
            del w, dq
        if run is None:
            got, own, b = ort_session(quantized).run(None, {"ids": ids})[0], float("nan"), float("nan")
        else:
            got = dyndq.run(quantized, {"ids": ids}, engine="onnxruntime")["logits"]
            clear_cache()
            own, b = report.outputs[0].relative_error, 8 * report.bytes_after / elements
        out = compare(want, got)
        print(f"  {name:34s} {t:7.2f}s  {b:6.4f}  {tensors:6.4f}x  {stats.relative:10.5f}  {stats.cosine:.6f}  "
              f"{own:.4f} / {out.relative:.4f}")
        if report is not None and report.budget is not None:
            counts = {}
            for w in report.budget.weights:
                c = w.candidates[w.chosen].choice
                counts[c] = counts.get(c, 0) + 1
            print(f"  {'':34s} ({', '.join(f'{n} {c}' for c, n in sorted(counts.items()))}; kept: {report.budget.kept}; "
                  f"allocation {report.seconds:.1f} s of it)")
            for w in report.budget.weights:
                print(f"  {'':34s}   {w.name}: {w.candidates[w.chosen].choice} ({w.why})")
            print(f"  {'':34s}   allocations run (bytes, predicted / measured relative squared error): " + "; ".join(
                f"{label} {b} {p:.4g} / {m:.4g}" for label, b, p, m in report.budget.considered))
        del quantized, weights, got


# -- measuring -------------------------------------------------------------------------------


def timed(fn, repeat: int):
    times, result = [], None
    for _ in range(repeat):
        result = None
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), result


def interleaved(runs: dict, repeat: int, rounds_of: dict) -> tuple[dict, dict]:
    """({label: [seconds of each round]}, {label: the last round's result}): `repeat` rounds,
    each running every function of `runs` once, in order (those named in `rounds_of` only in
    that many first rounds)."""
    times, results = {k: [] for k in runs}, {}
    for r in range(repeat):
        for label, fn in runs.items():
            if r >= rounds_of.get(label, repeat):
                continue
            results[label] = None  # (the last round's result let go before the next is made)
            start = time.perf_counter()
            results[label] = fn()
            times[label].append(time.perf_counter() - start)
    return times, results


def ort_session(model: onnx.ModelProto):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC  # (the graph's own meaning)
    options.enable_cpu_mem_arena = False  # (its memory goes back when the session does)
    options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def compare(want: np.ndarray, got: np.ndarray) -> ErrorStats:
    stats = ErrorStats()
    stats.add(want.ravel(), got.ravel())
    return stats


def sample_groups(model: onnx.ModelProto, names, count: int, seed: int) -> tuple[np.ndarray, list]:
    """`count` groups of 128 consecutive rows of one column, drawn at random from the MatMul weights."""
    rng = np.random.default_rng(seed)
    inits = {t.name: t for t in model.graph.initializer}
    picks = []
    for _ in range(count):
        name = names[rng.integers(len(names))]
        k, n = inits[name].dims
        picks.append((name, int(rng.integers(k // GROUP)) * GROUP, int(rng.integers(n))))
    arrays = {name: nh.to_array(inits[name]) for name in {p[0] for p in picks}}
    groups = np.stack([arrays[name][r:r + GROUP, c] for name, r, c in picks])
    return groups.reshape(count, 1, GROUP), picks


# (the peak from /proc/self/status VmHWM: ru_maxrss survives exec, so a child of this big
# process would report this process' own peak)
_CHILD = """
import sys, time
t = time.perf_counter()
{body}
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(f"@@ {{time.perf_counter() - t:.2f}} {{hwm * 1024}}")
"""


def in_child(body: str) -> tuple[float, int]:
    """(seconds, peak resident bytes) of `body` run in a fresh Python."""
    out = subprocess.run([sys.executable, "-c", _CHILD.format(body=body)], capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    seconds, peak = out.stdout.strip().splitlines()[-1].split()[1:]
    return float(seconds), int(peak)


def files_size(folder: str, stem: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder) if f.startswith(stem))


def memory() -> str:
    """This process' resident memory now and at its peak (Linux)."""
    try:
        status = {line.split(":")[0]: int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("Vm")}
    except OSError:
        return "memory: ?"
    return f"memory now {status['VmRSS'] / 2**20:.2f} GiB, peak {status['VmHWM'] / 2**20:.2f} GiB"


def machine() -> str:
    model = platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import onnxruntime

    load = " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else "?"
    return (f"{model}, {os.cpu_count()} CPUs, load average {load}; Python {platform.python_version()}, "
            f"NumPy {np.__version__}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__}")


# -- the run ---------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--repeat", type=int, default=1, help="runs of each quantizer; the median is shown")
    p.add_argument("--slow-rounds", type=int, default=None,
                   help="rounds HQQ and search run in (default: every round; they take minutes)")
    p.add_argument("--sample-groups", type=int, default=2048, help="groups the exhaustive bound is measured on")
    p.add_argument("--scales", type=int, default=1000, help="scales per zero point the exhaustive search tries")
    p.add_argument("--no-hqq", action="store_true", help="leave out ONNX Runtime's HQQ (it needs torch)")
    p.add_argument("--no-files", action="store_true", help="leave out the external-data runs in fresh processes")
    p.add_argument("--no-low-bit", action="store_true", help="leave out the 2-bit, MXFP4 and NVFP4 rows")
    p.add_argument("--no-mixed", action="store_true", help="leave out the mixed-width (--budget) rows")
    p.add_argument("--mixed-only", action="store_true",
                   help="only the mixed-width rows: on the model as is and on the model with --outliers' layers")
    p.add_argument("--outliers", action="store_true",
                   help=f"give {' and '.join(OUTLIER_LAYERS)} outlier input channels (one row in 128, 60x)")
    args = p.parse_args(argv)
    args.slow_rounds = args.repeat if args.slow_rounds is None else max(1, min(args.slow_rounds, args.repeat))
    print(f"machine: {machine()}")
    model = decoder(args.hidden, args.layers, args.intermediate, args.vocab, args.heads, outliers=args.outliers)
    matmuls = [t.name for t in model.graph.initializer if t.name.endswith(".weight") and len(t.dims) == 2
               and t.name != "embed.weight"]
    floats = sum(int(np.prod(t.dims)) * 4 for t in model.graph.initializer)
    print(f"model: hidden {args.hidden}, {args.layers} blocks, MLP {args.intermediate}, vocabulary {args.vocab}: "
          f"{floats / 2**30:.2f} GiB of float32 weights ({len(matmuls)} MatMul weights and an embedding)")

    if args.mixed_only:
        mixed_widths(model, matmuls, floats, args.repeat, "the model as is (Student-t weights everywhere)")
        del model
        outlying = decoder(args.hidden, args.layers, args.intermediate, args.vocab, args.heads, outliers=True)
        mixed_widths(outlying, matmuls, floats, args.repeat,
                     f"the model with outlier input channels in {' and '.join(OUTLIER_LAYERS)}")
        print(f"  ({memory()})")
        return 0
    hqq = not args.no_hqq
    if hqq:
        try:
            import torch  # noqa: F401
        except ImportError:
            hqq = False
            print("ONNX Runtime's HQQ: left out (it needs torch, which is not installed)")

    # 1. quantize time, in this process, side by side
    rows = []
    # (interleaved rounds: each round runs every quantizer once, so the load other work puts on
    # the machine falls on all of them alike; HQQ first in a round, its torch temporaries the largest)
    runs = {"hqq": lambda: ort_quantize(model, "hqq")} if hqq else {}
    runs.update({
        "rtn": lambda: dyndq.quantize(model, evaluate=False),
        "ort": lambda: ort_quantize(model, "rtn"),
        "rtn+eval": lambda: dyndq.quantize(model)[1],  # (the default: the report's evaluation too)
        "search": lambda: dyndq.quantize(model, method="search", evaluate=False),
        "matmul": lambda: dyndq.quantize(model, method="search", ops=("MatMul",), evaluate=False),
    })
    slow = {"hqq", "search", "matmul"}  # (the quantizers of minutes: in the first --slow-rounds rounds only)
    times, results = interleaved(runs, args.repeat, {k: args.slow_rounds for k in slow})
    t = {k: float(np.median(v)) for k, v in times.items()}
    t_hqq, ort_hqq = t.get("hqq"), results.get("hqq")
    t_rtn, (ours_rtn, report_rtn) = t["rtn"], results["rtn"]
    t_search, (ours_search, report_search) = t["search"], results["search"]
    t_ort, ort_rtn = t["ort"], results["ort"]
    t_matmul, (ours_matmul, _) = t["matmul"], results["matmul"]
    stored = lambda m: sum(stored_bytes(t) for t in m.graph.initializer) / floats  # noqa: E731
    rows.append(("dyndq rtn (--no-evaluate)", t_rtn, stored(ours_rtn)))
    rows.append(("dyndq rtn, with evaluation (the default)", t["rtn+eval"], stored(ours_rtn)))
    rows.append(("dyndq search", t_search, stored(ours_search)))
    rows.append(("ORT RTN (MatMulNBits, GatherBlockQuantized)", t_ort, stored(ort_rtn)))
    rows.append(("dyndq search, MatMul only (as ORT HQQ)", t_matmul, stored(ours_matmul)))
    if hqq:
        rows.append(("ORT HQQ (MatMulNBits; no Gather)", t_hqq, stored(ort_hqq)))
    print(f"\nquantize time (4 bits, groups of 128, asymmetric; median of {args.repeat} interleaved rounds, "
          f"HQQ and search in the first {args.slow_rounds}), and the model's tensors after / before:")
    for name, seconds, ratio in rows:
        print(f"  {name:45s} {seconds:7.2f} s  ({seconds / t_ort:.2f}x ORT RTN)  tensors {ratio:.3f}x")
    rounds = "; ".join(f"{k} " + " ".join(f"{x:.2f}" for x in v) for k, v in times.items())
    print(f"  (every round, s: {rounds}; load average now {' '.join(open('/proc/loadavg').read().split()[:3])})")
    if hqq:
        print(f"  (dyndq search: {t_search / t_hqq:.3f}x ORT HQQ's time; MatMul only {t_matmul / t_hqq:.3f}x)")
    print(f"  (dyndq's report: its quantized weights are {report_rtn.size_ratio:.4f}x the float weights they replace, "
          f"codes {4 / 32:.3f}x + scales and zero points)")

    print(f"  ({memory()})")
    # 2. exactness, 3. reconstruction error, 4. the bound: one float weight in memory at a time
    names = matmuls
    inits = {t.name: t for t in model.graph.initializer}
    ours_rtn_w, theirs_rtn = dyndq_weights(ours_rtn), matmulnbits_weights(ort_rtn)
    methods = {"dyndq rtn (= ORT RTN)": theirs_rtn, "dyndq search": dyndq_weights(ours_search)}
    if hqq:
        methods["ORT HQQ"] = matmulnbits_weights(ort_hqq)
    totals = {label: ErrorStats() for label in methods}
    same = True
    groups, picks = sample_groups(model, names, args.sample_groups, seed=1)
    hqq_sample = np.zeros(groups.shape)
    for name in names:
        w = nh.to_array(inits[name])
        ours = ours_rtn_w[name]()
        for label, weights in methods.items():
            dq = weights[name]()
            same &= label != "dyndq rtn (= ORT RTN)" or bool(np.array_equal(ours, dq))
            totals[label].add(w.ravel(), dq.ravel())
            if label == "ORT HQQ":
                for i, (pick, r, c) in enumerate(picks):
                    if pick == name:
                        hqq_sample[i, 0] = dq[r:r + GROUP, c]
        del w, ours, dq
    print(f"\ndyndq rtn gives ONNX Runtime's RTN weights, value for value: {'yes' if same else 'NO'} ({len(names)} MatMul weights)")
    print("\nreconstruction error over the MatMul weights (relative Frobenius, max abs, cosine):")
    base = totals["dyndq rtn (= ORT RTN)"].relative
    for label, st in totals.items():
        print(f"  {label:24s} {st.relative:.5f} ({st.relative / base:.4f}x RTN)  max abs {st.max_abs:.4g}  cosine {st.cosine:.6f}")

    kw = dict(bits=4, symmetric=False)
    e_rtn = squared_error(groups, rtn(groups, scale_dtype=np.float32, **kw)).sum()
    e_search = squared_error(groups, search(groups, scale_dtype=np.float32, **kw)).sum()
    t0 = time.perf_counter()
    e_bound = exhaustive(groups, scales=args.scales, **kw).sum()
    t_bound = time.perf_counter() - t0
    line = (f"\nthe bound on {args.sample_groups} sampled groups (exhaustive: 16 zero points x {args.scales} scales each, "
            f"least squares; {t_bound:.0f} s): {np.sqrt(e_bound / e_rtn):.4f}x RTN's error; "
            f"dyndq search {np.sqrt(e_search / e_rtn):.4f}x ({np.sqrt(e_search / e_bound):.4f}x the bound)")
    if hqq:
        e_hqq = float(((groups.astype(np.float64) - hqq_sample) ** 2).sum())
        line += f"; ORT HQQ {np.sqrt(e_hqq / e_rtn):.4f}x ({np.sqrt(e_hqq / e_bound):.4f}x the bound)"
    print(line)
    del methods, theirs_rtn, ours_rtn_w

    print(f"  ({memory()})")
    # 5. the output error: logits on seeded token ids (one ONNX Runtime session at a time)
    from dyndq.runner import clear_cache

    ids = np.random.default_rng(2).integers(0, args.vocab, size=(1, 16), dtype=np.int64)
    want = ort_session(model).run(None, {"ids": ids})[0]
    models = {"dyndq rtn": ours_rtn, "dyndq search": ours_search, "dyndq search, MatMul only": ours_matmul,
              "ORT RTN": ort_rtn}
    if hqq:
        models["ORT HQQ (MatMul only)"] = ort_hqq
    print("\noutput error (logits, 16 seeded token ids, ONNX Runtime, basic optimizations):")
    for label in list(models):
        m = models[label]
        if label.startswith("dyndq"):
            got = dyndq.run(m, {"ids": ids}, engine="onnxruntime")["logits"]
            clear_cache()
        else:
            got = ort_session(m).run(None, {"ids": ids})[0]
        st = compare(want, got)
        print(f"  {label:26s} rel. {st.relative:.5f}  max abs {st.max_abs:.4g}  cosine {st.cosine:.6f}")
        if label != "dyndq search":
            del models[label]  # (each model once measured, but the one step 6 runs)
        del m, got
    ours_rtn = ours_matmul = ort_rtn = ort_hqq = None
    del models

    print(f"  ({memory()})")
    # 6. runs on both engines
    few = ids[:, :4]
    on_ort = dyndq.run(ours_search, {"ids": few}, engine="onnxruntime")["logits"]
    t0 = time.perf_counter()
    on_ref = dyndq.run(ours_search, {"ids": few}, engine="reference")["logits"]
    clear_cache()
    st = compare(on_ort, on_ref)
    print(f"\nthe quantized model (search) on the reference engine ({time.perf_counter() - t0:.1f} s) and on ONNX Runtime: "
          f"rel. difference {st.relative:.2e} (float MatMuls summed in each engine's order)")
    del ours_rtn, ours_search, ours_matmul, ort_rtn, ort_hqq

    print(f"  ({memory()})")
    # 7. the low-bit formats: 2 bits (rtn, search, ONNX Runtime's 2-bit RTN), MXFP4, NVFP4
    if not args.no_low_bit:
        low_bit(model, matmuls, floats, args.repeat, args.slow_rounds, hqq)
        print(f"  ({memory()})")
    # 8. mixed widths under a budget, at uniform 4-bit search's bits per weight
    if not args.no_mixed:
        mixed_widths(model, matmuls, floats, args.repeat, "the model " + ("with outlier input channels in " +
                     " and ".join(OUTLIER_LAYERS) if args.outliers else "as is (Student-t weights everywhere)"))
        print(f"  ({memory()})")
    # 9. the external-data path, each in a fresh process
    if not args.no_files:
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "float.onnx")
            save_model(model, src, external_data=True)
            largest = max(int(np.prod(t.dims)) * 4 for t in model.graph.initializer)
            del model, inits
            base_s, base_rss = in_child("import dyndq.quantization, onnxruntime.quantization.matmul_nbits_quantizer")
            t_ours, rss_ours = in_child(f"from dyndq.cli import main; assert main(['quantize', {src!r}, "
                                        f"{os.path.join(d, 'q.onnx')!r}, '--no-evaluate']) == 0")
            t_theirs, rss_theirs = in_child(
                "from onnxruntime.quantization import matmul_nbits_quantizer as q\n"
                f"m = q.MatMulNBitsQuantizer({src!r}, block_size={GROUP}, bits=4, op_types_to_quantize=('MatMul', 'Gather'))\n"
                f"m.process(); m.model.save_model_to_file({os.path.join(d, 'ort.onnx')!r}, use_external_data_format=True)")
            float_size = files_size(d, "float.onnx")
            print(f"\nfrom the model saved with external data ({float_size / 2**30:.2f} GiB; largest weight "
                  f"{largest / 2**20:.0f} MiB; a fresh Python with both quantizers imported: {base_rss / 2**20:.0f} MiB):")
            print(f"  dyndq quantize (rtn)  {t_ours:6.1f} s  peak {rss_ours / 2**20:6.0f} MiB "
                  f"(= imports + {(rss_ours - base_rss) / largest:.2f}x the largest weight)  "
                  f"files {files_size(d, 'q.onnx') / float_size:.3f}x")
            print(f"  ORT quantizer (RTN)   {t_theirs:6.1f} s  peak {rss_theirs / 2**20:6.0f} MiB "
                  f"(= imports + {(rss_theirs - base_rss) / largest:.2f}x the largest weight)  "
                  f"files {files_size(d, 'ort.onnx') / float_size:.3f}x")
    print(f"\nthis benchmark's own {memory()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
