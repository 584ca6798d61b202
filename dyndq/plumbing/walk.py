"""Walking a model: every node of the main graph, of every If/Loop/Scan body at any
depth, and of every model-local function, with a readable path to its graph.

One walker serves check, export, lift and the CLI, so that they agree on what
"every node" means and on how a place in the model is named in messages:
"main", "main/branch.then_branch", "function local::Deq".  A node of ours is resolved
(`op_version`) by the opset imports of the scope it stands in: the model's for the main
graph and its bodies, a function's own for its nodes, as ONNX resolves them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import onnx
from onnx import AttributeProto

from dyndq.opdefs import OpVersion

from .opsets import op_version, scope_opsets


@dataclass(frozen=True)
class Site:
    """Where a node stands: its graph (a readable path), its index there, the opset imports
    in force, and whether it is inside a model-local function (where values have no types)."""

    graph: str
    index: int
    node: onnx.NodeProto
    opsets: dict[str, int]
    in_function: bool = False
    scope: str = "main"  # the top graph it stands in: "main", or the function's path "function dom::Name"

    @property
    def op(self) -> OpVersion | None:
        """The op version of ours the node resolves to where it stands (None: not ours, or its
        scope imports no version at which its op exists)."""
        return op_version(self.node, self.opsets)






def subgraphs(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.GraphProto]]:
    """(attribute label, graph) for each graph attribute of a node: If's branches, Loop's and Scan's bodies."""
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.name, attr.g
        elif attr.type == AttributeProto.GRAPHS:
            for j, g in enumerate(attr.graphs):
                yield f"{attr.name}[{j}]", g


def subgraph_path(path: str, node: onnx.NodeProto, index: int, label: str) -> str:
    """The path of a graph nested in the node at `index` of the graph at `path`."""
    return f"{path}/{node.name or f'{node.op_type}#{index}'}.{label}"


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every graph nested in it, depth first."""
    yield graph
    for node in graph.node:
        for _, g in subgraphs(node):
            yield from graphs(g)


def with_nested(node: onnx.NodeProto) -> list[onnx.NodeProto]:
    """The node, then every node of every graph nested in it (If/Loop/Scan bodies), at any depth."""
    return [node] + [n for _, g in subgraphs(node) for sub in graphs(g) for n in sub.node]


def walk(model: onnx.ModelProto) -> Iterator[Site]:
    """Every node of the model: main graph and nested graphs (depth first, each node before
    its bodies), then each function. The protos are the model's own: editing them edits it."""
    yield from _walk_nodes(model.graph.node, "main", scope_opsets(model.opset_import), False, "main")
    for f in model.functions:
        yield from function_sites(f)


def function_sites(f: onnx.FunctionProto, path: str | None = None) -> Iterator[Site]:
    """Every node of a model-local function (its bodies included), with the function's own
    opset imports; `path` names the function in messages (its `function_path` by default)."""
    path = path or function_path(f)
    yield from _walk_nodes(f.node, path, scope_opsets(f.opset_import), True, function_path(f))


def function_path(f: onnx.FunctionProto) -> str:
    """How messages and reports name a model-local function: "function dom::Name"."""
    return f"function {f.domain}::{f.name}"


def _walk_nodes(nodes, path: str, opsets, in_function: bool, scope: str) -> Iterator[Site]:
    for i, node in enumerate(nodes):
        yield Site(path, i, node, opsets, in_function, scope)
        for label, g in subgraphs(node):
            yield from _walk_nodes(g.node, subgraph_path(path, node, i, label), opsets, in_function, scope)







@dataclass(eq=False)
class Scope:
    """One list of nodes a rewrite edits: the main graph, a model-local function, or a graph
    nested in either (an If branch, a Loop or Scan body), with what names resolve against it.

    `nodes` is the proto's own repeated field (editing it edits the model); `graph` the graph
    (None for a function's own nodes); `parent` the scope enclosing it (None for the main graph
    and a function); `imports` the opset imports in force (the model's, or the function's)."""

    path: str
    nodes: Any
    graph: onnx.GraphProto | None
    imports: Any
    parent: "Scope | None" = None
    function: onnx.FunctionProto | None = None
    _defines: set | None = field(default=None, repr=False)
    _constants: dict | None = field(default=None, repr=False)
    _nodes_made: set | None = field(default=None, repr=False)
    _makers: dict | None = field(default=None, repr=False)

    @property
    def in_function(self) -> bool:
        return self.function is not None

    @property
    def top(self) -> "Scope":
        return self if self.parent is None else self.parent.top

    @property
    def outputs(self) -> list[str]:
        if self.graph is not None:
            return [o.name for o in self.graph.output]
        return list(self.function.output)

    def defines(self) -> set[str]:
        """The names this scope gives a value: its inputs, initializers and node outputs
        (a nested scope's own are not among them).  Cached until `changed()`."""
        if self._defines is None:
            names = {o for node in self.nodes for o in node.output}
            if self.graph is not None:
                names.update(vi.name for vi in self.graph.input)
                names.update(t.name for t in self.graph.initializer)
            else:
                names.update(self.function.input)
            names.discard("")
            self._defines = names
        return self._defines

    def constant(self, name: str) -> onnx.TensorProto | None:
        """The tensor of one of this scope's constants: an initializer that is not also a graph
        input, or the `value` of a Constant node (None for any other name).  Cached until `changed()`."""
        if self._constants is None:
            found = {}
            for node in self.nodes:
                if is_constant_node(node) and node.attribute[0].name == "value":
                    found[node.output[0]] = node.attribute[0].t
            self._nodes_made = set(found)
            if self.graph is not None:
                fed = {vi.name for vi in self.graph.input}
                found.update((t.name, t) for t in self.graph.initializer if t.name not in fed)
            self._constants = found
        return self._constants.get(name)

    def resolve(self, name: str) -> "Scope | None":
        """The scope whose value `name` is, as ONNX resolves it from here: this one, or the
        nearest enclosing scope that defines it (None: defined nowhere around)."""
        scope = self
        while scope is not None:
            if name in scope.defines():
                return scope
            scope = scope.parent
        return None

    def fed(self, name: str) -> bool:
        """Whether `name` is an input of this scope (a graph input, initializer or not, or a function input)."""
        if self.graph is not None:
            return any(vi.name == name for vi in self.graph.input)
        return name in self.function.input

    def constant_node(self, name: str) -> bool:
        """Whether `name` is the output of a Constant node of this scope (not an initializer)."""
        self.constant(name)
        return name in self._nodes_made

    def maker(self, name: str) -> tuple[int, onnx.NodeProto] | None:
        """(index, node) of the node of this scope whose output `name` is.  Cached until `changed()`."""
        if self._makers is None:
            self._makers = {out: (i, node) for i, node in enumerate(self.nodes) for out in node.output if out}
        return self._makers.get(name)

    def changed(self) -> None:
        self._defines = self._constants = self._nodes_made = self._makers = None


def scopes(model: onnx.ModelProto) -> list[Scope]:
    """Every scope of the model in pre-order: the main graph, the graphs nested in it (each
    right after the graph holding it), then each model-local function and its nested graphs.
    Reversed, every body comes before the graph that holds it."""
    main = Scope("main", model.graph.node, model.graph, model.opset_import)
    out = [main] + scopes_under(main)
    for f in model.functions:
        top = Scope(function_path(f), f.node, None, f.opset_import, function=f)
        out += [top] + scopes_under(top)
    return out


def scopes_under(scope: Scope) -> list[Scope]:
    """The scopes nested in `scope`, at any depth, in pre-order."""
    out = []
    for i, node in enumerate(scope.nodes):
        for label, g in subgraphs(node):
            inner = Scope(subgraph_path(scope.path, node, i, label), g.node, g, scope.imports, scope, scope.function)
            out += [inner] + scopes_under(inner)
    return out


def is_constant_node(node: onnx.NodeProto) -> bool:
    """A Constant node of ai.onnx with its one output and its one value attribute."""
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1 \
        and len(node.attribute) == 1


def constant_value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor a Constant node holds in `value`, `value_float(s)` or `value_int(s)` (None for
    the sparse and string forms, which hold no weight)."""
    if not node.attribute:
        return None
    attr = node.attribute[0]
    name = node.output[0]
    if attr.name == "value":
        return attr.t
    if attr.name in ("value_float", "value_int"):
        kind = onnx.TensorProto.FLOAT if attr.name == "value_float" else onnx.TensorProto.INT64
        return onnx.helper.make_tensor(name, kind, [], [attr.f if attr.name == "value_float" else attr.i])
    if attr.name in ("value_floats", "value_ints"):
        kind = onnx.TensorProto.FLOAT if attr.name == "value_floats" else onnx.TensorProto.INT64
        values = list(attr.floats if attr.name == "value_floats" else attr.ints)
        return onnx.helper.make_tensor(name, kind, [len(values)], values)
    return None
