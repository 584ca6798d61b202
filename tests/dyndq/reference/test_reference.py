"""Graphs holding DynamicDequantize run in onnx.reference through our kernel;
DequantizeLinear runs at opsets 10 and 13 (which onnx.reference lacks)."""
from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from cases import backend_case, vi

import dyndq
from dyndq import DOMAIN, ValidationError, dynamic_dequantize, reference_evaluator
from dyndq.reference import dequantize_linear, op_class

DynamicDequantize = op_class(DOMAIN, "DynamicDequantize")

f32, u8, i8, i32 = np.float32, np.uint8, np.int8, np.int32
ELEM = {np.dtype(u8): T.UINT8, np.dtype(i8): T.INT8, np.dtype(i32): T.INT32, np.dtype(f32): T.FLOAT}


def bits(a):
    return np.ascontiguousarray(a, dtype=f32).view(np.uint32)


def model_of(nodes, inputs, outputs, *, opset=21, initializers=(), functions=(), extra_opsets=()):
    graph = h.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    imports = [h.make_opsetid("", opset), dyndq.opset_import(), *extra_opsets]
    return h.make_model(graph, opset_imports=imports, functions=list(functions),
                        ir_version=h.find_min_ir_version_for(imports, ignore_unknown=True))


def test_reference_evaluator_is_a_reference_evaluator():
    m = _alone("per_tensor", 1, u8, None, (4,), (1,))
    ev = reference_evaluator(m)
    assert isinstance(ev, ReferenceEvaluator)
    assert dyndq.reference_evaluator is reference_evaluator


def _alone(qtype, axis, src_dtype, zp_dtype, shape, scale_shape):
    inputs = [vi("src", src_dtype, shape), vi("scales", f32, scale_shape)]
    names = ["src", "scales"]
    if zp_dtype is not None:
        inputs.append(vi("zps", zp_dtype, scale_shape))
        names.append("zps")
    node = dyndq.make_node(names, ["dst"], qtype=qtype, axis=axis)
    return model_of([node], inputs, [vi("dst", f32, shape)])


# (the op alone in a graph, every dtype, qtype and axis of the shared table, on the reference
# evaluator: tests/test_opcheck.py)


def test_onednn_golden_in_a_graph():
    m = _alone("per_tensor", 1, u8, i32, [4], [1])
    (got,) = reference_evaluator(m).run(None, {"src": np.array([0, 10, 20, 30], u8), "scales": np.array([0.1], f32),
                                                "zps": np.array([10], i32)})
    assert got.tolist() == [-1.0, 0.0, 1.0, 2.0]


def test_default_attributes_and_omitted_zps():
    node = h.make_node("DynamicDequantize", ["src", "scales", ""], ["dst"], domain=DOMAIN)  # no attributes at all
    m = model_of([node], [vi("src", i8, [2, 3]), vi("scales", f32, [])], [vi("dst", f32, [2, 3])])
    src = np.array([[-128, 0, 127], [1, 2, 3]], i8)
    (got,) = reference_evaluator(m).run(None, {"src": src, "scales": np.array(0.5, f32)})
    assert np.array_equal(got, src.astype(f32) * f32(0.5))


def test_between_matmul_and_relu():
    """x @ DynamicDequantize(w) -> Relu: weights dequantized per output channel."""
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, (8, 6)).astype(i8)
    scales = (rng.random(6) * 0.1).astype(f32)
    zps = rng.integers(-5, 5, 6).astype(i8)
    x = rng.standard_normal((4, 8)).astype(f32)
    nodes = [
        dyndq.make_node(["w", "scales", "zps"], ["wf"], qtype="per_channel", axis=1, name="deq"),
        h.make_node("MatMul", ["x", "wf"], ["y"]),
        h.make_node("Relu", ["y"], ["z"]),
    ]
    m = model_of(nodes, [vi("x", f32, [4, 8])], [vi("z", f32, [4, 6])],
                 initializers=[onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(scales, "scales"),
                               onnx.numpy_helper.from_array(zps, "zps")])
    onnx.checker.check_model(m, full_check=True)
    (got,) = reference_evaluator(m).run(None, {"x": x})
    wf = dynamic_dequantize(w, scales, zps, qtype="per_channel", axis=1)
    assert np.array_equal(got, np.maximum(x @ wf, 0))


def test_quantized_activations_then_matmul():
    """Relu(MatMul(DynamicDequantize(x_q), W)): the op fed by a graph input, with a scalar scale."""
    rng = np.random.default_rng(2)
    xq = rng.integers(0, 256, (3, 5)).astype(u8)
    w = rng.standard_normal((5, 2)).astype(f32)
    nodes = [dyndq.make_node(["xq", "s", "z"], ["x"]), h.make_node("MatMul", ["x", "w"], ["y"]), h.make_node("Relu", ["y"], ["out"])]
    m = model_of(nodes, [vi("xq", u8, [3, 5]), vi("s", f32, [1]), vi("z", u8, [1])], [vi("out", f32, [3, 2])],
                 initializers=[onnx.numpy_helper.from_array(w, "w")])
    s, z = np.array([0.05], f32), np.array([128], u8)
    (got,) = reference_evaluator(m).run(None, {"xq": xq, "s": s, "z": z})
    assert np.array_equal(got, np.maximum(dynamic_dequantize(xq, s, z) @ w, 0))


def _if_model():
    then_graph = h.make_graph(
        [dyndq.make_node(["src", "scales", "zps"], ["t"], qtype="per_channel", axis=0)], "then", [], [vi("t", f32, [2, 3])]
    )
    else_graph = h.make_graph([h.make_node("Neg", ["dense"], ["e"])], "else", [], [vi("e", f32, [2, 3])])
    node = h.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)
    return model_of(
        [node],
        [h.make_tensor_value_info("cond", T.BOOL, []), vi("src", i8, [2, 3]), vi("scales", f32, [2]), vi("zps", i32, [2]),
         vi("dense", f32, [2, 3])],
        [vi("y", f32, [2, 3])],
    )


@pytest.mark.parametrize("cond", [True, False])
def test_inside_an_if_branch(cond):
    m = _if_model()
    onnx.checker.check_model(m, full_check=True)
    src = np.array([[-128, 0, 127], [5, 6, 7]], i8)
    scales = np.array([0.5, -2.0], f32)
    zps = np.array([2**31 - 1, -3], i32)
    dense = np.ones((2, 3), f32)
    (got,) = reference_evaluator(m).run(None, {"cond": np.array(cond), "src": src, "scales": scales, "zps": zps, "dense": dense})
    if cond:
        expect = (src.astype(np.int64) - zps.astype(np.int64)[:, None]).astype(f32) * scales[:, None]
        assert np.array_equal(bits(got), bits(expect))
    else:
        assert np.array_equal(got, -dense)


def test_inside_a_model_local_function():
    """onnx.reference builds function evaluators without the caller's new_ops; ours still run."""
    fn = h.make_function(
        "local", "DequantRelu", ["q", "s"], ["y"],
        [dyndq.make_node(["q", "s"], ["d"]), h.make_node("Relu", ["d"], ["y"])],
        opset_imports=[h.make_opsetid("", 21), dyndq.opset_import()],
    )
    node = h.make_node("DequantRelu", ["q", "s"], ["y"], domain="local")
    m = model_of([node], [vi("q", i8, [4]), vi("s", f32, [1])], [vi("y", f32, [4])], functions=[fn],
                 extra_opsets=[h.make_opsetid("local", 1)])
    q = np.array([-2, -1, 0, 3], i8)
    (got,) = reference_evaluator(m).run(None, {"q": q, "s": np.array([1.5], f32)})
    assert got.tolist() == [0.0, 0.0, 0.0, 4.5]


def test_plain_reference_evaluator_with_new_ops_runs_main_graph():
    m = _alone("per_tensor", 1, u8, None, [2], [1])
    (got,) = ReferenceEvaluator(m, new_ops=[DynamicDequantize]).run(None, {"src": np.array([2, 4], u8), "scales": np.array([0.5], f32)})
    assert got.tolist() == [1.0, 2.0]


def test_bad_use_in_a_graph_raises_validation_error():
    m = _alone("per_channel", 1, u8, None, [2, 3], [2])
    with pytest.raises(ValidationError) as e:
        reference_evaluator(m).run(None, {"src": np.zeros((2, 3), u8), "scales": np.ones(2, f32)})
    assert [p.argument for p in e.value.problems] == ["scales"]


def test_caller_new_ops_come_first():
    class DynamicDequantize(OpRun):  # the same (domain, op type) as ours
        op_domain = DOMAIN
        op_schema = None

        def _run(self, *args, **kwargs):
            return (np.array([42.0], f32),)

    m = _alone("per_tensor", 1, u8, None, [1], [1])
    (got,) = reference_evaluator(m, new_ops=[DynamicDequantize]).run(None, {"src": np.zeros(1, u8), "scales": np.ones(1, f32)})
    assert got.tolist() == [42.0]


# -- DequantizeLinear at opsets 10 and 13 ----------------------------------------------------------


def _dql_model(opset, x_dtype, x_shape, scale, zp=None, axis=None):
    inits = [onnx.numpy_helper.from_array(scale, "s")]
    names = ["x", "s"]
    if zp is not None:
        inits.append(onnx.numpy_helper.from_array(zp, "z"))
        names.append("z")
    attrs = {} if axis is None else {"axis": axis}
    node = h.make_node("DequantizeLinear", names, ["y"], **attrs)
    graph = h.make_graph([node], "g", [vi("x", x_dtype, list(x_shape))], [vi("y", f32, list(x_shape))], initializer=inits)
    imports = [h.make_opsetid("", opset)]
    return h.make_model(graph, opset_imports=imports, ir_version=h.find_min_ir_version_for(imports))


def _ort(model, feeds):
    """ONNX Runtime at its defaults: an oracle of the reference engine's DequantizeLinear of its own."""
    from dyndq.ort_session import OrtSession

    return OrtSession(model, level="all").run(None, feeds)[0]


@pytest.mark.parametrize("opset", [10, 13])
@pytest.mark.parametrize("x_dtype", [u8, i8])
@pytest.mark.parametrize("with_zp", [False, True])
def test_dequantize_linear_per_tensor(opset, x_dtype, with_zp):
    info = np.iinfo(x_dtype)
    x = np.arange(info.min, info.max + 1).astype(x_dtype)
    scale = np.array(0.037, f32)
    zp = np.array(17, x_dtype) if with_zp else None
    m = _dql_model(opset, x_dtype, x.shape, scale, zp)
    onnx.checker.check_model(m, full_check=True)
    (got,) = reference_evaluator(m).run(None, {"x": x})
    expect = (x.astype(np.int64) - (0 if zp is None else int(zp))).astype(f32) * scale
    assert np.array_equal(bits(got), bits(expect))
    assert np.array_equal(bits(got), bits(_ort(m, {"x": x})))


@pytest.mark.parametrize("axis", [None, 0, 1, -1, 2])
@pytest.mark.parametrize("x_dtype", [u8, i8])
def test_dequantize_linear_13_per_axis(axis, x_dtype):
    rng = np.random.default_rng(3)
    x = rng.integers(np.iinfo(x_dtype).min, np.iinfo(x_dtype).max + 1, (2, 3, 4)).astype(x_dtype)
    a = 1 if axis is None else axis
    C = x.shape[a]
    scale = rng.standard_normal(C).astype(f32)
    zp = rng.integers(0, 50, C).astype(x_dtype)
    m = _dql_model(13, x_dtype, x.shape, scale, zp, axis)
    onnx.checker.check_model(m, full_check=True)
    (got,) = reference_evaluator(m).run(None, {"x": x})
    shape = [1, 1, 1]
    shape[a] = C
    expect = (x.astype(np.int64) - zp.astype(np.int64).reshape(shape)).astype(f32) * scale.reshape(shape)
    assert np.array_equal(bits(got), bits(expect))
    assert np.array_equal(bits(got), bits(_ort(m, {"x": x})))


@pytest.mark.parametrize("opset", [10, 13])
def test_dequantize_linear_int32(opset):
    x = np.array([-(2**31), -(2**24) - 1, -1, 0, 1, 2**24 + 1, 2**31 - 1], i32)
    scale = np.array(1.0, f32)
    m = _dql_model(opset, i32, x.shape, scale, np.array(0, i32))
    (got,) = reference_evaluator(m).run(None, {"x": x})
    assert np.array_equal(bits(got), bits(x.astype(np.int64).astype(f32)))
    assert np.array_equal(bits(got), bits(_ort(m, {"x": x})))


@pytest.mark.parametrize("opset", [19, 21])
def test_dequantize_linear_newer_opsets_use_onnx_own(opset):
    x = np.array([0, 3, 5, 255], u8)
    m = _dql_model(opset, u8, x.shape, np.array(0.5, f32), np.array(3, u8))
    (got,) = reference_evaluator(m).run(None, {"x": x})
    assert got.tolist() == [-1.5, 0.0, 1.0, 126.0]


@pytest.mark.parametrize(
    "name, opset",
    # per-axis DequantizeLinear exists from opset 13 on, so the axis case is not stamped 10
    [(n, o) for n in ("test_dequantizelinear", "test_dequantizelinear_axis") for o in (10, 13, None)
     if not (o == 10 and n.endswith("axis"))],
)
def test_onnx_backend_cases_at_old_opsets(name, opset):
    """ONNX's own DequantizeLinear test data, stamped with opset 10 or 13 (or left as shipped)."""
    case = backend_case(name)
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    if opset is not None:
        del m.opset_import[:]
        m.opset_import.append(h.make_opsetid("", opset))
        m.ir_version = h.find_min_ir_version_for(list(m.opset_import))
    ev = reference_evaluator(m)
    for inputs, outputs in case.data_sets:
        feeds = dict(zip([i.name for i in m.graph.input], inputs))
        got = ev.run(None, feeds)
        for g, e in zip(got, outputs):
            assert np.array_equal(bits(g), bits(e))


def test_dequantize_linear_bad_inputs():
    with pytest.raises(ValidationError) as e:
        dequantize_linear(np.zeros(3, u8), np.array(1.0, f32), np.array(0, i8))
    assert [p.argument for p in e.value.problems] == ["x_zero_point"]
    with pytest.raises(ValidationError, match="x_scale"):
        dequantize_linear(np.zeros((2, 3), u8), np.ones(3, f32), opset=10)
    with pytest.raises(ValidationError, match="x_scale"):
        dequantize_linear(np.zeros((2, 3), u8), np.ones(2, f32), axis=1, opset=13)
    with pytest.raises(ValidationError, match="axis"):
        dequantize_linear(np.zeros((2, 3), u8), np.ones(3, f32), axis=2, opset=13)
    with pytest.raises(ValidationError, match="int32"):
        dequantize_linear(np.zeros(3, i32), np.array(1.0, f32), np.array(1, i32))
    with pytest.raises(ValidationError, match="x"):
        dequantize_linear(np.zeros(3, np.int16), np.array(1.0, f32))
