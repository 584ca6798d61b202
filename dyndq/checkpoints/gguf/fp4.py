"""GGUF's 4-bit float types: MXFP4 (blocks of 32, an 8-bit exponent each) and NVFP4 (blocks of 64
in four sub-blocks of 16, an unsigned e4m3 scale each).

gguf.quants (after llama.cpp) doubles the e2m1 values into int8s, KVALUES, and halves the scale:
`d * k`, d = 2^(e - 128) for MXFP4 (ggml_e8m0_to_fp32_half: e = 255 is 2^127, not NaN) and d =
e4m3(x & 0x7F) / 2 for NVFP4 (its bit 7 ignored; x = 0 and 0x7F give 0; 0xFF gives 240).  Neither
is ONNX's float4e2m1 times float8e8m0 / float8e4m3fn (code 8 is +0 here, -0 there; e = 255 and
x = 0x7F are NaN there), so the nodes follow gguf: the scale byte looks its d up in a table of 256
float32s (Gather, exact: it copies bits; the table holds every d, each a power of two or a 4-bit
significand, computed exactly), the 4-bit index looks k up in KVALUES (Gather), and one
DynamicDequantize(int8 k, float32 d) multiplies: `float32(k) * d`, gguf's `d * k`, one rounding of
the same operands (exact but where 2^127 * k overflows to inf, as gguf's does).  The codes and
scales stay GGUF's bytes; the tables (1 kB each) are their only cost beyond them.
"""
from __future__ import annotations

import numpy as np

from dyndq.checkpoints.gguf.registry import block_type
from dyndq.checkpoints.writer import Writer, field

KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)
_BYTES = np.arange(256)
# d of each MXFP4 exponent byte: 2^(e - 128) (e = 0: 2^-128, a float32 subnormal)
E8M0_HALF = np.ldexp(np.float32(1), _BYTES - 128).astype(np.float32)
# d of each NVFP4 scale byte: its low 7 bits as unsigned e4m3 (bias 7; exponent 0: subnormal, m * 2^-9), halved
_EXP, _MAN = (_BYTES >> 3) & 0x0F, _BYTES & 0x07
UE4M3_HALF = np.where((_BYTES == 0) | (_BYTES == 0x7F), 0.0,
                      np.where(_EXP == 0, _MAN * 2.0 ** -9, (1 + _MAN / 8) * 2.0 ** (_EXP - 7)) * 0.5).astype(np.float32)


def table_product(w: Writer, scale_bytes: np.ndarray, table: np.ndarray, packed: np.ndarray, shape, group) -> str:
    """DynamicDequantize(KVALUES[index], table[scale byte]): the indices GGUF's nibble bytes
    `packed` hold (per group of k bytes: byte i is index i low, i + k high), in `shape`."""
    scales = w.lookup(table, w.tensor(scale_bytes, "scale_bytes"), "scales")
    return w.dequantize(w.indexed(KVALUES, packed, shape), scales, group_shape=group, hint="product")


@block_type("MXFP4", block=32, size=17, composition="DynamicDequantize(Gather(int8 table, 4-bit index), Gather(2^(e-128) table, e))")
def mxfp4(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    return table_product(w, field(blocks, 0, 1), E8M0_HALF, field(blocks, 1, 16), (rows, n, 32), (1, 1, 32))


@block_type("NVFP4", block=64, size=36,
            composition="DynamicDequantize(Gather(int8 table, 4-bit index), Gather(e4m3/2 table, scale byte)), sub-blocks of 16")
def nvfp4(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    scale_bytes = field(blocks, 0, 4)[..., None]  # [rows, n, 4, 1]
    return table_product(w, scale_bytes, UE4M3_HALF, field(blocks, 4, 32).reshape(rows, n, 4, 8), (rows, n, 4, 16),
                         (1, 1, 1, 16))
