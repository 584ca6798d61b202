"""ONNX Runtime's quantized contrib ops, foreign forms of DynamicDequantize: one module per op,
each registering its rules (a lift, and a write for export target "onnxruntime") on what
`shared` holds (`float_zero_points`: MatMulNBits' float zero points, ONNX Runtime's arithmetic
with them and the doubled form of half-integer ones).  Adding a foreign op is adding one module here and importing it below
(docs/house.md shows how); the order of the imports is the order a node is offered to the
writes."""
from . import shared
from . import matmul_nbits
from . import gather_block_quantized

__all__ = ["gather_block_quantized", "matmul_nbits", "shared"]
