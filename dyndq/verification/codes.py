"""A decode's codes against round-to-nearest of the float source, and the known wrong layouts.

Round to nearest is ONNX Runtime's, as `dyndq.quantization.rtn` computes it (both of its rules:
"matmul", MlasQuantizeBlockwise, and "gather", its NumPy quantize_ndarray; symmetric or not),
through `quantize_weight` on the source laid out as the DynamicDequantize's output is (its
`index_map`), the padding of a last partial block zeros, as ONNX Runtime pads.  Codes are
compared as offsets from their zero point (code - zero point), with the scales bit for bit, so
MatMulNBits' implicit zero point 8 and a signed symmetric code are one thing.

A layout is named only when a known mistake, undone, gives round to nearest exactly:
"nibble-order" (each pair of neighbouring codes swapped, along the blocks or in storage order),
"zero-point-off-by-one" (codes and scales exact, the zero points all 1 above or all 1 below:
GPTQ's v1 and v2), "block-order" (the blocks of a row, codes, scale and zero point together, in
another order), "transposed" (a square weight's codes are round to nearest of its transpose).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dyndq.opdefs import dtypes

K_LEVELS = 2  # a requantization moves codes by at most this many levels of the RTN's step...
REQUANTIZED_ERROR = 2.0  # ...or keeps the error within this many times RTN's own


@dataclass
class Grouping:
    axis: int  # the axis the groups run along
    block: int  # elements per group (-1: the whole axis)
    bits: int
    tensor: bool = False  # one group: the whole tensor (per_tensor)


@dataclass
class Rtn:
    """One round-to-nearest candidate: its rule and the offsets, scales and zero points it gives."""

    rule: str
    symmetric: bool
    offsets: np.ndarray  # int64, the codes' shape: code - zero point
    levels: np.ndarray  # int64: the codes as stored (offset + zero point)
    scales: np.ndarray  # the decoder's scales' shape
    zeros: np.ndarray | None  # int64, the scales' shape

    def name(self, g: Grouping) -> str:
        block = "per tensor" if g.tensor else "per channel" if g.block == -1 else f"block {g.block}"
        owner = OWNERS.get(self.rule, f"ONNX Runtime's {self.rule}")
        return f"{owner} rule ({RULE_SOURCES[self.rule]})" + \
            f", {'symmetric' if self.symmetric else 'asymmetric'}, {g.bits} bits, {block}"


# where each rule is ONNX Runtime's: its weight-only quantizer's two (dyndq.quantization.rtn), and
# its QDQ/QOperator quantizer's (quantize_static, quantize_dynamic: quant_utils.quantize_data, called);
# NNCF's data-free weight compression (nncf_candidates); Olive's 8-bit Gather tables (rtn_candidates)
RULE_SOURCES = {"matmul": "MlasQuantizeBlockwise", "gather": "quantize_ndarray", "qdq": "quant_utils.quantize_data",
                "qdq-reduced": "quant_utils.quantize_data with reduce_range",
                "nncf": "weight_lowering.do_integer_quantization",
                "olive": "OnnxBlockWiseRtnQuantization._quantize_ndarray"}
OWNERS = {"nncf": "NNCF's", "olive": "Olive's"}  # (the rules that are no quantizer's of ONNX Runtime's)


def grouping(decoder, codes: np.ndarray, scales: np.ndarray) -> Grouping | None:
    """How the DynamicDequantize groups its codes (None: per tensor, or a form RTN has no rule for)."""
    try:
        bits = dtypes.narrow_integer_bits(dtypes.of(codes.dtype))
    except KeyError:  # (a type the table lacks: no codes of ours)
        bits = None
    if bits is None or codes.ndim != 2:
        return None
    attrs = {a.name: a for a in decoder.attribute}
    qtype = attrs["qtype"].s.decode() if "qtype" in attrs else "per_tensor"
    if qtype == "per_group":
        shape = list(attrs["group_shape"].ints)
        wide = [i for i, g in enumerate(shape) if g > 1]
        if len(wide) != 1:
            return None
        return Grouping(wide[0], shape[wide[0]], bits)
    if qtype == "per_channel":
        channel = (attrs["axis"].i if "axis" in attrs else 1) % 2
        return Grouping(1 - channel, -1, bits)
    return Grouping(0, -1, bits, tensor=True)


def _ints(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.int64)


def _spread(params: np.ndarray, g: Grouping, shape) -> np.ndarray:
    """Per-group parameters repeated over their group's elements (the codes' shape)."""
    if g.block == -1:
        return np.broadcast_to(params, shape)
    return np.repeat(params, g.block, axis=g.axis)[tuple(slice(0, s) for s in shape)]


def grouped(params: np.ndarray | None, g: Grouping, shape) -> np.ndarray | None:
    """Scales or zero points in the layout quantize_weight gives them (the axis one per group)."""
    if params is None:
        return None
    if g.tensor:
        return np.asarray(params).reshape([1] * len(shape))
    out = list(shape)
    out[g.axis] = 1 if g.block == -1 else -(-shape[g.axis] // g.block)
    return np.asarray(params).reshape(out)


def offsets_of(codes, zeros, g: Grouping) -> np.ndarray:
    z = 0 if zeros is None else _spread(_ints(zeros), g, codes.shape)
    return _ints(codes) - z


def rtn_candidates(source: np.ndarray, g: Grouping, scale_dtype, reader: str) -> list[Rtn]:
    """Round to nearest of `source` (laid out as the codes), by each rule and symmetry, the
    reader's own rule first (a Gather's table: the gather rule; at 8 bits Olive's, below)."""
    from dyndq.quantization.numerics import ScaleOutOfRange, quantize_weight

    if g.tensor:
        return []
    rules = ("gather", "matmul") if reader == "Gather" else ("matmul", "gather")
    if reader == "Gather" and g.bits == 8:
        # ONNX Runtime's quantize_ndarray is 4-bit only: an 8-bit table's codes by that formula are
        # Olive's (OnnxBlockWiseRtnQuantization._quantize_ndarray, its 8-bit GatherBlockQuantized:
        # the same NumPy steps with qmin -128, qmax 255, mid 128), which dyndq's gather rule at 8 bits follows
        rules = ("olive", "matmul")
    out = []
    for rule in rules:
        if rule == "gather" and g.bits == 2:  # (ONNX Runtime quantizes no Gather at 2 bits)
            continue
        for symmetric in (False, True):
            try:
                with np.errstate(all="ignore"):
                    q = quantize_weight(source, axis=g.axis, group_size=g.block, bits=g.bits, symmetric=symmetric,
                                        scale_dtype=scale_dtype, rule="gather" if rule == "olive" else rule)
            except ScaleOutOfRange:  # (a NaN, infinity or huge value no scale of that type holds: no RTN to be)
                continue
            codes = _ints(q.codes)[tuple(slice(0, s) for s in source.shape)]
            zeros = None if q.zero_points is None else _ints(q.zero_points)
            offsets = offsets_of(codes, zeros, g)
            levels = offsets + (1 << (g.bits - 1) if symmetric else _spread(zeros, g, codes.shape))
            out.append(Rtn(rule, symmetric, offsets, levels, q.scales, zeros))
    return out


def nncf_candidates(source: np.ndarray, g: Grouping, scale_dtype) -> list[Rtn]:
    """NNCF's round to nearest of `source` (nncf.compress_weights' data-free INT4/INT8 modes, its
    reference path: weight_lowering.calculate_integer_quantization_params and
    _calculate_integer_quantized_weight, NNCF 3.4), symmetric and asymmetric.  Written out here
    because nncf is no dependency of dyndq (it pulls in scipy, scikit-learn, networkx): the rule is
    a few lines, and `make test-nncf` checks it against NNCF's own output.  It differs from ONNX
    Runtime's: float32 throughout, w / scale (not w times a reciprocal), NumPy's half-to-even
    rounding; symmetric: scale = (|min| >= max ? |min| : -max) / 2^(bits-1), signed codes
    -2^(bits-1)..2^(bits-1)-1 and no zero point; asymmetric: min and max widened to hold 0, scale =
    (max - min) / (2^bits - 1), zero point = clip(-round(min / scale)), codes round(w / scale + zp).
    Scales below float32's eps are eps.  On float32 weights this is ONNX Runtime's gather rule but
    for two kinds of group: one whose scale falls below eps (a group of zeros: a pruned column), and
    one holding a single positive value (NNCF's symmetric scale positive, ONNX Runtime's negative).
    ([] where the form is per tensor.)"""
    if g.tensor:
        return []
    w = np.moveaxis(np.asarray(source, np.float32), g.axis, -1)
    length = w.shape[-1]
    block = length if g.block == -1 else g.block
    if length % block:  # (NNCF groups only an axis its group size divides)
        return []
    w = w.reshape(*w.shape[:-1], length // block, block)
    lo, hi = w.min(axis=-1, keepdims=True), w.max(axis=-1, keepdims=True)
    eps = np.finfo(np.float32).eps
    out = []
    for symmetric in (True, False):
        with np.errstate(all="ignore"):
            if symmetric:
                qmin, qmax = -(1 << (g.bits - 1)), (1 << (g.bits - 1)) - 1
                scale = np.where(np.abs(lo) >= hi, np.abs(lo), -hi) / np.float32(1 << (g.bits - 1))
                scale = np.where(np.abs(scale) < eps, eps, scale).astype(np.float32)
                zeros = None
                levels = np.clip(np.round(w / scale), qmin, qmax)
            else:
                qmin, qmax = 0, (1 << g.bits) - 1
                lo0, hi0 = np.minimum(np.float32(0), lo), np.maximum(np.float32(0), hi)
                scale = ((hi0 - lo0) / np.float32(qmax)).astype(np.float32)
                scale = np.where(np.abs(scale) < eps, eps, scale).astype(np.float32)
                zeros = np.clip((np.float32(0) - np.round(lo0 / scale)).astype(np.int32), qmin, qmax)
                levels = np.clip(np.round(w / scale + zeros.astype(np.float32)), qmin, qmax)
        if not np.isfinite(scale).all():
            continue
        levels = np.moveaxis(_ints(levels).reshape(*levels.shape[:-2], length), -1, g.axis)
        shape = list(source.shape)
        shape[g.axis] = 1 if g.block == -1 else length // block
        scales = np.moveaxis(scale[..., 0], -1, g.axis).reshape(shape).astype(scale_dtype)
        z = None if zeros is None else np.moveaxis(_ints(zeros)[..., 0], -1, g.axis).reshape(shape)
        offsets = offsets_of(levels, z, g)
        out.append(Rtn("nncf", symmetric, offsets, levels, scales, z))
    return out


def also_nncf(rtn: Rtn, candidates: list[Rtn], offsets, scales, zeros, covered) -> str:
    """Where ONNX Runtime's rule matched, NNCF's rule named if it gives the very same codes too (on float32
    weights NNCF's rule is ONNX Runtime's gather rule but for its eps floor, and the matmul rule
    differs from both only at ties): said, so that an NNCF output is not taken for ONNX Runtime's."""
    if rtn.rule == "nncf" or not any(c.rule == "nncf" and exact(offsets, scales, zeros, c, covered) for c in candidates):
        return ""
    return f"NNCF's rule ({RULE_SOURCES['nncf']})"


def qdq_candidates(source: np.ndarray, g: Grouping, code_dtype: str) -> list[Rtn]:
    """ONNX Runtime's QDQ quantizer's codes of `source` (per tensor, or per channel: each channel
    by itself), by its own function (quant_utils.quantize_data; [] where onnxruntime's quantization
    package is not installed, or the codes are not 8 bits)."""
    if not (g.tensor or g.block == -1) or code_dtype not in ("int8", "uint8") or \
            source.dtype not in (np.float32, np.float16):  # (its QDQ quantizer takes float and float16 weights)
        return []
    try:
        from onnx import TensorProto
        from onnxruntime.quantization.quant_utils import quantize_data
    except ImportError:
        return []
    qtype = TensorProto.INT8 if code_dtype == "int8" else TensorProto.UINT8
    out = []
    slices = [source.reshape(-1)] if g.tensor else [np.take(source, c, axis=1 - g.axis) for c in
                                                  range(source.shape[1 - g.axis])]
    # (reduce_range: 7-bit codes, which quantize_dynamic/quantize_static take to keep ONNX Runtime's u8s8
    # integer MatMul on AVX2 without VNNI from saturating)
    for symmetric, reduced in ((True, False), (False, False), (True, True), (False, True)):
        parts = [quantize_data(s.reshape(-1), qtype, symmetric, reduce_range=reduced) for s in slices]
        if g.tensor:
            levels = _ints(parts[0][2]).reshape(source.shape)
        else:
            levels = np.stack([_ints(q).reshape(-1) for _, _, q in parts], axis=1 - g.axis)
        scales = grouped(np.array([np.asarray(s).reshape(()) for _, s, _ in parts], np.float32), g, source.shape)
        zeros = grouped(np.array([int(np.asarray(z)) for z, _, _ in parts], np.int64), g, source.shape)
        out.append(Rtn("qdq-reduced" if reduced else "qdq", symmetric, levels - _spread(zeros, g, source.shape), levels, scales, zeros))
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bool(np.array_equal(a.view(f"u{a.dtype.itemsize}"), b.view(f"u{b.dtype.itemsize}")))


def exact(offsets: np.ndarray, scales: np.ndarray, zeros: np.ndarray | None, rtn: Rtn, covered=None) -> bool:
    """Whether the quantized form is this RTN's: offsets equal (where `covered`: the codes the
    weight reads, not a last block's padding, which a quantizer fills as it likes), scales bit for
    bit, zero points equal (where the form stores them and RTN is asymmetric)."""
    mask = np.ones(offsets.shape, bool) if covered is None else covered
    if not (np.array_equal(offsets[mask], rtn.offsets[mask]) and same_bits(scales, rtn.scales)):
        return False
    return zeros is None or rtn.zeros is None or np.array_equal(_ints(zeros), rtn.zeros)


def swapped_pairs(codes: np.ndarray, axis: int | None) -> np.ndarray | None:
    """Each pair of neighbouring codes swapped along `axis` (None: in storage order)."""
    flat = codes.reshape(-1) if axis is None else np.moveaxis(codes, axis, -1)
    if flat.shape[-1] % 2:
        return None
    pairs = flat.reshape(*flat.shape[:-1], -1, 2)[..., ::-1].reshape(flat.shape)
    return pairs.reshape(codes.shape) if axis is None else np.moveaxis(pairs, -1, axis)


def block_permutation(codes, scales, zeros, rtn: Rtn, g: Grouping, covered) -> int | None:
    """The number of rows whose blocks (code offsets and scale together) are RTN's in another
    order; None when some block is no block of RTN's in its row, or every row is in order."""
    if g.block == -1 or codes.shape[g.axis] % g.block:
        return None
    lines = np.moveaxis(codes, g.axis, -1)
    n_blocks = lines.shape[-1] // g.block

    def blocks(offsets, sc):
        lv = np.moveaxis(offsets, g.axis, -1).reshape(-1, n_blocks, g.block)
        s = np.ascontiguousarray(np.moveaxis(np.asarray(sc), g.axis, -1).reshape(-1, n_blocks))
        return [[(lv[r, b].tobytes(), s[r, b].tobytes()) for b in range(n_blocks)] for r in range(lv.shape[0])]

    ours = blocks(np.where(covered, offsets_of(codes, zeros, g), 0), scales)
    theirs = blocks(np.where(covered, rtn.offsets, 0), rtn.scales)
    moved = 0
    for mine, want in zip(ours, theirs):
        if mine == want:
            continue
        if sorted(mine) != sorted(want):
            return None
        moved += 1
    return moved or None


def layout(codes, scales, zeros, rtn: Rtn, g: Grouping, covered) -> tuple[str, str] | None:
    """(kind, what was found) of the known wrong layout that, undone, gives `rtn` exactly (on the
    `covered` codes); or None."""
    codes_int, n_zeros = _ints(codes), zeros
    for axis, where in ((g.axis, "along the blocks"), (None, "in storage order")):
        if g.bits > 4:
            break
        swapped = swapped_pairs(codes_int, axis)
        if swapped is not None and exact(offsets_of(swapped, n_zeros, g), scales, n_zeros, rtn, covered):
            return "nibble-order", f"every pair of neighbouring codes swapped {where}"
    if zeros is not None and rtn.zeros is not None and same_bits(scales, rtn.scales):
        diff = _ints(zeros) - rtn.zeros
        off = np.unique(diff[diff != 0])
        if len(off) == 1 and abs(int(off[0])) == 1 and np.array_equal(codes_int[covered], rtn.levels[covered]):
            return "zero-point-off-by-one", (f"codes and scales exact; {int((diff != 0).sum())} of {diff.size} zero "
                                             f"points {int(off[0]):+d}")
    moved = block_permutation(codes, scales, zeros, rtn, g, covered)
    if moved:
        return "block-order", f"the blocks of {moved} row(s) in another order (codes, scales and zero points)"
    return None


def levels_off(values: np.ndarray, rtn_values: np.ndarray, rtn: Rtn, g: Grouping, covered) -> int:
    """The most levels of RTN's step by which the (covered) values differ from RTN's."""
    step = np.abs(_spread(np.asarray(rtn.scales, np.float64), g, values.shape))
    with np.errstate(all="ignore"):
        off = np.where(step > 0, np.abs(values.astype(np.float64) - rtn_values) / step, 0.0)[covered]
    off = off[np.isfinite(off)]
    return int(np.round(off.max())) if off.size else 0


def rtn_values(rtn: Rtn, g: Grouping, shape) -> np.ndarray:
    return rtn.offsets.astype(np.float32) * _spread(np.asarray(rtn.scales, np.float32), g, shape)
