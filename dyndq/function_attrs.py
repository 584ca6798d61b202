"""Model-local functions whose nodes of our domains take attributes by reference.

ONNX lets a node in a function body write `axis` as a reference to an attribute
of the function (`ref_attr_name`), given at each call; a call inside a function
may itself pass one of its own attributes on by reference, so a value can come
down a chain of calls.  Such a node has no value of its own to judge or lower:
check judges it once per chain of calls that gives it values (with the values
put in, as ONNX's inliner would), and export inlines those functions with
`onnx.inliner` before lowering.  The inliner moves nodes, not opset imports, so
the scopes the nodes land in are first made to import what they need: a node of
ours is resolved by the imports of the scope it stands in (`graphs.op_version`).
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import onnx

from dyndq.plumbing.opsets import import_if_absent, scope_opsets
from dyndq.plumbing.walk import Site, function_sites, walk, with_nested
from dyndq.opdefs import domains

FunctionKey = tuple[str, str]  # (domain, name), as a call names a function


def _passes_references(node: onnx.NodeProto) -> bool:
    return any(a.ref_attr_name for a in node.attribute)


def functions_with_references(model: onnx.ModelProto) -> list[FunctionKey]:
    """(domain, name) of each model-local function holding (at any depth) a node of ours with
    an attribute reference, or a call passing an attribute by reference to such a function:
    either way its nodes get their values only from its own callers."""
    functions = {(f.domain, f.name): f for f in model.functions}
    ours = domains()
    found: set[FunctionKey] = set()
    grown = True
    while grown:  # a caller of a referring function refers in turn: until nothing is added
        grown = False
        for key, f in functions.items():
            if key not in found and any(
                _passes_references(n) and (n.domain in ours or (n.domain, n.op_type) in found)
                for node in f.node for n in with_nested(node)
            ):
                found.add(key)
                grown = True
    return [key for key in functions if key in found]


def call_sites(model: onnx.ModelProto) -> Iterator[Site]:
    """Each node of ours that takes attributes by reference, once per chain of calls that gives
    it values, with those values put in.  A chain starts at a call that passes no reference
    (in the main graph, a body, or a function) and goes down through calls that pass some on;
    a reference to an attribute its call does not give falls back to the function's default,
    else the attribute is absent, as ONNX says."""
    referring = set(functions_with_references(model))
    if not referring:
        return
    functions = {(f.domain, f.name): f for f in model.functions}
    for call in walk(model):
        if (call.node.domain, call.node.op_type) in referring and not _passes_references(call.node):
            yield from _called(functions, referring, call.node, {}, [_caller(call)], ())


def _caller(site: Site) -> str:
    return f"{site.graph} node {site.node.name or site.index}"


def _called(functions, referring, call: onnx.NodeProto, outer: dict, chain: list[str], entered: tuple) -> Iterator[Site]:
    """The nodes of ours with references in the function `call` calls, and in the functions it
    calls on with references, given the call's values; `chain` names the calls, innermost first."""
    key = (call.domain, call.op_type)
    if key in entered:  # a function calling itself: ONNX refuses it (check says so), nothing to judge here
        return
    f = functions[key]
    values = _values(f, call, outer)
    ours = domains()
    for site in function_sites(f):
        node = site.node
        if not _passes_references(node):
            continue
        if node.domain in ours:
            where = f"{site.graph} (called by {', called by '.join(chain)})"
            yield dataclasses.replace(site, graph=where, node=_resolved(node, values))
        elif (node.domain, node.op_type) in referring:
            yield from _called(functions, referring, node, values, [_caller(site)] + chain, entered + (key,))


def _values(f: onnx.FunctionProto, call: onnx.NodeProto, outer: dict) -> dict[str, onnx.AttributeProto]:
    """The function's attribute values at one call: written on the call, or passed on by
    reference from the caller's own values (`outer`), else the function's default."""
    values = {a.name: a for a in f.attribute_proto}
    for a in call.attribute:
        given = outer.get(a.ref_attr_name) if a.ref_attr_name else a
        if given is not None:
            values[a.name] = given
    return values


def _resolved(node: onnx.NodeProto, values: dict) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    del out.attribute[:]
    for a in node.attribute:
        if not a.ref_attr_name:
            out.attribute.append(a)
            continue
        value = values.get(a.ref_attr_name)
        if value is not None:
            resolved = onnx.AttributeProto()
            resolved.CopyFrom(value)
            resolved.name = a.name
            out.attribute.append(resolved)
    return out


def inline_referring_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every function of `functions_with_references` inlined at its calls (by
    onnx.inliner, which puts each call's attribute values in), each scope that takes their nodes
    importing what they import; the model itself when there is none.  (onnx.inliner raises
    RuntimeError when two scopes import one domain at two versions.)"""
    ids = functions_with_references(model)
    if not ids:
        return model
    import onnx.inliner

    return onnx.inliner.inline_selected_functions(_imports_for_inlining(model, ids), ids)


def _imports_for_inlining(model: onnx.ModelProto, ids: list[FunctionKey]) -> onnx.ModelProto:
    """A copy in which every scope (the model, each function) calling a function of `ids`
    imports every domain that function's nodes, and those it inlines in turn, need.  (A scope
    importing a domain already is left as it is: for our domains, at the same version, as
    onnx.checker refuses two versions of a custom domain in one model, and export checks first.)"""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inlined = set(ids)
    functions = {(f.domain, f.name): f for f in out.functions}

    def callees(nodes) -> set[FunctionKey]:
        return {(n.domain, n.op_type) for node in nodes for n in with_nested(node)} & inlined

    needs = {key: scope_opsets(functions[key].opset_import) for key in ids}
    grown = True
    while grown:  # what a function inlines in turn lands with it
        grown = False
        for key in ids:
            for callee in callees(functions[key].node):
                for domain, version in needs[callee].items():
                    if domain not in needs[key]:
                        needs[key][domain] = version
                        grown = True
    for imports, nodes in [(out.opset_import, out.graph.node)] + [(f.opset_import, f.node) for f in out.functions]:
        for callee in callees(nodes):
            for domain, version in needs[callee].items():
                import_if_absent(imports, domain, version)
    return out
