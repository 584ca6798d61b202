"""Version 2's other forms, blocked and threaded: int4/uint4 src or zps, float16/bfloat16
scales and dst, per_group.  (Version 1's forms keep their own tuned path.)

    out[...] = T2(float32(int64(src) - int64(zp)) * float32(scale))

How it stays exact, with nothing larger than a block beyond the output:
* int4/uint4 arrays (ml_dtypes) are cast to float32 by ml_dtypes' own cast, which
  reads the low nibble of each byte (sign-extended for int4): exact.
* float16/bfloat16 scales are subsets of float32: converted once, exactly.
* zps of 4 or 8 bits, or int32 with |zp| <= 2**23, and any src of ours: |src - zp| <
  2**24, so float32(src) - float32(zp) is exact.  Other int32 zps: the difference in
  float64 (exact, |diff| < 2**53), rounded once to float32, as the int64 one would be.
* One float32 multiply, then one rounding to T2 (kernels/narrowing.py).

How it is fast: src is viewed so that every parameter broadcasts (per_group (d0, d1)
with groups (g0, g1) as (d0/g0, g0, d1/g1, g1), parameters (d0/g0, 1, d1/g1, 1)), with
size-1 dims dropped and neighbours of one kind merged; the view is cut into blocks that
stay in cache through the cast, the subtraction, the multiply and the narrowing, and
the blocks are shared among threads.
"""
from __future__ import annotations

import math
import threading

import numpy as np

from dyndq.opdefs import PER_GROUP, PER_TENSOR, dtypes

from . import narrowing, parallel
from .parallel import TUNING as T

__all__ = ["dequantize_v2", "exact_zero_points", "param_count", "view"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_F32_EXACT_ZP = 1 << 23  # |zp| up to this: float32 subtraction is exact for our src dtypes


def dequantize_v2(src, scales, zps, qtype, axis, group_shape, out, threads=None):
    """Fill out (T2, src's shape) and return it; arguments already judged valid."""
    if src.size == 0:
        return out
    vshape, varies = view(src.shape, qtype, axis, group_shape)
    pshape = tuple(d if v else 1 for d, v in zip(vshape, varies))
    sc = np.asarray(scales, dtype=_F32).reshape(pshape)  # native order, exact
    z, mode = _zero_points(zps, qtype, pshape)
    src = np.ascontiguousarray(src)  # a copy only for other layouts: a byte an element
    sv = src.reshape(vshape)
    target = out if out.flags.c_contiguous and out.dtype.isnative else np.empty(src.shape, out.dtype.newbyteorder("="))
    ov = target.reshape(vshape)
    narrow = _NARROW[target.dtype.name]
    # finite scales times integers below 2**33 are finite in float32: no NaN to look for
    may_hold_nan = not bool(np.isfinite(sc).all())
    normal_or_zero = narrow == "float16" and not may_hold_nan and _products_normal_or_zero(src.dtype, sc, z)
    chunk = T.chunk if narrow is None else T.narrow_chunk
    if mode == "f64":
        chunk = max(1, chunk // 2)
    blocks = parallel.blocks(vshape, chunk)

    def work(start, stop):
        scratch = _scratch(chunk)
        with np.errstate(all="ignore"):  # NaN and Inf follow IEEE arithmetic, silently
            for idx in blocks[start:stop]:
                pidx = _param_index(idx, varies)
                zb = z if z is None or z.ndim == 0 else z[pidx]
                _block(sv[idx], ov[idx], sc[pidx], zb, mode, narrow, scratch, may_hold_nan, normal_or_zero)

    parallel.run(work, len(blocks), parallel.threads_for(src.size, len(blocks), threads))
    if target is not out:
        np.copyto(out, target)
    return out


def _block(s, o, sc, z, mode, narrow, scratch, may_hold_nan, normal_or_zero):
    if narrow is None:
        t = o  # float32 output: computed in place
    else:
        t = scratch.f32[: s.size].reshape(s.shape)
    if mode == "f64":
        np.copyto(t, np.subtract(s, z, dtype=_F64), casting="same_kind")  # exact; one rounding
    else:
        np.copyto(t, s, casting="unsafe")  # exact: every src value is a float32
        if z is not None:
            np.subtract(t, z, out=t)
    np.multiply(t, sc, out=t)
    if narrow == "float16":
        narrowing.to_float16(t, o, scratch.u32, may_hold_nan=may_hold_nan, normal_or_zero=normal_or_zero)
    elif narrow == "bfloat16":
        narrowing.to_bfloat16(t, o)


_NARROW = {"float32": None, "float16": "float16", "bfloat16": "bfloat16"}


def view(shape, qtype, axis, group_shape):
    """A shape src can be viewed in (C order), and for each of its dims whether the
    parameters vary along it (else they broadcast)."""
    if qtype == PER_TENSOR:
        dims = [(d, False) for d in shape]
    elif qtype == PER_GROUP:
        dims = [x for d, g in zip(shape, group_shape) for x in ((d // int(g), True), (int(g), False))]
    else:
        a = axis % len(shape)
        dims = [(d, i == a) for i, d in enumerate(shape)]
    merged: list[list] = []
    for d, v in dims:
        if d == 1:
            continue  # a size-1 dim: nothing varies along it
        if merged and merged[-1][1] == v:
            merged[-1][0] *= d  # neighbours of one kind: C order lets them merge
        else:
            merged.append([d, v])
    if not merged:
        merged = [[1, False]]
    return tuple(d for d, _ in merged), tuple(v for _, v in merged)


def param_count(vshape, varies) -> int:
    """How many parameters a view (view's result) has: the product of the dims they vary along."""
    return math.prod(d for d, v in zip(vshape, varies) if v)


def _zero_points(zps, qtype, pshape):
    """The zero points shaped like the parameters, and how to subtract them exactly."""
    if zps is None:
        return None, None
    z = zps.reshape(()) if zps.size == 1 else zps.reshape(pshape)  # one zp: a 0-d array, broadcast
    return exact_zero_points(z)


def exact_zero_points(z: np.ndarray, src_itemsize: int = 1) -> tuple[np.ndarray, str]:
    """The zero points converted for an exact subtraction, and in what: "f32" when src is of
    4 or 8 bits and every |zp| <= 2**23 (then |src - zp| < 2**24, exact in float32), else "f64"
    (exact, |diff| < 2**53, rounded once to float32 afterwards)."""
    small = z.dtype.itemsize == 1 or z.size == 0 or max(-int(z.min()), int(z.max())) <= _F32_EXACT_ZP
    if src_itemsize == 1 and small:
        return z.astype(_F32), "f32"
    return z.astype(_F64), "f64"


_F16_MIN_NORMAL = 2.0**-14
_F16_MAX = 65504.0


def _products_normal_or_zero(src_dtype, sc, z) -> bool:
    """Whether every product float32(src - zp) * scale is +-0 or a normal float16 in magnitude
    (then the float16 rounding skips its clamps): |src - zp| is 0 or at least 1, so nonzero
    scales of at least 2**-14 keep nonzero products normal, and the largest |scale| times
    the largest |src - zp| bounds them from above. Finite scales assumed."""
    lo, hi = dtypes.integer_range(src_dtype)
    z_lo, z_hi = (0.0, 0.0) if z is None or z.size == 0 else (float(z.min()), float(z.max()))
    d_max = max(abs(lo - z_hi), abs(hi - z_lo))
    a = np.abs(sc)  # the parameters' size (no copy of its nonzero part: a masked min instead)
    smallest = float(np.min(a, where=a != 0, initial=np.inf))
    return (smallest == np.inf or smallest >= _F16_MIN_NORMAL) and float(a.max()) * d_max <= _F16_MAX


def _param_index(idx, varies):
    return tuple(i if v else (0 if isinstance(i, int) else slice(None)) for i, v in zip(idx, varies))


class _Scratch:
    """Per-thread block buffers: a float32 block and the narrowing's uint32 scratch."""

    def __init__(self, n):
        self.n = n
        self.f32 = np.empty(n, _F32)
        self.u32 = np.empty(2 * n, np.uint32)


_local = threading.local()


def _scratch(n) -> _Scratch:
    s = getattr(_local, "scratch", None)
    if s is None or s.n < n:
        s = _local.scratch = _Scratch(n)
    return s

