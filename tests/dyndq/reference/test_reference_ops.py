"""dyndq.reference_ops: the ops where onnx.reference's meaning is not ONNX's, corrected, each run by
`dyndq.run` (the reference engine) against ONNX's own expected outputs (its backend node tests,
tests/backend_cases.py) carried to the versions corrected: the same inputs mean the same thing
there, or the expected output is derived from ONNX's by the version's own rule."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from backend_cases import assert_as_expected, expected, feeds, node_cases, with_opset
from onnx import TensorProto, helper

import dyndq
from dyndq.reference_ops import CORRECTED, UNTRUSTED, untrusted_nodes


def _case(name):
    case = node_cases()[name]
    (data_set,) = case.data_sets
    return case, feeds(case, data_set), expected(data_set)


def _run(model, inputs) -> list:
    out = dyndq.run(model, inputs)
    return [out[o.name] for o in model.graph.output]


def _unfixed_batch(model):
    """The model with its graph inputs' first dimension left open (a batch of another size fits)."""
    for vi in model.graph.input:
        dim = vi.type.tensor_type.shape.dim[0]
        dim.Clear()
        dim.dim_param = "N"
    for vi in model.graph.output:
        vi.type.tensor_type.shape.dim[0].Clear()
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    return model


# -- BatchNormalization before opset 14: one output is inference ----------------------------------


@pytest.mark.parametrize("name", ["test_batchnorm_example", "test_batchnorm_epsilon"])
@pytest.mark.parametrize("opset", [7, 9, 12, 13])
def test_batchnorm_with_momentum_and_one_output_is_inference(name, opset):
    """paddle2onnx writes momentum on every BatchNormalization; with one output it is still inference,
    y = scale * (x - mean) / sqrt(var + epsilon) + B (onnx.reference gave training statistics:
    0.9487 where 1.0 is right)."""
    case, inputs, want = _case(name)
    model = with_opset(case.model, opset, momentum=0.9)
    assert_as_expected(_run(model, inputs), want, case.rtol, case.atol, f"{name} at opset {opset}")


def test_batchnorm_6_with_is_test_unset_and_one_output_is_inference():
    case, inputs, want = _case("test_batchnorm_example")
    model = with_opset(case.model, 6, momentum=0.9, is_test=0)
    assert_as_expected(_run(model, inputs), want, case.rtol, case.atol, "opset 6")


def test_batchnorm_9_with_five_outputs_is_training():
    """Y and the running mean and variance as ONNX's training-mode test expects them (opset 15,
    training_mode=1), from the same node at opset 9 with all five outputs."""
    case, inputs, want = _case("test_batchnorm_example_training_mode")
    model = with_opset(case.model, 9, training_mode=None, momentum=0.9)
    (node,) = model.graph.node
    node.output.extend(["saved_mean", "saved_var"])
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, [3])
                              for n in ("saved_mean", "saved_var"))
    got = _run(model, inputs)
    assert_as_expected(got[:3], want, case.rtol, case.atol, "opset 9 training")
    x = inputs["x"]
    np.testing.assert_allclose(got[3], x.mean(axis=(0, 2, 3)), rtol=1e-5)
    assert [e.op_type for _, e in untrusted_nodes(model)] == ["BatchNormalization"]  # (saved_* are not ONNX's)


# -- Softmax, LogSoftmax, Hardmax before opset 13: coerced to 2-D ---------------------------------


@pytest.mark.parametrize("op, module", [("softmax", "softmax"), ("logsoftmax", "logsoftmax"), ("hardmax", "hardmax")])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
@pytest.mark.parametrize("opset", [1, 11, 12])
def test_softmax_family_before_13_runs_over_the_2d_coerced_input(op, module, axis, opset):
    """Expected: ONNX's own helper of the op's test (`onnx.backend.test.case.node.softmax.softmax`, ...)
    over the last axis of the input reshaped to [prod(dims before axis), prod(dims from axis)], as
    versions 1 and 11 define it; axis 2 (the last) is also -13's expected output."""
    import importlib

    name = f"test_{op}_axis_{axis}" if axis >= 0 else f"test_{op}_negative_axis"
    case, inputs, want = _case(name)
    (x,) = inputs.values()
    helper_fn = getattr(importlib.import_module(f"onnx.backend.test.case.node.{module}"), op)
    a = axis % x.ndim
    coerced = helper_fn(x.reshape(int(np.prod(x.shape[:a])), -1), axis=-1).reshape(x.shape).astype(x.dtype)
    if a == x.ndim - 1:
        assert_as_expected([coerced], want, case.rtol, case.atol, "the last axis means the same in every version")
    got = _run(with_opset(case.model, opset), inputs)
    assert_as_expected(got, [coerced], case.rtol, case.atol, f"{name} at {opset}")


def test_softmax_11_default_axis_is_1():
    case, inputs, _ = _case("test_softmax_axis_1")
    (x,) = inputs.values()
    model = with_opset(case.model, 11, axis=None)
    from onnx.backend.test.case.node.softmax import softmax

    want = softmax(x.reshape(x.shape[0], -1), axis=-1).reshape(x.shape)
    assert_as_expected(_run(model, inputs), [want], case.rtol, case.atol, "default axis")


# -- OneHot ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["test_onehot_without_axis", "test_onehot_with_axis", "test_onehot_negative_indices",
                                  "test_onehot_with_negative_axis", "test_onehot_out_of_range_indices"])
def test_onehot_takes_depth_as_a_one_element_tensor(name):
    """tf2onnx writes depth as a [1] tensor (magika's OneHot): ONNX allows it; onnx.reference failed."""
    case, inputs, want = _case(name)
    depth = case.model.graph.node[0].input[1]
    inputs[depth] = np.asarray(inputs[depth]).reshape(1)
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    vi = next(v for v in model.graph.input if v.name == depth)
    vi.type.tensor_type.shape.CopyFrom(onnx.TensorShapeProto(dim=[onnx.TensorShapeProto.Dimension(dim_value=1)]))
    assert_as_expected(_run(model, inputs), want, case.rtol, case.atol, name)


def _onehot_model(opset, index_type=TensorProto.INT64, depth_type=TensorProto.INT64, value_type=TensorProto.DOUBLE):
    graph = helper.make_graph([helper.make_node("OneHot", ["i", "d", "v"], ["y"])], "g",
                              [helper.make_tensor_value_info("i", index_type, [5]),
                               helper.make_tensor_value_info("d", depth_type, []),
                               helper.make_tensor_value_info("v", value_type, [2])],
                              [helper.make_tensor_value_info("y", value_type, [5, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


@pytest.mark.parametrize("opset, hot", [(9, [0, None, 2, None, None]), (11, [0, 2, 2, None, None])])
def test_onehot_reads_negative_indices_from_the_end_only_from_11(opset, hot):
    """OneHot-9: an index outside [0, depth) is all off_value; -11: [-depth, depth - 1], negatives from
    the end.  on_value and off_value come out exactly as given (0.1 and 0.3: no arithmetic on them)."""
    out = dyndq.run(_onehot_model(opset), {"i": np.array([0, -1, 2, 5, -4], np.int64), "d": np.array(3, np.int64),
                                           "v": np.array([0.3, 0.1])})["y"]
    want = np.full((5, 3), 0.3)
    for row, col in enumerate(hot):
        if col is not None:
            want[row, col] = 0.1
    np.testing.assert_array_equal(out, want)


def test_onehot_casts_non_integer_indices_and_depth_to_int64():
    out = dyndq.run(_onehot_model(11, TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.FLOAT),
                    {"i": np.array([0.7, -1.5, 2.2, 2.9, -0.2], np.float32), "d": np.array(3.7, np.float32),
                     "v": np.array([0, 1], np.float32)})["y"]
    np.testing.assert_array_equal(out.argmax(axis=1), [0, 2, 2, 2, 0])  # (int64: 0, -1 -> 2, 2, 2, 0)
    assert out.sum() == 5


# -- LRN, LpNormalization, RoiAlign-10 ------------------------------------------------------------


@pytest.mark.parametrize("name", ["test_lrn", "test_lrn_default"])
@pytest.mark.parametrize("images", [1, 2])
def test_lrn_sums_over_channels_for_any_batch(name, images):
    """ONNX's LRN test has as many images as channels (5 and 5); one image of it is its first row of
    the expected output (LRN works per image).  onnx.reference summed over the channels numbered by
    the images: with one image only channel 0 was normalized.  (Within 1e-6, float32's rounding: the
    test's alpha is small, 2e-4, and the case's own rtol of 1e-3 would let that error pass.)"""
    case, inputs, want = _case(name)
    model = _unfixed_batch(with_opset(case.model, 13))
    (x,) = inputs.values()
    assert_as_expected(_run(model, {"x": x[:images]}), [want[0][:images]], 1e-6, 0, name)


@pytest.mark.parametrize("name", ["test_l1normalization_axis_0", "test_l1normalization_axis_1",
                                  "test_l1normalization_axis_last", "test_l2normalization_axis_0",
                                  "test_lpnormalization_default"])
def test_lpnormalization_takes_absolute_values(name):
    """ONNX's tests have no negative input; with signs flipped the norm is unchanged and each output
    flips its sign with its input.  onnx.reference summed x^p, not |x|^p: for p = 1 a signed sum."""
    case, inputs, want = _case(name)
    (x,) = inputs.values()
    signs = np.where(np.random.default_rng(0).random(x.shape) < 0.5, -1, 1).astype(x.dtype)
    assert (x >= 0).all()  # (the premise: ONNX's inputs are not negative)
    assert_as_expected(_run(case.model, {"x": x * signs}), [want[0] * signs], case.rtol, case.atol, name)


def test_roialign_10_maps_without_the_half_pixel_offset():
    """RoiAlign-10 is -16 with coordinate_transformation_mode="output_half_pixel" (ONNX's
    test_roialign_aligned_false); onnx.reference ran -16's default, "half_pixel"."""
    case, inputs, want = _case("test_roialign_aligned_false")
    model = with_opset(case.model, 10, coordinate_transformation_mode=None)
    assert_as_expected(_run(model, inputs), want, case.rtol, case.atol, "RoiAlign-10")


# -- binary ops before opset 7: broadcast=1 with axis ---------------------------------------------


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("opset", [1, 6])
def test_legacy_broadcast_aligns_b_at_axis(op, opset):
    """ONNX's test_<op>_bcast (x [3, 4, 5], y [5], NumPy's broadcast): at opset 6 with broadcast=1 and
    axis 2 the same; with A transposed to [5, 4, 3] and axis 0, B runs along A's first axis and the
    expected output is ONNX's transposed.  onnx.reference aligned B with A's last axis (NumPy's rule)."""
    case, inputs, want = _case(f"test_{op.lower()}_bcast")
    x, y = inputs.values()
    got = _run(with_opset(case.model, opset, broadcast=1, axis=2), inputs)
    assert_as_expected(got, want, case.rtol, case.atol, "axis 2")
    model = with_opset(case.model, opset, broadcast=1, axis=0)
    for vi in (model.graph.input[0], model.graph.output[0]):
        vi.type.tensor_type.shape.CopyFrom(onnx.TensorShapeProto(dim=[onnx.TensorShapeProto.Dimension(dim_value=d)
                                                                      for d in (5, 4, 3)]))
    got = _run(model, {"x": np.ascontiguousarray(x.transpose(2, 1, 0)), "y": y})
    assert_as_expected(got, [want[0].transpose(2, 1, 0)], case.rtol, case.atol, "axis 0")


def test_every_corrected_class_is_one_onnx_op_and_every_untrusted_op_exists():
    names = [c.__name__ for c in CORRECTED]
    assert len(names) == len(set(names))
    for name in names + [u.op_type for u in UNTRUSTED]:
        assert onnx.defs.has(name), name


def test_the_corrections_run_in_functions_and_bodies():
    """A BatchNormalization-9 with momentum inside a model-local function and inside an If's branches:
    ONNX's expected inference output in each (the evaluators ONNX builds for them get our classes)."""
    case, inputs, want = _case("test_batchnorm_example")
    names = list(inputs)
    bn = helper.make_node("BatchNormalization", names, ["y"], momentum=0.9)
    function = helper.make_function("local", "BN", names, ["y"], [bn], [helper.make_opsetid("", 12)])
    branch = helper.make_graph([helper.make_node("BatchNormalization", names, ["z"], momentum=0.9)], "branch", [],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3, 4, 5])])
    graph = helper.make_graph(
        [helper.make_node("BN", names, ["y"], domain="local"),
         helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=branch)], "g",
        list(case.model.graph.input) + [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3, 4, 5]) for n in ("y", "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12), helper.make_opsetid("local", 1)],
                              functions=[function], ir_version=7)
    assert_as_expected(_run(model, {**inputs, "c": np.array(True)}), want * 2, case.rtol, case.atol, "function, If")
