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

ONNX Runtime's contrib ops `com.microsoft::MatMulNBits` and `GatherBlockQuantized`
are lifted first, each by its module in converters/ (docs/int4-bridge.md): into
DynamicDequantize-2 per_group + MatMul (+ Slice, Add) and DynamicDequantize-2 +
Gather, their codes, scales and zero points carried over value for value; the
forms ours cannot express exactly (2-bit codes, a g_idx that is not the identity,
float zero points that are not integers, ...) are left alone and reported.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import onnx

from dyndq.build import make_node
from dyndq.files import model_of
from dyndq.checker import value_types
from dyndq.converters import FOREIGN
from dyndq.converters.dynamic_dequantize import lift_padded_blocks
from dyndq.plumbing.names import NameScope
from dyndq.plumbing.types import repeated_attributes
from dyndq.plumbing.names import all_names
from dyndq.plumbing.walk import function_path, scopes, walk
from dyndq.plumbing.opsets import import_at_least
from dyndq.opdefs import LiftPlan, all_versions, lifters
from dyndq.plumbing.ir import model_ir
from dyndq.rewrites import rewrite_model, specs_at

log = logging.getLogger("dyndq.lift")


@dataclass(frozen=True)
class SkippedNode:
    graph: str  # "main", "main/if_node.then_branch", "function dom::Name"
    node: str  # its name, or its output's name when it had none
    reason: str
    op_type: str = "DequantizeLinear"

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
    _lift_foreign(out, report)
    types = value_types(out)

    in_scope = {scope.path: scope for scope in scopes(out)}
    imports: dict[tuple[str, str], int] = {}  # (domain, "main" or function) -> lowest version covering its nodes
    for site in walk(out):
        node = site.node
        candidates = lifters(node.domain, node.op_type)
        if not candidates:
            continue
        who = node.name or node.output[0]
        twice = sorted(repeated_attributes(node))
        if twice:  # which value would the lifted node take? (ONNX refuses such a node)
            report.skipped.append(SkippedNode(site.graph, who, f"attribute {', '.join(twice)} given more than once", node.op_type))
            continue
        spec = specs_at(types, in_scope[site.graph])  # its own graph's scope (in a function: its constants')
        reasons = []
        for op in candidates:  # oldest first: the lowest version that expresses the node
            plan = op.lifting(node, spec)
            if isinstance(plan, LiftPlan):
                break
            reasons.append(str(plan))
        else:
            reason = reasons[-1] if len(set(reasons)) == 1 else "; ".join(
                f"{op.qualname}-{op.since_version}: {r}" for op, r in zip(candidates, reasons))
            report.skipped.append(SkippedNode(site.graph, who, reason, node.op_type))
            continue
        new = make_node(list(plan.inputs), list(node.output), name=node.name or None, op_type=op.name,
                        domain=op.domain, version=op.since_version, **plan.attrs)
        if node.HasField("doc_string"):
            new.doc_string = node.doc_string
        new.metadata_props.extend(node.metadata_props)
        report.sources.append(node.op_type)
        node.CopyFrom(new)  # in place: the walk hands out the model's own protos
        report.lifted.append((site.graph, who, plan.attrs.get("qtype", op.name)))
        for key in ((op.domain, "main"), (op.domain, site.scope)):
            imports[key] = max(imports.get(key, 0), op.since_version)
    for (domain, scope), version in imports.items():
        if scope == "main":
            import_at_least(out.opset_import, domain, version)
    # a function whose nodes (at any depth) were lifted imports the domain itself
    for f in out.functions:
        for (domain, scope), version in imports.items():
            if scope == function_path(f):
                import_at_least(f.opset_import, domain, version)
    return out, report


def _lift_foreign(out: onnx.ModelProto, report: LiftReport) -> None:
    """Lift in place what takes more than renaming one node: ONNX Runtime's contrib ops
    (converters.FOREIGN), and blocked DequantizeLinear whose blocked axis is padded (x constant);
    recording each in the report."""

    def candidate(node) -> bool:
        return (node.domain, node.op_type) in FOREIGN or (
            node.op_type == "DequantizeLinear" and any(a.name == "block_size" for a in node.attribute))

    if not any(candidate(site.node) for site in walk(out)):
        return

    def convert(node, view):
        module = FOREIGN.get((node.domain, node.op_type))
        if module is None:
            padded = lift_padded_blocks(node, view)
            return padded if not isinstance(padded, str) else None  # (the op versions' lifting tells why)
        return module.lift(node, view)

    outcomes = rewrite_model(out, convert, value_types(out), NameScope(all_names(out)))
    for o in outcomes:
        if o.rewrite is None:
            op = f"{o.node.domain}::{o.node.op_type}" if o.node.domain else o.node.op_type
            report.skipped.append(SkippedNode(o.graph, o.name, o.reason, op))
            continue
        report.lifted.append((o.graph, o.name, o.rewrite.form))
        report.sources.append(o.node.op_type)
        report.notes.extend(o.rewrite.notes)
    if report.lifted:  # (the walker imported our domain where it wrote nodes of it)
        out.ir_version = max(out.ir_version, model_ir(out))  # (int4 codes need IR 10)
