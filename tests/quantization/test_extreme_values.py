"""Weights at the ends of their dtype's range: whatever the method, rule, sign convention and
scale dtype, the weight the graph gives back (our kernel, then the Slice and the Cast the graph
adds) is finite wherever the weight was, and the error statistics say what happened.  A scale
that its dtype cannot hold (float32 weights of 1e6 with float16 scales) is refused by name."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dyndq
from dyndq.quantization.numerics import ScaleOutOfRange, quantize_weight

from quantize_models import extreme_weights, heavy


def through_the_graph(q, dtype):
    """DynamicDequantize (our kernel) on the codes, the Slice back to the weight's length, the
    Cast to the weight's dtype: the weight the quantized graph computes."""
    args = (q.codes, q.scales) if q.zero_points is None else (q.codes, q.scales, q.zero_points)
    out = dyndq.dynamic_dequantize(*args, qtype="per_group", group_shape=q.group_shape)
    return np.take(out, np.arange(q.length), axis=q.axis).astype(dtype)


@settings(max_examples=400, deadline=None)
@given(w=extreme_weights(), method=st.sampled_from(["rtn", "search"]), rule=st.sampled_from(["matmul", "gather"]),
       symmetric=st.booleans(), bits=st.sampled_from([4, 8]), group_pick=st.integers(1, 48),
       scale_dtype=st.sampled_from([None, "float32", "float16", "bfloat16"]))
def test_the_dequantized_weight_is_finite_wherever_the_weight_was(w, method, rule, symmetric, bits, group_pick,
                                                                  scale_dtype):
    group = -1 if group_pick > w.shape[0] else group_pick
    try:
        q = quantize_weight(w, axis=0, group_size=group, bits=bits, symmetric=symmetric, scale_dtype=scale_dtype,
                            method=method, rule=rule)
    except ScaleOutOfRange as e:  # only a scale dtype narrower than the weight's can be too small for it
        assert scale_dtype == "float16" and w.dtype != np.float16, e
        return
    assert np.isfinite(w.astype(np.float32)).all()
    assert np.isfinite(q.scales.astype(np.float32)).all(), q.scales
    got = through_the_graph(q, w.dtype)
    assert np.isfinite(got.astype(np.float32)).all(), (w, got)
    s = q.stats
    for figure in (s.relative, s.max_abs, s.cosine, s.sq_error):
        assert np.isfinite(figure), s
    want = np.abs(w.astype(np.float64) - got.astype(np.float64)).max()
    assert s.max_abs == want


@pytest.mark.parametrize("method", ["rtn", "search"])
@pytest.mark.parametrize("rule", ["matmul", "gather"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("dtype,big", [(np.float32, 3e38), (np.float16, 40000.0), (ml_dtypes.bfloat16, 3e38),
                                       (np.float16, 65504.0)])
def test_a_group_spanning_the_whole_range(method, rule, symmetric, dtype, big):
    w = np.array([[big], [-big], [1.0], [0.5]] * 8, np.float64).astype(dtype)
    q = quantize_weight(w, axis=0, group_size=-1, bits=4, symmetric=symmetric, method=method, rule=rule)
    got = through_the_graph(q, dtype).astype(np.float64)
    assert np.isfinite(got).all()
    # the ends come back within a step of the scale (symmetric codes reach one step less on one
    # side; a rounded scale a little more), as any other group's do
    step = 1.01 * float(np.abs(q.scales.astype(np.float64)).max())
    np.testing.assert_allclose(got[:2, 0], [float(dtype(big)), -float(dtype(big))], atol=step, rtol=0)
    assert 0 < q.stats.relative < 0.2 and q.stats.cosine > 0.98 and 0 < q.stats.max_abs <= step


def test_a_scale_its_dtype_cannot_hold_is_refused_by_name():
    w = heavy((64, 2), 1) * np.float32(1e8)
    with pytest.raises(ScaleOutOfRange) as e:
        quantize_weight(w, axis=0, group_size=32, scale_dtype="float16")
    said = str(e.value)
    assert "float16" in said and "65504" in said


def model_with_extreme_weights():
    """A float16 embedding table holding +-40000 (its float16 range overflows), then a float32
    MatMul weight with a group spanning +-3e38 (its float32 range overflows)."""
    from onnx import TensorProto as T, helper, numpy_helper as nh

    w = heavy((256, 8), 2)
    w[3, 2], w[5, 2] = 3e38, -3e38
    table = heavy((10, 256), 3, dtype=np.float16)
    table[4, 7], table[4, 9] = 40000, -40000
    g = helper.make_graph([helper.make_node("Gather", ["E", "ids"], ["x"], name="embed"),
                           helper.make_node("Cast", ["x"], ["x32"], to=T.FLOAT),
                           helper.make_node("MatMul", ["x32", "W"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("ids", T.INT64, ["n"])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["n", 8])],
                          [nh.from_array(table, "E"), nh.from_array(w, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), table, w


@pytest.mark.parametrize("method", ["rtn", "search"])
def test_a_model_with_extreme_weights_quantizes_to_finite_weights_and_says_how_far(method):
    model, table, w = model_with_extreme_weights()
    out, report = dyndq.quantize(model, method=method)
    assert [layer.name for layer in report.layers] == ["E", "W"] and not report.left_alone
    for layer, weight in zip(report.layers, (table, w)):
        assert 0 < layer.relative_error < 0.1 and 0.99 < layer.cosine <= 1 + 1e-12, layer
        assert 0 < layer.max_abs_error < 0.1 * float(np.abs(weight.astype(np.float64)).max()), layer
    ids = np.arange(10, dtype=np.int64)
    for engine in ("reference", "onnxruntime"):
        got = dyndq.run(out, {"ids": ids}, engine=engine)["y"]
        assert np.isfinite(got).all(), engine
    text = "\n".join(report.table())
    assert "nan" not in text and "inf" not in text


def test_a_weight_whose_scales_float16_cannot_hold_is_left_alone_and_said():
    model, _, _ = model_with_extreme_weights()
    out, report = dyndq.quantize(model, scale_dtype="float16", evaluate=False)
    assert [layer.name for layer in report.layers] == ["E"]
    (said,) = map(str, report.left_alone)
    assert said.startswith("graph 'main' node 2 'mm' (MatMul): B ('W'): found values up to 3e+38 in magnitude, "
                           "whose groups need scales beyond the largest float16 (65504)")


def test_an_output_the_float_model_makes_infinite_is_left_out_of_the_output_error():
    from onnx import TensorProto as T, helper, numpy_helper as nh

    w = heavy((256, 8), 4)
    w[:, 0] = 3e38  # (every input row reaches this column: the float model's y[:, 0] overflows)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm"),
                           helper.make_node("Relu", ["x"], ["r"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [2, 256])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 8]),
                           helper.make_tensor_value_info("r", T.FLOAT, [2, 256])], [nh.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    _, report = dyndq.quantize(model)
    assert [o.name for o in report.outputs] == ["r"]
    assert report.outputs_note.endswith("; left out: y, where the float model gives NaN or infinity")
    assert "nan" not in "\n".join(report.table())
