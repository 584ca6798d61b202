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

The converter receives a lowering context first (`LoweringContext`), then the
op's inputs as value names and its attributes; it adds nodes to the context
and returns the name of the value that holds dst.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1 as OP
from dyndq.opdefs import PER_CHANNEL, PER_TENSOR, TensorSpec

# DequantizeLinear's per-axis form (1-D scale with `axis`) needs this ai.onnx opset.
PER_CHANNEL_DQL_OPSET = 13
# DequantizeLinear itself (per tensor, scalar scale) needs this one.
DQL_OPSET = 10


def takes_zero_point(src: TensorSpec | None, zps: TensorSpec | None, has_zps: bool) -> bool:
    """Whether DequantizeLinear can take the node's zero point: absent, or known to have src's dtype."""
    if not has_zps:
        return True
    return src is not None and zps is not None and src.dtype is not None and src.dtype == zps.dtype


def required_opset(qtype: str, src: TensorSpec | None = None, zps: TensorSpec | None = None,
                   has_zps: bool = False) -> int:
    """The lowest ai.onnx opset at which a node lowers to its preferred form: 13 for
    per_channel DequantizeLinear (with axis); 10 for per_tensor DequantizeLinear and
    for the integer-arithmetic route (zps of another dtype, or dtypes not known)."""
    if qtype == PER_CHANNEL and takes_zero_point(src, zps, has_zps):
        return PER_CHANNEL_DQL_OPSET
    return DQL_OPSET


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


@dataclass
class LoweringContext:
    """What a converter needs to lower one node.

    `opset` is the target ai.onnx opset; `spec(name)` the known dtype and shape
    of a value (None when unknown); `op(...)` adds a node and returns its output
    name; `const(array)` adds a Constant node.  New names derive from `base`
    (the original node's name, or its output's) and are unique in the model.
    """

    opset: int
    base: str
    names: NameScope
    specs: Callable[[str], TensorSpec | None] = lambda name: None
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    _consts: dict = field(default_factory=dict, repr=False)

    def spec(self, name: str | None) -> TensorSpec | None:
        return self.specs(name) if name else None

    def fresh(self, hint: str) -> str:
        return self.names.fresh(f"{self.base}/{hint}")

    def op(self, op_type: str, *inputs: str, hint: str | None = None, **attrs) -> str:
        """Add one single-output node of ai.onnx; return the name of its output."""
        hint = hint or op_type.lower()
        out = self.fresh(hint)
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=self.fresh(op_type), **attrs))
        return out

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


@OP.def_converter
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
    if takes_zero_point(ctx.spec(src), ctx.spec(zps), bool(zps)) and (
        qtype == PER_TENSOR or ctx.opset >= PER_CHANNEL_DQL_OPSET
    ):
        if qtype == PER_TENSOR:
            inputs = [src, _scalar(ctx, scales, "scale")]
            if zps:
                inputs.append(_scalar(ctx, zps, "zero_point"))
            return ctx.op("DequantizeLinear", *inputs, hint="dst")
        inputs = [src, scales]
        if zps:
            zshape, sshape = _known_shape(ctx.spec(zps)), _known_shape(ctx.spec(scales))
            if zshape is None or zshape != sshape:  # one zero point for every channel (or not known not to be)
                zps = ctx.op("Expand", zps, ctx.op("Shape", scales, hint="scales_shape"), hint="zero_point")
            inputs.append(zps)
        return ctx.op("DequantizeLinear", *inputs, axis=int(axis), hint="dst")

    # Exact integer arithmetic: float32(int64(src) - int64(zp)) * scale.
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


@dataclass(frozen=True)
class LiftPlan:
    """How one DequantizeLinear becomes a DynamicDequantize: its inputs and attributes."""

    inputs: tuple[str, ...]
    qtype: str
    axis: int | None = None


def lift(node: onnx.NodeProto, spec: Callable[[str], TensorSpec | None]) -> LiftPlan | str:
    """The plan to lift a DequantizeLinear node, or the reason it cannot be lifted.

    Liftable: x int8/uint8, x_scale float32 with one element (per tensor) or 1-D
    (per channel, with the node's axis), zero point absent or of x's dtype, no
    block_size, float32 output.
    """
    from dyndq.onnx_types import attribute_values

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
        return LiftPlan(inputs, PER_TENSOR)
    if len(ss.shape) != 1:
        return f"x_scale has rank {len(ss.shape)} (blocked), not 0 or 1"
    axis = int(attrs.get("axis", 1))
    if xs.rank is not None:
        if xs.rank == 0 or not -xs.rank <= axis < xs.rank:
            return f"axis {axis} out of range for x of rank {xs.rank}"
    if zp and (zs.shape is None or len(zs.shape) != 1):
        return "x_zero_point's shape is not known to be 1-D"
    return LiftPlan(inputs, PER_CHANNEL, axis)
