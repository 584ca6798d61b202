"""DynamicDequantize-1 to standard ONNX (lowering), and DequantizeLinear back to it (lifting).

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
from dyndq.opdefs import PER_CHANNEL, PER_TENSOR, LiftPlan, LiftRefusal, Needs, TensorSpec

from .lowering_context import LoweringContext
from .onnx_types import attribute_values

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


def _channel_shape(ctx: LoweringContext, src: str, axis: int) -> str | None:
    """A shape [-1, 1, ..., 1] that aligns a 1-D per-channel tensor with src's `axis`
    (None when axis is the last one: the tensor broadcasts as it is)."""
    rank = ctx.spec(src).rank if ctx.spec(src) is not None else None
    if axis < 0:
        trailing = -axis - 1
    elif rank is not None:
        trailing = rank - 1 - axis
    else:  # rank unknown: ones for each dim of src after axis, computed at run time
        dims = ctx.op("Shape", src, hint="src_shape")
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
    if takes_zero_point(ctx.spec(src), zps_spec) and (
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

_LIFTABLE_X = ("int8", "uint8")


@OP.def_lifting(source=("", "DequantizeLinear"))
def dynamic_dequantize_lifting(node: onnx.NodeProto, spec) -> LiftPlan | LiftRefusal:
    """The plan to lift a DequantizeLinear node (`spec(name)` gives a value's TensorSpec
    or None), or the reason it cannot be lifted.

    Liftable: x int8/uint8, x_scale float32 with one element (per tensor) or 1-D
    (per channel, with the node's axis), zero point absent or of x's dtype, no
    block_size, float32 output.
    """
    plan = _plan_or_reason(node, spec)
    return LiftRefusal(plan) if isinstance(plan, str) else plan


def _plan_or_reason(node, spec) -> LiftPlan | str:
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
    if attrs.get("block_size", 0):
        return f"blocked quantization (block_size={attrs['block_size']})"
    if attrs.get("output_dtype", TensorProto.UNDEFINED) not in (TensorProto.UNDEFINED, TensorProto.FLOAT):
        return f"output_dtype {TensorProto.DataType.Name(attrs['output_dtype'])}, not FLOAT"
    if xs is None or xs.dtype is None:
        return "x's dtype is unknown"
    if xs.dtype not in _LIFTABLE_X:
        return f"x is {xs.dtype}, not int8/uint8"
    if ss is None or ss.dtype is None:
        return "x_scale's dtype is unknown"
    if ss.dtype != "float32":
        return f"x_scale is {ss.dtype}, not float32"
    if zp:
        if zs is None or zs.dtype is None:
            return "x_zero_point's dtype is unknown"
        if zs.dtype != xs.dtype:
            return f"x_zero_point is {zs.dtype}, not x's dtype {xs.dtype}"
    if ss.shape is None:
        return "x_scale's shape is unknown"
    inputs = (x, scale) + ((zp,) if zp else ())
    if ss.shape in ((), (1,)):
        if zp and zs.shape not in ((), (1,)):
            return f"x_zero_point has shape {list(zs.shape) if zs.shape is not None else 'unknown'} for a one-element scale"
        return LiftPlan(inputs, {"qtype": PER_TENSOR})
    if len(ss.shape) != 1:
        return f"x_scale has rank {len(ss.shape)} (blocked), not 0 or 1"
    axis = int(attrs.get("axis", 1))
    if xs.rank is not None:
        if xs.rank == 0 or not -xs.rank <= axis < xs.rank:
            return f"axis {axis} out of range for x of rank {xs.rank}"
    if zp and (zs.shape is None or len(zs.shape) != 1):
        return "x_zero_point's shape is not known to be 1-D"
    return LiftPlan(inputs, {"qtype": PER_CHANNEL, "axis": axis})
