"""Handlers of the element-wise kinds: binary and unary arithmetic, GELU, Pow, SoftMax, the
comparison GreaterEqual, Select and GenIndex (formulas from doc/graph/operations/*.md)."""
from __future__ import annotations

import numpy as np

from dyndq.onednn.emitter import OpEmitter, Refused
from dyndq.onednn.handler import REQUIRED, Attr, handler
from dyndq.onednn.shared import (BROADCAST, FLOATS, axis_of, broadcast_from_onnx, check_broadcast,
                                 no_attrs_from_onnx, per_axis_shape)


def _binary(onnx_type: str):
    def mapping(e: OpEmitter, attrs: dict) -> None:
        """In float32, rounded once to dst's dtype.  oneDNN lets the inputs' dtypes differ (one of
        them then f32, as dst) and takes an s32 input beside a float one (an implicit causal
        mask added as s32): it is widened to float32 exactly (|value| <= 2^24, as a mask's are)."""
        check_broadcast(e, attrs)
        if not any(t.dtype.name in FLOATS for t in e.op.inputs):
            e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
        for i, t in enumerate(e.op.inputs):
            e.dtype_in(t, f"inputs[{i}]", FLOATS | {"int32"})
        e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
        if e.problems:
            raise Refused()
        e.float_op(onnx_type, [0, 1])
    return mapping


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


for _kind, _onnx in (("Add", "Add"), ("Subtract", "Sub"), ("Multiply", "Mul"), ("Divide", "Div"),
                     ("Maximum", "Max"), ("Minimum", "Min")):
    handler(_kind, roles=("src_0", "src_1"), inputs=(2, 2), attrs=(BROADCAST,), onnx_types=(_onnx,),
            from_onnx=_binary_from_onnx, example={"Divide": _positive_divisor, "Multiply": _scale_factor}.get(_kind))(
                _binary(_onnx))


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


for _kind, _onnx in (("Sigmoid", "Sigmoid"), ("ReLU", "Relu"), ("Exp", "Exp"), ("Sqrt", "Sqrt")):
    handler(_kind, onnx_types=(_onnx,), from_onnx=no_attrs_from_onnx,
            example=_non_negative if _kind == "Sqrt" else None)(_unary(_onnx))


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
