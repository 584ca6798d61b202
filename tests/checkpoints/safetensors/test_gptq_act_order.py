"""GPTQ act-order on ONNX Runtime: the decode is a blocked DequantizeLinear of the codes reordered
into their groups, then a Gather of its output back into the inputs' order, which ONNX Runtime
keeps at load; the former form (scale and zero columns gathered by g_idx, one a code: Gather, Sub,
Mul on constants), still written for groups of unequal sizes, it folds into the float weight whole
(9.7x a float model's session memory, docs/import.md "What it costs")."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import dyndq
from dyndq.checkpoints import safetensors as ours
from safetensors_checkpoints import check_exact, gptq_oracle, gptq_tensors

N_IN, OUT, GROUP = 256, 64, 32


def module(t, bits):
    config = {"quant_method": "gptq", "bits": bits, "group_size": GROUP, "desc_act": True}
    return ours.Module("model.layers.0.mlp.down_proj", "gptq", t, config)


def unequal(t):
    """`t` with one input moved from group 0 into group 1 (33 and 31 inputs): groups GPTQ never writes."""
    g_idx = t["g_idx"].copy()
    g_idx[np.flatnonzero(g_idx == 0)[0]] = 1
    return {**t, "g_idx": g_idx}


def optimized(tmp_path, placed) -> onnx.ModelProto:
    """x @ weight.T on ONNX Runtime at its default optimization level, as the model it writes."""
    weight = helper.make_node("Cast", [placed.output], ["weight32"], to=TensorProto.FLOAT)
    nodes = [*placed.nodes, weight, helper.make_node("Transpose", ["weight32"], ["b"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "b"], ["y"])]
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N_IN])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, OUT])], initializer=placed.tensors)
    model = dyndq.export(dyndq.make_model(graph, opset=placed.opset), target="onnxruntime")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


def folded_weights(model: onnx.ModelProto) -> list[str]:
    """The float initializers of the weight's size or more: a decode folded at load."""
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    return [f"{t.name} {list(t.dims)}" for t in model.graph.initializer
            if t.data_type in floats and int(np.prod(t.dims)) >= N_IN * OUT]


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_act_order_decodes_are_not_folded_by_onnx_runtime_and_stay_exact(tmp_path, bits):
    t = gptq_tensors(N_IN, OUT, bits, GROUP, act_order=True, seed=40 + bits)
    assert not (t["g_idx"] == np.arange(N_IN) // GROUP).all()
    placed = ours.nodes(module(t, bits))
    ops = [n.op_type for n in placed.nodes]
    constants = {t.name for t in placed.tensors}
    assert ops.count("DynamicDequantize") == 1 and "Gather" in ops, ops
    assert not [n.name for n in placed.nodes if n.op_type == "Gather" and n.input[0] in constants]  # (no scales gathered)
    assert folded_weights(optimized(tmp_path, placed)) == []
    check_exact(module(t, bits), gptq_oracle(t, bits))


def test_groups_of_unequal_sizes_keep_the_gathered_scales_which_onnx_runtime_folds(tmp_path):
    """(the check above can fail: the former form, still written where the groups differ in size)"""
    t = unequal(gptq_tensors(N_IN, OUT, 4, GROUP, act_order=True, seed=44))
    placed = ours.nodes(module(t, 4))
    assert "unequal sizes (31 to 33 inputs)" in placed.form, placed.form
    assert folded_weights(optimized(tmp_path, placed)) != []
    check_exact(module(t, 4), gptq_oracle(t, 4))
