"""AWQ, GEMM version (AutoAWQ's layout): `qweight` int32 [in, out/8], `qzeros` int32 [groups,
out/8], `scales` float16 [groups, out]; 4-bit codes, 8 to a word along the outputs in the order
[0, 2, 4, 6, 1, 3, 5, 7] (nibble i holds output column 8c + order[i]).

The format's dequantization (AutoAWQ's and GPTQModel's `dequantize_gemm`): unpack, undo the
order, `(q - z) * scales` per group of group_size inputs, [in, out], in float16 (the integer
difference promoted to float16, exact; one float16 multiply).  The nodes: one
DynamicDequantize(uint4 q [out, in], float16 scales [out, groups], uint4 z [out, groups]), output
float16, exact for GPTQ's reason (gptq.py): |q - z| <= 15 and an 11-bit scale make a product
exact in float32, whose one rounding to float16 is float16's multiply.  The codes are unpacked
here, reordered and stored transposed ([out, in], torch's orientation) as ONNX uint4: the same
bits.  The GEMV version (codes packed along the inputs) is not taken yet.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from dyndq.checkpoints.safetensors.files import Module
from dyndq.checkpoints.safetensors.packing import grouped, need
from dyndq.checkpoints.writer import Writer

ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # nibble i holds column order[i] of its 8
REVERSE = np.argsort(ORDER)  # column j is nibble REVERSE[j]: [0, 4, 1, 5, 2, 6, 3, 7]
SHIFTS = np.arange(0, 32, 4, dtype=np.uint32)


def columns(words: np.ndarray) -> np.ndarray:
    """AWQ's words (int32 [..., n]) as their 8n codes [..., 8n] uint8, in column order."""
    nibbles = (words.astype("<u4")[..., None] >> SHIFTS) & np.uint32(0xF)
    return nibbles[..., REVERSE].astype(np.uint8).reshape(*words.shape[:-1], -1)


def write(w: Writer, module: Module) -> tuple[str, tuple[int, int], str]:
    config, t = module.config, module.tensors
    where = f"AWQ module {module.name!r}"
    bits = int(config.get("bits", config.get("w_bit", 4)))  # (w_bit: AutoAWQ's quant_config.json)
    need(bits == 4, where, f"bits {bits}", "4 (AutoAWQ's GEMM packing)")
    for suffix in ("qweight", "qzeros", "scales"):
        need(suffix in t, where, f"tensors {sorted(t)}", f"a {suffix} tensor")
    qweight, qzeros, scales = t["qweight"], t["qzeros"], t["scales"]
    need(qweight.ndim == 2 and qweight.dtype == np.int32, f"{module.name}.qweight", f"{qweight.dtype} {list(qweight.shape)}",
         "int32 [in, out/8]")
    n_in, out = qweight.shape[0], qweight.shape[1] * 8
    need(scales.ndim == 2 and scales.shape[1] == out and n_in % scales.shape[0] == 0, f"{module.name}.scales",
         f"shape {list(scales.shape)}", f"[groups dividing {n_in}, {out}]")
    need(qzeros.shape == (scales.shape[0], out // 8) and qzeros.dtype == np.int32, f"{module.name}.qzeros",
         f"{qzeros.dtype} {list(qzeros.shape)}", f"int32 [{scales.shape[0]}, {out // 8}]")

    def rows(some: np.ndarray) -> np.ndarray:  # k word-columns of qweight.T [k, in] -> the codes of 8k outputs [8k, in]
        return columns(some.T).T

    codes = w.codes(rows, qweight.T, TensorProto.UINT4, (out, n_in))
    zeros_t = np.ascontiguousarray(columns(qzeros).T)
    zeros = w.codes(lambda some: some, zeros_t, TensorProto.UINT4, zeros_t.shape, "zeros")
    value = grouped(w, codes, np.ascontiguousarray(scales.T), zeros, n_in, None)
    return value, (out, n_in), (f"AWQ 4-bit GEMM: DynamicDequantize(uint4 q, float16 scales, uint4 z) to float16, "
                                f"groups of {n_in // scales.shape[0]}")
