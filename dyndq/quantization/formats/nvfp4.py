"""NVFP4: float4e2m1 codes in blocks of 16, float8e4m3fn block scales times a float32 tensor scale: "nvfp4".

The rule is fp4.py's (shared with MXFP4, float4.py).  Its nodes are two DynamicDequantize-3: the first
dequantizes the float8e4m3fn block scales with the float32 tensor scale g (per_tensor) into
float32 block scales, the second the float4 codes with those, writing the weight's dtype:

    W_block_scales, W_tensor_scale -> DynamicDequantize -> W_scales
    W_quantized, W_scales -> DynamicDequantize -> [Slice] -> W_dequantized
"""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from dyndq.quantization.formats.float4 import Float4Format
from dyndq.quantization.formats.registry import register


class Nvfp4(Float4Format):
    name = "nvfp4"
    summary = "float4e2m1 codes, float8e4m3fn scales per 16 times a float32 tensor scale"
    scales_words = "float8e4m3fn times a float32"

    def scale_inputs(self, name, q, scales, scale_array, names, tensors, nodes) -> None:
        from dyndq.build import make_node
        from dyndq.plumbing.types import elem_type

        block_scales = names.fresh(f"{name}_block_scales")
        tensor_scale = names.fresh(f"{name}_tensor_scale")
        tensors += [numpy_helper.from_array(scale_array, block_scales),
                    numpy_helper.from_array(np.array([q.tensor_scale], np.float32), tensor_scale)]
        nodes.append(make_node([block_scales, tensor_scale], [scales], name=names.fresh(f"{name}_scales_DynamicDequantize"),
                               version=3, qtype="per_tensor", output_dtype=elem_type("float32")))

    def dequantized_scales(self, q) -> np.ndarray:
        from dyndq.kernels.dynamic_dequantize import dynamic_dequantize
        from dyndq.plumbing.types import elem_type

        return dynamic_dequantize(q.scales, np.array([q.tensor_scale], np.float32), qtype="per_tensor",
                                  output_dtype=elem_type("float32"))


NVFP4 = register(Nvfp4())
