"""compressed-tensors (vLLM's llm-compressor): `pack-quantized` and `nvfp4-pack-quantized`.

pack-quantized: `weight_packed` int32 [out, in*b/32] (b = 2, 4, 8: code j of a word at bits j*b,
along the inputs), each code stored as q + 2^(b-1); `weight_scale` [out, groups] (channel: [out,
1]); asymmetric: `weight_zero_point` int32 [out*b/32, groups], packed along the outputs, stored
the same way; `weight_shape` [out, in].  compressed-tensors' own dequantization
(`PackedQuantizationCompressor.decompress`: `unpack_from_int32`, then `dequantize`) computes
`(float(q) - float(z)) * scale` in the scale's dtype.  The nodes: the codes as ONNX int2/int4/int8
(q's two's complement bits: the stored code xor 2^(b-1)), zero points likewise, and one
DynamicDequantize in the scale's dtype: `T(float32(q - z) * float32(scale))`.  Exact: q - z is an
integer of at most 9 bits, exact in float16 and bfloat16 as in float32, so their subtraction is
ours; the product with a scale of 11 (float16) or 8 (bfloat16) significant bits is exact in
float32, and its one rounding to T is T's multiply (a float32 scale: the same one float32 multiply).
Codes of 3, 5, 6 or 7 bits (packed across words, and differently by older releases) are refused.

nvfp4-pack-quantized: `weight_packed` uint8 [out, in/2] (two float4 e2m1 codes a byte, the first
low: ONNX's float4e2m1 packing, taken as it is), `weight_scale` float8e4m3fn [out, in/16],
`weight_global_scale` float32 [1].  compressed-tensors (`NVFP4PackedCompressor.decompress`)
unpacks the codes to bfloat16 (sign bit 3: code 8 is -0), the scales to bfloat16 (exact), then
`scale / global_scale` (a bfloat16 tensor over a float32 one: float32, one rounding), `code *
that` in float32 (exact widening, one rounding) and the result to bfloat16.  The nodes do the same
in the same order: Div(Cast(e4m3 scale to float32), global scale), then DynamicDequantize(float4e2m1
codes, that, output bfloat16): the same float32 product, rounded to bfloat16 once as torch does.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from dyndq.checkpoints.safetensors.files import Module
from dyndq.checkpoints.safetensors.packing import codes_tensor, grouped, need, to_type, unpack
from dyndq.checkpoints.writer import Writer


def weight_bits(module: Module, n_in: int, columns: int) -> int:
    """The code width: the checkpoint's (one config group) or the one its packed width fits."""
    groups = (module.config.get("config_groups") or {}).values()
    stated = {int(g["weights"]["num_bits"]) for g in groups if (g.get("weights") or {}).get("num_bits")}
    fits = [b for b in (2, 4, 8) if -(-n_in * b // 32) == columns]
    bits = next(iter(stated)) if len(stated) == 1 else (fits[0] if len(fits) == 1 else 0)
    need(bits in (2, 4, 8) and bits in fits, f"compressed-tensors module {module.name!r}",
         f"{columns} packed int32 columns for {n_in} inputs (num_bits {sorted(stated) or 'not stated'})", "codes of 2, 4 or 8 bits")
    return bits


def pack_quantized(w: Writer, module: Module) -> tuple[str, tuple[int, int], str]:
    t = module.tensors
    where = f"compressed-tensors module {module.name!r}"
    for suffix in ("weight_packed", "weight_scale", "weight_shape"):
        need(suffix in t, where, f"tensors {sorted(t)}", f"a {suffix} tensor")
    packed, scale = t["weight_packed"], np.asarray(t["weight_scale"])
    shape = tuple(int(n) for n in np.asarray(t["weight_shape"]).reshape(-1))
    need(len(shape) == 2 and packed.ndim == 2 and packed.dtype == np.int32 and packed.shape[0] == shape[0],
         f"{module.name}.weight_packed", f"{packed.dtype} {list(packed.shape)} for weight_shape {list(shape)}",
         "int32 [out, packed columns] of a 2-D weight")
    out, n_in = shape
    bits = weight_bits(module, n_in, packed.shape[1])
    offset = np.uint8(1 << (bits - 1))
    if scale.size == 1:  # (tensor strategy: one scale, repeated per output: 2 bytes a row)
        scale = np.full((out, 1), scale.reshape(()), scale.dtype)
    scale = scale.reshape(out, -1)
    groups = scale.shape[1]
    need(n_in % groups == 0, f"{module.name}.weight_scale", f"{groups} groups of {n_in} inputs", "a divisor of the inputs")
    codes = codes_tensor(w, lambda some: unpack(some, bits, n_in) ^ offset, packed, bits, (out, n_in), signed=True)
    zeros = None
    if "weight_zero_point" in t:
        zp = np.asarray(t["weight_zero_point"])
        if zp.dtype == np.int32 and zp.ndim == 2 and zp.shape == (-(-out * bits // 32), groups):
            z = np.ascontiguousarray(unpack(zp.T, bits, out).T) ^ offset  # packed along the outputs
        else:
            need(zp.dtype == np.int8 and zp.size in (1, out * groups), f"{module.name}.weight_zero_point",
                 f"{zp.dtype} {list(zp.shape)}", f"int32 [{-(-out * bits // 32)}, {groups}] (packed) or int8 [{out}, {groups}]")
            z = np.broadcast_to(zp.reshape(-1, 1) if zp.size == 1 else zp.reshape(out, groups), (out, groups)).view(np.uint8)
            z = np.ascontiguousarray(z) & np.uint8((1 << bits) - 1)
        zeros = codes_tensor(w, lambda some: some, z, bits, z.shape, signed=True, hint="zero_points")
    value = grouped(w, codes, scale, zeros, n_in, None)
    kind = "asymmetric" if zeros else "symmetric"
    return value, (out, n_in), (f"compressed-tensors pack-quantized int{bits} {kind}: DynamicDequantize(int{bits} q"
                                f"{', int%d z' % bits if zeros else ''}, {scale.dtype} scales) in {scale.dtype}, groups of {n_in // groups}")


def nvfp4(w: Writer, module: Module) -> tuple[str, tuple[int, int], str]:
    t = module.tensors
    where = f"compressed-tensors module {module.name!r}"
    for suffix in ("weight_packed", "weight_scale", "weight_global_scale"):
        need(suffix in t, where, f"tensors {sorted(t)}", f"a {suffix} tensor")
    packed, scale, global_scale = t["weight_packed"], t["weight_scale"], np.asarray(t["weight_global_scale"])
    need(packed.ndim == 2 and packed.dtype == np.uint8, f"{module.name}.weight_packed", f"{packed.dtype} {list(packed.shape)}",
         "uint8 [out, in/2]")
    out, n_in = packed.shape[0], packed.shape[1] * 2
    need(scale.ndim == 2 and scale.shape[0] == out and n_in % scale.shape[1] == 0 and scale.dtype.name == "float8_e4m3fn",
         f"{module.name}.weight_scale", f"{scale.dtype} {list(scale.shape)}", f"float8_e4m3fn [{out}, groups dividing {n_in}]")
    need(global_scale.dtype == np.float32 and global_scale.size == 1 and global_scale.ndim >= 1,
         f"{module.name}.weight_global_scale", f"{global_scale.dtype} {list(global_scale.shape)}",
         "float32 [1] (compressed-tensors' shape: a 0-dim one would make torch divide in bfloat16)")
    codes = w.fresh("quantized")
    w.tensors.append(helper.make_tensor(codes, TensorProto.FLOAT4E2M1, [out, n_in], np.ascontiguousarray(packed).tobytes(),
                                        raw=True))
    wide = w.op("Cast", [w.tensor(np.ascontiguousarray(scale), "scales")], "scales_float32", to=TensorProto.FLOAT)
    scales = w.op("Div", [wide, w.tensor(global_scale.reshape(1, 1), "global_scale")], "scales_over_global")
    value = to_type(w, w.dequantize(codes, scales, group_shape=(1, n_in // scale.shape[1]), hint="product"),
                    TensorProto.BFLOAT16)
    return value, (out, n_in), ("compressed-tensors nvfp4: DynamicDequantize(float4e2m1 q, Cast(e4m3 scale) / float32 "
                                f"global scale) to bfloat16, groups of {n_in // scale.shape[1]}")
