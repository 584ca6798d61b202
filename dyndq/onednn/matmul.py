"""The MatMul handler: dst = src @ weights (+ bias), accumulated in float32."""
from __future__ import annotations

import math

import numpy as np

from dyndq.onednn.emitter import OpEmitter, Refused
from dyndq.onednn.handler import Attr, handler
from dyndq.onednn.shared import FLOATS, no_attrs_from_onnx


def _weights_example(i: int, draw):
    """A linear layer's float weights (a rank-2 second operand) are N(0, 1/K), K the reduction
    length, as initialisers make them: activations then keep their magnitude."""
    if i != 1 or draw.dtype.is_integer or len(draw.shape) != 2:
        return None
    k = draw.shape[1] if draw.op.attrs.get("transpose_b") in (True, 1, "true", "True") else draw.shape[0]
    return draw.floats(std=1 / np.sqrt(max(k, 1)))


@handler("MatMul", roles=("src", "weights", "bias"), inputs=(2, 3), example=_weights_example,
         attrs=(Attr("transpose_a", "bool", False), Attr("transpose_b", "bool", False),
                Attr("accumulation_mode", "string", "strict", ("strict", "relaxed", "any", "f32"),
                     "we accumulate in float32")),
         onnx_types=("MatMul",), from_onnx=no_attrs_from_onnx)
def matmul(e: OpEmitter, attrs: dict) -> None:
    """transpose_a/b swap the last two dims of an input of rank >= 2 (no effect on rank 1); the
    result is rounded once to dst's dtype, which may differ from the inputs' (f16 inputs, f32 dst
    in the gated MLP)."""
    for i, t in enumerate(e.op.inputs):
        e.dtype_in(t, f"inputs[{i}]", FLOATS)
    for i, t in enumerate(e.op.inputs[:2]):
        if not t.shape:
            e.problem(f"inputs[{i}]", f"rank 0 ({t.describe()})", "a rank of at least 1 (a vector or a matrix, with batch dims)")
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
    if e.problems:
        raise Refused()
    flags = [attrs["transpose_a"], attrs["transpose_b"]]
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
