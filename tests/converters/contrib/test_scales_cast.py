"""Float16 scales of a float32 result: MatMulNBits and GatherBlockQuantized take scales of A's
type (their output's), so the fused import writes a GGUF Q4_0/Q8_0 weight's float16 d as it is
stored and a Cast to float32 feeding the op (exact: every float16 is a float32), not a float32
copy.  Our form of it is DynamicDequantize-3 with float16 scales and output_dtype float32.

Checked here: that form is written as Cast + the fused op; the fused op with its scales through
the Cast gives the same bits as with float32 scales stored, at every ONNX Runtime optimisation
level (the Cast folded at load from level basic; run each time with optimisations off); the
lift takes the Cast back (DynamicDequantize-3, output_dtype float32, the Cast gone where the
node was its one reader) and the export writes the same initializers again, byte for byte."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq.converters.contrib import shared as foreign
from dyndq.ort_session import OrtSession

K, N, BLOCK = 96, 40, 32  # (K padded to 3 blocks: no Slice)


def scales16(shape, seed=0) -> np.ndarray:
    """float16 scales over the whole finite range (subnormals, -0 and 65504 among them)."""
    rng = np.random.default_rng(seed)
    s = rng.integers(0, 1 << 16, shape, dtype=np.uint16).view(np.float16)
    s[~np.isfinite(s)] = np.float16(0.5)
    s.flat[:4] = np.array([6e-8, -0.0, 65504, -65504], np.float16)
    return s


def scales_given(s: np.ndarray, cast: bool) -> tuple[list, list]:
    """(nodes, initializers) making "scales": a Cast to float32 of the float16 `s` stored as "d"
    (`cast`), or `s` stored float32."""
    if cast:
        return ([helper.make_node("Cast", ["d"], ["scales"], name="d_Cast", to=TensorProto.FLOAT)],
                [numpy_helper.from_array(s, "d")])
    return [], [numpy_helper.from_array(s.astype(np.float32), "scales")]


def matmul_nbits(bits: int, cast: bool, seed=0) -> onnx.ModelProto:
    """One MatMulNBits, float32 A, its scales a Cast of float16 ones (`cast`) or the same values stored float32."""
    rng = np.random.default_rng(seed)
    blocks = K // BLOCK
    B = foreign.pack(rng.integers(0, 1 << bits, (N, K)), bits).reshape(N, blocks, BLOCK * bits // 8)
    s = scales16((N, blocks), seed)
    nodes, inits = scales_given(s, cast)
    inits.insert(0, numpy_helper.from_array(B, "B"))
    nodes.append(helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], name="mm", domain="com.microsoft",
                                  K=K, N=N, bits=bits, block_size=BLOCK, accuracy_level=0))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def gather_block_quantized(bits: int, cast: bool, seed=0) -> onnx.ModelProto:
    """One GatherBlockQuantized of uint8 data [N, K], float32 output, its scales as `matmul_nbits`'."""
    rng = np.random.default_rng(seed)
    data = foreign.pack(rng.integers(0, 1 << bits, (N, K)), bits)
    s = scales16((N, K // BLOCK), seed)
    nodes, inits = scales_given(s, cast)
    inits.insert(0, numpy_helper.from_array(data, "data"))
    nodes.append(helper.make_node("GatherBlockQuantized", ["data", "idx", "scales"], ["y"], name="embed",
                                  domain="com.microsoft", bits=bits, block_size=BLOCK, gather_axis=0, quantize_axis=1))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, ["n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", K])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def initializers(model):
    return {t.name: t.SerializeToString() for t in model.graph.initializer}


def bits_of(y: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(y, np.float32).view(np.uint32)


@pytest.mark.parametrize("bits", [4, 8])
def test_matmul_nbits_scales_through_a_cast_give_the_float32_scales_bits_at_every_level(bits):
    A = np.concatenate([np.eye(K, dtype=np.float32),
                        np.random.default_rng(1).standard_normal((5, K)).astype(np.float32)])
    want = bits_of(OrtSession(matmul_nbits(bits, cast=False), level="all").run(None, {"A": A})[0])
    for level in ("off", "basic", "all"):  # (off: the Cast runs each time; basic and up: folded at load)
        got = OrtSession(matmul_nbits(bits, cast=True), level=level).run(None, {"A": A})[0]
        assert np.array_equal(bits_of(got), want), level


@pytest.mark.parametrize("bits", [4, 8])
def test_matmul_nbits_with_cast_scales_lifts_to_output_dtype_float32_and_exports_back_byte_for_byte(bits):
    model = matmul_nbits(bits, cast=True)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and not report.skipped and dyndq.check(lifted) == []
    [ddq] = [n for n in lifted.graph.node if n.op_type == "DynamicDequantize"]
    assert [n.op_type for n in lifted.graph.node] == ["DynamicDequantize", "MatMul"]  # (the Cast gone with the node)
    attrs = {a.name: helper.get_attribute_value(a) for a in ddq.attribute}
    assert attrs["output_dtype"] == TensorProto.FLOAT
    inits = {t.name: t for t in lifted.graph.initializer}
    assert inits[ddq.input[1]].data_type == TensorProto.FLOAT16  # (the checkpoint's d, as stored)
    eye = np.eye(K, dtype=np.float32)
    effective = OrtSession(matmul_nbits(bits, cast=False), level="all").run(None, {"A": eye})[0]
    on_ours = dyndq.run(lifted, {"A": eye}, engine="reference")["Y"]
    assert np.array_equal(on_ours, effective)  # (values: a -0 weight shows as +0 through A = identity)

    back, written = dyndq.export_with_report(lifted, target="onnxruntime")
    assert [n.op_type for n in back.graph.node] == ["Cast", "MatMulNBits"], [n.op_type for n in back.graph.node]
    assert initializers(back) == initializers(model)
    cast, fused = back.graph.node
    assert cast.input[0] == "d" and fused.input[2] == cast.output[0] and cast.attribute[0].i == TensorProto.FLOAT
    assert {a.name: a.i for a in fused.attribute} == {a.name: a.i for a in model.graph.node[1].attribute}
    A = np.random.default_rng(2).standard_normal((3, K)).astype(np.float32)
    assert np.array_equal(bits_of(OrtSession(back, level="all").run(None, {"A": A})[0]),
                          bits_of(OrtSession(model, level="all").run(None, {"A": A})[0]))
    assert dyndq.check(back) == []


@pytest.mark.parametrize("bits", [4, 8])
def test_gather_block_quantized_with_cast_scales_lifts_and_exports_back_byte_for_byte(bits):
    model = gather_block_quantized(bits, cast=True)
    idx = np.arange(N, dtype=np.int64)
    want = bits_of(OrtSession(gather_block_quantized(bits, cast=False), level="all").run(None, {"idx": idx})[0])
    for level in ("off", "all"):
        assert np.array_equal(bits_of(OrtSession(model, level=level).run(None, {"idx": idx})[0]), want), level
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and not report.skipped and dyndq.check(lifted) == []
    assert [n.op_type for n in lifted.graph.node] == ["DynamicDequantize", "Gather"]
    ddq = lifted.graph.node[0]
    assert {a.name: helper.get_attribute_value(a) for a in ddq.attribute}["output_dtype"] == TensorProto.FLOAT
    assert np.array_equal(bits_of(dyndq.run(lifted, {"idx": idx}, engine="reference")["y"]), want)
    back = dyndq.export(lifted, target="onnxruntime")
    assert [n.op_type for n in back.graph.node] == ["Cast", "GatherBlockQuantized"]
    assert initializers(back) == initializers(model)
    assert np.array_equal(bits_of(OrtSession(back, level="all").run(None, {"idx": idx})[0]), want)


def test_a_cast_also_read_by_another_node_stays_and_the_lift_reads_the_float16_scales():
    """The model builder's tied form reads one scales tensor from two ops: lifting one of them
    leaves the Cast to the other."""
    model = matmul_nbits(4, cast=True)
    model.graph.node.append(helper.make_node("Identity", ["scales"], ["scales_out"]))
    model.graph.output.append(helper.make_tensor_value_info("scales_out", TensorProto.FLOAT, [N, K // BLOCK]))
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1
    ops = [n.op_type for n in lifted.graph.node]
    assert ops.count("Cast") == 1 and "MatMulNBits" not in ops
    ddq = next(n for n in lifted.graph.node if n.op_type == "DynamicDequantize")
    assert ddq.input[1] == "d" or {t.name: t.data_type for t in lifted.graph.initializer}[ddq.input[1]] == TensorProto.FLOAT16


def test_another_cast_of_scales_is_not_taken():
    """Only a Cast to float32 of float16 scales is read through: a Cast of float32 scales is left
    alone, named."""
    model = matmul_nbits(4, cast=True)
    d = next(t for t in model.graph.initializer if t.name == "d")
    d.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(d).astype(np.float32), "d"))
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 0 and "scales is not a constant" in report.skipped[0].reason
