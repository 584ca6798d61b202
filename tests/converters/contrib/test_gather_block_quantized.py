"""com.microsoft::GatherBlockQuantized <-> DynamicDequantize-2 + Gather: lifted exactly (every row
ONNX Runtime gathers equals, in value, the lifted graph's on our reference engine and on ONNX
Runtime after the standard export) and written back byte for byte; over data types (int4, uint4,
uint8 with 2, 4 and 8 bits), axes, block sizes, padding and zero points.  ONNX Runtime's own
quantizer writes GatherBlockQuantized of int4/uint4 data only: the uint8 tables here are built
following its kernel's packing (codes and zero points low bits first along the last axis, each
row of zero points padded to whole bytes), which the tests check against the kernel's output."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx.reference
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq.converters.contrib import shared as foreign
from dyndq.ort_session import OrtSession

FLOAT = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def gather_block_quantized(kind, shape, qa, ga, block, with_zp, bits=4, t="float32", seed=0, explicit=True,
                           zp_padding=0):
    """A model of one GatherBlockQuantized; the codes and zero points as ints (logical shapes).
    Packed zero points: each row padded to whole bytes with `zp_padding`."""
    rng = np.random.default_rng(seed)
    r = len(shape)
    blocks = -(-shape[qa % r] // block)
    sshape = tuple(blocks if i == qa % r else d for i, d in enumerate(shape))
    lo, hi = {"int4": (-8, 7), "uint4": (0, 15)}.get(kind, (0, 2**bits - 1))
    codes = rng.integers(lo, hi + 1, shape)
    zero = rng.integers(lo, hi + 1, sshape) if with_zp else np.full(sshape, 0 if kind != "uint8" else 2 ** (bits - 1))
    if kind == "uint8":
        pad = np.full(zero.shape[:-1] + ((-zero.shape[-1]) % (8 // bits),), zp_padding)
        data, zp = foreign.pack(codes, bits), foreign.pack(np.concatenate([zero, pad], -1), bits) if with_zp else None
    else:
        data, zp = codes.astype(getattr(ml_dtypes, kind)), zero.astype(getattr(ml_dtypes, kind))
    scales = (rng.standard_normal(sshape) * 0.1).astype(t)
    inits = [numpy_helper.from_array(data, "data"), numpy_helper.from_array(scales, "scales")]
    inputs = ["data", "idx", "scales"]
    if with_zp:
        inits.append(numpy_helper.from_array(zp, "zp"))
        inputs.append("zp")
    attrs = dict(quantize_axis=qa, gather_axis=ga, block_size=block) if explicit else {}
    if kind == "uint8" or bits != 4:
        attrs["bits"] = bits
    node = helper.make_node("GatherBlockQuantized", inputs, ["y"], name="embed", domain="com.microsoft", **attrs)
    out = list(shape[:ga % r]) + ["n"] + list(shape[ga % r + 1:])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, ["n"])],
                              [helper.make_tensor_value_info("y", FLOAT[t], out)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    return model, codes, zero, scales


def on_ort(model, idx):
    return OrtSession(model, level="all").run(None, {"idx": idx})[0]  # (ONNX Runtime at its defaults)


@st.composite
def forms(draw):
    kind = draw(st.sampled_from(["int4", "uint4", "uint8"]))
    bits = draw(st.sampled_from([2, 4, 8])) if kind == "uint8" else 4
    block = draw(st.sampled_from([16, 32, 64]))
    rank = 2 if kind == "uint8" else draw(st.integers(2, 3))
    if kind == "uint8":  # ONNX Runtime: gather_axis 0, quantize_axis last, codes packed along it
        qa, ga = draw(st.sampled_from([rank - 1, -1])), 0
    else:
        qa, ga = draw(st.integers(-rank, rank - 1)), draw(st.integers(-rank, rank - 1))
    shape = [draw(st.integers(1, 5)) for _ in range(rank)]
    per = 8 // bits if kind == "uint8" else 1  # (codes a byte of uint8 data: its rows are whole bytes)
    shape[qa % rank] = draw(st.integers(1, 2 * block)) if kind != "uint8" else per * draw(st.integers(1, 2 * block // per))
    return dict(kind=kind, shape=tuple(shape), qa=qa, ga=ga, block=block, with_zp=draw(st.booleans()), bits=bits,
                t=draw(st.sampled_from(["float32", "float16"])), seed=draw(st.integers(0, 2**32 - 1)),
                zp_padding=draw(st.sampled_from([0, 2**bits - 1])) if kind == "uint8" and bits < 8 else 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forms())
def test_lifted_rows_equal_gather_block_quantized_and_write_back_byte_for_byte(p):
    model, codes, zero, scales = gather_block_quantized(**p)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and not report.skipped and dyndq.check(lifted) == []
    r = len(p["shape"])
    qa, ga, block = p["qa"] % r, p["ga"] % r, p["block"]
    rows = p["shape"][ga]
    idx = np.arange(-rows, rows, dtype=np.int64)
    expand = lambda a: np.repeat(a, block, axis=qa).take(range(p["shape"][qa]), axis=qa)  # noqa: E731
    table = ((codes - expand(zero)).astype(np.float32) * expand(scales.astype(np.float32))).astype(p["t"])
    expected = np.take(table, idx, axis=ga)
    assert np.array_equal(on_ort(model, idx), expected)
    assert np.array_equal(dyndq.run(lifted, {"idx": idx}, engine="reference")["y"], expected)
    assert np.array_equal(on_ort(dyndq.export(lifted), idx), expected)

    back, written = dyndq.export_with_report(lifted, target="onnxruntime")
    assert [n.form.split(" (")[0] for n in written.foreign] == ["com.microsoft::GatherBlockQuantized"]
    assert {t.name: t.SerializeToString() for t in back.graph.initializer} == \
        {t.name: t.SerializeToString() for t in model.graph.initializer}
    assert [n.SerializeToString() for n in back.graph.node] == [n.SerializeToString() for n in model.graph.node]


def test_attributes_left_at_their_defaults_stay_so():
    model, *_ = gather_block_quantized("uint4", (6, 256), 1, 0, 128, True, explicit=False)
    back = dyndq.export(dyndq.lift(model), target="onnxruntime")
    assert back.graph.node[0].SerializeToString() == model.graph.node[0].SerializeToString()


def test_uint8_absent_zero_point_is_written_out():
    model, *_ = gather_block_quantized("uint8", (4, 64), 1, 0, 32, False, bits=8)
    lifted = dyndq.lift(model)
    ddq = next(n for n in lifted.graph.node if n.op_type == "DynamicDequantize")
    zps = numpy_helper.to_array(next(t for t in lifted.graph.initializer if t.name == ddq.input[2]))
    assert zps.dtype == np.uint8 and np.all(zps == 128)


def test_padding_of_the_blocked_axis_is_cut_by_a_slice():
    model, codes, *_ = gather_block_quantized("int4", (5, 40), 1, 0, 16, True)
    lifted = dyndq.lift(model)
    assert [n.op_type for n in lifted.graph.node if n.op_type != "Constant"] == ["DynamicDequantize", "Slice", "Gather"]
    padded = next(t for t in lifted.graph.initializer if t.name == "data")
    assert list(padded.dims) == [5, 48]


@pytest.mark.parametrize("with_zp", [False, True])
def test_two_bit_codes_are_lifted_as_uint2_under_version_3(with_zp):
    """uint8 data of bits=2 (4 codes a byte, low bits first; absent zero point 2) becomes uint2
    codes and zero points under DynamicDequantize-3, the absent zero point written out."""
    model, codes, zero, _ = gather_block_quantized("uint8", (4, 64), 1, 0, 16, with_zp, bits=2, zp_padding=3)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and dyndq.check(lifted) == []
    assert {o.domain: o.version for o in lifted.opset_import}[dyndq.DOMAIN] == 3
    ddq = next(n for n in lifted.graph.node if n.op_type == "DynamicDequantize")
    held = {t.name: numpy_helper.to_array(t) for t in lifted.graph.initializer}
    assert held[ddq.input[0]].dtype == ml_dtypes.uint2 and np.array_equal(held[ddq.input[0]].astype(int), codes)
    assert held[ddq.input[2]].dtype == ml_dtypes.uint2 and np.array_equal(held[ddq.input[2]].astype(int), zero)
    assert np.all(zero == 2) or with_zp
    idx = np.array([3, 0, 2, 2], np.int64)
    standard = dyndq.export(lifted)
    expected = on_ort(model, idx)
    assert np.array_equal(on_ort(standard, idx), expected)
    assert np.array_equal(onnx.reference.ReferenceEvaluator(standard).run(None, {"idx": idx})[0], expected)
    back = dyndq.export(lifted, target="onnxruntime")  # (the padding of the zero points' rows, 3, kept)
    assert {t.name: t.SerializeToString() for t in back.graph.initializer} == \
        {t.name: t.SerializeToString() for t in model.graph.initializer}


def test_two_bit_rows_of_partial_bytes_are_not_written_as_uint8_data():
    """uint8 data holds 4 codes a byte and ONNX Runtime takes its row length times 4: a table of
    rows of 18 codes (32 cut by a Slice) has no GatherBlockQuantized form, and export says so."""
    inits = [numpy_helper.from_array(np.zeros((3, 32), np.uint8).astype(ml_dtypes.uint2), "codes"),
             numpy_helper.from_array(np.ones((3, 2), np.float32), "scales")]
    inits += [numpy_helper.from_array(np.array([v]), n) for n, v in (("start", 0), ("end", 18), ("axis", 1))]
    nodes = [helper.make_node("DynamicDequantize", ["codes", "scales"], ["table"], domain=dyndq.DOMAIN,
                              qtype="per_group", group_shape=[1, 16]),
             helper.make_node("Slice", ["table", "start", "end", "axis"], ["cut"]),
             helper.make_node("Gather", ["cut", "idx"], ["y"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 18])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(dyndq.DOMAIN, 3)],
                              ir_version=11)
    back, report = dyndq.export_with_report(model, target="onnxruntime")
    assert "GatherBlockQuantized" not in {n.op_type for n in back.graph.node}
    assert any("2-bit codes: rows of 18 codes, not whole bytes of 4" in line for line in report.lines()), report.lines()


def test_zero_points_outside_the_two_bit_codes_range_are_not_written():
    """int32 zero points beside uint2 codes: one of 5 has no 2-bit code, and export says so naming
    the codes' range (not the uint8 data's, which would take it)."""
    zps = np.zeros((3, 2), np.int32)
    inits = [numpy_helper.from_array(np.zeros((3, 32), np.uint8).astype(ml_dtypes.uint2), "codes"),
             numpy_helper.from_array(np.ones((3, 2), np.float32), "scales"), numpy_helper.from_array(zps, "zps")]
    nodes = [helper.make_node("DynamicDequantize", ["codes", "scales", "zps"], ["table"], domain=dyndq.DOMAIN,
                              qtype="per_group", group_shape=[1, 16]),
             helper.make_node("Gather", ["table", "idx"], ["y"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(dyndq.DOMAIN, 3)],
                              ir_version=11)
    written = dyndq.export(model, target="onnxruntime")
    assert "GatherBlockQuantized" in {n.op_type for n in written.graph.node}  # (3 is a 2-bit code: taken)
    zps[1, 0] = 5
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(zps, "zps"))
    back, report = dyndq.export_with_report(model, target="onnxruntime")
    assert "GatherBlockQuantized" not in {n.op_type for n in back.graph.node}
    assert any("zero points outside uint2's range" in line for line in report.lines()), report.lines()


def test_float8_data_is_left_alone():
    data = numpy_helper.from_array(np.zeros((4, 32), np.float32).astype(ml_dtypes.float8_e4m3fn), "data")
    scales = numpy_helper.from_array(np.ones((4, 1), np.float32), "scales")
    node = helper.make_node("GatherBlockQuantized", ["data", "idx", "scales"], ["y"], domain="com.microsoft",
                            quantize_axis=1, gather_axis=0, block_size=32)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [data, scales])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    _, report = dyndq.lift_with_report(model)
    assert "float8_e4m3fn: DynamicDequantize takes integer codes" in report.skipped[0].reason


@pytest.mark.openvino
def test_two_bit_rows_exported_for_openvino_are_onnxruntime_s():
    """(OpenVINO has no uint2 tensors: the constant codes are re-encoded as uint8 values)"""
    from engines import run_openvino

    model, *_ = gather_block_quantized("uint8", (6, 48), 1, 0, 16, True, bits=2, zp_padding=1)
    exported = dyndq.export(dyndq.lift(model), target="openvino")
    assert TensorProto.UINT2 not in {t.data_type for t in exported.graph.initializer}
    idx = np.array([5, 0, 3, 3], np.int64)
    [got] = run_openvino(exported, {"idx": idx})
    assert np.array_equal(got, on_ort(model, idx))
