"""float32 -> float16 / bfloat16, rounded to nearest even, exactly as NumPy / ml_dtypes cast.

NumPy's own float32 -> float16 cast is a scalar loop of bit manipulation (about 5 ns
an element on a 2020s x86 core: it uses no F16C instructions), which would make it
the whole cost of a float16 dequantization.  `to_float16` gets the very same bits
with a dozen vectorized NumPy passes over a cache-resident block:

* M = 2**(max(e, -14) + 13), e the exponent of |p|: the unit in the last place of M
  is float16's at |p| (its normal or, below 2**-14, its subnormal spacing), so the
  float32 sum |p| + M, rounded to nearest even, rounds |p| to float16's precision;
  subtracting M again is exact.
* |p| is first capped at 65536: everything from 65520 up rounds to 65536 or more,
  which is float16's infinity.
* Multiplying the rounded value by 2**-112 rebases float32's exponent onto
  float16's (float16 subnormals become float32 subnormals, exactly), so the bits
  shifted right by 13 are float16's.
* NaNs (rare) become the one quiet NaN 0x7E00, sign and payload dropped: ONNX
  Runtime's float32 -> float16 conversions keep a payload in some code paths and
  drop it (keeping the sign) in others, so only this NaN is the same on every engine
  (the lowering makes ORT's NaNs this one too).

Checked against NumPy's cast for all 2**32 float32 bit patterns when written (NaNs apart).
bfloat16 uses ml_dtypes' own cast, which is the oracle's.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["to_float16", "to_bfloat16"]

_U32 = np.dtype(np.uint32)
_ABS = np.uint32(0x7FFFFFFF)
_EXP = np.uint32(0x7F800000)
_EXP_MIN = np.uint32(0x38800000)  # 2**-14: float16's smallest normal; below, a fixed spacing
_EXP_MAX = np.uint32(0x47000000)  # 2**15: float16's largest exponent
_PLUS_13 = np.uint32(13 << 23)
_CAP = np.uint32(0x47800000)  # 65536.0
_REBASE = np.float32(2.0**-112)
_SIGN16 = np.uint32(0x8000)
_0, _13, _16 = np.uint32(0), np.uint32(13), np.uint32(16)  # NumPy scalars: Python ints cost a cast
_BF16 = np.dtype(ml_dtypes.bfloat16)
QUIET_NAN16 = np.uint16(0x7E00)  # every float16 NaN the kernel gives (see the module doc)


def to_float16(p: np.ndarray, out: np.ndarray, scratch: np.ndarray, *, may_hold_nan: bool = True,
               normal_or_zero: bool = False) -> np.ndarray:
    """out[...] = p.astype(float16), bit for bit, but for NaNs: all 0x7E00.

    p: C-contiguous float32, overwritten (it is the scratch of the rounding); out: a
    C-contiguous float16 (or uint16) array of p's shape; scratch: a uint32 array of at
    least 2 * p.size elements.  What the caller knows saves passes: may_hold_nan=False,
    p has no NaN; normal_or_zero=True, every p is +-0 or has 2**-14 <= |p| <= 65504 (no
    float16 subnormal, no overflow), so neither clamp is needed: zeros give M = 2**-114,
    and 0 + M - M is 0."""
    n = p.size
    flat = p.reshape(-1)
    nans = None
    if may_hold_nan and np.isnan(flat).any():  # rare
        nans = np.flatnonzero(np.isnan(flat))
    u = flat.view(_U32)
    m, sign = scratch[:n], scratch[n:2 * n]
    np.right_shift(u, _16, out=sign)  # the sign, kept apart: the rest works on |p|
    np.bitwise_and(sign, _SIGN16, out=sign)
    np.bitwise_and(u, _ABS, out=u)
    np.bitwise_and(u, _EXP, out=m)
    if not normal_or_zero:
        np.clip(m, _EXP_MIN, _EXP_MAX, out=m)
    np.add(m, _PLUS_13, out=m)  # M
    if not normal_or_zero:
        np.clip(u, _0, _CAP, out=u)
    r, big = u.view(np.float32), m.view(np.float32)
    np.add(r, big, out=r)
    np.subtract(r, big, out=r)
    np.multiply(r, _REBASE, out=r)
    np.right_shift(u, _13, out=u)
    np.bitwise_or(u, sign, out=u)
    bits = out.reshape(-1).view(np.uint16)
    np.copyto(bits, u, casting="unsafe")
    if nans is not None:
        bits[nans] = QUIET_NAN16
    return out


def to_bfloat16(p: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[...] = p.astype(bfloat16): ml_dtypes' cast (nearest even, subnormals kept, overflow
    to infinity, NaN made quiet), which is the oracle's. (Rounding the bits with NumPy
    integer passes was tried: no faster than this cast, about 0.6 ns an element here.)"""
    np.copyto(out, p, casting="unsafe")
    return out
