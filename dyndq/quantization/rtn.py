"""Round to nearest (RTN), exactly as ONNX Runtime's weight-only quantizer rounds.

NumPy on one block of groups (the matmul rule's levels in our compiled kernel where it is
built, `matmul_levels`); for a float32 weight with float32 scales both rules run instead in
the compiled kernel on the weight in place (kernels/_native_quantize.h, rtn_tile, called by
numerics.py), the same bytes: `groups` is [rows, n_groups, group_length] (one group is
`group_length` consecutive elements along the quantization axis); the result is the level of
every element, the zero level and the scale of every group (see `Levels`).

ONNX Runtime's `MatMulNBitsQuantizer` (default configuration, `onnxruntime.quantization.
matmul_nbits_quantizer`) rounds MatMul weights and Gather data by two different rules, and we
follow each, because the issue asks for its very codes (docs/quantize.md states both):

"matmul" (its C++ MlasQuantizeBlockwise, used for MatMul's B, and here for Gemm's B too):
  asymmetric: lo = min(min(group), 0), hi = max(max(group), 0); scale = (hi - lo) / qmax in
  float32; zero point = -lo / scale rounded half away from zero (C's roundf) and clamped to
  [0, qmax], 0 for an all-zero group; level = clamp(roundf(w * (1 / scale) + zp), 0, qmax),
  each step rounded to float32, with 1 / scale taken as 0 when the scale is 0.
  symmetric: m = the group's max if |max| > |min| else its min (signed; for a group of
  zeros its first element, whose sign the scale's zero takes); scale = -m / half (a negative
  scale maps the larger side to the lowest code); level as above with zp = half.
  The codes are computed against the scale as float16 holds it when scales are float16,
  and against the float32 scale otherwise (ONNX Runtime quantizes bfloat16 weights in float32
  and rounds the scales to bfloat16 afterwards).
"gather" (its NumPy quantize_ndarray, used for Gather's data), with NumPy's promotions
  (float32 and float16 weights in their own dtype; the quotients of a bfloat16 one in float32):
  asymmetric: lo, hi as above; scale = (hi - lo) / qmax; zero point = round_half_even(-lo /
  scale) clamped, half for an all-zero group; level = clamp(round_half_even(w / scale + zp)),
  half for an all-zero group.
  symmetric: m as above; scale = m / -half; level = clamp(round_half_even(w / scale)) + half,
  half for an all-zero group.
Here qmax = 2^bits - 1 and half = 2^(bits - 1): 3 and 2 for 2 bits, 15 and 8 for 4, 255 and 128 for 8.

Where ONNX Runtime's arithmetic overflows (a group spanning more than the largest value of
the dtype it computes (hi - lo) in: +-3e38 in float32, +-40000 in a float16 Gather table), it
writes an infinite scale and its weights dequantize to NaN; we compute that group's (hi - lo)
/ qmax in float64 instead (`range_scale`), a finite scale the dtype holds.  Every other group
is ONNX Runtime's, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dyndq.kernels import native
from dyndq.quantization.scratch import scratch

RULES = ("matmul", "gather")


@dataclass
class Levels:
    """A block of groups quantized: value = (level - zero) * scale.

    levels: uint8 [rows, n_groups, group_length], in [0, qmax]; zeros: uint8 [rows, n_groups];
    scales: [rows, n_groups] in the scale dtype.  Symmetric quantization has zeros == half
    everywhere: its signed codes are level - half."""

    levels: np.ndarray
    zeros: np.ndarray
    scales: np.ndarray


def qmax_of(bits: int) -> int:
    return (1 << bits) - 1


def half_of(bits: int) -> int:
    return 1 << (bits - 1)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: to nearest, ties away from zero (NumPy's round sends ties to even)."""
    whole = np.trunc(x)
    tie = np.abs(x - whole) == 0.5  # (exact: x - trunc(x) is exact in binary floating point)
    return np.where(tie, whole + np.sign(x), np.round(x))


def range_scale(high: np.ndarray, low: np.ndarray, qmax) -> np.ndarray:
    """(high - low) / qmax in the dtype NumPy gives it (ONNX Runtime's arithmetic); where that
    overflows, in float64, rounded back to that dtype, which holds it (it is at most 2 / qmax of
    the dtype's largest value)."""
    with np.errstate(over="ignore"):
        scale = np.asarray((high - low) / qmax)
    over = np.isinf(scale)
    if over.any():
        wide = (np.asarray(high, np.float64)[over] - np.asarray(low, np.float64)[over]) / float(qmax)
        scale[over] = wide.astype(scale.dtype)
    return scale


def rtn(groups: np.ndarray, *, bits: int, symmetric: bool, scale_dtype, rule: str = "matmul") -> Levels:
    if rule == "matmul":
        return _matmul_rule(groups, bits, symmetric, np.dtype(scale_dtype))
    if rule == "gather":
        return _gather_rule(groups, bits, symmetric, np.dtype(scale_dtype))
    raise ValueError(f"unknown rounding rule {rule!r}; one of {RULES}")


def _matmul_rule(groups, bits, symmetric, scale_dtype) -> Levels:
    g = groups.astype(np.float32, copy=False)
    stored, reciprocal, zero = matmul_scales(g, bits, symmetric, scale_dtype)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        levels = matmul_levels(g, reciprocal, zero, np.float32(qmax_of(bits)))
    return Levels(levels, zero.astype(np.uint8), stored)


def matmul_scales(g: np.ndarray, bits: int, symmetric: bool, scale_dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The matmul rule's (scale as stored, the float32 reciprocal its codes are made with, the
    float32 zero level) for each group of float32 `g` [rows, n_groups, group_length]: what
    `matmul_levels` takes (gptq.py rounds its columns one at a time with them)."""
    f32 = np.float32
    scale_dtype = np.dtype(scale_dtype)
    qmax, half = f32(qmax_of(bits)), f32(half_of(bits))
    low, high = g.min(axis=-1), g.max(axis=-1)
    if symmetric:
        m = np.where(np.abs(high) > np.abs(low), high, low)
        # a group of zeros: its first element, sign and all (its scan keeps the first of equal
        # values, -0 and 0 alike, so its scale is -0 after a 0 and 0 after a -0)
        m = np.where(m == 0, g[..., 0], m)
        scale = -m / half
        zero = np.full(scale.shape, half, f32)
    else:
        low, high = np.minimum(low, f32(0)), np.maximum(high, f32(0))
        scale = range_scale(high, low, qmax)
        with np.errstate(divide="ignore", invalid="ignore"):
            zero_real = np.where(scale != 0, f32(0) - low / scale, low)
        zero = np.clip(round_half_away(zero_real), f32(0), qmax)  # (clamping first, as it does, gives the same)
    with np.errstate(over="ignore"):  # (a scale its dtype cannot hold is infinite: numerics refuses it)
        stored = scale.astype(scale_dtype)
    # codes against the scale as stored when it is float16, else against the float32 scale
    against = stored.astype(f32) if scale_dtype == np.float16 else scale
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        reciprocal = np.where(against != 0, f32(1) / against, f32(0)).astype(f32)
    return stored, reciprocal, zero.astype(f32)


def matmul_levels(g: np.ndarray, reciprocal: np.ndarray, zero: np.ndarray, qmax) -> np.ndarray:
    """uint8 clamp(roundf(g * reciprocal + zero), 0, qmax) per group, each step in float32, a
    NaN level 0 (as ONNX Runtime's x86-64 build casts NaN; C leaves that cast undefined).

    The compiled kernel's one pass where it is built and on (dyndq.kernels.native.rtn_levels),
    else NumPy, the same bytes, in place on two float32 scratch arrays (the weight's hot loop;
    `round_half_away` makes seven new temporaries): x >= 0 rounds half away as trunc(x) +
    (x - trunc(x) >= 0.5), the fraction exact in binary floating point; every x < 0 clamps to
    level 0 whichever way it rounds; fmax sends a NaN to 0."""
    compiled = native.rtn_levels(g, reciprocal, zero, qmax)  # (kernels/_native.c: one pass)
    if compiled is not None:
        return compiled
    f32 = np.float32
    x, whole = scratch("rtn.x", g.shape, f32), scratch("rtn.whole", g.shape, f32)
    with np.errstate(over="ignore", invalid="ignore"):
        np.multiply(g, reciprocal[..., None], out=x)  # (a subnormal scale's reciprocal is infinite: 0 times it is NaN)
        x += zero[..., None]
        np.trunc(x, out=whole)
        x -= whole  # (the fraction; inf - inf is NaN, whose comparison is False: inf stays inf)
        whole += x >= f32(0.5)
        np.fmax(whole, f32(0), out=whole)
        np.minimum(whole, f32(qmax), out=whole)
    return whole.astype(np.uint8)


def _gather_rule(groups, bits, symmetric, scale_dtype) -> Levels:
    # NumPy's own promotions, as its code has them: Python scalars beside arrays of the weight's
    # dtype (float32 stays float32, float16 float16; a bfloat16 quotient comes out float32).
    g = groups
    qmax, half = qmax_of(bits), half_of(bits)
    low, high = g.min(axis=-1), g.max(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        if symmetric:
            m = np.where(np.abs(high) > np.abs(low), high, low)
            scale = m / float(-half)
            signed = np.where(scale[..., None] == 0, 0, g / scale[..., None])
            levels = np.clip(np.round(signed), -half, half - 1).astype(np.int16) + half
            zero = np.full(scale.shape, half, np.uint8)
        else:
            low, high = np.minimum(low, 0), np.maximum(high, 0)
            scale = range_scale(high, low, float(qmax))
            empty = scale == 0
            zero = np.clip(np.round(np.where(empty, half, -low / scale)), 0, qmax).astype(np.uint8)
            levels = np.clip(np.round(np.where(empty[..., None], half, g / scale[..., None] + zero[..., None])), 0, qmax)
    with np.errstate(over="ignore"):
        return Levels(levels.astype(np.uint8), zero, scale.astype(scale_dtype))
