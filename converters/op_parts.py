"""The rules that apply an op version's own parts: its `lifting` (one standard node -> one of
ours) and its `lowering` (one of ours -> standard nodes).

Each op version converts one node by the parts attached to its handle (as JAX attaches a
lowering to a primitive); these two rules are how `lift` and `export` reach them, through
the one walker, for every op of the registry, a test's toy op included.
"""
from __future__ import annotations

import onnx

from dyndq.opdefs import LiftPlan, OpVersion, Refusal, TensorSpec, lifters
from dyndq.plumbing.opsets import op_version
from dyndq.plumbing.types import attribute_values, make_attribute, repeated_attributes

from .lowering_context import LoweringContext
from .rewrite import GraphView, Rewrite, stand_in
from .rules import LIFT, LOWER, OURS, rule


def input_specs(op: OpVersion, node: onnx.NodeProto, spec_of) -> list[TensorSpec | None]:
    """The spec of each of the op's inputs as its parts take them: None for an absent
    input, TensorSpec(None, None) for one whose type is not known."""
    names = list(node.input)
    return [
        (spec_of(names[i]) or TensorSpec(None, None)) if i < len(names) and names[i] else None
        for i in range(len(op.inputs))
    ]


def attrs_of(op: OpVersion, node: onnx.NodeProto) -> dict:
    """The node's attributes as the op's parts take them: the version's defaults, then the node's own."""
    attrs = op.defaults()
    attrs.update({k: v for k, v in attribute_values(node).items() if k in attrs or op.attribute(k)})
    return attrs


# -- lifting ------------------------------------------------------------------------------------

def _lift_check(node: onnx.NodeProto, view: GraphView):
    """(the op version, its plan): the oldest version whose lifting takes the node, so forms
    version 1 expresses stay version 1; or why none does."""
    candidates = lifters("" if node.domain == "ai.onnx" else node.domain, node.op_type)
    if not candidates:
        return Refusal("no op version lifts it", mine=False)
    twice = sorted(repeated_attributes(node))
    if twice:  # which value would the lifted node take? (ONNX refuses such a node)
        return Refusal(f"attribute {', '.join(twice)} given more than once")
    reasons = []
    for op in candidates:
        plan = op.lifting(node, view.spec)
        if isinstance(plan, LiftPlan):
            return op, plan
        reasons.append(str(plan))
    if len(set(reasons)) == 1:
        return Refusal(reasons[-1])
    return Refusal("; ".join(f"{op.qualname}-{op.since_version}: {r}" for op, r in zip(candidates, reasons)))


@rule("a standard node -> one of ours, by the op version's lifting", kind=LIFT, pattern=(None, None),
      check=_lift_check)
def lift(found, node: onnx.NodeProto, view: GraphView) -> Rewrite:
    op, plan = found
    new = onnx.helper.make_node(op.name, list(plan.inputs), list(node.output), domain=op.domain)
    # sorted by name, as onnx.helper.make_node writes them
    new.attribute.extend(make_attribute(k, op.attribute(k).kind.coerce(v), op.attribute(k).kind)
                         for k, v in sorted(plan.attrs.items()))
    stand_in(new, node)
    return Rewrite([node], [new], form=plan.attrs.get("qtype", op.name), domains={op.domain: op.since_version})


# -- lowering -----------------------------------------------------------------------------------

def _lower_check(node: onnx.NodeProto, view: GraphView):
    op = op_version(node, view.imports)
    return op if op is not None else Refusal("no op version where it stands", mine=False)


@rule("one of ours -> standard ONNX, by the op version's lowering", kind=LOWER, pattern=(OURS, None),
      check=_lower_check, order=1)
def lower(op: OpVersion, node: onnx.NodeProto, view: GraphView) -> Rewrite:
    """The op version's lowering at the export's target opset (`view.options["opset"]`, which
    export chose from every node's `lowering_needs`: the nodes written need that opset), for its
    target's engine (`view.options["target"]`); the last node stands where the original stood:
    it keeps its name, doc string and metadata."""
    opset = view.options["opset"]
    inputs = [name or None for name in list(node.input) + [""] * (len(op.inputs) - len(node.input))]
    ctx = LoweringContext(opset=opset, base=node.name or node.output[0], names=view.names, specs=view.spec,
                          target=view.options.get("target", "onnx"), constants=view.constant)
    result = op.lowering(ctx, *inputs[: len(op.inputs)], **attrs_of(op, node))
    ctx.output_as(result, node.output[0])
    new = list(ctx.nodes)
    if new:
        view.names.used.discard(new[-1].name)  # (its fresh name goes: it takes the original's)
        stand_in(new[-1], node)
    form = ctx.form or ", ".join(dict.fromkeys(n.op_type for n in new if n.op_type != "Constant")) or "identity"
    return Rewrite([node], new, ctx.initializers, form=form, domains={"": opset}, derived=ctx.derived,
                   needs_why=f"the export's target opset {opset}")
