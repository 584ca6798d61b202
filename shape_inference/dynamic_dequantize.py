"""Shape inference for DynamicDequantize-1: specs and attributes in, dst's spec out.

This one function holds every rule about the op's arguments (types, ranks,
lengths, attribute values).  ONNX's shape inference calls it through the schema,
`dyndq.check` calls it per node, and the kernel calls it on its arrays' specs
before computing, so the rules are written once.  It raises ValidationError
with every problem found; it never looks at data.
"""
from __future__ import annotations

import operator

from dyndq.opdefs import PER_CHANNEL, PER_TENSOR, QTYPES, Problem, TensorSpec, ValidationError
from dyndq.opdefs import DYNAMIC_DEQUANTIZE_1 as OP


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


def _check_dtype(spec: TensorSpec | None, arg: str, problems: list[Problem]) -> None:
    if spec is None or spec.dtype is None:
        return
    allowed = OP.allowed_dtypes(arg)
    if spec.dtype not in allowed:
        type_var = next(p.type_var for p in OP.inputs if p.name == arg)
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


@OP.def_shape_inference
def dynamic_dequantize(
    src: TensorSpec,
    scales: TensorSpec,
    zps: TensorSpec | None = None,
    *,
    qtype: str = PER_TENSOR,
    axis: int = 1,
) -> TensorSpec:
    problems: list[Problem] = []
    _check_dtype(src, "src", problems)
    _check_dtype(scales, "scales", problems)
    _check_dtype(zps, "zps", problems)

    if not isinstance(qtype, str) or qtype not in QTYPES:
        problems.append(Problem("qtype", repr(qtype), " | ".join(repr(q) for q in QTYPES)))
    axis = _normalize_axis(axis, problems)

    if qtype == PER_TENSOR:
        _one_element(scales, "scales", qtype, problems)
        if zps is not None:
            _one_element(zps, "zps", qtype, problems)
    elif qtype == PER_CHANNEL:
        _check_per_channel(src, scales, zps, axis, problems)

    if problems:
        raise ValidationError(problems)
    return TensorSpec("float32", src.shape)


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
