"""GGUF's legacy blocks of 32: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Each block is a float16 scale d (Q4_1 and Q5_1: and a float16 min m) and 32 codes.  gguf.quants
dequantizes `d * q` (Q4_0, Q5_0: q the code minus 8 or 16; Q8_0 `x * d`, x the int8 code) and
`(d * q) + m` (Q4_1, Q5_1: q the code as it is), each d and m widened to float32 first.  Why the
nodes give the same float32 bits:

- the product is one DynamicDequantize-3 (float16 scales, output float32): `float32(q - zp) *
  float32(d)`, the same two float32 operands as gguf's and one rounding (the product of a float16
  and a code of at most 8 bits needs at most 19 of float32's 24 bits, so it is exact anyway);
  multiplication commutes bit for bit in IEEE arithmetic, NaN included (one NaN operand: its
  payload, quietened; inf * 0: the default NaN);
- the min is added after, by one float32 Add of the same two operands in the same order
  (`product + m`), m widened by Cast float16 -> float32, which is exact;
- 4- and 8-bit codes are ONNX int4/uint4/int8 tensors in element order (repacked from GGUF's
  halves: byte i holds elements i and i + 16); 5-bit codes, for which ONNX has no type, are kept
  as GGUF's own bytes (the 4 high-bit bytes and 16 nibble bytes) and put together at run time by
  BitShift, BitwiseAnd and BitwiseOr on uint8, which are exact; their zero point 16 is made at run
  time (ConstantOfShape), so it weighs nothing in the file.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from dyndq.checkpoints.gguf.registry import block_type
from dyndq.checkpoints.writer import Writer, field, nibbles

GROUP = (1, 1, 32)  # a block's codes share its scale: [rows, n_blocks, 32] over [rows, n_blocks, 1]


@block_type("Q4_0", block=32, size=18, composition="DynamicDequantize(int4 q - 8, float16 d)")
def q4_0(w: Writer, blocks: np.ndarray) -> str:
    codes = w.codes(lambda some: nibbles(field(some, 2, 16)) ^ np.uint8(8), blocks, TensorProto.INT4, (*blocks.shape[:2], 32))
    # (q ^ 8, in 4 bits, is q - 8 as a two's complement nibble)
    return w.dequantize(codes, w.half(blocks, 0, "scales"), group_shape=GROUP, hint="product")


@block_type("Q4_1", block=32, size=20, composition="DynamicDequantize(uint4 q, float16 d) + Cast(float16 m)")
def q4_1(w: Writer, blocks: np.ndarray) -> str:
    codes = w.codes(lambda some: nibbles(field(some, 4, 16)), blocks, TensorProto.UINT4, (*blocks.shape[:2], 32))
    product = w.dequantize(codes, w.half(blocks, 0, "scales"), group_shape=GROUP, hint="product")
    return plus_min(w, product, blocks, 2)


@block_type("Q5_0", block=32, size=22,
            composition="DynamicDequantize(uint8 q from GGUF's nibble and high-bit bytes, float16 d, zero point 16)")
def q5_0(w: Writer, blocks: np.ndarray) -> str:
    codes, zps = five_bits(w, blocks, high_at=2, low_at=6, zero_point=16)
    return w.dequantize(codes, w.half(blocks, 0, "scales"), zps, group_shape=GROUP, hint="product")


@block_type("Q5_1", block=32, size=24,
            composition="DynamicDequantize(uint8 q from GGUF's nibble and high-bit bytes, float16 d) + Cast(float16 m)")
def q5_1(w: Writer, blocks: np.ndarray) -> str:
    codes, _ = five_bits(w, blocks, high_at=4, low_at=8)
    product = w.dequantize(codes, w.half(blocks, 0, "scales"), group_shape=GROUP, hint="product")
    return plus_min(w, product, blocks, 2)


@block_type("Q8_0", block=32, size=34, composition="DynamicDequantize(int8 x, float16 d)")
def q8_0(w: Writer, blocks: np.ndarray) -> str:
    codes = field(blocks, 2, 32).view(np.int8)
    return w.dequantize(w.tensor(codes, "quantized"), w.half(blocks, 0, "scales"), group_shape=GROUP, hint="product")


def plus_min(w: Writer, product: str, blocks: np.ndarray, at: int) -> str:
    """`product + float32(m)`, m the float16 min at byte `at` of each block (gguf's order)."""
    m = w.op("Cast", [w.half(blocks, at, "mins")], "mins_float32", to=TensorProto.FLOAT)
    return w.op("Add", [product, m], "with_min")


def five_bits(w: Writer, blocks: np.ndarray, *, high_at: int, low_at: int, zero_point: int | None = None):
    """The 5-bit codes of a block of 32, uint8 [rows, n_blocks, 32], from GGUF's bytes kept as they
    are: 16 nibble bytes (byte i: element i low, i + 16 high) and a 32-bit word of high bits (bit j:
    element j); and the zero point (uint8, made at run time) when one is given."""
    rows, n_blocks = blocks.shape[:2]
    flat = (rows, n_blocks, 32)
    low = w.fields(field(blocks, low_at, 16), [0, 4], 0x0F, flat, "low")
    high = w.fields(field(blocks, high_at, 4), range(8), 1, flat, "high", inner=True)  # (bit j of byte i: element 8i + j)
    codes = w.join(low, high, 4, "codes")
    zps = None if zero_point is None else w.filled(np.uint8(zero_point), (rows, n_blocks, 1), "zero_points")
    return codes, zps
