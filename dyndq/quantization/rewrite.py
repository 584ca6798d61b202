"""The nodes and tensors that stand for one quantized weight.

A weight W becomes its codes, scales and zero points (initializers) and one
DynamicDequantize-2 node (or -3, below) whose output replaces W in every node that read it:

    W_quantized, W_scales[, W_zero_points] -> DynamicDequantize -> [Slice] -> [Cast] -> W_dequantized

- per_group, group_shape 1 everywhere but the quantization axis; per_channel (axis = the
  other dim) when a 2-D weight has one group per whole axis, as DequantizeLinear's per-axis
  form says it;
- a Slice back to the weight's length along the axis when the codes were padded to whole
  groups (DynamicDequantize-2's per_group needs them);
- a Cast to the weight's dtype when the scales have another (the op's output has the
  scales' dtype).

Codes version 2 does not take (int2/uint2, float4e2m1) make DynamicDequantize-3 nodes.  What
differs from one format to another is the format's (formats/): what its codes are called in
the form, how its scales are read (NVFP4 dequantizes its block scales with a node of their own:
formats/nvfp4.py), and whether its node writes the weight's dtype itself (output_dtype: the
FP4 formats' scales are float8, so no Cast).
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


VERSION_2_CODES = ("int4", "uint4", "int8", "uint8")


def per_channel(q: QuantizedWeight) -> bool:
    return q.codes.ndim == 2 and q.group == q.length


def version_of(q: QuantizedWeight) -> int:
    """The DynamicDequantize version its nodes are: 2 where it takes the codes, else 3."""
    return 2 if q.codes.dtype.name in VERSION_2_CODES and q.tensor_scale is None else 3


def placed(fmt, name: str, dtype: str, q: QuantizedWeight, names: NameScope, opset: int) -> Placed:
    """The tensors and nodes for weight `name` (of `dtype`) quantized as `q` in format `fmt`
    (formats.Format: what its codes are called, how its scales are read, whether its node writes
    the weight's dtype), named after the weight."""
    codes = names.fresh(f"{name}_quantized")
    scales = names.fresh(f"{name}_scales")
    version = version_of(q)
    tensors = [numpy_helper.from_array(q.codes, codes)]
    inputs = [codes, scales]
    nodes = []
    if per_channel(q):
        channel = 1 - q.axis
        attrs = dict(qtype="per_channel", axis=channel)
        scale_array = q.scales.reshape(-1)
        form = f"per_channel (axis {channel})"
    else:
        attrs = dict(qtype="per_group", group_shape=q.group_shape)
        scale_array = q.scales
        form = f"per_group {q.group_shape}"
    fmt.scale_inputs(name, q, scales, scale_array, names, tensors, nodes)
    if q.zero_points is not None:
        zps = names.fresh(f"{name}_zero_points")
        inputs.append(zps)
        tensors.append(numpy_helper.from_array(q.zero_points.reshape(-1) if per_channel(q) else q.zero_points, zps))
    form = f"{fmt.form(q)} {form}"
    if fmt.writes_dtype:  # (its scales are not of the weight's dtype: the node writes the weight's dtype itself)
        attrs["output_dtype"] = elem_type(dtype)
    cast = not fmt.writes_dtype and np.dtype(q.scales.dtype).name != dtype
    steps = ["DynamicDequantize"] + ["Slice"] * bool(q.padded_to) + ["Cast"] * cast
    out = names.fresh(f"{name}_dequantized")
    outputs = [names.fresh(f"{name}_{step}_out") for step in steps[:-1]] + [out]
    nodes.append(make_node(inputs, [outputs[0]], name=names.fresh(f"{name}_DynamicDequantize"), version=version,
                           **attrs))
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
