"""DynamicDequantize-3 to standard ONNX, for each export target's engine, and DequantizeLinear
(versions 19 to 28, any of its types) back to it.

A node version 2 expresses (its dtypes, output_dtype absent or the scales' own) is lowered by
version 2's lowering, unchanged.  Every other node takes one of two routes, chosen for the
target's engine (converters/engines.py says what each runs):

- "tensor", "channel", "block": one DequantizeLinear, where the engine's takes the codes, as
  version 2's forms (the scales Cast to float32 first, exactly, unless the engine's
  DequantizeLinear takes float8e8m0 scales as they are: then output_dtype FLOAT), its float32
  result rounded once to the output dtype after (`_narrow`: float16 NaNs made 0x7E00).
- "decode": the codes decoded to values by standard ops, then one float32 Mul by the scales
  broadcast to them (version 2's `_broadcastable`), then the rounding to the output dtype.
  Integer codes: Cast to int64, Sub the int64 zero points, Cast to float32 (the exact
  difference, rounded once).  Float codes: Cast to float32 (exact), or, where the engine has
  no such tensors, a Gather from the table of the 2**bits values of the code's bit patterns,
  held in an unsigned type it has (float4e2m1 in uint4, float6 in uint8); integer codes it
  lacks (int2 on OpenVINO) are held as their values in int8/uint8.  Only a constant can be
  re-encoded so: a value of such a type computed at run time is refused, by name.  Codes of
  unknown dtype (inside a model-local function) go through float64: Cast, Sub, Cast to float32,
  exact for every code type.

Float codes' zero points are zeros (the kernel refuses others), and a -0 one counts: x - (-0)
is +0 for a -0 code x, as DequantizeLinear's (x - x_zero_point) * x_scale says.  Zero points
known to be +0 (a constant) change nothing: DequantizeLinear gets them as they are, the decode
route leaves them out.  Others (a -0 among them, or computed at run time) go to DequantizeLinear
only where the engine subtracts them so (`Engine.dql_float_zero_points`), else the decode route
subtracts them itself: a zero code whose zero point is -0 made +0 (Where, exact; not a Sub, which
ONNX Runtime's optimizer deletes for a constant zero).  (That route never needs a newer opset than
DequantizeLinear's for float codes, whose types need 19 and up: the needs, read off the specs,
hold for either.)

A NaN code times a NaN scale: IEEE 754 leaves open which NaN comes out; the kernel gives the
code's.  Where the engine's blocked DequantizeLinear gives the scale's (`Engine.blocked_nan_of_scale`)
and the scales may hold a NaN, the codes' NaNs are taken back: Where(IsNaN(codes), codes, y).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_2 as OP2
from dyndq.opdefs import DYNAMIC_DEQUANTIZE_3 as OP3
from dyndq.opdefs import FLOAT_CODES_3, PER_GROUP, PER_TENSOR, LiftPlan, Needs, Problem, Refusal, TensorSpec
from dyndq.opdefs import ValidationError, dtypes

from .dynamic_dequantize import (BFLOAT16_OPSET, CASTLIKE_OPSET, DQL_OPSET, INT4_OPSET, PER_CHANNEL_DQL_OPSET,
                                 RANGE_OPSET, _broadcastable, _plan_or_reason, dequantize_linear, dql_route,
                                 dynamic_dequantize_2, dynamic_dequantize_2_needs, float32_scales, integer_arithmetic,
                                 takes_zero_point, to_output)
from .engines import ENGINES, Engine, engine
from .lowering_context import LoweringContext

OUTPUT_DTYPE_OPSET = 23  # DequantizeLinear's output_dtype
GATHER_OPSET = 13  # the table route: Cast, Gather
_E8M0 = "float8_e8m0fnu"


def _held_as(dtype: str) -> tuple[str, bool]:
    """How an engine that lacks a code type holds a constant of it: (dtype, whether as bit patterns).
    A float code as its bit patterns in the unsigned type of 4 or 8 bits that holds them (float4e2m1
    in uint4; float6 and the float8 fnuz types in uint8); an integer one as its values in int8/uint8."""
    row = dtypes.by_name(dtype)
    if row.is_float:
        return ("uint4" if row.bits <= 4 else "uint8"), True
    return ("uint8" if dtype.startswith("u") else "int8"), False


def _opset(dtype: str) -> int:
    """The ai.onnx opset whose Cast and DequantizeLinear first take `dtype` (the dtype table's)."""
    return dtypes.by_name(dtype).opset


def _dtype(spec: TensorSpec | None) -> str | None:
    return None if spec is None else spec.dtype


def _output(scales: str | None, output_dtype) -> str | None:
    return dtypes.by_onnx(output_dtype).name if output_dtype is not None else scales


def version_2_holds(src, scales, zps, output_dtype) -> bool:
    """Whether version 2 expresses the node (its dtypes, dst of the scales' dtype)."""
    s, t, z = _dtype(src), _dtype(scales), _dtype(zps)
    return (s in OP2.allowed_dtypes("src") and t in OP2.allowed_dtypes("scales")
            and (zps is None or z in OP2.allowed_dtypes("zps")) and _output(t, output_dtype) == t)


def _held(src: str | None, e: Engine) -> str | None:
    """The dtype `e` holds a code of dtype `src` in (itself, where it has such tensors)."""
    return src if e.holds(src) else _held_as(src)[0]


def _route(src, scales, zps, qtype, group_shape, e: Engine) -> str:
    """"tensor", "channel", "block" (one DequantizeLinear) or "decode" (see the module doc)."""
    s, t = _dtype(src), _dtype(scales)
    if s is None or t is None or (zps is not None and _dtype(zps) is None):
        return "decode"
    if s not in e.dql_codes or not takes_zero_point(src, zps):
        return "decode"
    if s == "int32" and zps is not None:
        return "decode"  # engines subtract int32 zero points in int32, which overflows: int64 here
    route = dql_route(src, scales, zps, qtype, group_shape, e)
    return "decode" if route == "integer" else route


def _needs(src, scales, zps, qtype, group_shape, output_dtype, e: Engine) -> Needs:
    """What the node's lowering needs on engine `e` (version 3 forms only)."""
    route = _route(src, scales, zps, qtype, group_shape, e)
    s, t, z, out = _dtype(src), _dtype(scales), _dtype(zps), _output(_dtype(scales), output_dtype)
    reasons = {"tensor": (DQL_OPSET, "DequantizeLinear"),
               "channel": (PER_CHANNEL_DQL_OPSET, "per_channel DequantizeLinear with axis"),
               "block": (INT4_OPSET, "blocked DequantizeLinear (block_size)"),
               "decode": (DQL_OPSET, "Cast, Sub and Mul")}
    opset, why = reasons[route]
    why = [why]
    held = [d for d in (s, z) if d is not None]
    for d in held:
        held_as = _held(d, e)
        need = _opset(held_as) if held_as == d else max(_opset(held_as), GATHER_OPSET)
        if need > opset:
            opset, why = need, why + [f"{held_as} codes" + ("" if held_as == d else f" holding {d} ones")]
    if t is not None and _opset(t) > opset:
        opset, why = _opset(t), why + [f"{t} scales"]
    if route == "decode" and qtype == PER_GROUP and RANGE_OPSET > opset:
        opset, why = RANGE_OPSET, why + ["per_group broadcasting (Range, Gather)"]
    if route != "decode" and t == _E8M0 and e.dql_e8m0_scales and OUTPUT_DTYPE_OPSET > opset:
        opset, why = OUTPUT_DTYPE_OPSET, why + ["DequantizeLinear's output_dtype"]
    if out == "bfloat16" and BFLOAT16_OPSET > opset:
        opset, why = BFLOAT16_OPSET, why + ["Cast to bfloat16"]
    kept = [_held(d, e) for d in held] + ([t] if t else [])
    if s is None or t is None or (zps is not None and z is None):
        # (inside a model-local function) the Casts may take any type the engine holds
        kept = [d for d in OP3.allowed_dtypes("src") + OP3.allowed_dtypes("scales") if e.holds(d)]
        opset = max([opset, CASTLIKE_OPSET] + [_opset(d) for d in kept])
        why = why + [f"Casts from dtypes not known (any {e.title} holds)"]
    ir = max([3] + [dtypes.by_name(d).ir for d in kept])
    return Needs(opset, ir, ", ".join(why))


@OP3.def_lowering_needs
def dynamic_dequantize_3_needs(
    src: TensorSpec | None,
    scales: TensorSpec | None,
    zps: TensorSpec | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
    group_shape: tuple[int, ...] | None = None,
    output_dtype: int | None = None,
) -> Needs:
    """Version 2's needs for the forms it expresses; otherwise what the route needs, for standard
    ONNX and (`by_target`) for each engine: the opset whose DequantizeLinear or Cast first takes
    each type held, 13 for per-axis DequantizeLinear and bfloat16, 21 for blocks, 23 for
    output_dtype, 11 for per_group broadcasting by Range."""
    if version_2_holds(src, scales, zps, output_dtype):
        return dynamic_dequantize_2_needs(src, scales, zps, qtype=qtype, axis=axis, group_shape=group_shape)
    per = {name: _needs(src, scales, zps, qtype, group_shape, output_dtype, e) for name, e in ENGINES.items()}
    onnx_needs = per.pop("onnx")
    return Needs(onnx_needs.opset, onnx_needs.ir_version, onnx_needs.why, by_target=per)


@OP3.def_lowering
def dynamic_dequantize_3(
    ctx: LoweringContext,
    src: str,
    scales: str,
    zps: str | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
    group_shape: tuple[int, ...] | None = None,
    output_dtype: int | None = None,
) -> str:
    """Lower one DynamicDequantize-3 for the target's engine; return the name holding dst."""
    zps = zps or None
    src_spec = ctx.spec(src) or TensorSpec(None, None)
    scales_spec = ctx.spec(scales) or TensorSpec(None, None)
    zps_spec = (ctx.spec(zps) or TensorSpec(None, None)) if zps else None
    if version_2_holds(src_spec, scales_spec, zps_spec, output_dtype):
        return dynamic_dequantize_2(ctx, src, scales, zps, qtype=qtype, axis=axis, group_shape=group_shape)
    e = engine(ctx.target)
    t = scales_spec.dtype
    out = _output(t, output_dtype)
    float_codes = src_spec.dtype in FLOAT_CODES_3
    signed_zeros = float_codes and zps is not None and not _plus_zeros(ctx, zps)
    route = _route(src_spec, scales_spec, zps_spec, qtype, group_shape, e)
    if signed_zeros and src_spec.dtype not in e.dql_float_zero_points:
        route = "decode"  # (its DequantizeLinear would not give x - (-0) = +0 for a -0 code)
    if route != "decode":
        if t == _E8M0 and e.dql_e8m0_scales:  # its DequantizeLinear takes them as they are
            y = dequantize_linear(ctx, route, src, scales, zps, zps_spec, axis, group_shape,
                                  output_dtype=TensorProto.FLOAT)
        else:
            y = dequantize_linear(ctx, route, src, float32_scales(ctx, scales, t), zps, zps_spec, axis, group_shape)
        if float_codes and route == "block" and e.blocked_nan_of_scale and _may_hold_nan(ctx, scales):
            y = _codes_nans(ctx, src, y)
        return to_output(ctx, y, out, scales)
    scale = float32_scales(ctx, scales, t)
    if src_spec.dtype is None or (zps and zps_spec.dtype is None):  # (inside a function) exact for every type
        x = ctx.op("Cast", src, to=TensorProto.DOUBLE, hint="src_double")
        zp = ctx.op("Cast", zps, to=TensorProto.DOUBLE, hint="zero_point_double") if zps else None
        scale, zp = _broadcastable(ctx, src, x, scale, zp, qtype, axis, group_shape)
        if zp is not None:
            x = ctx.op("Sub", x, zp, hint="centered")
        x = ctx.op("Cast", x, to=TensorProto.FLOAT, hint="centered_float")
        ctx.form = "float64 arithmetic (Cast, Sub, Cast, Mul)"
    elif float_codes:
        x, decoded = _float_values(ctx, e, src, src_spec.dtype)
        negative = _minus_zeros(ctx, e, zps, zps_spec.dtype) if signed_zeros else None
        scale, negative = _broadcastable(ctx, src, x, scale, negative, qtype, axis, group_shape)
        if signed_zeros:
            x = _minus_zero_subtracted(ctx, x, negative)
        ctx.form = decoded + (", x - zp for zero points of -0 (Where)" if signed_zeros else "") + ", Mul"
    else:
        ctx.form = "integer arithmetic (Cast to int64, Sub, Cast, Mul)"
        if not e.holds(src_spec.dtype):
            ctx.form += f" on {_held_as(src_spec.dtype)[0]} values"
        codes = _held_input(ctx, e, src, src_spec.dtype, "src")
        zero = _held_input(ctx, e, zps, zps_spec.dtype, "zps") if zps else None
        y = integer_arithmetic(ctx, src, codes, zero, scale, qtype, axis, group_shape, out, e.nan_of_second)
        return to_output(ctx, y, out, scales)
    factors = (scale, x) if e.nan_of_second else (x, scale)  # (the codes' NaN kept where both are NaN)
    y = ctx.op("Mul", *factors, hint="dst" if out == "float32" else "dst_float")
    return to_output(ctx, y, out, scales)


def _float_values(ctx: LoweringContext, e: Engine, src: str, dtype: str, arg: str = "src") -> tuple[str, str]:
    """The float codes' values as float32: a Cast (exact), or where the engine has no tensors of
    the codes' dtype, a Gather from the table of their values by their bit patterns; and how, in
    a few words.  (`arg`: which input they are, src or zps.)"""
    hint = "src" if arg == "src" else "zero_point"
    if e.holds(dtype):
        return ctx.op("Cast", src, to=TensorProto.FLOAT, hint=f"{hint}_float"), "Cast to float32"
    bits = _held_input(ctx, e, src, dtype, arg)
    width = dtypes.by_name(dtype).bits
    table = np.arange(1 << width, dtype=np.uint8).view(dtypes.by_name(dtype).numpy).astype(np.float32)
    index = ctx.op("Cast", bits, to=TensorProto.INT32, hint=f"{hint}_bits")
    value = ctx.op("Gather", ctx.const(table, f"{dtype}_values"), index, axis=0, hint=f"{hint}_float")
    return value, f"Gather from the {len(table)} {dtype} values"


def _plus_zeros(ctx: LoweringContext, zps: str) -> bool:
    """Whether float codes' zero points are a constant holding +0 only (x - (+0) is x for every
    code: they change nothing); False where one is -0 or they are computed at run time."""
    values = ctx.constant(zps)
    return values is not None and not np.signbit(values.astype(np.float32)).any()


def _minus_zeros(ctx: LoweringContext, e: Engine, zps: str, dtype: str) -> str | None:
    """Which of float codes' zero points (zeros) are -0, as a bool tensor of their shape: a
    constant (None where every one is -0), or computed at run time (1/zp < 0: -inf for -0)."""
    values = ctx.constant(zps)
    if values is not None:
        negative = np.signbit(values.astype(np.float32))
        return None if negative.all() else ctx.derive(negative, zps)
    zp, _ = _float_values(ctx, e, zps, dtype, "zps")
    return ctx.op("Less", ctx.op("Reciprocal", zp, hint="zero_point_reciprocal"),
                  ctx.const(np.array(0, np.float32), "zero_float"), hint="zero_point_negative")


def _minus_zero_subtracted(ctx: LoweringContext, x: str, negative: str | None) -> str:
    """x - zp for zero points zp of either sign, `negative` saying where they are -0 (None:
    everywhere), broadcast against x: x itself, but a zero x whose zp is -0 is +0 (IEEE: -0 - (-0)
    = +0 - (-0) = +0, x - (+0) = x).  Written as Where(Equal(x, 0) [And negative], +0, x), not as
    a Sub: ONNX Runtime's NoopElimination deletes a Sub of a constant zero, a -0 one included."""
    zero = ctx.const(np.array(0, np.float32), "zero_float")
    zero_codes = ctx.op("Equal", x, zero, hint="src_is_zero")
    where = zero_codes if negative is None else ctx.op("And", zero_codes, negative, hint="src_minus_zero_point_zero")
    return ctx.op("Where", where, zero, x, hint="centered")


def _may_hold_nan(ctx: LoweringContext, scales: str) -> bool:
    """Whether the scales may hold a NaN: computed at run time, or a constant holding one."""
    values = ctx.constant(scales)
    return values is None or bool(np.isnan(values.astype(np.float32)).any())


def _codes_nans(ctx: LoweringContext, src: str, y: str) -> str:
    """y with each NaN code's own NaN where the code is NaN (the kernel's product, d * c = d for
    a NaN d): Where(IsNaN(codes), codes, y), the codes Cast to float32 (exact, NaNs quiet)."""
    codes = ctx.op("Cast", src, to=TensorProto.FLOAT, hint="src_float")
    ctx.form += ", the codes' NaNs kept (Where)"
    return ctx.op("Where", ctx.op("IsNaN", codes, hint="src_is_nan"), codes, y, hint="dst_codes_nans")


def _held_input(ctx: LoweringContext, e: Engine, name: str, dtype: str, arg: str) -> str:
    """`name` as the engine holds it: itself, or (a constant) re-encoded in `_held_as`'s dtype."""
    if e.holds(dtype):
        return name
    as_dtype, as_bits = _held_as(dtype)
    codes = ctx.constant(name)
    if codes is None:
        onnx_name = dtypes.by_name(dtype).onnx_name
        raise ValidationError([Problem(
            f"{ctx.base}: {arg}", f"{name!r}, a {onnx_name} value computed at run time",
            f"a constant for export target {e.name!r}: {e.title} has no {onnx_name} tensors, and only a "
            f"constant's codes can be re-encoded (export target 'onnx' keeps them)")])
    raw = codes.view(np.uint8) if as_bits else codes.astype(np.int64)
    return ctx.derive(raw.astype(dtypes.by_name(as_dtype).numpy), name)


# -- lifting: DequantizeLinear -> DynamicDequantize-3 ------------------------------------------

@OP3.def_lifting(source=("", "DequantizeLinear"))
def dynamic_dequantize_3_lifting(node: onnx.NodeProto, spec) -> LiftPlan | Refusal:
    """Version 3 takes what version 2 does and also every type of DequantizeLinear-28: codes
    int2 to int32, float8, float6 and float4 (a zero point of float codes as it is: the kernel
    holds it to 0), float8e8m0 scales, and an output_dtype other than the scales' (kept as
    the node's output_dtype)."""
    plan = _plan_or_reason(node, spec, OP3)
    return Refusal(plan) if isinstance(plan, str) else plan
