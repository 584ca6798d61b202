"""A small float model (an embedding, a square weight, weights of 2 and 4 blocks of 32, logits as
long as the embedding has rows), ONNX Runtime's MatMulNBits quantization of it, and copies of that
with one fault planted each, for dyndq.verify's tests."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper as nh

V, D, H = 64, 64, 128  # the square weight W1 [D, D]; W2 [D, H] has 4 blocks of 32 along K in W3 [H, V]


def float_model(seed: int = 0, w1=None) -> onnx.ModelProto:
    """ids -> Gather(E [V, D]) -> MatMul(W1 [D, D]) -> Relu -> MatMul(W2 [D, H]) -> Relu -> MatMul(W3 [H, V]) = logits."""
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) * 0.1).astype(np.float32)  # noqa: E731
    weights = {"E": w(V, D), "W1": w(D, D), "W2": w(D, H), "W3": w(H, V)}
    if w1 is not None:
        weights["W1"] = w1
    nodes = [helper.make_node("Gather", ["E", "ids"], ["x"], name="embed"),
             helper.make_node("MatMul", ["x", "W1"], ["h1"], name="fc1"), helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("MatMul", ["r1", "W2"], ["h2"], name="fc2"), helper.make_node("Relu", ["h2"], ["r2"]),
             helper.make_node("MatMul", ["r2", "W3"], ["logits"], name="fc3")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch"])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", V])],
                          [nh.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def ort_quantized(model: onnx.ModelProto, **kw) -> onnx.ModelProto:
    """ONNX Runtime's MatMulNBitsQuantizer on a copy of `model` (it changes the model it is given)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # (it changes the model it is given)
    kw.setdefault("op_types_to_quantize", ("MatMul",))
    q = MatMulNBitsQuantizer(copy, **kw)
    q.process()
    return q.model.model


def nbits(model=None, **kw):
    return ort_quantized(model or float_model(), bits=4, block_size=32, is_symmetric=False, **kw)


def node_of(model, weight: str) -> onnx.NodeProto:
    """The MatMulNBits node quantizing `weight` (its B input is named after it)."""
    return next(n for n in model.graph.node if n.op_type == "MatMulNBits" and n.input[1].startswith(weight + "_"))


def init(model, name) -> onnx.TensorProto:
    return next(t for t in model.graph.initializer if t.name == name)


def replace(model, name, array) -> None:
    init(model, name).CopyFrom(nh.from_array(np.ascontiguousarray(array), name))


def unpack(packed: np.ndarray) -> np.ndarray:
    return np.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def pack(codes: np.ndarray) -> np.ndarray:
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)


def copy_of(model):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def nibbles_swapped(model, weight):
    out = copy_of(model)
    b = nh.to_array(init(out, node_of(out, weight).input[1]))
    replace(out, node_of(out, weight).input[1], ((b >> 4) | (b << 4)).astype(np.uint8))
    return out


def zero_points_plus_one(model, weight):
    out = copy_of(model)
    name = node_of(out, weight).input[3]
    zp = unpack(nh.to_array(init(out, name)))
    replace(out, name, pack(np.where(zp < 15, zp + 1, zp).astype(np.uint8)))
    return out


def blocks_reversed(model, weight):
    out = copy_of(model)
    node = node_of(out, weight)
    n_rows = next(a.i for a in node.attribute if a.name == "N")
    b = nh.to_array(init(out, node.input[1]))
    replace(out, node.input[1], b[:, ::-1])
    s = nh.to_array(init(out, node.input[2]))
    replace(out, node.input[2], s.reshape(n_rows, -1)[:, ::-1].reshape(s.shape))
    zp = nh.to_array(init(out, node.input[3]))
    blocks = b.shape[1]
    z = unpack(zp)[:, :blocks][:, ::-1]
    replace(out, node.input[3], pack(z).reshape(zp.shape))
    return out


def transposed_square(model, weight, source):
    """The square weight's quantized tensors taken from ONNX Runtime's quantization of its transpose."""
    out = copy_of(model)
    wrong = nbits(float_model(w1=np.ascontiguousarray(nh.to_array(init(source, weight)).T)))
    for i in (1, 2, 3):
        name = node_of(out, weight).input[i]
        replace(out, name, nh.to_array(init(wrong, node_of(wrong, weight).input[i])))
    return out


def requantized(model, weight, source):
    """One weight's tensors from ONNX Runtime's quantization of that weight slightly moved (1e-3 of
    its spread): a few codes a level off, the scales a little off."""
    out = copy_of(model)
    w = nh.to_array(init(source, weight))
    moved = copy_of(source)
    rng = np.random.default_rng(7)
    replace(moved, weight, (w + rng.standard_normal(w.shape).astype(np.float32) * 1e-3 * w.std()).astype(np.float32))
    other = nbits(moved)
    for i in (1, 2, 3):
        replace(out, node_of(out, weight).input[i], nh.to_array(init(other, node_of(other, weight).input[i])))
    return out




def accuracy_level_set(model, weight, level: int = 4):
    """The MatMulNBits node of `weight` made to compute at `level` (4: ONNX Runtime quantizes its input
    A to int8 per block on a CPU with int8 dot products); its tensors untouched."""
    from onnx import helper

    out = copy_of(model)
    node = node_of(out, weight)
    kept = [a for a in node.attribute if a.name != "accuracy_level"]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute("accuracy_level", level)])
    return out
