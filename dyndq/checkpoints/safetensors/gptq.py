"""GPTQ (AutoGPTQ's and GPTQModel's layout): `qweight` int32 [in*b/32, out] (codes packed along
the inputs), `qzeros` int32 [groups, out*b/32] (packed along the outputs), `scales` float16
[groups, out], `g_idx` int32 [in] (the group of each input row); b = 2, 3, 4 or 8.

The format's dequantization (GPTQModel's `dequantize_weight`, AutoGPTQ's torch kernels):
`scales[g_idx] * (q - z[g_idx])`, [in, out], in float16: the integer q - z (int8/int16 in torch)
promoted to float16 (exact: |q - z| <= 256), one float16 multiply (torch computes it in float32
and rounds once).  z is the stored field plus one, wrapped to b bits, in checkpoint_format "gptq"
(v1: AutoGPTQ stored z - 1 and reads `(field + 1) & maxq`), the stored field itself in "gptq_v2".

The nodes: one DynamicDequantize(q [out, in], float16 scales [out, groups], z [out, groups]),
output float16: `float16(float32(q - z) * float32(scale))`.  Why that is the same float16: q - z is
an integer of at most 9 bits, a float16 scale has 11 significant bits, so their product (at most
20 bits, never out of float32's range) is exact in float32, and its one rounding to float16 is
the correctly rounded product, which is what float16 multiplication gives (overflow to inf, the
subnormals and -0 included).  Without act-order (g_idx[k] = k // group_size) the scales apply to
runs of group_size inputs (per_group); with act-order (every group of group_size inputs, in any
order) the codes' input rows are reordered so that each group's are contiguous (a stable sort of
g_idx), decoded per_group as without it, and the product's columns put back in the inputs' order
by one Gather (copies: exact).  Why not gather the scales by g_idx: that Gather/Mul on constants is
what ONNX Runtime folds at load, to the float weight whole (9.7x a float model's session memory);
a DequantizeLinear it keeps, and a Gather of its output is no constant.  Groups of unequal sizes
(which GPTQ does not write) keep that form: the scale and zero columns gathered by g_idx.  The weight comes out in torch's
orientation, [out, in]: the codes are unpacked here and stored transposed as ONNX uint2/uint4/uint8
(the same bits); 3-bit codes, for which ONNX has no type, keep GPTQ's bytes (3 a run of 8 codes)
and are unpacked at run time (Cast, BitShift, BitwiseOr, BitwiseAnd on uint32: exact).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from dyndq.checkpoints.safetensors.files import Module
from dyndq.checkpoints.safetensors.packing import codes_tensor, grouped, need, unpack
from dyndq.checkpoints.writer import Writer

FORMATS = {"gptq": 1, "gptq_v2": 2}  # checkpoint_format -> the zero-point convention


def write(w: Writer, module: Module) -> tuple[str, tuple[int, int], str]:
    config, t = module.config, module.tensors
    where = f"GPTQ module {module.name!r}"
    bits = int(config.get("bits", 0))
    need(bits in (2, 3, 4, 8), where, f"bits {bits}", "2, 3, 4 or 8")
    checkpoint_format = str(config.get("checkpoint_format") or config.get("format") or "gptq").lower()
    need(checkpoint_format in FORMATS, where, f"checkpoint_format {checkpoint_format!r}", "gptq (v1) or gptq_v2")
    for suffix in ("qweight", "qzeros", "scales"):
        need(suffix in t, where, f"tensors {sorted(t)}", f"a {suffix} tensor")
    qweight, qzeros, scales = t["qweight"], t["qzeros"], t["scales"]
    need(qweight.ndim == 2 and qweight.dtype == np.int32, f"{module.name}.qweight", f"{qweight.dtype} {list(qweight.shape)}",
         "int32 [in*bits/32, out]")
    out = qweight.shape[1]
    g_idx = t.get("g_idx")
    n_in = len(g_idx) if g_idx is not None else qweight.shape[0] * 32 // bits
    groups = scales.shape[0] if scales.ndim == 2 else 0
    need(qweight.shape[0] * 32 == n_in * bits and n_in % 32 == 0, f"{module.name}.qweight", f"{qweight.shape[0]} rows",
         f"{n_in * bits // 32} ({n_in} inputs of {bits} bits, a multiple of 32)")
    need(scales.ndim == 2 and scales.shape[1] == out and groups > 0, f"{module.name}.scales", f"shape {list(scales.shape)}",
         f"[groups, {out}]")
    need(qzeros.shape == (groups, -(-out * bits // 32)) and qzeros.dtype == np.int32, f"{module.name}.qzeros",
         f"{qzeros.dtype} {list(qzeros.shape)}", f"int32 [{groups}, {-(-out * bits // 32)}]")
    zeros = unpack(qzeros, bits, out)
    if FORMATS[checkpoint_format] == 1:
        zeros = (zeros + np.uint8(1)) & np.uint8((1 << bits) - 1)
    if g_idx is not None:
        g_idx = np.asarray(g_idx)
        need(g_idx.ndim == 1 and np.issubdtype(g_idx.dtype, np.integer) and (g_idx >= 0).all() and (g_idx < groups).all(),
             f"{module.name}.g_idx", f"{g_idx.dtype} values from {g_idx.min()} to {g_idx.max()}", f"integers in [0, {groups})")
        if n_in % groups == 0 and (g_idx == np.arange(n_in) // (n_in // groups)).all():
            g_idx = None  # (no act-order: consecutive groups, per_group)
    else:
        need(n_in % groups == 0, f"{module.name}.scales", f"{groups} groups of {n_in} inputs", "a divisor of the inputs")
    order_note = f"groups of {n_in // groups}"
    rows = None  # (act-order in equal groups: the input rows in group order, a stable sort of g_idx)
    if g_idx is not None:
        counts = np.bincount(g_idx, minlength=groups)
        if n_in % groups == 0 and (counts == n_in // groups).all():
            rows = np.argsort(g_idx, kind="stable")
            order_note = (f"act-order: the input rows reordered into groups of {n_in // groups} (a stable sort of g_idx), "
                          "decoded per group, then put back by a Gather of the product by the inverse order")
        else:
            order_note = (f"act-order in groups of unequal sizes ({counts.min()} to {counts.max()} inputs): g_idx "
                          "gathers the scale and zero columns")
    gathered = g_idx is not None and rows is None  # (the scale and zero columns gathered by g_idx: one a code)
    if bits == 3:
        codes = three_bit_codes(w, qweight, out, n_in)
        if rows is not None:  # (the codes exist only at run time: reordered there, a Gather copies)
            codes = w.op("Gather", [codes, w.tensor(rows.astype(np.int32), "rows_by_group")], "codes_by_group", axis=1)
        zeros_value = w.tensor(np.ascontiguousarray(zeros.T), "zeros")
    else:
        take = (lambda some: unpack(some, bits, n_in)) if rows is None else (lambda some: unpack(some, bits, n_in)[..., rows])
        codes = codes_tensor(w, take, qweight.T, bits, (out, n_in))
        zeros_t = np.ascontiguousarray(zeros.T)
        zeros_value = (w.tensor(zeros_t, "zeros") if gathered  # (Gather: on uint8)
                       else codes_tensor(w, lambda some: some, zeros_t, bits, zeros_t.shape, hint="zeros"))
    value = grouped(w, codes, np.ascontiguousarray(scales.T), zeros_value, n_in, g_idx if gathered else None)
    if rows is not None:  # (input k is column inverse[k] of the reordered product: a Gather copies, exact)
        inverse = np.argsort(rows, kind="stable").astype(np.int32)  # (int32, as g_idx: half int64's bytes)
        value = w.op("Gather", [value, w.tensor(inverse, "rows_back")], "product_by_input", axis=1)
    form = (f"GPTQ {bits}-bit ({checkpoint_format}): DynamicDequantize({'uint8 q from GPTQ bytes' if bits == 3 else f'uint{bits} q'}, "
            f"float16 scales, z) to float16, {order_note}")
    return value, (out, n_in), form


def three_bit_codes(w: Writer, qweight: np.ndarray, out: int, n_in: int) -> str:
    """GPTQ's 3-bit codes, uint8 [out, in], from its bytes kept as they are (transposed to [out,
    in/8, 3]: each 3 bytes hold 8 codes, code j at bit 3j of b0 | b1 << 8 | b2 << 16), unpacked at run time."""
    stream = np.ascontiguousarray(qweight.T).astype("<i4", copy=False).view(np.uint8).reshape(out, n_in // 8, 3)
    wide = w.op("Cast", [w.tensor(stream, "bytes")], "bytes_uint32", to=TensorProto.UINT32)
    parts = [w.fresh(f"byte{i}") for i in range(3)]
    w.nodes.append(helper.make_node("Split", [wide], parts, name=w.fresh("Split"), axis=2, num_outputs=3))
    word = parts[0]
    for i in (1, 2):
        lifted = w.op("BitShift", [parts[i], w.tensor(np.array(8 * i, np.uint32), f"byte{i}_shift")], f"byte{i}_placed",
                      direction="LEFT")
        word = w.op("BitwiseOr", [word, lifted], f"word{i}")
    codes = w.unpack(word, np.arange(0, 24, 3), 7, "codes_wide", inner=True, dtype=np.uint32)  # [out, in/8, 1, 8]
    codes = w.op("Cast", [codes], "codes_uint8", to=TensorProto.UINT8)
    return w.reshape(codes, (out, n_in), "codes")
