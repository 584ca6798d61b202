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
from dyndq.graphs import walk
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

    no_types = lambda name: None  # noqa: E731  (a function's inputs have no types)
    for site in walk(out):
        node = site.node
        if node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
            continue
        who = node.name or node.output[0]
        plan = lift_node(node, no_types if site.in_function else spec)
        if not isinstance(plan, LiftPlan):
            report.skipped.append(SkippedNode(site.graph, who, plan))
            continue
        kwargs = {"qtype": plan.qtype}
        if plan.qtype == PER_CHANNEL:
            kwargs["axis"] = plan.axis
        new = make_node(list(plan.inputs), list(node.output), name=node.name or None, **kwargs)
        new.doc_string = node.doc_string
        node.CopyFrom(new)  # in place: the walk hands out the model's own protos
        report.lifted.append((site.graph, who, plan.qtype))
    if report.lifted:
        _ensure_domain(out.opset_import)
    # a function whose nodes (at any depth) were lifted imports our domain itself
    lifted_in = {graph.split("/")[0] for graph, _, _ in report.lifted}
    for f in out.functions:
        if f"function {f.domain}::{f.name}" in lifted_in:
            _ensure_domain(f.opset_import)
    return out, report


def _ensure_domain(imports) -> None:
    if not any(o.domain == DOMAIN for o in imports):
        imports.append(opset_import())
