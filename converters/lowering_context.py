"""What every lowering gets: a context to add standard nodes to, with fresh names.

Shared by the lowerings of every op (one module per op beside this one): a
lowering receives a `LoweringContext` first, then the op's inputs as value
names and its attributes; it adds nodes with `ctx.op(...)` and `ctx.const(...)`
and returns the name of the value holding its output.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import helper

from dyndq.opdefs import TensorSpec
from dyndq.plumbing.names import NameScope



@dataclass
class LoweringContext:
    """What a lowering needs to lower one node.

    `opset` is the target ai.onnx opset and `target` the export target (the engine the forms
    are chosen for: converters/engines.py); `spec(name)` the known dtype and shape of a value
    (None when unknown) and `constant(name)` its array when it is a constant of the model;
    `op(...)` adds a node and returns its output name; `const(array)` adds a Constant node;
    `derive(array, source)` a new initializer made from the constant `source` (the walker
    keeps one copy: it takes the source's name once nothing else reads the source).  New names
    derive from `base` (the original node's name, or its output's) and are unique in the model.
    A lowering may set `form` to say in a few words what it chose (the export
    report shows it); by default the report lists the standard op types used.
    """

    opset: int
    base: str
    names: NameScope
    specs: Callable[[str], TensorSpec | None] = lambda name: None
    target: str = "onnx"
    constants: Callable[[str], np.ndarray | None] = lambda name: None
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    form: str | None = None
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    derived: dict[str, tuple[str, str]] = field(default_factory=dict)
    _consts: dict = field(default_factory=dict, repr=False)

    def constant(self, name: str | None) -> np.ndarray | None:
        return self.constants(name) if name else None

    def derive(self, array: np.ndarray, source: str) -> str:
        """A new initializer holding `array`, the constant `source`'s value in another form."""
        name = self.names.fresh(source)
        self.initializers.append(onnx.numpy_helper.from_array(np.asarray(array), name))
        self.derived[name] = (source, "")
        return name

    def spec(self, name: str | None) -> TensorSpec | None:
        return self.specs(name) if name else None

    def fresh(self, hint: str) -> str:
        return self.names.fresh(f"{self.base}/{hint}")

    def op(self, op_type: str, *inputs: str, hint: str | None = None, domain: str = "", **attrs) -> str:
        """Add one single-output node (of ai.onnx unless `domain` says); return the name of its output."""
        hint = hint or op_type.lower()
        out = self.fresh(hint)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=self.fresh(op_type), domain=domain or None,
                                           **attrs))
        return out

    def output_as(self, result: str, dst: str) -> None:
        """Make the value `result` (made by this context's nodes) be called `dst`: the original
        node's output name, which the rest of the graph reads."""
        if result == dst:
            return
        for n in self.nodes:
            n.output[:] = [dst if name == result else name for name in n.output]
            n.input[:] = [dst if name == result else name for name in n.input]

    def const(self, array, hint: str) -> str:
        """A Constant node (one per distinct value per lowered node); works in functions too."""
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            out = self.fresh(hint)
            tensor = onnx.numpy_helper.from_array(array, name=out)
            self.nodes.append(helper.make_node("Constant", [], [out], name=self.fresh("Constant"), value=tensor))
            self._consts[key] = out
        return self._consts[key]


