"""The NumPy kernels of DynamicDequantize-1 and -2.

    dst = T2(float32(int64(src) - int64(zp)) * float32(scale))

per tensor (one scale, one zero point), per channel (one per index of src
along `axis`) or, from version 2, per group (one per block of `group_shape`),
zp = 0 when `zps` is absent; T2 is the dtype of scales (float32 in version 1).
Exact to the bit, for every dtype combination, as ONNX Runtime's
DequantizeLinear computes it.  Version 1's forms (8-bit src, float32 scales)
take the fast blocked path below; the other forms of version 2 take
`dequantize_v2` (kernels/dequantize_v2.py), also blocked and threaded.

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
The work is cut into blocks of about `TUNING.chunk` elements that stay in the
CPU cache between the cast, the subtraction and the multiply, and the blocks are
shared among threads by `kernels/parallel.py` (NumPy's loops release the GIL).
Tensors under `TUNING.parallel_min` elements run on the calling thread.

Arguments are judged by the op's one shape-inference function (the rules are
written once, in `shape_inference/`); this module adds only what is particular
to a kernel: non-array inputs, and `out` and `threads`.
"""
from __future__ import annotations

import math
import operator
from typing import NamedTuple

import numpy as np

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1, DYNAMIC_DEQUANTIZE_2
from dyndq.opdefs import PER_GROUP, PER_TENSOR, Problem, TensorSpec, ValidationError

from . import buffers, native, parallel
from .dequantize_v2 import dequantize_v2, exact_zero_points, param_count, view
from .parallel import THREADS_ENV
from .parallel import TUNING as T  # read at every call: tests and benchmarks tune it

__all__ = ["dynamic_dequantize", "dequantize", "THREADS_ENV"]

THREADS_ENV = "DYNDQ_NUM_THREADS"

_F32 = np.dtype(np.float32)


# -- arguments ------------------------------------------------------------------------------


def _array_or_problem(x, name: str, problems: list[Problem]):
    """NumPy arrays and NumPy scalars are taken as they are; anything else is refused.

    Python lists and scalars carry no dtype of their own (is [3, 200] int8? uint8?),
    so they are not guessed at: the caller converts them with numpy.asarray(x, dtype=...).
    """
    if isinstance(x, np.ndarray) and not isinstance(x, np.ma.MaskedArray):
        # a subclass (np.matrix keeps two dims whatever is done to it) as the plain array it holds
        return x if type(x) is np.ndarray else np.asarray(x)
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


def _check_out(out, src, others, dst_dtype, allowed, problems: list[Problem]):
    # scales of a dtype outside T2: out is judged against every dtype scales could have had
    want = dst_dtype.name if dst_dtype is not None else " | ".join(allowed)
    if not isinstance(out, np.ndarray) or isinstance(out, np.ma.MaskedArray):
        problems.append(Problem("out", f"a {type(out).__name__}", f"a {want} numpy.ndarray of src's shape"))
        return
    if out.dtype.name != want and (dst_dtype is not None or out.dtype.name not in allowed):
        problems.append(Problem("out", f"dtype {out.dtype.name}", f"{want} (the dtype of scales)"))
    if src is not None and out.shape != src.shape:
        problems.append(Problem("out", f"shape {list(out.shape)}", f"src's shape {list(src.shape)}"))
    if not out.flags.writeable:
        problems.append(Problem("out", "a read-only array", "a writeable array"))
    for name, a in others:
        if a is not None and _overlaps(out, a):
            problems.append(Problem("out", f"memory shared with {name}", "an array that overlaps no input"))


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


_VALID: dict = {}  # argument signatures the shape function accepted -> their _Plan (a cache of its verdicts)
_VALID_MAX = 512


def _signature(op, src, scales, zps, qtype, axis, group_shape):
    """What the shape function sees of a call, as a dict key; None when not plain arrays.

    Types ride along with values so that axis=True or axis=1.0 never pass for axis=1."""
    if type(src) is not np.ndarray or type(scales) is not np.ndarray:
        return None
    if zps is None:
        z = None
    elif type(zps) is np.ndarray:
        z = (zps.dtype, zps.shape)
    else:
        return None
    key = (op.since_version, src.dtype, src.shape, scales.dtype, scales.shape, z, type(qtype), qtype, type(axis), axis,
           type(group_shape), group_shape if not isinstance(group_shape, list) else ("list", *group_shape))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _validate(op, src, scales, zps, attrs, out, threads):
    """Every problem with the arguments, raised at once; the arrays, NumPy scalars made 0-d."""
    problems: list[Problem] = []
    src_a = _array_or_problem(src, "src", problems)
    scales_a = _array_or_problem(scales, "scales", problems)
    zps_a = None if zps is None else _array_or_problem(zps, "zps", problems)
    try:
        op.shape_inference(_spec(src_a), _spec(scales_a), None if zps is None else _spec(zps_a), **attrs)
    except ValidationError as e:
        problems += e.problems
    if out is not None:
        allowed = op.allowed_dtypes("dst")
        dst = scales_a.dtype if scales_a is not None and scales_a.dtype.name in allowed else None
        _check_out(out, src_a, (("src", src_a), ("scales", scales_a), ("zps", zps_a)), dst, allowed, problems)
    _check_threads(threads, problems)
    if problems:
        raise ValidationError(problems)
    return src_a, scales_a, zps_a


@DYNAMIC_DEQUANTIZE_1.def_kernel
def dynamic_dequantize_1(
    src,
    scales,
    zps=None,
    *,
    qtype=PER_TENSOR,
    axis=1,
    out=None,
    threads=None,
):
    """DynamicDequantize-1: `float32(int64(src) - int64(zp)) * scale`, judged by version 1's rules
    (int8/uint8 src, float32 scales, per_tensor or per_channel).  See `dynamic_dequantize`."""
    return _kernel(DYNAMIC_DEQUANTIZE_1, src, scales, zps, {"qtype": qtype, "axis": axis}, out, threads)


@DYNAMIC_DEQUANTIZE_2.def_kernel
def dynamic_dequantize(
    src,
    scales,
    zps=None,
    *,
    qtype=PER_TENSOR,
    axis=1,
    group_shape=None,
    out=None,
    threads=None,
):
    """DynamicDequantize: `T2(float32(int64(src) - int64(zp)) * float32(scale))`, an array of
    src's shape and of scales' dtype T2 (float32, float16 or bfloat16).

    src: int8, uint8, int4 or uint4 array (int4/uint4 as ml_dtypes arrays, one element per
    byte, as onnx.numpy_helper gives them).  scales: one element ([1] or []) for
    qtype="per_tensor"; 1-D with src.shape[axis] elements for qtype="per_channel"; src's
    rank with src.shape[i] / group_shape[i] in each dim for qtype="per_group".
    zps (optional; absent means 0): int8, uint8, int32, int4 or uint4, shaped like scales
    (or one element under per_channel).  out: a writeable T2 array of src's shape,
    overlapping no input; it is filled and returned.  threads: at most this many threads
    (default: the environment variable DYNDQ_NUM_THREADS, else every core available).

    Every version-1 call computes exactly what version 1 does.  Raises
    dyndq.ValidationError naming every bad argument.  Inputs are never modified.
    """
    return _kernel(DYNAMIC_DEQUANTIZE_2, src, scales, zps,
                   {"qtype": qtype, "axis": axis, "group_shape": group_shape}, out, threads)


_FAST_SRC = (np.dtype(np.int8), np.dtype(np.uint8))
_FAST_ZPS = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32))


def _kernel(op, src, scales, zps, attrs, out, threads):
    qtype, axis = attrs["qtype"], attrs["axis"]
    key = _signature(op, src, scales, zps, qtype, axis, attrs.get("group_shape"))
    plan = None if key is None else _VALID.get(key)
    if plan is None or not _extras_ok(src, scales, zps, out, threads):
        src, scales, zps = _validate(op, src, scales, zps, attrs, out, threads)
        plan = _Plan.of(src, scales, qtype, axis, attrs.get("group_shape"))
        if key is not None:
            if len(_VALID) >= _VALID_MAX:
                _VALID.clear()
            _VALID[key] = plan
    dst = plan.dst
    # the compiled kernel writes C-contiguous, aligned outputs of native byte order; NumPy the rest
    if plan.compiled and T.native and (out is None or (out.flags.c_contiguous and out.flags.aligned
                                                       and out.dtype.isnative)):
        if out is None:
            out = _output(src, dst)
        if plan.count_p == 1 and src.size <= T.small:  # one scale, one thread: the lean entry
            return native.dequantize_one(src, scales, zps, out)
        return native.dequantize(src, scales, zps, plan.vshape, plan.varies, out, threads, plan.count_p)
    if not (qtype != PER_GROUP and dst == _F32 and src.dtype in _FAST_SRC
            and (zps is None or zps.dtype in _FAST_ZPS)):
        if out is None:
            out = _output(src, dst)
        return dequantize_v2(src, scales, zps, qtype, axis, attrs.get("group_shape"), out, threads)
    if qtype == PER_TENSOR and src.size <= T.small and (zps is None or zps.dtype.itemsize == 1):
        scale = scales.item()
        if -1e30 < scale < 1e30:  # finite, and the product cannot overflow: no FP flags to silence
            # The one-shot path for small tensors.  Exact: float32(src) and the 8-bit zp are
            # exact in float32, so is their difference (|d| < 2**9); the Python float holds the
            # float32 scale exactly and NumPy converts it back to that float32.
            if out is None:
                out = src.astype(_F32)
            else:
                np.copyto(out, src)
            if zps is not None:
                np.subtract(out, zps.item(), out=out)
            np.multiply(out, scale, out=out)
            return out
    if out is None:
        out = _output(src, _F32)
    dequantize(src, scales, zps, None if qtype == PER_TENSOR else axis % src.ndim, out, threads=threads)
    return out


class _Plan(NamedTuple):
    """What a call's signature (dtypes, shapes, attributes) settles, worked out once per
    signature: a tiny call's cost is its Python, and this is most of it."""

    dst: np.dtype  # T2, in native byte order
    compiled: bool  # whether the compiled kernel has these dtypes (kernels/native.py)
    vshape: tuple  # src viewed so that the parameters broadcast (dequantize_v2.view)
    varies: tuple
    count_p: int  # how many parameters that view has

    @classmethod
    def of(cls, src, scales, qtype, axis, group_shape) -> "_Plan":
        dst = _native_order(scales.dtype)
        if qtype == PER_TENSOR or src.ndim == 0:
            vshape, varies = (max(src.size, 1),), (False,)
        else:
            vshape, varies = view(src.shape, qtype, axis, group_shape)
        return cls(dst, native.handles(src.dtype, dst), vshape, varies, param_count(vshape, varies))


def _native_order(d: np.dtype) -> np.dtype:
    # np.dtype(d.name) would do, at ten times the cost of a tiny call's arithmetic
    return d if d.isnative else d.newbyteorder("=")


def _output(src, dst):
    """An output for src: a freed output's buffer when there is one (buffers.py). The pool's
    own size rule (below min_bytes: NumPy's allocator) is applied here first, since the
    pool's call costs a tiny call more than the allocation it would hand back."""
    if src.size * dst.itemsize < buffers.POOL.min_bytes:
        return np.empty(src.shape, dst)
    return buffers.empty(src.shape, dst)


def _extras_ok(src, scales, zps, out, threads) -> bool:
    """Cheap checks of out and threads for the common case; False sends the call to
    the full validation, which judges them exactly (and says what is wrong)."""
    if threads is not None and (type(threads) is not int or threads < 1):
        return False
    if out is None:
        return True
    return (
        type(out) is np.ndarray
        and out.dtype == _native_order(scales.dtype)
        and out.shape == src.shape
        and out.flags.writeable
        and not np.may_share_memory(out, src)
        and not np.may_share_memory(out, scales)
        and (zps is None or not np.may_share_memory(out, zps))
    )


# -- the arithmetic, shared with onnx.reference's DequantizeLinear (dyndq.reference) ------------

def dequantize(src: np.ndarray, scale: np.ndarray, zp: np.ndarray | None, axis: int | None,
               out: np.ndarray, *, threads: int | None = None) -> np.ndarray:
    """out[...] = float32(int64(src) - int64(zp)) * scale, with no argument checks.

    src: any integer array; scale: float32 with one element, or 1-D along `axis`;
    zp: None or an integer array shaped like scale (or one element); axis: None
    for per tensor, else a non-negative axis of src; out: float32, src's shape.
    """
    n = src.size
    if n == 0:
        return out
    if scale.dtype != _F32 or scale.ndim != 1:
        scale = np.asarray(scale, dtype=_F32).reshape(-1)  # native byte order, exact
    if zp is not None:
        if not zp.dtype.isnative:
            zp = zp.astype(zp.dtype.newbyteorder("="))
        zp = zp.reshape(-1)
    mode, zval = _zp_mode(src, zp)
    if axis is not None and scale.size == 1 and (zval is None or zval.size == 1):
        axis = None  # one channel: the same arithmetic as per tensor
    if n <= T.small:
        if axis is None:
            sc = scale.reshape(())
            z = None if zval is None else zval.reshape(())
            if mode != "f64" and -1e30 < float(sc) < 1e30:  # finite and no overflow: no FP flags
                _block(src, out, sc, z, mode)
                return out
        else:
            pshape = [1] * src.ndim
            pshape[axis] = -1
            sc = scale.reshape(pshape)
            z = None if zval is None else zval.reshape(pshape) if zval.size > 1 else zval.reshape(())
        with np.errstate(all="ignore"):  # NaN and Inf follow IEEE arithmetic, silently
            _block(src, out, sc, z, mode)
        return out
    count, make, bufsize = _jobs(src, out, scale, zval, axis, max(1, T.chunk // 4) if mode == "f64" else T.chunk)
    parallel.run(lambda a, b: _run_jobs(make, a, b, mode, bufsize), count, parallel.threads_for(n, count, threads))
    return out


def _zp_mode(src: np.ndarray, zp: np.ndarray | None):
    """How to subtract the zero point exactly: (mode, zero points converted for it)."""
    if zp is None:
        return None, None
    zval, mode = exact_zero_points(zp, src.dtype.itemsize)
    return mode, zval


def _jobs(src, out, scale, zval, axis, chunk):
    """Cut the work into blocks of about `chunk` elements.

    Returns (count, make, bufsize): make(i) gives block i as (src, out, scale, zp)
    views, built only when it runs (no list of views held in memory); bufsize is the
    ufunc buffer size the blocks' broadcasting needs (None: NumPy's default).

    Contiguous arrays are handled as flat runs of memory so that every ufunc call is
    a plain loop; other layouts go through NumPy's broadcasting, block by block."""
    n = src.size
    if not (src.flags.c_contiguous and out.flags.c_contiguous and out.dtype.isnative):
        return _strided_jobs(src, out, scale, zval, axis, chunk)
    s1, o1 = src.reshape(-1), out.reshape(-1)
    if axis is None:
        sc = scale.reshape(())
        z = None if zval is None else zval.reshape(())
        return -(-n // chunk), lambda i: (s1[i * chunk:(i + 1) * chunk], o1[i * chunk:(i + 1) * chunk], sc, z), None
    shape = src.shape
    C = shape[axis]
    pre = math.prod(shape[:axis])
    post = math.prod(shape[axis + 1:])
    if zval is not None and zval.size == 1:
        zval = np.broadcast_to(zval, (C,))
    if post == 1 or C * post <= T.expand_max:
        # every row of L = C * post elements has the same parameters: lay them out as a row
        if post > 1:
            scale = np.repeat(scale, post)
            zval = None if zval is None else np.repeat(zval, post)
        L = C * post
        if L > chunk:  # long rows: segments of a row, with the matching segment of the params
            per_row = -(-L // chunk)

            def make(i):
                r, c0 = divmod(i, per_row)
                c0 *= chunk
                c1 = min(c0 + chunk, L)
                return (s1[r * L + c0:r * L + c1], o1[r * L + c0:r * L + c1], scale[c0:c1],
                        None if zval is None else zval[c0:c1])

            return pre * per_row, make, None
        R = chunk // L
        s2, o2 = s1.reshape(pre, L), o1.reshape(pre, L)
        if L >= T.row_broadcast_min:
            # rows long enough to broadcast the params over, with a buffer no longer than a row
            sc, z = scale.reshape(1, L), None if zval is None else zval.reshape(1, L)
            return -(-pre // R), lambda i: (s2[i * R:(i + 1) * R], o2[i * R:(i + 1) * R], sc, z), parallel.bufsize_for(L)
        # short rows: the params tiled over R rows (at most T.tile_max elements), flat loops
        R = max(1, min(chunk, T.tile_max) // L)
        sc_t = np.tile(scale, R)
        z_t = None if zval is None else np.tile(zval, R)

        def make(i):
            m = min(R, pre - i * R) * L
            return s1[i * R * L:i * R * L + m], o1[i * R * L:i * R * L + m], sc_t[:m], None if z_t is None else z_t[:m]

        return -(-pre // R), make, None
    # rows of `post` elements, row i on channel i % C, one scale per row
    rows = pre * C
    s2, o2 = src.reshape(rows, post), out.reshape(rows, post)
    if post >= chunk:
        per_row = -(-post // chunk)

        def make(i):
            r, c0 = divmod(i, per_row)
            c0 *= chunk
            ch = r % C
            return (s2[r, c0:c0 + chunk], o2[r, c0:c0 + chunk], scale[ch:ch + 1],
                    None if zval is None else zval[ch:ch + 1])

        return rows * per_row, make, None
    R = max(1, chunk // post)

    def make(i):
        r0, r1 = i * R, min(i * R + R, rows)
        ch = slice(r0, r1) if pre == 1 else np.arange(r0, r1) % C
        return s2[r0:r1], o2[r0:r1], scale[ch].reshape(-1, 1), None if zval is None else zval[ch].reshape(-1, 1)

    return -(-rows // R), make, parallel.bufsize_for(post)


def _strided_jobs(src, out, scale, zval, axis, chunk):
    """Blocks of any layout, with parameters shaped to broadcast along `axis`."""
    r = src.ndim
    if axis is None:
        pshape = ()
    else:
        pshape = tuple(src.shape[axis] if i == axis else 1 for i in range(r))
        if zval is not None and zval.size == 1:
            zval = np.broadcast_to(zval, (src.shape[axis],))
    sc = scale.reshape(pshape)
    z = None if zval is None else zval.reshape(pshape)
    if r == 0:
        return 1, lambda i: (src, out, sc, z), None
    blocks = parallel.blocks(src.shape, chunk)

    def make(i):
        idx = blocks[i]
        pidx = _param_index(idx, pshape) if pshape else ()
        return src[idx], out[idx], sc[pidx], None if z is None else z[pidx]

    return len(blocks), make, None


def _param_index(idx, pshape):
    return tuple(
        (0 if isinstance(i, int) else slice(None)) if p == 1 else i for i, p in zip(idx, pshape)
    )


def _run_jobs(make, start, stop, mode, bufsize):
    """Blocks [start, stop) of a job cut by _jobs or _strided_jobs."""
    old = None
    if bufsize is not None:
        old = np.getbufsize()
        np.setbufsize(bufsize)
    try:
        with np.errstate(all="ignore"):  # NaN and Inf follow IEEE arithmetic, silently
            for i in range(start, stop):
                _block(*make(i), mode)
    finally:
        if old is not None:
            np.setbufsize(old)


def _block(s, o, scale, zval, mode):
    # A plain cast first (no ufunc casting buffers), then float32 ufuncs in place,
    # while the block is still in cache.
    if mode == "f64":
        np.copyto(o, np.subtract(s, zval, dtype=np.float64))  # exact; one rounding to float32
    else:
        np.copyto(o, s)
        if mode == "f32":
            np.subtract(o, zval, out=o)
    np.multiply(o, scale, out=o)

