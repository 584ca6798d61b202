"""A weight inside a model-local function (a Constant node, as exporters write them), quantized in
every format and written in every form: the file is valid (onnx.checker's full check and
dyndq.check) and gives the weights our kernel gives, on the engines it is written for.

A function importing ai.onnx 21 cannot hold uint2 or float4 codes in a Constant node (Constant-25
and -23 take them): those are passed in from the main graph (dyndq.plumbing.function_inputs).
The function computes x @ W; with x = identity(K) its output is the dequantized weight itself
(each output a sum of one weight and zeros), compared in value."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

from cases import run_ort

import dyndq
from dyndq.plumbing.function_inputs import pass_out, take_in
from dyndq.quantization import quantize_file

from quantize_models import heavy

K, N = 64, 32
EYE = {"x": np.eye(K, dtype=np.float32)}
FORMATS = {"int2": dict(bits=2, group_size=32), "int4": dict(bits=4, group_size=32), "int8": dict(bits=8, group_size=32),
           "mxfp4": dict(format="mxfp4"), "nvfp4": dict(format="nvfp4")}


def function_model(nested=False) -> onnx.ModelProto:
    """x -> local::Lin (Constant W [K, N], MatMul) -> y; nested: main calls local::Outer, which
    calls Lin twice (y = Lin(x) + Lin(x))."""
    lin = helper.make_function("local", "Lin", ["a"], ["b"], [
        helper.make_node("Constant", [], ["W"], value=nh.from_array(heavy((K, N)), "W")),
        helper.make_node("MatMul", ["a", "W"], ["b"])], [helper.make_opsetid("", 21)])
    functions, call = [lin], helper.make_node("Lin", ["x"], ["y"], domain="local")
    if nested:
        functions.append(helper.make_function("local", "Outer", ["a"], ["b"], [
            helper.make_node("Lin", ["a"], ["b1"], domain="local"), helper.make_node("Lin", ["a"], ["b2"], domain="local"),
            helper.make_node("Add", ["b1", "b2"], ["b"])], [helper.make_opsetid("", 21), helper.make_opsetid("local", 1)]))
        call = helper.make_node("Outer", ["x"], ["y"], domain="local")
    graph = helper.make_graph([call], "g", [helper.make_tensor_value_info("x", T.FLOAT, ["m", K])],
                              [helper.make_tensor_value_info("y", T.FLOAT, ["m", N])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)],
                             functions=functions, ir_version=10)


def valid(model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    assert dyndq.check(model) == []


@pytest.fixture(scope="module", params=sorted(FORMATS))
def kernel_weights(request):
    """(format, the quantized model, the weight our kernel dequantizes it to)."""
    options = FORMATS[request.param]
    quantized, _ = dyndq.quantize(function_model(), evaluate=False, **options)
    return request.param, quantized, dyndq.run(quantized, EYE, engine="reference")["y"]


@pytest.mark.parametrize("emit", ["dyndq", "onnx", "onnxruntime"])
def test_a_weight_in_a_function_is_written_valid_in_every_format_and_form(tmp_path, kernel_weights, emit):
    name, _, want = kernel_weights
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(function_model(), src)
    quantize_file(src, dst, emit=emit, evaluate=False, **FORMATS[name])
    written = onnx.load(dst)
    valid(written)
    if emit == "dyndq":
        assert np.array_equal(dyndq.run(written, EYE, engine="reference")["y"], want)
        written = dyndq.export(written, target="onnxruntime")
        valid(written)
    level = "all"  # (ONNX Runtime's default, every optimization)
    if emit == "onnx":  # (standard ONNX: onnx.reference runs every type; ONNX Runtime no float4 DequantizeLinear)
        assert np.array_equal(dyndq.run(written, EYE, engine="reference")["y"], want)
        if name in ("mxfp4", "nvfp4"):
            return
        # (standard ONNX is not written for ONNX Runtime: at its default level it fuses blocked DequantizeLinear +
        # MatMul into MatMulNBits at accuracy_level 4, which rounds A to int8; --emit onnxruntime is its form)
        level = "basic"
    assert np.array_equal(run_ort(written, EYE, level=level)[0], want)


def test_codes_a_function_cannot_hold_are_passed_in_from_the_main_graph_and_back(kernel_weights):
    name, quantized, _ = kernel_weights
    codes = {"int2": [T.UINT2, T.UINT2], "mxfp4": [T.FLOAT4E2M1, T.FLOAT8E8M0], "nvfp4": [T.FLOAT4E2M1]}.get(name, [])
    fn = quantized.functions[0]
    assert [t.data_type for t in quantized.graph.initializer] == codes  # (codes, then zero points or scales)
    assert list(fn.input) == ["a"] + [t.name for t in quantized.graph.initializer]
    assert list(quantized.graph.node[0].input) == ["x"] + [t.name for t in quantized.graph.initializer]
    back = onnx.ModelProto()
    back.CopyFrom(quantized)
    assert take_in(back) == sorted(t.name for t in quantized.graph.initializer)
    assert not back.graph.initializer and list(back.functions[0].input) == ["a"]
    assert pass_out(back) == [t.name for t in quantized.graph.initializer]
    assert back.SerializeToString() == quantized.SerializeToString()


def test_a_function_called_from_another_passes_the_codes_on():
    model = function_model(nested=True)
    quantized, _ = dyndq.quantize(model, bits=2, group_size=32, evaluate=False)
    valid(quantized)
    lin, outer = quantized.functions
    passed = [t.name for t in quantized.graph.initializer]
    assert len(passed) == 2 and list(lin.input)[1:] == passed and list(outer.input)[1:] == passed
    assert all(list(n.input)[1:] == passed for n in outer.node if n.op_type == "Lin")
    got = dyndq.run(quantized, EYE, engine="reference")["y"]
    exported = dyndq.export(quantized, target="onnxruntime")
    assert [n.op_type for n in exported.functions[0].node][-1] == "MatMulNBits"
    assert np.array_equal(run_ort(exported, EYE)[0], got)


@pytest.mark.parametrize("emit", ["onnxruntime", "onnx"])
def test_a_contrib_op_in_a_function_another_calls_passes_the_check(tmp_path, emit):
    """MatMulNBits written into Lin, whose output Outer's Add reads: ONNX has no schema of it and
    its full check, strict inside functions, found Add's input untyped (quantize exit 70, nothing
    written, though ONNX Runtime loads the file).  dyndq.check lends ONNX Runtime's schema to the
    checker (dyndq.lent_schemas) for the check alone."""
    dyndq.save_model(function_model(nested=True), tmp_path / "m.onnx")
    quantize_file(tmp_path / "m.onnx", tmp_path / "q.onnx", emit=emit, evaluate=False, group_size=32)
    written = onnx.load(tmp_path / "q.onnx")
    assert dyndq.check(written) == []
    assert not onnx.defs.has("MatMulNBits", 1, "com.microsoft")  # (lent for the check only)
    got = dyndq.run(written, EYE, engine="onnxruntime")["y"]
    assert np.array_equal(got, dyndq.run(dyndq.quantize(function_model(nested=True), evaluate=False,
                                                        group_size=32)[0], EYE, engine="reference")["y"])


def test_a_contrib_node_is_judged_against_onnxruntimes_schema():
    """The lent schema judges the node too: a MatMulNBits without its required K is named."""
    quantized, _ = dyndq.quantize(function_model(nested=True), evaluate=False, group_size=32)
    exported = dyndq.export(quantized, target="onnxruntime")
    node, = [n for n in exported.functions[0].node if n.op_type == "MatMulNBits"]
    kept = [a for a in node.attribute if a.name != "K"]
    del node.attribute[:]
    node.attribute.extend(kept)
    problems = dyndq.check(exported)
    assert len(problems) == 1 and "Required attribute 'K' is missing" in str(problems[0]), problems
