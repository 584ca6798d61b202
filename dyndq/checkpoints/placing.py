"""The matched checkpoint tensors put into the model in place of its float weights.

Each checkpoint tensor is decoded once (its `Written`: our op and standard ops), whatever number
of weights it stands for (tied embeddings: the Gather's table and the output projection read one
decode, so the file holds its codes once).  A weight read as stored takes the decode's value
itself (its producer renamed to the weight's name), or an Identity of it for a second weight; a
transposed one a Transpose of it; a Cast after where the weight's type is not the decode's (GGUF's
decode is float32, GPTQ's and AWQ's float16: a float32 weight widens it exactly).  The nodes go first in the main graph (their inputs are
their own initializers), the weights' initializers (and graph inputs of the same name, and the
Constant nodes making a weight) go.  Each tensor is decoded when its turn comes and its tensors
handed to the `store` (the import from a file: written to the new external data file) before
the next is decoded.
Lookup tables equal to one written before (the same for every tensor of a block type) are
shared, not written again.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import onnx
from onnx import helper

from dyndq.checkpoints.matching import TRANSPOSED, Match, constant_tensors
from dyndq.opdefs import DOMAIN
from dyndq.plumbing.ir import model_ir
from dyndq.plumbing.names import NameScope, all_names
from dyndq.plumbing.opsets import import_at_least


@dataclass
class Imported:
    """One weight replaced: by which tensor, found how, read which way, its nodes in a few words."""

    weight: str
    tensor: str
    kind: str
    how: str
    orientation: str
    form: str
    shape: tuple
    error: float | None = None
    note: str = ""

    def as_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.__dict__.items()}


def decode(model: onnx.ModelProto, matches: list[Match], tensors: dict) -> dict:
    """checkpoint tensor name -> its Written, all made at once, for a step that rewrites decodes
    before they are placed (fused.prepare); `place` otherwise decodes one tensor at a time."""
    make = decoder(model, matches, tensors)
    return {t: make(t) for t in dict.fromkeys(m.tensor for m in matches)}


def decoder(model: onnx.ModelProto, matches: list[Match], tensors: dict):
    """A function decoding one checkpoint tensor (by name) when asked, its nodes named after its
    first weight from one scope of names: `decode`'s, one decode at a time (fused.prepare, streamed)."""
    names = NameScope(all_names(model))
    first = {}
    for m in matches:
        first.setdefault(m.tensor, m.weight)

    def make(tensor: str):
        return tensors[tensor].nodes(names, first[tensor])
    return make


def place(model: onnx.ModelProto, matches: list[Match], tensors: dict, store=None, decoded: dict | None = None
          ) -> list[Imported]:
    """Put the matches into `model` (in place), each tensor's decode read by every weight it stands
    for; returns a row per weight.  Each tensor is decoded here when its turn comes and let go
    once placed, so that one tensor's decode is in memory at a time (`decoded`: decodes made
    before, from `decode`, taken instead).  `store(tensor)`, when given, takes each new
    initializer as it is made and returns what the graph holds (an external data file's stub)."""
    decoded = dict(decoded or {})
    names = NameScope(all_names(model) | {n for w in decoded.values() for node in w.nodes for n in [*node.output, node.name]}
                      | {t.name for w in decoded.values() for t in w.tensors})  # (the decodes' and the placing's names from one scope)
    graph = model.graph
    dtypes = {t.name: t.data_type for t in graph.initializer}
    dtypes.update({name: t.data_type for name, t in constant_tensors(graph).items() if name not in dtypes})
    by_tensor: dict[str, list[Match]] = {}
    for m in matches:
        by_tensor.setdefault(m.tensor, []).append(m)
    nodes, rows, tables = [], [], {}
    for tensor_name, ms in by_tensor.items():
        source = tensors[tensor_name]
        written = decoded.pop(tensor_name) if tensor_name in decoded else source.nodes(names, ms[0].weight)
        shared = _share_tables(written, tables)
        for t in written.tensors:
            if t.name not in shared:
                graph.initializer.append(store(t) if store is not None else t)
        del written.tensors[:]  # (the graph holds copies of them, or the store's stubs: the decode's own go now)
        nodes += written.nodes
        value_of, renamed = written.output, False
        for i, m in enumerate(ms):
            steps = []
            if m.orientation == TRANSPOSED:  # (a mixture of experts' 3-D [E, out, in]: each expert's matrix)
                steps.append(("Transpose", {"perm": [0, 2, 1]} if len(source.shape) == 3 else {}))
            if dtypes[m.weight] != written.dtype:  # (exact: float16 -> float32 widens; float32 -> float16 as the model holds it)
                steps.append(("Cast", {"to": dtypes[m.weight]}))
            if not steps and not renamed:  # (the decode's own value takes the weight's name)
                _rename(written.nodes, value_of, m.weight)
                value_of, renamed = m.weight, True
            else:
                value = value_of
                for j, (op, attrs) in enumerate(steps or [("Identity", {})]):
                    out = m.weight if j == len(steps or [None]) - 1 else names.fresh(f"{m.weight}_{op.lower()}")
                    nodes.append(helper.make_node(op, [value], [out], name=names.fresh(f"{m.weight}_{op}"), **attrs))
                    value = out
            note = "; ".join(x for x in (source.note, f"one decode with {', '.join(o.weight for o in ms if o is not m)}"
                                         if len(ms) > 1 else "",
                                         f"cast to {onnx.TensorProto.DataType.Name(dtypes[m.weight]).lower()}"
                                         if dtypes[m.weight] != written.dtype else "") if x)
            rows.append(Imported(m.weight, tensor_name, source.kind, m.how, m.orientation, written.form,
                                 tuple(source.shape), m.error, note))
    replaced = {m.weight for m in matches}
    drop_initializers(graph, replaced)
    inputs = [vi for vi in graph.input if vi.name not in replaced]
    del graph.input[:]
    graph.input.extend(inputs)
    rest = [n for n in graph.node if not (n.op_type == "Constant" and list(n.output) and n.output[0] in replaced)]
    del graph.node[:]
    graph.node.extend(nodes + rest)
    import_at_least(model.opset_import, DOMAIN, 3)  # (DynamicDequantize-3)
    model.ir_version = max(model.ir_version, model_ir(model))
    return rows


def drop_initializers(graph: onnx.GraphProto, names: set[str]) -> None:
    """The graph's initializers of those names removed in place (not the kept ones copied into a
    new list: protobuf copies each message extended, which would hold every weight twice)."""
    for i in reversed(range(len(graph.initializer))):
        if graph.initializer[i].name in names:
            del graph.initializer[i]


def _rename(nodes: list, old: str, new: str) -> None:
    for n in nodes:
        for i, name in enumerate(n.output):
            if name == old:
                n.output[i] = new
        for i, name in enumerate(n.input):
            if name == old:
                n.input[i] = new


def _share_tables(written, seen: dict) -> set[str]:
    """Lookup tables of `written` equal to one written before: its nodes read that one instead;
    returns their names (not to be written)."""
    shared = set()
    for t in written.tensors:
        if t.name not in written.tables:
            continue
        key = (t.data_type, tuple(t.dims), hashlib.sha256(t.raw_data).hexdigest())
        if key in seen:
            _rename(written.nodes, t.name, seen[key])
            shared.add(t.name)
        else:
            seen[key] = t.name
    return shared
