"""The kinds and features oneDNN's upstream graphs asked for (issue 21, point 1): BiasAdd and Clamp
bit for bit in every float dtype (hypothesis), LayerNorm's statistics, RMSNorm with gamma,
SoftMaxBackward, ReduceSum over no axis, shapes the JSON leaves unknown (rank included) taken
from the producer, and the inverses `dump` writes (Clip, Elu, Tanh, LayerNormalization).
Each kind's basic semantics are in test_onednn.py (tests/data/onednn/kinds/)."""
import ml_dtypes
import numpy as np
import pytest
from cases import same_bits
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq import onednn
from dyndq.onednn.handler import inverse_table

ENGINES = ("reference", "onnxruntime")
FLOATS = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}


def lt(i, dtype, shape):
    return {"id": i, "dtype": dtype, "shape": list(shape), "stride": [], "layout_type": "strided",
            "property_type": "variable"}


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
