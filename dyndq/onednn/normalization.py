"""Handlers of the normalization kinds: LayerNorm and RMSNorm (doc/graph/operations/LayerNorm.md,
RMSNorm.md; the op schemas of src/graph/interface/op_def.hpp).

Both normalize over the dims from `begin_norm_axis` to the last, in float32 (oneDNN keeps its
statistics in f32 whatever the data's dtype), and round once to dst's dtype.  LayerNorm is ONNX's
LayerNormalization (opset 17); RMSNorm is written out of ReduceMean, Sqrt and Div, as ONNX's
RMSNormalization needs opset 23 and the importer writes opset 21.
"""
from __future__ import annotations

import math

import numpy as np

from dyndq.onednn.emitter import OpEmitter, Refused
from dyndq.onednn.handler import Attr, handler
from dyndq.onednn.shared import FLOATS, axis_of

EPSILON = Attr("epsilon", "f32", 1e-5)
BEGIN_NORM_AXIS = Attr("begin_norm_axis", "s64", -1)


def _normalized(e: OpEmitter, attrs: dict) -> tuple[int, list[int]]:
    """The first normalized axis (in [0, rank)) and the normalized dims."""
    shape = list(e.op.inputs[0].shape)
    axis = axis_of(e, "begin_norm_axis", attrs["begin_norm_axis"], len(shape))
    if any(d < 0 for d in shape[axis:]):
        e.refuse("inputs[0]", f"shape {shape}", "known normalized dims (from begin_norm_axis on)")
    return axis, shape[axis:]


def _affine(e: OpEmitter, i: int, normalized: list[int], what: str) -> str:
    """Input i (gamma or beta) as a float32 tensor of the normalized dims: given so, or flat
    (one value per normalized element, as oneDNN's 1-D gamma spans the flattened channels)."""
    shape = list(e.op.inputs[i].shape)
    if shape == normalized:
        return e.f32(i)
    if shape == [math.prod(normalized)]:
        return e.node("Reshape", [e.f32(i), e.const(normalized, "int64", f"{what}_shape")], what=f"{what}_normalized")
    e.refuse(f"inputs[{i}]", f"shape {shape}", f"{normalized} or [{math.prod(normalized)}], one value per "
                                               f"normalized element")


def _norm_example(i: int, draw):
    """gamma around 1 (0.5 to 1.5), as trained scales are; beta small (-0.5 to 0.5)."""
    if draw.dtype.is_integer or i == 0:
        return None
    return draw.floats(0.5, 1.5) if i == 1 else draw.floats(-0.5, 0.5)


def _layer_norm_from_onnx(w) -> dict:
    """ONNX's LayerNormalization with its scale and bias: use_affine, no statistics (ONNX's second
    and third outputs are the mean and 1/sqrt(variance + epsilon), not oneDNN's variance)."""
    if w.n_inputs != 3:
        w.problem("inputs", f"{w.n_inputs} inputs", "3 (X, Scale, B): oneDNN's LayerNorm takes gamma and beta together")
    if w.n_outputs != 1:
        w.problem("outputs", f"{w.n_outputs} outputs", "1 (Y): oneDNN's statistics are the mean and the variance, "
                                                      "not ONNX's InvStdDev")
    return {"keep_stats": False, "begin_norm_axis": int(w.values.get("axis", -1)), "use_affine": True,
            "epsilon": float(w.values.get("epsilon", 1e-5))}


@handler("LayerNorm", roles=("src", "gamma", "beta"), inputs=(1, 3), outputs=(1, 3), example=_norm_example,
         onnx_types=("LayerNormalization",), from_onnx=_layer_norm_from_onnx,
         attrs=(Attr("keep_stats", "bool", True), BEGIN_NORM_AXIS, Attr("use_affine", "bool", True), EPSILON))
def layer_norm(e: OpEmitter, attrs: dict) -> None:
    """dst = gamma (src - mean) / sqrt(variance + epsilon) + beta, mean and variance (biased) over
    the normalized dims.  use_affine takes gamma and beta (inputs 1 and 2); keep_stats gives mean
    and variance as outputs 1 and 2, of src's shape without the normalized dims."""
    src = e.op.inputs[0]
    n_in, n_out = len(e.op.inputs), len(e.op.outputs)
    if n_in not in ((3,) if attrs["use_affine"] else (1, 3)):
        e.problem("inputs", f"{n_in} input{'s' * (n_in > 1)}",
                  "3 (src, gamma, beta) under use_affine (its default)" if attrs["use_affine"] else "1 (src) or 3")
    if n_out not in ((3,) if attrs["keep_stats"] else (1, 3)):
        e.problem("outputs", f"{n_out} output{'s' * (n_out > 1)}",
                  "3 (dst, mean, variance) under keep_stats (its default)" if attrs["keep_stats"] else "1 (dst) or 3")
    for i, t in enumerate(e.op.inputs):
        e.dtype_in(t, f"inputs[{i}]", FLOATS)
    for i, t in enumerate(e.op.outputs):
        e.dtype_in(t, f"outputs[{i}]", FLOATS)
    if e.problems:
        raise Refused()
    axis, normalized = _normalized(e, attrs)
    x = e.f32(0)
    if n_in == 3 and attrs["use_affine"]:
        scale, bias = _affine(e, 1, normalized, "gamma"), _affine(e, 2, normalized, "beta")
    else:  # ONNX's LayerNormalization takes a scale: ones, and no bias (gamma and beta, if given, unused)
        scale, bias = e.const(np.ones(normalized, np.float32), "float32", "ones"), None
    e.finish("dst", "LayerNormalization", [x, scale] + ([bias] if bias else []), axis=axis,
             epsilon=float(attrs["epsilon"]), stash_type=1)
    if n_out == 3:  # ONNX gives 1/sqrt(variance + epsilon); oneDNN wants the variance itself
        axes = e.const(list(range(axis, len(src.shape))), "int64", "stats_axes")
        mean = e.node("ReduceMean", [x, axes], what="mean_kept", keepdims=1)
        centred = e.node("Sub", [x, mean], what="centred")
        variance = e.node("ReduceMean", [e.node("Mul", [centred, centred], what="squares"), axes], what="variance_kept",
                          keepdims=1)
        for out, value in ((1, mean), (2, variance)):
            _stat(e, out, value)


def _stat(e: OpEmitter, out: int, value: str) -> None:
    """A statistic (normalized dims kept as 1) as output `out` declares it: those dims dropped, in
    its dtype."""
    t = e.op.outputs[out]
    shape = e.const(list(t.shape), "int64", f"{('mean', 'variance')[out - 1]}_shape")
    if t.dtype.name == "float32":
        e.node("Reshape", [value, shape], e.output(out), what="stat")
    else:
        e.node("Cast", [e.node("Reshape", [value, shape], what="stat")], e.output(out), what="stat_dtype", to=t.dtype.onnx)


@handler("RMSNorm", roles=("src", "gamma"), inputs=(1, 2), example=_norm_example, attrs=(EPSILON, BEGIN_NORM_AXIS))
def rms_norm(e: OpEmitter, attrs: dict) -> None:
    """dst = gamma src / sqrt(mean(src^2) + epsilon) over the normalized dims: oneDNN's layer
    normalization under its rms_norm flag (mean taken as 0, the variance as the mean square),
    gamma broadcast numpy-style (RMSNorm.md)."""
    for i, t in enumerate(e.op.inputs):
        e.dtype_in(t, f"inputs[{i}]", FLOATS)
    e.dtype_in(e.op.outputs[0], "outputs[0]", FLOATS)
    if e.problems:
        raise Refused()
    axis, _ = _normalized(e, attrs)
    x = e.f32(0)
    axes = e.const(list(range(axis, len(e.op.inputs[0].shape))), "int64", "axes")
    mean_square = e.node("ReduceMean", [e.node("Mul", [x, x], what="squares"), axes], what="mean_square", keepdims=1)
    rms = e.node("Sqrt", [e.node("Add", [mean_square, e.const(float(attrs["epsilon"]), "float32", "epsilon")],
                                 what="plus_epsilon")], what="rms")
    if len(e.op.inputs) == 1:
        e.finish("dst", "Div", [x, rms])
    else:
        e.finish("dst", "Mul", [e.node("Div", [x, rms], what="normalized"), e.f32(1)])
