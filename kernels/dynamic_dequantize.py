"""The NumPy kernel of DynamicDequantize-1.

    dst = float32(int64(src) - int64(zp)) * scale

per tensor (one scale, one zero point) or per channel (one per index of src
along `axis`), zp = 0 when `zps` is absent.  Exact to the bit, for every dtype
pair, as ONNX Runtime's DequantizeLinear computes it.

How it stays exact without int64 temporaries
--------------------------------------------
* No zps: float32(src) is exact for 8-bit src, so dst = float32(src) * scale
  (no subtraction at all).
* 8-bit zps, or int32 zps with |zp| <= 2**23: float32(src) and float32(zp) are
  exact and |src - zp| < 2**24, so the float32 subtraction is exact too:
  dst = (float32(src) - float32(zp)) * scale.
* Other int32 zps: float64(src) - float64(zp) is exact (|diff| < 2**53) and the
  cast to float32 rounds once, to nearest even, exactly as the int64 difference
  would.  Done in small blocks, so no full-size float64 array ever exists.

How it is fast
--------------
The work is cut into blocks of about `_CHUNK` elements that stay in the CPU
cache between the cast, the subtraction and the multiply, and the blocks are
shared among threads (NumPy's loops release the GIL).  Tensors under
`_PARALLEL_MIN` elements run on the calling thread, with no pool involved.

Arguments are judged by the op's one shape-inference function (the rules are
written once, in `shape_inference/`); this module adds only what is particular
to a kernel: non-array inputs, and `out` and `threads`.
"""
from __future__ import annotations

import operator
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1 as OP
from dyndq.opdefs import PER_CHANNEL, PER_TENSOR, Problem, TensorSpec, ValidationError

__all__ = ["dynamic_dequantize", "dequantize", "THREADS_ENV"]

THREADS_ENV = "DYNDQ_NUM_THREADS"

_F32 = np.dtype(np.float32)
_CHUNK = 1 << 16  # elements per block: 256 KiB of float32 output, cache-resident
_PARALLEL_MIN = 1 << 18  # below this many elements, no thread pool
_EXPAND_MAX = 1 << 14  # per-channel params repeated up to this length (64 KiB)
_F32_EXACT_ZP = 1 << 23  # |zp| up to this: float32 arithmetic is exact for 8-bit src


# -- arguments ------------------------------------------------------------------------------


def _array_or_problem(x, name: str, problems: list[Problem]):
    """NumPy arrays and NumPy scalars are taken as they are; anything else is refused.

    Python lists and scalars carry no dtype of their own (is [3, 200] int8? uint8?),
    so they are not guessed at: the caller converts them with numpy.asarray(x, dtype=...).
    """
    if isinstance(x, np.ndarray) and not isinstance(x, np.ma.MaskedArray):
        return x
    if isinstance(x, np.generic):
        return np.asarray(x)
    what = "a masked array" if isinstance(x, np.ma.MaskedArray) else f"a Python {type(x).__name__}"
    problems.append(
        Problem(name, what, "a numpy.ndarray or NumPy scalar (convert lists and Python numbers "
                            "with numpy.asarray(x, dtype=...) first)")
    )
    return None


def _spec(a):
    return TensorSpec(None, None) if a is None else TensorSpec.of(a)


def _check_out(out, src, others, problems: list[Problem]):
    if not isinstance(out, np.ndarray) or isinstance(out, np.ma.MaskedArray):
        problems.append(Problem("out", f"a {type(out).__name__}", "a float32 numpy.ndarray of src's shape"))
        return
    if out.dtype.kind != "f" or out.dtype.itemsize != 4:
        problems.append(Problem("out", f"dtype {out.dtype.name}", "float32"))
    if src is not None and out.shape != src.shape:
        problems.append(Problem("out", f"shape {list(out.shape)}", f"src's shape {list(src.shape)}"))
    if not out.flags.writeable:
        problems.append(Problem("out", "a read-only array", "a writeable array"))
    for name, a in others:
        if a is not None and _overlaps(out, a):
            problems.append(Problem("out", f"memory shared with {name}", f"an array that overlaps no input"))


def _overlaps(a: np.ndarray, b: np.ndarray) -> bool:
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=10_000))
    except np.exceptions.TooHardError:
        return True


def _check_threads(threads, problems: list[Problem]) -> None:
    if threads is None:
        return
    ok = not isinstance(threads, bool)
    if ok:
        try:
            ok = operator.index(threads) >= 1
        except TypeError:
            ok = False
    if not ok:
        problems.append(Problem("threads", repr(threads), "None or an integer >= 1"))


# -- the op ---------------------------------------------------------------------------------


@OP.def_kernel
def dynamic_dequantize(
    src,
    scales,
    zps=None,
    *,
    qtype=PER_TENSOR,
    axis=1,
    out=None,
    threads=None,
):
    """DynamicDequantize-1: `float32(int64(src) - int64(zp)) * scale`, as a float32 array of src's shape.

    src: int8 or uint8 array.  scales: float32, one element ([1] or []) for
    qtype="per_tensor", or 1-D with src.shape[axis] elements for
    qtype="per_channel".  zps (optional; absent means 0): int8, uint8 or int32,
    shaped like scales, or one element shared by every channel.
    out: a writeable float32 array of src's shape, overlapping no input; it is
    filled and returned.  threads: at most this many threads (default: the
    environment variable DYNDQ_NUM_THREADS, else every core available).

    Raises dyndq.ValidationError naming every bad argument.  Inputs are never modified.
    """
    problems: list[Problem] = []
    src_a = _array_or_problem(src, "src", problems)
    scales_a = _array_or_problem(scales, "scales", problems)
    zps_a = None if zps is None else _array_or_problem(zps, "zps", problems)
    try:
        OP.shape_inference(
            _spec(src_a), _spec(scales_a), None if zps is None else _spec(zps_a), qtype=qtype, axis=axis
        )
    except ValidationError as e:
        problems += e.problems
    if out is not None:
        _check_out(out, src_a, (("src", src_a), ("scales", scales_a), ("zps", zps_a)), problems)
    _check_threads(threads, problems)
    if problems:
        raise ValidationError(problems)

    if out is None:
        out = np.empty(src_a.shape, _F32)
    channel_axis = None
    if qtype == PER_CHANNEL:
        channel_axis = operator.index(axis) % src_a.ndim
    dequantize(src_a, scales_a, zps_a, channel_axis, out, threads=threads)
    return out


# -- the arithmetic, shared with onnx.reference's DequantizeLinear (dyndq.reference) ------------


def dequantize(src: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int | None,
               out: np.ndarray, *, threads: int | None = None) -> np.ndarray:
    """out[...] = float32(int64(src) - int64(zp)) * scale, with no argument checks.

    src: any integer array; scale: float32 with one element, or 1-D along `axis`;
    zp: None or an integer array shaped like scale (or one element); axis: None
    for per tensor, else a non-negative axis of src; out: float32, src's shape.
    """
    if src.size == 0:
        return out
    scale = np.asarray(scale, dtype=_F32).reshape(-1)  # native byte order, exact
    if zp is not None:
        zp = zp.reshape(-1)
        if not zp.dtype.isnative:
            zp = zp.astype(zp.dtype.newbyteorder("="))
    mode, zval = _zp_mode(src, zp)
    shape, pshape, scale, zval, src_v, out_v = _layout(src, out, scale, zval, axis)
    scale = scale.reshape(pshape)
    if zval is not None:
        zval = zval.reshape(pshape)
    if src_v.ndim == 0:
        with np.errstate(all="ignore"):
            _block(src_v, out_v, scale, zval, mode)
        return out
    blocks = _blocks(shape, _CHUNK)
    n = _threads_for(src.size, len(blocks), threads)
    if n <= 1:
        _run_blocks(blocks, src_v, out_v, scale, zval, mode)
    else:
        _parallel(blocks, n, src_v, out_v, scale, zval, mode)
    return out


def _zp_mode(src: np.ndarray, zp: np.ndarray | None):
    """How to subtract the zero point exactly: (mode, zero points converted for it)."""
    if zp is None:
        return None, None
    if zp.size == 0:
        return "f32", zp.astype(_F32)
    if src.dtype.itemsize == 1 and zp.dtype.itemsize == 1:
        return "f32", zp.astype(_F32)
    if src.dtype.itemsize == 1:
        lo, hi = int(zp.min()), int(zp.max())
        if -_F32_EXACT_ZP <= lo and hi <= _F32_EXACT_ZP:
            return "f32", zp.astype(_F32)
    return "f64", zp.astype(np.float64)


def _layout(src, out, scale, zval, axis):
    """Views of src and out, their common shape for blocking, and the parameters'
    broadcast shape.  Contiguous arrays are collapsed to as few axes as possible."""
    contiguous = src.flags.c_contiguous and out.flags.c_contiguous and out.dtype.isnative
    r = src.ndim
    if axis is None:
        if contiguous:
            shape = (src.size,)
            return shape, (), scale, zval, src.reshape(shape), out.reshape(shape)
        return src.shape, (), scale, zval, src, out
    C = src.shape[axis]
    if scale.size == 1 and C != 1:
        scale = np.broadcast_to(scale, (C,))
    if zval is not None and zval.size == 1 and C != 1:
        zval = np.broadcast_to(zval, (C,))
    if contiguous:
        pre = int(np.prod(src.shape[:axis], dtype=np.int64))
        post = int(np.prod(src.shape[axis + 1:], dtype=np.int64))
        if post == 1:
            shape, pshape = (pre, C), (1, C)
        elif C * post <= _EXPAND_MAX:
            scale = np.repeat(scale, post)
            zval = None if zval is None else np.repeat(zval, post)
            shape, pshape = (pre, C * post), (1, C * post)
        else:
            shape, pshape = (pre, C, post), (1, C, 1)
        return shape, pshape, scale, zval, src.reshape(shape), out.reshape(shape)
    pshape = tuple(C if i == axis else 1 for i in range(r))
    return src.shape, pshape, scale, zval, src, out


def _blocks(shape, chunk):
    """Index tuples cutting an array of `shape` into blocks of about `chunk` elements."""
    r = len(shape)
    k, inner = r - 1, 1
    while k > 0 and inner * shape[k] <= chunk:
        inner *= shape[k]
        k -= 1
    # now inner = prod(shape[k+1:]) <= chunk (or k == r - 1 and inner == 1)
    step = max(1, chunk // inner)
    starts = range(0, shape[k], step)
    return [
        outer + (slice(s, s + step),)
        for outer in np.ndindex(*shape[:k])
        for s in starts
    ]


def _param_index(idx, pshape):
    return tuple(
        (0 if isinstance(i, int) else slice(None)) if p == 1 else i for i, p in zip(idx, pshape)
    )


def _run_blocks(blocks, src, out, scale, zval, mode):
    pshape = scale.shape
    with np.errstate(all="ignore"):  # NaN and Inf follow IEEE arithmetic, silently
        for idx in blocks:
            pidx = _param_index(idx, pshape) if pshape else ()
            _block(src[idx], out[idx], scale[pidx], None if zval is None else zval[pidx], mode)


def _block(s, o, scale, zval, mode):
    if mode is None:
        np.multiply(s, scale, out=o, dtype=_F32)
    elif mode == "f32":
        np.subtract(s, zval, out=o, dtype=_F32)
        np.multiply(o, scale, out=o)
    else:
        o[...] = np.subtract(s, zval, dtype=np.float64)  # exact; one rounding to float32
        np.multiply(o, scale, out=o)


# -- threads ----------------------------------------------------------------------------------


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _threads_for(size: int, n_blocks: int, threads: int | None) -> int:
    if size < _PARALLEL_MIN or n_blocks < 2:
        return 1
    n = _cores()
    if threads is None:
        env = os.environ.get(THREADS_ENV)
        if env:
            try:
                threads = max(1, int(env))
            except ValueError:
                threads = None
    if threads is not None:
        n = min(n, int(threads))
    return max(1, min(n, n_blocks))


_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def _get_pool(workers: int) -> ThreadPoolExecutor:
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < workers:
            old = _pool
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dyndq")
            _pool_size = workers
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def _reset_pool_after_fork() -> None:
    global _pool, _pool_size, _pool_lock
    _pool, _pool_size, _pool_lock = None, 0, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_pool_after_fork)


def _parallel(blocks, n, src, out, scale, zval, mode):
    per = -(-len(blocks) // n)
    groups = [blocks[i:i + per] for i in range(0, len(blocks), per)]
    pool = _get_pool(len(groups) - 1)
    futures = [pool.submit(_run_blocks, g, src, out, scale, zval, mode) for g in groups[1:]]
    try:
        _run_blocks(groups[0], src, out, scale, zval, mode)
    finally:
        for f in futures:
            f.result()
