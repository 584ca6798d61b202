"""Walking a model: every node of the main graph, of every If/Loop/Scan body at any
depth, and of every model-local function, with a readable path to its graph.

One walker serves check, export, lift and the CLI, so that they agree on what
"every node" means and on how a place in the model is named in messages:
"main", "main/branch.then_branch", "function local::Deq".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import onnx
from onnx import AttributeProto


@dataclass(frozen=True)
class Site:
    """Where a node stands: its graph (a readable path), its index there, the opset imports
    in force, and whether it is inside a model-local function (where values have no types)."""

    graph: str
    index: int
    node: onnx.NodeProto
    opsets: dict[str, int]
    in_function: bool = False


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


def walk(model: onnx.ModelProto) -> Iterator[Site]:
    """Every node of the model: main graph and nested graphs (depth first, each node before
    its bodies), then each function. The protos are the model's own: editing them edits it."""
    opsets = {o.domain: o.version for o in model.opset_import}
    yield from _walk_nodes(model.graph.node, "main", opsets, False)
    for f in model.functions:
        f_opsets = {o.domain: o.version for o in f.opset_import}
        yield from _walk_nodes(f.node, f"function {f.domain}::{f.name}", f_opsets, True)


def _walk_nodes(nodes, path: str, opsets, in_function: bool) -> Iterator[Site]:
    for i, node in enumerate(nodes):
        yield Site(path, i, node, opsets, in_function)
        for label, g in subgraphs(node):
            yield from _walk_nodes(g.node, subgraph_path(path, node, i, label), opsets, in_function)
