"""Which node: the first node, in graph order, whose output differs beyond the tolerance.

The engine runs again with values inside the graph exposed as graph outputs, and each is
compared with the reference's value of that name.  Exposing a value can stop a rewrite that
would have consumed it (ONNX Runtime fuses no node whose output is a graph output), so for ONNX
Runtime only the values its optimized graph still computes are exposed (those of the nodes a
fusion removed have no value to compare anyway: their consumer, the fused node's output, is the
one named), and the divergence must still show in the graph's outputs of that run, else no node
is named and the report says why.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from dyndq.parity.metrics import compare
from dyndq.parity.report import FirstDivergence
from dyndq.plumbing.names import op_name


def node_outputs(model: onnx.ModelProto) -> list[str]:
    """The values the main graph's nodes make, in graph order."""
    return [o for n in model.graph.node for o in n.output if o]


def surviving(model: onnx.ModelProto, optimized: onnx.ModelProto) -> list[str]:
    """The model's node outputs that the engine's optimized graph still computes, in graph order."""
    kept = {o for n in optimized.graph.node for o in n.output}
    return [o for o in node_outputs(model) if o in kept]


def first_divergence(model: onnx.ModelProto, run_exposed: Callable[[Sequence[str]], Mapping[str, np.ndarray]],
                     reference: Mapping[str, np.ndarray], candidates: Sequence[str],
                     optimized: onnx.ModelProto | None = None) -> tuple[FirstDivergence | None, str | None]:
    """The first node of `model` whose output (among `candidates`, with a reference value) differs;
    or None and why.  `run_exposed(names)` runs the engine with `names` exposed (the graph's outputs
    come with them)."""
    outputs = [o.name for o in model.graph.output]
    names = [c for c in candidates if c in reference and c not in outputs]
    values = run_exposed(names)
    if all(compare(o, values[o], reference[o]).agrees for o in outputs if o in reference):
        return None, ("run again with the values inside the graph exposed as outputs, the engine agrees "
                      "(exposing them changed its rewrite): no first node named")
    made_by = {o: n for n in (optimized.graph.node if optimized is not None else ()) for o in n.output}
    for node in model.graph.node:
        for out in node.output:
            if out not in values or out not in reference:
                continue
            parity = compare(out, values[out], reference[out])
            if not parity.agrees:
                engine_node = made_by.get(out)
                became = op_name(engine_node) if engine_node is not None else None
                return FirstDivergence(node.name or out, node.op_type, out, tuple(node.input), became, parity), None
    return None, "no value inside the graph differs, only its outputs as the engine returns them"
