"""`dump(model) -> dict`: an ONNX model holding our op and mapped standard ops as a oneDNN graph.

The JSON is oneDNN's 3.x graph format: dense row-major strides, `strided` layouts,
property types, input and output ports.  Nodes that `load` wrote carry the oneDNN
op they came from in their metadata (`onednn.op`): each such group of nodes is
written back as that op, kind, attributes, name and tensor ids unchanged.  Other
nodes are written by the handler whose `onnx_types` hold their op type, one op per node,
with the attribute types of the handler's spec.  What oneDNN cannot
express (an ONNX op without a kind, data held in the model, a dtype oneDNN lacks)
is refused with every problem named.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import onnx

from dyndq.converters.onnx_types import attribute_values, spec_of_type
from dyndq.onednn.int4 import dense_strides
from dyndq.onednn.kinds import inverse_table
from dyndq.opdefs import DOMAIN, Problem, ValidationError, dtypes

FORMAT_VERSION = "3.7.0"  # written when the model does not say which version it came from


@dataclass
class _Node:
    """What a handler's inverse sees of an ONNX node: its attributes, its inputs' ranks."""

    kind: str
    values: dict
    ranks: list
    n_inputs: int
    problem: Callable
    constants: list  # each input's array when it is an initializer, else None
    n_outputs: int = 1  # outputs the node computes (named ones)


def _attrs_of(node: onnx.NodeProto, h, shapes: dict, constants: dict, blame) -> dict:
    ranks = [len(shapes[n]) if shapes.get(n) is not None else None for n in node.input]
    arrays = [constants.get(n) for n in node.input]
    values = h.from_onnx(_Node(h.kind, attribute_values(node), ranks, len(node.input), blame, arrays,
                               sum(1 for o in node.output if o)))
    return h.typed(values)


def dump(model: onnx.ModelProto, weights_as_inputs: bool = False, weights: dict | None = None) -> dict:
    """The model's main graph as a oneDNN graph JSON object (see the module doc).

    oneDNN's JSON holds no tensor data: an initializer an op takes is refused, unless
    `weights_as_inputs`, which makes each such initializer an input port of property_type
    constant (after the graph's inputs); pass a dict as `weights` to have it filled with their
    arrays, keyed by the names `load` gives those ports (as `import-onednn --inputs-dir`
    names files).  Initializers a handler reads as attributes (Reshape's shape, Quantize's
    scales) stay attributes."""
    from dyndq.checker import value_types

    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"dump() takes an onnx.ModelProto, not {type(model).__name__}")
    g = model.graph
    meta = {p.key: p.value for p in model.metadata_props}
    types = value_types(model)
    specs = {name: spec_of_type(tp) for name, tp in types.at("main").items()}  # dump writes the main graph
    shapes = {name: (s.shape if s else None) for name, s in specs.items()}
    notes = json.loads(meta.get("onednn.tensors", "{}"))
    problems: list[Problem] = []
    ids: dict[str, int] = {}

    def blame_node(i, node):
        return lambda arg, found, allowed: Problem(arg, found, allowed, op=node.op_type, node=node.name, node_index=i, graph=g.name)

    # ids kept from load, then fresh ones above them
    groups: dict[str, dict] = {}
    for node in g.node:
        props = {p.key: p.value for p in node.metadata_props}
        if "onednn.op" in props:
            entry = json.loads(props["onednn.op"])
            groups[props["onednn.id"]] = entry
            for name, tid in zip(entry.get("input_names", []) + entry.get("output_names", []),
                                 entry["inputs"] + entry["outputs"]):
                ids.setdefault(name, tid)
    counter = [max([*ids.values(), *(int(k) for k in notes)], default=-1) + 1]

    def tid(name: str) -> int:
        if name not in ids:
            ids[name] = counter[0]
            counter[0] += 1
        return ids[name]

    def tensor(name: str, blame) -> dict:
        spec = specs.get(name)
        if spec is None or spec.dtype is None:
            problems.append(blame(name, "a value of unknown type", "a tensor whose dtype ONNX can infer"))
            return {}
        row = dtypes.by_name(spec.dtype)
        if row.onednn is None:
            problems.append(blame(name, f"dtype {spec.dtype}", "a dtype oneDNN has: " +
                                  ", ".join(d.onednn for d in dtypes.DTYPES if d.onednn)))
        shape = [d if isinstance(d, int) else -1 for d in (spec.shape or [])]
        i = tid(name)
        prop, layout = notes.get(str(i), ["undef", "strided"])
        return {"id": i, "dtype": row.onednn, "shape": shape,
                "stride": dense_strides(shape) if all(d >= 0 for d in shape) else [-1] * len(shape),
                "layout_type": "strided" if layout in ("strided", "any", "undef") else layout, "property_type": prop}

    initializers = {t.name for t in g.initializer}
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer}
    weight_names: list[str] = []
    inverse = inverse_table()
    ops, written = [], set()
    next_op = [max([int(k) for k in groups] or [-1]) + 1]
    for index, node in enumerate(g.node):
        props = {p.key: p.value for p in node.metadata_props}
        blame = blame_node(index, node)
        if "onednn.id" in props and props["onednn.id"] in groups:
            key = props["onednn.id"]
            if key in written:
                continue
            written.add(key)
            e = groups[key]
            names = (e.get("input_names", []), e.get("output_names", []))
            ops.append({"id": e["id"], "name": e["name"], "kind": e["kind"], "attrs": e["attrs"],
                        "inputs": [tensor(n, blame) for n in names[0]], "outputs": [tensor(n, blame) for n in names[1]]})
            continue
        if node.domain not in ("", "ai.onnx", DOMAIN) or node.op_type not in inverse:
            problems.append(blame("op_type", f"{node.domain + '::' if node.domain else ''}{node.op_type}",
                                  "an op oneDNN has a kind for: " + ", ".join(sorted(inverse))))
            continue
        h = inverse[node.op_type]
        kind = h.kind
        data = [n for n in node.input[:h.onnx_inputs] if n]  # the rest: constants read as attributes
        for name in data:
            if name in initializers and not weights_as_inputs:
                problems.append(blame(name, "an initializer (data held in the model)",
                                      "a graph input: oneDNN's graph JSON holds no tensor data "
                                      "(or weights_as_inputs, --weights-as-inputs)"))
            elif name in initializers and name not in weight_names:
                weight_names.append(name)
                notes[str(tid(name))] = ["constant", "strided"]
        attrs = _attrs_of(node, h, shapes, constants, lambda *a, blame=blame: problems.append(blame(*a)))
        ops.append({"id": next_op[0], "name": node.name or f"{kind.lower()}_{next_op[0]}", "kind": kind,
                    "attrs": attrs, "inputs": [tensor(n, blame) for n in data],
                    "outputs": [tensor(n, blame) for n in node.output]})
        next_op[0] += 1
    graph_inputs = [vi.name for vi in g.input if vi.name not in initializers] + weight_names
    for name in graph_inputs + [vi.name for vi in g.output]:
        if name not in ids:
            problems.append(Problem(name, "a graph input or output no op uses", "values of the graph's ops", graph=g.name))
    if problems:
        raise ValidationError(problems)
    doc = {
        "version": meta.get("onednn.version") or FORMAT_VERSION,
        "engine_kind": meta.get("onednn.engine_kind", "cpu"),
        "fpmath_mode": meta.get("onednn.fpmath_mode", "strict"),
        "fpmath_mode_apply_to_int": meta.get("onednn.fpmath_mode_apply_to_int", "false"),
        "input_ports": [ids[n] for n in graph_inputs],
        "output_ports": [ids[vi.name] for vi in g.output],
        "graph": ops,
    }
    if weights is not None and weight_names:
        from dyndq.onednn.importer import value_names
        from dyndq.onednn.reader import read

        names = value_names(read(doc))
        weights.update({names[ids[n]]: constants[n] for n in weight_names})
    return doc


def save_json(doc: dict, path) -> None:
    """Write `doc` to `path` as JSON, atomically (dyndq.files.write_atomically: a staging file
    beside it, then a rename; only a regular file is replaced)."""
    from dyndq.files import write_atomically

    write_atomically(path, lambda f: f.write((json.dumps(doc, indent=2) + "\n").encode("utf-8")))
