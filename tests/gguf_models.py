"""A small llama-like float ONNX model with torch's names, and GGUF files of its weights as
llama.cpp's converter writes them (its names, its Q/K row permutation), for the import's tests.

The model (`float_model`): ids -> Gather(model.embed_tokens.weight) -> Mul(model.norm.weight) = h;
q = MatMul(h, Transpose(q_proj.weight)) as torch exports; k = MatMul(h, k_proj.weight stored
[in, out]); ffn = MatMul(Gemm(h, up_proj.weight, transB=1), an unnamed [in, out] weight);
logits = MatMul(h, Transpose(lm_head.weight)), or of the embedding itself (`tied`).
`write_gguf` quantizes each weight with gguf's own quantizer, permuting Q and K's rows first as
llama.cpp's converter does; `expected` is gguf's dequantization of each, un-permuted and oriented
as the model reads it (the permutation undone by the inverse reshape, written here apart from
dyndq's argsort).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import gguf_blocks
from gguf_blocks import gguf, qtype

V, D, HEADS, KV_HEADS, FFN, T = 64, 256, 4, 2, 256, 5
HEAD = D // HEADS
Q, K = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
UP, DOWN = "model.layers.0.mlp.up_proj.weight", "onnx::MatMul_9"
EMBED, NORM, HEAD_W = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"


def source_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """The source model's weights in torch's order ([out, in])."""
    rng = np.random.default_rng(seed)
    w = lambda *s: (rng.standard_normal(s) * 0.05).astype(np.float32)  # noqa: E731
    return {"embed": w(V, D), "norm": (1 + 0.1 * rng.standard_normal(D)).astype(np.float32), "q": w(D, D),
            "k": w(KV_HEADS * HEAD, D), "up": w(FFN, D), "down": w(D, FFN), "lm_head": w(V, D)}


def float_model(src: dict, *, tied: bool = False, names: dict | None = None, extra: bool = False) -> onnx.ModelProto:
    """The float model holding `src` (names renamed by `names`: torch name -> another); `extra`
    adds a float bias no checkpoint tensor holds."""
    n = {k: (names or {}).get(k, k) for k in (Q, K, UP, DOWN, EMBED, NORM, HEAD_W)}
    inits = [numpy_helper.from_array(src["embed"], n[EMBED]), numpy_helper.from_array(src["norm"], n[NORM]),
             numpy_helper.from_array(src["q"], n[Q]), numpy_helper.from_array(np.ascontiguousarray(src["k"].T), n[K]),
             numpy_helper.from_array(src["up"], n[UP]), numpy_helper.from_array(np.ascontiguousarray(src["down"].T), n[DOWN]),
             numpy_helper.from_array(np.array([T, D], np.int64), "flat")]
    nodes = [helper.make_node("Gather", [n[EMBED], "ids"], ["e"]), helper.make_node("Mul", ["e", n[NORM]], ["h"]),
             helper.make_node("Transpose", [n[Q]], ["qT"], perm=[1, 0]), helper.make_node("MatMul", ["h", "qT"], ["q"]),
             helper.make_node("MatMul", ["h", n[K]], ["k"]), helper.make_node("Reshape", ["h", "flat"], ["h2"]),
             helper.make_node("Gemm", ["h2", n[UP]], ["u"], transB=1), helper.make_node("MatMul", ["u", n[DOWN]], ["ffn"])]
    head = n[EMBED] if tied else n[HEAD_W]
    if not tied:
        inits.append(numpy_helper.from_array(src["lm_head"], n[HEAD_W]))
    nodes += [helper.make_node("Transpose", [head], ["headT"], perm=[1, 0]), helper.make_node("MatMul", ["h", "headT"], ["logits"])]
    outputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, T, D]),
               helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, T, KV_HEADS * HEAD]),
               helper.make_tensor_value_info("ffn", TensorProto.FLOAT, [T, D]),
               helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, T, V])]
    if extra:
        inits.append(numpy_helper.from_array(np.linspace(-1, 1, D, dtype=np.float32), "extra.bias"))
        nodes.append(helper.make_node("Add", ["ffn", "extra.bias"], ["ffn_biased"]))
        outputs.append(helper.make_tensor_value_info("ffn_biased", TensorProto.FLOAT, [T, D]))
    graph = helper.make_graph(nodes, "llama_like", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, T])],
                              outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's reordering of Q and K's rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Its inverse: the same reshape, swapped back."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


TYPES = {"token_embd.weight": "Q8_0", "blk.0.attn_q.weight": "Q8_0", "blk.0.attn_k.weight": "Q4_0",
         "blk.0.ffn_up.weight": "Q5_K", "blk.0.ffn_down.weight": "Q4_1", "output_norm.weight": "F32",
         "output.weight": "Q5_0", "blk.0.attn_v.weight": "Q8_0"}


def gguf_tensors(src: dict, *, tied: bool = False) -> dict[str, tuple[str, np.ndarray]]:
    """GGUF name -> (type, raw bytes) as llama.cpp's converter and quantizer would write them."""
    rng = np.random.default_rng(9)
    floats = {"token_embd.weight": src["embed"], "blk.0.attn_q.weight": permute(src["q"], HEADS),
              "blk.0.attn_k.weight": permute(src["k"], KV_HEADS), "blk.0.ffn_up.weight": src["up"],
              "blk.0.ffn_down.weight": src["down"], "output_norm.weight": src["norm"],
              "blk.0.attn_v.weight": (rng.standard_normal((KV_HEADS * HEAD, D)) * 0.05).astype(np.float32)}
    if not tied:
        floats["output.weight"] = src["lm_head"]
    out = {}
    for name, values in floats.items():
        kind = TYPES[name]
        out[name] = (kind, values if kind == "F32" else k_quant(values.shape, kind) if kind.endswith("_K")
                     else gguf.quants.quantize(values, qtype(kind)))
    return out


def k_quant(shape, kind: str) -> np.ndarray:
    """Raw K-quant blocks (gguf has no quantizer for them): random codes and sub-block scales, the
    float16 d and dmin small, so that the values are those of a weight."""
    block, size = gguf.GGML_QUANT_SIZES[qtype(kind)]
    rows, n = shape[0], shape[1] // block
    data = np.random.default_rng(4).integers(0, 256, (rows, n, size), dtype=np.uint8)
    data[..., 0:4] = np.array([2e-4, 1e-4], np.float16).view(np.uint8)
    return data.reshape(rows, n * size)


def write_gguf(path, tensors: dict, architecture: str = "llama") -> None:
    """A GGUF file of `tensors` by gguf's own writer, with the llama metadata the import reads."""
    gguf_blocks.write_gguf(path, tensors, architecture, block_count=1, head_count=HEADS, head_count_kv=KV_HEADS)


def llama_file(folder) -> tuple[dict, dict, object]:
    """(the source weights, their GGUF tensors, the GGUF file written in `folder`): the tests' llama."""
    src = source_weights()
    tensors = gguf_tensors(src)
    write_gguf(folder / "m.gguf", tensors)
    return src, tensors, folder / "m.gguf"


def bits(a) -> np.ndarray:
    """Float values as their float32 bits, to compare bit for bit."""
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def dequantized(tensors: dict, name: str) -> np.ndarray:
    kind, data = tensors[name]
    return gguf.quants.dequantize(data, qtype(kind)).astype(np.float32, copy=False)


def expected(tensors: dict, *, tied: bool = False) -> dict[str, np.ndarray]:
    """Each model weight's values after the import: gguf's dequantization, un-permuted, as the model reads it."""
    out = {EMBED: dequantized(tensors, "token_embd.weight"), NORM: dequantized(tensors, "output_norm.weight"),
           Q: unpermute(dequantized(tensors, "blk.0.attn_q.weight"), HEADS),
           K: np.ascontiguousarray(unpermute(dequantized(tensors, "blk.0.attn_k.weight"), KV_HEADS).T),
           UP: dequantized(tensors, "blk.0.ffn_up.weight"),
           DOWN: np.ascontiguousarray(dequantized(tensors, "blk.0.ffn_down.weight").T)}
    if not tied:
        out[HEAD_W] = dequantized(tensors, "output.weight")
    return out


def ids() -> dict[str, np.ndarray]:
    return {"ids": np.array([[3, 0, 63, 17, 3]], np.int64)}


def with_weights(model: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of the float model holding `weights` instead of its own."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.name in weights:
            t.CopyFrom(numpy_helper.from_array(weights[t.name], t.name))
    return out


def with_outputs(model: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy of `model` whose outputs are the values `names` (float32, each of its weight's shape)."""
    shapes = {t.name: list(t.dims) for t in float_model(source_weights()).graph.initializer}
    shapes["w_q_custom"] = shapes[Q]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    out.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in names)
    return out
