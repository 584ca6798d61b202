"""GGUF's float tensors: F32, F16, BF16, each widened to float32 as gguf.quants does.

F32 is the tensor itself.  BF16 is Cast to float32, which is exact and keeps every bit (a
bfloat16's bits are a float32's top half; gguf shifts them so).  F16 is Cast to float32 too, exact
for every number; its NaNs need more (below): a signalling NaN widened by NumPy stays signalling,
ONNX Runtime's vectorised Cast quietens it, so the NaNs are written again from their own bits
(BitCast, ai.onnx opset 26).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto

from dyndq.checkpoints.gguf.registry import block_type
from dyndq.checkpoints.writer import Writer


@block_type("F32", block=1, size=4, composition="the float32 tensor itself")
def f32(w: Writer, blocks: np.ndarray) -> str:
    return w.op("Identity", [w.tensor(blocks.view(np.float32), "float32")], "float32_out")


@block_type("F16", block=1, size=2,
            composition="Cast(BitCast(uint16 bits) -> float16) to float32, each NaN put back with its own payload")
def f16(w: Writer, blocks: np.ndarray) -> str:
    # NumPy widens a signalling NaN keeping its quiet bit clear; ONNX Runtime's vectorised Cast (16
    # values and more) sets it.  So the NaNs are written again from their bits: sign << 31 | the
    # all-ones exponent | the 10-bit payload << 13, as NumPy's npy_halfbits_to_floatbits does.
    bits = w.tensor(blocks.view(np.uint16), "float16_bits")
    value = w.op("Cast", [w.op("BitCast", [bits], "float16", to=TensorProto.FLOAT16)], "float32_cast", to=TensorProto.FLOAT)
    wide = w.op("Cast", [bits], "bits_uint32", to=TensorProto.UINT32)
    fields = [w.op("BitShift", [w.op("BitwiseAnd", [wide, w.tensor(np.array(mask, np.uint32), f"{what}_mask")], what),
                                w.tensor(np.array(shift, np.uint32), f"{what}_shift")], f"{what}_placed", direction="LEFT")
              for what, mask, shift in (("sign", 0x8000, 16), ("payload", 0x3FF, 13))]
    nan_bits = w.op("BitwiseOr", [w.op("BitwiseOr", fields, "sign_payload"),
                                  w.tensor(np.array(0x7F800000, np.uint32), "nan_exponent")], "nan_bits")
    nan = w.op("BitCast", [nan_bits], "nan", to=TensorProto.FLOAT)
    w.needs_opset(26)  # (BitCast)
    return w.op("Where", [w.op("IsNaN", [value], "is_nan"), nan, value], "float32_out")


@block_type("BF16", block=1, size=2, composition="the bfloat16 tensor, Cast to float32 (exact: the bits shifted)")
def bf16(w: Writer, blocks: np.ndarray) -> str:
    return w.op("Cast", [w.tensor(blocks.view(ml_dtypes.bfloat16), "bfloat16")], "float32_out", to=TensorProto.FLOAT)
