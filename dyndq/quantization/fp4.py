"""MXFP4 and NVFP4: one weight as float4e2m1 codes with block scales, by the rules docs/quantize.md states.

- "mxfp4" (OCP Microscaling v1.0): blocks of 32 along the axis; a block's float8e8m0 scale is
  2^e with e = floor(log2(max|x|)) - 2 (2: float4e2m1's largest exponent), clamped to
  [-127, 127] (e8m0's finite range); a block whose elements are all 0 takes e = -127 and codes
  0 (log2(0) has no value; any scale gives it back exactly, and -127 is the smallest).
- "nvfp4": blocks of 16; the tensor's float32 scale g = max|W| / (448 * 6); a block's scale
  float8e4m3fn(max|x| / 6 / g), computed in float32 in that order, rounded to nearest even and
  saturated at 448; its divisor d = float32(float32(block scale) * g).  An all-zero weight has
  g = 0 (every block scale 0, every code 0).
- the codes of both: float4e2m1 = x / d rounded to nearest, ties to even, clamped to +-6
  (d = 2^e for mxfp4); where d is 0 (a block scale that rounded to 0) the codes are 0.

x / d is taken in float64, where it is exact enough that rounding it to float4 is the rounding
of the true quotient (x and d have 24-bit significands, so a quotient that is not a tie of
float4 is at least 2^-27 of itself away from one, far above float64's 2^-53); float32 division
would round twice.  Nothing here rounds with ml_dtypes' casts: the grid of float4e2m1 is
stepped by hand (`to_float4`), and the casts only store values the grid holds exactly.

The last block of an axis that is not a multiple of the block is quantized on its own
elements and padded with code 0 (`QuantizedWeight.padded_to`), as the integer formats are.
Pure NumPy and ml_dtypes: no onnx here.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from dyndq.quantization.numerics import ErrorStats, QuantizedWeight

BLOCK = {"mxfp4": 32, "nvfp4": 16}  # elements per block along the reduction axis
FP4_MAX = 6.0  # float4e2m1's largest value
E4M3_MAX = 448.0  # float8e4m3fn's largest value
E8M0_EXPONENTS = (-127, 127)  # float8e8m0's finite exponents (0xFF is NaN)
ELEMENTS_AT_A_TIME = 1 << 15  # quantized at a time: their float64 temporaries stay in cache (measured: 4x faster than 2^23)


def to_float4(y: np.ndarray) -> np.ndarray:
    """float64 `y` rounded to float4e2m1's grid (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives): to
    nearest, ties to the even significand, clamped to +-6; float64 values on the grid.  Within
    [0, 2) the grid steps by 0.5, [2, 4) by 1, [4, 6] by 2, and in each an even multiple of the
    step is an even significand, so rint (ties to even) on y / step is the rounding."""
    a = np.minimum(np.abs(y), FP4_MAX)
    step = np.where(a < 2, 0.5, np.where(a < 4, 1.0, 2.0))
    return np.copysign(np.minimum(np.rint(a / step) * step, FP4_MAX), y)


def quantize_fp4(weight: np.ndarray, *, axis: int, format: str) -> QuantizedWeight:
    """`weight` in `format` ("mxfp4", "nvfp4") along `axis`: codes float4e2m1, scales float8e8m0
    (mxfp4) or float8e4m3fn with the float32 `tensor_scale` g (nvfp4), no zero points."""
    weight = np.asarray(weight)
    axis = axis % weight.ndim
    length = weight.shape[axis]
    block = BLOCK[format]
    n_blocks = -(-length // block)
    rows = np.moveaxis(weight, axis, -1).reshape(-1, length)
    g = _tensor_scale(weight) if format == "nvfp4" else None
    codes = np.zeros((rows.shape[0], n_blocks * block), ml_dtypes.float4_e2m1fn)
    scales = np.empty((rows.shape[0], n_blocks), ml_dtypes.float8_e8m0fnu if g is None else ml_dtypes.float8_e4m3fn)
    stats = ErrorStats()
    step = max(1, ELEMENTS_AT_A_TIME // (n_blocks * block))  # rows at a time
    for r in range(0, rows.shape[0], step):
        x = np.zeros((min(step, rows.shape[0] - r), n_blocks * block), np.float64)
        x[:, :length] = rows[r:r + step]
        x = x.reshape(x.shape[0], n_blocks, block)
        amax = np.abs(x).max(axis=-1)
        if g is None:
            stored, divisor = _mx_scales(amax)
        else:
            stored, divisor = _nv_scales(amax, g)
        with np.errstate(divide="ignore", invalid="ignore"):
            values = np.where(divisor[..., None] != 0, to_float4(x / divisor[..., None]), 0.0)
        codes[r:r + len(x)] = values.reshape(len(x), -1).astype(ml_dtypes.float4_e2m1fn)  # (exact: on the grid)
        scales[r:r + len(x)] = stored
        # the weight as the graph gives it back: float32(code) * float32(d), rounded to the weight's dtype
        back = (values.astype(np.float32) * divisor.astype(np.float32)[..., None]).astype(weight.dtype)
        stats.add(rows[r:r + step], back.reshape(len(x), -1)[:, :length])
    lead = [s for i, s in enumerate(weight.shape) if i != axis]
    codes = np.moveaxis(codes.reshape(*lead, n_blocks * block), -1, axis)
    scales = np.moveaxis(scales.reshape(*lead, n_blocks), -1, axis)
    return QuantizedWeight(np.ascontiguousarray(codes), np.ascontiguousarray(scales), None, axis, block, length,
                           stats, tensor_scale=g, format=format)


def _mx_scales(amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float8e8m0 scales, 2^e as float64) of blocks whose largest magnitudes are `amax`."""
    _, exponent = np.frexp(amax)  # amax = m * 2^exponent with m in [0.5, 1): floor(log2(amax)) = exponent - 1
    e = np.where(amax > 0, exponent.astype(np.int64) - 1 - 2, E8M0_EXPONENTS[0])
    e = np.clip(e, *E8M0_EXPONENTS)
    power = np.ldexp(1.0, e)
    return power.astype(ml_dtypes.float8_e8m0fnu), power  # (exact: a power of two in e8m0's range)


def _tensor_scale(weight: np.ndarray) -> np.float32:
    """g = float32(max|W|) / float32(448 * 6), in float32."""
    amax = np.float32(np.abs(weight.astype(np.float32)).max()) if weight.size else np.float32(0)
    return np.float32(amax / np.float32(E4M3_MAX * FP4_MAX))


def _nv_scales(amax: np.ndarray, g: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(float8e4m3fn block scales, d = float32(scale) * g as float64) for blocks of largest
    magnitudes `amax`, in float32: max / 6, then / g; rounded to nearest even, saturated at 448."""
    f32 = np.float32
    if g == 0:
        zero = np.zeros(amax.shape, np.float32)
        return zero.astype(ml_dtypes.float8_e4m3fn), zero.astype(np.float64)
    with np.errstate(over="ignore"):
        wanted = (amax.astype(f32) / f32(FP4_MAX)) / g
    stored = np.minimum(wanted, f32(E4M3_MAX)).astype(ml_dtypes.float8_e4m3fn)  # (saturated, then RNE)
    divisor = (stored.astype(f32) * g).astype(np.float64)
    return stored, divisor
