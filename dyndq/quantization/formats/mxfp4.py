"""MXFP4 (OCP Microscaling v1.0): float4e2m1 codes in blocks of 32, each with a float8e8m0 scale: "mxfp4".

The rule is fp4.py's (shared with NVFP4); one DynamicDequantize-3 node writes the weight's
dtype itself (output_dtype: its scales are float8).
"""
from __future__ import annotations

from dyndq.quantization import fp4
from dyndq.quantization.formats.registry import Format, register


class Mxfp4(Format):
    name = "mxfp4"
    summary = "float4e2m1 codes, float8e8m0 scales per 32"
    bits = (4,)
    block = fp4.BLOCK["mxfp4"]
    codes_words = "float4e2m1"
    scales_words = "float8e8m0"
    choices = {"mxfp4": 4}
    writes_dtype = True

    def quantize(self, weight, target, options, bits: int):
        return fp4.quantize_fp4(weight, axis=target.axis, format=self.name)

    def form(self, q) -> str:
        return self.name


MXFP4 = register(Mxfp4())
