"""A checkpoint weight read by Gemm with transB=0 (B stored [in, out], as a MatMul's): imported
transposed from the checkpoint's [out, in], its values gguf's dequantization bit for bit on the
reference engine and on ONNX Runtime (through every emit's export), and the Gemm's output the
float model's holding those weights; by name for a square weight (the reader decides, not the
shape) and by shape (or --names) for another.  Q8_0 by gguf's quantizer, Q4_K drawn blocks."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
from engines import run_onnxruntime
from gguf_blocks import gguf, qtype
from gguf_models import bits, k_quant, write_gguf

N_IN, N_OUT = 256, 64


def gemm_model(weights: dict[str, np.ndarray], trans_b: dict[str, int]) -> onnx.ModelProto:
    """y_name = Gemm(x, name, transB) + bias for each weight; each weight's value an output too."""
    nodes, outputs, inits = [], [], []
    for name, w in weights.items():
        n_out = w.shape[1] if trans_b[name] == 0 else w.shape[0]
        bias = np.linspace(-0.5, 0.5, n_out, dtype=np.float32)
        inits += [numpy_helper.from_array(w, name), numpy_helper.from_array(bias, f"{name}.bias")]
        nodes.append(helper.make_node("Gemm", ["x", name, f"{name}.bias"], [f"y_{name}"], transB=trans_b[name]))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [4, n_out]))
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, N_IN])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def probe(model: onnx.ModelProto, shapes: dict[str, tuple]) -> onnx.ModelProto:
    """The model with the weights' values (of those shapes) as its outputs too."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in shapes.items())
    return out


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_K"])
def test_a_weight_read_by_gemm_with_trans_b_0_is_imported_transposed_bit_for_bit(tmp_path, kind):
    rng = np.random.default_rng(3)
    # "square": 256 x 256, matched by name (its orientation from the reader, transB=0: transposed);
    # "wide": [in, out] = [256, 64], matched by shape (the checkpoint's [64, 256] transposed)
    square = (rng.standard_normal((N_IN, N_IN)) * 0.05).astype(np.float32)
    wide = (rng.standard_normal((N_IN, N_OUT)) * 0.05).astype(np.float32)
    raw = {}
    for name, w in (("square", square), ("wide", wide)):
        stored = np.ascontiguousarray(w.T)  # (the checkpoint's [out, in])
        raw[name] = k_quant(stored.shape, kind) if kind.endswith("_K") else gguf.quants.quantize(stored, qtype(kind))
    write_gguf(tmp_path / "g.gguf", {"square": (kind, raw["square"]), "blk.0.ffn_down.weight": (kind, raw["wide"])})
    model = gemm_model({"square": square, "wide": wide}, {"square": 0, "wide": 0})
    # (K-quant blocks drawn, not quantized from the weight: nothing close to it to match by shape)
    names = {"blk.0.ffn_down.weight": "wide"} if kind.endswith("_K") else None
    out, report = dyndq.import_weights(model, tmp_path / "g.gguf", names=names)
    rows = {r.weight: r for r in report.imported}
    assert rows["square"].how == "by name" and rows["square"].orientation == "transposed"
    assert rows["wide"].how == ("by --names" if names else "by shape") and rows["wide"].orientation == "transposed"
    want = {name: np.ascontiguousarray(gguf.quants.dequantize(raw[name], qtype(kind)).astype(np.float32).T)
            for name in ("square", "wide")}
    looked = probe(out, {name: value.shape for name, value in want.items()})
    for engine, got in (("reference", dyndq.run(looked, {"x": np.zeros((4, N_IN), np.float32)})),
                        ("onnxruntime", dict(zip([o.name for o in looked.graph.output], run_onnxruntime(
                            dyndq.export(looked, target="onnxruntime"), {"x": np.zeros((4, N_IN), np.float32)}))))):
        for name, value in want.items():
            assert got[name].shape == value.shape, (engine, name)
            assert (bits(got[name]) == bits(value)).all(), f"{name} on {engine}"
    # the Gemm's outputs: the float model holding gguf's weights (the same operands: bit for bit on
    # the reference engine; ONNX Runtime's Gemm may sum a stored weight in another order: 1e-5)
    oracle = gemm_model(want, {"square": 0, "wide": 0})
    x = {"x": np.linspace(-1, 1, 4 * N_IN, dtype=np.float32).reshape(4, N_IN)}
    ours, theirs = dyndq.run(out, x), dyndq.run(oracle, x)
    for name in theirs:
        assert (bits(ours[name]) == bits(theirs[name])).all(), name
    for emit in ("onnx", "onnxruntime"):
        exported = dyndq.export(out, target=emit)
        for value, name in zip(run_onnxruntime(exported, x), [o.name for o in out.graph.output]):
            np.testing.assert_allclose(value, theirs[name], rtol=1e-5, atol=1e-5 * float(np.abs(theirs[name]).max()))
