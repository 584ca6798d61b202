"""MXFP4 (OCP Microscaling v1.0): float4e2m1 codes in blocks of 32, each with a float8e8m0 scale: "mxfp4".

The rule is fp4.py's (shared with NVFP4); one DynamicDequantize-3 node writes the weight's
dtype itself (output_dtype: its scales are float8).
"""
from __future__ import annotations

from dyndq.quantization.formats.float4 import Float4Format
from dyndq.quantization.formats.registry import register


class Mxfp4(Float4Format):
    name = "mxfp4"
    summary = "float4e2m1 codes, float8e8m0 scales per 32"
    scales_words = "float8e8m0"


MXFP4 = register(Mxfp4())
