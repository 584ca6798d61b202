"""`lift(model)`: a copy of the model with standard nodes as ours, where ours express them exactly.

Which standard nodes are liftable, and how, is asked of the op versions whose
`lifting` part takes them (today: DequantizeLinear, opsets 10 to 25):

- version 1 takes x int8/uint8, x_scale float32 with one element (per_tensor)
  or 1-D (per_channel, the node's axis), zero point absent or of x's dtype, no
  block_size, float32 output;
- version 2 also takes int4/uint4 x, float16/bfloat16 x_scale (output_dtype
  absent or equal), and block_size (DequantizeLinear-21) as per_group with
  group_shape block_size along axis and 1 elsewhere, when every dim of x is
  known and divides exactly (ONNX rounds the block count up; our op does not);
  when x is a constant whose blocked axis does not divide, its codes are padded
  to whole blocks and a Slice cuts the result back (converters/dynamic_dequantize.py).

The oldest version that takes a node gets it, so forms version 1 expresses stay
version 1, and the model imports our domain at the lowest version that covers
every lifted node (a version it already imports is kept when it is newer: a
model importing version 2 keeps it, and its version-1 forms mean the same
there).  Every node left alone is listed in the report (and logged by `lift`).
`export(lift(m))` computes what `m` computes, bit for bit.

Every lift is a rule of kind LIFT in the one registry (converters/rules.py), applied in one
pass of the walker over every scope of the model; this module only reports what they did.

ONNX Runtime's contrib ops `com.microsoft::MatMulNBits` and `GatherBlockQuantized`
are lifted too, each by the rules of its module in converters/contrib/ (docs/int4-bridge.md): into
DynamicDequantize per_group + MatMul (+ Slice, Add) and DynamicDequantize + Gather (version 2,
or version 3 for 2-bit codes), their codes, scales and zero points carried over value for value
(half-integer float zero points doubled, with the scales halved, where that is exact; the bytes
it costs are among the report's notes); the forms ours cannot express exactly (a g_idx that is
not the identity, float zero points that are neither integers nor half-integers, ...) are left
alone and reported.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import onnx

from dyndq.checker import value_types
from dyndq.converters.rules import LIFT, apply, rules
from dyndq.converters.walker import settle
from dyndq.model_files import model_of
from dyndq.opdefs import all_versions
from dyndq.plumbing.names import NameScope, all_names, op_name
from dyndq.plumbing.opsets import import_at_least

log = logging.getLogger("dyndq.lift")


@dataclass(frozen=True)
class SkippedNode:
    graph: str  # "main", "main/if_node.then_branch", "function dom::Name"
    node: str  # its name, or its output's name when it had none
    reason: str
    op_type: str  # "DequantizeLinear", or "domain::OpType" outside ai.onnx

    def __str__(self) -> str:
        return f"{self.graph}: {self.op_type} {self.node!r} left alone: {self.reason}"


@dataclass
class LiftReport:
    """What `lift` did: the nodes it lifted (with what they became), and each one it left alone, with why."""

    lifted: list[tuple[str, str, str]] = field(default_factory=list)  # (graph, node, qtype or what it became)
    sources: list[str] = field(default_factory=list)  # the op type of each lifted node
    skipped: list[SkippedNode] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what to know of a lifted node (e.g. float zero points)

    @property
    def count(self) -> int:
        return len(self.lifted)

    def summary(self) -> str:
        kinds = sorted(set(self.sources)) or sorted({op.lifts_from[1] for op in all_versions() if op.lifts_from})
        return f"lifted {self.count} {'/'.join(kinds)} node(s); left {len(self.skipped)} alone"


def lift(model: onnx.ModelProto | str) -> onnx.ModelProto:
    """A copy of `model` with every liftable DequantizeLinear as DynamicDequantize; the others are logged."""
    out, report = lift_with_report(model)
    for s in report.skipped:
        log.info("%s", s)
    for note in report.notes:
        log.info("note: %s", note)
    return out


def lift_with_report(model: onnx.ModelProto | str) -> tuple[onnx.ModelProto, LiftReport]:
    model = model_of(model, "lift")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    report = LiftReport()
    outcomes = apply(out, rules(LIFT), value_types(out), NameScope(all_names(out)))
    for o in outcomes:
        op = op_name(o.node)
        if o.rewrite is None:
            report.skipped.append(SkippedNode(o.graph, o.name, o.reason, op))
            continue
        report.lifted.append((o.graph, o.name, o.rewrite.form))
        report.sources.append(o.node.op_type)
        report.notes.extend(o.rewrite.notes)
        if o.graph.startswith("function "):  # (the walker imported our domain into the function: the model too)
            for domain, version in o.rewrite.domains.items():
                if domain not in ("", "ai.onnx"):
                    import_at_least(out.opset_import, domain, version)
    if report.lifted:
        settle(out)  # (uint2 codes in a function importing opset 21 passed in; our domain at one version; IR 10 for int4)
    return out, report
