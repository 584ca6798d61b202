"""What the converters of ONNX Runtime's quantized contrib ops share.

`com.microsoft::MatMulNBits` and `com.microsoft::GatherBlockQuantized` are foreign
forms of DynamicDequantize: each has a module beside this one holding its lifting
(the foreign node -> DynamicDequantize-2 and standard nodes) and its lowering (a
DynamicDequantize-2 on constant weights and the node it feeds -> the foreign node).
Unlike an op version's lifting, which renames one node, these rewrite several nodes
and their weights (MatMulNBits stores its codes transposed and bit-packed), so each
returns a `Rewrite`, or a sentence saying why it cannot, and the face applies it.

What a converter may read of the graph a node stands in is a `GraphView` the face
builds: constant values, the nodes reading a value, which values leave the graph,
value specs, and a name scope for new names.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx

from dyndq.opdefs import DOMAIN, PER_GROUP, TensorSpec, dtypes

from .lowering_context import LoweringContext
from dyndq.plumbing.names import NameScope
from dyndq.plumbing.types import attribute_values

MS_DOMAIN = "com.microsoft"
MS_OPSET = 1  # the one version of com.microsoft's MatMulNBits and GatherBlockQuantized
# Metadata on a lifted DynamicDequantize: the foreign form it came from (JSON), so that the
# way back writes the same bytes.  Only the form is kept there; every value comes from the graph.
LIFTED_FROM = "dyndq.lifted_from"
# Metadata on a lifted MatMul: MatMulNBits' accuracy_level, which a MatMul has no attribute for.
ACCURACY_LEVEL = "dyndq.accuracy_level"
# The scales (and A) types ONNX Runtime 1.32's CPU kernels of both contrib ops take.
RUNTIME_FLOATS = ("float32", "float16")
# Slice with its bounds as inputs (the lifted form of a padded weight) needs this ai.onnx opset;
# Add broadcasting a bias [N] over [..., N] (NumPy's rules) needs this one.
SLICE_OPSET = 10
BROADCAST_OPSET = 7


@dataclass
class GraphView:
    """What a foreign converter may read of one graph (the face builds it).

    `constant(name)`: the value of a constant as the graph sees it (an initializer or a
    Constant node's output of this graph or of a graph enclosing it; None when the value is not
    a constant); `consumers(name)`: every node of this graph reading the value (a node holding a
    body that reads it stands for that body's readers); `is_output(name)`: whether it leaves the
    graph; `spec(name)`: its known dtype and shape (None when unknown, always in a function);
    `names`: every name in use in the model; `imports`: the opset imports in force there.
    """

    constant: Callable[[str], np.ndarray | None]
    consumers: Callable[[str], list[onnx.NodeProto]]
    is_output: Callable[[str], bool]
    spec: Callable[[str], TensorSpec | None]
    names: NameScope
    producer: Callable[[str], onnx.NodeProto | None] = lambda name: None
    imports: dict[str, int] = field(default_factory=dict)  # {domain: version} of the scope's opset imports
    in_function: bool = False

    @property
    def opset(self) -> int:
        """The ai.onnx opset the graph's scope imports (0: none)."""
        return self.imports.get("", self.imports.get("ai.onnx", 0))


@dataclass
class Rewrite:
    """Nodes that replace nodes: `replaces` leave the graph, `nodes` stand where the last of
    them stood (in order), `initializers` are the new constants (`derived` says, for each one
    made from a constant of the model, (that constant's name, its role): "" for the value
    itself in another form, which takes the source's name once nothing else reads it; e.g.
    "zero_points" for a value made beside it), `form` says in a few words what came out,
    `notes` what the reader should know of it, `domains` the opset imports the new nodes need
    (for ai.onnx, "", the lowest version that has them, `needs_why` says why)."""

    replaces: list[onnx.NodeProto]
    nodes: list[onnx.NodeProto]
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    form: str = ""
    notes: list[str] = field(default_factory=list)
    domains: dict[str, int] = field(default_factory=dict)
    derived: dict[str, tuple[str, str]] = field(default_factory=dict)
    needs_why: str = ""


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


# -- reading nodes ------------------------------------------------------------------------------

def inputs_of(node: onnx.NodeProto, count: int) -> list[str | None]:
    """The node's first `count` input names, None for each absent one."""
    names = list(node.input) + [""] * count
    return [n or None for n in names[:count]]


def int_attributes(node: onnx.NodeProto, wanted: dict[str, int | None]) -> dict[str, int] | str:
    """The node's integer attributes among `wanted` (name -> default; None: required), or why not:
    one missing, given twice, or of another kind than INT (ONNX Runtime refuses such a node too)."""
    out, seen = {}, set()
    for a in node.attribute:
        if a.name not in wanted:
            continue
        if a.name in seen:
            return f"attribute {a.name} given more than once"
        seen.add(a.name)
        if a.type != onnx.AttributeProto.INT:
            kind = onnx.AttributeProto.AttributeType.Name(a.type)
            return f"attribute {a.name} is {kind}, not INT"
        out[a.name] = int(a.i)
    missing = [k for k, default in wanted.items() if default is None and k not in out]
    if missing:
        return f"attribute {', '.join(missing)} missing"
    return {k: out.get(k, default) for k, default in wanted.items()}


def ddq_attrs(node: onnx.NodeProto) -> tuple[str, tuple[int, ...] | None]:
    """A DynamicDequantize's qtype and group_shape (version 2's defaults filled in)."""
    attrs = attribute_values(node)
    group = attrs.get("group_shape")
    return attrs.get("qtype", "per_tensor"), tuple(group) if group is not None else None


def power_of_two_block(block: int) -> bool:
    """What both contrib ops take as block_size: a power of two, 16 or more."""
    return block >= 16 and block & (block - 1) == 0


def lifted_from(node: onnx.NodeProto, op: str) -> dict:
    """The foreign form a lifted DynamicDequantize remembers (empty when it has none or another op's)."""
    for p in node.metadata_props:
        if p.key == LIFTED_FROM:
            try:
                form = json.loads(p.value)
            except ValueError:
                return {}
            return form if isinstance(form, dict) and form.get("op") == op else {}
    return {}


def remember(node: onnx.NodeProto, key: str, value) -> None:
    """Set a metadata entry (JSON for anything but a string)."""
    entry = node.metadata_props.add()
    entry.key, entry.value = key, value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def float_scales(view: GraphView, name: str | None, allowed=("float32", "float16", "bfloat16"), refusal: str = ""):
    """(the constant scales, their dtype name), or why not: not a constant, or a dtype not `allowed`
    (`refusal` says whose rule that is)."""
    scales = view.constant(name) if name else None
    if scales is None:
        return "scales is not a constant"
    t = dtypes.name_of(scales.dtype)
    if t not in allowed:
        return f"scales is {t}" + (f": {refusal}" if refusal else f", not {'/'.join(allowed)}")
    return scales, t


def integer_values(array: np.ndarray) -> np.ndarray | None:
    """The values of a zero-point tensor as int64, when every one is a finite integer (None otherwise)."""
    a = np.asarray(array)
    if a.dtype.kind in "iu" or a.dtype.name in ("int4", "uint4"):
        return a.astype(np.int64)
    wide = a.astype(np.float64)
    if not np.all(np.isfinite(wide)) or not np.array_equal(wide, np.round(wide)):
        return None
    if wide.size and np.abs(wide).max() >= 2**31:
        return None
    return wide.astype(np.int64)


# -- bits ---------------------------------------------------------------------------------------
# ONNX Runtime packs codes of `bits` bits into bytes along the last axis, low bits first: the
# layout onnx.numpy_helper gives int4 tensors, but over rows of a uint8 tensor (MatMulNBits'
# blobs, GatherBlockQuantized's uint8 data), which numpy_helper has no call for; so by hand.

def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes holding `bits`-bit codes, low bits first -> one uint8 per code (last axis x 8/bits)."""
    packed = np.asarray(packed, np.uint8)
    if bits == 8:
        return packed
    per, mask = 8 // bits, (1 << bits) - 1
    parts = [(packed >> (bits * i)) & mask for i in range(per)]
    return np.stack(parts, axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * per)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of `unpack`: codes in [0, 2^bits) along the last axis (a multiple of 8/bits) -> uint8."""
    codes = np.asarray(codes).astype(np.uint8)
    if bits == 8:
        return codes
    per = 8 // bits
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    out = np.zeros(grouped.shape[:-1], np.uint8)
    for i in range(per):
        out |= (grouped[..., i] << (bits * i)).astype(np.uint8)
    return out


def as_codes(values: np.ndarray, dtype: str) -> np.ndarray:
    """Integer values as an array of our dtype name (uint4 codes in ml_dtypes' uint4, ...)."""
    return np.asarray(values).astype(np.int64).astype(dtypes.by_name(dtype).numpy)


def tensor(array: np.ndarray, name: str) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(array), name)


# -- building -----------------------------------------------------------------------------------

def context(view: GraphView, base: str) -> LoweringContext:
    """A lowering context for new nodes named after `base` (the replaced node's name)."""
    return LoweringContext(opset=SLICE_OPSET, base=base, names=view.names, specs=view.spec)


def dynamic_dequantize(ctx: LoweringContext, src: str, scales: str, zps: str | None, group_shape, form: dict) -> str:
    """A DynamicDequantize-2 per_group node remembering `form` (the foreign form); returns dst."""
    inputs = [src, scales] + ([zps] if zps else [])
    dst = ctx.op("DynamicDequantize", *inputs, domain=DOMAIN, hint="weight", qtype=PER_GROUP,
                 group_shape=[int(g) for g in group_shape])
    remember(ctx.nodes[-1], LIFTED_FROM, form)
    return dst


def lifted(node: onnx.NodeProto, ctx: LoweringContext, new: Constants, form: str, *, padded: bool,
           broadcast: bool = False, notes=()) -> Rewrite:
    """The Rewrite of a lift: `node` replaced by the context's nodes (DynamicDequantize-2 and
    standard ops, a Slice among them when `padded`, an Add broadcasting a bias when `broadcast`)."""
    need, why = 1, ""
    if broadcast:
        need, why = BROADCAST_OPSET, "Add broadcasting the bias"
    if padded:
        need, why = SLICE_OPSET, "Slice with its bounds as inputs, cutting the padding"
    return Rewrite([node], list(ctx.nodes), new.tensors, form, list(notes), domains={DOMAIN: 2, "": need},
                   derived=new.derived, needs_why=why)


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
    shape = view.constant(node.input[0]).shape
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


def chain_nodes(view: GraphView, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` (a DynamicDequantize first) and the Constant nodes that only the others read (a
    Slice's bounds): what a rewrite replaces.  The DynamicDequantize's own constants are left to
    the walker, which removes them once unread and gives their names to what was made of them."""
    out = list(nodes)
    for node in nodes[1:]:
        for name in node.input:
            maker = view.producer(name) if name else None
            if maker is not None and maker.op_type == "Constant" and all(
                    reader in nodes for reader in view.consumers(name)) and maker not in out:
                out.insert(0, maker)
    return out


def stand_in(new: onnx.NodeProto, old: onnx.NodeProto) -> None:
    """The node that now makes the original's output takes its name, doc string and metadata
    (but for what a lifting noted for the way back)."""
    if old.name:
        new.name = old.name
    if old.HasField("doc_string"):
        new.doc_string = old.doc_string
    new.metadata_props.extend(p for p in old.metadata_props if p.key != ACCURACY_LEVEL)


