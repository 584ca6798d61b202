"""One weight quantized: the layout around the per-group rules of `rtn` and `search`.

`quantize_weight(weight, axis=..., group_size=...)` cuts the weight into groups of
`group_size` consecutive elements along `axis` (the whole axis for -1), hands them to the
method block by block (a few MiB at a time, so the memory it takes beyond the weight is
its codes and small temporaries), and returns the codes, scales and zero points in the
layout DynamicDequantize-2 takes (`per_group`: src's rank, one scale per block), with the
error statistics of the dequantized weight against the original.

A last group shorter than `group_size` (the axis not a multiple of it) is quantized on its
own elements; the codes are then padded along `axis` to whole groups with level 0 (the bytes
ONNX Runtime's MatMulNBits holds there), and `padded_to` says how long the padded axis is:
the graph takes the first `length` elements back with a Slice (DynamicDequantize's per_group
needs whole groups, as MatMulNBits stores them).  An axis shorter than the group is one such
group: ONNX Runtime's quantizer pads K to a whole block with zeros and quantizes the block on
its K real elements (MlasQuantizeBlockwise is given the real K), which is the same rule.

Nothing it writes dequantizes to a value the weight did not hold: a scale its dtype cannot
hold (float32 weights of 1e6 with float16 scales) raises `ScaleOutOfRange`, and a level whose
value (level - zero) * scale rounds beyond the largest value of the scale dtype or of the
weight's (float16 weights near 65504, whose scale rounded up) steps toward its group's zero
level until it is finite (`_within_range`): the value just inside the range, where ONNX
Runtime's would be infinite.

Pure NumPy and ml_dtypes, and our kernel for the values the graph gives back: no onnx here.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from dyndq.kernels.dynamic_dequantize import dynamic_dequantize
from dyndq.quantization.rtn import Levels, half_of, rtn
from dyndq.quantization.search import search

METHODS = {"rtn": rtn, "search": search}
BLOCK_ELEMENTS = 1 << 16  # elements of the weight handed to a method at a time (its temporaries: a few MiB)


class ScaleOutOfRange(ValueError):
    """A group's scale is beyond the largest value of the scale dtype asked for: `found` and
    `allowed` say so in the words of a `Problem`."""

    def __init__(self, found: str, allowed: str):
        super().__init__(f"found {found}; allowed: {allowed}")
        self.found, self.allowed = found, allowed


@dataclass
class ErrorStats:
    """Sums over a weight, to tell how far the dequantized weight is from the original."""

    sq_error: float = 0.0
    sq_weight: float = 0.0
    sq_dequantized: float = 0.0
    dot: float = 0.0
    max_abs: float = 0.0

    def add(self, w: np.ndarray, dq: np.ndarray) -> None:
        w, dq = w.astype(np.float64), dq.astype(np.float64)
        diff = w - dq
        self.sq_error += float(np.einsum("i,i->", diff.ravel(), diff.ravel()))
        self.sq_weight += float(np.einsum("i,i->", w.ravel(), w.ravel()))
        self.sq_dequantized += float(np.einsum("i,i->", dq.ravel(), dq.ravel()))
        self.dot += float(np.einsum("i,i->", w.ravel(), dq.ravel()))
        if diff.size:
            # (NumPy's max keeps a NaN, where Python's max(0.0, nan) gives 0.0: a NaN error never
            # shows a max of 0 beside it)
            self.max_abs = float(np.max([self.max_abs, np.abs(diff).max()]))

    @property
    def relative(self) -> float:
        """|W - W'| / |W| (Frobenius); 0 for an all-zero weight rebuilt exactly."""
        return float(np.sqrt(self.sq_error / self.sq_weight)) if self.sq_weight else float(self.sq_error > 0)

    @property
    def cosine(self) -> float:
        norms = np.sqrt(self.sq_weight) * np.sqrt(self.sq_dequantized)
        return float(self.dot / norms) if norms else float(self.sq_error == 0)


@dataclass
class QuantizedWeight:
    codes: np.ndarray  # int2/uint2/int4/uint4/int8/uint8/float4e2m1, the weight's shape with `axis` padded to whole groups
    scales: np.ndarray  # the weight's rank, `axis` holding one entry per group; the scale dtype
    zero_points: np.ndarray | None  # the shape of scales, the codes' dtype; None when symmetric
    axis: int
    group: int  # elements per group along axis
    length: int  # the axis' length in the weight
    stats: ErrorStats = field(default_factory=ErrorStats)
    # NVFP4's float32 tensor scale g (fp4.py): then `scales` are float8e4m3fn codes of the block
    # scales, which dequantize with g before the codes dequantize with them
    tensor_scale: np.float32 | None = None

    @property
    def padded_to(self) -> int | None:
        """The padded axis length, or None when groups divide the axis."""
        padded = self.codes.shape[self.axis]
        return padded if padded != self.length else None

    @property
    def group_shape(self) -> list[int]:
        return [self.group if i == self.axis else 1 for i in range(self.codes.ndim)]


def code_dtype(bits: int, symmetric: bool) -> np.dtype:
    return np.dtype({(2, True): ml_dtypes.int2, (2, False): ml_dtypes.uint2,
                     (4, True): ml_dtypes.int4, (4, False): ml_dtypes.uint4,
                     (8, True): np.int8, (8, False): np.uint8}[bits, symmetric])


def quantize_weight(weight: np.ndarray, *, axis: int, group_size: int, bits: int = 4, symmetric: bool = False,
                    scale_dtype=None, method: str = "rtn", rule: str = "matmul") -> QuantizedWeight:
    """`weight` quantized along `axis` in groups of `group_size` (-1: the whole axis).

    The caller has judged the arguments (the face names bad ones as problems); this checks
    them again only as assertions of its contract."""
    weight = np.asarray(weight)
    axis = axis % weight.ndim
    length = weight.shape[axis]
    group = length if group_size == -1 else group_size
    assert 1 <= group and bits in (2, 4, 8) and method in METHODS, (group, length, bits, method)
    scale_dtype = np.dtype(scale_dtype or weight.dtype)
    outer = int(np.prod(weight.shape[:axis], dtype=np.int64))
    inner = int(np.prod(weight.shape[axis + 1:], dtype=np.int64))
    n_groups = -(-length // group)
    w3 = weight.reshape(outer, length, inner)
    levels3 = np.empty((outer, n_groups * group, inner), np.uint8)
    scales3 = np.empty((outer, n_groups, inner), scale_dtype)
    zeros3 = np.empty((outer, n_groups, inner), np.uint8)
    stats = ErrorStats()
    per_row = max(1, BLOCK_ELEMENTS // length)  # rows of `length` elements per block
    n_block = min(inner, per_row)
    o_block = max(1, per_row // n_block)
    for o in range(0, outer, o_block):
        for n in range(0, inner, n_block):
            part = w3[o:o + o_block, :, n:n + n_block]
            rows = part.transpose(0, 2, 1).reshape(-1, length)  # (a copy of this block only)
            q = _quantize_rows(rows, group, bits, symmetric, scale_dtype, METHODS[method], rule)
            q, values = _within_range(q, rows, weight.dtype, bits)
            stats.add(rows, values[:, :length])
            shape = (part.shape[0], part.shape[2])
            levels3[o:o + o_block, :, n:n + n_block] = q.levels.reshape(*shape, -1).transpose(0, 2, 1)
            scales3[o:o + o_block, :, n:n + n_block] = q.scales.reshape(*shape, -1).transpose(0, 2, 1)
            zeros3[o:o + o_block, :, n:n + n_block] = q.zeros.reshape(*shape, -1).transpose(0, 2, 1)
    shape = list(weight.shape)
    codes = _codes(levels3, zeros3, group, bits, symmetric)
    shape[axis] = n_groups * group
    codes = codes.reshape(shape)
    shape[axis] = n_groups
    dtype = code_dtype(bits, symmetric)
    zero_points = None if symmetric else zeros3.reshape(shape).astype(dtype)
    return QuantizedWeight(codes, scales3.reshape(shape), zero_points, axis, group, length, stats)


def _quantize_rows(rows, group, bits, symmetric, scale_dtype, method, rule) -> Levels:
    """Rows of the whole axis: full groups, then the short last one (if any) on its own."""
    n_rows, length = rows.shape
    full = length // group
    parts = []
    if full:
        parts.append(method(rows[:, :full * group].reshape(n_rows, full, group),
                            bits=bits, symmetric=symmetric, scale_dtype=scale_dtype, rule=rule))
    if length % group:
        tail = method(rows[:, full * group:].reshape(n_rows, 1, -1),
                      bits=bits, symmetric=symmetric, scale_dtype=scale_dtype, rule=rule)
        pad = np.zeros((n_rows, 1, group - tail.levels.shape[-1]), np.uint8)
        parts.append(Levels(np.concatenate([tail.levels, pad], axis=-1), tail.zeros, tail.scales))
    return Levels(
        np.concatenate([p.levels for p in parts], axis=1).reshape(n_rows, -1),
        np.concatenate([p.zeros for p in parts], axis=1),
        np.concatenate([p.scales for p in parts], axis=1),
    )


def _values(levels, zeros, scales, dtype) -> np.ndarray:
    """Rows of levels as the graph gives them back, padding included: our kernel's values (an
    overflow infinite), cast to the weight's `dtype`."""
    group = levels.shape[1] // scales.shape[1]
    values = dynamic_dequantize(levels, scales, zeros, qtype="per_group", group_shape=[1, group])
    with np.errstate(over="ignore"):
        return values.astype(dtype)


def _within_range(q: Levels, rows: np.ndarray, dtype, bits: int) -> tuple[Levels, np.ndarray]:
    """(`q` with every value finite in the scale dtype and in the weight's `dtype` (see the
    module doc), its values in `dtype`); ScaleOutOfRange when a scale itself is not finite."""
    scales = q.scales.astype(np.float32)
    if not np.isfinite(scales).all():
        top = float(np.abs(rows.astype(np.float64)).max())
        name = np.dtype(q.scales.dtype).name
        raise ScaleOutOfRange(
            f"values up to {top:.4g} in magnitude, whose groups need scales beyond the largest {name} "
            f"({float(ml_dtypes.finfo(q.scales.dtype).max):.6g})",
            "scales of a dtype that holds them (scale_dtype float32 or bfloat16, or the weight's own)")
    levels = q.levels
    for _ in range(1 << bits):  # (at most qmax steps: a level at its zero gives 0)
        values = _values(levels, q.zeros, q.scales, dtype)
        bad = ~np.isfinite(values.astype(np.float32))
        if not bad.any():
            break
        zeros = np.repeat(q.zeros, levels.shape[1] // q.zeros.shape[1], axis=1).astype(np.int16)
        wide = levels.astype(np.int16)
        levels = np.where(bad, wide - np.sign(wide - zeros), wide).astype(np.uint8)
    return Levels(levels, q.zeros, q.scales), values


def _codes(levels, zeros, group, bits, symmetric) -> np.ndarray:
    """Levels as stored: unsigned as they are; signed as level - half."""
    dtype = code_dtype(bits, symmetric)
    if not symmetric:
        return levels.astype(dtype)
    return (levels.astype(np.int16) - half_of(bits)).astype(np.int8).astype(dtype)
