"""`check(model)`: every problem with the use of our ops in a model, all at once.

ONNX's checker stops at the first error and knows nothing of our rules beyond
the schema, so we walk the graphs ourselves (main graph, every If/Loop/Scan
body, model-local functions), judge each node of our domains with the op's own
shape function, and then let `onnx.checker` judge the rest of the model.
"""
from __future__ import annotations

import onnx
from onnx import AttributeProto, external_data_helper

from dyndq.plumbing.types import (ATTRIBUTE_PROTO_TYPE, attribute_type_name, attribute_value, repeated_attributes,
                                  spec_of_type)
from dyndq.converters.op_parts import input_specs
from dyndq.model_files import model_of
from dyndq.plumbing.walk import Site, walk
from dyndq.opdefs import (
    OpVersion,
    Problem,
    ValidationError,
    all_versions,
    domains,
    newest_domain_version,
    ops_of,
    qualname,
    versions_of,
)
from dyndq.schema import MARK
from dyndq.wording import a as article
from dyndq.scopes import ValueTypes, value_types  # noqa: F401  (value_types: part of this module's face)


def check_node(site: Site, all_types: ValueTypes) -> list[Problem]:
    """The problems of one node of our domains (none for other nodes)."""
    node = site.node
    types = all_types.at(site.graph)
    if node.domain not in domains():
        return []
    where = dict(op=qualname(node.domain, node.op_type), node=node.name, node_index=site.index, graph=site.graph)
    op, problems = _resolve(site)
    if op is None:
        return [p.at(**where) for p in problems]
    problems += _arity(op, node)
    attrs, attr_problems = _attributes(op, node)
    problems += attr_problems
    specs = input_specs(op, node, all_types.specs_at(site.graph))
    if attrs is not None and all(s is not None for s, p in zip(specs, op.inputs) if not p.optional):
        try:
            inferred = op.shape_inference(*specs, **attrs)
        except ValidationError as e:
            problems += e.problems
        else:
            problems += _declared_outputs(op, node, inferred, types)
    return [p.at(**where) for p in problems]


def _declared_outputs(op: OpVersion, node, inferred, types) -> list[Problem]:
    """A declared output dtype other than the one the op infers (e.g. a float32 dst beside
    float16 scales): ONNX would report it as a clash of types, far from the node."""
    inferred = inferred if isinstance(inferred, (list, tuple)) else [inferred]
    problems = []
    for param, name, spec in zip(op.outputs, node.output, inferred):
        declared = spec_of_type(types.get(name))
        if declared is not None and declared.dtype and spec.dtype and declared.dtype != spec.dtype:
            problems.append(Problem(param.name, f"declared dtype {declared.dtype}",
                                    f"{spec.dtype}, the dtype the op gives it ({param.type_var})"))
    return problems


def _resolve(site: Site) -> tuple[OpVersion | None, list[Problem]]:
    """The op version the node resolves to where it stands (`Site.op`), or why there is none."""
    node, opsets = site.node, site.opsets
    if not versions_of(node.domain, node.op_type):
        ops = ops_of(node.domain)
        return None, [Problem("op_type", repr(node.op_type), f"an op of domain {node.domain!r}: {', '.join(ops)}")]
    newest = newest_domain_version(node.domain)
    oldest = versions_of(node.domain, node.op_type)[0]
    allowed = f"an opset import of {node.domain!r} at version {oldest if oldest == newest else f'{oldest}..{newest}'}"
    if node.domain not in opsets:
        return None, [Problem("opset_import", f"no opset import for domain {node.domain!r}", allowed)]
    version = opsets[node.domain]
    op = site.op
    if op is None or version > newest:
        return None, [Problem("opset_import", f"{node.domain!r} at version {version}", allowed)]
    return op, []


def _arity(op: OpVersion, node) -> list[Problem]:
    problems = []
    n_required = sum(not p.optional for p in op.inputs)
    names = list(node.input)
    while names and not names[-1]:
        names.pop()  # trailing empty names are omitted optional inputs
    if len(names) > len(op.inputs):
        problems.append(Problem("inputs", f"{len(names)} inputs", f"at most {len(op.inputs)}: {_names(op.inputs)}"))
    for i, p in enumerate(op.inputs[:n_required]):
        if i >= len(names) or not names[i]:
            problems.append(Problem(p.name, "missing", f"{article(p.type_var)} input (required)"))
    if len(node.output) != len(op.outputs) or not all(node.output):
        problems.append(Problem("outputs", f"{len(node.output)} outputs {list(node.output)}", f"exactly {len(op.outputs)}: {_names(op.outputs)}"))
    return problems


def _names(params) -> str:
    return ", ".join(p.name + (" (optional)" if p.optional else "") for p in params)


def _attributes(op: OpVersion, node) -> tuple[dict | None, list[Problem]]:
    """The node's attributes as the op's parts take them, a bad one left at its default
    (None when a required one is missing: then the parts cannot be asked)."""
    attrs = op.defaults()
    problems = []
    seen = set()
    for a in node.attribute:
        spec = op.attribute(a.name)
        if a.name in seen:
            problems.append(Problem(a.name, "the attribute given more than once", "each attribute at most once"))
            continue
        seen.add(a.name)
        if spec is None:
            known = ", ".join(x.name for x in op.attributes)
            problems.append(Problem(a.name, "an unknown attribute", f"attributes {known}"))
        elif a.ref_attr_name:
            problems.append(Problem(a.name, f"a reference to the function's attribute {a.ref_attr_name!r}",
                                    f"{article(attribute_type_name(spec.kind))} value written on the node"))
        elif a.type != ATTRIBUTE_PROTO_TYPE[spec.kind]:
            found = AttributeProto.AttributeType.Name(a.type)
            problems.append(Problem(a.name, f"an attribute of type {found} ({attribute_value(a)!r})",
                                    f"type {attribute_type_name(spec.kind)}"))
        else:
            attrs[a.name] = attribute_value(a)
    missing = [spec for spec in op.attributes if spec.required and spec.name not in attrs]
    for spec in missing:
        problems.append(Problem(spec.name, "missing", f"{article(attribute_type_name(spec.kind))} attribute (required)"))
    return (None if missing else attrs), problems


def _about_our_ops(message: str) -> bool:
    return any(op.name in message for op in all_versions())


def _about_unloaded_external_data(model: onnx.ModelProto, message: str) -> bool:
    """Whether ONNX's complaint is only that it cannot find the file of a tensor whose external
    data is not loaded. A ModelProto does not know the folder it came from, so the checker looks
    for the file beside the current directory; the file is judged when the model is loaded from
    its path (onnx.load, dyndq's CLI), not here."""
    if "should be stored in" not in message:
        return False
    return any(
        f"tensor name: {t.name})" in message
        for t in external_data_helper._get_all_tensors(model)
        if external_data_helper.uses_external_data(t)
    )


def onnx_checker_problems(model: onnx.ModelProto, ours_reported: bool) -> list[Problem]:
    """What `onnx.checker.check_model(full_check=True)` finds (it stops at the first),
    leaving out what is about our ops when we have reported on them already."""
    from dyndq.lent_schemas import lent
    from dyndq.plumbing.light import light_view

    light = light_view(model)  # (a model over 2 GiB cannot be serialized for ONNX's checker)

    def first(full: bool) -> str | None:
        try:
            with lent(model):  # (ONNX Runtime's schemas of its ops in the model, which ONNX has none of)
                onnx.checker.check_model(light, full_check=full)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            return str(e).strip()
        except ValueError as e:  # e.g. "Invalid tensor data type 0." for a declared UNDEFINED element type
            return str(e).strip() or type(e).__name__
        return None

    message = first(True)
    if message is not None and (MARK in message or (ours_reported and _about_our_ops(message))):
        message = first(False)  # ONNX stopped at a mistake reported above; its structural checks still count
        if message is not None and ours_reported and _about_our_ops(message):
            message = None
    if message is None or _about_unloaded_external_data(model, message):
        return []
    return [Problem("model", f"onnx.checker: {message}", "a model that onnx.checker.check_model(full_check=True) accepts")]


def check(model: onnx.ModelProto | str) -> list[Problem]:
    """Every problem found in the model; an empty list means it is valid."""
    model = model_of(model, "check")
    from dyndq.function_attrs import call_sites

    types = value_types(model)
    sites = [site for site in walk(model) if not _takes_references(site)]  # judged once per call, below
    problems = [p for site in sites + list(call_sites(model)) for p in check_node(site, types)]
    problems += [p for site in walk(model) if site.node.domain not in domains() for p in duplicate_attributes(site)]
    return problems + onnx_checker_problems(model, ours_reported=bool(problems))


def duplicate_attributes(site: Site) -> list[Problem]:
    """An attribute given twice on a node of any domain. ONNX's checker refuses it (stopping
    there), but onnx.reference runs the node with the last value and ONNX Runtime with another:
    so it is named here, at its node, for every node (ours are judged in check_node)."""
    node = site.node
    where = dict(op=f"{node.domain or 'ai.onnx'}::{node.op_type}", node=node.name, node_index=site.index, graph=site.graph)
    return [Problem(name, "the attribute given more than once", "each attribute at most once").at(**where)
            for name in repeated_attributes(node)]


def _takes_references(site: Site) -> bool:
    return site.in_function and site.node.domain in domains() and any(a.ref_attr_name for a in site.node.attribute)



def validate(model: onnx.ModelProto) -> None:
    """Raise ValidationError with every problem, if there is any."""
    problems = check(model)
    if problems:
        raise ValidationError(problems)
