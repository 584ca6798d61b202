"""What every rewrite rule works with: a view of the graph around a node, and the Rewrite it returns.

A rule (converters/rules.py) is asked about one node through a `GraphView`, a read-only
view of the graph the node stands in that the walker (converters/walker.py) builds:
constant values as ONNX scopes names, the nodes reading a value, which values leave the
graph, value specs, the opset imports in force, a name scope for new names and the
options the command was given.  It answers with a `Rewrite` (nodes that replace nodes,
and the constants they read, each `derived` from a constant of the model) or a
`Refusal`; the walker applies the rewrites.  The helpers below build the nodes and
follow the chains (DynamicDequantize -> Slice -> MatMul) rules share.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx

from dyndq.opdefs import DOMAIN, DYNAMIC_DEQUANTIZE_2, DYNAMIC_DEQUANTIZE_3, TensorSpec, dtypes
from dyndq.plumbing.names import NameScope
from dyndq.plumbing.types import attribute_values

from .lowering_context import LoweringContext

# Slice with its bounds as inputs (the lifted form of a padded weight) needs this ai.onnx opset;
# Add broadcasting a bias [N] over [..., N] (NumPy's rules) needs this one.
SLICE_OPSET = 10
BROADCAST_OPSET = 7


@dataclass
class GraphView:
    """What a rule may read of the graph a node stands in (the walker builds it).

    `constant(name)`: the value of a constant as the graph sees it (an initializer or a
    Constant node's output of this graph or of a graph enclosing it; None when the value is not
    a constant); `consumers(name)`: every node of this graph reading the value (a node holding a
    body that reads it stands for that body's readers); `is_output(name)`: whether it leaves the
    graph; `spec(name)`: its known dtype and shape (None when unknown, always in a function);
    `names`: every name in use in the model; `imports`: the opset imports in force there;
    `options`: what the command was given for the rules that take it (e.g. export's
    accuracy_level, for the rule writing MatMulNBits); `read(tensor)`: a constant's value,
    through the walker's store (a weight whose data is on disk is read from there, one at a
    time); `raw(name)`: a constant's bytes as stored (uint8, 4-bit codes two a byte), read in
    place from its data file where the model's constants stay on disk (the streamed export:
    walker.external_constants), else None (a rule then asks `constant`).
    """

    constant: Callable[[str], np.ndarray | None]
    consumers: Callable[[str], list[onnx.NodeProto]]
    is_output: Callable[[str], bool]
    spec: Callable[[str], TensorSpec | None]
    names: NameScope
    producer: Callable[[str], onnx.NodeProto | None] = lambda name: None
    imports: dict[str, int] = field(default_factory=dict)  # {domain: version} of the scope's opset imports
    in_function: bool = False
    options: dict = field(default_factory=dict)
    read: Callable[[onnx.TensorProto], np.ndarray] = onnx.numpy_helper.to_array
    raw: Callable[[str], np.ndarray | None] = lambda name: None


@dataclass
class Rewrite:
    """Nodes that replace nodes: `replaces` leave the graph, `nodes` stand where the last of
    them stood (in order), `initializers` are the new constants (`derived` says, for each one
    made from a constant of the model, (that constant's name, its role): "" for the value
    itself in another form, which takes the source's name once nothing else reads it; e.g.
    "zero_points" for a value made beside it), `form` says in a few words what came out,
    `notes` what the reader should know of it, `domains` the opset imports the new nodes need
    (for ai.onnx, "", the lowest version that has them, `needs_why` says why); `op` is the op
    version of ours the rule started from (set when a rule is applied).  A rewrite of a
    constant (kind QUANTIZE) replaces no node of its own: its `nodes` compute what stands for
    the constant, and `rewires` point the inputs of the nodes that read it there ((node, input
    index, the new value)); `replaces` lists the nodes that pass it on (Identity) or hold it
    (its Constant node), which leave once nothing else reads it."""

    replaces: list[onnx.NodeProto]
    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    form: str = ""
    notes: list[str] = field(default_factory=list)
    domains: dict[str, int] = field(default_factory=dict)
    derived: dict[str, tuple[str, str]] = field(default_factory=dict)
    needs_why: str = ""
    op: object = None  # the op version of ours the node the rule started from resolved to (None: not ours)
    rewires: list[tuple[onnx.NodeProto, int, str]] = field(default_factory=list)


@dataclass
class Constants:
    """The constants a rewrite adds, each with a fresh name and what it was derived from."""

    names: NameScope
    tensors: list[onnx.TensorProto] = field(default_factory=list)
    derived: dict[str, tuple[str, str]] = field(default_factory=dict)

    def add(self, array: np.ndarray, source: str | None, role: str = "", hint: str | None = None) -> str:
        """A new constant made from the constant `source` (None: from nothing in the model) in
        `role` ("": the source's value in another form); returns its name."""
        name = self.names.fresh(hint or (f"{source}_{role}" if role else source))
        self.tensors.append(tensor(array, name))
        if source:
            self.derived[name] = (source, role)
        return name


def inputs_of(node: onnx.NodeProto, count: int) -> list[str | None]:
    """The node's first `count` input names, None for each absent one."""
    names = list(node.input) + [""] * count
    return [n or None for n in names[:count]]


def ddq_attrs(node: onnx.NodeProto) -> tuple[str, tuple[int, ...] | None]:
    """A DynamicDequantize's qtype and group_shape (version 2's defaults filled in)."""
    attrs = attribute_values(node)
    group = attrs.get("group_shape")
    return attrs.get("qtype", "per_tensor"), tuple(group) if group is not None else None


def tensor(array: np.ndarray, name: str) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(array), name)


def context(view: GraphView, base: str) -> LoweringContext:
    """A lowering context for new nodes named after `base` (the replaced node's name)."""
    return LoweringContext(opset=SLICE_OPSET, base=base, names=view.names, specs=view.spec)


def lifted(node: onnx.NodeProto, ctx: LoweringContext, new: Constants, form: str, *, padded: bool,
           broadcast: bool = False, notes=()) -> Rewrite:
    """The Rewrite of a lift: `node` replaced by the context's nodes (DynamicDequantize and
    standard ops, a Slice among them when `padded`, an Add broadcasting a bias when `broadcast`),
    importing the DynamicDequantize version their dtypes need (`lifted_version`)."""
    need, why = 1, ""
    if broadcast:
        need, why = BROADCAST_OPSET, "Add broadcasting the bias"
    if padded:
        need, why = SLICE_OPSET, "Slice with its bounds as inputs, cutting the padding"
    return Rewrite([node], list(ctx.nodes), new.tensors, form, list(notes),
                   domains={DOMAIN: lifted_version(ctx, new), "": need}, derived=new.derived, needs_why=why)


def lifted_version(ctx: LoweringContext, new: Constants) -> int:
    """The DynamicDequantize version a lift's nodes need: 2 (every lift makes per_group nodes),
    3 where an input's dtype is only version 3's (2-bit or 16-bit codes, int32 zero points beside
    uint16 codes...) or a node sets output_dtype. Each input's dtype is its new constant's, else
    the model's; one unknown takes version 3, which holds every node version 2 does."""
    made = {t.name: dtypes.by_onnx(t.data_type).name for t in new.tensors}
    for n in ctx.nodes:
        if n.domain != DOMAIN or n.op_type != "DynamicDequantize":
            continue
        if "output_dtype" in attribute_values(n):
            return 3
        for param, name in zip(("src", "scales", "zps"), n.input):
            if not name:
                continue
            spec = None if name in made else ctx.spec(name)
            dtype = made.get(name, spec.dtype if spec is not None else None)
            if dtype not in DYNAMIC_DEQUANTIZE_2.allowed_dtypes(param):
                return DYNAMIC_DEQUANTIZE_3.since_version
    return DYNAMIC_DEQUANTIZE_2.since_version


def slice_to(ctx: LoweringContext, value: str, axis: int, length: int) -> str:
    """value[..., :length, ...] along `axis`: the padding of a blocked axis cut off."""
    return ctx.op("Slice", value, ctx.const(np.array([0], np.int64), "start"),
                  ctx.const(np.array([length], np.int64), "end"), ctx.const(np.array([axis], np.int64), "axis"),
                  hint="weight_unpadded")


def sliced_prefix(view: GraphView, node: onnx.NodeProto, rank: int) -> tuple[int, int] | None:
    """(axis, length) when `node` is a Slice taking value[:length] along one axis (step 1), its
    bounds constants; None otherwise."""
    if node.op_type != "Slice" or node.domain not in ("", "ai.onnx") or len(node.input) < 3:
        return None
    names = inputs_of(node, 5)
    bounds = [view.constant(n) if n else None for n in names[1:5]]
    starts, ends, axes, steps = bounds
    if starts is None or ends is None or starts.size != 1 or ends.size != 1 or (names[3] and axes is None):
        return None
    if (names[4] and (steps is None or steps.size != 1 or int(steps.ravel()[0]) != 1)) or int(starts.ravel()[0]) != 0:
        return None
    axis = int(axes.ravel()[0]) if axes is not None else 0
    if axes is not None and axes.size != 1 or not -rank <= axis < rank:
        return None
    return axis % rank, int(ends.ravel()[0])


def chain_to(view: GraphView, node: onnx.NodeProto, op_type: str, index: int, axis: int, what: str):
    """Follow a DynamicDequantize's output to the one node of `op_type` reading it as input
    `index` (a Slice cutting the padding of `axis` may stand between): (the Slices passed, that
    node, the length kept along `axis`), or why the output goes elsewhere."""
    value, passed = node.output[0], []
    spec = view.spec(node.input[0])  # (its shape alone: the values of a weight on disk are not read for it)
    shape = tuple(spec.shape) if spec is not None and spec.size is not None else view.constant(node.input[0]).shape
    length = shape[axis]
    while True:
        readers = view.consumers(value)
        if view.is_output(value) or len(readers) != 1:
            return f"its output is read by several nodes or leaves the graph, not only by {what}" if readers else \
                f"its output is not read by {what}"
        reader = readers[0]
        names = list(reader.input)
        if reader.domain in ("", "ai.onnx") and reader.op_type == op_type and len(names) > index \
                and names[index] == value and names.count(value) == 1:
            return passed, reader, length
        cut = sliced_prefix(view, reader, len(shape))
        if cut is None or passed or cut[0] != axis or names[0] != value:
            return f"its output feeds {reader.op_type} {reader.name or reader.output[0]!r}, not {what}"
        length = min(cut[1], length)
        passed.append(reader)
        value = reader.output[0]


def stand_in(new: onnx.NodeProto, old: onnx.NodeProto, drop=()) -> None:
    """The node that now makes the original's output takes its name, doc string and metadata
    (but for the metadata keys in `drop`).  (An empty doc string set would be written out: not
    the node given.)"""
    if old.name:
        new.name = old.name
    if old.HasField("doc_string"):
        new.doc_string = old.doc_string
    new.metadata_props.extend(p for p in old.metadata_props if p.key not in drop)
