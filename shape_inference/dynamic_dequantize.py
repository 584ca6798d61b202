"""Shape inference for DynamicDequantize-1, -2 and -3: specs and attributes in, dst's spec out.

This one function holds every rule about the op's arguments (types, ranks,
lengths, attribute values).  ONNX's shape inference calls it through the schema,
`dyndq.check` calls it per node, and the kernel calls it on its arrays' specs
before computing, so the rules are written once.  It raises ValidationError
with every problem found; it never looks at data.
"""
from __future__ import annotations

import operator

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1, DYNAMIC_DEQUANTIZE_2, DYNAMIC_DEQUANTIZE_3, FLOAT_CODES_3
from dyndq.opdefs import PER_CHANNEL, PER_GROUP, PER_TENSOR, Problem, TensorSpec, ValidationError, dtypes


def _one_element(spec: TensorSpec, arg: str, qtype: str, problems: list[Problem]) -> None:
    """A per-tensor argument: shape [1] or [] (known dims only are judged)."""
    shape = spec.shape
    if shape is None:
        return
    if len(shape) > 1 or (len(shape) == 1 and isinstance(shape[0], int) and shape[0] != 1):
        problems.append(
            Problem(arg, f"shape {_fmt(shape)}", f"one element, shape [1] or [] (qtype={qtype})")
        )


def _fmt(shape) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _check_dtype(op, spec: TensorSpec | None, arg: str, problems: list[Problem]) -> None:
    if spec is None or spec.dtype is None:
        return
    allowed = op.allowed_dtypes(arg)
    if spec.dtype not in allowed:
        type_var = next(p.type_var for p in op.inputs if p.name == arg)
        problems.append(Problem(arg, f"dtype {spec.dtype}", f"{type_var} = {' | '.join(allowed)}"))


def _normalize_axis(axis, problems: list[Problem]) -> int | None:
    if isinstance(axis, bool):
        problems.append(Problem("axis", f"{axis!r} (bool)", "an integer"))
        return None
    try:
        return operator.index(axis)
    except TypeError:
        problems.append(Problem("axis", f"{axis!r} ({type(axis).__name__})", "an integer"))
        return None


def _common(op, src, scales, zps, qtype, axis, problems) -> int | None:
    """The rules both versions share: dtypes, qtype, axis, per_tensor and per_channel shapes."""
    _check_dtype(op, src, "src", problems)
    _check_dtype(op, scales, "scales", problems)
    _check_dtype(op, zps, "zps", problems)
    qtypes = op.attribute("qtype").allowed
    if not isinstance(qtype, str) or qtype not in qtypes:
        problems.append(Problem("qtype", repr(qtype), " | ".join(repr(q) for q in qtypes)))
    axis = _normalize_axis(axis, problems)
    if qtype == PER_TENSOR:
        _one_element(scales, "scales", qtype, problems)
        if zps is not None:
            _one_element(zps, "zps", qtype, problems)
    elif qtype == PER_CHANNEL:
        _check_per_channel(src, scales, zps, axis, problems)
    return axis


@DYNAMIC_DEQUANTIZE_1.def_shape_inference
def dynamic_dequantize(
    src: TensorSpec,
    scales: TensorSpec,
    zps: TensorSpec | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
) -> TensorSpec:
    problems: list[Problem] = []
    _common(DYNAMIC_DEQUANTIZE_1, src, scales, zps, qtype, axis, problems)
    if problems:
        raise ValidationError(problems)
    return TensorSpec("float32", src.shape)


@DYNAMIC_DEQUANTIZE_2.def_shape_inference
def dynamic_dequantize_2(
    src: TensorSpec,
    scales: TensorSpec,
    zps: TensorSpec | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
    group_shape: tuple[int, ...] | None = None,
) -> TensorSpec:
    """Version 2: dst has scales' dtype and src's shape; per_group judged here, the rest shared."""
    problems: list[Problem] = []
    _common(DYNAMIC_DEQUANTIZE_2, src, scales, zps, qtype, axis, problems)
    if qtype == PER_GROUP:
        _check_per_group(src, scales, zps, group_shape, problems)
    if problems:
        raise ValidationError(problems)
    dtype = scales.dtype if scales.dtype in DYNAMIC_DEQUANTIZE_2.allowed_dtypes("scales") else None
    return TensorSpec(dtype, src.shape)


@DYNAMIC_DEQUANTIZE_3.def_shape_inference
def dynamic_dequantize_3(
    src: TensorSpec,
    scales: TensorSpec,
    zps: TensorSpec | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
    group_shape: tuple[int, ...] | None = None,
    output_dtype: int | None = None,
) -> TensorSpec:
    """Version 3: version 2's rules over its wider types, plus: float codes take zero points of
    their own dtype only (whose values must be 0: the kernel checks them, this never sees data),
    and dst's dtype is output_dtype (required for float8e8m0 scales) or the dtype of scales."""
    op = DYNAMIC_DEQUANTIZE_3
    problems: list[Problem] = []
    _common(op, src, scales, zps, qtype, axis, problems)
    if qtype == PER_GROUP:
        _check_per_group(src, scales, zps, group_shape, problems)
    if zps is not None and zps.dtype is not None and src.dtype is not None:
        if src.dtype in FLOAT_CODES_3 and zps.dtype != src.dtype:
            problems.append(Problem("zps", f"dtype {zps.dtype}, with float codes (src is {src.dtype})",
                                    f"absent, or {src.dtype} zeros (float codes take zero points of 0 only)"))
        elif src.dtype not in FLOAT_CODES_3 and zps.dtype in FLOAT_CODES_3:
            problems.append(Problem("zps", f"dtype {zps.dtype}, with integer codes (src is {src.dtype})",
                                    f"an integer dtype: {' | '.join(n for n in op.allowed_dtypes('zps') if n not in FLOAT_CODES_3)}"))
    dtype = _output_dtype(op, scales, output_dtype, problems)
    if problems:
        raise ValidationError(problems)
    return TensorSpec(dtype, src.shape)


def _output_dtype(op, scales: TensorSpec, output_dtype, problems: list[Problem]) -> str | None:
    """dst's dtype name: output_dtype's, else the dtype of scales (None when not known)."""
    allowed = op.allowed_dtypes("dst")
    if output_dtype is None:
        if scales.dtype is not None and scales.dtype not in allowed and scales.dtype in op.allowed_dtypes("scales"):
            problems.append(Problem("output_dtype", f"absent, with {scales.dtype} scales",
                                    f"one of {_onnx_names(allowed)} ({scales.dtype} is no output dtype)"))
        return scales.dtype if scales.dtype in allowed else None
    code = _normalize_axis(output_dtype, [])  # an int, not a bool (its problem is worded below)
    row = None
    if code is not None:
        try:
            row = dtypes.by_onnx(code)
        except KeyError:
            pass
    if row is None or row.name not in allowed:
        what = f"{output_dtype!r}" + (f" ({row.onnx_name})" if row is not None else "")
        problems.append(Problem("output_dtype", what, f"a TensorProto data type among {_onnx_names(allowed)}"))
        return None
    return row.name


def _onnx_names(names) -> str:
    return ", ".join(f"{dtypes.by_name(n).onnx_name} ({dtypes.by_name(n).onnx})" for n in names)


def _group_shape(group_shape, problems) -> tuple[int, ...] | None:
    """group_shape as a tuple of ints, or None after saying what is wrong with it."""
    if group_shape is None:
        problems.append(Problem("group_shape", "missing", "a list of ints, one >= 1 per dim of src (qtype='per_group')"))
        return None
    if isinstance(group_shape, (str, bytes)) or not hasattr(group_shape, "__iter__"):
        problems.append(Problem("group_shape", f"{group_shape!r} ({type(group_shape).__name__})", "a list of ints"))
        return None
    items = list(group_shape)
    if not all(not isinstance(g, bool) and _is_int(g) for g in items):
        problems.append(Problem("group_shape", repr(group_shape), "a list of ints"))
        return None
    items = [operator.index(g) for g in items]
    if any(g < 1 for g in items):
        problems.append(Problem("group_shape", _fmt(items), "every entry >= 1"))
        return None
    return tuple(items)


def _is_int(value) -> bool:
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _check_per_group(src, scales, zps, group_shape, problems) -> None:
    groups = _group_shape(group_shape, problems)
    rank = src.rank
    if rank == 0:
        problems.append(Problem("src", "rank 0 (a scalar)", "rank >= 1 for qtype='per_group'"))
        return
    if groups is not None and rank is not None and len(groups) != rank:
        problems.append(Problem("group_shape", f"{len(groups)} entries {_fmt(groups)}",
                                f"{rank} entries, one per dim of src (qtype='per_group')"))
        groups = None
    if scales.shape is not None:
        if rank is not None and len(scales.shape) != rank:
            problems.append(Problem("scales", f"shape {_fmt(scales.shape)} (rank {len(scales.shape)})",
                                    f"src's rank {rank} (qtype='per_group')"))
        elif groups is not None and src.shape is not None and len(scales.shape) == len(groups):
            bad_dims = []
            for i, (d, n, g) in enumerate(zip(src.shape, scales.shape, groups)):
                if isinstance(d, int) and d % g:
                    problems.append(Problem("group_shape", f"group_shape[{i}] = {g}",
                                            f"a divisor of src.shape[{i}] = {d} (qtype='per_group')"))
                elif isinstance(d, int) and isinstance(n, int) and n * g != d:
                    bad_dims.append(i)
            if bad_dims:
                want = [d // g if isinstance(d, int) else "?" for d, g in zip(src.shape, groups)]
                problems.append(Problem("scales", f"shape {_fmt(scales.shape)}",
                                        f"shape [{','.join(map(str, want))}], src.shape / group_shape "
                                        f"(qtype='per_group', dims {bad_dims} differ)"))
    if zps is None or zps.shape is None or scales.shape is None:
        return
    if len(zps.shape) != len(scales.shape) or any(
        isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(zps.shape, scales.shape)
    ):
        problems.append(Problem("zps", f"shape {_fmt(zps.shape)}",
                                f"the shape of scales {_fmt(scales.shape)} (qtype='per_group')"))


def _check_per_channel(src, scales, zps, axis, problems) -> None:
    rank = src.rank
    channels = None
    if axis is not None and rank is not None:
        if rank == 0:
            problems.append(
                Problem("src", "rank 0 (a scalar)", "rank >= 1 for qtype='per_channel' (it needs a channel axis)")
            )
        elif not -rank <= axis < rank:
            problems.append(
                Problem("axis", str(axis), f"an integer in [{-rank}, {rank - 1}] for src of rank {rank}")
            )
        else:
            channels = src.shape[axis]
    if scales.shape is not None:
        if len(scales.shape) != 1:
            problems.append(
                Problem("scales", f"shape {_fmt(scales.shape)} (rank {len(scales.shape)})",
                        "a 1-D tensor with src.shape[axis] elements (qtype='per_channel')")
            )
        elif isinstance(channels, int) and isinstance(scales.shape[0], int) and scales.shape[0] != channels:
            problems.append(
                Problem("scales", f"{scales.shape[0]} elements",
                        f"{channels} elements, src.shape[{axis}] (qtype='per_channel', axis={axis})")
            )
    if zps is None or zps.shape is None:
        return
    if zps.shape in ((), (1,)):
        return  # one zero point shared by every channel, as oneDNN allows
    if scales.shape is not None and len(zps.shape) == len(scales.shape) == 1:
        a, b = zps.shape[0], scales.shape[0]
        if not (isinstance(a, int) and isinstance(b, int)) or a == b:
            return  # equal, or not known to differ
    elif len(zps.shape) == 1 and scales.shape is None:
        return
    problems.append(
        Problem("zps", f"shape {_fmt(zps.shape)}",
                f"the shape of scales{'' if scales.shape is None else ' ' + _fmt(scales.shape)}, "
                "or one element (qtype='per_channel')")
    )
