"""Handlers of the element-wise kinds: binary and unary arithmetic, BiasAdd, Clamp, Elu, GELU,
Pow, SoftMax and SoftMaxBackward, the comparison GreaterEqual, Select and GenIndex (formulas
from doc/graph/operations/*.md and the op schemas of src/graph/interface/op_def.hpp)."""
from __future__ import annotations

import math

import numpy as np

from dyndq.onednn.emitter import OpEmitter, Refused
from dyndq.onednn.handler import REQUIRED, Attr, handler
from dyndq.onednn.shared import (BROADCAST, FLOATS, axis_of, broadcast_from_onnx, check_broadcast,
                                 no_attrs_from_onnx, per_axis_shape)
from dyndq.opdefs import dtypes

INT32, INT64 = dtypes.by_name("int32"), dtypes.by_name("int64")


INTEGER_BINARY = {"Add", "Subtract"}  # the binary kinds oneDNN's op schemas give s32 (src_0, src_1, dst)
S32 = (-2**31, 2**31 - 1)


def _binary(kind: str, onnx_type: str):
    def mapping(e: OpEmitter, attrs: dict) -> None:
        """In float32, rounded once to dst's dtype.  oneDNN lets the inputs' dtypes differ (one of
        them then f32, as dst) and takes an s32 input beside a float one (an implicit causal
        mask added as s32): it is widened to float32 exactly (|value| <= 2^24, as a mask's are).
        Add and Subtract also take s32 with s32 (a bottom-right causal mask's row index shifted
        by host scalars): exact in int64, saturated to s32 as oneDNN stores an s32 dst."""
        check_broadcast(e, attrs)
        if kind in INTEGER_BINARY and all(t.dtype.name == "int32" for t in e.op.inputs):
            e.dtype_in(e.op.outputs[0], "outputs[0]", {"int32"})
            if e.problems:
                raise Refused()
            _integer_binary(e, onnx_type)
            return
        if not any(t.dtype.name in FLOATS for t in e.op.inputs):
            e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
        for i, t in enumerate(e.op.inputs):
            e.dtype_in(t, f"inputs[{i}]", FLOATS | {"int32"})
        e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
        if e.problems:
            raise Refused()
        e.float_op(onnx_type, [0, 1])
    return mapping


def _integer_binary(e: OpEmitter, onnx_type: str) -> None:
    """s32 with s32: the exact result saturated to the s32 range, as an s32 dst.  Beside a
    one-element operand (a mask's host scalar) the other one is first clipped to the range where
    the result cannot leave s32, so the arithmetic stays in int32 (a fourth of the memory of the
    int64 route, which other shapes take)."""
    a, b = e.op.inputs
    if math.prod(b.shape) == 1 or math.prod(a.shape) == 1:
        scalar = 1 if math.prod(b.shape) == 1 else 0
        wide = e.node("Reshape", [e.cast(e.input(scalar), INT64, what="scalar_s64"), e.const([], "int64", "scalar")],
                      what="scalar_as_scalar")
        lo, hi = e.const(S32[0], "int64", "s32_min"), e.const(S32[1], "int64", "s32_max")
        if scalar == 1:  # a + s in [MIN, MAX] for a in [MIN - s, MAX - s]; a - s for a in [MIN + s, MAX + s]
            step = "Sub" if onnx_type == "Add" else "Add"
            bounds = [e.node(step, [bound, wide], what=f"{name}_for_a") for name, bound in (("lo", lo), ("hi", hi))]
        elif onnx_type == "Add":  # s + b: b in [MIN - s, MAX - s]
            bounds = [e.node("Sub", [bound, wide], what=f"{name}_for_b") for name, bound in (("lo", lo), ("hi", hi))]
        else:  # s - b in [MIN, MAX] for b in [s - MAX, s - MIN]
            bounds = [e.node("Sub", [wide, bound], what=f"{name}_for_b") for name, bound in (("lo", hi), ("hi", lo))]
        bounds = [e.cast(e.node("Clip", [x, lo, hi], what="bound_in_s32"), INT32, what="bound_s32") for x in bounds]
        other = 1 - scalar
        clipped = e.node("Clip", [e.input(other), *bounds], what=f"in{other}_clipped")
        operands = [clipped, e.input(1)] if other == 0 else [e.input(0), clipped]
        e.node(onnx_type, operands, e.output(), main=True)
        return
    wide = [e.cast(e.input(i), INT64, what=f"in{i}_s64") for i in (0, 1)]
    exact = e.node(onnx_type, wide, main=True, what="exact")
    saturated = e.node("Clip", [exact, e.const(S32[0], "int64", "s32_min"), e.const(S32[1], "int64", "s32_max")],
                       what="saturate")
    e.node("Cast", [saturated], e.output(), what="to_dst", to=e.op.outputs[0].dtype.onnx)


def _binary_from_onnx(w) -> dict:
    if w.n_inputs != 2:
        w.problem("inputs", f"{w.n_inputs} inputs", f"2 (oneDNN's {w.kind} is binary)")
    return broadcast_from_onnx(w)


def _positive_divisor(i: int, draw):
    """A divisor is positive (1 to 8, as sqrt(head size) is)."""
    return draw.floats(1.0, 8.0) if i == 1 and not draw.dtype.is_integer else None


def _scale_factor(i: int, draw):
    """A one-element factor is a scale (1/8 to 1, as 1/sqrt(head size) is)."""
    return draw.floats(0.125, 1.0) if draw.size == 1 and not draw.dtype.is_integer else None


def _index_offset(i: int, draw):
    """A one-element s32 added to or subtracted from an index (GenIndex's: a bottom-right causal
    mask adds the key length and subtracts the query length) is the length of the index's last
    dim, as both lengths are when they are equal."""
    if i != 1 or draw.dtype.name != "int32" or draw.size != 1:
        return None
    index = draw.input_shape(0)
    return draw.full(index[-1]) if index else None


_EXAMPLES = {"Divide": _positive_divisor, "Multiply": _scale_factor, "Add": _index_offset, "Subtract": _index_offset}
for _kind, _onnx in (("Add", "Add"), ("Subtract", "Sub"), ("Multiply", "Mul"), ("Divide", "Div"),
                     ("Maximum", "Max"), ("Minimum", "Min")):
    handler(_kind, roles=("src_0", "src_1"), inputs=(2, 2), attrs=(BROADCAST,), onnx_types=(_onnx,),
            from_onnx=_binary_from_onnx, example=_EXAMPLES.get(_kind))(
                _binary(_kind, _onnx))


@handler("BiasAdd", roles=("src", "bias"), inputs=(2, 2),
         attrs=(Attr("data_format", "string", "NXC", ("NXC", "NCX")),))
def bias_add(e: OpEmitter, attrs: dict) -> None:
    """dst = src + bias, the 1-D bias laid along the channel axis: the last one under NXC (the
    default), axis 1 under NCX.  In float32, rounded once to dst's dtype."""
    src, bias = e.op.inputs
    for i, t in enumerate(e.op.inputs):
        e.dtype_in(t, f"inputs[{i}]", FLOATS)
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
    rank = len(src.shape)
    axis = rank - 1 if attrs["data_format"] == "NXC" else 1
    if rank < 2:
        e.problem("inputs[0]", f"rank {rank}", "a rank of at least 2 (batch and channel axes)")
    elif len(bias.shape) != 1 or bias.shape[0] != src.shape[axis]:
        e.problem("inputs[1]", f"shape {list(bias.shape)}",
                  f"[{src.shape[axis]}], one value per channel (axis {axis} under {attrs['data_format']})")
    if e.problems:
        raise Refused()
    along = e.node("Reshape", [e.f32(1), e.const(per_axis_shape(rank, axis, -1), "int64", "bias_shape")],
                   what="bias_along_channels")
    e.finish("dst", "Add", [e.f32(0), along])


def _unary(onnx_type: str):
    def mapping(e: OpEmitter, attrs: dict) -> None:
        e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
        if e.problems:
            raise Refused()
        e.float_op(onnx_type, [0])
    return mapping


def _non_negative(i: int, draw):
    """Real roots and powers: the src of Sqrt and Pow is non-negative (0 to 4)."""
    return draw.floats(0.0, 4.0) if i == 0 and not draw.dtype.is_integer else None


for _kind, _onnx in (("Sigmoid", "Sigmoid"), ("ReLU", "Relu"), ("Exp", "Exp"), ("Sqrt", "Sqrt"), ("Tanh", "Tanh")):
    handler(_kind, onnx_types=(_onnx,), from_onnx=no_attrs_from_onnx,
            example=_non_negative if _kind == "Sqrt" else None)(_unary(_onnx))


def _clamp_from_onnx(w) -> dict:
    """Clip's min and max: constant inputs (opset 11 on) or attributes (before); oneDNN's Clamp
    needs both."""
    bounds = {}
    for i, key in ((1, "min"), (2, "max")):
        value = w.constants[i] if i < len(w.constants) else None
        if value is None and key in w.values:
            value = w.values[key]
        if value is None or np.size(value) != 1:
            w.problem(key, "absent or computed in the graph" if value is None else f"{np.size(value)} values",
                      f"a constant {key} (an initializer holding one value): oneDNN's Clamp takes both bounds "
                      f"as attributes")
            continue
        bounds[key] = float(np.asarray(value).reshape(()))
    return bounds


@handler("Clamp", attrs=(Attr("min", "f32", REQUIRED), Attr("max", "f32", REQUIRED)), onnx_types=("Clip",),
         onnx_inputs=1, from_onnx=_clamp_from_onnx)
def clamp(e: OpEmitter, attrs: dict) -> None:
    """dst = min(max(src, min), max): in float32 between exact Casts, so exact in every dtype
    (the bounds are f32 attributes; dst's rounding of them is Cast's, to nearest even)."""
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
    if "min" in attrs and "max" in attrs and not attrs["min"] <= attrs["max"]:
        e.problem("max", f"{attrs['max']!r} below min {attrs['min']!r}", "max >= min")
    if e.problems:
        raise Refused()
    e.finish("dst", "Clip", [e.f32(0), e.const(attrs["min"], "float32", "min"), e.const(attrs["max"], "float32", "max")])


def _alpha_from_onnx(w) -> dict:
    return {"alpha": float(w.values.get("alpha", 1.0))}


@handler("Elu", attrs=(Attr("alpha", "f32", REQUIRED),), onnx_types=("Elu",), from_onnx=_alpha_from_onnx)
def elu(e: OpEmitter, attrs: dict) -> None:
    """dst = src if src > 0 else alpha (exp(src) - 1)."""
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
    if e.problems:
        raise Refused()
    e.float_op("Elu", [0], alpha=float(attrs["alpha"]))


@handler("GELU", attrs=(Attr("mode", "string", "gelu_erf", ("gelu_erf", "gelu_tanh")),))
def gelu(e: OpEmitter, attrs: dict) -> None:
    """mode gelu_erf (the default): x/2 (1 + erf(x/sqrt 2)); gelu_tanh: the tanh approximation."""
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
    if e.problems:
        raise Refused()
    e.float_op("Gelu", [0], approximate={"gelu_erf": "none", "gelu_tanh": "tanh"}[attrs["mode"]])


@handler("Pow", attrs=(Attr("beta", "f32", REQUIRED),), example=_non_negative)
def power(e: OpEmitter, attrs: dict) -> None:
    """dst = src ** beta (oneDNN 3.x: one input and the f32 attribute beta)."""
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
    if e.problems:
        raise Refused()
    e.finish("dst", "Pow", [e.f32(0), e.const(attrs["beta"], "float32", "beta")])


def _softmax_from_onnx(w) -> dict:
    axis, rank = w.values.get("axis", -1), w.ranks[0]
    return {"axis": axis % max(rank, 1) if rank else axis}


@handler("SoftMax", outputs=(1, 2), attrs=(Attr("axis", "s64", 1), Attr("mode", "string", "none", ("none", "inf_as_zero"))),
         onnx_types=("Softmax",), from_onnx=_softmax_from_onnx)
def softmax(e: OpEmitter, attrs: dict) -> None:
    """exp(x - max) / sum exp(x - max) along `axis`; mode inf_as_zero gives zeros for a slice
    that is all minus infinity (plain softmax gives NaN there).  The optional second output,
    `stats` (f32, the axis kept as 1), is max + log(sum exp(x - max)), the logsumexp that
    training graphs keep for the backward pass; under inf_as_zero an all minus infinity slice
    gets +inf there, so that exp(x - stats) gives the zeros dst holds."""
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
    if len(e.op.outputs) > 1:
        e.dtype_in(e.op.outputs[1], "outputs[1]", {"float32"})
    if e.problems:
        raise Refused()
    axis = axis_of(e, "axis", attrs["axis"], len(e.op.inputs[0].shape))
    if attrs["mode"] == "none":
        e.float_op("Softmax", [0], axis=axis)
    else:
        x = e.f32(0)
        y = e.node("Softmax", [x], main=True, what="softmax", axis=axis)
        top = e.node("ReduceMax", [x, e.const([axis], "int64", "axis")], what="row_max", keepdims=1)
        empty = e.node("Equal", [top, e.const(float("-inf"), "float32", "minus_inf")], what="all_minus_inf")
        e.finish("dst", "Where", [empty, e.const(0.0, "float32", "zero"), y])
    if len(e.op.outputs) > 1:
        _stats(e, e.f32(0), axis, attrs["mode"] == "inf_as_zero")


@handler("SoftMaxBackward", roles=("diff_dst", "dst"), inputs=(2, 2), attrs=(Attr("axis", "s64", 1),))
def softmax_backward(e: OpEmitter, attrs: dict) -> None:
    """diff_src = dst * (diff_dst - sum(diff_dst * dst along axis)), the gradient of SoftMax
    given its output dst; in float32, rounded once to diff_src's dtype."""
    for i, t in enumerate(e.op.inputs):
        e.dtype_in(t, f"inputs[{i}]", FLOATS)
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
    if e.op.inputs[0].shape != e.op.inputs[1].shape:
        e.problem("inputs[1]", f"shape {list(e.op.inputs[1].shape)}", f"{list(e.op.inputs[0].shape)}, diff_dst's shape")
    if e.problems:
        raise Refused()
    axis = axis_of(e, "axis", attrs["axis"], len(e.op.inputs[0].shape))
    diff_dst, dst = e.f32(0), e.f32(1)
    product = e.node("Mul", [diff_dst, dst], what="diff_dst_dst")
    total = e.node("ReduceSum", [product, e.const([axis], "int64", "axis")], what="sum_along_axis", keepdims=1)
    centred = e.node("Sub", [diff_dst, total], what="centred")
    e.finish("diff_src", "Mul", [dst, centred])


def _stats(e: OpEmitter, x: str, axis: int, inf_as_zero: bool) -> None:
    axes = e.const([axis], "int64", "stats_axis")
    top = e.node("ReduceMax", [x, axes], what="stats_max", keepdims=1)
    shifted = e.node("Exp", [e.node("Sub", [x, top], what="stats_shifted")], what="stats_exp")
    total = e.node("ReduceSum", [shifted, axes], what="stats_sum", keepdims=1)
    if not inf_as_zero:
        e.node("Add", [top, e.node("Log", [total], what="stats_log")], e.output(1), what="stats")
        return
    value = e.node("Add", [top, e.node("Log", [total], what="stats_log")], what="stats_value")
    empty = e.node("Equal", [top, e.const(float("-inf"), "float32", "stats_minus_inf")], what="stats_empty")
    e.node("Where", [empty, e.const(float("inf"), "float32", "stats_inf"), value], e.output(1), what="stats")


# -- comparisons, selection and indices --------------------------------------------------------


@handler("GreaterEqual", roles=("src_0", "src_1"), inputs=(2, 2), attrs=(BROADCAST,),
         onnx_types=("GreaterOrEqual",), from_onnx=broadcast_from_onnx)
def greater_equal(e: OpEmitter, attrs: dict) -> None:
    check_broadcast(e, attrs)
    e.dtype_in(e.op.outputs[0], "outputs[0]", {"bool"})
    ints = all(t.dtype.is_integer for t in e.op.inputs) and len({t.dtype for t in e.op.inputs}) == 1
    if not ints:
        for i, t in enumerate(e.op.inputs):
            e.dtype_in(t, f"inputs[{i}]", FLOATS)
    if e.problems:
        raise Refused()
    inputs = [e.input(0), e.input(1)] if ints else [e.f32(0), e.f32(1)]
    e.node("GreaterOrEqual", inputs, e.output(), main=True)


def _mask_fill(i: int, draw):
    """A one-element value a Select picks where its condition is false, before a SoftMax (an
    attention mask's fill), is minus infinity."""
    if i == 2 and draw.size == 1 and not draw.dtype.is_integer and "SoftMax" in draw.downstream():
        return draw.full(-np.inf)
    return None


@handler("Select", roles=("cond", "then", "else"), inputs=(3, 3), attrs=(BROADCAST,),
         onnx_types=("Where",), from_onnx=broadcast_from_onnx, example=_mask_fill)
def select(e: OpEmitter, attrs: dict) -> None:
    """dst = cond ? then : else, broadcast numpy-style; exact in any dtype."""
    check_broadcast(e, attrs)
    e.dtype_in(e.op.inputs[0], "inputs[0]", {"bool"})
    for i in (1, 2):
        e.dtype_in(e.op.inputs[i], f"inputs[{i}]", FLOATS)
    if e.problems:
        raise Refused()
    e.finish("dst", "Where", [e.input(0), e.f32(1), e.f32(2)])


@handler("GenIndex", attrs=(Attr("axis", "s64", REQUIRED),))
def gen_index(e: OpEmitter, attrs: dict) -> None:
    """dst (s32, src's shape) holds each element's index along `axis`."""
    shape = list(e.op.inputs[0].shape)
    e.dtype_in(e.op.outputs[0], "outputs[0]", {"int32"})
    if any(d < 0 for d in shape):
        e.problem("inputs[0]", f"shape {shape}", "a known shape (GenIndex's output is made from it)")
    if e.problems:
        raise Refused()
    axis = axis_of(e, "axis", attrs["axis"], len(shape))
    index = e.node("Range", [e.const(0, "int32", "start"), e.const(shape[axis], "int32", "limit"),
                             e.const(1, "int32", "delta")], main=True, what="range")
    index = e.node("Reshape", [index, e.const(per_axis_shape(len(shape), axis, shape[axis]), "int64", "index_shape")],
                   what="along_axis")
    e.node("Expand", [index, e.const(shape, "int64", "shape")], e.output(), what="to_src_shape")
