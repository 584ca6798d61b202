"""DynamicDequantize's kernels, versions 1 and 2: what every call goes through.

    dst = T2(float32(int64(src) - int64(zp)) * float32(scale))

per tensor (one scale, one zero point), per channel (one per index of src along `axis`) or,
from version 2, per group (one per block of `group_shape`); zp = 0 when `zps` is absent; T2
is the dtype of scales (float32 in version 1).  Exact to the bit, for every dtype
combination, as ONNX Runtime's DequantizeLinear computes it.

This module holds what is common to every path, and nothing of the arithmetic:
* validation: arguments are judged by the op's one shape-inference function (the rules are
  written once, in shape_inference/), plus what is particular to a kernel (non-array
  inputs, `out` and `threads`);
* the plan cache: what a call's signature settles (the view in which the parameters
  broadcast, geometry.view), worked out once per signature;
* the dispatch, between two kernels with the same bits: the compiled one (kernels/native.py,
  kernels/_native.c) where it is built, switched on and can write `out`, else the NumPy one
  (kernels/numpy_kernel.py).
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import numpy as np

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1, DYNAMIC_DEQUANTIZE_2
from dyndq.opdefs import PER_TENSOR, Problem, TensorSpec, ValidationError

from . import buffers, native, numpy_kernel
from .geometry import param_count, view
from .parallel import THREADS_ENV
from .parallel import TUNING as T  # read at every call: tests and benchmarks tune it

__all__ = ["dynamic_dequantize", "dynamic_dequantize_1", "THREADS_ENV"]


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
    # the compiled kernel writes C-contiguous, aligned outputs of native byte order; NumPy the rest
    compiled = plan.compiled and T.native and (out is None or (out.flags.c_contiguous and out.flags.aligned
                                                               and out.dtype.isnative))
    if out is None:
        out = _output(src, plan.dst)
    if not compiled:
        return numpy_kernel.dequantize(src, scales, zps, plan.vshape, plan.varies, out, threads)
    if plan.count_p == 1 and src.size <= T.small:  # one scale, one thread: the lean entry
        return native.dequantize_one(src, scales, zps, out)
    return native.dequantize(src, scales, zps, plan.vshape, plan.varies, out, threads, plan.count_p)


class _Plan(NamedTuple):
    """What a call's signature (dtypes, shapes, attributes) settles, worked out once per
    signature: a tiny call's cost is its Python, and this is most of it."""

    dst: np.dtype  # T2, in native byte order
    compiled: bool  # whether the compiled kernel has these dtypes (kernels/native.py)
    vshape: tuple  # src viewed so that the parameters broadcast (geometry.view)
    varies: tuple
    count_p: int  # how many parameters that view has

    @classmethod
    def of(cls, src, scales, qtype, axis, group_shape) -> "_Plan":
        dst = _native_order(scales.dtype)
        if qtype == PER_TENSOR or src.ndim == 0:
            vshape, varies = (max(src.size, 1),), (False,)  # one run
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
