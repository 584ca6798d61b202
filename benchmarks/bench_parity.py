"""What `dyndq check --runtime-parity` costs, against the sessions it compares.

    .venv/bin/python benchmarks/bench_parity.py [--hidden 512] [--layers 1 2 4] [--repeats 3]

Each model is a decoder-shaped chain (LayerNormalization, q/k/v/o and a Gelu MLP of MatMuls,
residual adds), its MatMuls quantized by ONNX Runtime's own MatMulNBitsQuantizer (QDQ form: int4,
blocks of 32), which ONNX Runtime's default level fuses into MatMulNBits at accuracy_level 4.  For
each: the seconds of the sessions compared (the reference engine's run, and one ONNX Runtime
session made and run per level: off, basic, extended, all), the whole check without diagnosis
(`diagnose=False`: example inputs, the comparisons) and with it (the bisection of ONNX Runtime's
transformers and the first node), and the sessions the diagnosis ran; medians of REPEATS.
"""
from __future__ import annotations

import argparse
import logging
import math
import os
import statistics

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from bench_kernel import machine
from dyndq.parity import runtime_parity
from dyndq.parity.ort_rewrites import transformers


def decoder(hidden: int, layers: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def const(name, array):
        inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def op(op_type, inputs, out, **attrs):
        nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    x, ffn = "x", hidden * 11 // 4
    const("gamma", np.ones(hidden)), const("beta", np.zeros(hidden))
    for i in range(layers):
        h = op("LayerNormalization", [x, "gamma", "beta"], f"l{i}/ln", axis=-1)
        for w in ("q", "k", "v"):
            op("MatMul", [h, const(f"l{i}/w{w}", rng.standard_normal((hidden, hidden)) / np.sqrt(hidden))], f"l{i}/{w}")
        scores = op("MatMul", [f"l{i}/q", op("Transpose", [f"l{i}/k"], f"l{i}/kt", perm=[0, 2, 1])], f"l{i}/s")
        attn = op("MatMul", [op("Softmax", [scores], f"l{i}/p", axis=-1), f"l{i}/v"], f"l{i}/a")
        o = op("MatMul", [attn, const(f"l{i}/wo", rng.standard_normal((hidden, hidden)) / np.sqrt(hidden))], f"l{i}/o")
        x = op("Add", [x, o], f"l{i}/r1")
        h = op("LayerNormalization", [x, "gamma", "beta"], f"l{i}/ln2", axis=-1)
        up = op("Gelu", [op("MatMul", [h, const(f"l{i}/up", rng.standard_normal((hidden, ffn)) / np.sqrt(hidden))],
                            f"l{i}/u")], f"l{i}/g")
        down = op("MatMul", [up, const(f"l{i}/down", rng.standard_normal((ffn, hidden)) / np.sqrt(ffn))], f"l{i}/d")
        x = op("Add", [x, down], f"l{i}/r2")
    nodes.append(helper.make_node("Identity", [x], ["y"], name="out"))
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def qdq_int4(model):
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    config = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=False, bits=4, op_types_to_quantize=("MatMul",),
                                          quant_format=QuantFormat.QDQ)
    logging.disable(logging.INFO)
    try:
        quantizer = MatMulNBitsQuantizer(model, algo_config=config)  # (it changes the model it is given: a fresh one)
        quantizer.process()
    finally:
        logging.disable(logging.NOTSET)
    return quantizer.model.model


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(f"machine: {machine()}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (shared machine: figures move with it)")
    n = len(transformers("all"))
    print(f"transformer names bisected at level all: {n} (log2 {math.log2(n):.1f})")
    print(f"{'model':<28} {'sessions s':>10} {'check s':>8} {'ratio':>6} {'diagnosed s':>11} {'diag. sessions':>14} "
          f"{'bisection':>9}")
    for layers in args.layers:
        model = qdq_int4(decoder(args.hidden, layers))
        plain, full = [], []
        for _ in range(args.repeats):
            plain.append(runtime_parity(model, diagnose=False))
            full.append(runtime_parity(model))
        sessions = statistics.median(r.cost["compared_sessions_seconds"] for r in plain)
        check = statistics.median(r.cost["seconds"] for r in plain)
        diagnosed = statistics.median(r.cost["seconds"] for r in full)
        last = full[-1]
        bisection = [c.bisection["sessions"] for c in last.comparisons if c.bisection]
        named = {k.name for c in last.comparisons for k in c.causes}
        print(f"{f'QDQ int4, hidden {args.hidden}, {layers} layer(s)':<28} {sessions:>10.3f} {check:>8.3f} "
              f"{check / sessions:>6.2f} {diagnosed:>11.3f} {last.cost['diagnosis_sessions']:>14} "
              f"{'/'.join(map(str, bisection)):>9}  named: {', '.join(sorted(named)) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
