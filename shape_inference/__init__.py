"""One pure function per op version: input specs + attributes -> output spec, or ValidationError.

Importing this package attaches each function to its op handle in `opdefs`.
"""
from . import dynamic_dequantize

__all__ = ["dynamic_dequantize"]
