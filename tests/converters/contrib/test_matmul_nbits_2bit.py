"""2-bit MatMulNBits: ONNX Runtime's own 2-bit models lifted into DynamicDequantize-3 with uint2
codes and written back byte for byte; half-integer float zero points (zp = 1.5: the codebook
[-1, -1/3, 1/3, 1] times a scale) lifted exactly as codes 2q, zero points 2zp and scales / 2, and
the forms that are not exact left alone, named.

The weights ONNX Runtime computes are read by running the node with A = identity(K) (each output
one weight), and compared value for value with the lifted graph's on the reference engine, and
with an independent decoding of the packed bytes (numpy.unpackbits, little bit order: code i of
a byte in bits 2i and 2i+1).  Outputs for other inputs are compared with parity.TOLERANCE of their
largest magnitude (the engines sum in their own orders).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx.reference
import pytest
from decoder import decoder_model, ort_quantize
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq.parity import TOLERANCE
from dyndq.ort_session import OrtSession

FLOAT = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def on_ort(model, feeds):
    return OrtSession(model, level="basic").run(None, feeds)[0]


def decoded(packed: np.ndarray) -> np.ndarray:
    """2-bit codes from bytes, four a byte, the first in the lowest bits (by numpy.unpackbits,
    not by the code under test)."""
    bits = np.unpackbits(packed[..., None], axis=-1, bitorder="little")  # [..., bytes, 8]
    pairs = bits.reshape(*packed.shape, 4, 2)
    return (pairs[..., 0] + 2 * pairs[..., 1]).reshape(*packed.shape[:-1], packed.shape[-1] * 4).astype(np.int64)


def attrs_of(node):
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def alone(model, node):
    """The MatMulNBits node alone, in a model of its own, reading A [M, K]."""
    used = set(node.input)
    attrs = attrs_of(node)
    t = next(x for x in model.graph.initializer if x.name == node.input[2]).data_type
    single = helper.make_node(node.op_type, ["A"] + list(node.input[1:]), ["Y"], name=node.name, domain=node.domain,
                              **attrs)
    graph = helper.make_graph([single], "one", [helper.make_tensor_value_info("A", t, ["M", attrs["K"]])],
                              [helper.make_tensor_value_info("Y", t, ["M", attrs["N"]])],
                              [x for x in model.graph.initializer if x.name in used])
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


@pytest.fixture(scope="module")
def float_model():
    return decoder_model(hidden=64, layers=1, vocab=128)


@pytest.mark.parametrize("block, sym", [(16, False), (32, True), (128, False)])
def test_onnxruntime_s_own_two_bit_models_lift_exactly_and_round_trip_byte_for_byte(float_model, block, sym):
    model = ort_quantize(float_model, "QOperator", 2, block, sym)
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert nodes and all(attrs_of(n)["bits"] == 2 for n in nodes)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == len(nodes) and not report.skipped and dyndq.check(lifted) == []
    assert {o.domain: o.version for o in lifted.opset_import}[dyndq.DOMAIN] == 3
    held = {t.name: numpy_helper.to_array(t) for t in lifted.graph.initializer}
    codes = [held[n.input[0]] for n in lifted.graph.node if n.op_type == "DynamicDequantize"]
    assert len(codes) == len(nodes) and all(c.dtype == ml_dtypes.uint2 for c in codes)

    for node in nodes:  # the weights, value for value: ONNX Runtime's, the lift's, the bytes' own decoding
        one = alone(model, node)
        a = attrs_of(node)
        K, N, width = a["K"], a["N"], a["block_size"]
        eye = np.eye(K, dtype=np.float32)
        theirs = on_ort(one, {"A": eye})
        ours = dyndq.run(dyndq.lift(one), {"A": eye}, engine="reference")["Y"]
        assert np.array_equal(ours, theirs), node.name
        inits = {x.name: numpy_helper.to_array(x) for x in one.graph.initializer}
        q = decoded(inits[node.input[1]].reshape(N, -1))  # [N, K_pad]
        scales = inits[node.input[2]].reshape(N, -1)
        blocks = scales.shape[1]
        zero = (decoded(inits[node.input[3]].reshape(N, -1))[:, :blocks] if len(node.input) > 3 and node.input[3]
                else np.full((N, blocks), 2))  # (absent: 2, 2^(bits-1))
        expected = ((q - np.repeat(zero, width, 1)).astype(np.float32) * np.repeat(scales, width, 1)).T[:K]
        assert np.array_equal(theirs, expected), node.name

    back, written = dyndq.export_with_report(lifted, target="onnxruntime")
    assert len(written.foreign) == len(nodes)
    assert [(t.name, t.SerializeToString()) for t in back.graph.initializer] == \
        [(t.name, t.SerializeToString()) for t in model.graph.initializer]
    assert [n.SerializeToString() for n in back.graph.node] == [n.SerializeToString() for n in model.graph.node]

    # standard ONNX: on ONNX Runtime and on onnx.reference, the quantized model's outputs
    ids = np.random.default_rng(block).integers(0, 128, (2, 5))
    expected = on_ort(model, {"input_ids": ids})
    standard = dyndq.export(lifted)
    assert not {n.domain for n in standard.graph.node} - {"", "ai.onnx"}
    onnx.checker.check_model(standard, full_check=True)
    bound = TOLERANCE * np.abs(expected).max()
    assert np.abs(on_ort(standard, {"input_ids": ids}) - expected).max() <= bound
    reference = onnx.reference.ReferenceEvaluator(standard).run(None, {"input_ids": ids})[0]
    assert np.abs(reference - expected).max() <= bound


def half_zero_point_model(scales, zero, K=64, block=16, seed=0, t="float16"):
    """One 2-bit MatMulNBits with float zero points `zero` [N, blocks] and scales [N, blocks]."""
    N, blocks = np.shape(scales)
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 4, (N, blocks * block))
    packed = np.packbits(np.stack([q & 1, q >> 1], -1).reshape(N, -1, 8)[..., ::-1], axis=-1).reshape(N, blocks, -1)
    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(np.asarray(scales, t), "scales"),
             numpy_helper.from_array(np.asarray(zero, t).reshape(-1), "zp")]
    node = helper.make_node("MatMulNBits", ["A", "B", "scales", "zp"], ["Y"], name="codebook", domain="com.microsoft",
                            K=K, N=N, bits=2, block_size=block)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", FLOAT[t], ["M", K])],
                              [helper.make_tensor_value_info("Y", FLOAT[t], ["M", N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    return model, q


def test_packing_of_the_hand_built_models_is_onnxruntime_s():
    """(the builder above packs with numpy.packbits: checked against the kernel, zero points of 2)"""
    scales = np.full((3, 4), 0.5)
    model, q = half_zero_point_model(scales, np.full((3, 4), 2.0), t="float32")
    assert np.array_equal(on_ort(model, {"A": np.eye(64, dtype=np.float32)}), ((q - 2) * 0.5).T)


@pytest.mark.parametrize("zero, zps_type", [
    (np.full((5, 4), 1.5), "uint4"),  # the codebook [-1, -1/3, 1/3, 1] for scales 2/3 * alpha
    (np.array([[1.5, 2.0, -0.5, 3.5]] * 5), "int4"),  # integers and half-integers, one below 0
    (np.array([[9.5, 0.5, 1.0, 2.5]] * 5), "uint8"),
])
def test_half_integer_zero_points_lift_exactly_doubled_and_write_back_byte_for_byte(zero, zps_type):
    alpha = np.random.default_rng(1).uniform(0.01, 0.1, (5, 4))
    model, q = half_zero_point_model(2 / 3 * alpha, zero)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and not report.skipped and dyndq.check(lifted) == []
    held = {t.name: numpy_helper.to_array(t) for t in lifted.graph.initializer}
    ddq = next(n for n in lifted.graph.node if n.op_type == "DynamicDequantize")
    codes, scales, zps = (held[name] for name in ddq.input)
    assert codes.dtype == ml_dtypes.uint4 and np.array_equal(codes.astype(int), 2 * q.T)
    assert zps.dtype == getattr(ml_dtypes, zps_type, np.dtype(zps_type)) and np.array_equal(zps.astype(int), 2 * zero.T)
    original = numpy_helper.to_array(model.graph.initializer[1])
    assert np.array_equal(scales.T * 2, original)  # halved, exactly
    # the cost, in bytes, named: codes 64x5 at 4 bits, scales 4x5 float16, zero points 4x5
    zps_bytes = {"uint4": 10, "int4": 10, "uint8": 20}[zps_type]
    after, before = 160 + 40 + zps_bytes, 80 + 40 + 40
    assert report.notes == [f"com.microsoft::MatMulNBits 'codebook': half-integer zero points lifted exactly as codes 2q "
                            f"(uint4), zero points 2zp ({zps_type}) and scales / 2: {after} bytes of codes, scales and "
                            f"zero points for MatMulNBits' {before} ({after - before:+d})"]

    eye = np.eye(64, dtype=np.float16)
    theirs = on_ort(model, {"A": eye})
    exact = ((q - np.repeat(zero, 16, 1)) * np.repeat(original.astype(np.float64), 16, 1)).T.astype(np.float16)
    assert np.array_equal(theirs, exact)  # float16 scales: ONNX Runtime's float32 arithmetic is exact here
    assert np.array_equal(dyndq.run(lifted, {"A": eye}, engine="reference")["Y"], theirs)
    standard = dyndq.export(lifted)
    assert np.array_equal(on_ort(standard, {"A": eye}), theirs)
    assert np.array_equal(onnx.reference.ReferenceEvaluator(standard).run(None, {"A": eye})[0], theirs)

    back = dyndq.export(lifted, target="onnxruntime")
    assert [(t.name, t.SerializeToString()) for t in back.graph.initializer] == \
        [(t.name, t.SerializeToString()) for t in model.graph.initializer]
    assert back.graph.node[0].input[:4] == model.graph.node[0].input[:4]


def test_half_integer_zero_points_with_float32_scales_are_lifted_only_where_onnxruntime_is_exact():
    """ONNX Runtime computes q*scale - zp*scale in float32 (two roundings and a third for the
    difference): with scales of full precision it differs from (q - zp)*scale, and the node is left
    alone with the count of weights that differ (the count checked here against ONNX Runtime's own
    weights); with powers of two as scales nothing rounds and it is lifted."""
    rng = np.random.default_rng(2)
    zero = np.full((6, 4), 1.5)
    full = rng.uniform(0.01, 0.1, (6, 4)).astype(np.float32)
    model, q = half_zero_point_model(full, zero, t="float32")
    lifted, report = dyndq.lift_with_report(model)
    theirs = on_ort(model, {"A": np.eye(64, dtype=np.float32)})
    exact = ((q - 1.5) * np.repeat(full.astype(np.float64), 16, 1)).T.astype(np.float32)
    differ = int(np.count_nonzero(theirs != exact))
    assert differ and report.count == 0
    assert report.skipped[0].reason == (f"float zero points: ONNX Runtime computes q*scale - zp*scale there, which "
                                        f"differs from (q - zp)*scale in {differ} of 384 weights")
    assert lifted.SerializeToString() == model.SerializeToString()

    powers = (2.0 ** -rng.integers(3, 9, (6, 4))).astype(np.float32)
    model, _ = half_zero_point_model(powers, zero, t="float32")
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1
    eye = np.eye(64, dtype=np.float32)
    assert np.array_equal(dyndq.run(lifted, {"A": eye}, engine="reference")["Y"], on_ort(model, {"A": eye}))
    back = dyndq.export(lifted, target="onnxruntime")
    assert [t.SerializeToString() for t in back.graph.initializer] == [t.SerializeToString() for t in model.graph.initializer]


def test_scales_whose_halves_are_not_exact_are_left_alone_and_named():
    scales = np.full((2, 4), 0.03, np.float16)
    scales[1, 2] = np.float16(2.0**-24)  # the smallest subnormal: its half is 0 in float16
    scales[0, 0] = np.float16(3 * 2.0**-24)
    model, _ = half_zero_point_model(scales, np.full((2, 4), 1.5))
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 0
    assert report.skipped[0].reason == ("half-integer zero points: lifted as (2q - 2zp) * (scales / 2), but halving is "
                                        "not exact for 2 of the 8 scales (subnormals)")
    assert lifted.SerializeToString() == model.SerializeToString()


def test_doubled_codes_changed_since_the_lift_are_not_written_as_half_integers():
    """The way back divides by two what the lift doubled: codes no longer even are written as the
    4-bit codes they are (and scales as they are), which computes the same."""
    model, _ = half_zero_point_model(np.full((2, 4), 0.25), np.full((2, 4), 1.5))
    lifted = dyndq.lift(model)
    ddq = next(n for n in lifted.graph.node if n.op_type == "DynamicDequantize")
    codes = next(t for t in lifted.graph.initializer if t.name == ddq.input[0])
    values = numpy_helper.to_array(codes).astype(int)
    values[0, 0] = 7
    codes.CopyFrom(numpy_helper.from_array(values.astype(ml_dtypes.uint4), codes.name))
    back, report = dyndq.export_with_report(lifted, target="onnxruntime")
    [node] = back.graph.node
    assert attrs_of(node)["bits"] == 4 and "bits 4" in report.foreign[0].form
    eye = np.eye(64, dtype=np.float16)
    assert np.array_equal(on_ort(back, {"A": eye}), dyndq.run(lifted, {"A": eye}, engine="reference")["Y"])


@pytest.mark.openvino
def test_two_bit_weights_exported_for_openvino_are_onnxruntime_s():
    """OpenVINO has no uint2 tensors: export re-encodes the constant codes and zero points as uint8
    values (converters/engines.py); the weights it computes are still ONNX Runtime's, value for value."""
    from engines import run_openvino

    w = numpy_helper.from_array((np.random.default_rng(3).standard_normal((80, 24)) * 0.05).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "w"], ["Y"], name="proj")], "g",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", 80])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", 24])], [w])
    model = ort_quantize(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]),
                         "QOperator", 2, 32, False)
    exported = dyndq.export(dyndq.lift(model), target="openvino")
    assert {t.data_type for t in exported.graph.initializer} <= {TensorProto.UINT8, TensorProto.FLOAT, TensorProto.INT64}
    eye = np.eye(80, dtype=np.float32)
    [got] = run_openvino(exported, {"A": eye})
    assert np.array_equal(got, on_ort(model, {"A": eye}))


def test_int2_codes_are_written_as_unsigned_two_bit_codes_shifted_by_two():
    """Signed 2-bit codes (ours: int2, [-2, 1]) become MatMulNBits' unsigned ones with their zero
    points, both shifted by 2: every difference q - zp stays as it was (no zero point: 2, absent)."""
    rng = np.random.default_rng(4)
    codes = rng.integers(-2, 2, (48, 5))
    scales = rng.uniform(0.01, 0.1, (3, 5)).astype(np.float32)
    nodes = [dyndq.make_node(["q", "s"], ["w"], name="dq", qtype="per_group", group_shape=[16, 1]),
             helper.make_node("MatMul", ["A", "w"], ["Y"], name="mm")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", 48])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", 5])],
                              [numpy_helper.from_array(codes.astype(ml_dtypes.int2), "q"),
                               numpy_helper.from_array(scales, "s")])
    model = dyndq.make_model(graph)
    back, report = dyndq.export_with_report(model, target="onnxruntime")
    [node] = back.graph.node
    assert node.op_type == "MatMulNBits" and attrs_of(node)["bits"] == 2 and list(node.input[3:]) == []
    assert "bits 2" in report.foreign[0].form
    packed = numpy_helper.to_array(next(t for t in back.graph.initializer if t.name == node.input[1]))
    assert np.array_equal(decoded(packed.reshape(5, -1)), codes.T + 2)
    eye = np.eye(48, dtype=np.float32)
    ours = dyndq.run(model, {"A": eye}, engine="reference")["Y"]
    assert np.array_equal(ours, (codes * np.repeat(scales, 16, 0)).astype(np.float32))
    assert np.array_equal(on_ort(back, {"A": eye}), ours)


def test_a_two_bit_matmul_nbits_in_a_function_lifts_into_a_valid_model_and_back_with_its_bytes():
    """A function importing ai.onnx 21 cannot hold uint2 codes in a Constant node (Constant-25 takes
    them): the lifted codes are passed in from the main graph, and the export takes them back in."""
    from dyndq.converters.contrib import shared as foreign

    rng = np.random.default_rng(0)
    K, N, block = 64, 8, 32
    B = foreign.pack(rng.integers(0, 4, (N, K)), 2).reshape(N, K // block, block // 4)
    tensors = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(rng.uniform(0.01, 0.05, (N, K // block))
                                                                       .astype(np.float32), "s")]
    body = [helper.make_node("Constant", [], [t.name], name=f"{t.name}_const", value=t) for t in tensors] + [
        helper.make_node("MatMulNBits", ["a", "B", "s"], ["b"], name="mm", domain="com.microsoft", K=K, N=N, bits=2,
                         block_size=block)]
    imports = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    fn = helper.make_function("local", "Proj", ["a"], ["b"], body, imports)
    graph = helper.make_graph([helper.make_node("Proj", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", N])])
    model = helper.make_model(graph, opset_imports=imports + [helper.make_opsetid("local", 1)], functions=[fn],
                              ir_version=10)
    lifted = dyndq.lift(model)
    onnx.checker.check_model(lifted, full_check=True)
    assert [t.data_type for t in lifted.graph.initializer] == [TensorProto.UINT2, TensorProto.UINT2]
    eye = {"x": np.eye(K, dtype=np.float32)}
    assert np.array_equal(dyndq.run(lifted, eye, engine="reference")["y"], on_ort(model, eye))
    back = dyndq.export(lifted, target="onnxruntime")
    assert not back.graph.initializer and list(back.functions[0].input) == ["a"]
    # (the same constants and node, byte for byte; the Constant nodes' own names are not kept through the main graph)
    assert [n.attribute[0].t.SerializeToString() for n in back.functions[0].node[:2]] == \
        [t.SerializeToString() for t in tensors]
    assert back.functions[0].node[2].SerializeToString() == body[2].SerializeToString()


@pytest.mark.parametrize("main_bits, function_bits", [(4, 2), (2, 4)])
def test_a_function_and_the_graph_lifted_to_versions_2_and_3_import_one_version(main_bits, function_bits):
    """ONNX's checker resolves a function's nodes under its import of org.dyndq and the model's: both
    are raised to 3 (which holds every version 2 node), whichever holds the 2-bit codes."""
    from dyndq.converters.contrib import shared as foreign

    rng = np.random.default_rng(0)
    K = N = 32

    def layer(tag, x, y, bits):
        q = rng.integers(0, 2**bits, (N, K))
        tensors = [numpy_helper.from_array(foreign.pack(q, bits).reshape(N, 1, K * bits // 8), f"B_{tag}"),
                   numpy_helper.from_array(rng.uniform(0.01, 0.05, (N, 1)).astype(np.float32), f"s_{tag}")]
        return helper.make_node("MatMulNBits", [x, f"B_{tag}", f"s_{tag}"], [y], domain="com.microsoft", K=K, N=N,
                                bits=bits, block_size=K), tensors

    main, main_tensors = layer("main", "x", "h", main_bits)
    inner, inner_tensors = layer("fn", "a", "b", function_bits)
    imports = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    fn = helper.make_function("local", "P", ["a"], ["b"], [helper.make_node("Constant", [], [t.name], value=t)
                                                           for t in inner_tensors] + [inner], imports)
    graph = helper.make_graph([main, helper.make_node("P", ["h"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, N])], main_tensors)
    model = helper.make_model(graph, opset_imports=imports + [helper.make_opsetid("local", 1)], functions=[fn],
                              ir_version=10)
    lifted = dyndq.lift(model)
    versions = [o.version for o in [*lifted.opset_import, *lifted.functions[0].opset_import] if o.domain == dyndq.DOMAIN]
    assert versions == [3, 3]
    onnx.checker.check_model(lifted, full_check=True)
    x = {"x": rng.standard_normal((2, K)).astype(np.float32)}
    got = dyndq.run(lifted, x, engine="reference")["y"]
    assert np.abs(got - on_ort(model, x)).max() <= TOLERANCE * np.abs(got).max()
