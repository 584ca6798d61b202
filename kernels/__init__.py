"""Kernels, one module per op (NumPy, with the optional compiled kernel _native.c driven by native.py); no ONNX here.
Importing a module attaches its kernel to the op handle."""
from . import dynamic_dequantize

__all__ = ["dynamic_dequantize"]
