"""GGUF's K-quants, super-blocks of 256: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

A super-block holds a float16 scale d (Q2_K, Q4_K, Q5_K: and a float16 dmin), small integer
sub-block scales (and mins) and the codes.  gguf.quants dequantizes, all in float32:

    Q2_K, Q4_K, Q5_K:  dl = d * sc;  ml = dmin * m;  dl * q - ml      (sub-blocks of 16, 32, 32)
    Q3_K, Q6_K:        dl = d * sc;  dl * q                           (sc signed; q signed)

The nodes: a nested DynamicDequantize makes dl from the sub-block scales (kept as small integers,
uint4/uint8/int8, with their float16 d: nothing per sub-block in float32), a second one multiplies
the codes by it, and one Sub takes the mins off.  Why that is exactly gguf's float32:

- `dl = float32(sc) * float32(d)`: the same product as gguf's `d * sc`, and exact (a float16 has
  11 significant bits, a 6-bit or 8-bit scale at most 8: 19 of float32's 24; nor can it overflow
  or leave float32's range: |d| <= 65504, 2^-24 <= |d| where not 0); the same for `dmin * m`;
- `float32(q - zp) * dl` is gguf's `dl * q`, one rounding of the same two float32 operands (exact
  for Q2_K, Q3_K, Q4_K, Q5_K: 19 + 5 bits at most; Q6_K's 8-bit scales and 6-bit codes can round,
  and do so identically, the operands being the same); multiplication commutes bit for bit;
- the Sub is gguf's `dl * q - ml`, same operands, same order, one rounding.

Where gguf's codes are signed (Q3_K's `ql - 4 * (1 - h)`, Q6_K's `q - 32`) the node takes the
unsigned code with a zero point (4, 32) made at run time (ConstantOfShape), so it costs no bytes.
2- and 4-bit codes are ONNX uint2/uint4 tensors in element order (unpacked here from GGUF's byte
order); 3-, 5- and 6-bit codes, which ONNX has no type for, are GGUF's own code bytes, put together
at run time by BitShift, BitwiseAnd and BitwiseOr on uint8 (exact).  The sub-block scales are
unpacked here from GGUF's 6-bit packing into one byte each (12 bytes -> 16: under 3% of a
super-block).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto

from dyndq.checkpoints.gguf.registry import block_type
from dyndq.checkpoints.writer import Writer, field, spread, sub_block_scales


def times_codes(w: Writer, codes: str, dl: str, sub_block: int, zps: str | None = None) -> str:
    """float32(codes - zps) * dl, codes [rows, n_blocks, k, sub_block] over dl [rows, n_blocks, k, 1]."""
    return w.dequantize(codes, dl, zps, group_shape=(1, 1, 1, sub_block), hint="product")


def minus_mins(w: Writer, product: str, mins: np.ndarray, blocks: np.ndarray, at: int) -> str:
    """product - dmin * m, gguf's `dl * q - ml`."""
    return w.op("Sub", [product, sub_block_scales(w, mins, blocks, at, "mins")], "minus_mins")


def scale_min_k4(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's and Q5_K's eight 6-bit scales and mins from their 12 bytes (gguf's get_scale_min),
    uint8 [rows, n_blocks, 8, 1] each."""
    d, m, m_d = (packed[..., i:i + 4] for i in (0, 4, 8))
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc[..., None], mn[..., None]


@block_type("Q2_K", block=256, size=84, composition="""DynamicDequantize(uint2 q, DynamicDequantize(uint4 sc, float16 d))
            - DynamicDequantize(uint4 m, float16 dmin), sub-blocks of 16""")
def q2_k(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    packed = field(blocks, 0, 16)[..., None]
    codes = w.codes(lambda some: spread(field(some, 16, 64).reshape(*some.shape[:2], 2, 32), [0, 2, 4, 6], 3), blocks,
                    TensorProto.UINT2, (rows, n, 16, 16))
    dl = sub_block_scales(w, (packed & 0x0F).astype(ml_dtypes.uint4), blocks, 80, "sub_scales")
    product = times_codes(w, codes, dl, 16)
    return minus_mins(w, product, (packed >> 4).astype(ml_dtypes.uint4), blocks, 82)


@block_type("Q3_K", block=256, size=110, composition="""DynamicDequantize(uint8 q from GGUF's 2-bit and high-bit bytes,
            DynamicDequantize(int8 sc, float16 d), zero point 4), sub-blocks of 16""")
def q3_k(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    low, high = field(blocks, 96, 8), field(blocks, 104, 4)  # the 16 6-bit scales: low nibbles, then high pairs
    low = spread(low, [0, 4], 0x0F).reshape(rows, n, 16)
    high = spread(high, [0, 2, 4, 6], 0x03).reshape(rows, n, 16)
    scales = ((low | (high << 4)).astype(np.int8) - 32)[..., None]
    dl = sub_block_scales(w, scales, blocks, 108, "sub_scales")
    shape = (rows, n, 16, 16)
    ql = w.fields(field(blocks, 32, 64).reshape(rows, n, 2, 32), [0, 2, 4, 6], 3, shape, "low")
    qh = w.fields(field(blocks, 0, 32), range(8), 1, shape, "high")
    zps = w.filled(np.uint8(4), (rows, n, 16, 1), "zero_points")  # q = ql - 4 * (1 - h) = (ql | h << 2) - 4
    return times_codes(w, w.join(ql, qh, 2, "codes"), dl, 16, zps)


@block_type("Q4_K", block=256, size=144, composition="""DynamicDequantize(uint4 q, DynamicDequantize(uint8 sc, float16 d))
            - DynamicDequantize(uint8 m, float16 dmin), sub-blocks of 32""")
def q4_k(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    sc, mn = scale_min_k4(field(blocks, 4, 12))
    codes = w.codes(lambda some: spread(field(some, 16, 128).reshape(*some.shape[:2], 4, 32), [0, 4], 0x0F), blocks,
                    TensorProto.UINT4, (rows, n, 8, 32))
    product = times_codes(w, codes, sub_block_scales(w, sc, blocks, 0, "sub_scales"), 32)
    return minus_mins(w, product, mn, blocks, 2)


@block_type("Q5_K", block=256, size=176, composition="""DynamicDequantize(uint8 q from GGUF's nibble and high-bit bytes,
            DynamicDequantize(uint8 sc, float16 d)) - DynamicDequantize(uint8 m, float16 dmin), sub-blocks of 32""")
def q5_k(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    sc, mn = scale_min_k4(field(blocks, 4, 12))
    shape = (rows, n, 8, 32)
    ql = w.fields(field(blocks, 48, 128).reshape(rows, n, 4, 32), [0, 4], 0x0F, shape, "low")
    qh = w.fields(field(blocks, 16, 32), range(8), 1, shape, "high")
    product = times_codes(w, w.join(ql, qh, 4, "codes"), sub_block_scales(w, sc, blocks, 0, "sub_scales"), 32)
    return minus_mins(w, product, mn, blocks, 2)


@block_type("Q6_K", block=256, size=210, composition="""DynamicDequantize(uint8 q from GGUF's nibble and 2-bit bytes,
            DynamicDequantize(int8 sc, float16 d), zero point 32), sub-blocks of 16""")
def q6_k(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    shape = (rows, n, 16, 16)
    ql = w.fields(field(blocks, 0, 128).reshape(rows, n, 2, 64), [0, 4], 0x0F, shape, "low")
    qh = w.fields(field(blocks, 128, 64).reshape(rows, n, 2, 32), [0, 2, 4, 6], 3, shape, "high")
    dl = sub_block_scales(w, field(blocks, 192, 16).view(np.int8)[..., None], blocks, 208, "sub_scales")
    zps = w.filled(np.uint8(32), (rows, n, 16, 1), "zero_points")
    return times_codes(w, w.join(ql, qh, 4, "codes"), dl, 16, zps)
