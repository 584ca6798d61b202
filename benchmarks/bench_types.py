"""The compiled kernel on every code type of DequantizeLinear-28, against ONNX Runtime and the memory-bound limit.

    python benchmarks/bench_types.py                    # 4096x4096, 9 rounds, 1 thread and the default
    python benchmarks/bench_types.py --size 1024 --reps 3 --types int2,float8_e4m3fn   # a quick look

Cases: each of the 16 code types (int2, uint2, int4, uint4, int8, uint8, int16, uint16,
int32, the four float8, float4_e2m1fn and the two float6; ml_dtypes arrays, one element a
byte below 8 bits), size x size codes with float32 scales per group of 32 along the last axis
(and float8_e8m0fnu scales for float4_e2m1fn, its MX form), no zero points, float32 and
float16 outputs.  Codes are random over the type's values (every byte for float8, with its NaN
codes; the type's own bits for float6 and float4).

For each case it times, on the same arrays and interleaved (one call of each contender per
round), after a warm-up whose results are dropped:

  ours    the compiled kernel (kernels/native.py's dequantize, as the op's kernel calls it)
          writing into a preallocated output
  ORT     ONNX Runtime's DequantizeLinear on the same codes fed as a graph input (blocked,
          block_size 32, axis 1): opset 25 for int2/uint2, 21 for the other float32 outputs,
          25 with output_dtype FLOAT16 for the float16 ones (float32 scales: the same
          arithmetic as ours; opset 21's output is the scales' dtype); "no kernel" where
          ONNX Runtime refuses the model (float4, float6, float8_e8m0fnu scales)
  limit   a plain copy of the same bytes: the codes copied into a byte buffer (np.copyto)
          and the output filled (ndarray.fill), in our kernel's blocks on our kernel's
          threads: the codes read once and the output written once, with no arithmetic

and prints medians (ms) and the ratios ours/ORT and ours/limit, once on 1 thread (ORT's
session on 1 intra-op thread) and once on the default threads (every core, for both), then
each goal as met or missed with its worst case.  Our output is checked bit for bit against a
plain NumPy oracle first, and ORT's compared with it ("ORT bits": same, or how many differ:
its float16 NaNs keep their sign and payload where ours are 0x7E00).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time

import ml_dtypes
import numpy as np

try:
    from onnx import helper
except ImportError:  # pragma: no cover
    sys.exit("bench_types needs onnx")
try:
    import onnxruntime as ort
except ImportError:  # pragma: no cover
    sys.exit("bench_types needs onnxruntime")

from bench_kernel import elem, machine, same_bits  # (beside this script: run as one, its folder is on sys.path)
from dyndq.kernels import native, parallel
from dyndq.kernels.geometry import view
from dyndq.opdefs import dtypes

TYPES = ("int2", "uint2", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32", "float8_e4m3fn",
         "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn")
OUTPUTS = ("float32", "float16")
GROUP = 32
PACKED = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4}  # ONNX Runtime reads these packed
_GOAL_ORT, _GOAL_LIMIT = 1.0, 1.5

# -- cases ---------------------------------------------------------------------------------------


def codes(rng, name: str, shape) -> np.ndarray:
    """Random codes of a type: its values for the integer types, every byte for float8, the
    type's own bits for float6 and float4 (a byte each)."""
    dt = np.dtype(name)
    row = dtypes.by_name(name)
    if row.is_integer:
        lo, hi = dtypes.integer_range(name)
        return rng.integers(lo, hi, shape, endpoint=True).astype(dt)
    b = rng.integers(0, 256, shape, dtype=np.uint8)
    if row.bits < 8:
        b &= np.uint8((1 << row.bits) - 1)
    return b.view(dt)


def make_cases(n: int, types, seed: int = 0):
    rng = np.random.default_rng(seed)
    cases = []
    for name in types:
        src = codes(rng, name, (n, n))
        scale_sets = [("float32", (rng.random((n, n // GROUP), dtype=np.float32) * 0.05 + 0.001))]
        if name == "float4_e2m1fn":  # MX: a power of two per group
            e8 = rng.integers(120, 135, (n, n // GROUP)).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
            scale_sets.append(("float8_e8m0fnu", e8))
        for scale_name, scales in scale_sets:
            for ot in OUTPUTS:
                cases.append(dict(label=f"{name:<15} {scale_name:<14} {ot:<7}", src=src, scales=scales,
                                  dst=np.dtype(ot)))
    return cases


def oracle(src, scales, dst) -> np.ndarray:
    """The op's arithmetic in plain NumPy: the codes' values as float32 (exact for these), times
    the scale in float32, rounded to the output dtype; float16 NaNs 0x7E00."""
    d = src.astype(np.int64).astype(np.float32) if dtypes.of(src.dtype).is_integer else src.astype(np.float32)
    s = np.repeat(scales.astype(np.float32), GROUP, axis=1)
    with np.errstate(all="ignore"):
        out = (d * s).astype(dst)
    if dst == np.float16:
        out.view(np.uint16)[np.isnan(out)] = 0x7E00
    return out


# -- ONNX Runtime --------------------------------------------------------------------------------------


def dql_model(case):
    src, scales, dst = case["src"], case["scales"], case["dst"]
    name = src.dtype.name
    attrs = {"axis": 1, "block_size": GROUP}
    if dst != scales.dtype:
        attrs["output_dtype"] = elem(dst)
    opset = 25 if name in ("int2", "uint2") or "output_dtype" in attrs or scales.dtype != np.float32 else 21
    inputs = [helper.make_tensor_value_info("x", elem(src.dtype), list(src.shape)),
              helper.make_tensor_value_info("s", elem(scales.dtype), list(scales.shape))]
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], **attrs)
    graph = helper.make_graph([node], "dql", inputs, [helper.make_tensor_value_info("y", elem(dst), list(src.shape))])
    imports = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=imports, ir_version=helper.find_min_ir_version_for(imports)), opset


def ort_value(a: np.ndarray):
    """a as ONNX Runtime takes it: 2- and 4-bit codes packed at the front of a buffer of a's
    shape (its Python API reads such a buffer as packed), one-byte floats by their bytes."""
    name = a.dtype.name
    if name in PACKED:
        bits = PACKED[name]
        per = 8 // bits
        v = a.view(np.uint8).reshape(-1) & np.uint8((1 << bits) - 1)
        v = np.concatenate([v, np.zeros(-v.size % per, np.uint8)])
        packed = np.zeros(v.size // per, np.uint8)
        for k in range(per):
            packed |= v[k::per] << np.uint8(bits * k)
        buf = np.zeros(a.shape, np.uint8)
        buf.reshape(-1)[: packed.size] = packed
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(buf, elem(a.dtype))
    if a.dtype.itemsize == 1 and not dtypes.of(a.dtype).is_integer or name in ("int8", "uint8"):
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(a.view(np.uint8), elem(a.dtype))
    return ort.OrtValue.ortvalue_from_numpy(a)


def ort_runner(case, threads):
    """A function running ONNX Runtime's DequantizeLinear on the case, and the opset; (None, why)
    where it has no CPU kernel for it."""
    model, opset = dql_model(case)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = threads
    try:
        sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = {"x": ort_value(case["src"]), "s": ort_value(case["scales"])}
        sess.run(None, feeds)
    except Exception:  # noqa: BLE001 (ONNX Runtime raises its own types: no schema, or no CPU kernel)
        return None, "no kernel"
    return (lambda: sess.run(None, feeds)[0]), opset


# -- the limit ---------------------------------------------------------------------------------------


def limit_fn(src, copy, out, threads):
    """The codes' bytes copied into `copy` and every byte of out written (a fill), in our kernel's
    blocks on our kernel's threads: a read of the codes and a write of the output, no arithmetic."""
    raw = src.reshape(-1).view(np.uint8)
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32}[out.dtype.itemsize]
    flat_out = out.reshape(-1).view(width)
    n, size = flat_out.size, src.dtype.itemsize
    chunk = parallel.TUNING.chunk
    count = -(-n // chunk)

    def work(a, b):
        lo, hi = a * chunk, min(b * chunk, n)
        np.copyto(copy[lo * size: hi * size], raw[lo * size: hi * size])
        flat_out[lo:hi].fill(1)

    parallel.run(work, count, parallel.threads_for(n, count, threads))
    return out


# -- timing ------------------------------------------------------------------------------------------


def measure(case, reps, threads):
    """Medians (ms) of ours, ORT (where it has a kernel) and the limit on one case, ORT's opset or
    why it has none, and how many of ORT's outputs differ from ours; None when ours is wrong."""
    src, scales, dst = case["src"], case["scales"], case["dst"]
    vshape, varies = view(src.shape, "per_group", 1, [1, GROUP])
    out, limit_out = np.empty(src.shape, dst), np.empty(src.shape, dst)
    copy = np.empty(src.nbytes, np.uint8)
    contenders = {"ours": lambda: native.dequantize(src, scales, None, vshape, varies, out, threads)}
    run_ort, opset = ort_runner(case, threads)
    if run_ort is not None:
        contenders["ORT"] = run_ort
    contenders["limit"] = lambda: limit_fn(src, copy, limit_out, threads)
    expect = oracle(src, scales, dst)
    if not same_bits(contenders["ours"](), expect):
        print(f"FAILED: ours differs from the oracle on {' '.join(case['label'].split())}", file=sys.stderr)
        return None
    ort_differs = None
    if run_ort is not None:
        got = np.asarray(run_ort())
        width = {2: np.uint16, 4: np.uint32}[dst.itemsize]
        ort_differs = int(np.count_nonzero(got.view(width) != expect.view(width))) if got.dtype == dst else -1
        del got
    del expect
    for fn in contenders.values():  # the warm-up
        fn()
    samples = {k: [] for k in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            t = time.perf_counter()
            r = fn()
            samples[name].append(time.perf_counter() - t)
            del r
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}, opset, ort_differs


def report(rows, title):
    print(f"\n{title}, ms:\n")
    head = (f"| {'codes           scales         output':<39} |     ours |      ORT |    limit | ours/ORT | "
            f"ours/limit | ORT: opset, bits   |")
    print(head)
    print("|" + "|".join("-" * len(p) for p in head.split("|")[1:-1]) + "|")
    for label, med, opset, differs in rows:
        o = med.get("ORT")
        ort_cell = f"{o:8.2f}" if o is not None else f"{'-':>8}"
        r_ort = f"{med['ours'] / o:8.2f}" if o is not None else f"{'-':>8}"
        note = opset if o is None else f"{opset}, " + ("same bits" if differs == 0 else f"{differs} differ")
        print(f"| {label:<39} | {med['ours']:8.2f} | {ort_cell} | {med['limit']:8.2f} | {r_ort} | "
              f"{med['ours'] / med['limit']:10.2f} | {note:<18} |")


def goals(rows, title):
    with_ort = [(label, med["ours"] / med["ORT"]) for label, med, *_ in rows if "ORT" in med]
    to_limit = [(label, med["ours"] / med["limit"]) for label, med, *_ in rows]
    lines = []
    for name, pairs, limit in ((f"ours <= {_GOAL_ORT:.1f}x ORT where it has a kernel", with_ort, _GOAL_ORT),
                               (f"ours <= {_GOAL_LIMIT:.1f}x the limit for every type", to_limit, _GOAL_LIMIT)):
        if not pairs:
            continue
        label, worst = max(pairs, key=lambda p: p[1])
        missed = [f"{' '.join(lb.split())} {x:.2f}x" for lb, x in pairs if x > limit]
        verdict = "met" if not missed else "MISSED"
        lines.append(f"  [{verdict}] {title}: {name}: worst {worst:.2f}x ({' '.join(label.split())})"
                     + (f"; over: {', '.join(missed)}" if missed else ""))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=4096, help="codes are size x size (default 4096: 16 M elements)")
    ap.add_argument("--reps", type=int, default=9, help="timed rounds (default 9)")
    ap.add_argument("--types", default=",".join(TYPES), help="code types, comma-separated (default: all 16)")
    ap.add_argument("--threads", default="1,default",
                    help="thread settings, comma-separated: numbers, or 'default' (every core); default '1,default'")
    ap.add_argument("--level", type=int, choices=[0, 1, 2], default=None,
                    help="run the compiled kernel at a lower level than this CPU's")
    args = ap.parse_args(argv)
    if not native.built():
        print(f"the compiled kernel is not built: {native.info()['why']}")
        return 1
    types = [t.strip() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in types if t not in TYPES]
    if unknown or args.size % GROUP or args.size < GROUP:
        print(f"--types: each one of {', '.join(TYPES)}; --size: a multiple of {GROUP}" +
              (f" (unknown: {', '.join(unknown)})" if unknown else ""))
        return 1
    if args.level is not None and args.level > native.cpu_level():
        print(f"--level {args.level}: this CPU has levels 0 to {native.cpu_level()}")
        return 1
    settings = [None if t.strip() == "default" else int(t) for t in args.threads.split(",")]
    with native.at_level(args.level) if args.level is not None else contextlib.nullcontext():
        return _run(args, types, settings)


def _run(args, types, settings) -> int:
    n = args.size
    print(f"machine: {machine()}")
    print(f"codes {n}x{n}, float32 scales per group of {GROUP} along the last axis, no zero points; medians of "
          f"{args.reps} interleaved rounds after a warm-up; our compiled kernel at level {native.level()} "
          f"({native.info()['entries']['dequantize']} variant, {native.info()['compiler'].split(' (')[0]})")
    cases = make_cases(n, types)
    verdicts = []
    for threads in settings:
        rows = []
        for case in cases:
            m = measure(case, args.reps, threads)
            if m is None:
                return 1
            rows.append((case["label"], *m))
        title = (f"{threads} thread{'s' if threads != 1 else ''}" if threads is not None
                 else f"default threads ({parallel.threads_for(n * n, 10**9, None)} for ours, ORT's default)")
        report(rows, title)
        verdicts += goals(rows, title)
    print("\ngoals:")
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
