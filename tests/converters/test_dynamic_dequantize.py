"""The DynamicDequantize-1 converter: each node form lowers to the standard ops it should,
and ONNX Runtime computes, to the bit, what our kernel computes."""
import inspect

import numpy as np
import onnx
import pytest
from cases import VALID, case_model, oracle, run_ort, same_values

from dyndq.opdefs import dtypes
from onnx import TensorProto, helper

import dyndq
from dyndq.converters.dynamic_dequantize import dynamic_dequantize as lower
from dyndq.converters.dynamic_dequantize import dynamic_dequantize_lifting as lift_node
from dyndq.converters.dynamic_dequantize import dynamic_dequantize_needs
from dyndq.converters.lowering_context import LoweringContext
from dyndq.plumbing.names import NameScope
from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1, LiftPlan, Refusal, TensorSpec

def bits_equal(a, b):
    return same_values(a, b)


def test_lowering_is_attached_with_a_leading_context():
    assert DYNAMIC_DEQUANTIZE_1.lowering is lower
    assert DYNAMIC_DEQUANTIZE_1.lowering_needs is dynamic_dequantize_needs
    assert DYNAMIC_DEQUANTIZE_1.lifting is lift_node
    params = list(inspect.signature(lower).parameters)
    assert params == ["ctx", "src", "scales", "zps", "qtype", "axis"]


def _forms(model):
    return [n.op_type for n in model.graph.node]


# (every valid row exported, its forms, and run in ONNX Runtime bit for bit: tests/test_opcheck.py)


def _dql(model):
    return next(n for n in model.graph.node if n.op_type == "DequantizeLinear")


def test_per_channel_writes_axis_explicitly_even_when_it_is_the_default():
    case = next(c for c in VALID if c.id == "pc-int8-int8-axis1")
    dql = _dql(dyndq.export(case_model(case)))
    assert [(a.name, a.i) for a in dql.attribute] == [("axis", 1)]


def test_per_tensor_scale_and_zero_point_become_true_scalars():
    case = next(c for c in VALID if c.id == "pt-uint8-uint8")
    exported = dyndq.export(case_model(case))
    types = {vi.name: vi.type for vi in onnx.shape_inference.infer_shapes(exported).graph.value_info}
    dql = _dql(exported)
    for name in dql.input[1:]:
        assert len(types[name].tensor_type.shape.dim) == 0
    assert not any(a.name == "axis" for a in dql.attribute)


def test_scalar_inputs_need_no_reshape():
    case = next(c for c in VALID if c.id == "pt-scalar-scale-and-zp")
    exported = dyndq.export(case_model(case))
    assert _forms(exported) == ["DequantizeLinear"]


def test_one_per_channel_zero_point_is_expanded_to_the_scales_shape():
    case = next(c for c in VALID if c.id == "pc-one-zp-broadcast")
    exported = dyndq.export(case_model(case))
    assert _forms(exported) == ["Shape", "Expand", "DequantizeLinear"]
    src, scales, zps = case.arrays()
    [got] = run_ort(exported, {"src": src, "scales": scales, "zps": zps})
    assert bits_equal(got, dyndq.dynamic_dequantize(src, scales, zps, **case.attrs))


@pytest.mark.parametrize("src_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("qtype", ["per_tensor", "per_channel"])
def test_int32_zero_points_at_the_extremes_are_exact(src_dtype, qtype):
    """An int32 subtraction would overflow here; the lowering subtracts in int64."""
    info = np.iinfo(src_dtype)
    src = np.array([[info.min, -1 if info.min else 0, 0, 1, info.max]] * 3, src_dtype)  # [3, 5]
    i32 = np.iinfo(np.int32)
    if qtype == "per_tensor":
        zps_all = [np.array([v], np.int32) for v in (i32.min, i32.max, i32.min + 1, i32.max - 1, 0)]
        scales = np.array([0.75], np.float32)
        attrs = {"qtype": qtype}
    else:
        zps_all = [np.array([i32.min, i32.max, i32.min + 200], np.int32), np.array([i32.max], np.int32)]
        scales = np.array([1.0, 3.0e-7, -2.5], np.float32)
        attrs = {"qtype": qtype, "axis": 0}
    for zps in zps_all:
        graph = helper.make_graph(
            [dyndq.make_node(["src", "scales", "zps"], ["dst"], name="dq", **attrs)], "g",
            [helper.make_tensor_value_info("src", dtypes.of(src.dtype).onnx, src.shape),
             helper.make_tensor_value_info("scales", TensorProto.FLOAT, scales.shape),
             helper.make_tensor_value_info("zps", TensorProto.INT32, zps.shape)],
            [helper.make_tensor_value_info("dst", TensorProto.FLOAT, src.shape)])
        exported = dyndq.export(dyndq.make_model(graph))
        [got] = run_ort(exported, {"src": src, "scales": scales, "zps": zps})
        want = dyndq.dynamic_dequantize(src, scales, zps, **attrs)
        assert bits_equal(got, want)
        assert bits_equal(got, oracle(src, scales, zps, **attrs))


def test_scales_and_zero_points_from_constant_nodes():
    """A Constant output is still a value computed at run time: it is not read."""
    nodes = [
        helper.make_node("Constant", [], ["s"], value=onnx.numpy_helper.from_array(np.array([0.5, 2.0], np.float32))),
        helper.make_node("Constant", [], ["z"], value=onnx.numpy_helper.from_array(np.array(7, np.int32))),
        dyndq.make_node(["x", "s", "z"], ["y"], qtype="per_channel", axis=0, name="dq"),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    exported = dyndq.export(dyndq.make_model(graph))
    onnx.checker.check_model(exported, full_check=True)
    x = np.array([[0, 7, 255], [1, 2, 3]], np.uint8)
    [got] = run_ort(exported, {"x": x})
    assert bits_equal(got, dyndq.dynamic_dequantize(x, np.array([0.5, 2.0], np.float32), np.array(7, np.int32),
                                                    qtype="per_channel", axis=0))


# -- the context, and what happens when types or ranks are unknown ------------------------------


def _lower_alone(specs, *inputs, **attrs):
    ctx = LoweringContext(opset=13, base="dq", names=NameScope({"x", "s", "z", "y"}), specs=specs.get)
    out = lower(ctx, *inputs, **attrs)
    return ctx, out


def test_new_names_are_readable_and_unique():
    specs = {"x": TensorSpec("int8", (2, 3)), "s": TensorSpec("float32", (1,)), "z": TensorSpec("int32", (1,))}
    ctx, out = _lower_alone(specs, "x", "s", "z")
    names = [o for n in ctx.nodes for o in n.output] + [n.name for n in ctx.nodes]
    assert len(names) == len(set(names))
    assert all(name.startswith("dq/") for name in names)
    assert out == ctx.nodes[-1].output[0]


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
@pytest.mark.parametrize("zp_dtype", [None, np.int8, np.int32])
def test_unknown_types_and_rank_fall_back_to_exact_arithmetic(axis, zp_dtype):
    """Inside a model-local function nothing is typed: the lowering must still be right."""
    ctx, out = _lower_alone({}, "x", "s", "z" if zp_dtype else "", qtype="per_channel", axis=axis)
    assert "DequantizeLinear" not in [n.op_type for n in ctx.nodes] or zp_dtype is None
    rng = np.random.default_rng(axis + 7)
    x = rng.integers(-128, 128, (2, 3, 4), dtype=np.int8)
    s = rng.standard_normal(x.shape[axis]).astype(np.float32)
    z = None if zp_dtype is None else rng.integers(-100, 100, x.shape[axis]).astype(zp_dtype)
    for n in ctx.nodes:
        if n.output[0] == out:
            n.output[0] = "y"
    inputs = [helper.make_tensor_value_info("x", TensorProto.INT8, None),
              helper.make_tensor_value_info("s", TensorProto.FLOAT, None)]
    if z is not None:
        inputs.append(helper.make_tensor_value_info("z", dtypes.of(z.dtype).onnx, None))
    graph = helper.make_graph(ctx.nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    feeds = {"x": x, "s": s, **({"z": z} if z is not None else {})}
    [got] = run_ort(model, feeds)
    assert bits_equal(got, dyndq.dynamic_dequantize(x, s, z, qtype="per_channel", axis=axis))


# -- lifting, one node --------------------------------------------------------------------------


def _dql_node(**attrs):
    return helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], **attrs)


@pytest.mark.parametrize("x, s, z, attrs, expected", [
    (("int8", (2, 3)), ("float32", ()), ("int8", ()), {}, LiftPlan(("x", "s", "z"), {"qtype": "per_tensor"})),
    (("uint8", (2, 3)), ("float32", (1,)), ("uint8", (1,)), {}, LiftPlan(("x", "s", "z"), {"qtype": "per_tensor"})),
    (("int8", (2, 3)), ("float32", (3,)), ("int8", (3,)), {}, LiftPlan(("x", "s", "z"), {"qtype": "per_channel", "axis": 1})),
    (("int8", (2, 3)), ("float32", (2,)), ("int8", (2,)), {"axis": 0}, LiftPlan(("x", "s", "z"), {"qtype": "per_channel", "axis": 0})),
    (("int8", (2, 3)), ("float32", (3,)), ("int8", (3,)), {"axis": -1}, LiftPlan(("x", "s", "z"), {"qtype": "per_channel", "axis": -1})),
])
def test_lift_plans(x, s, z, attrs, expected):
    specs = {"x": TensorSpec(*x), "s": TensorSpec(*s), "z": TensorSpec(*z)}
    assert lift_node(_dql_node(**attrs), specs.get) == expected


@pytest.mark.parametrize("x, s, z, attrs, reason", [
    (("int32", (2, 3)), ("float32", ()), ("int32", ()), {}, "x is int32"),
    (("float8e4m3fn", (2, 3)), ("float32", ()), None, {}, "x is float8e4m3fn"),
    (("int8", (2, 4)), ("float16", ()), ("int8", ()), {}, "x_scale is float16"),
    (("int8", (2, 4)), ("float32", (2, 2)), ("int8", (2, 2)), {"block_size": 2}, "block_size"),
    (("int8", (2, 4)), ("float32", (2, 2)), ("int8", (2, 2)), {}, "rank 2"),
    (("int8", (2, 4)), ("float32", ()), ("int8", ()), {"output_dtype": TensorProto.FLOAT16}, "output_dtype"),
    (None, ("float32", ()), ("int8", ()), {}, "unknown"),
    (("int8", (2, 4)), ("float32", None), ("int8", ()), {}, "shape is unknown"),
])
def test_lift_refusals_say_why(x, s, z, attrs, reason):
    specs = {"s": TensorSpec(*s)}
    if x:
        specs["x"] = TensorSpec(*x)
    if z:
        specs["z"] = TensorSpec(*z)
    plan = lift_node(_dql_node(**attrs), specs.get)
    assert isinstance(plan, Refusal) and reason in plan.reason
