"""`lift(model)`: a copy of the model with DequantizeLinear nodes as DynamicDequantize.

A DequantizeLinear is lifted when DynamicDequantize expresses it exactly: x
int8/uint8, x_scale float32 with one element (per_tensor) or 1-D (per_channel,
with the node's axis written explicitly), zero point absent or of x's dtype, no
block_size, float32 output.  Every other one is left as it is and listed in the
report (and logged by `lift`).  `export(lift(m))` computes what `m` computes.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import onnx

from dyndq.build import make_node, opset_import
from dyndq.check import value_types
from dyndq.converters.dynamic_dequantize import LiftPlan, lift as lift_node
from dyndq.onnx_types import spec_of_type
from dyndq.opdefs import DOMAIN, PER_CHANNEL

log = logging.getLogger("dyndq.lift")


@dataclass(frozen=True)
class SkippedNode:
    graph: str  # "main", "main/if_node.then_branch", "function dom::Name"
    node: str  # its name, or its output's name when it had none
    reason: str

    def __str__(self) -> str:
        return f"{self.graph}: DequantizeLinear {self.node!r} left alone: {self.reason}"


@dataclass
class LiftReport:
    """What `lift` did: how many DequantizeLinear nodes it lifted, and each one it left alone, with why."""

    lifted: list[tuple[str, str, str]] = field(default_factory=list)  # (graph, node, qtype)
    skipped: list[SkippedNode] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.lifted)

    def summary(self) -> str:
        return f"lifted {self.count} DequantizeLinear node(s); left {len(self.skipped)} alone"


def lift(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with every liftable DequantizeLinear as DynamicDequantize; the others are logged."""
    out, report = lift_with_report(model)
    for s in report.skipped:
        log.info("%s", s)
    return out


def lift_with_report(model: onnx.ModelProto) -> tuple[onnx.ModelProto, LiftReport]:
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"lift() takes an onnx.ModelProto, not {type(model).__name__}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    report = LiftReport()
    types = value_types(out)

    def spec(name):
        return spec_of_type(types.get(name))

    _lift_nodes(out.graph.node, "main", spec, report)
    if report.lifted:
        _ensure_domain(out.opset_import)
    for f in out.functions:
        before = report.count
        # a function's inputs have no types: only what is computed inside it can be known
        _lift_nodes(f.node, f"function {f.domain}::{f.name}", lambda name: None, report)
        if report.count > before:
            _ensure_domain(f.opset_import)
            _ensure_domain(out.opset_import)
    return out, report


def _ensure_domain(imports) -> None:
    if not any(o.domain == DOMAIN for o in imports):
        imports.append(opset_import())


def _lift_nodes(nodes, path: str, spec, report: LiftReport) -> None:
    for i, node in enumerate(nodes):
        label = node.name or f"{node.op_type}#{i}"
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _lift_nodes(attr.g.node, f"{path}/{label}.{attr.name}", spec, report)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for j, g in enumerate(attr.graphs):
                    _lift_nodes(g.node, f"{path}/{label}.{attr.name}[{j}]", spec, report)
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        who = node.name or node.output[0]
        plan = lift_node(node, spec)
        if not isinstance(plan, LiftPlan):
            report.skipped.append(SkippedNode(path, who, plan))
            continue
        kwargs = {"qtype": plan.qtype}
        if plan.qtype == PER_CHANNEL:
            kwargs["axis"] = plan.axis
        new = make_node(list(plan.inputs), list(node.output), name=node.name or None, **kwargs)
        new.doc_string = node.doc_string
        nodes[i].CopyFrom(new)
        report.lifted.append((path, who, plan.qtype))
