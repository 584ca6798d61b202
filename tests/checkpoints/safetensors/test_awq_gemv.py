"""AWQ's GEMV version (AutoAWQ's WQLinear_GEMV): its modules' nodes give the weights its GEMV
kernel multiplies by, bit for bit (the oracle, tests/safetensors_checkpoints.py, follows
gemv_cuda.cu's own indexing: autoawq 0.2.9 needs triton and CUDA and does not install here), every
code and zero value and the float16 extremes reached, the padded zeros and scales not read; the
codes read in GEMM's order, or the product rounded to float16, fail; what is written weighs at
most 1.10x the module's checkpoint bytes; a module it cannot read is refused by name."""
from __future__ import annotations

import numpy as np
import pytest

import dyndq
from dyndq.checkpoints import safetensors as ours
from safetensors_checkpoints import (awq_gemv_oracle, awq_gemv_product, awq_gemv_tensors, awq_zeros_width, check_exact,
                                     written_bytes)


def gemv(t, group_size, **config):
    return ours.Module("model.layers.0.mlp.gate_proj", "awq", t,
                       {"quant_method": "awq", "bits": 4, "group_size": group_size, "version": "gemv", **config})


# (in, out, group): zeros a word short of a multiple of 2 (groups of 64) and scales padded past
# the groups, one group-row of 1024 inputs and more than one, rows not a multiple of 8
@pytest.mark.parametrize("n_in, out, group_size", [(256, 24, 64), (1152, 8, 64), (384, 12, 128), (2048, 16, 128)])
def test_gemv_modules_give_the_gemv_kernels_weights_exactly(n_in, out, group_size):
    t = awq_gemv_tensors(n_in, out, group_size, seed=n_in)
    assert t["scales"].shape[1] > n_in // group_size or n_in == 2048  # (padded where AutoAWQ pads)
    check_exact(gemv(t, group_size), awq_gemv_oracle(t, group_size))


def test_autoawqs_own_config_keys_and_upper_case_version_are_taken():
    t = awq_gemv_tensors(256, 16, 128, seed=2)
    module = ours.Module("m", "awq", t, {"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "version": "GEMV",
                                         "zero_point": True})
    check_exact(module, awq_gemv_oracle(t, 128))


def test_the_padding_is_not_read():
    t = awq_gemv_tensors(384, 8, 128, seed=3)
    want = awq_gemv_oracle(t, 128)
    garbage = dict(t, scales=t["scales"].copy(), qzeros=t["qzeros"].copy())
    garbage["scales"][:, 3:] = np.float16(np.nan)
    garbage["qzeros"] |= np.int32(0x0FFFF000).astype(np.int32)  # (nibbles 3..6: groups past the 3)
    check_exact(gemv(garbage, 128), want)


def test_gemms_nibble_order_or_a_float16_product_differ():
    t = awq_gemv_tensors(256, 16, 64, seed=4)
    want = awq_gemv_oracle(t, 64)
    nibbles = (t["qweight"].view(np.uint32)[..., None] >> np.arange(0, 32, 4, dtype=np.uint32)) & 0xF
    reordered = dict(t, qweight=(nibbles[..., [0, 2, 4, 6, 1, 3, 5, 7]] << np.arange(0, 32, 4, dtype=np.uint32))
                     .sum(-1).astype(np.uint32).view(np.int32))
    with pytest.raises(AssertionError, match="values differ"):
        check_exact(gemv(reordered, 64), want)
    with np.errstate(all="ignore"):
        rounded = want.astype(np.float16).astype(np.float32)  # (GEMM's dequantize_gemm and GEMV's gemmv2 round so)
    with pytest.raises(AssertionError, match="values differ"):
        check_exact(gemv(t, 64), rounded)


@pytest.mark.parametrize("group_size", [32, -1])
def test_group_sizes_the_gemv_kernel_has_no_kernel_for_give_the_same_product(group_size):
    """(gemv_forward_cuda runs groups of 64 and 128; other sizes: the same float32 product per group)"""
    t = awq_gemv_tensors(256, 8, 256 if group_size == -1 else group_size, seed=5)
    check_exact(gemv(t, group_size), awq_gemv_product(t, 256 if group_size == -1 else group_size))


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_gemv_tensors_written_weigh_at_most_1_10_of_the_checkpoints(group_size):
    t = awq_gemv_tensors(1024, 256, group_size, seed=6)
    assert t["qzeros"].shape[1] == awq_zeros_width(1024, group_size)
    ratio = written_bytes(ours.nodes(gemv(t, group_size))) / sum(a.nbytes for a in t.values())
    assert ratio <= 1.10, f"groups of {group_size}: {ratio:.3f}x"  # (1.000: the same bytes, the padding left behind)


def test_a_gemv_module_it_cannot_read_is_refused_by_name():
    t = awq_gemv_tensors(256, 16, 64, seed=7)
    module = ours.Module("m.up_proj", "awq", t, {"quant_method": "awq", "bits": 4, "version": "gemv"})
    with pytest.raises(dyndq.ValidationError, match=r"m.up_proj.*group size 0.*group_size"):
        ours.nodes(module)
    with pytest.raises(dyndq.ValidationError, match=r"gate_proj.*group size 96"):
        ours.nodes(gemv(t, 96))
    with pytest.raises(dyndq.ValidationError, match=r"gate_proj.scales.*float32.*float16"):
        ours.nodes(gemv(dict(t, scales=t["scales"].astype(np.float32)), 64))
    with pytest.raises(dyndq.ValidationError, match=r"gate_proj.qzeros.*int32 \[8, 2\].*int32 \[16, at least 1\]"):
        ours.nodes(gemv(dict(t, qzeros=t["qzeros"][:8]), 64))
    with pytest.raises(dyndq.ValidationError, match=r"gate_proj.scales.*at least 4"):
        ours.nodes(gemv(dict(t, scales=t["scales"][:, :3]), 64))


def test_the_codes_written_are_the_qweights_own_bytes():
    """(GEMV packs code i of each word at bits 4i: ONNX's uint4 order, so [out, in] uint4 is qweight's bytes)"""
    from onnx import TensorProto

    t = awq_gemv_tensors(256, 16, 64, seed=8)
    placed = ours.nodes(gemv(t, 64))
    [codes] = [x for x in placed.tensors if x.data_type == TensorProto.UINT4 and list(x.dims) == [16, 256]]
    assert codes.raw_data == t["qweight"].astype("<i4").tobytes()
