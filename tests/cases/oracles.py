"""The independent oracle of the op's arithmetic, and how outputs are compared, for every engine's
tests: to the bit (`same_bits`, `same_values`) for our op, within a stated tolerance
(`close_after_matmul`) for values a MatMul sums in an engine's own order."""
from __future__ import annotations

import numpy as np

import dyndq
from dyndq.opdefs import dtypes

from .table import _random


def oracle(src, scales, zps=None, qtype="per_tensor", axis=1):
    """Version 1's arithmetic, float32(int64(src) - int64(zp)) * scale: version 2's with float32 scales."""
    return oracle_2(src, np.asarray(scales).astype(np.float32), zps, qtype, axis)


def oracle_2(src, scales, zps=None, qtype="per_tensor", axis=1, group_shape=None):
    """Version 2's arithmetic: version 3's with dst of the scales' dtype."""
    return oracle_3(src, scales, zps, qtype, axis, group_shape)


def along_src(src, scale, zp, qtype, axis, group_shape):
    """Scales and zero points placed against src: repeated over each group (per_group), shaped
    to src's axis (per_channel), or scalars (per_tensor)."""
    if qtype == "per_group":
        for i, g in enumerate(group_shape):
            scale = np.repeat(scale, g, axis=i)
            zp = np.repeat(zp, g, axis=i) if zp.ndim else zp
    elif qtype == "per_channel":
        shape = [1] * src.ndim
        shape[axis] = src.shape[axis]
        scale = scale.reshape(shape)
        zp = zp.reshape(()) if zp.size == 1 else zp.reshape(shape)
    else:
        scale, zp = scale.reshape(()), zp.reshape(())
    return scale, zp


def oracle_3(src, scales, zps=None, qtype="per_tensor", axis=1, group_shape=None, output_dtype=None):
    """Version 3's arithmetic written plainly with NumPy and ml_dtypes:
    OT(float32(decode(src) - decode(zp)) * float32(decode(scale))), parameters repeated to src's
    shape: integer codes' difference in int64, float codes (and float8e8m0 scales) decoded by
    ml_dtypes' casts and their zero points subtracted in float32 (IEEE's: a -0 code minus a -0 zero
    point is +0), OT output_dtype's or the scales' dtype; a float16 NaN is 0x7E00, whatever its
    sign and payload."""
    src = np.asarray(src)
    t2 = np.asarray(scales).dtype if output_dtype is None else dtypes.by_onnx(output_dtype).numpy
    scale = np.asarray(scales).astype(np.float32)
    float_codes = src.dtype.name in dyndq.opdefs.FLOAT_CODES_3
    zp = np.zeros((), np.int64) if zps is None else np.asarray(zps).astype(np.float32 if float_codes else np.int64)
    scale, zp = along_src(src, scale, zp, qtype, axis, group_shape)
    with np.errstate(all="ignore"):
        centered = (src.astype(np.float32) - zp.astype(np.float32) if float_codes
                    else (src.astype(np.int64) - zp).astype(np.float32))
        dst = np.asarray((centered * scale).astype(np.dtype(t2.name)))
    if dst.dtype.name == "float16":  # every float16 NaN is the one quiet NaN (README, "The op")
        dst.view(np.uint16)[np.isnan(dst)] = 0x7E00  # (a view in any layout: .astype keeps src's)
    return dst


def random_array(rng, dtype, shape, *, onednn=False) -> np.ndarray:
    """Random values of a dtype (our name, or oneDNN's short name with onednn=True)."""
    name = dtypes.by_onednn(dtype).name if onednn else dtype
    return _random(rng, name, shape)


def same_bits(a, b) -> bool:
    """Float arrays of one dtype and shape with the very same bits (NaN payloads and -0 included)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape or a.dtype.kind not in "fV" and a.dtype.name != "bfloat16":
        return False
    width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.array_equal(np.ascontiguousarray(a).view(width), np.ascontiguousarray(b).view(width))


def same_values(a, b) -> bool:
    """Arrays of one dtype and shape with the very same bytes: for floats, the same bits
    (the sign of zero and NaN payloads included), as every engine comparison must be."""
    a, b = np.asarray(a), np.asarray(b)
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


# The demo MLP's output y comes out of float32 MatMuls, which each engine sums in its own order
# (bit-identical on some CPUs, not on others): engines are compared on y within this tolerance;
# our op's outputs, always to the bit.
MATMUL_RTOL, MATMUL_ATOL = 1e-5, 1e-6


def close_after_matmul(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.allclose(a, b, rtol=MATMUL_RTOL, atol=MATMUL_ATOL)
