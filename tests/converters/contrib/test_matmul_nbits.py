"""com.microsoft::MatMulNBits <-> DynamicDequantize-2 + MatMul: lifted exactly and written back
byte for byte, over bits, block sizes, K padding, zero-point forms, scales types and bias.

The effective weights of a MatMulNBits are read the way ONNX Runtime computes them: a run with
A = identity(K) returns W (each output a sum of one weight and zeros).  They must equal, in value,
what the lifted graph gives on our reference engine and on ONNX Runtime after the standard export.
Outputs for other A are compared with a tolerance (parity.TOLERANCE of the output's largest
magnitude): MatMulNBits and MatMul sum in different orders.  ONNX Runtime runs with basic graph
optimizations, so that the standard export's DequantizeLinear + MatMul is not fused back.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq.converters.contrib import shared as foreign
from dyndq.parity import TOLERANCE
from dyndq.ort_session import OrtSession

FLOAT = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def matmul_nbits(K, N, bits, block, zp="packed", t="float32", bias=False, seed=0, g_idx=None, scales_1d=False,
                 accuracy_level=None, zp_values=None, identity_g_idx=False, power_of_two_scales=False):
    """A model of one MatMulNBits with random codes, scales and zero points; and the codes, zero points as ints."""
    rng = np.random.default_rng(seed)
    blocks = -(-K // block)
    q = rng.integers(0, 2**bits, (N, blocks * block))
    B = foreign.pack(q, bits).reshape(N, blocks, block * bits // 8)
    scales = (rng.standard_normal((N, blocks)) * 0.05).astype(t)
    if power_of_two_scales:  # q*scale - zp*scale is then exact, as (q - zp)*scale is (and +0, not -0, where q = zp)
        scales = (2.0 ** np.round(np.log2(np.abs(scales) + 1e-30))).astype(t)
    if identity_g_idx:
        g_idx = np.arange(K) // block
    inits = [numpy_helper.from_array(B, "B"), numpy_helper.from_array(scales.reshape(-1) if scales_1d else scales, "scales")]
    inputs = ["A", "B", "scales"]
    zero = np.full((N, blocks), 2 ** (bits - 1))
    if zp == "packed":
        zero = rng.integers(0, 2**bits, (N, blocks)) if zp_values is None else zp_values
        per = 8 // bits
        rows = np.concatenate([zero, np.full((N, (-blocks) % per), 2 ** (bits - 1))], axis=1)
        inits.append(numpy_helper.from_array(foreign.pack(rows, bits).reshape(-1), "zp"))
        inputs.append("zp")
    elif zp in ("float", "half"):  # "half": integers and half-integers from -1 to 2^bits, as floats
        drawn = rng.integers(0, 2**bits, (N, blocks)) if zp == "float" else rng.integers(-2, 2 ** (bits + 1) + 1,
                                                                                        (N, blocks)) / 2
        zero = drawn if zp_values is None else zp_values
        inits.append(numpy_helper.from_array(np.asarray(zero).astype(t), "zp"))
        inputs.append("zp")
    if g_idx is not None:
        inputs += [""] * (4 - len(inputs)) + ["g_idx"]
        inits.append(numpy_helper.from_array(np.asarray(g_idx, np.int32), "g_idx"))
    if bias:
        inputs += [""] * (5 - len(inputs)) + ["bias"]
        inits.append(numpy_helper.from_array((rng.standard_normal(N)).astype(t), "bias"))
    attrs = dict(K=K, N=N, bits=bits, block_size=block)
    if accuracy_level is not None:
        attrs["accuracy_level"] = accuracy_level
    node = helper.make_node("MatMulNBits", inputs, ["Y"], name="mm", domain="com.microsoft", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", FLOAT[t], ["M", K])],
                              [helper.make_tensor_value_info("Y", FLOAT[t], ["M", N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    return model, q, zero


def on_ort(model, A):
    return OrtSession(model, level="basic").run(None, {"A": A})[0]


def initializers(model):
    return {t.name: t.SerializeToString() for t in model.graph.initializer}


def same_node(original, written):
    """The written node is the original one, byte for byte (accuracy_level absent where it was, or
    written as it was)."""
    assert written.SerializeToString() == original.SerializeToString()


@st.composite
def forms(draw):
    bits = draw(st.sampled_from([2, 4, 8]))
    block = draw(st.sampled_from([16, 32, 64, 128]))
    K = draw(st.integers(1, 3 * block))
    return dict(K=K, N=draw(st.integers(1, 12)), bits=bits, block=block,
                zp=draw(st.sampled_from(["absent", "packed"] + (["float", "half"] if bits < 8 else []))),
                t=draw(st.sampled_from(["float32", "float16"])), bias=draw(st.booleans()),
                scales_1d=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)),
                accuracy_level=draw(st.sampled_from([None, 0, 4])), identity_g_idx=draw(st.booleans()),
                power_of_two_scales=draw(st.booleans()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forms())
def test_lifted_weights_equal_matmul_nbits_effective_weights_and_write_back_byte_for_byte(p):
    """Lifted only where exact: where ONNX Runtime's kernel computes q*scale - zp*scale (float zero
    points, a g_idx) the node is lifted only when that equals (q - zp)*scale for every weight
    (powers of two as scales make it so), and is left alone, the difference named, otherwise."""
    model, q, zero = matmul_nbits(**p)
    lifted, report = dyndq.lift_with_report(model)
    K, t = p["K"], np.dtype(p["t"])
    eye = np.eye(K, dtype=t)
    plain, _, _ = matmul_nbits(**{**p, "accuracy_level": None, "bias": False})
    scales = numpy_helper.to_array(next(x for x in model.graph.initializer if x.name == "scales")).reshape(p["N"], -1)
    # the documented formula, (q - zp) * scale, computed exactly (half-integer zero points too)
    formula = ((q - np.repeat(zero, p["block"], axis=1)).astype(np.float32)
               * np.repeat(scales.astype(np.float32), p["block"], axis=1)).astype(t).T[:K]
    if report.count == 0:  # only where ONNX Runtime's kernel computes otherwise than the op, named
        assert p["zp"] in ("float", "half") or p["identity_g_idx"]
        [skipped] = report.skipped
        assert "ONNX Runtime" in skipped.reason and lifted.graph.node[0].op_type == "MatMulNBits"
        if p["bits"] == 8 and p["identity_g_idx"]:
            with pytest.raises(Exception, match="Only 2b and 4b quantization is supported"):
                on_ort(plain, eye)
            return
        if p["bits"] == 2 and p["identity_g_idx"] and p["zp"] in ("float", "half"):
            with pytest.raises(Exception, match="g_idx .* not supported for 2-bit quantization with floating-point"):
                on_ort(plain, eye)
            return
        effective = on_ort(plain, eye)
        if p["zp"] == "half" and not p["identity_g_idx"]:  # (q*scale - zp*scale, not the formula)
            assert not np.array_equal(effective, formula)
            return
        as_ours = dyndq.lift(matmul_nbits(**{**p, "identity_g_idx": False, "zp": "packed" if p["zp"] in ("float", "half") else p["zp"],
                                              "accuracy_level": None, "bias": False})[0])
        if p["zp"] != "packed":  # (with packed zero points and g_idx ONNX Runtime ignores them)
            assert not np.array_equal(effective, dyndq.run(as_ours, {"A": eye}, engine="reference")["Y"])
        return
    assert report.count == 1 and not report.skipped and dyndq.check(lifted) == []
    assert {n.op_type for n in lifted.graph.node} <= {"DynamicDequantize", "Slice", "Constant", "MatMul", "Add"}
    # the weights: of the same node without bias, at accuracy_level 0 (at 4 ONNX Runtime quantizes A)
    effective = on_ort(plain, eye)
    plain_lifted = dyndq.lift(plain)
    assert np.array_equal(dyndq.run(plain_lifted, {"A": eye}, engine="reference")["Y"], formula)
    assert np.array_equal(on_ort(dyndq.export(plain_lifted), eye), formula)
    assert np.array_equal(effective, formula)  # (values: the sign of a zero weight is not seen through a MatMul)

    back, written = dyndq.export_with_report(lifted, target="onnxruntime")
    assert [n.form.split(" (")[0] for n in written.foreign] == ["com.microsoft::MatMulNBits"]
    assert initializers(back) == initializers(model)
    # in their places (but for a g_idx: the lift drops it, the way back writes it again, last)
    order = lambda m: [t.name for t in m.graph.initializer if t.name != "g_idx"]  # noqa: E731
    assert order(back) == order(model)
    assert len(back.graph.node) == 1
    same_node(model.graph.node[0], back.graph.node[0])

    A = np.random.default_rng(p["seed"]).standard_normal((3, K)).astype(t)
    assert np.array_equal(on_ort(back, A), on_ort(model, A))  # the same kernel on the same bytes
    float_meaning, _, _ = matmul_nbits(**{**p, "accuracy_level": None})
    original = on_ort(float_meaning, A)
    scale = float(np.abs(original.astype(np.float64)).max())
    # float16: each engine may accumulate its K products in float16, each step rounding at 2^-11 of
    # the running sum, in its own order: a bound growing as sqrt(K) (2e-3 was seen too tight at K=151,
    # 3 ulps apart); the weights themselves are compared exactly above
    tolerance = TOLERANCE * scale if t == np.float32 else 2.0**-11 * (2 + np.sqrt(K)) * scale
    assert np.abs(on_ort(dyndq.export(lifted), A).astype(np.float64) - original).max() <= tolerance


def test_absent_zero_point_is_written_out_as_two_to_the_bits_minus_one():
    for bits, value in ((4, 8), (8, 128)):
        model, _, _ = matmul_nbits(40, 3, bits, 16, zp="absent")
        lifted = dyndq.lift(model)
        ddq = next(n for n in lifted.graph.node if n.op_type == "DynamicDequantize")
        zps = numpy_helper.to_array(next(t for t in lifted.graph.initializer if t.name == ddq.input[2]))
        assert zps.dtype.name == ("uint4" if bits == 4 else "uint8") and np.all(zps.astype(int) == value)
        assert dyndq.export(lifted, target="onnxruntime").graph.node[0].input[3:] == []  # absent again


@pytest.mark.parametrize("t", ["float32", "float16"])
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("halves", [False, True], ids=["integers", "half-integers"])
def test_float_zero_points_of_minus_zero_come_back_as_minus_zero(t, bits, halves):
    """A float zero point of -0.0 is 0 to both ONNX Runtime and the op, and lifts as 0; the way
    back writes -0.0 where it was, so that lift then export gives the model back byte for byte
    (the doubled form of half-integer zero points too)."""
    zero = np.array([[0.0, -0.0, 3.0, -0.0], [-0.0] * 4, [1.0, 0.0, 2.0, 0.0]])
    if halves:
        zero[2, 0] = 1.5
    model, _, _ = matmul_nbits(64, 3, bits, 16, zp="float", t=t, zp_values=zero, power_of_two_scales=True)
    stored = numpy_helper.to_array(next(x for x in model.graph.initializer if x.name == "zp"))
    assert np.signbit(stored).sum() == 6
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and not report.skipped and dyndq.check(lifted) == []
    back = dyndq.export(lifted, target="onnxruntime")
    assert back.SerializeToString() == model.SerializeToString()
    A = np.random.default_rng(1).standard_normal((2, 64)).astype(t)
    assert np.array_equal(on_ort(back, A), on_ort(model, A))


@pytest.mark.parametrize("bits, zp, version", [(4, "packed", 2), (8, "absent", 2), (2, "packed", 3), (2, "half", 2),
                                               (4, "half", 2)])
def test_the_lift_imports_the_version_its_dtypes_need(bits, zp, version):
    """Version 2 where its types hold the lifted node (the doubled form of 2-bit codes with
    half-integer zero points is uint4 codes and int8 zero points), version 3 where they do not
    (uint2 codes)."""
    model, _, _ = matmul_nbits(64, 8, bits, 32, zp=zp, power_of_two_scales=True)
    lifted = dyndq.lift(model)
    assert {o.domain: o.version for o in lifted.opset_import}[dyndq.DOMAIN] == version
    assert dyndq.check(lifted) == []


def test_padded_k_is_kept_in_the_codes_and_cut_by_a_slice():
    model, q, _ = matmul_nbits(40, 5, 4, 32)
    lifted = dyndq.lift(model)
    codes = next(t for t in lifted.graph.initializer if t.name == "B")
    assert list(codes.dims) == [64, 5] and codes.data_type == TensorProto.UINT4
    assert np.array_equal(numpy_helper.to_array(codes).astype(int), q.T)
    assert [n.op_type for n in lifted.graph.node if n.op_type != "Constant"] == ["DynamicDequantize", "Slice", "MatMul"]


def test_accuracy_level_is_kept_as_metadata_and_written_explicitly():
    model, _, _ = matmul_nbits(64, 4, 4, 32, accuracy_level=4)
    lifted = dyndq.lift(model)
    matmul = next(n for n in lifted.graph.node if n.op_type == "MatMul")
    assert {p.key: p.value for p in matmul.metadata_props} == {foreign.ACCURACY_LEVEL: "4"}
    level = lambda m: next(a.i for a in m.graph.node[0].attribute if a.name == "accuracy_level")  # noqa: E731
    assert level(dyndq.export(lifted, target="onnxruntime")) == 4
    assert level(dyndq.export(lifted, target="onnxruntime", accuracy_level=0)) == 0
    plain, _, _ = matmul_nbits(64, 4, 4, 32)
    back, report = dyndq.export_with_report(dyndq.lift(plain), target="onnxruntime")
    assert "accuracy_level 0: kept from the lifted node" in report.foreign[0].form
    assert "accuracy_level" not in {a.name for a in back.graph.node[0].attribute}  # (absent, as it was)
    assert level(dyndq.export(dyndq.lift(plain), target="onnxruntime", accuracy_level=0)) == 0  # asked: written


def test_identity_g_idx_is_lifted_where_exact_and_written_back():
    model, _, _ = matmul_nbits(64, 3, 4, 16, zp="absent", identity_g_idx=True, power_of_two_scales=True)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and "g_idx" not in {t.name for t in lifted.graph.initializer}
    back = dyndq.export(lifted, target="onnxruntime")
    assert initializers(back) == initializers(model)
    assert list(back.graph.node[0].input) == list(model.graph.node[0].input)


@pytest.mark.parametrize("zp, reason", [
    ("packed", "g_idx with packed zero points: ONNX Runtime's kernel takes 2^(bits-1) for every zero point"),
    ("absent", "g_idx: ONNX Runtime computes q*scale - zp*scale there, which differs from (q - zp)*scale in"),
])
def test_g_idx_where_onnxruntime_computes_otherwise_is_left_alone(zp, reason):
    """ONNX Runtime's g_idx path ignores packed zero points (it takes 8) and rounds q*scale and
    zp*scale apart: measured, the weights differ from (q - zp)*scale by up to 6.4 and in the last
    bit; so such a node is left alone, saying why."""
    model, _, _ = matmul_nbits(64, 3, 4, 16, zp=zp, identity_g_idx=True)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 0 and reason in report.skipped[0].reason
    assert lifted.SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("change, reason", [
    (dict(bits=2, zp="float", zp_values=np.full((3, 4), 0.25)), "neither integers nor half-integers"),
    (dict(bits=2, identity_g_idx=True, zp="absent"), "g_idx with 2-bit codes: ONNX Runtime 1.32's CPU kernel gives"),
    (dict(bits=8, zp="float", t="float16"), "float zero points with 8-bit codes: ONNX Runtime 1.32's CPU kernel refuses"),
    (dict(g_idx=(np.arange(64) // 16)[::-1]), "g_idx is not the identity"),
    (dict(zp="float", zp_values=np.full((3, 4), 7.25)), "neither integers nor half-integers"),
    (dict(zp="float"), "float zero points: ONNX Runtime computes q*scale - zp*scale there, which differs"),
])
def test_forms_not_expressible_exactly_are_left_alone_and_named(change, reason):
    p = dict(K=64, N=3, bits=4, block=16)
    p.update(change)
    model, _, _ = matmul_nbits(**p)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 0 and len(report.skipped) == 1
    assert reason in str(report.skipped[0]) and "com.microsoft::MatMulNBits 'mm'" in str(report.skipped[0])
    assert lifted.graph.node[0].op_type == "MatMulNBits"  # untouched
    assert any(o.domain == "com.microsoft" for o in lifted.opset_import)
    exported, written = dyndq.export_with_report(model)
    assert exported.graph.node[0].op_type == "MatMulNBits"
    assert written.foreign[0].form == "kept" and reason in written.foreign[0].why


def test_a_weight_that_is_a_graph_input_is_not_a_constant():
    model, _, _ = matmul_nbits(32, 2, 4, 16)
    model.graph.input.append(helper.make_tensor_value_info("B", TensorProto.UINT8, [2, 2, 8]))
    _, report = dyndq.lift_with_report(model)
    assert "B is not a constant" in report.skipped[0].reason


def test_a_node_left_alone_runs_as_it_was_after_a_standard_export():
    """A node left alone is left as it is: the exported model still holds it, and computes the same."""
    model, _, _ = matmul_nbits(64, 3, 2, 16, zp="float", zp_values=np.full((3, 4), 0.25))
    assert dyndq.export(model).graph.node[0].op_type == "MatMulNBits"
    A = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    assert np.array_equal(on_ort(dyndq.export(model), A), on_ort(model, A))


def test_a_node_in_an_if_branch_is_lifted_with_the_branch_s_own_weights():
    model, _, _ = matmul_nbits(64, 3, 4, 32)
    inner = model.graph
    branch = helper.make_graph(list(inner.node), "then", [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
                               list(inner.initializer))
    other = helper.make_graph([helper.make_node("Slice", ["A", "zero", "three", "one"], ["Z"])], "else", [],
                              [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2, 3])],
                              [numpy_helper.from_array(np.array([0]), "zero"), numpy_helper.from_array(np.array([3]), "three"),
                               numpy_helper.from_array(np.array([1]), "one")])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["out"], name="if", then_branch=branch, else_branch=other)],
                              "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                    helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 64])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 3])])
    wrapped = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=10)
    lifted, report = dyndq.lift_with_report(wrapped)
    assert report.lifted[0][0] == "main/if.then_branch" and not report.skipped
    A = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    expected = on_ort(model, A)
    got = dyndq.run(lifted, {"c": np.array(True), "A": A}, engine="reference")["out"]
    assert np.abs(got - expected).max() <= TOLERANCE * np.abs(expected).max()
    back = dyndq.export(lifted, target="onnxruntime")
    then = next(a.g for a in back.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == ["MatMulNBits"]
    assert {t.name: t.SerializeToString() for t in then.initializer} == initializers(model)


def test_a_node_in_a_model_local_function_reading_its_inputs_is_left_alone_and_named():
    model, _, _ = matmul_nbits(32, 2, 4, 16, zp="absent")
    fn = helper.make_function("local", "Proj", ["A", "B", "scales"], ["Y"], list(model.graph.node),
                              [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    graph = helper.make_graph([helper.make_node("Proj", ["A", "B", "scales"], ["Y"], domain="local")], "g",
                              list(model.graph.input), list(model.graph.output), list(model.graph.initializer))
    wrapped = helper.make_model(graph, functions=[fn], ir_version=10,
                                opset_imports=list(model.opset_import) + [helper.make_opsetid("local", 1)])
    _, report = dyndq.lift_with_report(wrapped)
    assert report.count == 0
    assert str(report.skipped[0]).startswith("function local::Proj: com.microsoft::MatMulNBits 'mm' left alone: "
                                             "B is not a constant")
    _, exported = dyndq.export_with_report(wrapped)  # standard ONNX asked for: the node kept is named, with why
    assert [line for line in exported.lines() if line.startswith("function local::Proj: com.microsoft::MatMulNBits "
                                                                   "'mm' -> kept: no standard form: B is not a constant")]
    assert "1 MatMulNBits node(s) in the input" in exported.summary()


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("K", [16, 48, 64, 100, 512])
def test_one_scale_per_column_is_written_as_matmul_nbits_that_means_the_same_at_every_level(K, bits, symmetric):
    """A per_channel weight (`quantize --group-size -1`) is written as MatMulNBits, accuracy_level
    0, one block per column (or blocks of it repeating its scale, where fewer bytes; 2-bit blocks
    are at most 256): standard DequantizeLinear + MatMul would be fused by ONNX Runtime at its
    default level into MatMulNBits at accuracy_level 4, which rounds A to int8.  At every level the
    weights (A = identity) are ours value for value, and the outputs agree within parity.TOLERANCE."""
    rng = np.random.default_rng(K + bits)
    N = 24
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["Y"], name="mm")], "g",
                              [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
                              [numpy_helper.from_array(rng.standard_normal((K, N)).astype(np.float32), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    quantized, _ = dyndq.quantize(model, bits=bits, group_size=-1, symmetric=symmetric, evaluate=False)
    [ddq] = [n for n in quantized.graph.node if n.op_type == "DynamicDequantize"]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in ddq.attribute}["qtype"] == b"per_channel"
    written = dyndq.export(quantized, target="onnxruntime")
    [node] = written.graph.node
    attrs = {a.name: a.i for a in node.attribute}
    assert node.op_type == "MatMulNBits" and attrs["accuracy_level"] == 0 and attrs["bits"] == bits
    eye, A = np.eye(K, dtype=np.float32), rng.standard_normal((8, K)).astype(np.float32)
    weights = dyndq.run(quantized, {"A": eye}, engine="reference")["Y"]
    want = dyndq.run(quantized, {"A": A}, engine="reference")["Y"]
    for level in ("off", "all"):
        session = OrtSession(written, level=level)
        assert np.array_equal(session.run(None, {"A": eye})[0], weights), level
        got = session.run(None, {"A": A})[0]
        assert np.abs(got - want).max() <= TOLERANCE * np.abs(want).max(), level


@pytest.mark.parametrize("bits,signed", [(2, True), (2, False), (4, True), (4, False), (8, True), (8, False)])
@pytest.mark.parametrize("band_bytes", [1, 40, 1 << 18])
def test_b_packed_in_bands_is_the_whole_weight_packed(bits, signed, band_bytes, monkeypatch):
    """MatMulNBits' B made a band of columns at a time (the streamed import's memory: no whole
    int16 copy of the codes) is the bytes of the codes shifted, transposed and packed whole."""
    from dyndq.converters.contrib import matmul_nbits

    monkeypatch.setattr(matmul_nbits, "BAND_BYTES", band_bytes)
    rng = np.random.default_rng(bits)
    low, high = (-(1 << (bits - 1)), 1 << (bits - 1)) if signed else (0, 1 << bits)
    codes = rng.integers(low, high, size=(64, 37)).astype(np.int8 if signed else np.uint8)
    shift = matmul_nbits.absent_zero_point(bits) if signed else 0
    whole = foreign.pack((codes.astype(np.int16) + shift).T, bits)
    got = matmul_nbits._packed_b(codes, shift, bits)
    assert got.dtype == np.uint8 and got.shape == whole.shape and np.array_equal(got, whole)
