"""Handlers of the quantization kinds: DynamicDequantize (our op), Quantize, Dequantize, DynamicQuantize.

Each follows oneDNN's doc/graph/operations/*.md: Quantize and DynamicQuantize compute
saturate(round(src / scale + zp)) (oneDNN leaves the rounding to the library; we round half
to even, as ONNX does); Dequantize computes (src - zp) * scale with the attribute's values.
"""
from __future__ import annotations

import numpy as np

from dyndq.onednn.emitter import FLOAT8, OpEmitter, Refused
from dyndq.onednn.handler import REQUIRED, Attr, from_opdefs, handler
from dyndq.onednn.shared import axis_of, per_axis_shape
from dyndq.opdefs import DYNAMIC_DEQUANTIZE_2, dtypes

QTYPES = ("per_tensor", "per_channel")


def _dequantizer_example(i: int, draw):
    """scales small and positive; zero points within the range of the src they are subtracted
    from (an u8 zp beside u4 weights stays in 0..15).  Weights of a linear layer (dequantized
    into a rank-2 second operand of a MatMul) get scales that give them the magnitude
    1/sqrt(K) initialisers give weights, K the MatMul's reduction length."""
    if i == 0 and draw.dtype.name in FLOAT8:  # f8 data over a good part of its range
        return draw.floats(-8.0, 8.0)
    if i == 2 and draw.dtype.is_integer:
        src = draw.input_dtype(0)
        lo, hi = dtypes.integer_range(src) if src is not None and src.is_integer else (None, None)
        return draw.integers(lo, hi)
    if i == 1 and not draw.dtype.is_integer:
        k = linear_weights_k(draw, draw.op.outputs[0] if draw.op and draw.op.outputs else None, draw.input_shape(0))
        src = draw.input_dtype(0)
        if k is None or src is None or not src.is_integer:
            return draw.floats(2.0**-8, 2.0**-4)
        target = 1 / np.sqrt(k) / _rms_of_quantized(src, zps=len(draw.names) > 2)
        return draw.floats(0.5 * target, 1.5 * target)
    return None


def linear_weights_k(draw, value: str | None, shape) -> int | None:
    """K when `value` (of `shape`) is the rank-2 second operand of a MatMul: a linear layer's weights."""
    if value is None or shape is None or len(shape) != 2:
        return None
    for use, index in draw.uses(value):
        if use.kind == "MatMul" and index == 1:
            return shape[1] if use.attrs.get("transpose_b") in (True, 1, "true", "True") else shape[0]
    return None


def _rms_of_quantized(src: dtypes.DType, zps: bool) -> float:
    """The root mean square of src - zp with src (and zp) uniform over src's range."""
    lo, hi = dtypes.integer_range(src)
    n = hi - lo + 1
    variance = (n * n - 1) / 12
    return float(np.sqrt(2 * variance)) if zps else float(np.sqrt(variance + ((lo + hi) / 2) ** 2))


def _ddq_from_onnx(w) -> dict:
    """Version 2's attributes; a version-3 node's dtypes oneDNN's DynamicDequantize lacks (codes
    other than s4/u4/s8/u8, float8e8m0 scales, a dst other than the scales' dtype) named."""
    op = DYNAMIC_DEQUANTIZE_2
    given = dict(zip(("src", "scales", "zps"), w.dtypes))
    for arg, dtype in given.items():
        if dtype is not None and dtype not in op.allowed_dtypes(arg):
            names = ", ".join(dtypes.by_name(d).onednn for d in op.allowed_dtypes(arg))
            w.problem(arg, f"dtype {dtype}", f"{names} (what oneDNN's DynamicDequantize takes)")
    out = w.values.get("output_dtype")
    try:
        out_name = None if out is None else dtypes.by_onnx(out).name
    except (KeyError, TypeError, ValueError):  # (no dtype of that code: said, as check says it)
        w.problem("output_dtype", repr(out), "absent, or a TensorProto data type code: the scales' dtype "
                                             "(oneDNN's DynamicDequantize writes dst in the scales' dtype)")
        out_name = None
    if out_name is not None and given.get("scales") is not None and out_name != given["scales"]:
        w.problem("output_dtype", f"{out_name}, the scales being {given['scales']}",
                  "absent, or the scales' dtype: oneDNN's DynamicDequantize writes dst in the scales' dtype")
    return {k: v for k, v in w.values.items() if k in {a.name for a in op.attributes}}


@handler("DynamicDequantize", roles=("src", "scales", "zps"), inputs=(2, 3),
         attrs=tuple(from_opdefs(a) for a in DYNAMIC_DEQUANTIZE_2.attributes),
         onnx_types=("DynamicDequantize",), from_onnx=_ddq_from_onnx, example=_dequantizer_example)
def dynamic_dequantize(e: OpEmitter, attrs: dict) -> None:
    """Our op, as it is: same inputs, attributes and dtypes (its version 2 judges them)."""
    import dyndq
    from dyndq.opdefs import ValidationError

    if e.problems:
        raise Refused()
    try:
        node = dyndq.make_node([e.input(i) for i in range(len(e.op.inputs))], [e.output()], name=e.node_name,
                               **e.op.attrs)
    except ValidationError as err:
        for p in err.problems:
            e.problem(p.argument, p.found, p.allowed)
        raise Refused() from None
    e.tag(node, main=True)
    e.nodes.append(node)


def quantize_arith(e: OpEmitter, src: str, scale: str, zp: str | None, dst_index: int = 0) -> None:
    """dst = saturate(round_half_even(src / scale + zp))."""
    dst = e.op.outputs[dst_index]
    lo, hi = dtypes.integer_range(dst.dtype)
    value = e.node("Div", [src, scale], main=True, what="div")
    if zp is not None:
        value = e.node("Add", [value, zp], what="add_zp")
    value = e.node("Round", [value], what="round")
    value = e.node("Clip", [value, e.const(lo, "float32", "min"), e.const(hi, "float32", "max")], what="saturate")
    e.node("Cast", [value], e.output(dst_index), what="to_dst", to=dst.dtype.onnx)


def _static_params(e: OpEmitter, attrs: dict, rank: int, channels_of) -> tuple[list, list, int | None]:
    scales, zps = attrs["scales"], attrs["zps"]
    if not scales:
        e.refuse("scales", repr(scales), "a non-empty list of f32 scales")
    zps = [0] * len(scales) if zps is None else zps
    if attrs["qtype"] == "per_tensor":
        if len(scales) != 1 or len(zps) != 1:
            e.refuse("scales", f"{len(scales)} scales and {len(zps)} zps", "one of each for qtype='per_tensor'")
        return scales, zps, None
    axis = axis_of(e, "axis", attrs["axis"], rank)
    n = channels_of(axis)
    if len(scales) != n or len(zps) != n:
        e.refuse("scales", f"{len(scales)} scales and {len(zps)} zps",
                 f"{n} of each, the size of dimension {axis} (qtype='per_channel')")
    return scales, zps, axis


STATIC = (Attr("qtype", "string", "per_tensor", QTYPES), Attr("axis", "s64", 1),
          Attr("scales", "f32[]", REQUIRED), Attr("zps", "s64[]"))


def _static_op(e: OpEmitter, attrs: dict, src_types: set, dst_types: set, float8_op: str) -> tuple | None:
    """A static (de)quantization's dtypes and parameters checked: (scales, zps, axis), or None
    when f8 data went straight to ONNX's `float8_op` (QuantizeLinear / DequantizeLinear)."""
    src, dst = e.op.inputs[0], e.op.outputs[0]
    e.dtype_in(src, "inputs[0]", src_types)
    e.dtype_in(dst, "outputs[0]", dst_types)
    if e.problems:
        raise Refused()
    scales, zps, axis = _static_params(e, attrs, len(src.shape), lambda a: src.shape[a])
    if src.dtype.name in FLOAT8 or dst.dtype.name in FLOAT8:
        _float8_linear(e, float8_op, scales, zps, axis)
        return None
    return scales, zps, axis


def _float8_linear(e: OpEmitter, onnx_type: str, scales: list, zps: list, axis: int | None) -> None:
    """f8 data: ONNX's QuantizeLinear / DequantizeLinear (opset 21) with float scales, which
    compute exactly what oneDNN documents (oneDNN takes no zero points for f8: they must be 0).
    QuantizeLinear saturates to the largest finite f8 (its default, saturate=1)."""
    if any(z != 0 for z in zps):
        e.refuse("zps", repr(zps), "zero points of 0 (oneDNN takes none for f8_e4m3 and f8_e5m2)")
    extra = {} if axis is None else {"axis": axis}
    scale = e.const(scales[0] if axis is None else scales, "float32", "scales")
    if onnx_type == "DequantizeLinear":
        e.node(onnx_type, [e.input(0), scale], e.output(), main=True, **extra)
        return
    dst = e.op.outputs[0].dtype.name
    zp = e.const(0.0 if axis is None else [0.0] * len(scales), dst, "zps")
    e.node(onnx_type, [e.input(0), scale, zp], e.output(), main=True, **extra)


def _quantize_from_onnx(w) -> dict:
    """QuantizeLinear with a constant scale (and zero point): per tensor or per axis."""
    for key in ("block_size", "output_dtype", "precision"):
        if w.values.get(key):
            w.problem(key, repr(w.values[key]), "none: oneDNN's Quantize has no counterpart for it")
    scale = w.constants[1] if len(w.constants) > 1 else None
    if scale is None:
        w.problem("inputs[1]", "a scale computed in the graph", "a constant scale (an initializer)")
        return {}
    zp = w.constants[2] if len(w.constants) > 2 and w.constants[2] is not None else np.zeros(scale.shape)
    attrs = {"scales": [float(v) for v in np.ravel(scale)],
             "zps": [int(v) for v in np.ravel(zp.astype(np.float64))]}
    if scale.size > 1:
        attrs.update(qtype="per_channel", axis=int(w.values.get("axis", 1)))
    return attrs


@handler("Quantize", attrs=STATIC, onnx_types=("QuantizeLinear",), onnx_inputs=1, from_onnx=_quantize_from_onnx)
def quantize(e: OpEmitter, attrs: dict) -> None:
    params = _static_op(e, attrs, {"float32"}, {"int8", "uint8"} | FLOAT8, "QuantizeLinear")
    if params is None:
        return
    scales, zps, axis = params
    src = e.op.inputs[0]
    shape = [] if axis is None else per_axis_shape(len(src.shape), axis, len(scales))
    quantize_arith(e, e.input(0), e.const(np.reshape(scales, shape), "float32", "scales"),
                   e.const(np.reshape(zps, shape), "float32", "zps"))


@handler("Dequantize", attrs=STATIC, example=_dequantizer_example)
def dequantize(e: OpEmitter, attrs: dict) -> None:
    """dst = (src - zp) * scale with the attribute's scales and zps: our op with constant inputs
    (int32 zero points hold every s64 zp that fits the s8/u8 range oneDNN takes)."""
    import dyndq

    params = _static_op(e, attrs, {"int8", "uint8"} | FLOAT8, {"float32"}, "DequantizeLinear")
    if params is None:
        return
    scales, zps, axis = params
    if any(not -2**31 <= z < 2**31 for z in zps):
        e.refuse("zps", repr(zps), "zero points within the s32 range")
    extra = {} if axis is None else {"qtype": "per_channel", "axis": axis}
    node = dyndq.make_node([e.input(0), e.const(scales, "float32", "scales"), e.const(zps, "int32", "zps")],
                           [e.output()], name=e.node_name, **extra)
    e.tag(node, main=True)
    e.nodes.append(node)


def _quantizer_example(i: int, draw):
    """A quantizer's scales are positive (1/64 to 1/16: N(0, 1) activations then span tens of
    steps); its zero points lie in the range of the dst they are added to."""
    if i == 1 and not draw.dtype.is_integer:
        return draw.floats(1 / 64, 1 / 16)
    dst = draw.output_dtype(0)
    if i == 2 and draw.dtype.is_integer and dst is not None and dst.is_integer:
        return draw.integers(*dtypes.integer_range(dst))
    return None


@handler("DynamicQuantize", roles=("src", "scales", "zps"), inputs=(2, 3), example=_quantizer_example,
         attrs=(Attr("qtype", "string", "per_tensor", QTYPES), Attr("axis", "s64", 1)))
def dynamic_quantize(e: OpEmitter, attrs: dict) -> None:
    src, dst = e.op.inputs[0], e.op.outputs[0]
    e.dtype_in(src, "inputs[0]", {"float32"})
    e.dtype_in(e.op.inputs[1], "inputs[1]", {"float32"})
    if len(e.op.inputs) > 2:
        e.dtype_in(e.op.inputs[2], "inputs[2]", {"int8", "uint8", "int32"})
    e.dtype_in(dst, "outputs[0]", {"int8", "uint8"})
    if e.problems:
        raise Refused()
    rank = len(src.shape)
    shape = [] if attrs["qtype"] == "per_tensor" else per_axis_shape(rank, axis_of(e, "axis", attrs["axis"], rank), -1)

    def param(i: int) -> str:
        t = e.op.inputs[i]
        n = int(np.prod(t.shape)) if t.shape else 1
        if attrs["qtype"] == "per_tensor" or n == 1:
            if n != 1:
                e.refuse(f"inputs[{i}]", f"{t.describe()}", "one element for qtype='per_tensor'")
            target = []
        else:
            channels = src.shape[shape.index(-1)]
            if len(t.shape) != 1 or n != channels:
                e.refuse(f"inputs[{i}]", t.describe(), f"a 1-D tensor of {channels} elements, src's dimension "
                                                       f"{shape.index(-1)} (qtype='per_channel')")
            target = shape
        value = e.input(i) if t.dtype.name == "float32" else e.cast(e.input(i), e.op.inputs[1].dtype, what=f"in{i}_f32")
        return e.node("Reshape", [value, e.const(target, "int64", f"in{i}_shape")], what=f"in{i}_broadcast")

    quantize_arith(e, e.input(0), param(1), param(2) if len(e.op.inputs) > 2 else None)
