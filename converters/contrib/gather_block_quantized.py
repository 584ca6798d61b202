"""com.microsoft::GatherBlockQuantized <-> DynamicDequantize + Gather, exactly.

GatherBlockQuantized(data, indices, scales, zero_points?) with attributes quantize_axis,
gather_axis, block_size and bits gathers rows of a block-quantized table and dequantizes
them: one scale and zero point per block of `block_size` along quantize_axis (the last
block may be short).  data is int4/uint4 (zero points of the same type; absent means 0,
as ours), or uint8 holding 2-, 4- or 8-bit codes packed along its last axis, low bits first
(absent zero point: 2^(bits-1); zero points packed alike, each row padded to whole bytes:
measured on ONNX Runtime 1.32, 2 bits included); FP8/FP4 data has no zero points and no codes
of ours.

Lifting gives the equivalent

    table = DynamicDequantize-2(codes, scales, zps, per_group, block_size along quantize_axis)
    table = Slice(table, [0], [D], [quantize_axis])   when D is not a multiple of block_size
    output = Gather(table, indices, axis=gather_axis)

int4/uint4 data is used as it is (padded along quantize_axis when D is not a multiple of
the block); uint8 data is unpacked to uint2 (DynamicDequantize-3) or uint4 (or kept, for 8
bits) and its absent zero point written out.  The lifted form dequantizes the whole table and then gathers, where
GatherBlockQuantized gathers codes and then dequantizes: equal for every index in range;
an index out of range is an error for Gather, and zeros for GatherBlockQuantized.

Lowering (export for ONNX Runtime) takes the reverse path from a DynamicDequantize-2
per_group node on constant codes (one axis grouped, by a power of two >= 16) with float32
or float16 scales whose output is the data of one Gather.  int4/uint4 codes stay as
they are; uint8/int8 and uint2/int2 codes become uint8 data of 8 or 2 bits (signed codes
shifted by 128 or 2 with their zero points) where ONNX Runtime's kernel takes it (gather_axis
0, quantize_axis last, 2-bit rows of whole bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from dyndq.opdefs import DOMAIN, PER_GROUP, dtypes
from dyndq.plumbing.types import attribute_values

from .. import rewrite as rw
from ..rewrite import GraphView, Rewrite
from ..rules import LIFT, WRITE, rule, says_why
from . import shared
from .shared import MS_DOMAIN, MS_OPSET, RUNTIME_FLOATS

OP = "GatherBlockQuantized"
QUALNAME = f"{MS_DOMAIN}::{OP}"
DEFAULTS = {"bits": 4, "block_size": 128, "quantize_axis": 1, "gather_axis": 0}


# == lifting ===================================================================================

@dataclass(frozen=True)
class _Table:
    """What the lift of one GatherBlockQuantized found: the table's codes (unpacked), its zero
    points as codes (None: absent), where its axes are, and the form to remember."""

    inputs: tuple
    kind: str
    codes: np.ndarray
    zero: np.ndarray | None
    bits: int
    block: int
    qa: int
    ga: int
    want: tuple
    form: dict
    cast: onnx.NodeProto | None = None  # the Cast of float16 scales to float32 feeding the node (shared.cast_scales)



def _lift_found(node: onnx.NodeProto, view: GraphView) -> _Table | str:
    """What a GatherBlockQuantized holds, decoded, or why it has no exact DynamicDequantize form."""
    attrs = shared.int_attributes(node, DEFAULTS)
    if isinstance(attrs, str):
        return attrs
    data_name, indices, s, z = rw.inputs_of(node, 4)
    bits, block = attrs["bits"], attrs["block_size"]
    data = view.constant(data_name) if data_name else None
    if data is None:
        return "data is not a constant (an initializer or a Constant of this graph)"
    kind = dtypes.name_of(data.dtype)
    if kind not in ("int4", "uint4", "uint8"):
        return f"data is {kind}: DynamicDequantize takes integer codes (int4/uint4/uint8 here)"
    if data.ndim == 0:
        return "data is a scalar: GatherBlockQuantized gathers from a tensor of rank 1 or more"
    if kind == "uint8" and bits not in (2, 4, 8):
        return f"bits={bits}: GatherBlockQuantized takes uint8 data of 2, 4 or 8 bits"
    if kind != "uint8" and bits != 4:
        return f"bits={bits} with {kind} data"
    if not shared.power_of_two_block(block):
        return f"block_size {block}: GatherBlockQuantized takes powers of two from 16 for integer codes"
    codes = shared.unpack(data, bits) if kind == "uint8" else data
    rank = codes.ndim
    qa, ga = int(attrs["quantize_axis"]), int(attrs["gather_axis"])
    if rank == 0 or not (-rank <= qa < rank and -rank <= ga < rank):
        return f"quantize_axis {qa} or gather_axis {ga} out of range for data of rank {rank}"
    qa, ga = qa % rank, ga % rank
    length = codes.shape[qa]
    blocks = -(-length // block)
    want = tuple(blocks if i == qa else d for i, d in enumerate(codes.shape))
    found = shared.float_scales(view, s)
    cast = None
    if isinstance(found, str):
        through = shared.cast_scales(view, s)  # (float16 scales read as float32 through a Cast: lifted with output_dtype)
        if through is None:
            return found
        cast, found = through[0], (through[1], "float16")
    scales, t = found
    if scales.shape != want:
        return f"scales has shape {list(scales.shape)}, not {list(want)}"
    form = {"op": QUALNAME, "data": kind, "bits": bits,
            "attributes": {a.name: int(a.i) for a in node.attribute if a.name in DEFAULTS}}
    zero = None
    if z:
        zero = view.constant(z)
        if zero is None:
            return "zero_points is not a constant"
        if zero.ndim != rank:
            return f"zero_points has rank {zero.ndim}, not data's {rank}"
        zero = shared.unpack(zero, bits) if kind == "uint8" else zero
        if dtypes.name_of(zero.dtype) != kind or zero.shape[:-1] != want[:-1] or zero.shape[-1] < want[-1] \
                or (kind != "uint8" and zero.shape != want):
            return f"zero_points (as codes) have shape {list(zero.shape)}, not {list(want)}"
        form["zero_points"] = "given"
        padding = zero[..., want[-1]:]
        if kind == "uint8" and padding.size and np.all(padding == padding.flat[0]) and int(padding.flat[0]):
            form["zero_points_padding"] = int(padding.flat[0])  # (written back as it was; 0 otherwise)
        zero = zero[..., :want[-1]]
    return _Table((data_name, indices, s if cast is None else cast.input[0], z), kind, codes, zero, bits, block, qa, ga,
                  want, form, cast)


@rule("GatherBlockQuantized -> DynamicDequantize + Gather", kind=LIFT, pattern=(MS_DOMAIN, OP),
      check=says_why(_lift_found), targets=("onnx", "openvino"))
def lift(found: _Table, node: onnx.NodeProto, view: GraphView) -> Rewrite:
    """One GatherBlockQuantized as DynamicDequantize-2 (+ Slice) + Gather."""
    (data_name, indices, s, z), kind, codes, zero, bits, block, qa, ga, want, form = (
        found.inputs, found.kind, found.codes, found.zero, found.bits, found.block, found.qa, found.ga, found.want,
        dict(found.form))
    rank, length = codes.ndim, codes.shape[qa]
    blocks = -(-length // block)
    new = rw.Constants(view.names)
    code_type = shared.CODE_TYPES[bits] if kind == "uint8" else kind
    zero_name = None
    padded = blocks * block != length
    if kind == "uint8" or padded:
        padding = [(0, blocks * block - length) if i == qa else (0, 0) for i in range(rank)]
        full = np.pad(codes.astype(np.int64), padding) if padded else codes
        code_name = new.add(shared.as_codes(full, code_type), data_name)
    else:
        code_name = data_name
    if z:
        zero_name = new.add(shared.as_codes(zero, code_type), z) if kind == "uint8" else z
    elif kind == "uint8":
        form["zero_points"] = "absent"
        zero_name = new.add(shared.as_codes(np.full(want, 1 << (bits - 1)), code_type), data_name, "zero_points")

    base = node.name or node.output[0]
    ctx = rw.context(view, base)
    group = [block if i == qa else 1 for i in range(rank)]
    table = shared.dynamic_dequantize(ctx, code_name, s, zero_name, group, form)
    if found.cast is not None:  # (float16 scales, a float32 result: DynamicDequantize-3's output_dtype, as the Cast gave)
        ctx.nodes[-1].attribute.append(onnx.helper.make_attribute("output_dtype", onnx.TensorProto.FLOAT))
    if padded:
        table = rw.slice_to(ctx, table, qa, length)
    out = ctx.op("Gather", table, indices, axis=ga, hint="gathered")
    ctx.output_as(out, node.output[0])
    shared.stand_in(ctx.nodes[-1], node)
    shown = f"DynamicDequantize per_group {group} + {'Slice + ' if padded else ''}Gather (axis {ga})"
    if found.cast is not None:
        shown += " (float16 scales, output_dtype float32: the Cast folded)"
    out = rw.lifted(node, ctx, new, shown, padded=padded)
    out.replaces[:0] = shared.lifted_cast(view, node, found.cast)
    return out


# == writing for ONNX Runtime ==================================================================================

@dataclass(frozen=True)
class _Chain:
    """What the write of one GatherBlockQuantized found: the codes kept, the zero points as the
    contrib op's codes, the data type and bits it takes, the nodes from the DynamicDequantize to
    the Gather."""

    inputs: tuple
    codes: np.ndarray
    values: np.ndarray
    zero: np.ndarray | None
    zero_values: np.ndarray
    data_type: str
    bits: int
    shift: int
    block: int
    qa: int
    ga: int
    length: int
    nodes: list
    gather: onnx.NodeProto
    cast: bool = False  # float16 scales, output_dtype float32: the scales Cast to float32 (shared.cast_scales)



@dataclass(frozen=True)
class _Described:
    """A constant's type and shape, where the streamed export keeps its values on disk (its
    values read only once the chain is known to be this rule's: a MatMul's codes, read here whole,
    were every fused weight's peak)."""

    dtype: np.dtype
    shape: tuple

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _described(view: GraphView, name: str) -> _Described | None:
    spec = view.spec(name)
    if view.raw(name) is None or spec is None or spec.dtype is None or spec.size is None:
        return None
    try:
        numpy_type = dtypes.by_name(spec.dtype).numpy
    except KeyError:  # (a type of no row: read as it is)
        return None
    return None if numpy_type is None else _Described(np.dtype(numpy_type), tuple(spec.shape))


def _write_found(node: onnx.NodeProto, view: GraphView) -> _Chain | str:
    """The chain a DynamicDequantize-2 starts that one GatherBlockQuantized expresses, or why not."""
    qtype, group = rw.ddq_attrs(node)
    src, s, z = rw.inputs_of(node, 3)
    if qtype != PER_GROUP:
        return f"{qtype}: GatherBlockQuantized takes blocks along one axis (per_group)"
    codes = _described(view, src)  # (on disk: its type and shape alone until it is known to feed a Gather)
    if codes is None:
        codes = view.constant(src)
    if codes is None:
        return "src is not a constant"
    kind = dtypes.name_of(codes.dtype)
    if kind not in ("int2", "uint2", "int4", "uint4", "int8", "uint8"):
        return f"src is {kind}: GatherBlockQuantized takes 2-, 4- and 8-bit integer codes"
    grouped = [i for i, g in enumerate(group) if g > 1]
    if len(grouped) != 1 or not shared.power_of_two_block(group[grouped[0]]):
        return f"group_shape {list(group)}: GatherBlockQuantized takes one blocked axis, by a power of two from 16"
    qa, block, rank = grouped[0], int(group[grouped[0]]), codes.ndim
    found = shared.float_scales(view, s, RUNTIME_FLOATS, f"ONNX Runtime's CPU {OP} takes float32 and float16")
    if isinstance(found, str):
        return found
    scales, t = found
    output_dtype = attribute_values(node).get("output_dtype")
    cast = output_dtype is not None and dtypes.by_onnx(output_dtype).name == "float32" and t == "float16"
    if not cast and output_dtype is not None and dtypes.by_onnx(output_dtype).name != t:
        return (f"output_dtype {dtypes.by_onnx(output_dtype).name}: GatherBlockQuantized gives the scales' type, {t} "
                "(or float32 from float16 scales, through a Cast)")
    chain = rw.chain_to(view, node, "Gather", 0, qa, "the data of a Gather")
    if isinstance(chain, str):
        return chain
    nodes, gather, length = chain
    if isinstance(codes, _Described):
        codes = view.constant(src)
    if not codes.shape[qa] - block < length <= codes.shape[qa]:
        return f"Slice keeps {length} of {codes.shape[qa]}: more than the last block's padding"
    ga = int(attribute_values(gather).get("axis", 0)) % rank
    keep = tuple(slice(0, length) if i == qa else slice(None) for i in range(rank))
    zero = view.constant(z) if z else None
    if z and zero is None:
        return "zps is not a constant"
    if kind in ("int4", "uint4"):
        data_type, bits, shift = kind, 4, 0
    else:
        bits = 2 if kind in ("int2", "uint2") else 8
        data_type, shift = "uint8", (1 << (bits - 1)) if kind.startswith("int") else 0
        if ga != 0 or qa != rank - 1:
            return (f"{bits}-bit codes: ONNX Runtime's GatherBlockQuantized takes uint8 data with gather_axis 0 and "
                    f"quantize_axis last, not {ga} and {qa}")
        if bits == 2 and length % 4:
            return f"2-bit codes: rows of {length} codes, not whole bytes of 4 (uint8 data holds 4 codes a byte)"
    code_type = shared.CODE_TYPES[bits] if data_type == "uint8" else data_type  # (uint8 data: codes of `bits` bits)
    lo, hi = dtypes.integer_range(code_type)
    values = codes.astype(np.int64)[keep] + shift
    # the zero points as the contrib op's codes; absent (ours: 0) becomes explicit where its default differs
    zero_values = (np.zeros(scales.shape, np.int64) if zero is None else zero.astype(np.int64)) + shift
    if zero_values.min(initial=lo) < lo or zero_values.max(initial=hi) > hi:
        return f"zero points outside {code_type}'s range"
    return _Chain((src, s, z), codes, values, zero, zero_values, data_type, bits, shift, block, qa, ga, length, nodes,
                  gather, cast)


@rule("DynamicDequantize + Gather -> GatherBlockQuantized", kind=WRITE, pattern=(DOMAIN, "DynamicDequantize"),
      check=says_why(_write_found), targets=("onnxruntime",), makes=OP)
def write(found: _Chain, node: onnx.NodeProto, view: GraphView) -> Rewrite:
    """A DynamicDequantize (and the Gather reading it) as one GatherBlockQuantized."""
    (src, s, z), codes, values = found.inputs, found.codes, found.values
    zero, zero_values = found.zero, found.zero_values
    data_type, bits, shift, block, qa, ga = found.data_type, found.bits, found.shift, found.block, found.qa, found.ga
    length, nodes, gather, rank = found.length, found.nodes, found.gather, found.codes.ndim
    kind = dtypes.name_of(codes.dtype)
    form = shared.lifted_from(node, QUALNAME)
    packed4 = form.get("data") == "uint8" and form.get("bits") == 4 and kind == "uint4" and ga == 0 \
        and qa == rank - 1 and values.shape[-1] % 2 == 0
    if packed4:
        data_type, bits = "uint8", 4
    packed = 4 if packed4 else 2 if bits == 2 else 0  # the bits of the codes packed in uint8 data (0: none)
    default = 1 << (bits - 1) if data_type == "uint8" else 0
    replaced = [node] + nodes + [gather]
    new = rw.Constants(view.names)
    rewritten = packed or shift or length != codes.shape[qa]
    data_name = new.add(shared.pack(values, packed) if packed else shared.as_codes(values, data_type), src) \
        if rewritten else src
    cast = [shared.scales_cast(view, s, gather.name or gather.output[0])] if found.cast else []
    inputs = [data_name, gather.input[1], cast[0].output[0] if cast else s]
    if form.get("zero_points") == "given" or np.any(zero_values != default):
        if z and not rewritten and dtypes.name_of(zero.dtype) == data_type:
            inputs.append(z)  # the zero points as they are
        else:
            if packed:  # each row padded to whole bytes, with what the lifted node had there (0 by default)
                pad = (-zero_values.shape[-1]) % (8 // packed)
                fill = np.full(zero_values.shape[:-1] + (pad,), form.get("zero_points_padding", 0), np.int64)
                zero_data = shared.pack(np.concatenate([zero_values, fill], axis=-1), packed)
            else:
                zero_data = shared.as_codes(zero_values, data_type)
            inputs.append(new.add(zero_data, z) if z else new.add(zero_data, src, "zero_points"))
    attrs = {"block_size": block, "gather_axis": ga, "quantize_axis": qa, "bits": bits}
    # the attributes the lifted node had, as it wrote them (a negative axis stays negative), else the
    # ones that differ from their defaults and those ONNX Runtime's quantizer writes
    had = form.get("attributes") if isinstance(form.get("attributes"), dict) else None
    if had is None:
        had = {k: v for k, v in attrs.items() if k != "bits" or data_type == "uint8"}
    kept = {}
    for k, v in attrs.items():
        old = had.get(k)
        if old is not None and (old == v or (k.endswith("axis") and old % rank == v)):
            kept[k] = old
        elif old is not None or v != DEFAULTS[k]:
            kept[k] = v
    fused = onnx.helper.make_node(OP, inputs, [gather.output[0]], domain=MS_DOMAIN, **kept)
    shared.stand_in(fused, gather)
    shown = f"{QUALNAME} ({data_type} data, block_size {block}, quantize_axis {qa}, gather_axis {ga})"
    if cast:
        shown += ", its float16 scales through a Cast to float32"
    return Rewrite(replaced, cast + [fused], new.tensors, shown, domains={MS_DOMAIN: MS_OPSET}, derived=new.derived)
