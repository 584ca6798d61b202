"""MatMulNBits' float zero points: what ONNX Runtime computes with them, and the doubled form
that lifts half-integer ones exactly.

ONNX Runtime's CPU MatMulNBits takes zero points of the scales' type (float32 or float16) with 2-
and 4-bit codes (8-bit ones it refuses) and computes q*scale - zp*scale there: float32 products
and difference, then rounded to the scales' type (measured on 1.32).  DynamicDequantize's zero
points are integers; a half-integer zp (1.5: the codebook [-1, -1/3, 1/3, 1] times a scale) is
lifted through (q - zp) * s = (2q - 2zp) * (s / 2): codes 2q, zero points 2zp, scales halved,
exact when halving is exact for every scale.  The lift takes either form only where its values
equal ONNX Runtime's on every weight (`onnxruntime_differences`); the way back divides by two
what the lift doubled (`doubled_problem` says when that no longer holds).  A zero point of -0.0
is 0 to both (ONNX Runtime's q*scale - zp*scale gives a weight of the same value): the lift keeps
its sign in the form (`negative_zeros`), and the way back writes it again (`with_negative_zeros`),
so that lift then export gives the same bytes.
"""
from __future__ import annotations

import base64

import numpy as np
import onnx

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_3, PER_GROUP, dtypes

from . import shared

# The type of the doubled codes 2q for each width: the next unsigned type holding 2 * (2^bits - 1).
DOUBLED_CODE_TYPES = {2: "uint4", 4: "uint8", 8: "uint16"}
# The integer types the doubled zero points 2zp are held in, smallest first.
ZERO_TYPES = ("uint4", "int4", "uint8", "int8", "int16", "int32")


def smallest_zero_type(zero: np.ndarray) -> str:
    """The first of ZERO_TYPES holding every value of `zero` (int64)."""
    for t in ZERO_TYPES:
        lo, hi = dtypes.integer_range(dtypes.by_name(t))
        if zero.size == 0 or (lo <= zero.min() and zero.max() <= hi):
            return t
    return "int64"


def inexact_halves(scales: np.ndarray) -> int:
    """How many scales s / 2 does not hold exactly in their own type (s / 2 * 2 gives other bits:
    a subnormal with its last bit set, or a NaN whose payload changes)."""
    half = (scales / 2).astype(scales.dtype)
    back = (half * 2).astype(scales.dtype)
    bits = f"u{scales.dtype.itemsize}"
    return int(np.count_nonzero(back.view(bits) != scales.view(bits)))


def packed_bytes(t: onnx.TensorProto) -> int:
    """A constant's bytes as ONNX stores it (sub-byte types packed)."""
    return -(-int(np.prod(t.dims, dtype=np.int64)) * dtypes.by_onnx(t.data_type).bits // 8)


def cost(who: str, before: int, tensors, code_type: str, zps_type: str) -> str:
    """The note saying what the doubled form costs, in bytes: `tensors` (the lifted codes, scales
    and zero points) against the foreign node's `before`."""
    after = sum(packed_bytes(t) for t in tensors)
    return (f"{who}: half-integer zero points lifted exactly as codes 2q ({code_type}), zero points 2zp "
            f"({zps_type}) and scales / 2: {after} bytes of codes, scales and zero points for MatMulNBits' "
            f"{before} ({after - before:+d})")


def onnxruntime_differences(q, scales, zero, block: int, K: int, bits: int, doubled: bool = False) -> int:
    """How many of the K rows' weights ONNX Runtime's q*scale - zp*scale (float32 products and
    difference, then rounded to the scales' type; measured on 1.32's CPU kernel) gives another
    value than DynamicDequantize's (q - zp)*scale.  Values, not bits: the sign of a zero weight
    (ONNX Runtime's +0 where q = zp under a negative scale, ours -0) is not seen through a
    MatMul, whose sums start at +0.  q [K_pad, N]; scales, zero [n_blocks, N] (`doubled`: zero
    holds 2zp, and ours is computed as the lift writes it, (2q - 2zp) * (scales / 2)).

    A weight's value depends on its code and its block only: both formulas are computed for each
    of the 2^bits codes in each block, [2^bits, n_blocks, N], and the weights whose (code, block)
    differs are counted only when some does."""
    levels = np.arange(1 << bits).reshape(-1, 1, 1)
    s32 = scales.astype(np.float32)
    zp32 = (zero / 2 if doubled else zero).astype(np.float32)  # (half-integers: exact in float32)
    theirs = (levels.astype(np.float32) * s32 - zp32 * s32).astype(scales.dtype).astype(np.float32)
    codes = np.broadcast_to(levels * (2 if doubled else 1), theirs.shape)
    kernel_scales = (scales / 2).astype(scales.dtype) if doubled else scales
    ours = DYNAMIC_DEQUANTIZE_3.kernel(shared.as_codes(codes, "int32"), kernel_scales[None], zero.astype(np.int32)[None],
                                       qtype=PER_GROUP, group_shape=(len(levels), 1, 1)).astype(np.float32)
    differ = (theirs != ours) & ~(np.isnan(theirs) & np.isnan(ours))  # [2^bits, n_blocks, N]
    if not differ.any():
        return 0
    rows = np.arange(K) // block
    return int(np.count_nonzero(differ[q[:K], rows[:, None], np.arange(q.shape[1])[None, :]]))


def doubled_problem(codes, scales, bits: int) -> str | None:
    """Why codes 2q, zero points 2zp and scales / 2 are not (any more) the doubled form of a
    MatMulNBits of `bits`-bit codes with half-integer zero points (None: they are)."""
    q = codes.astype(np.int64)
    if np.any(q % 2) or q.min(initial=0) < 0 or q.max(initial=0) >= 2 << bits:
        return f"codes that are not 2q for {bits}-bit codes q"
    doubled = (scales * 2).astype(scales.dtype)
    if np.any(~np.isfinite(doubled) & np.isfinite(scales)):
        return "scales whose double overflows"
    return None


def negative_zeros(zero_points: np.ndarray) -> str | None:
    """Which float zero points are -0.0, as the form keeps it: one bit each in their stored order,
    packed (NumPy's packbits) and in base64 (a JSON string an eighth of their count); None where
    none is."""
    minus = np.signbit(np.asarray(zero_points)).reshape(-1) & (np.asarray(zero_points).reshape(-1) == 0)
    return base64.b64encode(np.packbits(minus).tobytes()).decode("ascii") if minus.any() else None


def with_negative_zeros(values: np.ndarray, kept: str | None) -> np.ndarray:
    """Float zero points with the -0.0 ones the lift kept (`negative_zeros`) made -0.0 again, where
    they are still 0 (a form kept for another count of zero points is left out)."""
    if not isinstance(kept, str):
        return values
    try:
        bits = np.unpackbits(np.frombuffer(base64.b64decode(kept, validate=True), np.uint8))
    except ValueError:
        return values
    if not values.size <= bits.size < values.size + 8:
        return values
    flat = values.reshape(-1).copy()
    flat[(bits[:values.size] == 1) & (flat == 0)] = -0.0
    return flat.reshape(values.shape)
