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
import math
import os
import re
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx

from dyndq.plumbing.types import attribute_values, spec_of_type
from dyndq.onednn.int4 import dense_strides
from dyndq.onednn.kinds import inverse_table
from dyndq.onednn.metadata import op_entry, tensor_hints
from dyndq.opdefs import DOMAIN, Problem, ValidationError, dtypes

FORMAT_VERSION = "3.7.0"  # written when the model does not say which version it came from
_WRITTEN_BY_LOAD = "what dyndq.onednn.load writes there (or no onednn.* metadata: the node is then written by its kind's inverse)"


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
    dtypes: list = field(default_factory=list)  # each input's dtype name (None: not known)


def _attrs_of(node: onnx.NodeProto, h, specs: dict, constants: dict, blame) -> dict:
    ranks = [len(specs[n].shape) if specs.get(n) is not None and specs[n].shape is not None else None
             for n in node.input]
    arrays = [constants.get(n) for n in node.input]
    kinds = [specs[n].dtype if specs.get(n) is not None else None for n in node.input]
    values = h.from_onnx(_Node(h.kind, attribute_values(node), ranks, len(node.input), blame, arrays,
                               sum(1 for o in node.output if o), kinds))
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
    problems: list[Problem] = []
    try:
        notes = tensor_hints(meta.get("onednn.tensors", "{}"))
    except ValueError as e:
        problems.append(Problem("metadata onednn.tensors", str(e), _WRITTEN_BY_LOAD, graph=g.name))
        notes = {}
    ids: dict[str, int] = {}

    def blame_node(i, node):
        return lambda arg, found, allowed: Problem(arg, found, allowed, op=node.op_type, node=node.name, node_index=i, graph=g.name)

    # ids kept from load, then fresh ones above them
    groups: dict[str, dict] = {}
    broken: set[str] = set()  # the onednn.id of ops whose metadata is named as a problem
    for index, node in enumerate(g.node):
        props = {p.key: p.value for p in node.metadata_props}
        if "onednn.op" in props:
            try:
                entry = op_entry(props["onednn.op"])
                if props.get("onednn.id") != str(entry["id"]):
                    raise ValueError(f"onednn.id {props.get('onednn.id')!r} beside an op of id {entry['id']}")
            except ValueError as e:
                problems.append(blame_node(index, node)("metadata onednn.op", str(e), _WRITTEN_BY_LOAD))
                broken.add(props.get("onednn.id", ""))
                continue
            groups[props["onednn.id"]] = entry
            for name, tid in zip(entry["input_names"] + entry["output_names"], entry["inputs"] + entry["outputs"]):
                ids.setdefault(name, tid)
    counter = [max([*ids.values(), *(int(k) for k in notes)], default=-1) + 1]

    def tid(name: str) -> int:
        if name not in ids:
            ids[name] = counter[0]
            counter[0] += 1
        return ids[name]

    def tensor(name: str, blame, described=None) -> dict:
        """The tensor `name` as a oneDNN logical tensor; `described`: [shape, stride, layout type,
        property type] as the loaded op described it (kept where the shape is still that one)."""
        spec = specs.get(name)
        if spec is None or spec.dtype is None:
            problems.append(blame(name, "a value of unknown type", "a tensor whose dtype ONNX can infer"))
            return {}
        if spec.shape is None:  # (a rank written as none would be a rank-0 shape: every check after it untrue)
            unranked[0] = True
            if name not in unranked_said:
                unranked_said.add(name)
                problems.append(blame(name, "a value of unknown rank (ONNX's shape inference cannot find it)",
                                      "a tensor of known rank: oneDNN's graph JSON writes each tensor's dims"))
        row = dtypes.by_name(spec.dtype)
        if row.onednn is None:
            problems.append(blame(name, f"dtype {spec.dtype}", "a dtype oneDNN has: " +
                                  ", ".join(d.onednn for d in dtypes.DTYPES if d.onednn)))
        shape = [d if isinstance(d, int) else -1 for d in (spec.shape or [])]
        i = tid(name)
        prop, layout = notes.get(str(i), ["undef", "strided"])
        if described and _same_tensor(described[0], shape):  # as the op was loaded: its view, strides, layout
            shape, stride, layout, prop = described
        else:
            stride = dense_strides(shape) if all(d >= 0 for d in shape) else [-1] * len(shape)
            layout = "strided" if layout in ("strided", "any", "undef") else layout
        return {"id": i, "dtype": row.onednn, "shape": shape, "stride": stride, "layout_type": layout,
                "property_type": prop}

    initializers = {t.name for t in g.initializer}
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer}
    weight_names: list[str] = []
    positions: dict[int, int] = {}  # op id -> its place in the file it was loaded from
    inverse = inverse_table()
    ops, written = [], set()
    origin: dict[int, Callable] = {}  # op id -> the blame of the ONNX node it was written from
    refused: set[str] = set()  # the values of nodes no kind writes (named once, by their node)
    next_op = [max([int(k) for k in groups] or [-1]) + 1]
    named = written_ops = 0
    troubled: set[int] = set()  # ops with problems named already (their tensors may be missing)
    unranked_said: set[str] = set()  # values of unknown rank, each named once (at the first op reading or making it)
    unranked = [False]  # whether the last node's op reads or makes one (its checks after would judge a made-up rank)
    for index, node in enumerate(g.node):
        if len(ops) > written_ops and (len(problems) > named or unranked[0]):  # the last node's op, and problems with it
            troubled.add(ops[-1]["id"])
        named, written_ops, unranked[0] = len(problems), len(ops), False
        props = {p.key: p.value for p in node.metadata_props}
        blame = blame_node(index, node)
        if props.get("onednn.id") in broken:  # (named above)
            refused.update(list(node.input) + list(node.output))
            continue
        if "onednn.id" in props and props["onednn.id"] in groups:
            key = props["onednn.id"]
            if key in written:
                continue
            written.add(key)
            e = groups[key]
            names = (e.get("input_names", []), e.get("output_names", []))
            described = e.get("layouts") or [None] * (len(names[0]) + len(names[1]))
            origin[e["id"]] = blame
            ops.append({"id": e["id"], "name": e["name"], "kind": e["kind"], "attrs": e["attrs"],
                        "inputs": [tensor(n, blame, d) for n, d in zip(names[0], described)],
                        "outputs": [tensor(n, blame, d) for n, d in zip(names[1], described[len(names[0]):])]})
            if "position" in e:
                positions[e["id"]] = e["position"]
            continue
        if node.domain not in ("", "ai.onnx", DOMAIN) or node.op_type not in inverse:
            problems.append(blame("op_type", f"{node.domain + '::' if node.domain else ''}{node.op_type}",
                                  "an op oneDNN has a kind for: " + ", ".join(sorted(inverse))))
            refused.update(list(node.input) + list(node.output))
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
        attrs = _attrs_of(node, h, specs, constants, lambda *a, blame=blame: problems.append(blame(*a)))
        origin[next_op[0]] = blame
        ops.append({"id": next_op[0], "name": node.name or f"{kind.lower()}_{next_op[0]}", "kind": kind,
                    "attrs": attrs, "inputs": [tensor(n, blame) for n in data],
                    "outputs": [tensor(n, blame) for n in node.output]})
        next_op[0] += 1
    graph_inputs = [vi.name for vi in g.input if vi.name not in initializers] + weight_names
    if len(ops) > written_ops and (len(problems) > named or unranked[0]):
        troubled.add(ops[-1]["id"])
    for name in graph_inputs + [vi.name for vi in g.output]:
        if name not in ids and name not in refused:
            problems.append(Problem(name, "a graph input or output no op uses", "values of the graph's ops", graph=g.name))
    if len(positions) == len(ops):  # every op came from a loaded file: in the file's order
        ops.sort(key=lambda op: positions[op["id"]])
    doc = {
        "version": meta.get("onednn.version") or FORMAT_VERSION,
        "engine_kind": meta.get("onednn.engine_kind", "cpu"),
        "fpmath_mode": meta.get("onednn.fpmath_mode", "strict"),
        "fpmath_mode_apply_to_int": meta.get("onednn.fpmath_mode_apply_to_int", "false"),
        "input_ports": [ids[n] for n in graph_inputs if n in ids],
        "output_ports": [ids[vi.name] for vi in g.output if vi.name in ids],
        "graph": ops,
    }
    graph, later = _imported(doc, origin, troubled, g.name)
    problems += [p for p in later if not problems or p.node_index is not None]  # (with others: the ops' own)
    if problems:
        raise ValidationError(problems)
    if weights is not None and weight_names:
        from dyndq.onednn.importer import value_names

        names = value_names(graph)
        weights.update({names[ids[n]]: constants[n] for n in weight_names})
    return doc


def _same_tensor(described: list, shape: list) -> bool:
    """Whether a loaded op's description of a tensor still fits it: the shape it has, or another
    view of as many elements (oneDNN lets a consumer take a [256, 1] dst as [256])."""
    if described == shape:
        return True
    known = all(d >= 0 for d in described + shape)
    return known and math.prod(described) == math.prod(shape)


def _imported(doc: dict, origin: dict, troubled: set, graph_name: str):
    """(the graph `doc` holds, read back as `load` reads it, or None; the problems `load` finds in
    it): what one direction writes the other reads.  An op `load` would refuse (a dtype oneDNN's
    kind does not take: f64 ReLU, u8 Add) is refused on export, each problem told at the ONNX
    node the op was written from; ops whose problems were named already are left out."""
    from dyndq.onednn.importer import build
    from dyndq.onednn.reader import read

    try:
        graph = read(doc)
        build(graph)
    except ValidationError as e:
        return None, [_as_written(p, origin, graph_name) for p in e.problems if p.op_id not in troubled]
    return graph, []


def _as_written(p: Problem, origin: dict, graph_name: str) -> Problem:
    """A problem of the written JSON as the export's: at the ONNX node its op came from."""
    allowed = f"{p.allowed} (what oneDNN's {p.op} takes; written as it is, the graph would not import)"
    if p.op_id in origin:
        return origin[p.op_id](p.argument, p.found, allowed)
    return Problem(p.argument, p.found, allowed if p.op else p.allowed, graph=graph_name)


def weights_folder(path) -> str:
    """Where the arrays of a graph written to `path` go: its name without .json, + "-weights"."""
    return re.sub(r"\.json$", "", os.fspath(path)) + "-weights"


def save_json(doc: dict, path, weights: dict | None = None, check=None) -> dict:
    """Write `doc` to `path` as JSON and, when `weights` holds arrays ({port name: array}, as
    `dump(weights_as_inputs=True, weights=...)` fills it), each as NAME.npy into
    `weights_folder(path)`: all or nothing (dyndq.atomic_writes.write_together: staging files beside
    them, then renames; a failure at any step leaves the JSON and the folder as they were).
    Returns {path of each .npy written: its array}.  `check(staged JSON, staged weights folder or
    None)`, when given, is called before anything is put in place (dyndq.written.verify_onednn_json)."""
    from dyndq.atomic_writes import write_atomically, write_together

    text = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
    if not weights:
        write_atomically(path, lambda f: f.write(text), check=None if check is None else lambda staged: check(staged, None))
        return {}
    files = {f"{name}.npy": (lambda f, a=array: np.save(f, np.asarray(a), allow_pickle=False))
             for name, array in weights.items()}
    written = write_together(path, lambda f: f.write(text), weights_folder(path), files, check=check)
    return dict(zip(written, weights.values()))
