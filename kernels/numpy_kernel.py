"""The NumPy kernel: every form of DynamicDequantize (every version), blocked and threaded;
the fallback where the compiled kernel is not built, and its twin everywhere.

    out[...] = OT(float32(decode(src) - decode(zp)) * float32(decode(scale)))

src is viewed so that every parameter broadcasts (geometry.view: per_group (d0, d1) with
groups (g0, g1) as (d0/g0, g0, d1/g1, g1), parameters (d0/g0, 1, d1/g1, 1); per_channel as
(pre, C, post); per_tensor as one run), and the view is cut into blocks that stay in cache
through the cast, the subtraction, the multiply and the narrowing; the blocks are shared
among threads (NumPy's loops release the GIL).  Tensors up to `TUNING.small` elements are
one block on the calling thread.

How it stays exact, with nothing larger than a block beyond the output:
* float32(src) is exact for integer src of up to 16 bits (ml_dtypes' int2/int4 casts read the
  low bits of each byte, sign-extended for the signed ones) and for every float code (float8,
  float6 and float4 values are float32 values); for int32 src it rounds once, as the
  formula's one rounding does.
* float16/bfloat16 scales are subsets of float32, and float8e8m0's 2^(e-127) are float32
  values (2^-127 a subnormal): ml_dtypes converts them exactly, 0xFF to NaN.
* 4/8-bit src with zps of 4 or 8 bits, or int32 with |zp| <= 2**23: |src - zp| < 2**24, so
  float32(src) - float32(zp) is exact.  Float codes' zero points are zeros (the dispatch passes
  only those holding a -0): the float32 subtraction is IEEE's, a -0 code minus -0 giving +0.  Other zps: the difference in float64 (exact, |diff| <
  2**53), rounded once to float32, as the int64 one would be.
* One float32 multiply, then one rounding to T2 (kernels/narrowing.py).
"""
from __future__ import annotations

import threading

import ml_dtypes
import numpy as np

from dyndq.opdefs import dtypes

from . import narrowing, parallel
from .geometry import param_index, param_shape
from .parallel import TUNING as T

__all__ = ["dequantize", "exact_zero_points"]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_F32_EXACT_ZP = 1 << 23  # |zp| up to this: float32 subtraction is exact for 2/4/8-bit src
# the integer code dtypes (ml_dtypes' int2/int4 have no integer kind in NumPy)
_INTEGER_CODES = frozenset(d.numpy for d in dtypes.DTYPES if d.is_integer and d.numpy_type)
# T2 -> the rounding after the float32 product (by dtype: a dtype's name costs a microsecond)
_NARROW = {np.dtype(np.float32): None, np.dtype(np.float16): "float16", np.dtype(ml_dtypes.bfloat16): "bfloat16"}


def dequantize(src, scales, zps, vshape, varies, out, threads=None):
    """Fill out (T2, src's shape) and return it: src viewed as vshape, the parameters varying
    along the dims flagged in `varies` (geometry.view); arguments already judged valid."""
    n = src.size
    if n == 0:
        return out
    integer = src.dtype in _INTEGER_CODES
    if n <= T.small and not any(varies) and integer and _one_shot(src, scales, zps, out):
        return out
    pshape = param_shape(vshape, varies)
    sc = np.asarray(scales, dtype=_F32).reshape(pshape)  # native order, exact
    z, mode = (None, None) if zps is None else exact_zero_points(
        zps.reshape(()) if zps.size == 1 else zps.reshape(pshape), src.dtype.itemsize)
    src = np.ascontiguousarray(src)  # a copy only for other layouts: a byte an element
    target = out if out.flags.c_contiguous and out.dtype.isnative else np.empty(src.shape, out.dtype.newbyteorder("="))
    narrow = _NARROW[target.dtype]
    # finite scales times integers below 2**33 are finite in float32: no NaN to look for (float
    # codes may be NaN or infinite themselves, or overflow)
    may_hold_nan = narrow is not None and (not integer or not bool(np.isfinite(sc).all()))
    normal_or_zero = (narrow == "float16" and integer and not may_hold_nan
                      and _products_normal_or_zero(src.dtype, sc, z))
    args = mode, narrow, may_hold_nan, normal_or_zero
    sv, ov = src.reshape(vshape), target.reshape(vshape)
    if n <= T.small:  # one block on the calling thread, the parameters broadcast
        with np.errstate(all="ignore"):  # NaN and Inf follow IEEE arithmetic, silently
            _block(sv, ov, sc, z, _scratch(n if narrow else 0), *args)
    else:
        chunk = T.chunk if narrow is None else T.narrow_chunk
        if mode == "f64":
            chunk = max(1, chunk // 2)
        count, block, largest, bufsize = _jobs(sv, ov, sc, z, varies, chunk)

        def work(start, stop):
            scratch = _scratch(largest if narrow else 0)
            with _buffer(bufsize), np.errstate(all="ignore"):
                for i in range(start, stop):
                    _block(*block(i), scratch, *args)

        parallel.run(work, count, parallel.threads_for(n, count, threads))
    if target is not out:
        np.copyto(out, target)
    return out


def _one_shot(src, scales, zps, out) -> bool:
    """A small tensor with one scale, float32 out and an 8-bit (or no) zero point, in three NumPy
    calls (a tiny call's cost is its overhead); False where these do not hold.  Exact: float32(src)
    and the zero point are exact in float32, so is their difference (|d| < 2**9); the Python float
    holds the float32 scale exactly and NumPy converts it back to that float32."""
    if not (out.dtype == _F32 and src.dtype.itemsize == 1 and (zps is None or zps.dtype.itemsize == 1)):
        return False
    scale = float(scales.reshape(-1)[0])
    if not -1e30 < scale < 1e30:  # not finite, or the product could overflow: the blocks, under errstate
        return False
    np.copyto(out, src, casting="unsafe")
    if zps is not None:
        np.subtract(out, int(zps.reshape(-1)[0]), out=out)
    np.multiply(out, scale, out=out)
    return True


_TILE_ROWS_BELOW = 1024  # rows this short sharing their parameters: the parameters tiled over flat runs
_TILE = 1 << 15  # elements of such a run


def _jobs(sv, ov, sc, z, varies, chunk):
    """The work cut into blocks: (count, block(i) -> (src, out, scale, zp) of block i, the most
    elements a block holds, NumPy's ufunc buffer size for them (None: its default)).

    Short rows that share their parameters (per channel on the last axis: the view (rows, C),
    parameters varying along C only) are done as flat runs of whole rows with the parameters
    tiled to match: NumPy's broadcasting would loop over each short row.  Otherwise blocks of the
    view, with the parameters' part of each (geometry.param_index); where parameters broadcast
    along rows, NumPy's buffer no longer than a row keeps each inner loop a plain 1-D loop."""
    if varies == (False, True) and sv.shape[1] < _TILE_ROWS_BELOW:
        rows, L = sv.shape
        R = min(rows, max(1, min(chunk, _TILE) // L))
        sc_t = np.tile(sc.reshape(-1), R)
        z_t = z if z is None or z.ndim == 0 else np.tile(z.reshape(-1), R)
        s1, o1 = sv.reshape(-1), ov.reshape(-1)

        def tiled(i):
            a, m = i * R * L, min(R, rows - i * R) * L
            return s1[a:a + m], o1[a:a + m], sc_t[:m], z_t if z_t is None or z_t.ndim == 0 else z_t[:m]

        return -(-rows // R), tiled, R * L, None  # (R * L > chunk where one row is longer)
    blocks = parallel.blocks(sv.shape, chunk)

    def block(i):
        idx = blocks[i]
        pidx = param_index(idx, varies)
        return sv[idx], ov[idx], sc[pidx], z if z is None or z.ndim == 0 else z[pidx]

    largest = max(1, chunk)  # (parallel.blocks: at most chunk elements each)
    return len(blocks), block, largest, parallel.bufsize_for(sv.shape[-1]) if any(varies) else None


def _block(s, o, sc, z, scratch, mode, narrow, may_hold_nan, normal_or_zero):
    # A plain cast first (no ufunc casting buffers), then float32 ufuncs in place, while the
    # block is still in cache.
    t = o if narrow is None else scratch.f32[: s.size].reshape(s.shape)  # float32 output: in place
    if mode == "f64":
        np.copyto(t, np.subtract(s, z, dtype=_F64), casting="same_kind")  # exact; one rounding
    else:
        np.copyto(t, s, casting="unsafe")  # exact for 4/8-bit src; one rounding for wider ones
        if z is not None:
            np.subtract(t, z, out=t)
    np.multiply(t, sc, out=t)
    if narrow == "float16":
        narrowing.to_float16(t, o, scratch.u32, may_hold_nan=may_hold_nan, normal_or_zero=normal_or_zero)
    elif narrow == "bfloat16":
        narrowing.to_bfloat16(t, o)


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


class _buffer:
    """NumPy's ufunc buffer size set for a while (None: left as it is)."""

    def __init__(self, size):
        self.size = size

    def __enter__(self):
        if self.size is not None:
            self.old = np.setbufsize(self.size)

    def __exit__(self, *exc):
        if self.size is not None:
            np.setbufsize(self.old)


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
