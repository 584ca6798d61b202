"""A model's large tensors held beside it while a rewrite works on it in memory (dyndq.held_tensors):
`dyndq.export` of a model in memory lends its weights to the copy it works on, the walker lets go
of each weight's old form as its new one is made, and the model returned is the one the export of
the model held whole writes, byte for byte; the given model is never changed."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq.converters.contrib import shared as foreign
from dyndq.exporter import export_with_report
from dyndq.held_tensors import HeldTensors, lent_copy


def lifted(bits: int, K: int = 256, N: int = 64, seed: int = 0) -> onnx.ModelProto:
    """One MatMulNBits (random codes, packed zero points, a bias) lifted to DynamicDequantize + MatMul + Add."""
    rng = np.random.default_rng(seed)
    blocks = K // 32
    q = rng.integers(0, 2 ** bits, (N, K))
    zero = foreign.pack(rng.integers(0, 2 ** bits, (N, blocks + (-blocks) % (8 // bits))), bits).reshape(-1)
    inits = [numpy_helper.from_array(foreign.pack(q, bits).reshape(N, blocks, 32 * bits // 8), "B"),
             numpy_helper.from_array((rng.standard_normal((N, blocks)) * 0.05).astype(np.float32), "scales"),
             numpy_helper.from_array(zero, "zp"),
             numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "bias")]
    node = helper.make_node("MatMulNBits", ["A", "B", "scales", "zp", "", "bias"], ["Y"], name="mm",
                            domain="com.microsoft", K=K, N=N, bits=bits, block_size=32)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                              ir_version=10)
    return dyndq.lift(model)


def whole_export(model: onnx.ModelProto, target: str) -> onnx.ModelProto:
    """The export of a copy of `model` held whole, changed in place (no tensor held beside it)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return export_with_report(copy, target=target, consume=True)[0]


def serialized(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString(deterministic=True)


def codes_of(model: onnx.ModelProto) -> str:
    return next(n for n in model.graph.node if n.op_type == "DynamicDequantize").input[0]


@pytest.mark.parametrize("target", ["onnxruntime", "onnx", "openvino"])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_the_export_of_a_model_in_memory_writes_what_the_export_of_it_held_whole_writes(bits, target):
    model = lifted(bits)
    before = serialized(model)
    got = dyndq.export(model, target=target)
    assert serialized(got) == serialized(whole_export(model, target))
    assert serialized(model) == before  # (the model given lends its tensors, unchanged)
    assert not any(onnx.external_data_helper.uses_external_data(t) for t in got.graph.initializer)
    if target == "onnxruntime":
        assert [n.op_type for n in got.graph.node] == ["MatMulNBits"]


def test_codes_two_rewrites_read_are_let_go_after_the_second_only():
    """Two DynamicDequantize nodes read one set of codes: the first rewrite leaves them read by the
    second node, which then still finds them; both become MatMulNBits sharing one B."""
    model = lifted(4)
    graph = model.graph
    ddq = next(n for n in graph.node if n.op_type == "DynamicDequantize")
    twin = onnx.NodeProto()
    twin.CopyFrom(ddq)
    twin.name, twin.output[0] = "twin", "w_twin"
    graph.node.extend([twin, helper.make_node("MatMul", ["A", "w_twin"], ["Y2"], name="mm2")])
    graph.output.append(helper.make_tensor_value_info("Y2", TensorProto.FLOAT, ["M", 64]))
    got = dyndq.export(model, target="onnxruntime")
    assert [n.op_type for n in got.graph.node].count("MatMulNBits") == 2
    assert serialized(got) == serialized(whole_export(model, "onnxruntime"))


def test_codes_a_body_still_reads_are_not_let_go():
    """The codes are read by the DynamicDequantize the export rewrites and by an If's branches: the
    rewrite leaves them to the branches, which keep reading them in the model returned."""
    model = lifted(8)
    codes = codes_of(model)
    graph = model.graph
    branch = lambda name: helper.make_graph(  # noqa: E731
        [helper.make_node("Identity", [codes], [f"{name}_out"])], name, [],
        [helper.make_tensor_value_info(f"{name}_out", TensorProto.UINT8, [256, 64])])
    graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    graph.node.append(helper.make_node("If", ["cond"], ["raw_codes"], name="if", then_branch=branch("then"),
                                       else_branch=branch("else")))
    graph.output.append(helper.make_tensor_value_info("raw_codes", TensorProto.UINT8, [256, 64]))
    got = dyndq.export(model, target="onnxruntime")
    assert "MatMulNBits" in [n.op_type for n in got.graph.node]
    assert serialized(got) == serialized(whole_export(model, "onnxruntime"))
    assert codes in {t.name for t in got.graph.initializer}


def test_tensors_given_back_keep_every_field_as_it_was():
    """A weight in float_data and one whose data_location was set (as onnx's loader sets it) come
    back from `lent_copy` and `given_back` as they were, byte for byte."""
    values = np.linspace(-1, 1, 512, dtype=np.float32)
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [512], values.tolist())
    located = numpy_helper.from_array(values[::-1].copy(), "located")
    located.data_location = TensorProto.DEFAULT
    graph = helper.make_graph([helper.make_node("Add", ["typed", "located"], ["y"])], "g", [],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [512])], [typed, located])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    held = HeldTensors()
    copy = lent_copy(model, held)
    assert len(held) == 2 and all(onnx.external_data_helper.uses_external_data(t) for t in copy.graph.initializer)
    held.given_back(copy)
    assert serialized(copy) == serialized(model) and len(held) == 0


def test_a_tensor_read_after_it_was_let_go_is_an_error_naming_it():
    held = HeldTensors()
    stub = held.stored(numpy_helper.from_array(np.zeros(1024, np.float32), "codes"))
    assert held.read(stub).shape == (1024,)
    held.let_go(stub)
    with pytest.raises(RuntimeError, match="'codes'"):
        held.read(stub)
