"""Constants a model-local function cannot hold, passed in from the main graph, and back.

A function holds no initializers: its constants are Constant nodes, and ONNX judges a Constant
node by the Constant schema of the ai.onnx opset its function imports.  Constant-21 holds int4
and float8 tensors, but float4e2m1 only from opset 23, float8e8m0 from 24 and int2/uint2 from 25
(`onnx.defs.get_schema("Constant", opset)`), so the codes of a 2-bit or FP4 weight inside a
function importing opset 21 make a model ONNX's checker refuses.  The ways around it that keep
the codes' type and bits:

- raising the function's ai.onnx import is none: the checker resolves every node of a function
  under its import and under the model's (checker.cc, `check_opset_compatibility`) and refuses
  the model where they give different versions, as Constant-21 and Constant-25 are;
- nor is a Constant taking its value from a function attribute (`ref_attr_name`): ONNX infers
  its type from the calling node's attribute and judges it by the same schema;
- an initializer of the main graph is judged by the IR version alone.  So `pass_out` makes such
  a constant one, and the function takes it as a new input, passed by every node calling the
  function (a call inside another function passes that function's new input of the same name,
  which its own callers pass in turn).  The codes keep their type and their bits on disk,
  stored once however many nodes call the function.

Commands build and rewrite functions with Constant nodes, where rules see them as constants
(quantize, lift and export's rules), and call `pass_out` on what they write; `take_in` turns a
model written so back into Constant nodes (export does, before its rules).  The inputs passed so
are named in the function's metadata (`PASSED_IN`), so that `take_in` takes back those alone,
never an input of a function as its author wrote it.
"""
from __future__ import annotations

import json

import onnx

from .names import NameScope, all_names
from .opsets import ai_onnx_version
from .walk import graphs, is_constant_node, subgraphs, with_nested

# A function's metadata entry naming (JSON list) the inputs `pass_out` gave it
PASSED_IN = "dyndq.passed_in"


def constant_holds(data_type: int, imports) -> bool:
    """Whether a Constant node may hold a tensor of ONNX type `data_type` in a scope with these
    opset imports (a function's): whether the Constant of its ai.onnx opset takes that type."""
    opset = ai_onnx_version(imports)
    if opset is None:
        return False
    allowed = onnx.defs.get_schema("Constant", opset).type_constraints[0].allowed_type_strs
    return f"tensor({onnx.TensorProto.DataType.Name(data_type).lower()})" in allowed


def pass_out(model: onnx.ModelProto) -> list[str]:
    """Make every Constant node of a function (its bodies included) holding a type its opset's
    Constant does not take an initializer of the main graph passed in as a new input, in place;
    returns their names.  A name some other scope uses is changed (to a fresh one) in the function."""
    moved = []
    names = None
    for k, f in enumerate(model.functions):
        outside = None
        for nodes in _node_lists(f.node):
            for node in [n for n in nodes if _unheld(n, f)]:
                if names is None:
                    names = NameScope(all_names(model))
                if outside is None:
                    outside = _names_outside(model, k)
                name = node.output[0]
                if name in outside:
                    name = names.fresh(name)
                    _rename_in(f, node.output[0], name)
                tensor = onnx.TensorProto()
                tensor.CopyFrom(node.attribute[0].t)
                tensor.name = name
                nodes.remove(node)
                model.graph.initializer.append(tensor)
                _pass_in(model, k, name)
                moved.append(name)
    return moved


def take_in(model: onnx.ModelProto) -> list[str]:
    """The inverse of `pass_out`, in place: each function input that every node calling the function
    passes from the main graph's initializer of the same name (through the callers' own such
    inputs) becomes a Constant node of the function again, first among its nodes; an initializer
    nothing reads any more leaves the main graph.  Returns the names taken in."""
    passed = _passed(model)
    for k, name in passed:
        f = model.functions[k]
        i = list(f.input).index(name)
        for call in _calls(model, k):
            if len(call.input) > i:
                del call.input[i]
        del f.input[i]
        _note(f, [n for n in _noted(f) if n != name])
    initializers = {t.name: t for t in model.graph.initializer}
    first: dict[int, int] = {}  # function number -> Constant nodes put first so far (in the order passed)
    for k, name in passed:
        f = model.functions[k]
        if any(name in n.input for node in f.node for n in with_nested(node)) or name in f.output:
            f.node.insert(first.get(k, 0), onnx.helper.make_node("Constant", [], [name], value=initializers[name]))
            first[k] = first.get(k, 0) + 1
    read = {x for g in graphs(model.graph) for n in g.node for x in n.input} | {o.name for o in model.graph.output}
    for name in {name for _, name in passed} - read:
        model.graph.initializer.remove(initializers[name])
    return [name for _, name in passed]


# -- the parts -------------------------------------------------------------------------------------

def _unheld(node: onnx.NodeProto, f: onnx.FunctionProto) -> bool:
    return is_constant_node(node) and node.attribute[0].name == "value" \
        and not constant_holds(node.attribute[0].t.data_type, f.opset_import)


def _node_lists(nodes):
    """The function's node list and those of every body in it."""
    yield nodes
    for node in nodes:
        for _, g in subgraphs(node):
            for sub in graphs(g):
                yield sub.node


def _names_outside(model: onnx.ModelProto, k: int) -> set[str]:
    """Every value name the model uses outside its function number `k`."""
    names = set()
    for g in graphs(model.graph):
        names.update(vi.name for vi in [*g.input, *g.output, *g.value_info])
        names.update(t.name for t in g.initializer)
        names.update(x for n in g.node for x in [*n.input, *n.output])
    for j, other in enumerate(model.functions):
        if j != k:
            names.update([*other.input, *other.output])
            names.update(x for node in other.node for n in with_nested(node) for x in [*n.input, *n.output])
    return names


def _rename_in(f: onnx.FunctionProto, old: str, new: str) -> None:
    for node in f.node:
        for n in with_nested(node):
            n.input[:] = [new if x == old else x for x in n.input]
            n.output[:] = [new if x == old else x for x in n.output]
    f.output[:] = [new if x == old else x for x in f.output]


def _calls(model: onnx.ModelProto, k: int, within: int | None = -1) -> list[onnx.NodeProto]:
    """The nodes calling function number `k`: anywhere in the model (`within` -1), in the main graph
    and its bodies (None), or in function number `within`."""
    f = model.functions[k]
    lists = [model.graph.node] + [g.node for g in model.functions] if within == -1 else \
        [model.graph.node if within is None else model.functions[within].node]
    return [n for nodes in lists for node in nodes for n in with_nested(node)
            if n.domain == f.domain and n.op_type == f.name and n.overload == f.overload]


def _pass_in(model: onnx.ModelProto, k: int, name: str) -> None:
    """Make `name`, a value of the main graph, an input of function number `k`, passed by every node
    calling it."""
    f = model.functions[k]
    if name in f.input:
        return
    f.input.append(name)
    _note(f, _noted(f) + [name])
    for caller in [None, *range(len(model.functions))]:
        calls = _calls(model, k, caller)
        if calls and caller is not None:
            _pass_in(model, caller, name)  # (a call inside another function: that function passes it on)
        for n in calls:
            n.input.extend([""] * (len(f.input) - 1 - len(n.input)))  # (inputs it leaves out, as absent)
            n.input.append(name)


def _passed(model: onnx.ModelProto) -> list[tuple[int, str]]:
    """(function number, input name) for each input every call passes from the main graph's
    initializer of that name, directly or through the caller's own such input; a function no node
    calls has none."""
    fed = {vi.name for vi in model.graph.input}
    main = {t.name for t in model.graph.initializer} - fed
    pairs = {(k, name) for k, f in enumerate(model.functions) for name in _noted(f) if name in main and name in f.input}
    changed = True
    while changed:  # (until every pair left is passed so by every call, its callers' pairs standing)
        changed = False
        for k, name in sorted(pairs):
            i = list(model.functions[k].input).index(name)
            called = False
            for caller in [None, *range(len(model.functions))]:
                calls = _calls(model, k, caller)
                if any(len(c.input) <= i or c.input[i] != name for c in calls) or \
                        (calls and caller is not None and (caller, name) not in pairs):
                    called = False
                    break
                called = called or bool(calls)
            if not called:
                pairs.discard((k, name))
                changed = True
    return sorted(pairs)


def _noted(f: onnx.FunctionProto) -> list[str]:
    """The inputs `pass_out` gave the function (its PASSED_IN metadata)."""
    for entry in f.metadata_props:
        if entry.key == PASSED_IN:
            try:
                names = json.loads(entry.value)
            except ValueError:
                return []
            return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []
    return []


def _note(f: onnx.FunctionProto, names: list[str]) -> None:
    kept = [(entry.key, entry.value) for entry in f.metadata_props if entry.key != PASSED_IN]
    del f.metadata_props[:]
    for key, value in kept:
        f.metadata_props.add(key=key, value=value)
    if names:
        f.metadata_props.add(key=PASSED_IN, value=json.dumps(names))
