"""GGUF's non-linear 4-bit types: IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256).

A 4-bit index picks one of 16 int8 values (KVALUES, llama.cpp's kvalues_iq4nl); gguf.quants
dequantizes `d * k` (IQ4_NL: d the block's float16) and `dl * k` with `dl = d * sc` (IQ4_XS: sc
the 6-bit sub-block scale minus 32, per 32), in float32.  The nodes: Gather from the table (exact:
it copies int8 values), then DynamicDequantize(int8 k, d) or, for IQ4_XS, DynamicDequantize(int8
k, DynamicDequantize(int8 sc, float16 d)).  Exact for the reasons the K-quants' are (kquants.py):
`float32(sc) * float32(d)` is exact (11 + 6 bits) and is gguf's `d * sc`; `float32(k) * dl` is
gguf's `dl * k`, one rounding of the same operands.  The indices stay GGUF's nibble bytes
(unpacked at run time by BitShift and BitwiseAnd: Gather takes no 4-bit indices).
"""
from __future__ import annotations

import numpy as np

from dyndq.checkpoints.gguf.registry import block_type
from dyndq.checkpoints.writer import Writer, field, spread, sub_block_scales

KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)


@block_type("IQ4_NL", block=32, size=18, composition="DynamicDequantize(Gather(int8 table, 4-bit index), float16 d)")
def iq4_nl(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    values = w.indexed(KVALUES, field(blocks, 2, 16), (rows, n, 32))
    return w.dequantize(values, w.half(blocks, 0, "scales"), group_shape=(1, 1, 32), hint="product")


@block_type("IQ4_XS", block=256, size=136, composition="""DynamicDequantize(Gather(int8 table, 4-bit index),
            DynamicDequantize(int8 sc, float16 d)), sub-blocks of 32""")
def iq4_xs(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    low = spread(field(blocks, 4, 4)[..., None], [0, 4], 0x0F).reshape(rows, n, 8)  # sub-block 2i + h: nibble h of byte i
    high = field(blocks, 2, 2).view(np.uint16) >> np.arange(0, 16, 2, dtype=np.uint16)  # 2 bits each, from bit 0
    scales = ((low | ((high.astype(np.uint8) & 0x03) << 4)).astype(np.int8) - 32)[..., None]
    dl = sub_block_scales(w, scales, blocks, 0, "sub_scales")
    values = w.indexed(KVALUES, field(blocks, 8, 128).reshape(rows, n, 8, 16), (rows, n, 8, 32))
    return w.dequantize(values, dl, group_shape=(1, 1, 1, 32), hint="product")
