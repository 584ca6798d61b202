"""compressed-tensors modules (pack-quantized int2/int4/int8, group/channel, symmetric/asymmetric;
nvfp4-pack-quantized): their nodes give compressed-tensors' own decompression bit for bit, its own
packers making the tensors (needs torch and compressed-tensors: `make test-torch`)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dyndq.checkpoints import safetensors as ours
from safetensors_checkpoints import SPECIAL_HALVES, check_exact, written_bytes

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch", reason="torch (the torch extra: make test-torch installs it)")
ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors (the torch extra: make test-torch installs it)")
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402


def numpy_of(t) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
    return t.numpy()


def scheme(**weights) -> QuantizationScheme:
    return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**weights))


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("strategy", ["group", "channel"])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_pack_quantized_modules_dequantize_as_compressed_tensors_does(bits, strategy, symmetric, dtype):
    out, n_in, group = 64, 128, 32
    rng = np.random.default_rng(bits)
    groups = n_in // group if strategy == "group" else 1
    low, high = -(1 << (bits - 1)), (1 << (bits - 1))
    q = torch.from_numpy(rng.integers(low, high, (out, n_in), dtype=np.int8))
    scale = torch.from_numpy(rng.standard_normal((out, groups)).astype(np.float32) * 0.01).to(getattr(torch, dtype))
    if dtype == "float16":
        scale.view(-1)[:len(SPECIAL_HALVES)] = torch.from_numpy(SPECIAL_HALVES.view(np.int16)).view(torch.float16)
    state = {"weight_packed": pack_to_int32(q, bits), "weight_scale": scale, "weight_shape": torch.tensor([out, n_in])}
    if not symmetric:
        zp = torch.from_numpy(rng.integers(low, high, (out, groups), dtype=np.int8))
        state["weight_zero_point"] = pack_to_int32(zp, bits, packed_dim=0)
    args = dict(num_bits=bits, type="int", symmetric=symmetric, strategy=strategy, group_size=group if strategy == "group" else None)
    want = numpy_of(PackedQuantizationCompressor.decompress(dict(state), scheme(**args))["weight"])
    module = ours.Module("model.layers.0.mlp.up_proj", "pack-quantized", {k: numpy_of(v) for k, v in state.items()},
                         {"quant_method": "compressed-tensors", "format": "pack-quantized",
                          "config_groups": {"group_0": {"targets": ["Linear"], "weights": args}}})
    check_exact(module, want)
    checkpoint = sum(numpy_of(v).nbytes for v in state.values())
    assert written_bytes(ours.nodes(module)) <= 1.10 * checkpoint


def test_nvfp4_modules_dequantize_as_compressed_tensors_does():
    out, n_in = 32, 256
    rng = np.random.default_rng(5)
    packed = torch.from_numpy(rng.integers(0, 256, (out, n_in // 2), dtype=np.uint8))
    scale_bytes = (np.arange(out * n_in // 16) % 256).astype(np.uint8).reshape(out, n_in // 16)  # every e4m3 byte
    scale = torch.from_numpy(scale_bytes).view(torch.float8_e4m3fn)
    state = {"weight_packed": packed, "weight_scale": scale, "weight_global_scale": torch.tensor([448.0 * 6 / 3.7], dtype=torch.float32)}
    args = dict(num_bits=4, type="float", symmetric=True, strategy="tensor_group", group_size=16)
    want = numpy_of(NVFP4PackedCompressor.decompress(dict(state), scheme(**args))["weight"])
    module = ours.Module("m.o_proj", "nvfp4-pack-quantized", {k: numpy_of(v) for k, v in state.items()},
                         {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"})
    assert np.isnan(want.astype(np.float32)).sum() == 64  # (the 4 NaN e4m3 scale bytes of each 256, 16 codes each)
    check_exact(module, want, any_nan=True)
    assert written_bytes(ours.nodes(module)) <= 1.10 * sum(numpy_of(v).nbytes for v in state.values())
