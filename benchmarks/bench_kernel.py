"""Our kernel (compiled, or NumPy with --kernel numpy) against ONNX Runtime's DequantizeLinear, side by side, in one run.

    python benchmarks/bench_kernel.py            # 4096x4096, 9 repetitions (what `make bench` runs)
    python benchmarks/bench_kernel.py --size 512 --reps 3 --no-reference   # a quick look

Version 1's forms: 12 cases on size x size (uint8/int8 src x per_tensor / per_channel
axis 0 / per_channel axis -1 x with/without zps; one with int32 zps) and 2 on a 3-D
tensor per channel along its middle axis with zps (uint8, int32).  Version 2's forms:
int4 and uint4 src per_group, groups of 32 and 128 along the last axis and along axis 0,
float32 / float16 / bfloat16 scales, with and without zps (of src's dtype).

For each case it times, on the same arrays and interleaved (one call of each contender
per round), after a warm-up whose results are dropped:

  out=      our kernel writing into a preallocated output
  alloc     our kernel allocating its output (the previous result dropped)
  ORT       ONNX Runtime's DequantizeLinear-21 (blocked for per_group; default threads);
            none for bfloat16 scales, which ONNX Runtime has no kernel for
  onnx-ref  onnx.reference.ReferenceEvaluator (version 1's forms only)
  naive     (src.astype(np.float32) - zp) * scale (version 1's forms only)
  floor     a write of every byte of the output (in its own dtype's width, no
            arithmetic) plus a read of every byte of src, blocked and threaded like
            our kernel: what memory costs

and prints medians (ms), ratios, tracemalloc peaks of our calls, the tiny-tensor (1x64)
call cost, and each target as met or missed with its figure.  Every timed output is
checked bit for bit against our NumPy kernel's first.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import sys
import time
import tracemalloc

import ml_dtypes
import numpy as np

try:
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
except ImportError:  # pragma: no cover
    sys.exit("bench_kernel needs onnx")
try:
    import onnxruntime as ort
except ImportError:  # pragma: no cover
    sys.exit("bench_kernel needs onnxruntime")

import dyndq
from dyndq.kernels import buffers, native, parallel
from dyndq.opdefs import dtypes

F32 = np.float32


def elem(dtype) -> int:
    return dtypes.of(np.dtype(dtype)).onnx


# -- cases ---------------------------------------------------------------------------------------


def make_cases(n: int, seed: int = 0):
    """Version 1's forms."""
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
                cases.append(dict(label=label, src=src, scales=scales, zps=zps, qtype=qtype, axis=axis, group_shape=None))
    # per channel along an inner axis of a 3-D tensor of the same size
    shape = (n // 64, 64, n) if n >= 64 else (1, n, n)
    src = rng.integers(0, 256, shape, dtype=np.uint8)
    scales = (rng.random(shape[1], dtype=F32) * 0.05 + 0.001).astype(F32)
    for zp_dtype in ("uint8", "int32"):
        zps = rng.integers(100, 150, shape[1]).astype(zp_dtype)
        cases.append(dict(label=f"uint8 pc axis  1 of 3-D zp {zp_dtype}", src=src, scales=scales, zps=zps,
                          qtype="per_channel", axis=1, group_shape=None))
    return cases


def make_cases_2(n: int, seed: int = 1):
    """Version 2's forms: int4/uint4 per_group, float32/float16/bfloat16 scales."""
    rng = np.random.default_rng(seed)
    cases = []
    for src_dtype in ("uint4", "int4"):
        lo, hi = dtypes.integer_range(src_dtype)
        src = rng.integers(lo, hi, (n, n), endpoint=True).astype(np.dtype(src_dtype))
        for g in (32, 128):
            g = min(g, n)
            for where, groups in (("last", [1, g]), ("axis 0", [g, 1])):
                pshape = (n // groups[0], n // groups[1])
                for t2 in ("float32", "float16", "bfloat16"):
                    scales = (rng.random(pshape, dtype=F32) * 0.05 + 0.001).astype(np.dtype(t2))
                    for with_zps in (False, True):
                        zps = rng.integers(lo, hi, pshape, endpoint=True).astype(np.dtype(src_dtype)) if with_zps else None
                        label = f"{src_dtype} g{g:<3} {where:<6} {t2:<8} {'zp' if with_zps else 'no zp'}"
                        cases.append(dict(label=label, src=src, scales=scales, zps=zps, qtype="per_group", axis=1,
                                          group_shape=groups))
    return cases


def expected(case):
    """What every contender must give, bit for bit: the op as our NumPy kernel computes it (the
    tests hold both our kernels to their independent oracle; here it checks the others, and the
    compiled kernel against the NumPy one)."""
    src, scales, zps, qtype, axis, groups = (case[k] for k in ("src", "scales", "zps", "qtype", "axis", "group_shape"))
    with parallel.tuned(native=False):
        return dyndq.dynamic_dequantize(src, scales, zps, qtype=qtype, axis=axis, group_shape=groups)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    width = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    return np.array_equal(a.view(width), b.view(width))


# -- ONNX Runtime: DequantizeLinear-21 -----------------------------------------------------------------


def has_ort_kernel(case) -> bool:
    return case["scales"].dtype.name != "bfloat16"  # ONNX Runtime has no bfloat16 DequantizeLinear


def dql_model(case, opset=21):
    """DequantizeLinear with x, scale and zero point as graph inputs (fed the same arrays)."""
    src, scales, zps = case["src"], case["scales"], case["zps"]
    qtype = case["qtype"]
    pshape = [] if qtype == "per_tensor" else list(scales.shape)
    inputs = [helper.make_tensor_value_info("x", elem(src.dtype), list(src.shape)),
              helper.make_tensor_value_info("s", elem(scales.dtype), pshape)]
    names = ["x", "s"]
    if zps is not None:
        inputs.append(helper.make_tensor_value_info("z", elem(src.dtype), pshape))
        names.append("z")
    attrs = {}
    if qtype == "per_channel":
        attrs = {"axis": case["axis"]}
    elif qtype == "per_group":
        axis = 0 if case["group_shape"][0] > 1 else 1
        attrs = {"axis": axis, "block_size": case["group_shape"][axis]}
    node = helper.make_node("DequantizeLinear", names, ["y"], **attrs)
    out = helper.make_tensor_value_info("y", elem(scales.dtype), list(src.shape))
    graph = helper.make_graph([node], "dql", inputs, [out])
    imports = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=imports, ir_version=helper.find_min_ir_version_for(imports))


def int4_ortvalue(a: np.ndarray):
    """An int4/uint4 OrtValue of a's shape. ONNX Runtime's Python API refuses ml_dtypes int4
    arrays, and ortvalue_from_numpy_with_onnx_type(a.view(np.uint8), INT4) reads the bytes as
    packed (two elements a byte): so the packed bytes go at the front of a buffer of a's shape."""
    nibbles = a.view(np.uint8).reshape(-1) & 0x0F
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    buf = np.zeros(a.shape, np.uint8)
    buf.reshape(-1)[: nibbles.size // 2] = nibbles[0::2] | (nibbles[1::2] << 4)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(buf, elem(a.dtype))


def dql_feeds(case):
    src, scales, zps = case["src"], case["scales"], case["zps"]
    per_tensor = case["qtype"] == "per_tensor"
    int4 = src.dtype.name in ("int4", "uint4")
    feeds = {"x": int4_ortvalue(src) if int4 else src, "s": scales.reshape(()) if per_tensor else scales}
    if zps is not None:
        z = zps.astype(src.dtype)  # ORT needs the zero point in x's type; the values fit
        z = z.reshape(()) if per_tensor else z
        feeds["z"] = int4_ortvalue(z) if int4 else z
    return feeds


# -- the floor ---------------------------------------------------------------------------------------


def floor_fn(src, out, threads=None):
    """Write every byte of out (as unsigned integers of its width: no cast, no arithmetic)
    and read every byte of src, in our kernel's blocks, on our kernel's threads: what
    memory costs before any arithmetic."""
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[out.dtype.itemsize]
    flat_out = out.reshape(-1).view(width)
    raw = src.reshape(-1).view(np.uint8)
    flat_src = raw.view(np.uint64) if raw.size % 8 == 0 else raw
    n_out = flat_out.size
    blocks = parallel.blocks((n_out,), parallel.TUNING.chunk)
    ratio = flat_src.size / n_out

    def run(group):
        acc = 0
        for (sl,) in group:
            flat_out[sl].fill(1)
            a, b = int(sl.start * ratio), int(min(sl.stop, n_out) * ratio)
            acc ^= int(np.bitwise_or.reduce(flat_src[a:b])) if b > a else 0
        return acc

    parallel.run(lambda a, b: run(blocks[a:b]), len(blocks), parallel.threads_for(n_out, len(blocks), threads))
    return out


# -- timing ------------------------------------------------------------------------------------------


def median_ms(samples):
    return statistics.median(samples) * 1e3


def geomean(xs):
    xs = [x for x in xs if x > 0 and x == x]
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
    return (f"{model}, {parallel.cores()} cores available (os.cpu_count() {os.cpu_count()}), "
            f"Python {platform.python_version()}, NumPy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, "
            f"onnxruntime {ort.__version__}, onnx {onnx.__version__}")


def tiny_costs(reps: int = 7, loops: int = 300):
    """Per-call cost on a 1x64 tensor: our kernel vs InferenceSession.run."""
    rng = np.random.default_rng(1)
    case = dict(src=rng.integers(0, 256, (1, 64), dtype=np.uint8), scales=np.array([0.02], F32),
                zps=np.array([128], np.uint8), qtype="per_tensor", axis=1, group_shape=None)
    sess = ort.InferenceSession(dql_model(case).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = dql_feeds(case)
    src, scales, zps = case["src"], case["scales"], case["zps"]
    out = np.empty(src.shape, F32)
    expect = expected(case)
    assert same_bits(dyndq.dynamic_dequantize(src, scales, zps), expect)
    assert same_bits(sess.run(None, feeds)[0], expect)

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


def measure(case, reps, threads, with_reference, with_naive):
    """Medians (ms) of every contender on one case, and the tracemalloc peaks of our calls;
    None when a contender's output differs from the NumPy kernel's."""
    src, scales, zps = case["src"], case["scales"], case["zps"]
    attrs = {"qtype": case["qtype"], "axis": case["axis"]}
    if case["group_shape"] is not None:
        attrs["group_shape"] = case["group_shape"]
    t2 = np.dtype(scales.dtype.name)
    out = np.empty(src.shape, t2)
    floor_out = np.empty(src.shape, t2)
    contenders = {
        "out=": lambda: dyndq.dynamic_dequantize(src, scales, zps, out=out, threads=threads, **attrs),
        "alloc": lambda: dyndq.dynamic_dequantize(src, scales, zps, threads=threads, **attrs),
    }
    if has_ort_kernel(case):
        sess = ort.InferenceSession(dql_model(case).SerializeToString(), providers=["CPUExecutionProvider"])
        feeds = dql_feeds(case)
        contenders["ORT"] = lambda: sess.run(None, feeds)[0]
    if with_naive:
        shape = [1] * src.ndim
        if case["qtype"] == "per_channel":
            shape[case["axis"]] = -1
        s = scales.reshape(shape)
        # the zero points as float32 (exact here), or NumPy would promote int32 - float32 to float64
        z = None if zps is None else zps.reshape(shape).astype(F32)
        contenders["naive"] = (lambda: src.astype(F32) * s) if z is None else (lambda: (src.astype(F32) - z) * s)
    if with_reference:
        ref = ReferenceEvaluator(dql_model(case))
        ref_feeds = dql_feeds(case)
        contenders["onnx-ref"] = lambda: ref.run(None, ref_feeds)[0]
    contenders["floor"] = lambda: floor_fn(src, floor_out, threads)

    expect = expected(case)
    for name, fn in contenders.items():
        got = fn()  # also the warm-up
        if name != "floor" and not same_bits(got, expect):
            print(f"FAILED: {name} differs from the NumPy kernel on {case['label']}", file=sys.stderr)
            return None
        del got
    del expect
    samples = {k: [] for k in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            t = time.perf_counter()
            r = fn()
            samples[name].append(time.perf_counter() - t)
            del r
    med = {k: median_ms(v) for k, v in samples.items()}
    mem_out = peak_extra_bytes(contenders["out="])
    mem_alloc = peak_extra_bytes(contenders["alloc"])
    return med, mem_out, mem_alloc


def table(rows, cols, extra_head, extra_fmt):
    width = max(len(label) for label, *_ in rows)
    head = f"| {'case':<{width}} | " + " | ".join(f"{c:>8}" for c in cols) + " | " + " | ".join(extra_head) + " |"
    print(head)
    print("|" + "|".join("-" * len(p) for p in head.split("|")[1:-1]) + "|")
    for label, med, *rest in rows:
        cells = " | ".join(f"{med[c]:8.2f}" if c in med else f"{'-':>8}" for c in cols)
        print(f"| {label:<{width}} | {cells} | " + " | ".join(extra_fmt(label, med, *rest)) + " |")


def ratio(med, a, b):
    return med[a] / med[b] if a in med and b in med else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="src is size x size (default 4096)")
    ap.add_argument("--reps", type=int, default=9, help="timed repetitions per contender (default 9)")
    ap.add_argument("--threads", type=int, default=None, help="cap our kernel's threads (default: every core)")
    ap.add_argument("--no-reference", action="store_true", help="leave out onnx.reference (slow)")
    ap.add_argument("--no-tiny", action="store_true", help="leave out the 1x64 call-cost measurement")
    ap.add_argument("--no-v2", action="store_true", help="leave out version 2's forms")
    ap.add_argument("--kernel", choices=["compiled", "numpy"], default=None,
                    help="which of our kernels (default: the compiled one where it was built)")
    ap.add_argument("--level", type=int, choices=[0, 1, 2], default=None,
                    help="run the compiled kernel at a lower level than this CPU's: 1 as on a CPU with AVX2 "
                         "but no AVX-512, 0 as without AVX2 (as far as this CPU can stand in for one)")
    args = ap.parse_args(argv)
    n, reps, threads = args.size, args.reps, args.threads
    if args.kernel == "compiled" and not native.built():
        print("the compiled kernel was not built (kernels/_native.c: is there a C compiler?)")
        return 1
    kernel = args.kernel or ("compiled" if native.built() and parallel.TUNING.native else "numpy")
    if args.level is not None and (kernel != "compiled" or args.level > native.cpu_level()):
        print(f"--level {args.level}: needs the compiled kernel and a CPU of that level or above "
              f"(this one: {native.cpu_level() if native.built() else 'none built'})")
        return 1
    with parallel.tuned(native=kernel == "compiled"), \
            (native.at_level(args.level) if args.level is not None else contextlib.nullcontext()):
        return _run(args, n, reps, threads, kernel)


def _run(args, n, reps, threads, kernel) -> int:
    # the variant the C side's table really calls at this level (kernels/_native.c)
    level = f" at level {native.level()} ({native.info()['entries']['dequantize']} variant)" if kernel == "compiled" else ""
    print(f"machine: {machine()}")
    print(f"src {n}x{n}, medians of {reps} interleaved repetitions after a warm-up; "
          f"our {kernel} kernel{level} on {parallel.threads_for(n * n, 10**9, threads)} thread(s); "
          f"buffer pool {'off' if parallel.switched_off(buffers.POOL_ENV) else 'on'}\n")

    rows = []
    for case in make_cases(n):
        m = measure(case, reps, threads, not args.no_reference, True)
        if m is None:
            return 1
        rows.append((case["label"], *m))
    rows2 = []
    if not args.no_v2:
        for case in make_cases_2(n):
            m = measure(case, reps, threads, False, False)
            if m is None:
                return 1
            rows2.append((case["label"], *m))

    print("version 1's forms (float32 output), ms:\n")
    cols = ["out=", "alloc", "ORT"] + ([] if args.no_reference else ["onnx-ref"]) + ["naive", "floor"]
    table(rows, cols, ["out=/ORT", "alloc/ORT", "out=/floor", "peak out=", "peak alloc"],
          lambda label, med, mo, ma: [f"{ratio(med, 'out=', 'ORT'):8.2f}", f"{ratio(med, 'alloc', 'ORT'):9.2f}",
                                      f"{ratio(med, 'out=', 'floor'):10.2f}", f"{mo / 2**20:6.3f} MiB",
                                      f"{ma / 2**20:6.2f} MiB"])
    if rows2:
        print("\nversion 2's forms (per_group; output in the scales' dtype; ORT '-': no kernel), ms:\n")
        table(rows2, ["out=", "alloc", "ORT", "floor"], ["out=/ORT", "alloc/ORT", "out=/floor", "peak out="],
              lambda label, med, mo, ma: [f"{ratio(med, 'out=', 'ORT'):8.2f}", f"{ratio(med, 'alloc', 'ORT'):9.2f}",
                                          f"{ratio(med, 'out=', 'floor'):10.2f}", f"{mo / 2**20:6.3f} MiB"])

    every = rows + rows2
    out_ort = [ratio(r[1], "out=", "ORT") for r in every if "ORT" in r[1]]
    alloc_ort = [ratio(r[1], "alloc", "ORT") for r in every if "ORT" in r[1]]
    out_floor = [ratio(r[1], "out=", "floor") for r in rows]
    pc_zp = [(r[0], ratio(r[1], "out=", "floor")) for r in rows if " pc " in r[0] and "no zp" not in r[0]]
    v2_floor = [(r[0], ratio(r[1], "out=", "floor")) for r in rows2]
    print(f"\ngeometric means: out=/ORT {geomean(out_ort):.2f}, alloc/ORT {geomean(alloc_ort):.2f}, "
          f"out=/floor (version 1) {geomean(out_floor):.2f}"
          + (f", out=/floor (version 2) {geomean([x for _, x in v2_floor]):.2f}" if v2_floor else ""))

    tiny = {"ours": float("nan"), "ours out=": float("nan"), "ORT": float("nan")} if args.no_tiny else tiny_costs()
    print(f"tiny 1x64 per call: ours {tiny['ours']:.1f} us, ours out= {tiny['ours out=']:.1f} us, "
          f"ORT run {tiny['ORT']:.1f} us, ratio ours/ORT {tiny['ours'] / tiny['ORT']:.2f}")

    def worst(pairs):
        label, x = max(pairs, key=lambda p: p[1])
        return x, f"worst {x:.2f}x ({label.strip()})"

    def worst_of(values, rows_):
        labels = [r[0] for r in rows_ if "ORT" in r[1]]
        return worst(list(zip(labels, values)))

    out_bytes = n * n * 4
    peak_out = max(r[2] for r in rows)
    peak_alloc = max(r[3] for r in rows)
    targets = [
        ("out= <= 1.0x ORT in every case", *worst_of(out_ort, every)),
        ("alloc <= 1.0x ORT in every case (after a warm-up call whose result is dropped)", *worst_of(alloc_ort, every)),
        ("out= <= 1.3x floor, geometric mean of version 1's forms", geomean(out_floor), f"{geomean(out_floor):.2f}x"),
        ("per-channel with zero points <= 1.2x floor in every case", *worst(pc_zp)),
    ]
    if v2_floor:
        targets.append(("version 2's forms <= 1.5x floor in every case", *worst(v2_floor)))
    limits = [1.0, 1.0, 1.3, 1.2] + ([1.5] if v2_floor else [])
    if not args.no_tiny:
        targets.append(("tiny 1x64 call <= 0.5x ORT run", tiny["ours"] / tiny["ORT"], f"{tiny['ours'] / tiny['ORT']:.2f}x"))
        limits.append(0.5)
    targets += [
        ("peak extra memory, out= call < 1 MiB", peak_out / 2**20, f"{peak_out / 2**20:.3f} MiB"),
        ("peak extra memory, allocating call <= the output (+64 KiB of Python objects)",
         (peak_alloc - 2**16) / out_bytes, f"{peak_alloc / 2**20:.3f} MiB for a {out_bytes / 2**20:.1f} MiB output"),
    ]
    limits += [1.0, 1.0]
    print("\ntargets:")
    for (name, value, text), limit in zip(targets, limits):
        ok = value <= limit
        print(f"  [{'met' if ok else 'MISSED'}] {name}: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
