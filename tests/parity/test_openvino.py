"""OpenVINO's settings named: its CPU's defaults (bf16 inference precision where the CPU has it,
dynamic quantization of activations in groups of 32 where OpenVINO applies it on this CPU) each
move an int4 MatMul on their own; the check finds them by running again with each set to its
exact value, by halves."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from parity_models import our_int4_matmul

import dyndq
from dyndq.parity import example_feeds, runtime_parity
from dyndq.parity import engines
from dyndq.parity.engines import OPENVINO_EXACT, Tweak
from dyndq.parity.metrics import compare

pytestmark = pytest.mark.openvino


def int4_matmul(K=256, N=64, block=32, seed=0):
    """A plain QDQ int4 MatMul: DequantizeLinear(int4 [K, N], blocks of 32 along K) + MatMul."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(-8, 8, (K, N)).astype(ml_dtypes.int4)
    scales = (rng.random((K // block, N)) * 0.02 + 0.005).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w_q", "w_s"], ["w"], axis=0, block_size=block, name="dq"),
         helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, N])],
        [numpy_helper.from_array(codes, "w_q"), numpy_helper.from_array(scales, "w_s")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def bf16_capable() -> bool:
    import openvino as ov

    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def moves_on_its_own(model, feeds, name: str) -> bool:
    """The test's own measure, independent of the check's search: OpenVINO with every setting of
    OPENVINO_EXACT set exact but `name`, left at this CPU's default, differs from the reference."""
    config = {k: v for k, v in OPENVINO_EXACT.items() if k != name}
    out = engines.run_openvino(model, feeds, ["y"], Tweak(config=config))
    return not compare("y", out["y"], engines.run_reference(model, feeds)["y"]).agrees


def test_openvinos_settings_are_named_on_an_int4_matmul():
    """The settings named are those that move the result on their own on this CPU, measured here
    apart from the check: bf16 inference precision where the CPU has bf16, dynamic quantization of
    activations where OpenVINO applies it (not on every CPU: a CPU with AVX2 alone and no VNNI
    computes this MatMul exactly at its defaults, and then nothing is named)."""
    model = int4_matmul()
    feeds = example_feeds(model)
    expected = [name for name in OPENVINO_EXACT if moves_on_its_own(model, feeds, name)]
    if bf16_capable():
        assert "INFERENCE_PRECISION_HINT" in expected
    report = runtime_parity(model, engines=["openvino"])
    c, = report.comparisons
    assert (c.setting.engine, c.setting.name, c.setting.export) == ("openvino", "default", None)
    if not expected:
        assert c.agrees and not c.causes, c.lines()
        return
    assert not c.agrees and c.first_divergence.node == "mm" and c.first_divergence.op_type == "MatMul"
    names = [k.name for k in c.causes]
    assert names == expected, c.lines()
    assert all(k.kind == "setting" for k in c.causes)
    if len(names) == 2:
        assert all("on its own" in k.what for k in c.causes)
    exact = engines.run_openvino(model, feeds, ["y"], Tweak(config=dict(OPENVINO_EXACT)))
    assert compare("y", exact["y"], engines.run_reference(model, feeds)["y"]).agrees


def test_a_model_with_our_op_runs_on_openvino_through_its_export():
    report = runtime_parity(our_int4_matmul(), engines=["openvino"])
    c, = report.comparisons
    assert c.setting.export == "openvino" and c.error is None
    if not c.agrees:
        assert {k.name for k in c.causes} <= set(OPENVINO_EXACT) and c.causes, c.lines()


def test_int4_and_bfloat16_inputs_run_on_openvino():
    graph = helper.make_graph(
        [dyndq.make_node(["w4", "s"], ["d"], qtype="per_group", group_shape=[1, 2], name="dq4")], "g",
        [helper.make_tensor_value_info("w4", TensorProto.UINT4, [2, 4]),
         helper.make_tensor_value_info("s", TensorProto.BFLOAT16, [2, 2])],
        [helper.make_tensor_value_info("d", TensorProto.BFLOAT16, [2, 4])])
    w4 = np.array([[1, 15, 0, 7], [8, 3, 2, 9]], ml_dtypes.uint4)
    s = np.array([[0.5, 0.25], [1.0, -2.0]], ml_dtypes.bfloat16)
    report = runtime_parity(dyndq.make_model(graph, opset=21), engines=["openvino"], feeds={"w4": w4, "s": s})
    assert report.agrees, report.lines()
