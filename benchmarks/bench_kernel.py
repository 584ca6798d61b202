"""Our NumPy kernel against ONNX Runtime's DequantizeLinear, side by side, in one run.

    python benchmarks/bench_kernel.py            # 4096x4096, 9 repetitions (what `make bench` runs)
    python benchmarks/bench_kernel.py --size 512 --reps 3 --no-reference   # a quick look

For each of 12 cases (uint8/int8 src x per_tensor / per_channel axis 0 /
per_channel axis -1 x with/without zps; one case with int32 zps) it times, on
the same arrays and interleaved (one call of each contender per round):

  out=      our kernel writing into a preallocated output
  alloc     our kernel allocating its output
  ORT       ONNX Runtime's DequantizeLinear (opset 21 model, default threads, InferenceSession.run)
  onnx-ref  onnx.reference.ReferenceEvaluator (ONNX's own DequantizeLinear)
  naive     (src.astype(np.float32) - zp) * scale
  floor     a cast-free write of the float32 output plus a read of the input,
            blocked and threaded exactly like our kernel

and prints medians (ms) after a warm-up, ratios, tracemalloc peaks of our
calls, the tiny-tensor (1x64) call cost, and whether each target is met.
Every timed output is checked against the oracle (np.array_equal) first.
"""
from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
import tracemalloc

import numpy as np

try:
    import onnx
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator
except ImportError:  # pragma: no cover
    sys.exit("bench_kernel needs onnx")
try:
    import onnxruntime as ort
except ImportError:  # pragma: no cover
    sys.exit("bench_kernel needs onnxruntime")

import dyndq
from dyndq.kernels import parallel

F32 = np.float32
ELEM = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}


# -- cases ---------------------------------------------------------------------------------------


def make_cases(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    cases = []
    for src_dtype in ("uint8", "int8"):
        info = np.iinfo(src_dtype)
        src = rng.integers(info.min, info.max, (n, n), dtype=src_dtype, endpoint=True)
        for qtype, axis in (("per_tensor", 1), ("per_channel", 0), ("per_channel", -1)):
            C = 1 if qtype == "per_tensor" else n
            scales = (rng.random(C, dtype=F32) * 0.05 + 0.001).astype(F32)
            for with_zps in (False, True):
                zps = None
                zp_dtype = src_dtype
                if with_zps:
                    # the one int32 case: values that fit int8, so ORT can take them as int8
                    if src_dtype == "int8" and qtype == "per_channel" and axis == 0:
                        zp_dtype = "int32"
                    zps = rng.integers(-20 if src_dtype == "int8" else 100, 20 if src_dtype == "int8" else 150, C).astype(zp_dtype)
                label = f"{src_dtype} {'pt' if qtype == 'per_tensor' else f'pc axis {axis:>2}'} {('zp ' + zp_dtype) if with_zps else 'no zp'}"
                cases.append(dict(label=label, src=src, scales=scales, zps=zps, qtype=qtype, axis=axis))
    return cases


def oracle(src, scales, zps, qtype, axis):
    shape = [1] * src.ndim
    if qtype == "per_channel":
        shape[axis] = -1
    s = scales.reshape(shape) if qtype == "per_channel" else scales.reshape(())
    z = 0 if zps is None else (zps.astype(np.int64).reshape(shape) if qtype == "per_channel" else np.int64(zps.reshape(())[()]))
    return (src.astype(np.int64) - z).astype(F32) * s


def dql_model(case, opset=21):
    """DequantizeLinear-21 with x, scale and zero point as graph inputs (fed the same arrays)."""
    src = case["src"]
    per_tensor = case["qtype"] == "per_tensor"
    pshape = [] if per_tensor else [src.shape[case["axis"]]]
    inputs = [
        helper.make_tensor_value_info("x", ELEM[src.dtype.name], list(src.shape)),
        helper.make_tensor_value_info("s", TensorProto.FLOAT, pshape),
    ]
    names = ["x", "s"]
    if case["zps"] is not None:
        inputs.append(helper.make_tensor_value_info("z", ELEM[src.dtype.name], pshape))
        names.append("z")
    attrs = {} if per_tensor else {"axis": case["axis"]}
    node = helper.make_node("DequantizeLinear", names, ["y"], **attrs)
    graph = helper.make_graph([node], "dql", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(src.shape))])
    imports = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=imports, ir_version=helper.find_min_ir_version_for(imports))


def dql_feeds(case):
    per_tensor = case["qtype"] == "per_tensor"
    feeds = {"x": case["src"], "s": case["scales"].reshape(()) if per_tensor else case["scales"]}
    if case["zps"] is not None:
        z = case["zps"].astype(case["src"].dtype)  # ORT needs the zero point in x's type; the values fit
        feeds["z"] = z.reshape(()) if per_tensor else z
    return feeds


# -- the floor ---------------------------------------------------------------------------------------


def floor_fn(src, out, threads=None):
    """Write every float32 of out (no cast) and read every byte of src, in our kernel's
    blocks, on our kernel's threads: what memory costs before any arithmetic."""
    flat_out = out.reshape(-1)
    flat_src = src.reshape(-1).view(np.uint64) if src.size % 8 == 0 else src.reshape(-1)
    n_out = flat_out.size
    blocks = parallel.blocks((n_out,), parallel.TUNING.chunk)
    ratio = flat_src.size / n_out

    def run(group):
        acc = 0
        for (sl,) in group:
            flat_out[sl].fill(1.0)
            a, b = int(sl.start * ratio), int(min(sl.stop, n_out) * ratio)
            acc ^= int(np.bitwise_or.reduce(flat_src[a:b])) if b > a else 0
        return acc

    parallel.run(lambda a, b: run(blocks[a:b]), len(blocks), parallel.threads_for(n_out, len(blocks), threads))
    return out


# -- timing ------------------------------------------------------------------------------------------


def median_ms(samples):
    return statistics.median(samples) * 1e3


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def peak_extra_bytes(fn):
    """tracemalloc's peak of the memory allocated during fn() beyond what existed before."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return peak - base


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {parallel.cores()} cores available, Python {platform.python_version()}, NumPy {np.__version__}, " \
           f"onnxruntime {ort.__version__}, onnx {onnx.__version__}"


def tiny_costs(reps: int = 7, loops: int = 300):
    """Per-call cost on a 1x64 tensor: our kernel vs InferenceSession.run."""
    rng = np.random.default_rng(1)
    case = dict(src=rng.integers(0, 256, (1, 64), dtype=np.uint8), scales=np.array([0.02], F32),
                zps=np.array([128], np.uint8), qtype="per_tensor", axis=1)
    sess = ort.InferenceSession(dql_model(case).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = dql_feeds(case)
    src, scales, zps = case["src"], case["scales"], case["zps"]
    out = np.empty(src.shape, F32)
    expect = oracle(src, scales, zps, "per_tensor", 1)
    assert np.array_equal(dyndq.dynamic_dequantize(src, scales, zps), expect)
    assert np.array_equal(sess.run(None, feeds)[0], expect)

    def ours():
        dyndq.dynamic_dequantize(src, scales, zps)

    def ours_out():
        dyndq.dynamic_dequantize(src, scales, zps, out=out)

    def theirs():
        sess.run(None, feeds)

    fns = {"ours": ours, "ours out=": ours_out, "ORT": theirs}
    samples = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(loops):
            f()
    for _ in range(reps):
        for k, f in fns.items():
            t = time.perf_counter()
            for _ in range(loops):
                f()
            samples[k].append((time.perf_counter() - t) / loops)
    return {k: statistics.median(v) * 1e6 for k, v in samples.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="src is size x size (default 4096)")
    ap.add_argument("--reps", type=int, default=9, help="timed repetitions per contender (default 9, at least 7 for the report)")
    ap.add_argument("--threads", type=int, default=None, help="cap our kernel's threads (default: every core)")
    ap.add_argument("--no-reference", action="store_true", help="leave out onnx.reference (slow)")
    ap.add_argument("--no-tiny", action="store_true", help="leave out the 1x64 call-cost measurement")
    args = ap.parse_args(argv)
    n, reps, threads = args.size, args.reps, args.threads

    print(f"machine: {machine()}")
    print(f"src {n}x{n}, medians of {reps} interleaved repetitions after a warm-up; "
          f"our kernel on {parallel.threads_for(n * n, 10**9, threads)} thread(s)\n")

    cases = make_cases(n)
    rows = []
    for case in cases:
        src, scales, zps, qtype, axis = case["src"], case["scales"], case["zps"], case["qtype"], case["axis"]
        out = np.empty(src.shape, F32)
        floor_out = np.empty(src.shape, F32)
        sess = ort.InferenceSession(dql_model(case).SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = dql_feeds(case)
        shape = [1] * src.ndim
        if qtype == "per_channel":
            shape[axis] = -1
        naive_s = scales.reshape(shape) if qtype == "per_channel" else scales.reshape(())
        # the zero points as float32 (exact here), or NumPy would promote int32 - float32 to float64
        naive_z = None if zps is None else (zps.reshape(shape) if qtype == "per_channel" else zps.reshape(())).astype(F32)

        contenders = {
            "out=": lambda: dyndq.dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis, out=out, threads=threads),
            "alloc": lambda: dyndq.dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis, threads=threads),
            "ORT": lambda: sess.run(None, feeds)[0],
            "naive": (lambda: src.astype(F32) * naive_s) if zps is None else (lambda: (src.astype(F32) - naive_z) * naive_s),
        }
        if not args.no_reference:
            ref = ReferenceEvaluator(dql_model(case))
            contenders["onnx-ref"] = lambda: ref.run(None, feeds)[0]
        contenders["floor"] = lambda: floor_fn(src, floor_out, threads)

        # check every output against the oracle before any timing is reported
        expect = oracle(src, scales, zps, qtype, axis)
        for name, fn in contenders.items():
            if name == "floor":
                fn()
                continue
            got = fn()
            if not np.array_equal(got, expect):
                print(f"FAILED: {name} differs from the oracle on {case['label']}", file=sys.stderr)
                return 1
        del expect, got

        samples = {k: [] for k in contenders}
        for _ in range(reps):
            for name, fn in contenders.items():
                t = time.perf_counter()
                r = fn()
                samples[name].append(time.perf_counter() - t)
                del r
        med = {k: median_ms(v) for k, v in samples.items()}
        mem_out = peak_extra_bytes(lambda: dyndq.dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis, out=out, threads=threads))
        mem_alloc = peak_extra_bytes(lambda: dyndq.dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis, threads=threads))
        rows.append((case["label"], med, mem_out, mem_alloc))

    cols = ["out=", "alloc", "ORT"] + ([] if args.no_reference else ["onnx-ref"]) + ["naive", "floor"]
    width = max(len(label) for label, *_ in rows)
    head = f"| {'case':<{width}} | " + " | ".join(f"{c:>8}" for c in cols) + " | out=/ORT | alloc/ORT | out=/floor | peak out= | peak alloc |"
    print(head)
    print("|" + "|".join("-" * (len(p)) for p in head.split("|")[1:-1]) + "|")
    out_ort, alloc_ort, out_floor = [], [], []
    out_bytes = n * n * 4
    for label, med, mem_out, mem_alloc in rows:
        r1, r2, r3 = med["out="] / med["ORT"], med["alloc"] / med["ORT"], med["out="] / med["floor"]
        out_ort.append(r1)
        alloc_ort.append(r2)
        out_floor.append(r3)
        print(f"| {label:<{width}} | " + " | ".join(f"{med[c]:8.2f}" for c in cols)
              + f" | {r1:8.2f} | {r2:9.2f} | {r3:10.2f} | {mem_out / 2**20:6.3f} MiB | {mem_alloc / 2**20:6.2f} MiB |")
    g1, g2, g3 = geomean(out_ort), geomean(alloc_ort), geomean(out_floor)
    print(f"\ngeometric means: out=/ORT {g1:.2f}, alloc/ORT {g2:.2f}, out=/floor {g3:.2f}; "
          f"max out=/ORT {max(out_ort):.2f}")

    tiny = {"ours": float("nan"), "ours out=": float("nan"), "ORT": float("nan")} if args.no_tiny else tiny_costs()
    print(f"tiny 1x64 per call: ours {tiny['ours']:.1f} us, ours out= {tiny['ours out=']:.1f} us, "
          f"ORT run {tiny['ORT']:.1f} us, ratio ours/ORT {tiny['ours'] / tiny['ORT']:.2f}")

    peak_out = max(r[2] for r in rows)
    peak_alloc = max(r[3] for r in rows)
    targets = [
        ("ours out= <= 1.0x ORT in every case", max(out_ort) <= 1.0, f"worst {max(out_ort):.2f}x"),
        ("ours alloc <= 1.0x ORT, geometric mean", g2 <= 1.0, f"{g2:.2f}x"),
        ("ours out= <= 1.5x floor, geometric mean", g3 <= 1.5, f"{g3:.2f}x"),
        ("tiny 1x64 call <= 0.5x ORT run", tiny["ours"] <= 0.5 * tiny["ORT"], f"{tiny['ours'] / tiny['ORT']:.2f}x"),
        ("peak extra memory, out= call < 1 MiB", peak_out < 2**20, f"{peak_out / 2**20:.3f} MiB"),
        # the output itself plus at most 64 KiB of Python objects (views, frames): no temporaries
        ("peak extra memory, allocating call <= the output (+64 KiB of Python objects)", peak_alloc <= out_bytes + 2**16,
         f"{peak_alloc / 2**20:.3f} MiB for a {out_bytes / 2**20:.0f} MiB output "
         f"(+{(peak_alloc - out_bytes) / 2**10:.0f} KiB)"),
    ]
    print("\ntargets:")
    for name, ok, value in targets:
        print(f"  [{'met' if ok else 'MISSED'}] {name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
