"""DynamicDequantize's kernels, versions 1, 2 and 3: what every call goes through.

    dst = OT(float32(decode(src) - decode(zp)) * float32(decode(scale)))

per tensor (one scale, one zero point), per channel (one per index of src along `axis`) or,
from version 2, per group (one per block of `group_shape`); zp = 0 when `zps` is absent; OT
is the dtype of scales (float32 in version 1), or version 3's `output_dtype`.  Integer codes
are their values, the difference exact before its one rounding to float32; float codes
(float8, float6, float4) and float8e8m0 scales are decoded exactly.  Exact to the bit, for
every dtype combination, as ONNX Runtime's DequantizeLinear computes it.

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

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1, DYNAMIC_DEQUANTIZE_2, DYNAMIC_DEQUANTIZE_3, FLOAT_CODES_3
from dyndq.opdefs import PER_TENSOR, Problem, TensorSpec, ValidationError

from . import buffers, native, numpy_kernel
from .geometry import param_count, view
from .parallel import THREADS_ENV
from .parallel import TUNING as T  # read at every call: tests and benchmarks tune it

__all__ = ["dynamic_dequantize", "dynamic_dequantize_1", "dynamic_dequantize_2", "THREADS_ENV"]


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
    # dst's dtype not known (scales of a dtype outside T2): out is judged against every dtype dst could have
    want = dst_dtype if dst_dtype is not None else " | ".join(allowed)
    if not isinstance(out, np.ndarray) or isinstance(out, np.ma.MaskedArray):
        problems.append(Problem("out", f"a {type(out).__name__}", f"a {want} numpy.ndarray of src's shape"))
        return
    if out.dtype.name != want and (dst_dtype is not None or out.dtype.name not in allowed):
        problems.append(Problem("out", f"dtype {out.dtype.name}", f"{want} (the dtype of dst)"))
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


def _signature(op, src, scales, zps, attrs):
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
    key = (op.since_version, src.dtype, src.shape, scales.dtype, scales.shape, z) + tuple(
        (type(v), v if not isinstance(v, list) else ("list", *v)) for v in attrs.values())
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _validate(op, src, scales, zps, attrs, out, threads):
    """Every problem with the arguments, raised at once; the arrays, NumPy scalars made 0-d, and
    dst's dtype name (the shape function's)."""
    problems: list[Problem] = []
    src_a = _array_or_problem(src, "src", problems)
    scales_a = _array_or_problem(scales, "scales", problems)
    zps_a = None if zps is None else _array_or_problem(zps, "zps", problems)
    dst = None
    try:
        dst = op.shape_inference(_spec(src_a), _spec(scales_a), None if zps is None else _spec(zps_a), **attrs).dtype
    except ValidationError as e:
        problems += e.problems
    if out is not None:
        if dst is None and scales_a is not None and "output_dtype" not in attrs:
            dst = scales_a.dtype.name if scales_a.dtype.name in op.allowed_dtypes("dst") else None
        _check_out(out, src_a, (("src", src_a), ("scales", scales_a), ("zps", zps_a)), dst, op.allowed_dtypes("dst"),
                   problems)
    _check_threads(threads, problems)
    if problems:
        raise ValidationError(problems)
    return src_a, scales_a, zps_a, dst


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
def dynamic_dequantize_2(
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
    """DynamicDequantize-2: `T2(float32(int64(src) - int64(zp)) * float32(scale))`, an array of
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


@DYNAMIC_DEQUANTIZE_3.def_kernel
def dynamic_dequantize(
    src,
    scales,
    zps=None,
    *,
    qtype=PER_TENSOR,
    axis=1,
    group_shape=None,
    output_dtype=None,
    out=None,
    threads=None,
):
    """DynamicDequantize: `OT(float32(decode(src) - decode(zp)) * float32(decode(scale)))`, an
    array of src's shape and of dtype OT: `output_dtype` (a TensorProto data type: 1 float32,
    10 float16, 16 bfloat16), by default the dtype of scales.

    src: codes of any type of ONNX's DequantizeLinear-28, as NumPy / ml_dtypes arrays (one
    element per byte for the types under 8 bits, as onnx.numpy_helper gives them): int2, uint2,
    int4, uint4, int8, uint8, int16, uint16, int32 (their values), float8_e4m3fn,
    float8_e4m3fnuz, float8_e5m2, float8_e5m2fnuz, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn
    (decoded exactly).  scales: float32, float16, bfloat16 or float8_e8m0fnu (2^(e-127), then
    output_dtype is required): one element ([1] or []) for qtype="per_tensor"; 1-D with
    src.shape[axis] elements for qtype="per_channel"; src's rank with src.shape[i] /
    group_shape[i] in each dim for qtype="per_group".  zps (optional, absent means 0): for integer
    codes any integer code type; for float codes their own type, zeros only (a -0 one subtracted as
    IEEE arithmetic does: a -0 code minus -0 is +0); shaped like scales (or one element under
    per_channel).
    out: a writeable OT array of src's shape, overlapping no input; it is filled and returned.
    threads: at most this many threads (default: the environment variable DYNDQ_NUM_THREADS,
    else every core available).

    Every version-2 call computes exactly what version 2 does.  Raises dyndq.ValidationError
    naming every bad argument.  Inputs are never modified.
    """
    return _kernel(DYNAMIC_DEQUANTIZE_3, src, scales, zps,
                   {"qtype": qtype, "axis": axis, "group_shape": group_shape, "output_dtype": output_dtype},
                   out, threads)


def _kernel(op, src, scales, zps, attrs, out, threads):
    qtype, axis = attrs["qtype"], attrs["axis"]
    key = _signature(op, src, scales, zps, attrs)
    plan = None if key is None else _VALID.get(key)
    if plan is None or not _extras_ok(src, scales, zps, out, threads, plan.dst):
        src, scales, zps, dst = _validate(op, src, scales, zps, attrs, out, threads)
        plan = _Plan.of(src, np.dtype(dst), qtype, axis, attrs.get("group_shape"))
        if key is not None:
            if len(_VALID) >= _VALID_MAX:
                _VALID.clear()
            _VALID[key] = plan
    if zps is not None and zps.dtype in _FLOAT_CODES:
        zps = _zeros_or_problem(zps)  # float codes' zero points are zeros (the shape function sees no data)
    # the compiled kernel writes C-contiguous, aligned outputs of native byte order; NumPy the rest
    compiled = plan.compiled and T.native and (out is None or (out.flags.c_contiguous and out.flags.aligned
                                                               and out.dtype.isnative))
    if out is None:
        out = _output(src, plan.dst)
    if not compiled:
        return numpy_kernel.dequantize(src, scales, zps, plan.vshape, plan.varies, out, threads)
    if plan.count_p == 1 and src.size <= T.small and (zps is None or zps.dtype not in _FLOAT_CODES):
        # one scale, one thread, an integer zero point or none: the lean entry
        return native.dequantize_one(src, scales, zps, out)
    return native.dequantize(src, scales, zps, plan.vshape, plan.varies, out, threads, plan.count_p)


_FLOAT_CODES = frozenset(np.dtype(n) for n in FLOAT_CODES_3)


def _zeros_or_problem(zps):
    """The zero points of float codes as the kernels take them: None where every one is +0
    (x - (+0) is x itself, for every float code: absent is the same), the zero points as they
    are where some are -0 (x - (-0) is x but for x = -0, which gives +0, as IEEE arithmetic
    subtracts: DequantizeLinear's (x - x_zero_point) * x_scale); or the ValidationError naming
    nonzero ones."""
    values = zps.astype(np.float32)
    if not np.all(values == 0):  # (a NaN is not 0)
        bad = values[values != 0].reshape(-1)[:3]
        raise ValidationError([Problem("zps", f"nonzero values ({', '.join(map(str, bad))}) with float codes",
                                       "zero points of 0 only (as DequantizeLinear allows for float codes)")])
    return zps if np.signbit(values).any() else None


class _Plan(NamedTuple):
    """What a call's signature (dtypes, shapes, attributes) settles, worked out once per
    signature: a tiny call's cost is its Python, and this is most of it."""

    dst: np.dtype  # OT (the dtype of scales, or output_dtype's), in native byte order
    compiled: bool  # whether the compiled kernel has these dtypes (kernels/native.py)
    vshape: tuple  # src viewed so that the parameters broadcast (geometry.view)
    varies: tuple
    count_p: int  # how many parameters that view has

    @classmethod
    def of(cls, src, dst, qtype, axis, group_shape) -> "_Plan":
        if qtype == PER_TENSOR or src.ndim == 0:
            vshape, varies = (max(src.size, 1),), (False,)  # one run
        else:
            vshape, varies = view(src.shape, qtype, axis, group_shape)
        return cls(dst, native.handles(src.dtype, dst), vshape, varies, param_count(vshape, varies))


def _output(src, dst):
    """An output for src: a freed output's buffer when there is one (buffers.py). The pool's
    own size rule (below min_bytes: NumPy's allocator) is applied here first, since the
    pool's call costs a tiny call more than the allocation it would hand back."""
    if src.size * dst.itemsize < buffers.POOL.min_bytes:
        return np.empty(src.shape, dst)
    return buffers.empty(src.shape, dst)


def _extras_ok(src, scales, zps, out, threads, dst) -> bool:
    """Cheap checks of out and threads for the common case; False sends the call to
    the full validation, which judges them exactly (and says what is wrong)."""
    if threads is not None and (type(threads) is not int or threads < 1):
        return False
    if out is None:
        return True
    return (
        type(out) is np.ndarray
        and out.dtype == dst
        and out.shape == src.shape
        and out.flags.writeable
        and not np.may_share_memory(out, src)
        and not np.may_share_memory(out, scales)
        and (zps is None or not np.may_share_memory(out, zps))
    )
