"""float16 dst NaNs are the one quiet NaN 0x7E00 inside model-local functions too, on every
engine, while float32 and bfloat16 NaNs keep what the kernel gives them (sign, payload): a
function's lowering cannot see dst's dtype, one lowering serves every call."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import AttributeProto, helper

from cases import same_bits, vi

import dyndq

ONNX, LOCAL = helper.make_opsetid("", 21), helper.make_opsetid("local", 1)
N = 18  # ONNX Runtime's float32 -> float16 Cast: a vector loop (8 at a time), then a scalar tail
X = np.array([3, -2, 0] * 6, np.int8)
# NaN scales with payloads and both signs, an Inf (Inf * 0 is the CPU's default NaN, negative
# on x86) and ordinary numbers, for each dtype of scales (bits as the dtype stores them)
BITS = {
    "float16": [0x7E05, 0xFE05, 0x7C00, 0x3C00, 0xFD01, 0x4000],
    "bfloat16": [0x7FC5, 0xFFC5, 0x7F80, 0x3F80, 0xFF81, 0x4000],
    "float32": [0x7FC00123, 0xFFC00123, 0x7F800000, 0x3F800000, 0xFF812345, 0x40000000],
}
NP = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
UINT = {"float16": np.uint16, "bfloat16": np.uint16, "float32": np.uint32}
OTHER = {"float16": "float32", "bfloat16": "float32", "float32": "bfloat16"}  # a second call's scales


def scales(t2: str) -> np.ndarray:
    return np.array(BITS[t2] * 3, UINT[t2]).view(NP[t2])


def deq(by_reference: bool) -> onnx.FunctionProto:
    """local::Deq(x, s): DynamicDequantize-2 per_channel along axis 0, the axis written on the
    node or given by the call."""
    node = helper.make_node("DynamicDequantize", ["x", "s"], ["y"], domain=dyndq.DOMAIN, name="dq", qtype="per_channel")
    if by_reference:
        node.attribute.append(AttributeProto(name="axis", type=AttributeProto.INT, ref_attr_name="axis"))
    else:
        node.attribute.append(helper.make_attribute("axis", 0))
    return helper.make_function("local", "Deq", ["x", "s"], ["y"], [node], [ONNX, dyndq.opset_import(2)],
                                attributes=["axis"] if by_reference else [])


def twice() -> onnx.FunctionProto:
    """local::Twice(x, s, t): Deq on s and on t, two calls of one function with two dtypes of scales."""
    return helper.make_function("local", "Twice", ["x", "s", "t"], ["y", "z"],
                                [helper.make_node("Deq", ["x", "s"], ["y"], domain="local"),
                                 helper.make_node("Deq", ["x", "t"], ["z"], domain="local")], [ONNX, LOCAL])


def model(t2: str, place: str) -> onnx.ModelProto:
    inputs = [vi("x", "int8", [N]), vi("s", t2, [N])]
    if place == "function calling a function":  # float16 and another dtype through one lowering
        other = OTHER[t2]
        nodes = [helper.make_node("Twice", ["x", "s", "t"], ["y", "z"], domain="local")]
        graph = helper.make_graph(nodes, "g", inputs + [vi("t", other, [N])], [vi("y", t2, [N]), vi("z", other, [N])])
        functions = [deq(False), twice()]
    else:
        by_reference = place == "function, axis by reference"
        call = helper.make_node("Deq", ["x", "s"], ["y"], domain="local", **({"axis": 0} if by_reference else {}))
        graph = helper.make_graph([call], "g", inputs, [vi("y", t2, [N])])
        functions = [deq(by_reference)]
    return helper.make_model(graph, opset_imports=[ONNX, LOCAL], functions=functions, ir_version=10)


PLACES = ["function", "function, axis by reference", "function calling a function"]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("t2", ["float16", "bfloat16", "float32"])
def test_every_engine_gives_the_kernel_bits(t2, place):
    m = model(t2, place)
    assert dyndq.check(m) == []
    feeds = {"x": X, "s": scales(t2)}
    if place == "function calling a function":
        feeds["t"] = scales(OTHER[t2])
    for engine in ("reference", "onnxruntime"):
        out = dyndq.run(m, feeds, engine=engine)
        for name, s in (("y", "s"), ("z", "t")):
            if name in out:
                want = dyndq.dynamic_dequantize(X, feeds[s], qtype="per_channel", axis=0)
                assert same_bits(out[name], want), (engine, name)
    y = dyndq.run(m, feeds, engine="onnxruntime")["y"]
    if t2 == "float16":
        nans = np.isnan(y.astype(np.float32))
        assert nans.sum() == 12 and set(y.view(np.uint16)[nans].tolist()) == {0x7E00}
