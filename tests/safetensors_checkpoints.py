"""Safetensors checkpoints for the tests of dyndq.checkpoints.safetensors, their formats' own
dequantizations, and the one check of the nodes.

GPTQModel and AutoAWQ do not install here as usable packages (tried with pip: gptqmodel 7.7
needs torch >= 2.14.1, where the torch extra pins 2.13.0, and some twenty packages besides;
autoawq 0.2.9, archived by its authors, needs triton, accelerate and datasets), so their
dequantization is written below from their published code (GPTQModel 7.7's
`PackableQuantLinear.dequantize_weight` and `_dequantize_from_codes`, AutoGPTQ's `zeros + 1` of
v1, AutoAWQ/GPTQModel's `dequantize_gemm`), torch ops as NumPy ops in the same order and dtype.
(Checked once by hand, not here: those libraries' own functions, run with torch from their
sources, give these bits for every case the tests draw, NaNs included.)  The arithmetic:
`scales[g_idx] * (weight - zeros[g_idx])`, the integer difference promoted to float16 (torch's
promotion; NumPy's would be float64, so it is cast explicitly) and one float16 multiply.  The
packers put code i at bit i*b of each run's bit string, built bit by bit (not by the code under
test's shifts).  compressed-tensors' own functions are the oracle of its formats (test_compressed_tensors.py, torch).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq.checkpoints import safetensors as ours
from engines import run_onnxruntime

SPECIAL_HALVES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                           0x7E00, 0xFE00, 0x3C00, 0xBC00, 0x0200], np.uint16)
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


# the float model the import's and verify's safetensors tests put checkpoints onto: torch's module names
UP, Q, O = "model.layers.0.mlp.up_proj", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.o_proj"
N_IN, OUT, GROUP = 256, 64, 64


def float_model() -> onnx.ModelProto:
    """x [2, N_IN] -> Gemm(transB) with UP's weight [OUT, N_IN]; Transpose+MatMul with Q's (torch's
    export); O's weight [OUT, OUT] on a Gemm too (left float where the checkpoint has no module of
    it); float32 weights (a float16 one would be cast)."""
    rng = np.random.default_rng(1)
    w = lambda *s: (rng.standard_normal(s) * 0.05).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(w(OUT, N_IN), f"{UP}.weight"), numpy_helper.from_array(w(OUT, N_IN), f"{Q}.weight"),
             numpy_helper.from_array(w(OUT, OUT), f"{O}.weight")]
    nodes = [helper.make_node("Gemm", ["x", f"{UP}.weight"], ["up"], transB=1),
             helper.make_node("Transpose", [f"{Q}.weight"], ["qT"], perm=[1, 0]), helper.make_node("MatMul", ["x", "qT"], ["q"]),
             helper.make_node("Gemm", ["q", f"{O}.weight"], ["o"], transB=1)]
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, N_IN])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, OUT]) for n in ("up", "q", "o")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def pack_bits(codes: np.ndarray, bits: int) -> np.ndarray:
    """int32 words holding `codes` (uint [..., n]) densely along the last axis: code i at bit i*b of the bit string."""
    n = codes.shape[-1]
    stream = ((codes[..., :, None].astype(np.uint64) >> np.arange(bits, dtype=np.uint64)) & 1).reshape(*codes.shape[:-1], n * bits)
    pad = -stream.shape[-1] % 32
    stream = np.concatenate([stream, np.zeros((*stream.shape[:-1], pad), stream.dtype)], axis=-1)
    words = (stream.reshape(*stream.shape[:-1], -1, 32) << np.arange(32, dtype=np.uint64)).sum(-1)
    return words.astype(np.uint32).view(np.int32)


def scales_with_extremes(shape, rng) -> np.ndarray:
    """float16 scales: random normal ones, the first ones the float16 extremes (±0, subnormals, the
    largest, ±inf, NaNs), so that every kind of float16 product is reached."""
    s = (rng.standard_normal(shape) * 0.01).astype(np.float16)
    flat = s.reshape(-1)
    k = min(len(SPECIAL_HALVES), flat.size)
    flat[:k] = SPECIAL_HALVES[:k].view(np.float16)
    return s


def gptq_tensors(n_in, out, bits, group_size, *, act_order=False, v1=True, seed=0):
    """A GPTQ module's tensors (every code and zero value reached) and its codes, zeros [groups, out] and g_idx."""
    rng = np.random.default_rng(seed)
    groups = n_in // group_size
    q = rng.integers(0, 1 << bits, (n_in, out), dtype=np.uint8)
    # (v1 cannot hold a zero point of 0: AutoGPTQ's packer ORs its -1 over the fields above it, and
    # GPTQModel's reader adds 1 to the packed word with a carry, where AutoGPTQ's wraps each field)
    z = rng.integers(1 if v1 else 0, 1 << bits, (groups, out), dtype=np.uint8)
    g_idx = rng.permutation(np.arange(n_in) // group_size).astype(np.int32) if act_order else (np.arange(n_in) // group_size).astype(np.int32)
    stored = (z - 1) & ((1 << bits) - 1) if v1 else z
    return {"qweight": pack_bits(q.T, bits).T.copy(), "qzeros": pack_bits(stored, bits),
            "scales": scales_with_extremes((groups, out), rng), "g_idx": g_idx}


def gptq_oracle(t, bits, v1=True) -> np.ndarray:
    """GPTQModel's dequantize_weight (AutoGPTQ's v1 `(zeros + 1) & maxq`), [in, out] float16, transposed to [out, in]."""
    qweight, qzeros, scales, g_idx = t["qweight"], t["qzeros"], t["scales"], t["g_idx"].astype(np.int64)
    maxq = (1 << bits) - 1
    if bits in (2, 4, 8):
        wf = np.arange(0, 32, bits, dtype=np.int32)
        zeros = (np.right_shift(qzeros[:, :, None], wf[None, None, :]) & maxq).reshape(qzeros.shape[0], -1)[:, :scales.shape[1]]
        weight = np.right_shift(qweight[:, None, :], wf[None, :, None]) & maxq
    else:  # GPTQModel's 3-bit unpacking, its wf table and its fix-ups of the codes crossing words
        wf = np.array([[0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0], [0, 1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31],
                       [0, 2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0]], np.int32).reshape(1, 3, 12)
        zeros = np.broadcast_to(qzeros.reshape(qzeros.shape[0], qzeros.shape[1] // 3, 3, 1), (qzeros.shape[0], qzeros.shape[1] // 3, 3, 12))
        zeros = np.right_shift(zeros, wf[None])
        zeros[:, :, 0, 10] = (zeros[:, :, 0, 10] & 0x3) | ((zeros[:, :, 1, 0] << 2) & 0x4)
        zeros[:, :, 1, 11] = (zeros[:, :, 1, 11] & 0x1) | ((zeros[:, :, 2, 0] << 1) & 0x6)
        zeros = zeros & 0x7
        zeros = np.concatenate([zeros[:, :, 0, :11], zeros[:, :, 1, 1:12], zeros[:, :, 2, 1:11]], axis=2).reshape(scales.shape)
        weight = np.broadcast_to(qweight.reshape(qweight.shape[0] // 3, 3, 1, qweight.shape[1]), (qweight.shape[0] // 3, 3, 12, qweight.shape[1]))
        weight = np.right_shift(weight, wf.reshape(1, 3, 12, 1)) & 0x7
        weight[:, 0, 10] = (weight[:, 0, 10] & 0x3) | ((weight[:, 1, 0] << 2) & 0x4)
        weight[:, 1, 11] = (weight[:, 1, 11] & 0x1) | ((weight[:, 2, 0] << 1) & 0x6)
        weight = weight & 0x7
        weight = np.concatenate([weight[:, 0, :11], weight[:, 1, 1:12], weight[:, 2, 1:11]], axis=1)
    weight = weight.reshape(-1, weight.shape[-1]).astype(np.int16)
    zeros = zeros.astype(np.int16)
    if v1:
        zeros = (zeros + 1) & maxq  # AutoGPTQ: zeros = zeros + 1; zeros = bitwise_and(zeros, maxq)
    with np.errstate(all="ignore"):
        return (scales[g_idx] * (weight - zeros[g_idx]).astype(np.float16)).T


def awq_tensors(n_in, out, group_size, seed=0):
    rng = np.random.default_rng(seed)
    groups = n_in // group_size
    q = rng.integers(0, 16, (n_in, out), dtype=np.uint8)
    z = rng.integers(0, 16, (groups, out), dtype=np.uint8)

    def pack(codes):  # AutoAWQ's pack: nibble i of word c holds column 8c + order[i]
        words = np.zeros((codes.shape[0], codes.shape[1] // 8), np.uint32)
        for i, col in enumerate(AWQ_ORDER):
            words |= codes[:, col::8].astype(np.uint32) << np.uint32(4 * i)
        return words.view(np.int32)
    return {"qweight": pack(q), "qzeros": pack(z), "scales": scales_with_extremes((groups, out), rng)}


def awq_oracle(t, group_size) -> np.ndarray:
    """dequantize_gemm (AutoAWQ, GPTQModel): unpack columnwise, reverse the order, (q - z) * scales in float16; [out, in]."""
    def unpack(words):
        codes = (words[..., None] >> np.arange(0, 32, 4, dtype=np.int32)) & 0xF
        return codes.reshape(words.shape[0], -1)
    reverse = np.arange(t["qweight"].shape[1] * 8).reshape(-1, 8)[:, [0, 4, 1, 5, 2, 6, 3, 7]].reshape(-1)
    iweight, izeros = unpack(t["qweight"])[:, reverse] & 15, unpack(t["qzeros"])[:, reverse] & 15
    scales = np.repeat(t["scales"], group_size, axis=0)
    izeros = np.repeat(izeros, group_size, axis=0)
    with np.errstate(all="ignore"):
        return ((iweight - izeros).astype(np.float16) * scales).T


def awq_zeros_width(n_in, group_size) -> int:
    """AutoAWQ's calculate_zeros_width (awq/modules/linear/gemv.py): the words of a GEMV row of
    zeros, ceil(groups / 8) rounded up to a multiple of 2 (groups of 64) or 4 (of 32)."""
    multiple = {64: 2, 32: 4}.get(group_size, 1)
    return -(-(-(-(n_in // group_size) // 8)) // multiple) * multiple


def awq_gemv_tensors(n_in, out, group_size, seed=0):
    """A WQLinear_GEMV module's tensors as AutoAWQ's `from_linear` packs them: qweight [out, in/8]
    and qzeros [out, zw] with code i of each 8 at bits 4i (its order_map is 0..7), scales float16
    [out, 8 zw]; the padding columns hold random values (AutoAWQ leaves zeros: no kernel reads them)."""
    rng = np.random.default_rng(seed)
    groups, width = n_in // group_size, awq_zeros_width(n_in, group_size)
    q = rng.integers(0, 16, (out, n_in), dtype=np.uint8)
    z = rng.integers(0, 16, (out, width * 8), dtype=np.uint8)
    scales = (rng.standard_normal((out, width * 8)) * 0.01).astype(np.float16)
    scales[:, :groups] = scales_with_extremes((out, groups), rng)

    def pack(codes):  # from_linear's loop: qweight[:, col] |= intweight[:, 8 col + i] << 4 i
        words = np.zeros((codes.shape[0], codes.shape[1] // 8), np.uint32)
        for i in range(8):
            words |= codes[:, i::8].astype(np.uint32) << np.uint32(4 * i)
        return words.view(np.int32)
    return {"qweight": pack(q), "qzeros": pack(z), "scales": scales}


def awq_gemv_oracle(t, group_size) -> np.ndarray:
    """The weights AutoAWQ's GEMV kernel multiplies by (AutoAWQ_kernels' and llm-awq's gemv_cuda.cu,
    gemv_kernel_g64 / gemv_kernel_g128, the path of up to 8 rows), [out, in] float32: each of a warp's
    32 threads' loops, as the kernel indexes qweight, the (for groups of 64: 64-bit) zero words and
    the scales, over every output row at once; `dequantized_weight = scaling_factor *
    (current_single_weight_fp - current_zeros)` in float32."""
    assert group_size in (64, 128), "gemv_forward_cuda has kernels for groups of 64 and 128 only"
    qweight, zeros, scales = t["qweight"].view(np.uint32), t["qzeros"].view(np.uint32), t["scales"]
    out, weight_w = qweight.shape
    n_in = weight_w * 8
    packed = -(-(n_in // group_size) // 8)
    if group_size == 64:
        packed = -(-packed // 2) * 2
    assert zeros.shape[1] == packed and scales.shape[1] == packed * 8  # (the kernel's zeros_w and sf_w)
    per_group = group_size // 32  # (threads a group: each thread reads 32 codes)
    w = np.full((out, n_in), np.nan, np.float32)
    for p in range(packed // 2 if group_size == 64 else packed):
        if group_size == 64:  # (a uint64 read of two zero words: the second word's nibbles above the first's)
            words = zeros[:, 2 * p].astype(np.uint64) | (zeros[:, 2 * p + 1].astype(np.uint64) << np.uint64(32))
        else:
            words = zeros[:, p].astype(np.uint64)
        for thread in range(32):
            scale = scales[:, p * (32 // per_group) + thread // per_group].astype(np.float32)
            zero = ((words >> np.uint64(thread // per_group * 4)) & np.uint64(0xF)).astype(np.float32)
            for ic_0 in range(4):
                at = p * 128 + thread * 4 + ic_0
                if at < weight_w:
                    word = qweight[:, at]
                    for ic_1 in range(8):
                        single = ((word >> np.uint32(4 * ic_1)) & np.uint32(0xF)).astype(np.float32)
                        with np.errstate(all="ignore"):
                            w[:, at * 8 + ic_1] = scale * (single - zero)
    return w


def awq_gemv_product(t, group_size) -> np.ndarray:
    """The same float32 product for any group size (gemv_forward_cuda has kernels for 64 and 128
    only), written plainly: input k's code at bits 4(k % 8) of word k / 8, its group's zero so too, [out, in]."""
    k = np.arange(t["qweight"].shape[1] * 8)
    q = ((t["qweight"].view(np.uint32)[:, k // 8] >> (4 * (k % 8)).astype(np.uint32)) & 0xF).astype(np.float32)
    g = k // group_size
    z = ((t["qzeros"].view(np.uint32)[:, g // 8] >> (4 * (g % 8)).astype(np.uint32)) & 0xF).astype(np.float32)
    with np.errstate(all="ignore"):
        return t["scales"][:, g].astype(np.float32) * (q - z)


def model_of(placed, shape) -> onnx.ModelProto:
    out = helper.make_tensor_value_info(placed.output, placed.dtype, list(shape))
    graph = helper.make_graph(placed.nodes, "checkpoint_module", [], [out], initializer=placed.tensors)
    return dyndq.make_model(graph, opset=placed.opset)


def check_exact(module, want: np.ndarray, *, any_nan: bool = False) -> None:
    """The module's nodes give `want`'s bits on the reference engine and on ONNX Runtime (with
    `any_nan`, a NaN where `want` has one, of any bits: torch's float32 -> bfloat16 conversion
    gives 0x7FC0 in its scalar path and 0xFFFF in its vector one, so its NaN bits are not the
    format's)."""
    placed = ours.nodes(module)
    model = model_of(placed, want.shape)
    assert dyndq.check(model) == []
    with np.errstate(all="ignore"):
        got = {"reference": dyndq.run(model, {})[placed.output],
               "onnxruntime": run_onnxruntime(dyndq.export(model, target="onnxruntime"), {})[0]}
    bits = {2: np.uint16, 4: np.uint32}[want.dtype.itemsize]
    for engine, values in got.items():
        assert values.dtype == want.dtype and values.shape == want.shape, (engine, values.dtype, values.shape)
        same = values.view(bits) == want.view(bits)
        if any_nan:
            same |= np.isnan(values.astype(np.float32)) & np.isnan(want.astype(np.float32))
        differ = np.flatnonzero(~same)
        assert not differ.size, (f"{module.name} on {engine}: {differ.size} of {want.size} values differ, the first at "
                                 f"{differ[0]}: {values.flat[differ[0]].view(bits):#x}, oracle {want.flat[differ[0]].view(bits):#x}")


def written_bytes(placed) -> int:
    return sum(len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes for t in placed.tensors)
