"""Model-local functions whose nodes of our domains take attributes by reference.

ONNX lets a node in a function body write `axis` as a reference to an attribute
of the function (`ref_attr_name`), given at each call.  Such a node has no value
of its own to judge or lower: check judges it once per call, with the call's
values put in (as ONNX's inliner would), and export inlines those functions
with `onnx.inliner` before lowering.
"""
from __future__ import annotations

from typing import Iterator

import onnx

from dyndq.graphs import Site, function_path, walk, with_nested
from dyndq.opdefs import domains


def functions_with_references(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(domain, name) of each model-local function holding a node of ours with an attribute reference."""
    ours = domains()
    found = []
    for f in model.functions:
        nodes = [n for node in f.node for n in with_nested(node)]
        if any(n.domain in ours and any(a.ref_attr_name for a in n.attribute) for n in nodes):
            found.append((f.domain, f.name))
    return found


def call_sites(model: onnx.ModelProto) -> Iterator[Site]:
    """Each node of ours that takes attributes by reference, once per call of its function,
    with the call's attribute values put in (a reference to an attribute the call does not
    give falls back to the function's default, else the attribute is absent, as ONNX says)."""
    referring = set(functions_with_references(model))
    if not referring:
        return
    functions = {(f.domain, f.name): f for f in model.functions}
    ours = domains()
    for call in walk(model):
        key = (call.node.domain, call.node.op_type)
        if key not in referring:
            continue
        f = functions[key]
        given = {a.name: a for a in call.node.attribute}
        defaults = {a.name: a for a in f.attribute_proto}
        if any(a.ref_attr_name for a in given.values()):
            continue  # the call passes a reference on itself: judged where that function is called
        opsets = {o.domain: o.version for o in f.opset_import}
        where = f"{function_path(f)} (called by {call.graph} node {call.node.name or call.index})"
        for index, node in enumerate(f.node):
            if node.domain in ours and any(a.ref_attr_name for a in node.attribute):
                yield Site(where, index, _resolved(node, given, defaults), opsets, True)


def _resolved(node: onnx.NodeProto, given: dict, defaults: dict) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    del out.attribute[:]
    for a in node.attribute:
        if not a.ref_attr_name:
            out.attribute.append(a)
            continue
        value = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
        if value is not None:
            resolved = onnx.AttributeProto()
            resolved.CopyFrom(value)
            resolved.name = a.name
            out.attribute.append(resolved)
    return out


def inline_referring_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every function of `functions_with_references` inlined at its calls
    (by onnx.inliner, which puts each call's attribute values in); the model itself when none."""
    ids = functions_with_references(model)
    if not ids:
        return model
    import onnx.inliner

    return onnx.inliner.inline_selected_functions(model, ids)


