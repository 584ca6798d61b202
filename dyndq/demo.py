"""The demo: a small weight-only-quantized MLP, checked, inferred, run on both
engines, exported to standard ONNX, and written to a folder.

    x[batch,64] float32
      -> MatMul with DynamicDequantize(int8 W1[64,128], per_channel scales[128], int32 zps[128])
      -> Add b1 -> Relu
      -> MatMul with DynamicDequantize(uint8 W2[128,16], per_tensor scale[1], uint8 zp[1])
      -> Add b2 -> y[batch,16]

The weights are float weights drawn from a seeded generator and quantized the
usual asymmetric way (per output channel for W1, per tensor for W2), so every
run builds the same model and the same input.
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
IN, HIDDEN, OUT = 64, 128, 16
BATCH = 4


def _quantize_per_channel_int8(w: np.ndarray):
    """Asymmetric int8 quantization along axis 1, with int32 zero points (as oneDNN keeps them)."""
    lo = np.minimum(w.min(axis=0), 0.0)
    hi = np.maximum(w.max(axis=0), 0.0)
    scales = ((hi - lo) / 255.0).astype(np.float32)
    zps = np.round(-128.0 - lo / scales).astype(np.int32)
    q = np.clip(np.round(w / scales) + zps, -128, 127).astype(np.int8)
    return q, scales, zps


def _quantize_per_tensor_uint8(w: np.ndarray):
    lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
    scale = np.float32((hi - lo) / 255.0)
    zp = np.uint8(np.round(-lo / scale))
    q = np.clip(np.round(w / scale) + zp, 0, 255).astype(np.uint8)
    return q, np.array([scale], np.float32), np.array([zp], np.uint8)


def build_model(seed: int = SEED) -> onnx.ModelProto:
    """The demo MLP, holding two DynamicDequantize nodes."""
    from dyndq.build import make_model, make_node

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((IN, HIDDEN)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((HIDDEN, OUT)) * 0.05 + 0.01).astype(np.float32)
    b1 = (rng.standard_normal(HIDDEN) * 0.01).astype(np.float32)
    b2 = (rng.standard_normal(OUT) * 0.01).astype(np.float32)
    w1_q, w1_scales, w1_zps = _quantize_per_channel_int8(w1)
    w2_q, w2_scale, w2_zp = _quantize_per_tensor_uint8(w2)
    initializers = [
        numpy_helper.from_array(a, name)
        for name, a in [
            ("w1_q", w1_q), ("w1_scales", w1_scales), ("w1_zps", w1_zps), ("b1", b1),
            ("w2_q", w2_q), ("w2_scale", w2_scale), ("w2_zp", w2_zp), ("b2", b2),
        ]
    ]
    nodes = [
        make_node(["w1_q", "w1_scales", "w1_zps"], ["w1"], qtype="per_channel", axis=1, name="fc1_dequantize"),
        helper.make_node("MatMul", ["x", "w1"], ["fc1_mm"], name="fc1_matmul"),
        helper.make_node("Add", ["fc1_mm", "b1"], ["fc1"], name="fc1_bias"),
        helper.make_node("Relu", ["fc1"], ["h"], name="relu"),
        make_node(["w2_q", "w2_scale", "w2_zp"], ["w2"], qtype="per_tensor", name="fc2_dequantize"),
        helper.make_node("MatMul", ["h", "w2"], ["fc2_mm"], name="fc2_matmul"),
        helper.make_node("Add", ["fc2_mm", "b2"], ["y"], name="fc2_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "weight_only_quantized_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", OUT])],
        initializers,
    )
    model = make_model(graph, opset=21, producer_name="dyndq demo")
    model.doc_string = "A weight-only-quantized MLP: int8 per-channel and uint8 per-tensor weights, dequantized at run time."
    return model


def demo_input(seed: int = SEED, batch: int = BATCH) -> np.ndarray:
    return np.random.default_rng(seed + 1).standard_normal((batch, IN)).astype(np.float32)


# -- describing what was done ----------------------------------------------------------------


def describe_node(node: onnx.NodeProto, types: dict[str, str] | None = None) -> str:
    """One line: op, inputs (with types when known) -> outputs, attributes."""
    from dyndq.converters.onnx_types import attribute_values

    types = types or {}
    op = node.op_type if not node.domain else f"{node.domain}::{node.op_type}"
    ins = ", ".join(f"{n} {types[n]}" if n in types else (n or "''") for n in node.input)
    outs = ", ".join(node.output)
    shown = " ".join(f"{k}={_attribute_text(v)}" for k, v in attribute_values(node).items())
    return f"{op}({ins}) -> {outs}" + (f"  {shown}" if shown else "")


def _attribute_text(value) -> str:
    from dyndq.converters.onnx_types import dtype_name

    if isinstance(value, onnx.TensorProto):
        return f"{dtype_name(value.data_type)}{list(value.dims)}"
    if isinstance(value, onnx.GraphProto):
        return f"<graph {value.name}>"
    return str(value)


def initializer_types(model: onnx.ModelProto) -> dict[str, str]:
    from dyndq.converters.onnx_types import dtype_name

    return {
        t.name: f"{dtype_name(t.data_type)}[{','.join(map(str, t.dims))}]" for t in model.graph.initializer
    }


def value_type(vi: onnx.ValueInfoProto) -> str:
    from dyndq.converters.onnx_types import spec_of_type

    spec = spec_of_type(vi.type)
    return str(spec) if spec is not None else "?"


def bits_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise: the same bits (so NaN equals the same NaN, and -0 differs from +0)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return np.zeros(a.shape if a.size >= b.size else b.shape, bool)
    if a.dtype.kind == "f":
        view = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
        return a.view(view) == b.view(view)
    return a == b


@dataclass
class DemoResult:
    model: onnx.ModelProto
    exported: onnx.ModelProto
    feeds: dict
    outputs: dict  # engine -> {name: array}
    agree: bool
    identical: int
    total: int
    paths: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)


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
    from dyndq.files import save_array, save_model

    out = stream or sys.stdout

    def say(line: str = "") -> None:
        print(line, file=out)

    model = build_model()
    x = demo_input()
    feeds = {"x": x}
    types = initializer_types(model)
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)

    say(f"dyndq demo: a weight-only-quantized MLP, x[batch,{IN}] -> {HIDDEN} -> {OUT} (seed {SEED})")
    say()
    say(f"graph {model.graph.name!r}: {len(model.graph.node)} nodes (opsets: {opsets}; IR {model.ir_version})")
    for node in model.graph.node:
        say(f"  {describe_node(node, types)}")

    problems = dyndq.check(model)
    say()
    if problems:
        say(f"check: {len(problems)} problem(s)")
        for p in problems:
            say(f"  {p}")
        raise dyndq.ValidationError(problems)
    say("check: valid (dyndq.check and onnx.checker.check_model(full_check=True) find no problem)")

    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {vi.name: value_type(vi) for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    say(f"shape inference: w1 {shapes.get('w1', '?')}, w2 {shapes.get('w2', '?')}, output y {shapes.get('y', '?')}")

    exported, report = dyndq.export_with_report(model)
    say()
    say(
        f"exported to standard ONNX: {report.count} DynamicDequantize lowered; "
        f"{len(exported.graph.node)} nodes (opset {report.opset}, IR {report.ir_version})"
    )
    exported_types = initializer_types(exported)
    for node in exported.graph.node:
        say(f"  {describe_node(node, exported_types)}")

    outputs, timings = {}, {}
    for engine in ("reference", "onnxruntime"):
        result, first, best = _timed(lambda: dyndq.run(model, feeds, engine=engine))
        outputs[engine] = result
        timings[engine] = (first, best)
    ref, ort_out = outputs["reference"], outputs["onnxruntime"]
    same = [bits_equal(ref[k], ort_out[k]) for k in ref]
    identical = int(sum(s.sum() for s in same))
    total = int(sum(np.asarray(ref[k]).size for k in ref))
    agree = identical == total and ref.keys() == ort_out.keys()

    say()
    say(f"ran on x float32[{BATCH},{IN}] (first call builds and caches the engine; then best of 20):")
    names = {"reference": "reference evaluator (our NumPy kernel)", "onnxruntime": "ONNX Runtime (exported model)"}
    for engine, (first, best) in timings.items():
        say(f"  {names[engine]:<40} first {_ms(first):>10}   then {_ms(best):>9}")
    y = ref["y"]
    say(f"  output y: float32{list(y.shape)}, y[0,:4] = {np.array2string(y[0, :4], precision=6)}")
    if agree:
        say(f"  both engines agree bit for bit: yes ({identical} of {total} output values identical)")
    else:
        diff = max(float(np.max(np.abs(ref[k].astype(np.float64) - ort_out[k]))) for k in ref)
        say(f"  both engines agree bit for bit: NO ({identical} of {total} output values identical; max |difference| {diff:.3g})")

    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "model": os.path.join(out_dir, "model.onnx"),
        "exported": os.path.join(out_dir, "model.exported.onnx"),
        "input": os.path.join(out_dir, "x.npy"),
    }
    save_model(model, paths["model"])
    save_model(exported, paths["exported"])
    save_array(paths["input"], x)
    say()
    say(f"wrote {paths['model']} (with DynamicDequantize), {paths['exported']} (standard ONNX) and {paths['input']}")
    say(f"try:  dyndq run {paths['model']} --input x={paths['input']} --engine onnxruntime")
    return DemoResult(model, exported, feeds, outputs, agree, identical, total, paths, timings)

