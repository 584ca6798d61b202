"""The 2-bit bridge's figures: bytes and time of `lift` and of the way back, beside ONNX Runtime's
own quantizer and session creation on the same model.

    .venv/bin/python benchmarks/bench_lift_2bit.py [SIZE]     (default 4096: a SIZE x SIZE weight)

1. A float32 MatMul [M, SIZE] @ [SIZE, SIZE] (weights seeded N(0, 0.05)) is quantized to 2 bits
   by ONNX Runtime's own MatMulNBitsQuantizer (RTN, asymmetric, blocks of 32): MatMulNBits with
   packed uint8 zero points.  Then, each the median of REPEATS: `dyndq.lift` (MatMulNBits ->
   DynamicDequantize-3 uint2 + MatMul), `dyndq.export(target="onnxruntime")` (back, byte for
   byte: checked), and ONNX Runtime's session creation on the quantized model (its own load and
   prepacking of the same bytes).  Bytes: the initializers as ONNX stores them (uint2 packed four a
   byte), and the serialized model.
2. The same weight with half-integer zero points (1.5 everywhere, the codebook [-1, -1/3, 1/3, 1]
   times a scale) and float16 scales: lifted as codes 2q (uint4), zero points 2zp and scales / 2,
   with the bytes that doubled form costs.
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import dyndq
from bench_kernel import machine  # (beside this script: run as one, its folder is on sys.path)

REPEATS = 3


def median_time(fn) -> tuple[float, object]:
    times, out = [], None
    for _ in range(REPEATS):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def ort_two_bit(size: int) -> onnx.ModelProto:
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    w = (np.random.default_rng(0).standard_normal((size, size)) * 0.05).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", size])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])
    logging.disable(logging.INFO)
    quantizer = MatMulNBitsQuantizer(model, algo_config=DefaultWeightOnlyQuantConfig(block_size=32, bits=2))
    quantizer.process()
    logging.disable(logging.NOTSET)
    return quantizer.model.model


def half_zero_points(size: int, block: int = 32) -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    blocks = size // block
    B = rng.integers(0, 256, (size, blocks, block // 4), dtype=np.uint8)
    scales = (rng.uniform(0.01, 0.05, (size, blocks)) * 2 / 3).astype(np.float16)
    node = helper.make_node("MatMulNBits", ["x", "B", "scales", "zp"], ["y"], name="codebook", domain="com.microsoft",
                            K=size, N=size, bits=2, block_size=block)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["M", size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["M", size])],
                              [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales.reshape(-1), "scales"),
                               numpy_helper.from_array(np.full(size * blocks, 1.5, np.float16), "zp")])
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                 helper.make_opsetid("com.microsoft", 1)])


def stored_bytes(model: onnx.ModelProto) -> int:
    """The model's initializers' bytes, sub-byte codes packed."""
    from dyndq.converters.contrib.float_zero_points import packed_bytes

    return sum(packed_bytes(t) for t in model.graph.initializer)


def session(model: onnx.ModelProto):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def row(name: str, model: onnx.ModelProto) -> None:
    lift_s, (lifted, report) = median_time(lambda: dyndq.lift_with_report(model))
    back_s, back = median_time(lambda: dyndq.export(lifted, target="onnxruntime"))
    ort_s, _ = median_time(lambda: session(model))
    same = back.SerializeToString() == model.SerializeToString()
    print(f"{name}: lifted {report.count}, left {len(report.skipped)} alone; way back byte for byte: {same}")
    print(f"  initializers: {stored_bytes(model)} B as MatMulNBits, {stored_bytes(lifted)} B lifted "
          f"({stored_bytes(lifted) / stored_bytes(model):.3f}x); serialized {model.ByteSize()} B -> {lifted.ByteSize()} B")
    print(f"  lift {lift_s * 1e3:.0f} ms, export --target onnxruntime {back_s * 1e3:.0f} ms; "
          f"ONNX Runtime session creation on the same model {ort_s * 1e3:.0f} ms (lift / session {lift_s / ort_s:.2f})")
    for note in report.notes:
        print(f"  note: {note}")


def main(size: int = 4096) -> None:
    print(f"machine: {machine()}")
    start = time.perf_counter()
    model = ort_two_bit(size)
    print(f"ONNX Runtime's MatMulNBitsQuantizer, 2 bits, {size} x {size}, blocks of 32: {time.perf_counter() - start:.2f} s")
    row(f"2-bit MatMulNBits {size} x {size} (ONNX Runtime's RTN)", model)
    row(f"2-bit MatMulNBits {size} x {size}, zero points 1.5, float16 scales", half_zero_points(size))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))
