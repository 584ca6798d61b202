"""Lowering to standard ONNX (and lifting from it), one module per op.

Importing this package attaches each op's lowering, its needs and its lifting
to the op's handle in `opdefs`.  `lowering_context` is what every lowering gets;

ONNX Runtime's quantized contrib ops are foreign forms of DynamicDequantize: one
module each (`matmul_nbits`, `gather_block_quantized`) holds their lifting and
their lowering, on what `foreign` shares.  `FOREIGN` maps each one's (domain, op
type) to its module; `TARGETS` says which foreign lowerings an export target uses.
"""
from . import dynamic_dequantize, foreign, gather_block_quantized, lowering_context, matmul_nbits

FOREIGN = {m.SOURCE: m for m in (matmul_nbits, gather_block_quantized)}
TARGETS = {"onnx": (), "onnxruntime": (matmul_nbits, gather_block_quantized)}

__all__ = ["FOREIGN", "TARGETS", "dynamic_dequantize", "foreign", "gather_block_quantized", "lowering_context",
           "matmul_nbits"]
