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
bits.

The GEMV version (AutoAWQ's WQLinear_GEMV, `"version": "gemv"`): `qweight` int32 [out, in/8], the
codes packed along the inputs in plain order (nibble i of word c: input 8c + i), so ONNX's uint4
[out, in] holds the words' own bytes (unpacked and packed again a few rows at a time, as the other
formats' codes: streamed); `qzeros` int32 [out, zw] packed the same
way along the groups and `scales` float16 [out, 8 zw], both padded past in/group_size columns
(AutoAWQ's `calculate_zeros_width`: zw = ceil(groups / 8), rounded up to a multiple of 2 for groups
of 64, of 4 for groups of 32): the padding is not read, as the kernels do not read it.  The group
size is not in the shapes: the config's `group_size` (`q_group_size` in quant_config.json).  The
format's dequantization is its kernel's (AutoAWQ_kernels' and llm-awq's `gemv_forward_cuda`, the
path of up to 8 rows, the version's purpose): `float(scale) * (float(q) - float(z))` in float32,
not rounded to float16; the nodes: one DynamicDequantize(uint4 q, float16 scales, uint4 z) to
float32, the same product (exact in float32: |q - z| <= 15 by an 11-bit scale).  Its other kernel
(`gemmv2_forward_cuda`, more than 8 rows) rounds that product to float16 before its matrix product:
one Cast, not written (docs/import.md).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from dyndq.checkpoints.safetensors.files import Module, awq_version as version
from dyndq.checkpoints.safetensors.packing import codes_tensor, grouped, need, unpack
from dyndq.checkpoints.writer import Writer

ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])  # nibble i holds column order[i] of its 8
REVERSE = np.argsort(ORDER)  # column j is nibble REVERSE[j]: [0, 4, 1, 5, 2, 6, 3, 7]
SHIFTS = np.arange(0, 32, 4, dtype=np.uint32)


def columns(words: np.ndarray) -> np.ndarray:
    """AWQ's words (int32 [..., n]) as their 8n codes [..., 8n] uint8, in column order."""
    nibbles = (words.astype("<u4")[..., None] >> SHIFTS) & np.uint32(0xF)
    return nibbles[..., REVERSE].astype(np.uint8).reshape(*words.shape[:-1], -1)


def weight_shape(module: Module) -> tuple[int, int]:
    """[out, in] from the qweight's shape: [in, out/8] (GEMM) or [out, in/8] (GEMV)."""
    rows, words = module.tensors["qweight"].shape
    return (rows, words * 8) if version(module.config) == "gemv" else (words * 8, rows)


def write(w: Writer, module: Module) -> tuple[str, tuple[int, int], str]:
    config, t = module.config, module.tensors
    where = f"AWQ module {module.name!r}"
    bits = int(config.get("bits", config.get("w_bit", 4)))  # (w_bit: AutoAWQ's quant_config.json)
    need(bits == 4, where, f"bits {bits}", f"4 (AutoAWQ's {version(config).upper()} packing)")
    for suffix in ("qweight", "qzeros", "scales"):
        need(suffix in t, where, f"tensors {sorted(t)}", f"a {suffix} tensor")
    if version(config) == "gemv":
        return _gemv(w, module)
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


def _gemv(w: Writer, module: Module) -> tuple[str, tuple[int, int], str]:
    t, name = module.tensors, module.name
    qweight, qzeros, scales = t["qweight"], t["qzeros"], t["scales"]
    need(qweight.ndim == 2 and qweight.dtype == np.int32, f"{name}.qweight", f"{qweight.dtype} {list(qweight.shape)}",
         "int32 [out, in/8]")
    out, n_in = weight_shape(module)
    size = int(module.config.get("group_size", module.config.get("q_group_size", 0)))
    size = n_in if size == -1 else size  # (-1: one group a row, as AutoAWQ reads it)
    need(size > 0 and n_in % size == 0, f"AWQ module {name!r}", f"group size {size} for {n_in} inputs",
         "the config's group_size (q_group_size), a divisor of the inputs: GEMV's padded scales do not give it")
    groups = n_in // size
    need(qzeros.ndim == 2 and qzeros.dtype == np.int32 and qzeros.shape[0] == out and qzeros.shape[1] * 8 >= groups,
         f"{name}.qzeros", f"{qzeros.dtype} {list(qzeros.shape)}", f"int32 [{out}, at least {-(-groups // 8)}]")
    need(scales.ndim == 2 and scales.shape[0] == out and scales.shape[1] >= groups and scales.dtype == np.float16,
         f"{name}.scales", f"{scales.dtype} {list(scales.shape)}",
         f"float16 [{out}, at least {groups}] (groups of {size}, padded; the kernel reads half scales)")
    codes = codes_tensor(w, lambda some: unpack(some, 4, n_in), qweight, 4, (out, n_in))
    zeros = codes_tensor(w, lambda some: some, np.ascontiguousarray(unpack(qzeros, 4, groups)), 4, (out, groups), hint="zeros")
    scale = w.tensor(np.ascontiguousarray(scales[:, :groups]), "scales")  # (the padding columns left behind)
    value = w.dequantize(codes, scale, zeros, group_shape=(1, size), hint="product")
    return value, (out, n_in), (f"AWQ 4-bit GEMV: DynamicDequantize(uint4 q, float16 scales, uint4 z) to float32 "
                                f"(its kernel's float32 product), groups of {size}")
