"""What MXFP4 and NVFP4 share (`Float4Format`): float4e2m1 codes by fp4.py's rule, one block
size each, a DynamicDequantize-3 that writes the weight's dtype itself (its scales are float8)."""
from __future__ import annotations

from dyndq.quantization import fp4
from dyndq.quantization.formats.registry import Format


class Float4Format(Format):
    bits = (4,)
    codes_words = "float4e2m1"
    writes_dtype = True

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.name:  # a registered format: its block is fp4.py's for its name, its one budget choice its name
            cls.block = fp4.BLOCK[cls.name]
            cls.choices = {cls.name: 4}

    def quantize(self, weight, target, options, bits: int):
        return fp4.quantize_fp4(weight, axis=target.axis, format=self.name)

    def form(self, q) -> str:
        return self.name
