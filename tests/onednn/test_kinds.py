"""The table of oneDNN kinds (dyndq/onednn/kinds.py and its family modules): each mapped kind against
a NumPy oracle of oneDNN's documented semantics (tests/data/onednn/kinds/, on both engines);
BiasAdd and Clamp bit for bit in every float dtype (hypothesis), LayerNorm's statistics, RMSNorm
with gamma, SoftMaxBackward, SoftMax's stats, ReduceSum over no axis, f8 through ONNX's
FLOAT8E4M3FN / FLOAT8E5M2, s32 inputs of binary ops, shapes the JSON leaves unknown (rank
included) taken from the producer, and the inverses `dump` writes (Clip, Elu, Tanh,
LayerNormalization)."""
import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import TensorProto, helper, numpy_helper

import dyndq
from cases import both, graph, lt, op, same_bits
from engines import run_onnxruntime
from dyndq import onednn
from dyndq.onednn.handler import inverse_table

ENGINES = ("reference", "onnxruntime")

FLOATS = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def one_op(kind, attrs, inputs, outputs):
    """A one-op graph; inputs and outputs as (dtype, shape); attributes typed as the handler's spec."""
    spec = onednn.KINDS[kind].spec
    n = len(inputs)
    return {"version": "3.7.0", "graph": [{
        "id": 0, "name": kind.lower(), "kind": kind,
        "attrs": {k: {"type": spec[k].type, "value": v} for k, v in attrs.items()},
        "inputs": [lt(i, *x) for i, x in enumerate(inputs)], "outputs": [lt(n + i, *x) for i, x in enumerate(outputs)]}]}


def run_both(model, feeds):
    return [dyndq.run(model, feeds, engine=engine) for engine in ENGINES]


def problems_of(doc):
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(doc)
    return e.value.problems


# -- exact kinds: the same bits as NumPy's, on both engines ---------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(sorted(FLOATS)), shape=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       bounds=st.tuples(st.floats(-4, 4, width=32), st.floats(-4, 4, width=32)).map(sorted), seed=st.integers(0, 99))
def test_clamp_is_exact_in_every_float_dtype(dtype, shape, bounds, seed):
    lo, hi = bounds
    model, _ = onednn.load(one_op("Clamp", {"min": lo, "max": hi}, [(dtype, shape)], [(dtype, shape)]))
    x = (np.random.default_rng(seed).standard_normal(shape) * 3).astype(np.float32).astype(FLOATS[dtype])
    x.flat[0] = np.inf  # beyond the bounds too
    want = np.clip(x.astype(np.float32), np.float32(lo), np.float32(hi)).astype(FLOATS[dtype])
    for out in run_both(model, {model.graph.input[0].name: x}):
        [got] = out.values()
        assert same_bits(got, want)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(sorted(FLOATS)), shape=st.lists(st.integers(1, 4), min_size=2, max_size=4),
       data_format=st.sampled_from(["NXC", "NCX"]), seed=st.integers(0, 99))
def test_bias_add_is_exact_along_the_channel_axis(dtype, shape, data_format, seed):
    axis = len(shape) - 1 if data_format == "NXC" else 1
    model, _ = onednn.load(one_op("BiasAdd", {"data_format": data_format},
                                  [(dtype, shape), (dtype, [shape[axis]])], [(dtype, shape)]))
    rng = np.random.default_rng(seed)
    x, b = (rng.standard_normal(s).astype(np.float32).astype(FLOATS[dtype]) for s in (shape, [shape[axis]]))
    along = [1] * len(shape)
    along[axis] = -1
    want = (x.astype(np.float32) + b.astype(np.float32).reshape(along)).astype(FLOATS[dtype])
    for out in run_both(model, dict(zip([i.name for i in model.graph.input], (x, b)))):
        [got] = out.values()
        assert same_bits(got, want)


def test_bias_add_names_a_bias_that_is_not_one_per_channel():
    [p] = problems_of(one_op("BiasAdd", {"data_format": "NCX"}, [("f32", [2, 3, 4]), ("f32", [4])], [("f32", [2, 3, 4])]))
    assert (p.op, p.argument, p.found) == ("BiasAdd", "inputs[1]", "shape [4]") and "[3]" in p.allowed


def test_clamp_with_max_below_min_is_named():
    [p] = problems_of(one_op("Clamp", {"min": 1.0, "max": -1.0}, [("f32", [2])], [("f32", [2])]))
    assert (p.op, p.argument) == ("Clamp", "max")


# -- normalizations ---------------------------------------------------------------------------------


# float32 arithmetic summed in each engine's own order: a few ulp of float32 at the outputs' scale
RTOL, ATOL = 2.0**-18, 2.0**-18


def test_layer_norm_keeps_its_statistics_when_asked():
    """keep_stats (the default): mean and variance (biased) over the normalized dims, as oneDNN
    declares them (those dims dropped), beside dst."""
    doc = one_op("LayerNorm", {"begin_norm_axis": 1, "epsilon": 0.5},
                 [("f32", [3, 2, 4]), ("f32", [8]), ("f32", [8])], [("f32", [3, 2, 4]), ("f32", [3]), ("f32", [3])])
    model, _ = onednn.load(doc)
    feeds = onednn.example_inputs(model, seed=1)
    x, gamma, beta = feeds.values()
    mean = x.reshape(3, -1).astype(np.float64).mean(1)
    variance = x.reshape(3, -1).astype(np.float64).var(1)
    dst = (x - mean[:, None, None]) / np.sqrt(variance[:, None, None] + 0.5) * gamma.reshape(2, 4) + beta.reshape(2, 4)
    for out in run_both(model, feeds):
        got_dst, got_mean, got_var = out.values()
        np.testing.assert_allclose(got_dst, dst, rtol=RTOL * 8, atol=ATOL * 8)
        np.testing.assert_allclose(got_mean, mean, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got_var, variance, rtol=RTOL, atol=ATOL)


def test_layer_norm_without_affine_takes_src_alone():
    doc = one_op("LayerNorm", {"use_affine": False, "keep_stats": False}, [("bf16", [2, 5])], [("bf16", [2, 5])])
    model, _ = onednn.load(doc)
    feeds = onednn.example_inputs(model, seed=2)
    [x] = feeds.values()
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    for out in run_both(model, feeds):
        [got] = out.values()
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2.0**-7, atol=2.0**-7)


@pytest.mark.parametrize("inputs, outputs, argument", [
    ([("f32", [2, 4])], [("f32", [2, 4]), ("f32", [2]), ("f32", [2])], "inputs"),  # use_affine needs gamma, beta
    ([("f32", [2, 4]), ("f32", [4]), ("f32", [4])], [("f32", [2, 4])], "outputs"),  # keep_stats needs 3 outputs
    ([("f32", [2, 4]), ("f32", [3]), ("f32", [4])], [("f32", [2, 4]), ("f32", [2]), ("f32", [2])], "inputs[1]"),
])
def test_layer_norm_names_inputs_and_outputs_its_attributes_do_not_allow(inputs, outputs, argument):
    problems = problems_of(one_op("LayerNorm", {}, inputs, outputs))
    assert [(p.op, p.argument) for p in problems] == [("LayerNorm", argument)]


def test_rms_norm_over_two_dims_with_a_broadcast_gamma_in_bf16():
    doc = one_op("RMSNorm", {"begin_norm_axis": -2, "epsilon": 0.25},
                 [("bf16", [2, 3, 4]), ("f32", [1, 4])], [("bf16", [2, 3, 4])])
    model, _ = onednn.load(doc)
    feeds = onednn.example_inputs(model, seed=3)
    x, gamma = (a.astype(np.float64) for a in feeds.values())
    want = x / np.sqrt((x * x).mean(axis=(1, 2), keepdims=True) + 0.25) * gamma
    for out in run_both(model, feeds):
        [got] = out.values()
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2.0**-7, atol=2.0**-7)


def test_softmax_backward_of_a_softmax_sums_to_zero_along_its_axis():
    """The gradient of a SoftMax, at its output, has no component along the ones vector."""
    doc = one_op("SoftMaxBackward", {"axis": -1}, [("f32", [3, 6]), ("f32", [3, 6])], [("f32", [3, 6])])
    model, _ = onednn.load(doc)
    rng = np.random.default_rng(4)
    logits = rng.standard_normal((3, 6))
    dst = (np.exp(logits) / np.exp(logits).sum(1, keepdims=True)).astype(np.float32)
    diff_dst = rng.standard_normal((3, 6)).astype(np.float32)
    want = dst * (diff_dst - (diff_dst * dst).sum(1, keepdims=True))
    for out in run_both(model, dict(zip([i.name for i in model.graph.input], (diff_dst, dst)))):
        [got] = out.values()
        np.testing.assert_allclose(got, want, rtol=RTOL * 4, atol=ATOL * 4)
        assert np.abs(got.sum(1)).max() < 1e-6


# -- ReduceSum over no axis; shapes the JSON leaves unknown -----------------------------------------


def test_reduce_sum_over_no_axis_gives_src_as_it_is():
    model, _ = onednn.load(one_op("ReduceSum", {"axes": [], "keep_dims": True}, [("f32", [2, 3])], [("f32", [2, 3])]))
    feeds = onednn.example_inputs(model, seed=5)
    for out in run_both(model, feeds):
        [got] = out.values()
        assert same_bits(got, next(iter(feeds.values())))
    [p] = problems_of(one_op("ReduceSum", {"axes": [], "keep_dims": True}, [("f32", [2, 3])], [("f32", [2, 1])]))
    assert (p.op, p.argument) == ("ReduceSum", "axes")


def _select_softmax(select_out_shape):
    """Select -> SoftMax (axis -1), the Select's output and the SoftMax's declared as given."""
    shape = [2, 3, 4]
    return {"version": "3.8.0", "input_ports": [0, 1, 2], "output_ports": [4], "graph": [
        {"id": 0, "name": "select", "kind": "Select", "attrs": {},
         "inputs": [lt(0, "boolean", shape), lt(1, "f32", [1]), lt(2, "f32", shape)], "outputs": [lt(3, "f32", select_out_shape)]},
        {"id": 1, "name": "softmax", "kind": "SoftMax", "attrs": {"axis": {"type": "s64", "value": -1}},
         "inputs": [lt(3, "f32", select_out_shape)], "outputs": [lt(4, "f32", select_out_shape)]}]}


@pytest.mark.parametrize("declared", [[-9223372036854775808], [2, -1, -1]], ids=["rank", "dims"])
def test_a_shape_left_unknown_is_the_producers(declared):
    """oneDNN infers a shape (or rank) the JSON leaves unknown from the producer; so does load,
    and the consumer (a SoftMax over the last axis) sees the true rank."""
    model, report = onednn.load(_select_softmax(declared))
    [softmax] = [n for n in model.graph.node if n.op_type == "Softmax"]
    assert [a.i for a in softmax.attribute if a.name == "axis"] == [2]
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [2, 3, 4]
    assert any("tensor 3 is" in n and "[2, 3, 4], as op 0 'select' computes it" in n for n in report.notes)
    feeds = onednn.example_inputs(model, seed=6)
    for out in run_both(model, feeds):
        [got] = out.values()
        np.testing.assert_allclose(got.sum(-1), 1, rtol=1e-6)


def test_a_graph_input_of_unknown_rank_stays_a_named_problem():
    doc = one_op("ReLU", {}, [("f32", [-9223372036854775808])], [("f32", [-9223372036854775808])])
    model, _ = onednn.load(doc)  # loads (a rank-1 tensor of unknown length, as far as anyone can tell) ...
    with pytest.raises(dyndq.ValidationError) as e:  # ... but no example input can be made for it
        onednn.example_inputs(model)
    assert "a known dtype and shape" in str(e.value)


# -- dump: the inverses -----------------------------------------------------------------------------


def _model(nodes, inputs, outputs, initializers=()):
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [vi(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [vi(n, TensorProto.FLOAT, s) for n, s in outputs],
                          initializer=[numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in initializers])
    return dyndq.make_model(g, opset=21)


def test_dump_writes_clip_elu_tanh_and_layer_normalization_back_as_kinds_that_load_alike():
    model = _model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], name="ln", axis=-1, epsilon=1e-3),
                    helper.make_node("Clip", ["y", "lo", "hi"], ["z"], name="clip"),
                    helper.make_node("Elu", ["z"], ["u"], name="elu", alpha=0.25),
                    helper.make_node("Tanh", ["u"], ["w"], name="tanh")],
                   [("x", [2, 4]), ("s", [4]), ("b", [4])], [("w", [2, 4])], [("lo", -1.0), ("hi", 2.0)])
    doc = onednn.dump(model)
    kinds = [(op["kind"], {k: v["value"] for k, v in op["attrs"].items()}) for op in doc["graph"]]
    assert kinds == [("LayerNorm", {"keep_stats": False, "begin_norm_axis": -1, "use_affine": True,
                                    "epsilon": pytest.approx(1e-3)}),
                     ("Clamp", {"min": -1.0, "max": 2.0}), ("Elu", {"alpha": 0.25}), ("Tanh", {})]
    back, _ = onednn.load(doc)
    feeds = onednn.example_inputs(back, seed=7)
    [got] = dyndq.run(back, feeds).values()
    [want] = dyndq.run(model, dict(zip(["x", "s", "b"], feeds.values()))).values()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_dump_names_what_the_inverses_cannot_write():
    model = _model([helper.make_node("Clip", ["x", "lo"], ["y"], name="clip"),
                    helper.make_node("LayerNormalization", ["y", "s"], ["z", "m", "r"], name="ln")],
                   [("x", [2, 4]), ("s", [4])], [("z", [2, 4]), ("m", [2, 1]), ("r", [2, 1])], [("lo", 0.0)])
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(model)
    found = {(p.op, p.argument) for p in e.value.problems}
    assert found == {("Clip", "max"), ("LayerNormalization", "inputs"), ("LayerNormalization", "outputs")}


def test_every_new_kind_is_in_the_table_with_its_inverse():
    assert {"BiasAdd", "Clamp", "Elu", "Tanh", "LayerNorm", "RMSNorm", "SoftMaxBackward"} <= set(onednn.KINDS)
    table = inverse_table()
    assert [table[t].kind for t in ("Clip", "Elu", "Tanh", "LayerNormalization")] == ["Clamp", "Elu", "Tanh", "LayerNorm"]


DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"

KIND_FILES = sorted((DATA / "kinds").glob("*.json"))

GOOD = sorted(p for p in DATA.rglob("*.json")  # anchors and kinds (upstream/ has its own test)
              if not {"bad", "upstream"} & set(p.relative_to(DATA).parts))


def _f(x):
    return np.asarray(x).astype(np.float64)


def _erf(x):
    return np.vectorize(math.erf)(x)


def _softmax_inf_as_zero(x, axis):
    top = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - np.where(np.isneginf(top), 0, top))
    out = e / np.sum(e, axis=axis, keepdims=True)
    return np.where(np.isneginf(top), 0.0, out)


def _layer_norm(x, gamma, beta, begin_norm_axis, epsilon, **_):
    axes = tuple(range(begin_norm_axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + epsilon) * gamma + beta


def _rms_norm(x, gamma, begin_norm_axis, epsilon, **_):
    """oneDNN's layer normalization under its rms_norm flag: the mean taken as 0."""
    axes = tuple(range(begin_norm_axis % x.ndim, x.ndim))
    return x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + epsilon) * gamma


def _quantize(x, scale, zp, dtype):
    lo, hi = (-128, 127) if dtype == np.int8 else (0, 255)
    return np.clip(np.round(np.float32(x) / np.float32(scale) + np.float32(zp)), lo, hi).astype(dtype)


# kind -> (oracle of the inputs and attributes, exact?)  Formulas from doc/graph/operations/*.md
ORACLES = {
    "Add": (lambda a, b, **_: _f(a) + _f(b), True),
    "Subtract": (lambda a, b, **_: _f(a) - _f(b), True),
    "Multiply": (lambda a, b, **_: _f(a) * _f(b), True),
    "Divide": (lambda a, b, **_: _f(a) / _f(b), True),
    "Maximum": (lambda a, b, **_: np.maximum(_f(a), _f(b)), True),
    "Minimum": (lambda a, b, **_: np.minimum(_f(a), _f(b)), True),
    "BiasAdd": (lambda a, b, data_format, **_: _f(a) + _f(b).reshape([-1] + [1] * (a.ndim - 2)
                                                                    if data_format == "NCX" else [-1]), True),
    "Clamp": (lambda a, min, max, **_: np.clip(_f(a), min, max), True),
    "Elu": (lambda a, alpha, **_: np.where(_f(a) > 0, _f(a), alpha * np.expm1(_f(a))), False),
    "Tanh": (lambda a, **_: np.tanh(_f(a)), False),
    "LayerNorm": (lambda a, g, b, **k: _layer_norm(_f(a), _f(g), _f(b), **k), False),
    "RMSNorm": (lambda a, g, **k: _rms_norm(_f(a), _f(g), **k), False),
    "SoftMaxBackward": (lambda dd, d, axis, **_: _f(d) * (_f(dd) - np.sum(_f(dd) * _f(d), axis=axis, keepdims=True)), False),
    "Sigmoid": (lambda a, **_: 1 / (1 + np.exp(-_f(a))), False),
    "ReLU": (lambda a, **_: np.maximum(_f(a), 0), True),
    "Exp": (lambda a, **_: np.exp(_f(a)), False),
    "Sqrt": (lambda a, **_: np.sqrt(_f(a)), True),
    "GELU": (lambda a, **_: _f(a) / 2 * (1 + _erf(_f(a) / math.sqrt(2))), False),
    "Pow": (lambda a, beta, **_: _f(a) ** beta, False),
    "SoftMax": (lambda a, axis, **_: _softmax_inf_as_zero(_f(a), axis), False),
    "GenIndex": (lambda a, axis, **_: np.indices(a.shape)[axis], True),
    "GreaterEqual": (lambda a, b, **_: a >= b, True),
    "Select": (lambda c, a, b, **_: np.where(c, a, b), True),
    "TypeCast": (lambda a, **_: a, True),
    "MatMul": (lambda a, b, transpose_b, **_: _f(a) @ (np.swapaxes(_f(b), -1, -2) if transpose_b else _f(b)), False),
    "StaticReshape": (lambda a, **_: a.reshape(a.shape[0], -1), True),
    "StaticTranspose": (lambda a, order, **_: np.transpose(a, [d % a.ndim for d in order]), True),
    "Reorder": (lambda a, **_: a, True),
    "ReduceSum": (lambda a, axes, keep_dims, **_: np.sum(_f(a), axis=tuple(axes), keepdims=keep_dims), False),
    "ReduceMax": (lambda a, axes, keep_dims, **_: np.max(_f(a), axis=tuple(axes), keepdims=keep_dims), True),
    "Concat": (lambda *a, axis, **_: np.concatenate(a, axis=axis), True),
    "Quantize": (lambda a, scales, zps, axis, **_: _quantize(a, np.reshape(scales, (1, -1)), np.reshape(zps, (1, -1)), np.int8), True),
    "Dequantize": (lambda a, scales, zps, **_: (_f(a) - zps[0]) * np.float32(scales[0]), True),
    "DynamicQuantize": (lambda a, s, z, **_: _quantize(a, s, z.astype(np.float32), np.uint8), True),
    "DynamicDequantize": (lambda a, s, z, group_shape, **_: (
        (_f(a) - np.repeat(np.repeat(_f(z), 2, axis=1), 1, axis=0)).astype(np.float32)
        * np.repeat(s.astype(np.float32), 2, axis=1)), True),
}


def test_every_mapped_kind_has_a_file_and_an_oracle():
    assert {p.stem for p in KIND_FILES} == set(onednn.KINDS) == set(ORACLES)
    anchor_kinds = {op["kind"] for p in GOOD for op in json.loads(p.read_text())["graph"]}
    assert anchor_kinds <= set(onednn.KINDS)


def _as(value, dtype):
    return np.asarray(value).astype(np.float32).astype(dtype) if dtype.kind == "f" or dtype.name == "bfloat16" else np.asarray(value).astype(dtype)


@pytest.mark.parametrize("path", KIND_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract")  # softmax of the all -inf row
def test_each_kind_follows_onednns_documented_semantics(path, engine):
    doc = json.loads(path.read_text())
    [op] = doc["graph"]
    model, _ = onednn.load(path)
    feeds = onednn.example_inputs(model, seed=5)
    if op["kind"] == "SoftMax":  # a row of all minus infinity: zeros under inf_as_zero, not NaN
        feeds[model.graph.input[0].name][1] = -np.inf
    names = [i.name for i in model.graph.input]
    [got] = dyndq.run(model, feeds).values() if engine == "reference" else run_onnxruntime(dyndq.export(model), feeds)
    oracle, exact = ORACLES[op["kind"]]
    attrs = {k: v["value"] for k, v in op["attrs"].items()}
    with np.errstate(invalid="ignore"):  # the all minus infinity row of SoftMax
        want = _as(oracle(*(feeds[n] for n in names), **attrs), got.dtype)
    assert got.shape == tuple(op["outputs"][0]["shape"])
    if exact:
        assert np.array_equal(got, want) or same_bits(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=float(np.finfo(np.float32).eps) * 64 if got.dtype == np.float32 else 2.0**-10,
                                   atol=1e-6)
    if op["kind"] == "SoftMax":
        assert (got[1] == 0).all() and np.isfinite(got).all()


def _one_op(kind, attrs, inputs, output):
    """A one-op graph; inputs and output as (dtype, shape)."""
    def lt(i, dtype, shape):
        return {"id": i, "dtype": dtype, "shape": shape, "stride": [], "layout_type": "strided", "property_type": "variable"}
    return {"version": "3.7.0", "graph": [{
        "id": 0, "name": kind.lower(), "kind": kind,
        "attrs": {k: {"type": "", "value": v} for k, v in attrs.items()},
        "inputs": [lt(i, *x) for i, x in enumerate(inputs)], "outputs": [lt(len(inputs), *output)]}]}


def test_matmul_with_a_rank_1_src_and_a_bias_keeps_the_declared_unit_dim():
    """oneDNN unsqueezes a 1-D src to [1, d] (transpose has no effect on it); the JSON declares
    the dst [1, n], numpy's MatMul gives [n]: same elements, the declared shape wins."""
    model, _ = onednn.load(_one_op("MatMul", {"transpose_a": True}, [("f32", [4]), ("f32", [4, 3]), ("f32", [3])],
                                   ("f32", [1, 3])))
    feeds = onednn.example_inputs(model, 0)
    src, weights, bias = feeds.values()
    for engine in ("reference", "onnxruntime"):
        [got] = dyndq.run(model, feeds, engine=engine).values()
        np.testing.assert_allclose(got, (src @ weights + bias)[None, :], rtol=1e-6)


def test_no_broadcast_when_auto_broadcast_is_none():
    doc = _one_op("Subtract", {"auto_broadcast": "none"}, [("f32", [2, 3]), ("f32", [3])], ("f32", [2, 3]))
    [p] = _problems(doc)
    assert (p.op, p.argument) == ("Subtract", "auto_broadcast") and "[3]" in p.found


def test_attributes_out_of_reach_are_named():
    problems = _problems(_one_op("MatMul", {"accumulation_mode": "s32"}, [("f32", [2, 2]), ("f32", [2, 2])], ("f32", [2, 2])))
    assert [(p.op, p.argument) for p in problems] == [("MatMul", "accumulation_mode")]
    problems = _problems(_one_op("TypeCast", {}, [("f32", [2])], ("s8", [2])))
    assert [(p.op, p.argument) for p in problems] == [("TypeCast", "outputs[0]")]
    problems = _problems(_one_op("Quantize", {"scales": [0.5, 0.5], "qtype": "per_tensor"}, [("f32", [2])], ("u8", [2])))
    assert [(p.op, p.argument) for p in problems] == [("Quantize", "scales")]


def test_dynamic_quantize_per_channel_takes_one_scale_per_channel():
    doc = _one_op("DynamicQuantize", {"qtype": "per_channel", "axis": 1},
                  [("f32", [2, 3]), ("f32", [2])], ("s8", [2, 3]))
    [p] = _problems(doc)
    assert (p.op, p.argument) == ("DynamicQuantize", "inputs[1]") and "3 elements" in p.allowed
    doc["graph"][0]["inputs"][1]["shape"] = [3]
    model, _ = onednn.load(doc)
    src, scales = onednn.example_inputs(model, 0).values()
    [got] = dyndq.run(model, {model.graph.input[0].name: src, model.graph.input[1].name: scales}).values()
    assert np.array_equal(got, _quantize(src, scales[None, :], 0, np.int8))


def _problems(source):
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(source)
    return e.value.problems


F8 = [("f8_e4m3", ml_dtypes.float8_e4m3fn), ("f8_e5m2", ml_dtypes.float8_e5m2)]


def test_onednn_f8_names_are_onnx_float8e4m3fn_and_float8e5m2():
    from dyndq.opdefs import dtypes

    assert dtypes.by_onednn("f8_e4m3").onnx_name == "FLOAT8E4M3FN"  # finite only, max 448, NaN 0x7f
    assert dtypes.by_onednn("f8_e5m2").onnx_name == "FLOAT8E5M2"  # IEEE-like, with infinities
    assert dtypes.by_onednn("f8_e4m3").numpy == np.dtype(ml_dtypes.float8_e4m3fn)


@pytest.mark.parametrize("name, f8", F8)
@pytest.mark.parametrize("qtype", ["per_tensor", "per_channel"])
def test_dequantize_of_f8_is_exact_on_both_engines(name, f8, qtype):
    scales = [0.5] if qtype == "per_tensor" else [0.5, 0.25, 2.0]
    model, _ = onednn.load(graph(op(0, "Dequantize", [lt(0, name, [4, 3])], [lt(1, "f32", [4, 3])],
                                    qtype=qtype, axis=1, scales=scales)))
    [x] = onednn.example_inputs(model, 1).values()
    assert x.dtype == f8
    ref, ort = both(model, {model.graph.input[0].name: x})
    want = x.astype(np.float32) * np.float32(scales if qtype == "per_channel" else scales[0])
    for got in (ref, ort):
        [y] = got.values()
        assert np.array_equal(y, want)


@pytest.mark.parametrize("name, f8", F8)
def test_quantize_to_f8_rounds_to_nearest_even_and_saturates_on_both_engines(name, f8):
    model, _ = onednn.load(graph(op(0, "Quantize", [lt(0, "f32", [64])], [lt(1, name, [64])], scales=[0.25])))
    x = np.concatenate([np.linspace(-200, 200, 60), [1e6, -1e6, 0.0, 3.3]]).astype(np.float32)
    big = float(ml_dtypes.finfo(f8).max)
    want = np.clip(x / np.float32(0.25), -big, big).astype(f8)
    for got in both(model, {model.graph.input[0].name: x}):
        [y] = got.values()
        assert y.dtype == f8 and np.array_equal(y.view(np.uint8), want.view(np.uint8))


def test_f8_with_zero_points_is_refused():
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(graph(op(0, "Dequantize", [lt(0, "f8_e4m3", [4])], [lt(1, "f32", [4])], scales=[0.5], zps=[3])))
    [p] = e.value.problems
    assert (p.op, p.argument) == ("Dequantize", "zps") and "f8" in p.allowed


def test_typecast_to_f8_and_back():
    model, _ = onednn.load(graph(op(0, "TypeCast", [lt(0, "f32", [8])], [lt(1, "f8_e5m2", [8])]),
                                 op(1, "TypeCast", [lt(1, "f8_e5m2", [8])], [lt(2, "f32", [8])])))
    x = np.array([0.1, 1, 3, 7.5, -2, 57344, 1e-3, 100], np.float32)
    for got in both(model, {model.graph.input[0].name: x}):
        [y] = got.values()
        assert np.array_equal(y, x.astype(ml_dtypes.float8_e5m2).astype(np.float32))


@pytest.mark.parametrize("mode", ["none", "inf_as_zero"])
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract")  # the all minus infinity row
def test_softmax_stats_is_the_logsumexp_along_the_axis(mode):
    model, report = onednn.load(graph(op(0, "SoftMax", [lt(0, "f32", [3, 5])], [lt(1, "f32", [3, 5]), lt(2, "f32", [3, 1])],
                                         axis=-1, mode=mode)))
    assert len(model.graph.output) == 2
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32) * 4
    if mode == "inf_as_zero":
        x[1] = -np.inf
    want = np.log(np.sum(np.exp(x.astype(np.float64) - x.max(1, keepdims=True)), 1, keepdims=True)) + x.max(1, keepdims=True)
    for got in both(model, {model.graph.input[0].name: x}):
        dst, stats = got.values()
        keep = [0, 2] if mode == "inf_as_zero" else [0, 1, 2]
        np.testing.assert_allclose(stats[keep], want[keep], rtol=1e-6)
        if mode == "inf_as_zero":
            assert stats[1, 0] == np.inf and (dst[1] == 0).all()
            np.testing.assert_allclose(np.exp(x - stats), dst, rtol=1e-5, atol=1e-7)  # what backward graphs rely on


@pytest.mark.parametrize("kind", ["Add", "Multiply", "Subtract"])
def test_an_s32_input_beside_a_float_one_is_widened_exactly(kind):
    model, _ = onednn.load(graph(op(0, kind, [lt(0, "f32", [2, 4]), lt(1, "s32", [1, 4])], [lt(2, "f32", [2, 4])],
                                    auto_broadcast="numpy")))
    a = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    b = np.array([[0, -7, 2**20, -(2**24)]], np.int32)
    want = {"Add": np.add, "Multiply": np.multiply, "Subtract": np.subtract}[kind](a, b.astype(np.float32))
    for got in both(model, dict(zip([i.name for i in model.graph.input], (a, b)))):
        [y] = got.values()
        assert np.array_equal(y, want)


def test_two_s32_inputs_are_refused_where_onednn_takes_no_s32():
    """oneDNN's Add and Subtract take s32 with s32 into s32 (tested with the writer); Multiply
    takes no s32, and s32 with s32 gives no float dst."""
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(graph(op(0, "Multiply", [lt(0, "s32", [2]), lt(1, "s32", [2])], [lt(2, "s32", [2])])))
    assert {p.argument for p in e.value.problems} == {"inputs[0]", "outputs[0]"}
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(graph(op(0, "Add", [lt(0, "s32", [2]), lt(1, "s32", [2])], [lt(2, "f32", [2])])))
    assert [p.argument for p in e.value.problems] == ["outputs[0]"]
