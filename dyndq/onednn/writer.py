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
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"dump() takes an onnx.ModelProto, not {type(model).__name__}")
    out = _Dump(model, weights_as_inputs)
    for index, node in enumerate(model.graph.node):
        out.node(index, node)
    doc = out.document()
    graph, later = _imported(doc, out.origin, out.troubled, model.graph.name)
    # (with other problems: the ops' own only)
    problems = out.problems + [p for p in later if not out.problems or p.node_index is not None]
    if problems:
        raise ValidationError(problems)
    if weights is not None and out.weight_names:
        from dyndq.onednn.importer import value_names

        names = value_names(graph)
        weights.update({names[out.ids[n]]: out.constants[n] for n in out.weight_names})
    return doc


class _Dump:
    """One model being written as a oneDNN graph: the ops written so far, the tensor ids given,
    the problems found (every one named, then raised at once by `dump`)."""

    def __init__(self, model: onnx.ModelProto, weights_as_inputs: bool):
        from dyndq.checker import value_types

        self.g, self.weights_as_inputs = model.graph, weights_as_inputs
        self.meta = {p.key: p.value for p in model.metadata_props}
        types = value_types(model)
        self.specs = {name: spec_of_type(tp) for name, tp in types.at("main").items()}  # dump writes the main graph
        self.problems: list[Problem] = []
        try:
            self.notes = tensor_hints(self.meta.get("onednn.tensors", "{}"))
        except ValueError as e:
            self.problems.append(Problem("metadata onednn.tensors", str(e), _WRITTEN_BY_LOAD, graph=self.g.name))
            self.notes = {}
        self.ids: dict[str, int] = {}
        self.groups: dict[str, dict] = {}  # onednn.id -> the op load wrote that group of nodes from
        self.broken: set[str] = set()  # the onednn.id of ops whose metadata is named as a problem
        self._read_loaded_ops()
        # ids kept from load, then fresh ones above them
        self.next_id = max([*self.ids.values(), *(int(k) for k in self.notes)], default=-1) + 1
        self.next_op = max([int(k) for k in self.groups] or [-1]) + 1
        self.initializers = {t.name for t in self.g.initializer}
        self.constants = {t.name: onnx.numpy_helper.to_array(t) for t in self.g.initializer}
        self.weight_names: list[str] = []
        self.positions: dict[int, int] = {}  # op id -> its place in the file it was loaded from
        self.inverse = inverse_table()
        self.ops, self.written = [], set()
        self.origin: dict[int, Callable] = {}  # op id -> the blame of the ONNX node it was written from
        self.refused: set[str] = set()  # the values of nodes no kind writes (named once, by their node)
        self.named = self.written_ops = 0
        self.troubled: set[int] = set()  # ops with problems named already (their tensors may be missing)
        # values of unknown rank, each named once (at the first op reading or making it); whether the last
        # node's op reads or makes one (its checks after would judge a made-up rank)
        self.unranked_said: set[str] = set()
        self.unranked = False

    def _blame(self, i: int, node: onnx.NodeProto):
        return lambda arg, found, allowed: Problem(arg, found, allowed, op=node.op_type, node=node.name, node_index=i,
                                                   graph=self.g.name)

    def _read_loaded_ops(self) -> None:
        """The ops `load` wrote the nodes from (their `onednn.op` metadata), and the ids of their tensors."""
        for index, node in enumerate(self.g.node):
            props = {p.key: p.value for p in node.metadata_props}
            if "onednn.op" not in props:
                continue
            try:
                entry = op_entry(props["onednn.op"])
                if props.get("onednn.id") != str(entry["id"]):
                    raise ValueError(f"onednn.id {props.get('onednn.id')!r} beside an op of id {entry['id']}")
            except ValueError as e:
                self.problems.append(self._blame(index, node)("metadata onednn.op", str(e), _WRITTEN_BY_LOAD))
                self.broken.add(props.get("onednn.id", ""))
                continue
            self.groups[props["onednn.id"]] = entry
            for name, tid in zip(entry["input_names"] + entry["output_names"], entry["inputs"] + entry["outputs"]):
                self.ids.setdefault(name, tid)

    def _tid(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = self.next_id
            self.next_id += 1
        return self.ids[name]

    def _tensor(self, name: str, blame, described=None) -> dict:
        """The tensor `name` as a oneDNN logical tensor; `described`: [shape, stride, layout type,
        property type] as the loaded op described it (kept where the shape is still that one)."""
        spec = self.specs.get(name)
        if spec is None or spec.dtype is None:
            self.problems.append(blame(name, "a value of unknown type", "a tensor whose dtype ONNX can infer"))
            return {}
        if spec.shape is None:  # (a rank written as none would be a rank-0 shape: every check after it untrue)
            self.unranked = True
            if name not in self.unranked_said:
                self.unranked_said.add(name)
                self.problems.append(blame(name, "a value of unknown rank (ONNX's shape inference cannot find it)",
                                           "a tensor of known rank: oneDNN's graph JSON writes each tensor's dims"))
        row = dtypes.by_name(spec.dtype)
        if row.onednn is None:
            self.problems.append(blame(name, f"dtype {spec.dtype}", "a dtype oneDNN has: " +
                                       ", ".join(d.onednn for d in dtypes.DTYPES if d.onednn)))
        shape = [d if isinstance(d, int) else -1 for d in (spec.shape or [])]
        i = self._tid(name)
        prop, layout = self.notes.get(str(i), ["undef", "strided"])
        if described and _same_tensor(described[0], shape):  # as the op was loaded: its view, strides, layout
            shape, stride, layout, prop = described
        else:
            stride = dense_strides(shape) if all(d >= 0 for d in shape) else [-1] * len(shape)
            layout = "strided" if layout in ("strided", "any", "undef") else layout
        return {"id": i, "dtype": row.onednn, "shape": shape, "stride": stride, "layout_type": layout,
                "property_type": prop}

    def _close_op(self) -> None:
        """Mark the last node's op troubled when problems were named with it (its tensors may be missing)."""
        if len(self.ops) > self.written_ops and (len(self.problems) > self.named or self.unranked):
            self.troubled.add(self.ops[-1]["id"])
        self.named, self.written_ops, self.unranked = len(self.problems), len(self.ops), False

    def node(self, index: int, node: onnx.NodeProto) -> None:
        """Write the op of one node: as loaded (its group's first node), else by its kind's inverse."""
        self._close_op()
        props = {p.key: p.value for p in node.metadata_props}
        blame = self._blame(index, node)
        if props.get("onednn.id") in self.broken:  # (named above)
            self.refused.update(list(node.input) + list(node.output))
        elif "onednn.id" in props and props["onednn.id"] in self.groups:
            self._as_loaded(props["onednn.id"], blame)
        else:
            self._by_inverse(node, blame)

    def _as_loaded(self, key: str, blame) -> None:
        """The op `load` wrote a group of nodes from, as it was (once, at the group's first node)."""
        if key in self.written:
            return
        self.written.add(key)
        e = self.groups[key]
        names = (e.get("input_names", []), e.get("output_names", []))
        described = e.get("layouts") or [None] * (len(names[0]) + len(names[1]))
        self.origin[e["id"]] = blame
        self.ops.append({"id": e["id"], "name": e["name"], "kind": e["kind"], "attrs": e["attrs"],
                         "inputs": [self._tensor(n, blame, d) for n, d in zip(names[0], described)],
                         "outputs": [self._tensor(n, blame, d) for n, d in zip(names[1], described[len(names[0]):])]})
        if "position" in e:
            self.positions[e["id"]] = e["position"]

    def _by_inverse(self, node: onnx.NodeProto, blame) -> None:
        """A node written by the inverse of the kind its op type maps to, one op for it."""
        if node.domain not in ("", "ai.onnx", DOMAIN) or node.op_type not in self.inverse:
            self.problems.append(blame("op_type", f"{node.domain + '::' if node.domain else ''}{node.op_type}",
                                       "an op oneDNN has a kind for: " + ", ".join(sorted(self.inverse))))
            self.refused.update(list(node.input) + list(node.output))
            return
        h = self.inverse[node.op_type]
        kind = h.kind
        data = [n for n in node.input[:h.onnx_inputs] if n]  # the rest: constants read as attributes
        for name in data:
            if name in self.initializers and not self.weights_as_inputs:
                self.problems.append(blame(name, "an initializer (data held in the model)",
                                           "a graph input: oneDNN's graph JSON holds no tensor data "
                                           "(or weights_as_inputs, --weights-as-inputs)"))
            elif name in self.initializers and name not in self.weight_names:
                self.weight_names.append(name)
                self.notes[str(self._tid(name))] = ["constant", "strided"]
        attrs = _attrs_of(node, h, self.specs, self.constants, lambda *a, blame=blame: self.problems.append(blame(*a)))
        op = self.next_op
        self.origin[op] = blame
        self.ops.append({"id": op, "name": node.name or f"{kind.lower()}_{op}", "kind": kind,
                         "attrs": attrs, "inputs": [self._tensor(n, blame) for n in data],
                         "outputs": [self._tensor(n, blame) for n in node.output]})
        self.next_op += 1

    def document(self) -> dict:
        """The graph JSON of the ops written, its ports; a graph input or output no op uses is named."""
        g = self.g
        graph_inputs = [vi.name for vi in g.input if vi.name not in self.initializers] + self.weight_names
        self._close_op()
        for name in graph_inputs + [vi.name for vi in g.output]:
            if name not in self.ids and name not in self.refused:
                self.problems.append(Problem(name, "a graph input or output no op uses", "values of the graph's ops",
                                             graph=g.name))
        if len(self.positions) == len(self.ops):  # every op came from a loaded file: in the file's order
            self.ops.sort(key=lambda op: self.positions[op["id"]])
        meta = self.meta
        return {
            "version": meta.get("onednn.version") or FORMAT_VERSION,
            "engine_kind": meta.get("onednn.engine_kind", "cpu"),
            "fpmath_mode": meta.get("onednn.fpmath_mode", "strict"),
            "fpmath_mode_apply_to_int": meta.get("onednn.fpmath_mode_apply_to_int", "false"),
            "input_ports": [self.ids[n] for n in graph_inputs if n in self.ids],
            "output_ports": [self.ids[vi.name] for vi in g.output if vi.name in self.ids],
            "graph": self.ops,
        }


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
