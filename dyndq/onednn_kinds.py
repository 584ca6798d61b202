"""One mapping per oneDNN op kind, in one table (`KINDS`): each writes the op as ONNX nodes.

Every mapping follows oneDNN's documented semantics (doc/graph/operations/*.md and
the op schemas in src/graph/interface/op_def.hpp): attributes it cannot honour, and
dtypes outside what the kind takes, are named as problems rather than guessed at.
Float arithmetic runs in float32 between exact Casts (see onednn_emitter.py).
"""
from __future__ import annotations

import math
from typing import Callable

from dyndq.onednn_emitter import LOW_FLOATS, OpEmitter, Refused

FLOATS = {"float32"} | LOW_FLOATS
NUMPY_BROADCAST = ("numpy", "none")
KINDS: dict[str, Callable[[OpEmitter], None]] = {}
ROLES: dict[str, tuple[str, ...]] = {}  # kind -> names of its inputs, for readable value names


def kind(name: str, roles: tuple[str, ...] = ("src",)):
    def register(fn):
        KINDS[name] = fn
        ROLES[name] = roles
        return fn
    return register


def _flag(e: OpEmitter, key: str, value) -> bool:
    if isinstance(value, bool) or value in (0, 1):
        return bool(value)
    if value in ("true", "false", "True", "False"):
        return value.lower() == "true"
    e.refuse(key, repr(value), "a bool (true/false or 0/1)")


def _axis(e: OpEmitter, key: str, value, rank: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not -rank <= value < max(rank, 1):
        e.refuse(key, repr(value), f"an integer in [{-rank}, {rank - 1}]")
    return value % rank if rank else 0


def _broadcast(e: OpEmitter, attrs: dict) -> None:
    mode = attrs["auto_broadcast"]
    if mode not in NUMPY_BROADCAST:
        e.refuse("auto_broadcast", repr(mode), "'numpy' or 'none'")
    if mode == "none":
        shapes = {t.shape for t in e.op.inputs}
        if len(shapes) > 1:
            e.refuse("auto_broadcast", f"'none' with input shapes {[list(s) for s in sorted(shapes)]}",
                     "inputs of one shape (auto_broadcast='none' does not broadcast)")


# -- the quantization ops ----------------------------------------------------------------------


@kind("DynamicDequantize", ("src", "scales", "zps"))
def dynamic_dequantize(e: OpEmitter) -> None:
    """Our op, as it is: same inputs, attributes and dtypes."""
    import dyndq
    from dyndq.opdefs import ValidationError

    e.arity((2, 3))
    e.attrs(qtype="per_tensor", axis=1, group_shape=None)
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


def _quantize_arith(e: OpEmitter, src: str, scale: str, zp: str | None, dst_index: int = 0) -> None:
    """dst = saturate(round_half_even(src / scale + zp)), as Quantize and DynamicQuantize document it
    (oneDNN leaves the rounding mode to the library; we round half to even, as ONNX does)."""
    from dyndq.opdefs import dtypes

    dst = e.op.outputs[dst_index]
    lo, hi = dtypes.integer_range(dst.dtype)
    value = e.node("Div", [src, scale], main=True, what="div")
    if zp is not None:
        value = e.node("Add", [value, zp], what="add_zp")
    value = e.node("Round", [value], what="round")
    value = e.node("Clip", [value, e.const(lo, "float32", "min"), e.const(hi, "float32", "max")], what="saturate")
    e.node("Cast", [value], e.output(dst_index), what="to_dst", to=dst.dtype.onnx)


def _per_axis_shape(rank: int, axis: int, n: int) -> list[int]:
    shape = [1] * rank
    shape[axis] = n
    return shape


def _static_params(e: OpEmitter, attrs: dict, rank: int, channels_of) -> tuple[list, list, int | None]:
    scales, zps = attrs["scales"], attrs["zps"]
    if not isinstance(scales, list) or not scales or not all(isinstance(s, (int, float)) for s in scales):
        e.refuse("scales", repr(scales), "a non-empty list of f32 scales")
    zps = [0] * len(scales) if zps is None else zps
    if not isinstance(zps, list) or not all(isinstance(z, int) for z in zps):
        e.refuse("zps", repr(zps), "a list of s64 zero points")
    if attrs["qtype"] == "per_tensor":
        if len(scales) != 1 or len(zps) != 1:
            e.refuse("scales", f"{len(scales)} scales and {len(zps)} zps", "one of each for qtype='per_tensor'")
        return scales, zps, None
    if attrs["qtype"] != "per_channel":
        e.refuse("qtype", repr(attrs["qtype"]), "'per_tensor' or 'per_channel'")
    axis = _axis(e, "axis", attrs["axis"], rank)
    n = channels_of(axis)
    if len(scales) != n or len(zps) not in (n,):
        e.refuse("scales", f"{len(scales)} scales and {len(zps)} zps",
                 f"{n} of each, the size of dimension {axis} (qtype='per_channel')")
    return scales, zps, axis


@kind("Quantize")
def quantize(e: OpEmitter) -> None:
    e.arity(1)
    attrs = e.attrs(qtype="per_tensor", axis=1, scales=None, zps=None)
    src, dst = e.op.inputs[0], e.op.outputs[0]
    e.dtype_in(src, "inputs[0]", {"float32"})
    e.dtype_in(dst, "outputs[0]", {"int8", "uint8"})
    scales, zps, axis = _static_params(e, attrs, len(src.shape), lambda a: src.shape[a])
    if e.problems:
        raise Refused()
    shape = [] if axis is None else _per_axis_shape(len(src.shape), axis, len(scales))
    import numpy as np

    _quantize_arith(e, e.input(0), e.const(np.reshape(scales, shape), "float32", "scales"),
                    e.const(np.reshape(zps, shape), "float32", "zps"))


@kind("Dequantize")
def dequantize(e: OpEmitter) -> None:
    """dst = (src - zp) * scale with the attribute's scales and zps: our op with constant inputs
    (int32 zero points hold every s64 zp that fits the s8/u8 range oneDNN takes)."""
    import numpy as np

    import dyndq

    e.arity(1)
    attrs = e.attrs(qtype="per_tensor", axis=1, scales=None, zps=None)
    src, dst = e.op.inputs[0], e.op.outputs[0]
    e.dtype_in(src, "inputs[0]", {"int8", "uint8"})
    e.dtype_in(dst, "outputs[0]", {"float32"})
    scales, zps, axis = _static_params(e, attrs, len(src.shape), lambda a: src.shape[a])
    if any(not -2**31 <= z < 2**31 for z in zps):
        e.problem("zps", repr(zps), "zero points within the s32 range")
    if e.problems:
        raise Refused()
    extra = {} if axis is None else {"qtype": "per_channel", "axis": axis}
    node = dyndq.make_node([e.input(0), e.const(scales, "float32", "scales"), e.const(zps, "int32", "zps")],
                           [e.output()], name=e.node_name, **extra)
    e.tag(node, main=True)
    e.nodes.append(node)


@kind("DynamicQuantize", ("src", "scales", "zps"))
def dynamic_quantize(e: OpEmitter) -> None:
    e.arity((2, 3))
    attrs = e.attrs(qtype="per_tensor", axis=1)
    src, dst = e.op.inputs[0], e.op.outputs[0]
    e.dtype_in(src, "inputs[0]", {"float32"})
    e.dtype_in(e.op.inputs[1], "inputs[1]", {"float32"})
    if len(e.op.inputs) > 2:
        e.dtype_in(e.op.inputs[2], "inputs[2]", {"int8", "uint8", "int32"})
    e.dtype_in(dst, "outputs[0]", {"int8", "uint8"})
    rank = len(src.shape)
    if attrs["qtype"] not in ("per_tensor", "per_channel"):
        e.refuse("qtype", repr(attrs["qtype"]), "'per_tensor' or 'per_channel'")
    if e.problems:
        raise Refused()
    shape = [] if attrs["qtype"] == "per_tensor" else _per_axis_shape(rank, _axis(e, "axis", attrs["axis"], rank), -1)
    import numpy as np

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

    _quantize_arith(e, e.input(0), param(1), param(2) if len(e.op.inputs) > 2 else None)


# -- matmul --------------------------------------------------------------------------------------


@kind("MatMul", ("src", "weights", "bias"))
def matmul(e: OpEmitter) -> None:
    """dst = src @ weights (+ bias), accumulated in float32; transpose_a/b swap the last two dims of
    an input of rank >= 2 (no effect on rank 1); the result is rounded once to dst's dtype, which
    may differ from the inputs' (f16 inputs, f32 dst in the gated MLP)."""
    e.arity((2, 3))
    attrs = e.attrs(transpose_a=False, transpose_b=False, accumulation_mode="strict")
    if attrs["accumulation_mode"] not in ("strict", "relaxed", "any", "f32"):
        e.problem("accumulation_mode", repr(attrs["accumulation_mode"]),
                  "'strict', 'relaxed', 'any' or 'f32' (we accumulate in float32)")
    for i, t in enumerate(e.op.inputs):
        e.dtype_in(t, f"inputs[{i}]", FLOATS)
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
    flags = [_flag(e, k, attrs[k]) for k in ("transpose_a", "transpose_b")]
    if e.problems:
        raise Refused()
    operands = []
    for i, flag in enumerate(flags):
        value, rank = e.f32(i), len(e.op.inputs[i].shape)
        if flag and rank >= 2:
            perm = list(range(rank - 2)) + [rank - 1, rank - 2]
            value = e.node("Transpose", [value], what=f"transpose_{'ab'[i]}", perm=perm)
        operands.append(value)
    want = list(e.op.outputs[0].shape)
    numpy_shape = _numpy_matmul_shape(*(list(t.shape) for t in e.op.inputs[:2]), flags)
    # oneDNN keeps the unit dim a rank-1 operand was given where numpy drops it: the same elements
    reshape = numpy_shape is not None and numpy_shape != want and math.prod(numpy_shape) == math.prod(want)
    if len(e.op.inputs) == 2 and not reshape:
        e.finish("dst", "MatMul", operands)
        return
    value = e.node("MatMul", operands, main=True, what="matmul")
    if reshape:
        value = e.node("Reshape", [value, e.const(want, "int64", "dst_shape")], what="dst_shape")
    dst = e.op.outputs[0]
    if len(e.op.inputs) == 3:
        value = e.node("Add", [value, e.f32(2)], e.output() if dst.dtype.name == "float32" else None, what="bias")
    if dst.dtype.name != "float32" or len(e.op.inputs) == 2:
        e.node("Cast", [value], e.output(), what="to_dst", to=dst.dtype.onnx)


def _numpy_matmul_shape(a: list[int], b: list[int], flags) -> list[int] | None:
    """The shape ONNX's (numpy's) MatMul gives; None when the shapes do not fit."""
    if flags[0] and len(a) >= 2:
        a = a[:-2] + [a[-1], a[-2]]
    if flags[1] and len(b) >= 2:
        b = b[:-2] + [b[-1], b[-2]]
    a2, b2 = ([1] + a if len(a) == 1 else a), (b + [1] if len(b) == 1 else b)
    if a2[-1] != b2[-2]:
        return None
    batch_a, batch_b = a2[:-2], b2[:-2]
    n = max(len(batch_a), len(batch_b))
    batch_a, batch_b = [1] * (n - len(batch_a)) + batch_a, [1] * (n - len(batch_b)) + batch_b
    batch = [max(x, y) if 1 in (x, y) else x for x, y in zip(batch_a, batch_b)]
    out = batch + ([a2[-2]] if len(a) > 1 else []) + ([b2[-1]] if len(b) > 1 else [])
    return out


# -- element-wise ------------------------------------------------------------------------------


def _binary(onnx_type: str):
    def mapping(e: OpEmitter) -> None:
        e.arity(2)
        attrs = e.attrs(auto_broadcast="numpy")
        _broadcast(e, attrs)
        for i, t in enumerate(e.op.inputs):
            e.dtype_in(t, f"inputs[{i}]", FLOATS)
        if e.problems:
            raise Refused()
        e.float_op(onnx_type, [0, 1])
    return mapping


for _kind, _onnx in (("Add", "Add"), ("Subtract", "Sub"), ("Multiply", "Mul"), ("Divide", "Div"),
                     ("Maximum", "Max"), ("Minimum", "Min")):
    kind(_kind, ("src_0", "src_1"))(_binary(_onnx))


def _unary(onnx_type: str, **defaults):
    def mapping(e: OpEmitter) -> None:
        e.arity(1)
        e.attrs(**defaults)
        e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
        if e.problems:
            raise Refused()
        e.float_op(onnx_type, [0])
    return mapping


for _kind, _onnx in (("Sigmoid", "Sigmoid"), ("ReLU", "Relu"), ("Exp", "Exp"), ("Sqrt", "Sqrt")):
    kind(_kind)(_unary(_onnx))


@kind("GELU")
def gelu(e: OpEmitter) -> None:
    """mode gelu_erf (the default): x/2 (1 + erf(x/sqrt 2)); gelu_tanh: the tanh approximation."""
    e.arity(1)
    attrs = e.attrs(mode="gelu_erf")
    approx = {"gelu_erf": "none", "gelu_tanh": "tanh"}.get(attrs["mode"])
    if approx is None:
        e.problem("mode", repr(attrs["mode"]), "'gelu_erf' or 'gelu_tanh'")
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
    if e.problems:
        raise Refused()
    e.float_op("Gelu", [0], approximate=approx)


@kind("Pow")
def power(e: OpEmitter) -> None:
    """dst = src ** beta (oneDNN 3.x: one input and the f32 attribute beta)."""
    e.arity(1)
    attrs = e.attrs(beta=None)
    beta = attrs["beta"]
    if isinstance(beta, bool) or not isinstance(beta, (int, float)):
        e.refuse("beta", "missing" if beta is None else repr(beta), "an f32 exponent (required)")
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
    if e.problems:
        raise Refused()
    e.finish("dst", "Pow", [e.f32(0), e.const(beta, "float32", "beta")])


@kind("SoftMax")
def softmax(e: OpEmitter) -> None:
    """exp(x - max) / sum exp(x - max) along `axis`; mode inf_as_zero gives zeros for a slice
    that is all minus infinity (plain softmax gives NaN there)."""
    e.arity(1)
    attrs = e.attrs(axis=1, mode="none")
    if attrs["mode"] not in ("none", "inf_as_zero"):
        e.problem("mode", repr(attrs["mode"]), "'none' or 'inf_as_zero'")
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
    if e.problems:
        raise Refused()
    axis = _axis(e, "axis", attrs["axis"], len(e.op.inputs[0].shape))
    if attrs["mode"] == "none":
        e.float_op("Softmax", [0], axis=axis)
        return
    x = e.f32(0)
    y = e.node("Softmax", [x], main=True, what="softmax", axis=axis)
    top = e.node("ReduceMax", [x, e.const([axis], "int64", "axis")], what="row_max", keepdims=1)
    empty = e.node("Equal", [top, e.const(float("-inf"), "float32", "minus_inf")], what="all_minus_inf")
    e.finish("dst", "Where", [empty, e.const(0.0, "float32", "zero"), y])


# -- comparisons, selection and indices --------------------------------------------------------


@kind("GreaterEqual", ("src_0", "src_1"))
def greater_equal(e: OpEmitter) -> None:
    e.arity(2)
    attrs = e.attrs(auto_broadcast="numpy")
    _broadcast(e, attrs)
    e.dtype_in(e.op.outputs[0], "outputs[0]", {"bool"})
    ints = all(t.dtype.is_integer for t in e.op.inputs) and len({t.dtype for t in e.op.inputs}) == 1
    if not ints:
        for i, t in enumerate(e.op.inputs):
            e.dtype_in(t, f"inputs[{i}]", FLOATS)
    if e.problems:
        raise Refused()
    inputs = [e.input(0), e.input(1)] if ints else [e.f32(0), e.f32(1)]
    e.node("GreaterOrEqual", inputs, e.output(), main=True)


@kind("Select", ("cond", "then", "else"))
def select(e: OpEmitter) -> None:
    """dst = cond ? then : else, broadcast numpy-style; exact in any dtype."""
    e.arity(3)
    attrs = e.attrs(auto_broadcast="numpy")
    _broadcast(e, attrs)
    e.dtype_in(e.op.inputs[0], "inputs[0]", {"bool"})
    for i in (1, 2):
        e.dtype_in(e.op.inputs[i], f"inputs[{i}]", FLOATS)
    if e.problems:
        raise Refused()
    e.finish("dst", "Where", [e.input(0), e.f32(1), e.f32(2)])


@kind("GenIndex")
def gen_index(e: OpEmitter) -> None:
    """dst (s32, src's shape) holds each element's index along `axis`."""
    e.arity(1)
    attrs = e.attrs(axis=None)
    shape = list(e.op.inputs[0].shape)
    if attrs["axis"] is None:
        e.refuse("axis", "missing", "an integer axis (required)")
    axis = _axis(e, "axis", attrs["axis"], len(shape))
    e.dtype_in(e.op.outputs[0], "outputs[0]", {"int32"})
    if any(d < 0 for d in shape):
        e.problem("inputs[0]", f"shape {shape}", "a known shape (GenIndex's output is made from it)")
    if e.problems:
        raise Refused()
    index = e.node("Range", [e.const(0, "int32", "start"), e.const(shape[axis], "int32", "limit"),
                             e.const(1, "int32", "delta")], main=True, what="range")
    index = e.node("Reshape", [index, e.const(_per_axis_shape(len(shape), axis, shape[axis]), "int64", "index_shape")],
                   what="along_axis")
    e.node("Expand", [index, e.const(shape, "int64", "shape")], e.output(), what="to_src_shape")


# -- conversion, layout, shape -------------------------------------------------------------------


@kind("TypeCast")
def type_cast(e: OpEmitter) -> None:
    """A float dtype to another, rounding to nearest even."""
    e.arity(1)
    e.attrs()
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
    if e.problems:
        raise Refused()
    e.node("Cast", [e.input(0)], e.output(), main=True, to=e.op.outputs[0].dtype.onnx)


def _same_tensor(e: OpEmitter) -> None:
    src, dst = e.op.inputs[0], e.op.outputs[0]
    if src.dtype != dst.dtype:
        e.problem("outputs[0]", f"dtype {dst.dtype.onednn}", f"{src.dtype.onednn}, src's dtype (this op moves data only)")


@kind("Reorder")
def reorder(e: OpEmitter) -> None:
    """A change of memory layout only: the logical tensor is the same."""
    e.arity(1)
    e.attrs()
    _same_tensor(e)
    if e.op.inputs[0].shape != e.op.outputs[0].shape:
        e.problem("outputs[0]", f"shape {list(e.op.outputs[0].shape)}", f"{list(e.op.inputs[0].shape)}, src's shape")
    if e.problems:
        raise Refused()
    e.node("Identity", [e.input(0)], e.output(), main=True)


@kind("StaticReshape")
def static_reshape(e: OpEmitter) -> None:
    """`shape` with -1 inferred; 0 copies src's dim when special_zero, else means a zero dim."""
    e.arity(1)
    attrs = e.attrs(shape=None, special_zero=None)
    _same_tensor(e)
    shape = attrs["shape"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= -1 for d in shape):
        e.problem("shape", repr(shape), "a list of dims (-1 at most once)")
    if attrs["special_zero"] is None:
        e.problem("special_zero", "missing", "a bool (required)")
    if e.problems:
        raise Refused()
    zero_copies = _flag(e, "special_zero", attrs["special_zero"])
    e.node("Reshape", [e.input(0), e.const(shape, "int64", "shape")], e.output(), main=True,
           allowzero=0 if zero_copies else 1)


@kind("StaticTranspose")
def static_transpose(e: OpEmitter) -> None:
    e.arity(1)
    attrs = e.attrs(order=None)
    _same_tensor(e)
    rank = len(e.op.inputs[0].shape)
    order = attrs["order"]
    if not isinstance(order, list) or sorted(d % rank if isinstance(d, int) and -rank <= d < rank else None for d in order
                                             if isinstance(d, int)) != list(range(rank)) or len(order) != rank:
        e.problem("order", repr(order), f"a permutation of the {rank} dims (negative counts from the end)")
    if e.problems:
        raise Refused()
    e.node("Transpose", [e.input(0)], e.output(), main=True, perm=[d % rank for d in order])


@kind("Concat", ("src_0", "src_1", "src_2", "src_3"))
def concat(e: OpEmitter) -> None:
    n = len(e.op.inputs)
    e.arity((1, max(n, 1)))
    attrs = e.attrs(axis=None)
    if attrs["axis"] is None:
        e.refuse("axis", "missing", "an integer axis (required)")
    axis = _axis(e, "axis", attrs["axis"], len(e.op.inputs[0].shape))
    for i, t in enumerate(e.op.inputs):
        if t.dtype != e.op.outputs[0].dtype:
            e.problem(f"inputs[{i}]", f"dtype {t.dtype.onednn}", f"{e.op.outputs[0].dtype.onednn}, dst's dtype")
    if e.problems:
        raise Refused()
    if e.op.outputs[0].dtype.name in FLOATS:
        e.float_op("Concat", list(range(n)), axis=axis)
    else:
        e.node("Concat", [e.input(i) for i in range(n)], e.output(), main=True, axis=axis)


def _reduce(onnx_type: str):
    def mapping(e: OpEmitter) -> None:
        e.arity(1)
        attrs = e.attrs(axes=None, keep_dims=False)
        rank = len(e.op.inputs[0].shape)
        axes = attrs["axes"]
        if not isinstance(axes, list) or not axes or not all(isinstance(a, int) and -rank <= a < rank for a in axes):
            e.problem("axes", repr(axes), f"a non-empty list of axes in [{-rank}, {rank - 1}] (required)")
        e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS)
        if e.problems:
            raise Refused()
        keep = _flag(e, "keep_dims", attrs["keep_dims"])
        e.finish("dst", onnx_type, [e.f32(0), e.const(sorted(a % rank for a in axes), "int64", "axes")],
                 keepdims=int(keep))
    return mapping


kind("ReduceSum")(_reduce("ReduceSum"))
kind("ReduceMax")(_reduce("ReduceMax"))
