"""DynamicDequantize to standard ONNX (lowering), and DequantizeLinear back to it (lifting).

The parts attached to the op versions (`def_lowering`, `def_lowering_needs`, `def_lifting`)
convert one node; converters/op_parts.py applies them as rules.  Two rules of this module
take more than one node: a blocked DequantizeLinear whose last block is short lifts to a
padded DynamicDequantize + Slice, and export joins those two back.

Lowering, per node form:

- zps absent, or of src's dtype: one DequantizeLinear.  per_tensor gets a true
  scalar scale and zero point (a Reshape to [] unless the input is known to be
  rank 0); per_channel gets an explicit `axis` (opset >= 13) and a one-element
  zps is Expanded to the shape of scales.
- zps of another dtype (int32; int8 zps on uint8 src, or the reverse), which
  DequantizeLinear cannot take: Cast(src, int64) - Cast(zp, int64), Cast to
  float, Mul by the scale.  The subtraction in int64 cannot overflow; the Cast
  to float rounds to nearest even and the Mul is one float32 multiply, which is
  exactly the op's arithmetic `float32(int64(src) - int64(zp)) * scale`.
  (The same route is taken when the dtypes are unknown, e.g. inside a
  model-local function: it is exact for every combination.)

Scales and zero points are always treated as values computed at run time: the
lowering reshapes and expands them with ops, never by reading their data.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1 as OP
from dyndq.opdefs import DYNAMIC_DEQUANTIZE_2 as OP2
from dyndq.opdefs import PER_CHANNEL, PER_GROUP, PER_TENSOR, LiftPlan, Needs, Refusal, TensorSpec, dtypes
from dyndq.plumbing.ir import INT4_IR
from dyndq.plumbing.types import attribute_values

from . import rewrite as rw
from .engines import ENGINES, Engine, engine
from .lowering_context import LoweringContext
from .rewrite import GraphView, Rewrite, context, inputs_of, slice_to, stand_in
from .rules import LIFT, LOWER, rule

# DequantizeLinear's per-axis form (1-D scale with `axis`) needs this ai.onnx opset.
PER_CHANNEL_DQL_OPSET = 13
# DequantizeLinear itself (per tensor, scalar scale) needs this one.
DQL_OPSET = 10


def takes_zero_point(src: TensorSpec | None, zps: TensorSpec | None) -> bool:
    """Whether DequantizeLinear can take the node's zero point: absent (None), or known
    to have src's dtype."""
    if zps is None:
        return True
    return src is not None and src.dtype is not None and src.dtype == zps.dtype


@OP.def_lowering_needs
def dynamic_dequantize_needs(
    src: TensorSpec | None,
    scales: TensorSpec | None,
    zps: TensorSpec | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
) -> Needs:
    """The ai.onnx opset a node's lowering needs (inputs: their specs; an unknown one is
    TensorSpec(None, None), an absent one None): 13 for per_channel DequantizeLinear
    with `axis`; 10 for per_tensor DequantizeLinear and for the integer route."""
    if qtype == PER_CHANNEL and takes_zero_point(src, zps):
        return Needs(PER_CHANNEL_DQL_OPSET, why="per_channel DequantizeLinear with axis")
    if takes_zero_point(src, zps):
        return Needs(DQL_OPSET, why="DequantizeLinear")
    return Needs(DQL_OPSET, why="Cast, Sub and Mul (zero points of another dtype than src)")


def _known_shape(spec: TensorSpec | None):
    return None if spec is None else spec.shape


def _scalar(ctx: LoweringContext, name: str, hint: str) -> str:
    """The one-element tensor `name` as a true scalar (shape [])."""
    if _known_shape(ctx.spec(name)) == ():
        return name
    return ctx.op("Reshape", name, ctx.const(np.zeros((0,), np.int64), "scalar_shape"), hint=hint)


def _channel_shape(ctx: LoweringContext, src: str, axis: int, wide: str | None = None) -> str | None:
    """A shape [-1, 1, ..., 1] that aligns a 1-D per-channel tensor with src's `axis`
    (None when axis is the last one: the tensor broadcasts as it is).  Where src's rank is known
    only at run time, it is read off `wide` (src Cast to int64: ORT has no Shape of int4)."""
    rank = ctx.spec(src).rank if ctx.spec(src) is not None else None
    if axis < 0:
        trailing = -axis - 1
    elif rank is not None:
        trailing = rank - 1 - axis
    else:  # rank unknown: ones for each dim of src after axis, computed at run time
        dims = ctx.op("Shape", wide or src, hint="src_shape")
        after = ctx.op(
            "Slice", dims,
            ctx.const(np.array([axis + 1], np.int64), "after_axis"),
            ctx.const(np.array([np.iinfo(np.int64).max], np.int64), "end"),
            hint="dims_after_axis",
        )
        zeros = ctx.op("Mul", after, ctx.const(np.array(0, np.int64), "zero"), hint="zeros")
        ones = ctx.op("Add", zeros, ctx.const(np.array(1, np.int64), "one"), hint="ones")
        return ctx.op("Concat", ctx.const(np.array([-1], np.int64), "minus_one"), ones, axis=0, hint="channel_shape")
    if trailing == 0:
        return None
    return ctx.const(np.array([-1] + [1] * trailing, np.int64), "channel_shape")


@OP.def_lowering
def dynamic_dequantize(
    ctx: LoweringContext,
    src: str,
    scales: str,
    zps: str | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
) -> str:
    """Lower one DynamicDequantize-1; return the name of the value holding dst."""
    zps = zps or None
    zps_spec = (ctx.spec(zps) or TensorSpec(None, None)) if zps else None
    if takes_zero_point(ctx.spec(src), zps_spec) and (zps is None or engine(ctx.target).dql_zero_points) and (
        qtype == PER_TENSOR or ctx.opset >= PER_CHANNEL_DQL_OPSET
    ):
        if qtype == PER_TENSOR:
            inputs = [src, _scalar(ctx, scales, "scale")]
            if zps:
                inputs.append(_scalar(ctx, zps, "zero_point"))
            ctx.form = "DequantizeLinear"
            return ctx.op("DequantizeLinear", *inputs, hint="dst")
        ctx.form = "DequantizeLinear"
        inputs = [src, scales]
        if zps:
            zshape, sshape = _known_shape(ctx.spec(zps)), _known_shape(ctx.spec(scales))
            if zshape is None or zshape != sshape:  # one zero point for every channel (or not known not to be)
                zps = ctx.op("Expand", zps, ctx.op("Shape", scales, hint="scales_shape"), hint="zero_point")
            inputs.append(zps)
        return ctx.op("DequantizeLinear", *inputs, axis=int(axis), hint="dst")

    # Exact integer arithmetic: float32(int64(src) - int64(zp)) * scale.
    ctx.form = "integer arithmetic"
    if qtype == PER_TENSOR:
        scale = _scalar(ctx, scales, "scale")
        zp = _scalar(ctx, zps, "zero_point") if zps else None
    else:
        shape = _channel_shape(ctx, src, int(axis))
        scale = scales if shape is None else ctx.op("Reshape", scales, shape, hint="scale")
        zp = zps if shape is None or not zps else ctx.op("Reshape", zps, shape, hint="zero_point")
    x = ctx.op("Cast", src, to=TensorProto.INT64, hint="src_int64")
    if zp is not None:
        x = ctx.op("Sub", x, ctx.op("Cast", zp, to=TensorProto.INT64, hint="zero_point_int64"), hint="centered")
    x = ctx.op("Cast", x, to=TensorProto.FLOAT, hint="centered_float")
    return ctx.op("Mul", x, scale, hint="dst")


# -- lifting: DequantizeLinear -> DynamicDequantize --------------------------------------------

@OP.def_lifting(source=("", "DequantizeLinear"))
def dynamic_dequantize_lifting(node: onnx.NodeProto, spec) -> LiftPlan | Refusal:
    """The plan to lift a DequantizeLinear node (`spec(name)` gives a value's TensorSpec
    or None) to version 1, or the reason it cannot be lifted.

    Liftable: x int8/uint8, x_scale float32 with one element (per tensor) or 1-D
    (per channel, with the node's axis), zero point absent or of x's dtype, no
    block_size, float32 output.
    """
    plan = _plan_or_reason(node, spec, OP)
    return Refusal(plan) if isinstance(plan, str) else plan


def _plan_or_reason(node, spec, op) -> LiftPlan | str:
    """What op version `op` takes is read off its definition: x of src's dtypes, x_scale of
    scales', block_size only when it has per_group."""
    x_dtypes, scale_dtypes = op.allowed_dtypes("src"), op.allowed_dtypes("scales")
    blocks = PER_GROUP in op.attribute("qtype").allowed
    attrs = attribute_values(node)
    names = list(node.input)
    while names and not names[-1]:
        names.pop()
    if len(names) < 2:
        return "fewer than 2 inputs"
    x, scale = names[0], names[1]
    zp = names[2] if len(names) > 2 else None
    xs, ss = spec(x), spec(scale)
    zs = spec(zp) if zp else None
    block = attrs.get("block_size", 0)
    if block and not blocks:
        return f"blocked quantization (block_size={block})"
    if xs is None or xs.dtype is None:
        return "x's dtype is unknown"
    if xs.dtype not in x_dtypes:
        return f"x is {xs.dtype}, not {'/'.join(x_dtypes)}"
    if ss is None or ss.dtype is None:
        return "x_scale's dtype is unknown"
    if ss.dtype not in scale_dtypes:
        return f"x_scale is {ss.dtype}, not {'/'.join(scale_dtypes)}"
    out = attrs.get("output_dtype", TensorProto.UNDEFINED)
    kept = {}  # output_dtype, where the op version has it and it says more than the scales' dtype
    if out != TensorProto.UNDEFINED and dtypes.by_onnx(out).name != ss.dtype:
        if op.attribute("output_dtype") is None:
            return f"output_dtype {TensorProto.DataType.Name(out)}, not x_scale's dtype {ss.dtype}"
        if dtypes.by_onnx(out).name not in op.allowed_dtypes("dst"):
            return f"output_dtype {TensorProto.DataType.Name(out)}, not {'/'.join(op.allowed_dtypes('dst'))}"
        kept = {"output_dtype": int(out)}
    if zp:
        if zs is None or zs.dtype is None:
            return "x_zero_point's dtype is unknown"
        if zs.dtype != xs.dtype:
            return f"x_zero_point is {zs.dtype}, not x's dtype {xs.dtype}"
    if ss.shape is None:
        return "x_scale's shape is unknown"
    inputs = (x, scale) + ((zp,) if zp else ())
    axis = int(attrs.get("axis", 1))
    plan = _shaped_plan(inputs, xs, ss, zs, zp, axis, block)
    return plan if isinstance(plan, str) else LiftPlan(plan.inputs, {**plan.attrs, **kept})


def _shaped_plan(inputs, xs, ss, zs, zp, axis, block) -> LiftPlan | str:
    """The qtype (and axis or group_shape) of a DequantizeLinear of these shapes."""
    if block:
        return _blocked_plan(inputs, xs, ss, zs, axis, block)
    if ss.shape in ((), (1,)):
        if zp and zs.shape not in ((), (1,)):
            return f"x_zero_point has shape {list(zs.shape) if zs.shape is not None else 'unknown'} for a one-element scale"
        return LiftPlan(inputs, {"qtype": PER_TENSOR})
    if len(ss.shape) != 1:
        return f"x_scale has rank {len(ss.shape)} (blocked), not 0 or 1"
    if xs.rank is not None:
        if xs.rank == 0 or not -xs.rank <= axis < xs.rank:
            return f"axis {axis} out of range for x of rank {xs.rank}"
    if zp and (zs.shape is None or len(zs.shape) != 1):
        return "x_zero_point's shape is not known to be 1-D"
    return LiftPlan(inputs, {"qtype": PER_CHANNEL, "axis": axis})


def _blocked_plan(inputs, xs, ss, zs, axis, block) -> LiftPlan | str:
    """Blocked DequantizeLinear-21 as per_group: groups of `block` along axis, 1 elsewhere
    (only when every dim of x is known and divides exactly: ONNX rounds the block count up)."""
    if xs.shape is None or not all(isinstance(d, int) for d in xs.shape):
        return "x's shape is not fully known (per_group needs exact division)"
    r = len(xs.shape)
    if r == 0 or not -r <= axis < r:
        return f"axis {axis} out of range for x of rank {r}"
    a = axis % r
    if xs.shape[a] % block:
        return f"x.shape[{a}] = {xs.shape[a]} is not a multiple of block_size {block}"
    want = tuple(d // block if i == a else d for i, d in enumerate(xs.shape))
    if tuple(ss.shape) != want:
        return f"x_scale has shape {list(ss.shape)}, not {list(want)}"
    if zs is not None and (zs.shape is None or tuple(zs.shape) != want):
        return "x_zero_point is not shaped like x_scale"
    return LiftPlan(inputs, {"qtype": PER_GROUP, "group_shape": tuple(block if i == a else 1 for i in range(r))})


# == DynamicDequantize-2 ==========================================================================
#
# Version 2's forms, each lowered bit-exact for ONNX Runtime.  What decides the routes (checked
# on ORT 1.27 to 1.32, CPU): ORT's DequantizeLinear takes float32 and float16 scales only, treats
# any one-element scale as per tensor (and then refuses a block_size), refuses a one-element
# zero point beside a per-axis scale; ORT has no int4 Reshape/Expand, no bfloat16 Expand, and no
# float16/bfloat16 arithmetic of its own.
#
# - "v1": a node version 1 expresses (int8/uint8 src, float32 scales, per_tensor/per_channel,
#   zps absent or int8/uint8/int32): version 1's lowering, unchanged.
# - "tensor", "channel", "block": zps absent or of src's dtype, float32/float16/bfloat16
#   scales: one DequantizeLinear, per tensor (true scalars), per axis (explicit axis), or
#   blocked (DequantizeLinear-21 axis + block_size; all group sizes 1 is block_size 1).  A
#   per_group node whose scales hold one element is the per-tensor form (ORT would refuse the
#   block_size).  float16 and bfloat16 scales are Cast to float32 first and the float32 result
#   Cast to T2: the float32 product rounds once to T2, exactly the op's arithmetic.  (ORT's
#   DequantizeLinear takes float16 scales, but drops NaN payloads where the rest keeps them;
#   a float16 dst NaN is made the one quiet NaN 0x7E00 before the Cast, see `_narrow`.)
# - "integer": everything else (zps of another dtype than src, a one-element zps under
#   per_channel, more than one grouped dim, an int4 zero point that would need a Reshape, a
#   per_group scales that may hold one element at run time, unknown dtypes): Cast src and zps to
#   int64, Sub, Cast to float32, Mul by the float32 scales, Cast to T2.  The int64 subtraction
#   is exact (never int32: full-range int32 zero points overflow; never float16/bfloat16);
#   broadcasting is done by Reshape/Gather of the float32 scales and int64 zps only.  Where
#   the dtype of scales is not known (inside a model-local function) the product is CastLike'd
#   to it, its NaNs made 0x7E00 first when that dtype turns out float16 at run time.


INT4_OPSET = 21  # DequantizeLinear and Cast with int4/uint4, and blocked DequantizeLinear
BFLOAT16_OPSET = dtypes.by_name("bfloat16").opset  # Cast to and from bfloat16 (13)
RANGE_OPSET = 11  # per_group broadcasting (Range)
CASTLIKE_OPSET = 15  # dst's dtype taken from scales when it is not known
_V1_SRC, _V1_ZPS = ("int8", "uint8"), ("int8", "uint8", "int32")
_INT4 = ("int4", "uint4")
_T2 = ("float32", "float16", "bfloat16")
# dtypes of under 8 bits, which ONNX Runtime neither Reshapes nor Expands
SUB_BYTE = tuple(d.name for d in dtypes.DTYPES if 0 < d.bits < 8)  # int4, uint4, int2, uint2, float4, float6


def _dtype(spec: TensorSpec | None) -> str | None:
    return None if spec is None else spec.dtype


def _grouped(group_shape) -> list[int]:
    return [i for i, g in enumerate(group_shape or ()) if g > 1]


def _may_hold_one_element(shape) -> bool:
    """Whether a tensor of this (possibly partly symbolic) shape may hold one element at run time."""
    return shape is None or all(not isinstance(d, int) or d == 1 for d in shape)


def _route(src, scales, zps, qtype, group_shape, engine: Engine = ENGINES["onnx"]) -> str:
    """"v1", "tensor", "channel", "block" or "integer" (see the comment above)."""
    s, t, z = _dtype(src), _dtype(scales), _dtype(zps)
    if qtype != PER_GROUP and s in _V1_SRC and t == "float32" and (zps is None or z in _V1_ZPS and engine.dql_zero_points):
        return "v1"
    if t not in _T2 or not takes_zero_point(src, zps):
        return "integer"
    return dql_route(src, scales, zps, qtype, group_shape, engine)


def dql_route(src, scales, zps, qtype, group_shape, engine: Engine) -> str:
    """"tensor", "channel" or "block": the DequantizeLinear that takes a node of these shapes on
    `engine`; "integer" where none does (the dtypes are judged by the caller)."""
    z = _dtype(zps)
    if zps is not None and not engine.dql_zero_points:
        return "integer"
    zshape, sshape = _known_shape(zps), _known_shape(scales)
    if qtype == PER_GROUP:
        if len(_grouped(group_shape)) > 1:
            return "integer"
        if sshape is not None and all(isinstance(d, int) for d in sshape) and int(np.prod(sshape)) == 1:
            qtype = PER_TENSOR  # one scale for the whole tensor: DequantizeLinear per tensor
        elif _may_hold_one_element(sshape):
            return "integer"  # ORT would take a one-element scale as per tensor and refuse block_size
        elif not engine.rank1_blocked and (src is None or src.rank in (None, 1)):
            return "integer"  # (OpenVINO refuses a blocked DequantizeLinear of rank 1)
        else:
            return "block"
    if qtype == PER_TENSOR:
        # a zero point that is not a true scalar needs a Reshape, which ORT lacks for int4; one of
        # shape [1] beside a true scalar scale it takes as it is (ONNX's own int4 test case has it)
        return "integer" if zps is not None and z in SUB_BYTE and zshape not in ((), (1,)) else "tensor"
    # per_channel: a one-element zero point beside per-axis scales (ORT refuses it; int4 cannot be Expanded)
    if zps is not None and (zshape is None or zshape != sshape):
        return "integer"
    return "channel"


@OP2.def_lowering_needs
def dynamic_dequantize_2_needs(
    src: TensorSpec | None,
    scales: TensorSpec | None,
    zps: TensorSpec | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
    group_shape: tuple[int, ...] | None = None,
) -> Needs:
    """The ai.onnx opset and IR version a node's lowering needs, and why: version 1's needs for
    the forms version 1 expresses; 21 and IR 10 with int4/uint4; 21 for blocks; 13 for
    per-axis DequantizeLinear and Cast to bfloat16;
    11 for per_group broadcasting; 15 for CastLike when the dtype of scales is unknown."""
    route = _route(src, scales, zps, qtype, group_shape)
    if route == "v1":
        return dynamic_dequantize_needs(src, scales, zps, qtype=qtype, axis=axis)
    int4 = _dtype(src) in _INT4 or _dtype(zps) in _INT4
    # Inside a model-local function nothing is typed: src or zps may be int4, and the Cast from
    # int4 needs opset 21 (and IR 10), so an unknown dtype is taken to need what int4 needs.
    unknown = _dtype(src) is None or (zps is not None and _dtype(zps) is None)
    t = _dtype(scales)
    opset, why = {
        "tensor": (DQL_OPSET, ["DequantizeLinear"]),
        "channel": (PER_CHANNEL_DQL_OPSET, ["per_channel DequantizeLinear with axis"]),
        "block": (INT4_OPSET, ["blocked DequantizeLinear (block_size)"]),
        "integer": (DQL_OPSET, ["Cast, Sub and Mul"]),
    }[route]
    if route == "integer":
        if qtype == PER_GROUP:
            opset, why = RANGE_OPSET, why + ["per_group broadcasting (Range, Gather)"]
        if t is None:
            opset, why = max(opset, CASTLIKE_OPSET), why + ["CastLike to the unknown dtype of scales"]
    if t == "bfloat16":
        opset, why = max(opset, BFLOAT16_OPSET), why + ["Cast to bfloat16"]
    if int4:
        opset, why = max(opset, INT4_OPSET), why + ["int4/uint4 tensors"]
    elif unknown:
        opset, why = max(opset, INT4_OPSET), why + ["Cast from src/zps of unknown dtype, perhaps int4"]
    return Needs(opset, INT4_IR if int4 or unknown else 3, ", ".join(why))


@OP2.def_lowering
def dynamic_dequantize_2(
    ctx: LoweringContext,
    src: str,
    scales: str,
    zps: str | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
    group_shape: tuple[int, ...] | None = None,
) -> str:
    """Lower one DynamicDequantize-2; return the name of the value holding dst."""
    zps = zps or None
    zps_spec = (ctx.spec(zps) or TensorSpec(None, None)) if zps else None
    scales_spec = ctx.spec(scales) or TensorSpec(None, None)
    route = _route(ctx.spec(src) or TensorSpec(None, None), scales_spec, zps_spec, qtype, group_shape,
                   engine(ctx.target))
    if route == "v1":
        return dynamic_dequantize(ctx, src, scales, zps, qtype=qtype, axis=axis)
    t = scales_spec.dtype
    # float32 in, one rounding to T2 after (ORT's DequantizeLinear has no bfloat16 kernel, and its
    # float16 one drops NaN payloads that its Cast and the kernel keep)
    scale = float32_scales(ctx, scales, t)
    if route != "integer":
        y = dequantize_linear(ctx, route, src, scale, zps, zps_spec, axis, group_shape)
    else:
        ctx.form = "integer arithmetic"
        y = integer_arithmetic(ctx, src, src, zps, scale, qtype, axis, group_shape, t)
    return to_output(ctx, y, t, scales)


def float32_scales(ctx: LoweringContext, scales: str, t: str | None) -> str:
    """The scales as float32 (exact: float16, bfloat16 and float8e8m0 values are float32 values)."""
    return scales if t == "float32" else ctx.op("Cast", scales, to=TensorProto.FLOAT, hint="scales_float")


def dequantize_linear(ctx: LoweringContext, route: str, src: str, scale: str, zps: str | None, zps_spec, axis,
                      group_shape, **attrs) -> str:
    """One DequantizeLinear of a route's form ("tensor": true scalars; "channel": along axis;
    "block": along the one grouped dim of group_shape, its block_size), on float32 scales (or as
    `attrs`' output_dtype says); the name of its output."""
    ctx.form = "DequantizeLinear"
    if route == "tensor":
        zero = zps if zps is None or _dtype(zps_spec) in SUB_BYTE else _scalar(ctx, zps, "zero_point")
        inputs = [src, _scalar(ctx, scale, "scale")] + ([zero] if zps else [])
        return ctx.op("DequantizeLinear", *inputs, hint="dst", **attrs)
    if route == "channel":
        return ctx.op("DequantizeLinear", src, scale, *([zps] if zps else []), axis=int(axis), hint="dst", **attrs)
    grouped = _grouped(group_shape)
    a = grouped[0] if grouped else 0
    return _blocks(ctx, src, scale, zps, a, group_shape[a], **attrs)


def _blocks(ctx: LoweringContext, src: str, scale: str, zps: str | None, axis: int, block: int, **attrs) -> str:
    ctx.form = "DequantizeLinear (blocked)"
    return ctx.op("DequantizeLinear", src, scale, *([zps] if zps else []), axis=int(axis), block_size=int(block),
                  hint="dst", **attrs)


def integer_arithmetic(ctx: LoweringContext, src: str, codes: str, zps: str | None, scale: str, qtype, axis,
                       group_shape, out: str | None, scales_first: bool = False) -> str:
    """float32(int64(codes) - int64(zps)) * scale, scale and zero points broadcast against src
    (`codes`: src's values, or src itself); the name of the float32 product.  scales_first: the
    Mul takes the scales first (where the engine keeps the second operand's NaN)."""
    zp = ctx.op("Cast", zps, to=TensorProto.INT64, hint="zero_point_int64") if zps else None
    x = ctx.op("Cast", codes, to=TensorProto.INT64, hint="src_int64")
    scale, zp = _broadcastable(ctx, src, x, scale, zp, qtype, axis, group_shape)
    if zp is not None:
        x = ctx.op("Sub", x, zp, hint="centered")
    x = ctx.op("Cast", x, to=TensorProto.FLOAT, hint="centered_float")
    return ctx.op("Mul", *((scale, x) if scales_first else (x, scale)), hint="dst" if out == "float32" else "dst_float")


def to_output(ctx: LoweringContext, y: str, out: str | None, scales: str) -> str:
    """The float32 product as the output dtype: rounded once (`_narrow`), or, where the dtype is not
    known (inside a model-local function, dst takes the scales' dtype, whatever it is), CastLike."""
    if out is None:
        return ctx.op("CastLike", _quiet_nans_if_float16(ctx, y, scales), scales, hint="dst")
    return y if out == "float32" else _narrow(ctx, y, out)


def _narrow(ctx: LoweringContext, y: str, t: str) -> str:
    """The float32 product as T2: one rounding, to nearest even.  For float16, NaNs are first
    made the one quiet NaN: ORT's float32 -> float16 Cast keeps a NaN's payload in its
    vector loop (blocks of 8) and drops it in its scalar tail, so only a payload-free NaN
    comes out the same everywhere (0x7E00, as the kernel gives every float16 NaN)."""
    if t == "float16":
        nan = ctx.const(np.array(np.nan, np.float32), "quiet_nan")
        y = ctx.op("Where", ctx.op("IsNaN", y, hint="is_nan"), nan, y, hint="dst_quiet_nan")
    return ctx.op("Cast", y, to=dtypes.by_name(t).onnx, hint="dst")


def _quiet_nans_if_float16(ctx: LoweringContext, y: str, scales: str) -> str:
    """`_narrow`'s canonical NaN where dst's dtype is known only at run time (inside a
    model-local function, one lowering serves every call, whatever the dtype of scales): the
    NaNs of the float32 product are made the one quiet NaN exactly when scales are float16,
    and float32 and bfloat16 NaNs are left as the kernel leaves them.  2**16 is finite in
    float32 and bfloat16 and rounds to infinity in float16 (largest finite 65504), so
    IsInf(Cast(CastLike(2**16, scales), float32)) is true exactly for float16 scales."""
    big = ctx.op("CastLike", ctx.const(np.array(2.0**16, np.float32), "two_to_16"), scales, hint="two_to_16_as_dst")
    is_float16 = ctx.op("IsInf", ctx.op("Cast", big, to=TensorProto.FLOAT, hint="two_to_16_back"), hint="dst_is_float16")
    quiet = ctx.op("And", ctx.op("IsNaN", y, hint="is_nan"), is_float16, hint="nan_to_quiet")
    nan = ctx.const(np.array(np.nan, np.float32), "quiet_nan")
    return ctx.op("Where", quiet, nan, y, hint="dst_quiet_nan")


def _broadcastable(ctx, src, wide, scale, zp, qtype, axis, group_shape):
    """The float32 scales and int64 zero points shaped to broadcast against src, whose shape is
    read at run time off `wide`, src already Cast to int64 (never an int4 or bfloat16 tensor
    reshaped, nor its Shape taken: ORT has no kernels for those)."""
    if qtype == PER_TENSOR:
        return _scalar(ctx, scale, "scale"), None if zp is None else _scalar(ctx, zp, "zero_point")
    if qtype == PER_CHANNEL:
        shape = _channel_shape(ctx, src, int(axis), wide)
        if shape is None:
            return scale, zp
        scale = ctx.op("Reshape", scale, shape, hint="scale")
        if zp is not None:
            zp = ctx.op("Reshape", zp, shape, hint="zero_point")  # a one-element zp stays one element
        return scale, zp
    # per_group: along each grouped dim i, element j of src takes scale j // g_i: a Gather of
    # the scales (and zps) with indices Range(0, src.shape[i]) / g_i, computed at run time.
    # (Not Unsqueeze/Expand/Reshape to src's shape: Reshape reads a 0 in the target shape as
    # "keep this dim", which breaks empty tensors.)
    src_shape = None
    for i in _grouped(group_shape):
        if src_shape is None:
            src_shape = ctx.op("Shape", wide, hint="src_shape")
            zero, one = ctx.const(np.array(0, np.int64), "zero"), ctx.const(np.array(1, np.int64), "one")
        dim = ctx.op("Gather", src_shape, ctx.const(np.array(i, np.int64), f"dim{i}"), axis=0, hint=f"src_dim{i}")
        positions = ctx.op("Range", zero, dim, one, hint=f"positions{i}")
        index = ctx.op("Div", positions, ctx.const(np.array(group_shape[i], np.int64), f"group{i}"), hint=f"group_index{i}")
        scale = ctx.op("Gather", scale, index, axis=i, hint=f"scale_along{i}")
        if zp is not None:
            zp = ctx.op("Gather", zp, index, axis=i, hint=f"zero_point_along{i}")
    return scale, zp


@OP2.def_lifting(source=("", "DequantizeLinear"))
def dynamic_dequantize_2_lifting(node: onnx.NodeProto, spec) -> LiftPlan | Refusal:
    """Version 2 takes what version 1 does and also: int4/uint4 x, float16/bfloat16 x_scale
    (with output_dtype absent or equal), and blocked DequantizeLinear-21 (block_size) as
    per_group when every dim of x is known and divides exactly."""
    plan = _plan_or_reason(node, spec, OP2)
    return Refusal(plan) if isinstance(plan, str) else plan


def _padded_check(node: onnx.NodeProto, view: GraphView):
    """(x's name, its codes, the blocked axis, the padded shape, the plan) of a blocked
    DequantizeLinear-21 on constant x whose blocked axis is not a multiple of block_size; a
    Refusal, not `mine`, for every other node (the op versions' lifting judges those)."""
    attrs = attribute_values(node)
    block = int(attrs.get("block_size", 0))
    if block <= 0:
        return Refusal("not blocked", mine=False)
    x = inputs_of(node, 1)[0]
    codes = view.constant(x) if x else None
    if codes is None or codes.ndim == 0:
        return Refusal("x is not a constant tensor", mine=False)
    axis = int(attrs.get("axis", 1))
    if not -codes.ndim <= axis < codes.ndim or codes.shape[axis] % block == 0:
        return Refusal("no short last block", mine=False)
    axis %= codes.ndim
    padded_shape = tuple(-(-d // block) * block if i == axis else d for i, d in enumerate(codes.shape))
    plan = _plan_or_reason(node, lambda name: TensorSpec(dtypes.name_of(codes.dtype), padded_shape) if name == x
                           else view.spec(name), OP2)
    if isinstance(plan, str):
        return Refusal(plan, mine=False)
    return x, codes, axis, padded_shape, plan


@rule("DequantizeLinear (short last block) -> DynamicDequantize (padded) + Slice", kind=LIFT,
      pattern=("", "DequantizeLinear"), check=_padded_check)
def lift_padded_blocks(found, node: onnx.NodeProto, view: GraphView) -> Rewrite:
    """A blocked DequantizeLinear-21 on constant x whose blocked axis is not a multiple of
    block_size (ONNX rounds the block count up; per_group divides exactly), as
    DynamicDequantize-2 per_group on x padded with zeros to whole blocks, then a Slice back to
    x's length: what ONNX Runtime's quantizer writes (QDQ) for a K that is not a multiple of the
    block."""
    x, codes, axis, padded_shape, plan = found
    padding = [(0, p - d) for p, d in zip(padded_shape, codes.shape)]
    new = rw.Constants(view.names)
    name = new.add(np.pad(codes.astype(np.int64), padding).astype(codes.dtype), x)  # (int4 has no np.pad of its own)
    ctx = context(view, node.name or node.output[0])
    group = plan.attrs["group_shape"]
    dst = ctx.op(OP2.name, name, *plan.inputs[1:], domain=OP2.domain, hint="padded", qtype=PER_GROUP,
                 group_shape=[int(g) for g in group])
    out = slice_to(ctx, dst, axis, codes.shape[axis])
    ctx.output_as(out, node.output[0])
    stand_in(ctx.nodes[-1], node)
    return rw.lifted(node, ctx, new, f"DynamicDequantize per_group {list(group)} (padded) + Slice", padded=True)


def _short_block_check(node: onnx.NodeProto, view: GraphView):
    """(codes, axis, block, the Slice, the length it keeps, the scales' dtype) of a
    DynamicDequantize-2 per_group on constant codes grouped along one axis whose one reader is a
    Slice cutting the padding of the last group off that axis; a Refusal (not `mine` when the
    node is not of that shape)."""
    qtype, group = rw.ddq_attrs(node)
    src, scales, zps = inputs_of(node, 3)
    codes = view.constant(src) if src else None
    grouped = [i for i, g in enumerate(group or ()) if g > 1]
    if qtype != PER_GROUP or codes is None or codes.ndim != len(group) or len(grouped) != 1:
        return Refusal("not per_group on constant codes along one axis", mine=False)
    axis, block = grouped[0], int(group[grouped[0]])
    readers = view.consumers(node.output[0])
    if len(readers) != 1 or view.is_output(node.output[0]) or list(readers[0].input[:1]) != [node.output[0]]:
        return Refusal("not read by one Slice", mine=False)
    cut = readers[0]
    prefix = rw.sliced_prefix(view, cut, codes.ndim)
    if prefix is None or prefix[0] != axis or not codes.shape[axis] - block < prefix[1] < codes.shape[axis]:
        return Refusal("its Slice does not cut the last group's padding", mine=False)
    s_spec, z_spec = view.spec(scales), view.spec(zps) if zps else None
    src_type = dtypes.name_of(codes.dtype)
    if any(a.name == "output_dtype" for a in node.attribute):
        # (version 3 writing a dtype of its own: its own lowering, which writes it, takes the node)
        return Refusal("an output_dtype of its own", mine=False)
    if src_type not in OP2.allowed_dtypes("src"):
        # (DequantizeLinear-21's codes: version 3's others need a newer opset, and some engine
        # lacks them, which a rule cannot see; the op's own lowering, then the Slice, chooses per target)
        return Refusal(f"{src_type} codes: not DequantizeLinear-21's", mine=False)
    e = engine(view.options.get("target", "onnx"))
    if src_type not in e.dql_codes or not e.holds(src_type) or not e.short_last_block:
        # (the op's own lowering then takes the node, in a form the engine runs, and the Slice stays)
        return Refusal(f"{e.title}'s DequantizeLinear takes no {src_type} codes with a short last block", mine=False)
    if s_spec is None or s_spec.dtype not in _T2 or (zps and (z_spec is None or z_spec.dtype != src_type)):
        return Refusal("the scales' dtype is unknown, or the zero points' dtype is not the codes' "
                       "(DequantizeLinear needs both)")
    return codes, axis, block, cut, prefix[1], s_spec.dtype


@rule("DynamicDequantize (padded) + Slice -> DequantizeLinear (short last block)", kind=LOWER,
      pattern=(OP2.domain, OP2.name), check=_short_block_check, order=0)
def lower_padded_blocks(found, node: onnx.NodeProto, view: GraphView) -> Rewrite:
    """The way back of `lift_padded_blocks`: the DynamicDequantize-2 and its Slice as one blocked
    DequantizeLinear-21 on the codes without their padding (ONNX allows a short last block;
    per_group does not).  DequantizeLinear takes that form where ONNX Runtime fuses it with a
    MatMul reading it, and a Slice in between stops that fusion."""
    codes, axis, block, cut, length, t = found
    src, scales, zps = inputs_of(node, 3)
    new = rw.Constants(view.names)
    keep = tuple(slice(0, length) if i == axis else slice(None) for i in range(codes.ndim))
    short = new.add(codes[keep], src)
    ctx = context(view, cut.name or cut.output[0])
    y = to_output(ctx, _blocks(ctx, short, float32_scales(ctx, scales, t), zps, axis, block), t, scales)
    ctx.output_as(y, cut.output[0])
    stand_in(ctx.nodes[-1], cut)
    return Rewrite([node, cut], list(ctx.nodes), new.tensors,
                   "DequantizeLinear (blocked, the last block short)", domains={"": INT4_OPSET},
                   derived=new.derived, needs_why="blocked DequantizeLinear")
