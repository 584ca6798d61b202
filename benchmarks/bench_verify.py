"""`dyndq verify`'s cost against issue 43's bound: at most 3x running both models once on each engine.

    .venv/bin/python benchmarks/bench_verify.py [--layers N] [--only made|minilm]

For each case, a float model and its 4-bit quantization by ONNX Runtime's MatMulNBitsQuantizer
(block 32, asymmetric): the time of running both models once on each engine verify compares on
(the reference engine and ONNX Runtime: a session made and one sample run, per model and engine),
then `dyndq.verify`'s time on that one sample (weights and outputs), and its weights part alone.
Cases: all-MiniLM-L6-v2's ONNX export (`make test-trained-export`'s .test-models/minilm.onnx, or
$DYNDQ_TEST_MODELS'; skipped, saying so, where it is not there), and a made model of N MatMul
layers of 64 x 64 (many small weights: the cost that grows with the weights' count).  Each time is
the best of 2 (the machine is shared).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq.runner import Runner

ROOT = Path(__file__).resolve().parents[1]


def made(layers: int) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(0)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), f"W{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [f"h{i}"], name=f"fc{i}"))
        x = f"h{i}"
    graph = helper.make_graph(nodes, "made", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [4, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return model, {"x": rng.standard_normal((4, 64)).astype(np.float32)}


def minilm() -> tuple[onnx.ModelProto, dict] | None:
    path = Path(os.environ.get("DYNDQ_TEST_MODELS", ROOT / ".test-models")) / "minilm.onnx"
    if not path.exists():
        return None
    model = onnx.load(str(path))
    ids = np.random.default_rng(0).integers(1000, 2000, (4, 16)).astype(np.int64)
    return model, {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def quantized(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # (ONNX Runtime's quantizer changes the model it is given)
    q = MatMulNBitsQuantizer(copy, block_size=32, is_symmetric=False)
    q.process()
    return q.model.model


def best(fn, times: int = 2) -> float:
    out = []
    for _ in range(times):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return min(out)


def case(name: str, model: onnx.ModelProto, feed: dict) -> None:
    q = quantized(model)
    weights = sum(1 for t in model.graph.initializer if len(t.dims) >= 2)

    def both_once():
        for engine in ("reference", "onnxruntime"):
            for m in (model, q):
                Runner(m, engine)(feed)  # (a new session each time: as verify makes them)

    runs = best(both_once)
    full = best(lambda: dyndq.verify(q, model, inputs=[feed]))
    only = best(lambda: dyndq.verify(q, model, outputs=False))
    print(f"{name}: {weights} weights; both models once on each engine {runs:.2f} s; verify {full:.2f} s "
          f"({full / runs:.1f}x), its weights alone {only:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=200)
    parser.add_argument("--only", choices=("made", "minilm"))
    args = parser.parse_args()
    logging.disable(logging.INFO)  # (ONNX Runtime's quantizer logs a line per node)
    print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}, "
          f"onnxruntime {__import__('onnxruntime').__version__}")
    if args.only != "minilm":
        case(f"made ({args.layers} MatMul layers of 64 x 64)", *made(args.layers))
    if args.only != "made":
        found = minilm()
        if found is None:
            print("minilm: skipped: no minilm.onnx (make test-trained-export makes it)")
        else:
            case("all-MiniLM-L6-v2", *found)


if __name__ == "__main__":
    main()
