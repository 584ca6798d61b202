"""GGUF's ternary types, super-blocks of 256: TQ2_0 (2 bits a code) and TQ1_0 (5 codes a byte).

gguf.quants dequantizes `d * q`, d the float16 scale widened to float32 and q = code - 1 (a
trit: -1, 0, 1; TQ2_0's 2-bit field can also hold 3, giving 2).  The nodes: one
DynamicDequantize(code, float16 d, zero point 1), `float32(code - 1) * float32(d)`, the same
product as gguf's, exact (11 + 2 bits); the zero point is made at run time (ConstantOfShape).

- TQ2_0's codes are an ONNX uint2 tensor in element order (unpacked here from GGUF's byte order):
  64 bytes as GGUF's.
- TQ1_0 packs 5 trits a byte (48 bytes) and 4 more a byte (4 bytes) as a fixed-point base-3
  fraction: trit k of byte b is `((b * 3^k mod 256) * 3) >> 8`.  ONNX has no such type; the nodes
  keep GGUF's 52 bytes as they are and look each byte's trits up in a table of 256 x 5 (Gather,
  exact: it copies bytes) made by that very formula for every byte value.  The tables (2.3 kB a
  tensor) are its only cost beyond GGUF's bytes.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from dyndq.checkpoints.gguf.registry import block_type
from dyndq.checkpoints.writer import Writer, field, spread

POWERS = np.array([1, 3, 9, 27, 81], np.uint8)
# TRITS[b, k]: trit k (0, 1 or 2) of byte b, as gguf.quants' TQ1_0 and llama.cpp compute it (uint8 products wrap)
TRITS = ((np.arange(256, dtype=np.uint8)[:, None] * POWERS).astype(np.uint16) * 3 >> 8).astype(np.uint8)


def times_d(w: Writer, codes: str, blocks: np.ndarray, at: int) -> str:
    """float32(codes - 1) * float32(d), codes [rows, n_blocks, 256], d the float16 at byte `at`."""
    rows, n = blocks.shape[:2]
    zps = w.filled(np.uint8(1), (rows, n, 1), "zero_points")
    return w.dequantize(codes, w.half(blocks, at, "scales"), zps, group_shape=(1, 1, 256), hint="product")


@block_type("TQ2_0", block=256, size=66, composition="DynamicDequantize(uint2 q, float16 d, zero point 1)")
def tq2_0(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    codes = w.codes(lambda some: spread(field(some, 0, 64).reshape(*some.shape[:2], 2, 32), [0, 2, 4, 6], 3), blocks,
                    TensorProto.UINT2, (rows, n, 256))
    return times_d(w, codes, blocks, 64)


@block_type("TQ1_0", block=256, size=54, ratio=1.25,
            composition="DynamicDequantize(Gather(trit table, GGUF's base-3 bytes), float16 d, zero point 1)")
def tq1_0(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    parts = []
    # bytes 0..31 hold elements k*32 + i (trit k of byte i), 32..47 elements 160 + k*16 + i, 48..51 240 + k*4 + i
    for at, count, trits in ((0, 32, 5), (32, 16, 5), (48, 4, 4)):
        per_byte = w.lookup(TRITS[:, :trits], w.tensor(field(blocks, at, count), f"bytes_{at}"), f"trits_{at}")
        in_order = w.op("Transpose", [per_byte], f"trits_{at}_by_power", perm=[0, 1, 3, 2])
        parts.append(w.reshape(in_order, (rows, n, count * trits), f"codes_{at}"))
    return times_d(w, w.op("Concat", parts, "codes", axis=-1), blocks, 52)
