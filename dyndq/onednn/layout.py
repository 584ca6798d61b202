"""Handlers of the kinds that convert, move or reduce data: TypeCast, Reorder, StaticReshape,
StaticTranspose, Concat, ReduceSum, ReduceMax."""
from __future__ import annotations

from dyndq.onednn.emitter import FLOAT8, OpEmitter, Refused
from dyndq.onednn.handler import REQUIRED, Attr, handler
from dyndq.onednn.shared import FLOATS, axis_of, no_attrs_from_onnx


def _cast_from_onnx(w) -> dict:
    return {}  # `to` is the output's dtype, which the JSON gives the output


@handler("TypeCast", onnx_types=("Cast",), from_onnx=_cast_from_onnx)
def type_cast(e: OpEmitter, attrs: dict) -> None:
    """A float dtype to another, rounding to nearest even (to f8: ONNX's Cast, saturating)."""
    e.dtype_in(e.op.inputs[0], "inputs[0]", FLOATS | FLOAT8)
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS | FLOAT8)
    if e.problems:
        raise Refused()
    e.node("Cast", [e.input(0)], e.output(), main=True, to=e.op.outputs[0].dtype.onnx)


def _same_tensor(e: OpEmitter) -> None:
    src, dst = e.op.inputs[0], e.op.outputs[0]
    if src.dtype != dst.dtype:
        e.problem("outputs[0]", f"dtype {dst.dtype.onednn}", f"{src.dtype.onednn}, src's dtype (this op moves data only)")


@handler("Reorder", onnx_types=("Identity",), from_onnx=no_attrs_from_onnx)
def reorder(e: OpEmitter, attrs: dict) -> None:
    """A change of memory layout only: the logical tensor is the same."""
    _same_tensor(e)
    if e.op.inputs[0].shape != e.op.outputs[0].shape:
        e.problem("outputs[0]", f"shape {list(e.op.outputs[0].shape)}", f"{list(e.op.inputs[0].shape)}, src's shape")
    if e.problems:
        raise Refused()
    e.node("Identity", [e.input(0)], e.output(), main=True)


def _constant(w, i: int, what: str):
    """Input i of the ONNX node as a list, when it is an initializer; else named."""
    value = w.constants[i] if i < len(w.constants) else None
    if value is None:
        w.problem(f"inputs[{i}]", "a value computed in the graph", f"a constant {what} (an initializer): oneDNN's "
                                                                   f"{w.kind} takes it as an attribute")
        return None
    return value.tolist()


def _reshape_from_onnx(w) -> dict:
    shape = _constant(w, 1, "shape")
    return {"shape": [int(d) for d in shape or []], "special_zero": not w.values.get("allowzero", 0)}


@handler("StaticReshape", attrs=(Attr("shape", "s64[]", REQUIRED), Attr("special_zero", "bool", REQUIRED)),
         onnx_types=("Reshape",), onnx_inputs=1, from_onnx=_reshape_from_onnx)
def static_reshape(e: OpEmitter, attrs: dict) -> None:
    """`shape` with -1 inferred; 0 copies src's dim when special_zero, else means a zero dim."""
    _same_tensor(e)
    shape = attrs.get("shape")
    if shape is not None and not all(d >= -1 for d in shape):
        e.problem("shape", repr(shape), "a list of dims (-1 at most once)")
    if e.problems:
        raise Refused()
    e.node("Reshape", [e.input(0), e.const(shape, "int64", "shape")], e.output(), main=True,
           allowzero=0 if attrs["special_zero"] else 1)


def _transpose_from_onnx(w) -> dict:
    if "perm" in w.values:
        return {"order": list(w.values["perm"])}
    return {"order": list(range(w.ranks[0] or 0))[::-1]}


@handler("StaticTranspose", attrs=(Attr("order", "s64[]", REQUIRED),), onnx_types=("Transpose",),
         from_onnx=_transpose_from_onnx)
def static_transpose(e: OpEmitter, attrs: dict) -> None:
    _same_tensor(e)
    rank = len(e.op.inputs[0].shape)
    order = attrs.get("order")
    if order is not None and (len(order) != rank or not all(-rank <= d < rank for d in order)
                              or sorted(d % rank for d in order) != list(range(rank))):
        e.problem("order", repr(order), f"a permutation of the {rank} dims (negative counts from the end)")
    if e.problems:
        raise Refused()
    e.node("Transpose", [e.input(0)], e.output(), main=True, perm=[d % rank for d in order])


def _concat_from_onnx(w) -> dict:
    return {"axis": w.values["axis"]}


@handler("Concat", roles=("src_0", "src_1", "src_2", "src_3"), inputs=(1, 64), attrs=(Attr("axis", "s64", REQUIRED),),
         onnx_types=("Concat",), from_onnx=_concat_from_onnx)
def concat(e: OpEmitter, attrs: dict) -> None:
    n = len(e.op.inputs)
    for i, t in enumerate(e.op.inputs):
        if t.dtype != e.op.outputs[0].dtype:
            e.problem(f"inputs[{i}]", f"dtype {t.dtype.onednn}", f"{e.op.outputs[0].dtype.onednn}, dst's dtype")
    if e.problems:
        raise Refused()
    axis = axis_of(e, "axis", attrs["axis"], len(e.op.inputs[0].shape))
    if e.op.outputs[0].dtype.name in FLOATS | FLOAT8:  # (no float8 Concat in ONNX Runtime: through float32, exactly)
        e.float_op("Concat", list(range(n)), axis=axis)
    else:
        e.node("Concat", [e.input(i) for i in range(n)], e.output(), main=True, axis=axis)


def _reduce(onnx_type: str):
    def mapping(e: OpEmitter, attrs: dict) -> None:
        """Over `axes`; an empty list reduces over no axis (a training graph's dmask, whose
        dst has src's shape): the values as they are, ONNX's noop_with_empty_axes."""
        src, dst = e.op.inputs[0], e.op.outputs[0]
        rank = len(src.shape)
        axes = attrs.get("axes")
        if axes is not None and not all(-rank <= a < rank for a in axes):
            e.problem("axes", repr(axes), f"a list of axes in [{-rank}, {rank - 1}] (required)")
        elif axes == [] and dst.shape != src.shape:
            e.problem("axes", f"[] with dst shape {list(dst.shape)}",
                      f"axes to reduce over, or dst of src's shape {list(src.shape)} (no axis reduced)")
        e.dtype_in(src, "inputs[0]", FLOATS)
        if e.problems:
            raise Refused()
        e.finish("dst", onnx_type, [e.f32(0), e.const(sorted(a % rank for a in axes), "int64", "axes")],
                 keepdims=int(attrs["keep_dims"]), **({} if axes else {"noop_with_empty_axes": 1}))
    return mapping


def _reduce_from_onnx(w) -> dict:
    """axes from the input (opset 18) or the attribute (older ReduceMax); none means every dim,
    or none at all under noop_with_empty_axes (oneDNN's empty axes)."""
    axes = _constant(w, 1, "axes") if w.n_inputs > 1 else w.values.get("axes")
    if not axes and not w.values.get("noop_with_empty_axes"):  # no axes: every one (noop: none)
        axes = list(range(w.ranks[0] or 0))
    return {"axes": [int(a) for a in axes or []], "keep_dims": bool(w.values.get("keepdims", 1))}


for _kind in ("ReduceSum", "ReduceMax"):
    handler(_kind, attrs=(Attr("axes", "s64[]", REQUIRED), Attr("keep_dims", "bool", False)), onnx_types=(_kind,),
            onnx_inputs=1, from_onnx=_reduce_from_onnx)(_reduce(_kind))
