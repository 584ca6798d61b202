"""Applying the foreign converters' rewrites (converters/foreign.py) to a model, graph by graph.

`lift` and `export` both rewrite several nodes at once and the weights they read (a
MatMulNBits into DynamicDequantize + MatMul, and back).  Here the face builds each
converter's `GraphView` of a graph, asks the converter about each candidate node,
and applies what comes back: the replaced nodes leave, the new ones stand where the
last of them stood, an initializer that only the replaced nodes read is replaced in
place (keeping its position), and initializers nothing reads any more are dropped.
The main graph and every nested graph are rewritten; model-local functions are not
(they hold no initializers: their weights are not constants).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

import onnx

from dyndq.converters.foreign import GraphView, Rewrite
from dyndq.converters.lowering_context import NameScope
from dyndq.graphs import function_path, graphs, subgraph_path, subgraphs, with_nested


@dataclass(frozen=True)
class Outcome:
    """What a converter said of one node: its Rewrite, or why not (`reason`)."""

    graph: str
    node: onnx.NodeProto
    rewrite: Rewrite | None = None
    reason: str = ""

    @property
    def name(self) -> str:
        return self.node.name or self.node.output[0]


@dataclass
class _Graph:
    """One graph, indexed for the converters' questions."""

    graph: onnx.GraphProto
    path: str
    spec: Callable
    names: NameScope
    readers: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    makers: dict[str, onnx.NodeProto] = field(default_factory=dict)
    cache: dict = field(default_factory=dict)

    def __post_init__(self):
        for node in self.graph.node:
            for name in node.output:
                self.makers[name] = node
            for reader in with_nested(node):
                for name in dict.fromkeys(reader.input):
                    if name:
                        self.readers.setdefault(name, []).append(reader if reader is node else node)
        self.outputs = {o.name for o in self.graph.output}
        self.inputs = {i.name for i in self.graph.input}
        self.initializers = {t.name: t for t in self.graph.initializer}

    def constant(self, name: str):
        """The value of an initializer (not overridable as a graph input) or of a Constant node."""
        if name in self.cache:
            return self.cache[name]
        value = None
        if name in self.initializers and name not in self.inputs:
            value = onnx.numpy_helper.to_array(self.initializers[name])
        elif name in self.makers and self.makers[name].op_type == "Constant" and self.makers[name].domain in ("", "ai.onnx"):
            attrs = {a.name: a for a in self.makers[name].attribute}
            if "value" in attrs:
                value = onnx.numpy_helper.to_array(attrs["value"].t)
        self.cache[name] = value
        return value

    def view(self) -> GraphView:
        return GraphView(constant=self.constant, consumers=lambda n: self.readers.get(n, []),
                         is_output=lambda n: n in self.outputs, spec=self.spec, names=self.names,
                         producer=self.makers.get)


def graph_paths(model: onnx.ModelProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """(path, graph) for the main graph and every graph nested in it, at any depth (paths as the walker's)."""
    def nested(graph, path):
        yield path, graph
        for i, node in enumerate(graph.node):
            for label, g in subgraphs(node):
                yield from nested(g, subgraph_path(path, node, i, label))

    yield from nested(model.graph, "main")


def rewrite_model(model: onnx.ModelProto, convert: Callable[[onnx.NodeProto, GraphView], Rewrite | str | None],
                  types, names: NameScope, *, in_functions: Callable[[onnx.NodeProto], str | None] | None = None
                  ) -> list[Outcome]:
    """Ask `convert(node, view)` about every node of every graph (None: not a node it takes),
    apply the rewrites, and return what it said of each node it took.  `in_functions(node)` gives
    the reason a node inside a model-local function is left alone (None: not a candidate)."""
    outcomes: list[Outcome] = []
    for path, graph in list(graph_paths(model)):
        indexed = _Graph(graph, path, types.specs_at(path), names)
        view = indexed.view()
        done = []
        for node in list(graph.node):
            result = convert(node, view)
            indexed.cache.clear()  # (decoded weights are not kept from node to node: a big model's would add up)
            if result is None:
                continue
            if isinstance(result, Rewrite):
                done.append(result)
                outcomes.append(Outcome(path, node, rewrite=result))
            else:
                outcomes.append(Outcome(path, node, reason=str(result)))
        if done:
            _apply(graph, done)
    if in_functions is not None:
        for f in model.functions:
            for node in f.node:
                for inner in with_nested(node):
                    reason = in_functions(inner)
                    if reason is not None:
                        outcomes.append(Outcome(function_path(f), inner, reason=reason))
    if any(o.rewrite for o in outcomes):
        _drop_unread_initializers(model, {name for o in outcomes if o.rewrite for n in o.rewrite.replaces for name in n.input})
    return outcomes


def _apply(graph: onnx.GraphProto, rewrites: list[Rewrite]) -> None:
    position = {id(n): i for i, n in enumerate(graph.node)}
    gone, placed = set(), {}
    for rw in rewrites:
        where = [position[id(n)] for n in rw.replaces]
        gone.update(where)
        placed.setdefault(max(where), []).extend(rw.nodes)  # after every input the replaced nodes read
    nodes = []
    for i, node in enumerate(graph.node):
        if i in placed:
            nodes.extend(placed[i])
        elif i not in gone:
            nodes.append(node)
    nodes = [_copy(n) for n in nodes]
    del graph.node[:]
    graph.node.extend(nodes)
    existing = {t.name: t for t in graph.initializer}
    replaced = set()
    for rw in rewrites:
        for t in rw.initializers:
            if t.name in existing:  # read only by the replaced nodes: the new tensor takes its place
                existing[t.name].CopyFrom(t)
                replaced.add(t.name)
            else:
                graph.initializer.append(t)
                existing[t.name] = graph.initializer[-1]
    stale = replaced | {o for rw in rewrites for n in rw.replaces for o in n.output} - {o for n in graph.node for o in n.output}
    for vi in [vi for vi in graph.value_info if vi.name in stale]:
        graph.value_info.remove(vi)


def _copy(node: onnx.NodeProto) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    return out


def _drop_unread_initializers(model: onnx.ModelProto, candidates: set[str]) -> None:
    """Remove the initializers among `candidates` that no node, graph output or function reads any more."""
    read = set()
    for g in graphs(model.graph):
        read.update(o.name for o in g.output)
        for node in g.node:
            read.update(node.input)
    for g in graphs(model.graph):
        for t in [t for t in g.initializer if t.name in candidates and t.name not in read]:
            g.initializer.remove(t)
        for vi in [vi for vi in g.input if vi.name in candidates and vi.name not in read]:
            g.input.remove(vi)


def uses_domain(model: onnx.ModelProto, domain: str) -> bool:
    """Whether any node of the model (any graph, any function) is of `domain`."""
    return any(n.domain == domain for g in graphs(model.graph) for n in g.node) or any(
        n.domain == domain for f in model.functions for node in f.node for n in with_nested(node))
