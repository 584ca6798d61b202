"""No false alarm on float-only graphs: a corpus of varied float32 graphs (MatMul/Gemm, Softmax,
LayerNormalization, Gelu, residual adds; the decomposed forms ONNX Runtime fuses, so its
rewrites are on trial too) agrees with the reference engine at every ONNX Runtime level, within
the tolerance for float sums in another order; on OpenVINO, where its defaults differ, the only
cause is its bf16 inference precision (a real change of arithmetic, named), and with float32
precision it agrees."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dyndq.parity import example_feeds, runtime_parity
from dyndq.parity import engines
from dyndq.parity.engines import Tweak
from dyndq.parity.metrics import compare
from dyndq.parity.ort_rewrites import node_types


class Graph:
    """A float32 graph written node by node: weights from N(0, 1/fan_in), one input x[batch, seq, d]."""

    def __init__(self, d: int, seed: int):
        self.d, self.rng, self.nodes, self.inits, self.k = d, np.random.default_rng(seed), [], [], 0

    def const(self, array) -> str:
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def const_int(self, values) -> str:
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def weight(self, rows, cols) -> str:
        return self.const(self.rng.standard_normal((rows, cols)) / np.sqrt(rows))

    def op(self, op_type, *inputs, **attrs) -> str:
        self.k += 1
        out = f"{op_type.lower()}{self.k}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=f"n{self.k}", **attrs))
        return out

    def model(self, y: str, out_name: str = "y"):
        self.nodes.append(helper.make_node("Identity", [y], [out_name], name="out"))
        graph = helper.make_graph(self.nodes, "corpus", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                        [2, "seq", self.d])],
                                  [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, None)], self.inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def layer_norm_decomposed(g: Graph, x: str) -> str:
    last = g.const_int([-1])
    centred = g.op("Sub", x, g.op("ReduceMean", x, last, keepdims=1))
    var = g.op("ReduceMean", g.op("Pow", centred, g.const(2.0)), last, keepdims=1)
    norm = g.op("Div", centred, g.op("Sqrt", g.op("Add", var, g.const(1e-5))))
    return g.op("Add", g.op("Mul", norm, g.const(1 + 0.1 * g.rng.standard_normal(g.d))), g.const(np.zeros(g.d)))


def gelu_erf_decomposed(g: Graph, x: str) -> str:
    erf = g.op("Erf", g.op("Div", x, g.const(np.sqrt(2.0))))
    return g.op("Mul", g.op("Mul", x, g.op("Add", erf, g.const(1.0))), g.const(0.5))


def gelu_tanh_decomposed(g: Graph, x: str) -> str:
    cube = g.op("Pow", x, g.const(3.0))
    inner = g.op("Mul", g.op("Add", x, g.op("Mul", cube, g.const(0.044715))), g.const(np.sqrt(2 / np.pi)))
    return g.op("Mul", g.op("Mul", x, g.const(0.5)), g.op("Add", g.op("Tanh", inner), g.const(1.0)))


def mlp_gemm(d, seed):
    """Gemm (transB) + bias, Relu, MatMul + Add (fused by ONNX Runtime), residual add."""
    g = Graph(d, seed)
    flat = g.op("Reshape", "x", g.const_int([-1, d]))
    h = g.op("Relu", g.op("Gemm", flat, g.weight(4 * d, d), g.const(np.zeros(4 * d)), transB=1))
    y = g.op("Add", g.op("MatMul", h, g.weight(4 * d, d)), g.const(0.1 * g.rng.standard_normal(d)))
    return g.model(g.op("Add", y, flat))


def attention(d, seed):
    """Softmax(q k^T / sqrt(d)) v, then a residual add and LayerNormalization (the op)."""
    g = Graph(d, seed)
    q, k, v = (g.op("MatMul", "x", g.weight(d, d)) for _ in range(3))
    scores = g.op("Mul", g.op("MatMul", q, g.op("Transpose", k, perm=[0, 2, 1])), g.const(1 / np.sqrt(d)))
    attn = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    return g.model(g.op("LayerNormalization", g.op("Add", "x", attn), g.const(np.ones(d)), g.const(np.zeros(d)),
                        axis=-1))


def fused_forms(d, seed):
    """The decomposed LayerNorm, erf Gelu (with a bias before it) and tanh Gelu ONNX Runtime fuses into one node each."""
    g = Graph(d, seed)
    h = layer_norm_decomposed(g, "x")
    h = gelu_erf_decomposed(g, g.op("Add", g.op("MatMul", h, g.weight(d, 2 * d)), g.const(np.zeros(2 * d))))
    h = gelu_tanh_decomposed(g, g.op("MatMul", h, g.weight(2 * d, d)))
    return g.model(g.op("Add", h, "x"))


def gelu_op_and_logits(d, seed):
    """Gelu (the op, both approximations), LayerNormalization, then logits over a vocabulary."""
    g = Graph(d, seed)
    h = g.op("Gelu", g.op("MatMul", "x", g.weight(d, d)))
    h = g.op("Gelu", g.op("Add", h, "x"), approximate="tanh")
    h = g.op("LayerNormalization", h, g.const(np.ones(d)), g.const(np.zeros(d)), axis=-1)
    return g.model(g.op("MatMul", h, g.weight(d, 3 * d)), "logits")


def log_softmax_head(d, seed):
    """Gemm head and LogSoftmax: a distribution's log, compared with KL."""
    g = Graph(d, seed)
    flat = g.op("Reshape", "x", g.const_int([-1, d]))
    return g.model(g.op("LogSoftmax", g.op("Gemm", flat, g.weight(d, 2 * d), g.const(np.zeros(2 * d))), axis=-1))


CORPUS = [(build, d, seed) for build in (mlp_gemm, attention, fused_forms, gelu_op_and_logits, log_softmax_head)
          for d, seed in ((16, 0), (48, 1), (96, 2))]
IDS = [f"{build.__name__}-{d}" for build, d, _ in CORPUS]


@pytest.mark.parametrize("build, d, seed", CORPUS, ids=IDS)
def test_float_graphs_agree_at_every_onnxruntime_level(build, d, seed):
    model = build(d, seed)
    report = runtime_parity(model, seed=seed)
    assert report.agrees and len(report.comparisons) == 4, report.lines()


@pytest.mark.parametrize("build", [fused_forms, mlp_gemm, attention])
def test_the_corpus_is_rewritten_by_onnxruntime(build):
    """The graphs are on trial with ONNX Runtime's rewrites, not beside them: at level all it fuses them."""
    model = build(16, 0)
    graphs: list = []
    engines.run_onnxruntime(model, "all", example_feeds(model), [model.graph.output[0].name], optimized=graphs)
    before, after = node_types(model.graph), node_types(graphs[0].graph)
    assert before != after
    if build is fused_forms:
        assert after["LayerNormalization"] == 1 and after["com.microsoft::Gelu"] + after["com.microsoft::BiasGelu"] == 1
        assert after["com.microsoft::FastGelu"] == 1


@pytest.mark.openvino
@pytest.mark.parametrize("build, d, seed", CORPUS[::3], ids=IDS[::3])
def test_float_graphs_on_openvino_differ_only_by_its_bf16_inference_precision(build, d, seed):
    model = build(d, seed)
    report = runtime_parity(model, engines=["openvino"], seed=seed)
    for c in report.differing:
        assert [k.name for k in c.causes] == ["INFERENCE_PRECISION_HINT"], c.lines()
    feeds = example_feeds(model, seed)
    name = model.graph.output[0].name
    exact = engines.run_openvino(model, feeds, [name], Tweak(config={"INFERENCE_PRECISION_HINT": "f32"}))
    assert compare(name, exact[name], engines.run_reference(model, feeds)[name]).agrees
