"""Small float models for the quantizer's tests, with seeded heavy-tailed weights, and the weight
the graph gives back for a quantized one (loaded by tests/conftest.py as the module `quantize_models`)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto as T, helper, numpy_helper as nh

FLOAT_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def dequantized(q, dtype=None) -> np.ndarray:
    """The weight the graph gives back for a QuantizedWeight `q`, by the tests' oracle (independent
    of our kernel): DynamicDequantize-2 on its codes, then the Slice to the weight's length, then
    a Cast to `dtype` (default: the scales' dtype)."""
    from cases import oracle_2

    values = oracle_2(q.codes, q.scales, q.zero_points, "per_group", group_shape=q.group_shape)
    return np.take(values, np.arange(q.length), axis=q.axis).astype(dtype or q.scales.dtype)


def heavy(shape, seed=0, df=4, scale=0.02, dtype=np.float32) -> np.ndarray:
    """Student-t weights, the shape real LLM weights have."""
    return (np.random.default_rng(seed).standard_t(df, size=shape) * scale).astype(dtype)


def mlp(k=256, n=192, vocab=64, dtype=np.float32, seed=0, opset=21) -> onnx.ModelProto:
    """ids -> Gather(E [vocab, k]) -> MatMul(W1 [k, n]) -> Relu -> Gemm(W2 [k, n], transB=1) -> y [batch, k]."""
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["x"], name="embed"),
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "W2"], ["y"], name="fc2", transB=1),
    ]
    inits = [nh.from_array(heavy((vocab, k), seed, dtype=dtype), "E"), nh.from_array(heavy((k, n), seed + 1, dtype=dtype), "W1"),
             nh.from_array(heavy((k, n), seed + 2, dtype=dtype), "W2")]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("ids", T.INT64, ["batch"])],
                          [helper.make_tensor_value_info("y", elem, ["batch", k])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


@st.composite
def extreme_weights(draw, max_rows=40, max_columns=4):
    """[k, n] finite weights of one float dtype mixing its largest values, values near them,
    subnormals, zeros of both signs and ordinary values; of both signs or of one."""
    name = draw(st.sampled_from(sorted(FLOAT_DTYPES)))
    dtype = FLOAT_DTYPES[name]
    info = ml_dtypes.finfo(dtype)
    top, tiny = float(info.max), float(info.smallest_subnormal)
    values = st.one_of(
        st.sampled_from([top, -top, top / 2, -top / 3, tiny, -tiny, 0.0, -0.0, 1.0, -0.02]),
        st.floats(-top, top, allow_nan=False, width={"float32": 32, "float16": 16}.get(name, 64)),
        st.floats(-1e-30, 1e-30),
    )
    k, n = draw(st.integers(1, max_rows)), draw(st.integers(1, max_columns))
    flat = np.array(draw(st.lists(values, min_size=k * n, max_size=k * n)), np.float64).reshape(k, n)
    sign = draw(st.sampled_from(["both", "positive", "negative"]))
    if sign != "both":
        flat = np.abs(flat) * (1 if sign == "positive" else -1)
    # (clipped first: a float64 beyond the dtype's largest value would round to infinity)
    return np.clip(flat, -top, top).astype(dtype)


def exported_attention(hidden=100, vocab=50, seed=0, opset=21) -> onnx.ModelProto:
    """A one-head attention block as paddle2onnx, tf2onnx and jax2tf write them: every weight a
    Constant node (no initializer), the query's behind an Identity, and two MatMuls whose B is an
    activation (Q @ K^T, attention @ V), with `hidden` (100: shorter than a group of 128) as K:
    ids [1, seq] -> Gather(E [vocab, hidden]) -> attention -> MatMul(Wo [hidden, vocab]) -> logits [1, seq, vocab]."""
    def const(name, shape, s):
        return helper.make_node("Constant", [], [name], name=f"{name}_const", value=nh.from_array(heavy(shape, seed + s), name))

    nodes = [
        const("E", (vocab, hidden), 0), const("Wq", (hidden, hidden), 1), const("Wk", (hidden, hidden), 2),
        const("Wv", (hidden, hidden), 3), const("Wo", (hidden, vocab), 4),
        helper.make_node("Identity", ["Wq"], ["Wq_id"], name="Wq_identity"),
        helper.make_node("Gather", ["E", "ids"], ["x"], name="embed"),
        helper.make_node("MatMul", ["x", "Wq_id"], ["q"], name="query"),
        helper.make_node("MatMul", ["x", "Wk"], ["k"], name="key"),
        helper.make_node("MatMul", ["x", "Wv"], ["v"], name="value"),
        helper.make_node("Transpose", ["k"], ["kT"], name="key_t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kT"], ["scores"], name="q_kt"),
        helper.make_node("Softmax", ["scores"], ["attention"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["attention", "v"], ["context"], name="attend"),
        helper.make_node("MatMul", ["context", "Wo"], ["logits"], name="head"),
    ]
    g = helper.make_graph(nodes, "exported_attention", [helper.make_tensor_value_info("ids", T.INT64, [1, "seq"])],
                          [helper.make_tensor_value_info("logits", T.FLOAT, [1, "seq", vocab])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def stack(layers=6, hidden=512, seed=0) -> onnx.ModelProto:
    """x -> MatMul -> MatMul -> ...: `layers` float32 weights of hidden x hidden (1 MiB each at 512)."""
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"layer{i}"))
        inits.append(nh.from_array(heavy((hidden, hidden), seed + i, scale=1 / np.sqrt(hidden)), f"w{i}"))
        prev = f"h{i}"
    g = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", T.FLOAT, ["n", hidden])],
                          [helper.make_tensor_value_info(prev, T.FLOAT, ["n", hidden])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


# (the calibrated methods' tests: gptq, scale estimation)
def correlated(m: int, k: int, seed: int) -> np.ndarray:
    """Rows [m, k] whose channels are correlated (mixed by a random matrix) and of unequal scales."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((k, k)) / np.sqrt(k) + np.eye(k)
    return (rng.standard_normal((m, k)) @ mix * rng.uniform(0.2, 3.0, k)).astype(np.float32)


def two_layers(k=64, n=48, seed=0) -> onnx.ModelProto:
    """x [batch, k] -> MatMul(W1 [k, n]) -> y1; x -> Gemm(W2 [n, k], transB=1) -> y2: x = I gives
    each dequantized weight back exactly (y1 = W1', y2 = W2'^T), on any engine."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["y1"], name="fc1"),
             helper.make_node("Gemm", ["x", "W2"], ["y2"], name="fc2", transB=1)]
    inits = [nh.from_array(rng.standard_normal((k, n)).astype(np.float32), "W1"),
             nh.from_array(rng.standard_normal((n, k)).astype(np.float32), "W2")]
    g = helper.make_graph(nodes, "two", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", k])],
                          [helper.make_tensor_value_info("y1", T.FLOAT, ["batch", n]),
                           helper.make_tensor_value_info("y2", T.FLOAT, ["batch", n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def assert_two_layers_give_back(out, emit: str, want: dict) -> None:
    """The written two_layers file `out` at x = I gives `want`'s dequantized W1 and W2 back bit for
    bit: on our reference engine and ONNX Runtime (--emit dyndq), else the file as written on ONNX
    Runtime at its basic optimizations (as dyndq runs it: the extended ones fuse MatMuls)."""
    import onnxruntime as ort

    import dyndq

    eye = {"x": np.eye(want["W1"].shape[0], dtype=np.float32)}
    if emit == "dyndq":
        written = dyndq.load_model(str(out))
        runs = [dyndq.run(written, eye, engine=e) for e in ("reference", "onnxruntime")]
    else:
        basic = ort.SessionOptions()
        basic.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        session = ort.InferenceSession(str(out), basic, providers=["CPUExecutionProvider"])
        runs = [dict(zip(["y1", "y2"], session.run(["y1", "y2"], eye)))]
    for got in runs:
        np.testing.assert_array_equal(got["y1"].view(np.uint32), want["W1"].view(np.uint32))
        np.testing.assert_array_equal(got["y2"].view(np.uint32), want["W2"].T.view(np.uint32))


def assert_same_initializers(written: onnx.ModelProto, in_memory: onnx.ModelProto) -> None:
    """The same initializers, by name, byte for byte."""
    got = {t.name: nh.to_array(t) for t in written.graph.initializer}
    want = {t.name: nh.to_array(t) for t in in_memory.graph.initializer}
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name].view(np.uint8), want[name].view(np.uint8))


def with_float_weights(out: onnx.ModelProto, made: dict, opset_import) -> onnx.ModelProto:
    """A copy of the quantized `out` with each weight's DynamicDequantize (and the Slice and Cast after
    it) gone and `made` (name -> array, e.g. "W_dequantized") given as initializers in their place,
    under `opset_import` (the float model's): a float model of the quantized one's graph."""
    f = onnx.ModelProto()
    f.CopyFrom(out)
    dropped = set()
    for n in f.graph.node:
        if n.op_type == "DynamicDequantize" or (n.op_type in ("Slice", "Cast") and n.input[0] in dropped):
            dropped.update(n.output)
    keep = [n for n in f.graph.node if not dropped & set(n.output)]
    del f.graph.node[:]
    f.graph.node.extend(keep)
    f.graph.initializer.extend(nh.from_array(a, name) for name, a in made.items())
    del f.opset_import[:]
    f.opset_import.extend(opset_import)
    return f
