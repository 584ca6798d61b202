"""The int32 packings of GPTQ, AWQ and compressed-tensors, undone in NumPy at import, and the one
composition they share.

All three pack b-bit codes densely into little-endian int32 words: code i of a run of codes at bit
i*b of the run's words taken as one bit string (32 codes in b words; for b = 2, 4, 8 that is code j
of each word at bits j*b; GPTQ's 3-bit codes cross word boundaries, as GPTQModel's and AutoGPTQ's
unpacking reads them).  `unpack` reads them so.  Codes of 2, 4 and 8 bits become ONNX uint2/uint4/
uint8 (or, with compressed-tensors' offset, int2/int4/int8) tensors in the weight's orientation,
torch's [out_features, in_features]: the same bits, rearranged (no inflation).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto

from dyndq.checkpoints.writer import Writer
from dyndq.opdefs import Problem, ValidationError

ONNX_CODES = {2: TensorProto.UINT2, 4: TensorProto.UINT4}  # (8 bits: uint8 itself)
SIGNED_CODES = {2: TensorProto.INT2, 4: TensorProto.INT4}  # (8 bits: int8)


def unpack(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` b-bit codes of `words` (int32 [..., n], packed densely along the last axis:
    code i at bit i*b of the words' bit string), uint8 [..., count]."""
    words = np.ascontiguousarray(words).astype("<u4", copy=False)
    pad = -words.shape[-1] % bits  # (whole runs of 32 codes in `bits` words)
    if pad:
        words = np.concatenate([words, np.zeros((*words.shape[:-1], pad), words.dtype)], axis=-1)
    runs = words.reshape(*words.shape[:-1], -1, bits)
    codes = np.empty((*runs.shape[:-1], 32), np.uint8)
    mask = np.uint32((1 << bits) - 1)
    for i in range(32):
        word, shift = divmod(i * bits, 32)
        value = runs[..., word] >> np.uint32(shift)
        if shift + bits > 32:  # (the code's high bits in the next word)
            value = value | (runs[..., word + 1] << np.uint32(32 - shift))
        codes[..., i] = value & mask
    return codes.reshape(*codes.shape[:-2], -1)[..., :count]


def codes_tensor(w: Writer, make, source: np.ndarray, bits: int, shape, *, signed: bool = False, hint: str = "quantized") -> str:
    """An initializer of the codes `make(rows of source)` gives, one a byte ([k, ...] for k rows of
    `source`), of `shape`: ONNX's 2/4/8-bit type (int with `signed`: the code's low bits its two's
    complement), packed a few rows at a time."""
    if bits == 8:
        codes = make(source)
        return w.tensor(codes.view(np.int8) if signed else codes, hint)
    return w.codes(make, source, (SIGNED_CODES if signed else ONNX_CODES)[bits], shape, hint)


def grouped(w: Writer, codes: str, scales: np.ndarray, zeros: str | None, in_features: int, g_idx: np.ndarray | None) -> str:
    """float(codes - zeros) * scales in the scales' dtype (one DynamicDequantize to float32, then
    one Cast to the scales' type), codes [out, in]; scales [out, groups] (with zeros, uint8/int of the same shape) apply to
    consecutive runs of in/groups inputs, or, given `g_idx` (int [in]: the group of each input),
    to input k by group g_idx[k]: Gather of their columns by g_idx, then one value per code."""
    out_type = out_type_of(w, scales.dtype)
    scale = w.tensor(np.ascontiguousarray(scales), "scales")
    group = (1, in_features // scales.shape[1])
    if g_idx is not None:
        index = w.tensor(np.ascontiguousarray(g_idx), "g_idx")
        scale = w.op("Gather", [scale, index], "scales_by_input", axis=1)
        if zeros is not None:
            zeros = w.op("Gather", [zeros, index], "zeros_by_input", axis=1)
        group = (1, 1)
    return to_type(w, w.dequantize(codes, scale, zeros, group_shape=group, hint="product"), out_type)


def to_type(w: Writer, product: str, out_type: int) -> str:
    """The float32 product rounded once to `out_type` by a Cast (not by the op's output_dtype: our
    kernel's float16 rounding gives a NaN's sign as +, where NumPy, torch and Cast keep it)."""
    return product if out_type == TensorProto.FLOAT else w.op("Cast", [product], "rounded", to=out_type)


def out_type_of(w: Writer, dtype) -> int:
    """The ONNX type of scales of NumPy `dtype` (the format's dequantization computes in it)."""
    types = {np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.float32): TensorProto.FLOAT,
             np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16}
    need(np.dtype(dtype) in types, f"{w.name}'s scales", f"of dtype {dtype}", "float16, bfloat16 or float32")
    return types[np.dtype(dtype)]


def need(condition: bool, where: str, found: str, expected: str) -> None:
    """A ValidationError naming the tensor (`where`), what was found and what was expected, unless `condition`."""
    if not condition:
        raise ValidationError([Problem(where, found, expected)])
