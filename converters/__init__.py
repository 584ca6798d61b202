"""Lowering to standard ONNX (and lifting from it), one module per op."""
