"""The compiled kernel (kernels/_native.c), when it was built: one fused pass per element.

NumPy makes a pass per step (cast, subtract, multiply, a dozen for a float16
rounding); _native.c reads each byte of src once and writes each output element
once, which is what memory costs.  It is optional: `pip install` builds it where a
C compiler is found, and without it (or with DYNDQ_NATIVE=0, or TUNING.native
False) the NumPy kernels run, with the same bits.

This module does what the C side expects done: the view in which the parameters
broadcast (dequantize_v2.view, the one the NumPy path blocks by), the parameters
contiguous (widened to float32 / int32 where they change at every element and the
kernel runs at level 0), a choice of integer width for the subtraction, and every
array as its bytes; then it shares the elements among threads (the C loop releases
the GIL).

Levels (cpu_level, level, at_level): what the CPU lets the kernel use, 0 plain C, 1
AVX2 and F16C, 2 AVX-512; the kernel runs at the CPU's, or lower inside at_level
(for tests and `bench_kernel.py --level`).  _native.c says which loop each runs.
"""
from __future__ import annotations

import contextlib

import numpy as np

from dyndq.opdefs import dtypes

from . import parallel
from .dequantize_v2 import param_count
from .parallel import TUNING as T

try:
    from . import _native
except ImportError:  # not built (no C compiler at install): the NumPy kernels serve
    _native = None

__all__ = ["built", "handles", "dequantize", "dequantize_one", "cpu_level", "level", "at_level", "narrow"]

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)
_U8 = np.dtype(np.uint8)
_U16 = np.dtype(np.uint16)
_SRC = {dtypes.by_name(n).numpy: i for i, n in enumerate(("int8", "uint8", "int4", "uint4"))}
# float32 / float16 / bfloat16: the C side's DST_* for outputs and SK_* for scales alike
_DST = _SCALE_KIND = {dtypes.by_name(n).numpy: i for i, n in enumerate(("float32", "float16", "bfloat16"))}
_ZP_NONE, _ZP_NARROW, _ZP_WIDE = 0, 1, 2
# the zero-point dtypes the C loop reads as given, and its names for them (_native.c, ZK_*)
_ZP_KIND = {dtypes.by_name(n).numpy: i for i, n in enumerate(("int32", "int8", "uint8", "int4", "uint4"))}
# |zp| up to this: src - zp fits in int32 for every src of ours (|src| <= 255)
_NARROW_ZP = (1 << 31) - 256


def built() -> bool:
    """Whether the compiled kernel was built and loads."""
    return _native is not None


def handles(src_dtype: np.dtype, dst: np.dtype) -> bool:
    """Whether the compiled kernel was built and knows these dtypes (whether a call takes it
    also depends on TUNING.native, and on out being C-contiguous in native order)."""
    return _native is not None and src_dtype in _SRC and dst in _DST


def dequantize(src, scales, zps, vshape, varies, out, threads=None, count_p=None):
    """Fill out (C-contiguous, native, T2) with the dequantization of src viewed as vshape,
    parameters varying along the dims flagged in `varies` (count_p of them, when the caller
    knows); arguments already judged valid.  (Lean on purpose: a tiny call's cost is this
    function's Python.)"""
    n = src.size
    if n == 0:
        return out
    head, kinds = c_args(src, scales, zps, vshape, varies, out, count_p)
    stream = out.nbytes >= T.stream_min
    if n < T.parallel_min:
        _native.dequantize(*head, 0, n, stream, *kinds)
        return out
    count = -(-n // T.chunk)
    n_threads = parallel.threads_for(n, count, threads)
    per = -(-count // n_threads) * T.chunk  # one contiguous range per thread: one C call each
    parallel.run(lambda a, b: _native.dequantize(*head, a * per, min(b * per, n), stream, *kinds),
                 n_threads, n_threads)
    return out


def c_args(src, scales, zps, vshape, varies, out, count_p=None):
    """The C call's arguments before (src ... zmode) and after (scale and zero-point kinds)
    its start, stop and stream: `_native.dequantize(*head, start, stop, stream, *kinds)`."""
    if count_p is None:
        count_p = param_count(vshape, varies)
    # Parameters that change at every element (varies[-1]) are widened here once to float32 and
    # int32 for the plain C loop; the fused loops (AVX2, AVX-512) read them as given, as every
    # level reads parameters that hold for a group: no widening pass before the threads.
    widen = varies[-1] and _native.level() < 1
    sc, sk = _params(scales, _SCALE_KIND, _F32, widen)  # exact: float16/bfloat16 are float32 subsets
    if sc.size != count_p:  # one scale for many params (a per-channel axis of size 1 cannot be)
        sc = np.full(count_p, sc.reshape(()), sc.dtype)
    z, zmode, zk = (None, _ZP_NONE, 0) if zps is None else _zero_points(zps, count_p, widen)
    head = (_bytes(src), _bytes(out), _bytes(sc), None if z is None else _bytes(z), vshape, varies,
            _SRC[src.dtype], _DST[out.dtype], zmode)
    return head, (sk, zk)


def dequantize_one(src, scales, zps, out):
    """dequantize with one scale and one zero point (or none) for all of src, passed to C as
    Python numbers (a float holds any float32 exactly): the lean entry for small calls."""
    _native.dequantize_one(_bytes(src), _bytes(out), float(scales.item()), None if zps is None else int(zps.item()),
                           _SRC[src.dtype], _DST[out.dtype])
    return out


def _zero_points(zps, count_p, widen):
    """The zero points, one per parameter, as int32 (widen) or as given when the C loop reads
    their dtype; whether src - zp fits in int32; and their kind for the C loop."""
    z, zk = _params(zps, _ZP_KIND, _I32, widen)  # exact: every zp dtype of ours fits in int32
    if z.size != count_p:
        z = np.full(count_p, z.reshape(()), z.dtype)  # one zp for every channel
    if zps.dtype.itemsize == 1 or z.size == 0:
        return z, _ZP_NARROW, zk
    return z, (_ZP_NARROW if max(-int(z.min()), int(z.max())) <= _NARROW_ZP else _ZP_WIDE), zk


def _params(a: np.ndarray, kinds: dict, wide: np.dtype, widen: bool):
    """a as given when the C loop reads its dtype (kinds) and widen is off, else widened to
    `wide`; and its kind for the C loop (0: the wide dtype)."""
    kind = None if widen else kinds.get(a.dtype)  # (a non-native byte order is not among the keys)
    return (_widened(a, wide), 0) if kind is None else (a, kind)


def _bytes(a: np.ndarray) -> np.ndarray:
    """a's C-contiguous buffer as the C side takes it: ml_dtypes arrays (int4, bfloat16) export
    no buffer of their own, so 1- and 2-byte arrays go as uint8 / uint16 (a copy only for src
    of another layout, a byte an element; every other array comes contiguous already)."""
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.view(_U16) if a.dtype.itemsize == 2 else a.view(_U8) if a.dtype.itemsize == 1 else a


_WIDEN = {dtypes.by_name(n).numpy: i for i, n in enumerate(("float16", "bfloat16", "int8", "uint8", "int4", "uint4"))}
_WIDEN_MIN = 1024  # fewer parameters: NumPy's cast, whose call costs less than ours


def _widened(a: np.ndarray, to: np.dtype) -> np.ndarray:
    """a as a C-contiguous array of `to` (float32 scales, int32 zero points), exactly."""
    if a.size < _WIDEN_MIN:
        return a if a.dtype is to and a.flags.c_contiguous else np.ascontiguousarray(a, dtype=to)
    if a.dtype == to:
        return a if a.flags.c_contiguous else np.ascontiguousarray(a)
    kind = _WIDEN.get(a.dtype)  # (a non-native byte order is not among the keys: NumPy's cast)
    if kind is None:
        return np.ascontiguousarray(a, dtype=to)
    out = np.empty(a.shape, to)
    _native.widen(_bytes(a), out, kind)
    return out


def cpu_level() -> int:
    """What this CPU lets the compiled kernel use: 0 plain C, 1 AVX2/F16C, 2 AVX-512."""
    return _native.cpu_level()


def level() -> int:
    """The level the compiled kernel runs at: cpu_level(), unless at_level lowered it."""
    return _native.level()


@contextlib.contextmanager
def at_level(n: int):
    """Run the compiled kernel at level n (0 to cpu_level()) inside the block: how the tests
    take the paths of machines without AVX-512, or without AVX2, on a machine with them.
    (Process-wide: not for use while other threads dequantize.)"""
    before = _native.level()
    _native.set_level(n)
    try:
        yield
    finally:
        _native.set_level(before)


def narrow(p: np.ndarray, dst, *, level: int | None = None) -> np.ndarray:
    """float32 -> float16 / bfloat16, as the compiled kernel rounds (for tests), at a CPU
    level (default: this CPU's; 0 is the plain C rounding of machines without AVX2/F16C)."""
    p = np.ascontiguousarray(p, dtype=_F32)
    out = np.empty(p.shape, dst)
    _native.narrow(p, out.view(_U16), _DST[np.dtype(dst)], cpu_level() if level is None else level)
    return out
