"""The type of every value of a model, per graph scope, as ONNX resolves names.

A graph sees its own values and those of every graph enclosing it (ONNX's
lexical scoping: a body reads outer values by name), but sibling graphs, such
as If's two branches or two Loop bodies, are separate scopes and may each use
a name with a type of their own.  One flat table for the whole model would give
one of them the other's type.  Scopes are keyed by the walker's graph paths
("main", "main/if.then_branch", ...), so check, export and lift look a value up
exactly where their node stands.  Model-local functions have no types.
"""
from __future__ import annotations

from collections import ChainMap
from typing import Callable, Mapping

import onnx

from dyndq.plumbing.types import spec_of_type, untyped_tensor
from dyndq.plumbing.walk import subgraph_path, subgraphs
from dyndq.opdefs import TensorSpec
from dyndq.plumbing.light import light_view
from dyndq.schema import lenient_inference

_NO_TYPES: Mapping[str, onnx.TypeProto] = {}


class ValueTypes:
    """`at(graph_path)`: name -> TypeProto for the values a node in that graph sees."""

    def __init__(self, scopes: dict[str, ChainMap]):
        self._scopes = scopes

    def at(self, graph: str) -> Mapping[str, onnx.TypeProto]:
        return self._scopes.get(graph, _NO_TYPES)

    def get(self, name: str, default=None):
        """A value of the main graph (the scope most callers mean)."""
        return self.at("main").get(name, default)

    def specs_at(self, graph: str) -> Callable[[str], TensorSpec | None]:
        """name -> the TensorSpec of a value as a node in that graph sees it; None when its
        type is not known (always, inside a model-local function)."""
        scope = self.at(graph)
        return lambda name: spec_of_type(scope.get(name))


def value_types(model: onnx.ModelProto) -> ValueTypes:
    """The type of every value ONNX can infer, scope by scope."""
    scopes: dict[str, ChainMap] = {}
    _collect(inferred_model(model).graph, "main", ChainMap(), scopes)
    return ValueTypes(scopes)


def inferred_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model's light view with every type ONNX can infer written in (value_info, and the
    outputs of If/Loop/Scan bodies), our ops judged leniently; the view as it is when ONNX
    cannot infer the model at all."""
    model = light_view(model)  # (a model over 2 GiB cannot be serialized for ONNX's inference)
    try:
        with lenient_inference():
            return onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # a model ONNX cannot even infer: judge what it declares
        return model


def _collect(graph: onnx.GraphProto, path: str, outer: ChainMap, scopes: dict) -> None:
    own: dict[str, onnx.TypeProto] = {}
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if vi.HasField("type") and not untyped_tensor(vi.type):
            own.setdefault(vi.name, vi.type)
    for init in graph.initializer:
        own[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
    scope = outer.new_child(own)  # own names first: a body's value shadows an outer one
    scopes[path] = scope
    for i, node in enumerate(graph.node):
        for label, g in subgraphs(node):
            _collect(g, subgraph_path(path, node, i, label), scope, scopes)
