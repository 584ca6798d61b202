"""An LLM-shaped float model for the int4 bridge's tests: an embedding, decoder-like blocks
(attention projections, a gated MLP), an LM head; weights drawn, seeded, from Student's t
(heavy tails, as trained LLM weights have).  Sizes are small by default (the suite's budget);
the MLP's width, 8/3 of hidden rounded to 8, is not a multiple of 32 or 128, so K is padded
there, as in real models."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def decoder_model(hidden: int = 128, layers: int = 2, vocab: int = 512, seed: int = 0, df: float = 3.0):
    rng = np.random.default_rng(seed)
    ffn = int(8 * hidden / 3) // 8 * 8
    inits, nodes = [], []

    def weight(name, rows, cols):
        w = rng.standard_t(df, (rows, cols)) / np.sqrt(rows) * 0.5
        inits.append(numpy_helper.from_array(w.astype(np.float32), name))
        return name

    def node(op, inputs, out, **attrs):
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    inits += [numpy_helper.from_array(np.array(1 / np.sqrt(hidden), np.float32), "inv_sqrt_d"),
              numpy_helper.from_array(np.ones(hidden, np.float32), "ln_gamma"),
              numpy_helper.from_array(np.zeros(hidden, np.float32), "ln_beta")]
    x = node("Gather", [weight("embed", vocab, hidden), "input_ids"], "embedded")
    for i in range(layers):
        p = f"layer{i}"
        h = node("LayerNormalization", [x, "ln_gamma", "ln_beta"], f"{p}/ln1", axis=-1)
        q, k, v = (node("MatMul", [h, weight(f"{p}/w{n}", hidden, hidden)], f"{p}/{n}") for n in "qkv")
        scores = node("Mul", [node("MatMul", [q, node("Transpose", [k], f"{p}/kt", perm=[0, 2, 1])], f"{p}/qk"),
                              "inv_sqrt_d"], f"{p}/scores")
        attn = node("MatMul", [node("Softmax", [scores], f"{p}/probs", axis=-1), v], f"{p}/attn")
        x = node("Add", [x, node("MatMul", [attn, weight(f"{p}/wo", hidden, hidden)], f"{p}/o")], f"{p}/res1")
        h = node("LayerNormalization", [x, "ln_gamma", "ln_beta"], f"{p}/ln2", axis=-1)
        gate = node("MatMul", [h, weight(f"{p}/w_gate", hidden, ffn)], f"{p}/gate")
        up = node("MatMul", [h, weight(f"{p}/w_up", hidden, ffn)], f"{p}/up")
        act = node("Mul", [node("Mul", [gate, node("Sigmoid", [gate], f"{p}/sig")], f"{p}/silu"), up], f"{p}/act")
        x = node("Add", [x, node("MatMul", [act, weight(f"{p}/w_down", ffn, hidden)], f"{p}/down")], f"{p}/res2")
    node("MatMul", [x, weight("lm_head", hidden, vocab)], "logits")
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def ort_quantize(model, fmt: str, bits: int, block: int, sym: bool):
    """ONNX Runtime's own MatMulNBitsQuantizer on a copy (it changes the model it is given), format
    "QOperator" (MatMulNBits, and GatherBlockQuantized for 4 bits) or "QDQ" (DequantizeLinear + MatMul)."""
    import logging

    import onnx
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    ops = ("MatMul", "Gather") if fmt == "QOperator" and bits == 4 else ("MatMul",)
    config = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=sym, bits=bits, op_types_to_quantize=ops,
                                          quant_format=getattr(QuantFormat, fmt))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    logging.disable(logging.INFO)  # (it logs a line per node)
    try:
        quantizer = MatMulNBitsQuantizer(copy, algo_config=config)
        quantizer.process()
    finally:
        logging.disable(logging.NOTSET)
    return quantizer.model.model
