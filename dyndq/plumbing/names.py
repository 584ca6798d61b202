"""Names: every name a model uses, and fresh readable ones for what a rewrite adds."""
from __future__ import annotations

import onnx

from .walk import graphs, walk


class NameScope:
    """Every name already in use in a model (values and nodes); hands out fresh readable ones."""

    def __init__(self, used: set[str] | None = None):
        self.used = set(used or ())

    def fresh(self, hint: str) -> str:
        name, i = hint, 1
        while name in self.used or not name:
            name = f"{hint}_{i}"
            i += 1
        self.used.add(name)
        return name


def op_name(node: onnx.NodeProto) -> str:
    """How a message names a node's op: its type alone in the default domain ("" or "ai.onnx"),
    else "domain::type" ("com.microsoft::MatMulNBits")."""
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"


def all_names(model: onnx.ModelProto) -> set[str]:
    """Every value and node name used anywhere in the model (graphs, bodies, functions)."""
    names = set()
    for g in graphs(model.graph):
        names.update(vi.name for vi in list(g.input) + list(g.output) + list(g.value_info))
        names.update(t.name for t in g.initializer)
        names.update(t.values.name for t in g.sparse_initializer)
    for site in walk(model):
        names.add(site.node.name)
        names.update(site.node.input)
        names.update(site.node.output)
    for f in model.functions:
        names.update(f.input)
        names.update(f.output)
    names.discard("")
    return names
