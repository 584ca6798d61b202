"""One weight quantized: the layout around the per-group rules of `rtn` and `search`.

`quantize_weight(weight, axis=..., group_size=...)` cuts the weight into groups of
`group_size` consecutive elements along `axis` (the whole axis for -1), hands them to the
method block by block (tiles of whole groups, 64K elements: the memory it takes beyond the
weight is its codes and a few MiB of scratch arrays per thread, scratch.py), the blocks shared
among the cores (`_in_threads`: one thread's bytes and error sums, bit for bit), and returns the codes, scales and zero points in the
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

Pure NumPy and ml_dtypes, and our kernel for the values the graph gives back (and for rtn's
levels, rtn.matmul_levels; for rtn on a float32 weight with float32 scales, the whole tile,
native.rtn_tile): no onnx here.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from dyndq.kernels import native, parallel
from dyndq.kernels.dynamic_dequantize import dynamic_dequantize
from dyndq.quantization.rtn import Levels, half_of, qmax_of, rtn
from dyndq.quantization.scratch import release, scratch
from dyndq.quantization.search import search

ROUNDINGS = {"rtn": rtn, "search": search}  # the methods that see one group at a time (quantize_weight)
DATA_AWARE = ("gptq", "awq")  # the methods that need the layer's inputs too (gptq.py, awq.py; quantizer.py collects them)
METHODS = (*ROUNDINGS, *DATA_AWARE)
BLOCK_ELEMENTS = 1 << 16  # elements of the weight handed to a method at a time (its temporaries: a few MiB)
TILE_COLUMNS = 256  # columns of a block when the axis is not the last (see quantize_weight)


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
        self.merge(ErrorStats.of(w, dq))

    @staticmethod
    def of(w: np.ndarray, dq: np.ndarray) -> ErrorStats:
        """The sums of one block (threads compute blocks' sums apart, `merge` adds them in order)."""
        w64, dq64 = w.astype(np.float64), dq.astype(np.float64)
        return ErrorStats.of_float64(w64, dq64, w64 - dq64)

    @staticmethod
    def of_float64(w64: np.ndarray, dq64: np.ndarray, diff: np.ndarray) -> ErrorStats:
        """The sums of float64 `w64`, `dq64` and `diff` = w64 - dq64 (overwritten: |diff|)."""
        return ErrorStats(float(np.einsum("i,i->", diff.ravel(), diff.ravel())),
                          float(np.einsum("i,i->", w64.ravel(), w64.ravel())),
                          float(np.einsum("i,i->", dq64.ravel(), dq64.ravel())),
                          float(np.einsum("i,i->", w64.ravel(), dq64.ravel())),
                          float(np.abs(diff, out=diff).max()) if diff.size else None)

    def merge(self, block: ErrorStats) -> None:
        self.sq_error += block.sq_error
        self.sq_weight += block.sq_weight
        self.sq_dequantized += block.sq_dequantized
        self.dot += block.dot
        if block.max_abs is not None:
            # (NumPy's max keeps a NaN, where Python's max(0.0, nan) gives 0.0: a NaN error never
            # shows a max of 0 beside it)
            self.max_abs = float(np.max([self.max_abs, block.max_abs]))

    @property
    def finite(self) -> bool:
        """Whether every sum is finite (a NaN or an infinity in either weight makes one not)."""
        return bool(np.isfinite([self.sq_error, self.sq_weight, self.sq_dequantized, self.dot, self.max_abs]).all())

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
    format: str = "int"  # the format it is in (formats/: its dequantize, the nodes it writes)

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
    assert 1 <= group and bits in (2, 4, 8) and method in ROUNDINGS, (group, length, bits, method)
    scale_dtype = np.dtype(scale_dtype or weight.dtype)
    outer = int(np.prod(weight.shape[:axis], dtype=np.int64))
    inner = int(np.prod(weight.shape[axis + 1:], dtype=np.int64))
    n_groups = -(-length // group)
    w3 = weight.reshape(outer, length, inner)
    levels3 = np.empty((outer, n_groups * group, inner), np.uint8)
    scales3 = np.empty((outer, n_groups, inner), scale_dtype)
    zeros3 = np.empty((outer, n_groups, inner), np.uint8)
    # A block is a tile of whole groups along the axis (k) by up to TILE_COLUMNS columns (n), by
    # as many outer rows (o) as fill BLOCK_ELEMENTS: transposing it to rows of groups reads runs
    # of TILE_COLUMNS contiguous elements, where the axis' whole length by a few columns would
    # read a few elements per row of the weight, each a cache miss.  Groups are independent, so
    # the tiling changes no code, scale or zero point.
    k_block = min(length, group * max(1, BLOCK_ELEMENTS // (group * min(inner, TILE_COLUMNS))))
    n_block = max(1, min(inner, BLOCK_ELEMENTS // k_block))
    o_block = max(1, BLOCK_ELEMENTS // (k_block * n_block))

    # ONNX Runtime's RTN (either rule) on a float32 weight with float32 scales, the common case, runs in
    # place in one compiled pass per block (native.rtn_tile: no transposing copy, no float64
    # copies for the sums); every other case, and a block the tile hands back (a value beyond
    # float32's range, which `_within_range` steps back; a group of zeros with a -0, whose scale's
    # sign NumPy's min and max decide), takes the NumPy path below, the same bytes.
    in_place = (method == "rtn" and weight.dtype == np.float32 and scale_dtype == np.float32
                and native.built())
    if in_place:
        w3 = np.ascontiguousarray(w3)

    def one_block(o: int, k: int, n: int) -> ErrorStats:
        """Block (o, k, n) quantized into its own parts of levels3, scales3 and zeros3; its error sums."""
        if in_place:
            sums = native.rtn_tile(w3, levels3, scales3, zeros3, group, qmax_of(bits), symmetric, rule,
                                   (o, min(o + o_block, outer)), (k, min(k + k_block, length)),
                                   (n, min(n + n_block, inner)))
            if sums is not None and sums[0]:
                return ErrorStats(*sums[1:])
        part = w3[o:o + o_block, k:k + k_block, n:n + n_block]
        k_len = part.shape[1]
        rows = scratch("rows", (part.shape[0] * part.shape[2], k_len), weight.dtype)  # (a copy of this block only)
        np.copyto(rows.reshape(part.shape[0], part.shape[2], k_len), part.transpose(0, 2, 1))
        q = _quantize_rows(rows, group, bits, symmetric, scale_dtype, ROUNDINGS[method], rule)
        q, values = _within_range(q, rows, weight.dtype, bits)
        shape = (part.shape[0], part.shape[2])
        g = k // group  # (k is a whole number of groups)
        levels = q.levels.reshape(*shape, -1).transpose(0, 2, 1)
        levels3[o:o + o_block, k:k + levels.shape[1], n:n + n_block] = levels
        scales3[o:o + o_block, g:g + q.scales.shape[1], n:n + n_block] = q.scales.reshape(*shape, -1).transpose(0, 2, 1)
        zeros3[o:o + o_block, g:g + q.zeros.shape[1], n:n + n_block] = q.zeros.reshape(*shape, -1).transpose(0, 2, 1)
        return _block_sums(rows, values[:, :k_len])

    starts = [(o, k, n) for o in range(0, outer, o_block) for k in range(0, length, k_block)
              for n in range(0, inner, n_block)]
    stats = ErrorStats()
    try:
        for block in _in_threads(one_block, starts, weight.size):
            stats.merge(block)  # (in the blocks' order, whichever thread finished first: the same sums)
    finally:
        release()  # (the blocks run on this thread alone keep no scratch beyond the weight)
    shape = list(weight.shape)
    codes = _codes(levels3, zeros3, group, bits, symmetric)
    shape[axis] = n_groups * group
    codes = codes.reshape(shape)
    shape[axis] = n_groups
    dtype = code_dtype(bits, symmetric)
    zero_points = None if symmetric else zeros3.reshape(shape).astype(dtype)
    return QuantizedWeight(codes, scales3.reshape(shape), zero_points, axis, group, length, stats)


def from_rows(rows: np.ndarray, q: Levels, shape, axis: int, group: int, bits: int, symmetric: bool) -> QuantizedWeight:
    """A 2-D weight of `shape` whose rows along `axis` (`rows`: [other dim, length], the
    weight's dtype) a whole-row method (gptq.py) quantized to `q` (levels [rows, n_groups * group],
    padded with level 0 as `quantize_weight` pads them), in quantize_weight's layout, after the
    same range check (`_within_range`) and with the same error sums."""
    assert len(shape) == 2 and rows.shape == (shape[1 - axis], shape[axis]), (shape, axis, rows.shape)
    try:
        q, values = _within_range(q, rows, rows.dtype, bits)
        stats = _block_sums(rows, values[:, :rows.shape[1]])
    finally:
        release()
    codes = _codes(q.levels, q.zeros, group, bits, symmetric)
    zeros = None if symmetric else q.zeros.astype(code_dtype(bits, symmetric))
    if axis == 0:  # ([K, N]: the rows are its columns)
        codes, scales, zeros = codes.T, q.scales.T, None if zeros is None else zeros.T
    else:
        scales = q.scales
    return QuantizedWeight(np.ascontiguousarray(codes), np.ascontiguousarray(scales),
                           None if zeros is None else np.ascontiguousarray(zeros), axis, group, shape[axis], stats)


def _block_sums(w: np.ndarray, dq: np.ndarray) -> ErrorStats:
    """ErrorStats.of(w, dq), its float64 copies in this thread's scratch arrays (see scratch.py)."""
    w64, dq64, diff = (scratch(name, w.shape, np.float64) for name in ("sums.w", "sums.dq", "sums.diff"))
    np.copyto(w64, w, casting="unsafe")  # (as astype: bfloat16 and float16 weights too)
    np.copyto(dq64, dq, casting="unsafe")
    np.subtract(w64, dq64, out=diff)
    return ErrorStats.of_float64(w64, dq64, diff)


def _in_threads(work, starts: list, size: int):
    """work(*start) for every start, its results in the order of `starts`.

    The blocks are shared among threads (parallel.threads_for: the cores this process may run on,
    DYNDQ_NUM_THREADS, one thread for a small weight): NumPy's loops and our kernel release the
    GIL, so a weight's blocks really run at once.  The blocks write disjoint parts of the result,
    and their sums are merged in order, so the result is the one of a single thread, bit for bit.
    An error is raised as the first block raising it would raise it alone."""
    n_threads = parallel.threads_for(size, len(starts), None)
    if n_threads <= 1:
        return [work(*s) for s in starts]
    # (a pool of its own: the kernel's shared pool may be waited on from inside a block)
    with ThreadPoolExecutor(max_workers=n_threads, thread_name_prefix="dyndq-quantize") as pool:
        futures = [pool.submit(work, *s) for s in starts]
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()  # (after an error, the blocks not started yet are not run)


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
    out = scratch("values", levels.shape, scales.dtype)  # (the block is one thread's: no threads within)
    values = dynamic_dequantize(levels, scales, zeros, qtype="per_group", group_shape=[1, group], out=out, threads=1)
    with np.errstate(over="ignore"):
        return values.astype(dtype, copy=False)


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
        bad = ~np.isfinite(values.astype(np.float32, copy=False))
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
