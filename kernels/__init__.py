"""NumPy kernels, one module per op; no ONNX here. Importing a module attaches its kernel to the op handle."""
from . import dynamic_dequantize

__all__ = ["dynamic_dequantize"]
