"""The demo: a small float MLP quantized by `dyndq.quantize` into a weight-only int4 one,
checked, inferred, run on both engines, exported to standard ONNX, and written to a folder.

    x[batch,64] float32
      -> MatMul with DynamicDequantize(uint8 W1[64,128], per_channel scales[128], uint8 zps[128])
         (the first layer kept in 8 bits, as int4 recipes often do: a form version 1 expresses)
      -> Add b1 -> Relu
      -> MatMul with DynamicDequantize(uint4 W2[128,64], per_group groups of 32 along the input dim,
         float32 scales[4,64], uint4 zps[4,64])
      -> Add b2 -> Relu
      -> MatMul with Cast(DynamicDequantize(uint4 W3[64,16], per_group groups of 32,
         float16 scales[2,16], uint4 zps[2,16])) to float32
      -> Add b3 -> y[batch,16]

The float weights are drawn from a seeded generator and quantized by `dyndq.quantize` (ONNX
Runtime's round to nearest, one call per layer for its options), so every run builds the same
model and the same input.  Both engines must agree to the bit on every dequantized weight
(checked on a copy of the model whose graph outputs include every DynamicDequantize output);
the MLP's output y goes through float32 MatMuls, which NumPy and ONNX Runtime may sum in
different orders on some CPUs, so y is compared within a stated tolerance (Y_RTOL, Y_ATOL),
not to the bit.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SEED = 20240611
IN, HIDDEN, HIDDEN2, OUT = 64, 128, 64, 16
GROUP = 32  # int4 weights: one scale and zero point per 32 input rows of each output column
BATCH = 4
Y_RTOL, Y_ATOL = 1e-5, 1e-6  # y: float32 MatMuls summed in an engine's own order
# each layer's weight, the MatMul reading it, and dyndq.quantize's options for it
LAYERS = (
    ("w1", "fc1_matmul", dict(bits=8, group_size=-1)),  # uint8, one scale per output column
    ("w2", "fc2_matmul", dict(bits=4, group_size=GROUP)),
    ("w3", "fc3_matmul", dict(bits=4, group_size=GROUP, scale_dtype="float16")),
)


def float_model(seed: int = SEED) -> onnx.ModelProto:
    """The float MLP the demo quantizes: x -> (MatMul w, Add b, Relu) x 2 -> MatMul w3, Add b3 -> y."""
    from dyndq.build import make_model

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((IN, HIDDEN)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((HIDDEN, HIDDEN2)) * 0.05 + 0.01).astype(np.float32)
    w3 = (rng.standard_normal((HIDDEN2, OUT)) * 0.1).astype(np.float32)
    b1 = (rng.standard_normal(HIDDEN) * 0.01).astype(np.float32)
    b2 = (rng.standard_normal(HIDDEN2) * 0.01).astype(np.float32)
    b3 = (rng.standard_normal(OUT) * 0.01).astype(np.float32)
    initializers = [numpy_helper.from_array(a, name)
                    for name, a in [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2), ("w3", w3), ("b3", b3)]]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["fc1_mm"], name="fc1_matmul"),
        helper.make_node("Add", ["fc1_mm", "b1"], ["fc1"], name="fc1_bias"),
        helper.make_node("Relu", ["fc1"], ["h1"], name="relu1"),
        helper.make_node("MatMul", ["h1", "w2"], ["fc2_mm"], name="fc2_matmul"),
        helper.make_node("Add", ["fc2_mm", "b2"], ["fc2"], name="fc2_bias"),
        helper.make_node("Relu", ["fc2"], ["h2"], name="relu2"),
        helper.make_node("MatMul", ["h2", "w3"], ["fc3_mm"], name="fc3_matmul"),
        helper.make_node("Add", ["fc3_mm", "b3"], ["y"], name="fc3_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "weight_only_int4_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT])],
        initializers,
    )
    return make_model(graph, opset=21, producer_name="dyndq demo")


def quantized_model(seed: int = SEED):
    """(the demo MLP quantized, one QuantizeReport per layer): `dyndq.quantize` once per layer,
    with that layer's options and the other MatMuls excluded.  Each call puts its nodes ahead of
    the graph's, so the last layer goes first and the nodes read in the layers' order."""
    import dyndq

    model, reports = float_model(seed), []
    for weight, node, options in reversed(LAYERS):
        others = [n for _, n, _ in LAYERS if n != node]
        model, report = dyndq.quantize(model, exclude=others, evaluate=False, **options)
        reports.insert(0, report)
    model.doc_string = ("A weight-only-quantized MLP made by dyndq.quantize: uint8 per-channel weights, then uint4 "
                        "weights in groups of 32 with float32 and float16 scales, dequantized at run time.")
    return model, reports


def build_model(seed: int = SEED) -> onnx.ModelProto:
    """The demo MLP, holding three DynamicDequantize nodes (one uint8, two uint4)."""
    return quantized_model(seed)[0]


def dequantized_names(model: onnx.ModelProto) -> list[str]:
    """The outputs of the model's DynamicDequantize nodes, in graph order: the dequantized weights."""
    from dyndq.opdefs import DOMAIN

    return [n.output[0] for n in model.graph.node if n.domain == DOMAIN and n.op_type == "DynamicDequantize"]


def with_weights_as_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of the model whose graph outputs are y and the dequantized weights (types from
    ONNX's shape inference), to compare both engines on every weight."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    infos = {vi.name: vi for vi in inferred.graph.value_info}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.extend(infos[name] for name in dequantized_names(model))
    return out


def weight_bytes(model: onnx.ModelProto) -> tuple[int, int]:
    """(bytes the quantized weights take as stored: packed uint4 and uint8 values, scales and zero
    points; bytes the same weights would take as float32)."""
    inits = {t.name: t for t in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.output[0] in dequantized_names(model)]
    stored = sum(len(inits[name].raw_data) for n in nodes for name in n.input if name)
    as_float = sum(4 * int(np.prod(inits[n.input[0]].dims)) for n in nodes)
    return stored, as_float


def demo_input(seed: int = SEED, batch: int = BATCH) -> np.ndarray:
    return np.random.default_rng(seed + 1).standard_normal((batch, IN)).astype(np.float32)


# -- describing what was done ----------------------------------------------------------------


def describe_node(node: onnx.NodeProto, types: dict[str, str] | None = None) -> str:
    """One line: op, inputs (with types when known) -> outputs, attributes."""
    from dyndq.plumbing.names import op_name
    from dyndq.plumbing.types import attribute_values

    types = types or {}
    ins = ", ".join(f"{n} {types[n]}" if n in types else (n or "''") for n in node.input)
    outs = ", ".join(node.output)
    shown = " ".join(f"{k}={_attribute_text(v)}" for k, v in attribute_values(node).items())
    return f"{op_name(node)}({ins}) -> {outs}" + (f"  {shown}" if shown else "")


def _attribute_text(value) -> str:
    from dyndq.plumbing.types import dtype_name

    if isinstance(value, onnx.TensorProto):
        return f"{dtype_name(value.data_type)}{list(value.dims)}"
    if isinstance(value, onnx.GraphProto):
        return f"<graph {value.name}>"
    return str(value)


def initializer_types(model: onnx.ModelProto) -> dict[str, str]:
    from dyndq.plumbing.types import dtype_name

    return {
        t.name: f"{dtype_name(t.data_type)}[{','.join(map(str, t.dims))}]" for t in model.graph.initializer
    }


def value_type(vi: onnx.ValueInfoProto) -> str:
    from dyndq.plumbing.types import spec_of_type

    spec = spec_of_type(vi.type)
    return str(spec) if spec is not None else "?"


def bits_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise: the same bits (so NaN equals the same NaN, and -0 differs from +0)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return np.zeros(a.shape if a.size >= b.size else b.shape, bool)
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":  # (ml_dtypes' bfloat16 is kind "V")
        view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        return a.view(view) == b.view(view)
    return a == b


@dataclass
class DemoResult:
    model: onnx.ModelProto
    exported: onnx.ModelProto
    feeds: dict
    outputs: dict  # engine -> {name: array}: y and every dequantized weight
    agree: bool  # both engines' dequantized weights bit for bit
    identical: int  # dequantized weight values with identical bits
    total: int  # dequantized weight values
    y_close: bool = False  # both engines' y within Y_RTOL, Y_ATOL
    y_max_difference: float = 0.0
    y_identical: int = 0
    paths: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    sizes: tuple = (0, 0)  # weight_bytes(model)


def _timed(fn, repeat: int = 20):
    """(result, seconds of the first call, best seconds of `repeat` later calls)."""
    t0 = time.perf_counter()
    result = fn()
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return result, first, best


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def run_demo(out_dir: str = "dyndq-demo", *, stream=None) -> DemoResult:
    """Do the whole demo, print what was done to `stream` (stdout), and return the results."""
    import dyndq
    from dyndq.npy import save_array
    from dyndq.model_files import save_model
    from dyndq.written import verify_model
    from dyndq.kernels import native

    out = stream or sys.stdout

    def say(line: str = "") -> None:
        print(line, file=out)

    model, quantized = quantized_model()
    weights = dequantized_names(model)
    x = demo_input()
    feeds = {"x": x}
    types = initializer_types(model)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)

    say(f"dyndq demo: a weight-only int4 MLP, x[batch,{IN}] -> {HIDDEN} -> {HIDDEN2} -> {OUT} (seed {SEED})")
    say(native.summary())  # which kernel runs, and why (kernels/native.py)
    say()
    say("quantized by dyndq.quantize, one call per layer (rtn: ONNX Runtime's rounding):")
    for (weight, node, options), report in zip(LAYERS, quantized):
        layer, = report.layers
        shown = ", ".join(f"{k}={v!r}" for k, v in options.items())
        say(f"  {weight} ({node}; {shown}): {layer.form}, rel. error {layer.relative_error:.5f}")
    say()
    say(f"graph {model.graph.name!r}: {len(model.graph.node)} nodes (opsets: {opsets}; IR {model.ir_version})")
    for node in model.graph.node:
        say(f"  {describe_node(node, types)}")

    problems = dyndq.check(model)
    say()
    if problems:
        from dyndq.wording import problem_list

        say(problem_list("check", problems))
        raise dyndq.ValidationError(problems)
    say("check: valid (dyndq.check and onnx.checker.check_model(full_check=True) find no problem)")

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {vi.name: value_type(vi) for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    say("shape inference: " + ", ".join(f"{w} {shapes.get(w, '?')}" for w in weights)
        + f", output y {shapes.get('y', '?')}")
    stored, as_float = weight_bytes(model)
    say(f"weights: {stored} bytes as stored (uint8 and packed uint4 values, scales, zero points) "
        f"against {as_float} bytes as float32: {as_float / stored:.2f}x smaller")

    exported, report = dyndq.export_with_report(model)
    say()
    say(f"exported to standard ONNX: {report.count} DynamicDequantize lowered; "
        f"{len(exported.graph.node)} nodes (opset {report.opset}, IR {report.ir_version})")
    for lowered in report.lowered:
        say(f"  {lowered.node}: {lowered.form}, {lowered.nodes} node{'s' if lowered.nodes != 1 else ''}")
    exported_types = initializer_types(exported)
    for node in exported.graph.node:
        say(f"  {describe_node(node, exported_types)}")

    timings = {}
    for engine in ("reference", "onnxruntime"):
        _, first, best = _timed(lambda: dyndq.run(model, feeds, engine=engine))
        timings[engine] = (first, best)
    # every dequantized weight, from both engines: the same model with them as outputs too
    probe = with_weights_as_outputs(model)
    outputs = {engine: dyndq.run(probe, feeds, engine=engine) for engine in ("reference", "onnxruntime")}
    ref, ort_out = outputs["reference"], outputs["onnxruntime"]
    same = {w: bits_equal(ref[w], ort_out[w]) for w in weights}
    identical = int(sum(s.sum() for s in same.values()))
    total = int(sum(ref[w].size for w in weights))
    agree = identical == total
    y, y_ort = ref["y"], ort_out["y"]
    y_close = y.dtype == y_ort.dtype and y.shape == y_ort.shape and bool(
        np.allclose(y_ort, y, rtol=Y_RTOL, atol=Y_ATOL))
    y_max = float(np.max(np.abs(y.astype(np.float64) - y_ort.astype(np.float64)))) if y.size else 0.0
    y_identical = int(bits_equal(y, y_ort).sum())

    say()
    say(f"ran on x float32[{BATCH},{IN}] (first call builds and caches the engine; then best of 20):")
    names = {"reference": "reference evaluator (our NumPy kernel)", "onnxruntime": "ONNX Runtime (exported model)"}
    for engine, (first, best) in timings.items():
        say(f"  {names[engine]:<40} first {_ms(first):>10}   then {_ms(best):>9}")
    say("  dequantized weights, both engines: " + ", ".join(
        f"{w} {ref[w].dtype.name}{list(ref[w].shape)} {int(same[w].sum())} of {ref[w].size} identical" for w in weights))
    say(f"  both engines agree bit for bit on every dequantized weight: {'yes' if agree else 'NO'} "
        f"({identical} of {total} values identical)")
    say(f"  output y: float32{list(y.shape)}, y[0,:4] = {np.array2string(y[0, :4], precision=6)}")
    say(f"  both engines agree on y within rtol {Y_RTOL:g}, atol {Y_ATOL:g}: {'yes' if y_close else 'NO'} "
        f"(float32 MatMuls, summed in each engine's own order)")
    say(f"  y on this CPU: max |difference| {y_max:.3g}, {y_identical} of {y.size} values bit-identical")

    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "model": os.path.join(out_dir, "model.onnx"),
        "exported": os.path.join(out_dir, "model.exported.onnx"),
        "input": os.path.join(out_dir, "x.npy"),
    }
    # (each checked before it is put in place: valid, and it loads on its engine)
    save_model(model, paths["model"], check=lambda staged: verify_model(staged, "dyndq", shown_as=paths["model"]))
    save_model(exported, paths["exported"], check=lambda staged: verify_model(staged, "onnx", shown_as=paths["exported"]))
    save_array(paths["input"], x)
    say()
    say(f"wrote {paths['model']} (with DynamicDequantize), {paths['exported']} (standard ONNX) and {paths['input']}")
    say(f"try:  dyndq run {paths['model']} --input x={paths['input']} --engine onnxruntime")
    return DemoResult(model, exported, feeds, outputs, agree, identical, total, y_close, y_max, y_identical,
                      paths, timings, (stored, as_float))
