"""Lowering to standard ONNX (and lifting from it), one module per op.

Importing this package attaches each op's lowering, its needs and its lifting
to the op's handle in `opdefs`.  `lowering_context` is what every lowering gets;
`onnx_types` converts between ONNX's protos and our specs and attribute kinds.
"""
from . import dynamic_dequantize, lowering_context, onnx_types

__all__ = ["dynamic_dequantize", "lowering_context", "onnx_types"]
