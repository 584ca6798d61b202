"""The nodes and tensors that stand for one quantized weight.

A weight W becomes its codes, scales and zero points (initializers) and one
DynamicDequantize-2 node whose output replaces W in every node that read it:

    W_quantized, W_scales[, W_zero_points] -> DynamicDequantize -> [Slice] -> [Cast] -> W_dequantized

- per_group, group_shape 1 everywhere but the quantization axis; per_channel (axis = the
  other dim) when a 2-D weight has one group per whole axis, as DequantizeLinear's per-axis
  form says it;
- a Slice back to the weight's length along the axis when the codes were padded to whole
  groups (DynamicDequantize-2's per_group needs them);
- a Cast to the weight's dtype when the scales have another (the op's output has the
  scales' dtype).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dyndq.build import make_node
from dyndq.plumbing.names import NameScope
from dyndq.plumbing.types import elem_type
from dyndq.quantization.numerics import QuantizedWeight


@dataclass
class Placed:
    nodes: list[onnx.NodeProto]
    tensors: list[onnx.TensorProto]
    output: str  # the value that now stands for the weight
    form: str  # in a few words, for the report


def per_channel(q: QuantizedWeight) -> bool:
    return q.codes.ndim == 2 and q.group == q.length


def placed(name: str, dtype: str, q: QuantizedWeight, names: NameScope, opset: int) -> Placed:
    """The tensors and nodes for weight `name` (of `dtype`) quantized as `q`, named after it."""
    codes = names.fresh(f"{name}_quantized")
    scales = names.fresh(f"{name}_scales")
    tensors = [numpy_helper.from_array(q.codes, codes)]
    inputs = [codes, scales]
    if per_channel(q):
        channel = 1 - q.axis
        attrs = dict(qtype="per_channel", axis=channel)
        tensors.append(numpy_helper.from_array(q.scales.reshape(-1), scales))
        form = f"per_channel (axis {channel})"
    else:
        attrs = dict(qtype="per_group", group_shape=q.group_shape)
        tensors.append(numpy_helper.from_array(q.scales, scales))
        form = f"per_group {q.group_shape}"
    if q.zero_points is not None:
        zps = names.fresh(f"{name}_zero_points")
        inputs.append(zps)
        tensors.append(numpy_helper.from_array(q.zero_points.reshape(-1) if per_channel(q) else q.zero_points, zps))
    form = f"{q.codes.dtype.name} {form}"
    cast = np.dtype(q.scales.dtype).name != dtype
    steps = ["DynamicDequantize"] + ["Slice"] * bool(q.padded_to) + ["Cast"] * cast
    out = names.fresh(f"{name}_dequantized")
    outputs = [names.fresh(f"{name}_{step}_out") for step in steps[:-1]] + [out]
    nodes = [make_node(inputs, [outputs[0]], name=names.fresh(f"{name}_DynamicDequantize"), version=2, **attrs)]
    if q.padded_to:
        nodes.append(_slice(outputs[0], outputs[1], q.axis, q.length, names, opset, tensors))
        form += f", padded {q.length} -> {q.padded_to} + Slice"
    if cast:
        nodes.append(helper.make_node("Cast", [outputs[-2]], [out], name=names.fresh(f"{name}_Cast"), to=elem_type(dtype)))
        form += f" + Cast to {dtype}"
    return Placed(nodes, tensors, out, form)


def _slice(src: str, dst: str, axis: int, length: int, names, opset, tensors) -> onnx.NodeProto:
    name = names.fresh(f"{dst}_Slice")
    if opset < 10:  # Slice took attributes until opset 10
        return helper.make_node("Slice", [src], [dst], name=name, starts=[0], ends=[length], axes=[axis])
    bounds = []
    for hint, value in (("starts", 0), ("ends", length), ("axes", axis)):
        bounds.append(names.fresh(f"{dst}_{hint}"))
        tensors.append(numpy_helper.from_array(np.array([value], np.int64), bounds[-1]))
    return helper.make_node("Slice", [src, *bounds], [dst], name=name)
