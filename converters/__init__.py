"""Lowering to standard ONNX (and lifting from it), one module per op.

Importing this package attaches each converter to its op handle in `opdefs`.
"""
from . import dynamic_dequantize

__all__ = ["dynamic_dequantize"]
