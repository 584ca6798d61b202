"""Building graphs with our op: nodes, the opset import, and models ONNX Runtime loads."""
from __future__ import annotations

import onnx

from dyndq.opdefs import DOMAIN, DYNAMIC_DEQUANTIZE_1, PER_CHANNEL, Problem, TensorSpec, ValidationError, newest_domain_version

# The newest ai.onnx opset ONNX Runtime 1.31 runs; models are made no newer.
ORT_MAX_OPSET = 26


def make_node(inputs, outputs, *, qtype: str = "per_tensor", axis: int = 1, name: str | None = None) -> onnx.NodeProto:
    """A DynamicDequantize node in our domain; `inputs` is [src, scales] or [src, scales, zps].

    A bad qtype or axis is refused here, at once, rather than at check time.
    """
    # The op's shape function judges the attributes; with nothing known of the
    # inputs, attributes are all it judges.
    unknown = TensorSpec(None, None)
    try:
        DYNAMIC_DEQUANTIZE_1.shape_inference(unknown, unknown, qtype=qtype, axis=axis)
        problems = []
    except ValidationError as e:
        problems = e.problems
    inputs, outputs = list(inputs), list(outputs)
    if not 2 <= len(inputs) <= 3:
        problems.append(Problem("inputs", f"{len(inputs)} inputs", "[src, scales] or [src, scales, zps]"))
    if len(outputs) != 1:
        problems.append(Problem("outputs", f"{len(outputs)} outputs", "[dst]"))
    if problems:
        raise ValidationError([p.at(op=f"{DOMAIN}::{DYNAMIC_DEQUANTIZE_1.name}", node=name, node_index=None, graph=None) for p in problems])
    attrs = {"qtype": qtype}
    if qtype == PER_CHANNEL:
        attrs["axis"] = int(axis)
    return onnx.helper.make_node(DYNAMIC_DEQUANTIZE_1.name, inputs, outputs, name=name, domain=DOMAIN, **attrs)


def opset_import(version: int | None = None) -> onnx.OperatorSetIdProto:
    """The opset import a model needs for our domain (the newest version by default)."""
    return onnx.helper.make_opsetid(DOMAIN, newest_domain_version(DOMAIN) if version is None else version)


def ir_version_for(opset_imports) -> int:
    """The lowest IR version the opsets need. `make_model` stamps the newest one, which
    ONNX Runtime may refuse (1.31 loads IR <= 13 while onnx 1.23 stamps 14)."""
    return onnx.helper.find_min_ir_version_for(list(opset_imports), ignore_unknown=True)


def make_model(graph: onnx.GraphProto, *, opset: int = 21, **kwargs) -> onnx.ModelProto:
    """A model of `graph` importing ai.onnx at `opset` and our domain, at the lowest IR version they need."""
    imports = [onnx.helper.make_opsetid("", opset), opset_import()]
    kwargs.setdefault("ir_version", ir_version_for(imports))
    return onnx.helper.make_model(graph, opset_imports=imports, **kwargs)
