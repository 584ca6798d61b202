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


def import_compressed_tensors():
    """compressed-tensors imports transformers, whose check for Hugging Face's `kernels` package
    imports a top-level module `kernels`: in this editable install that finds dyndq's own kernels/
    folder and runs it a second time, attaching new kernel functions to the registered ops (which
    tests/kernels/test_arguments.py then sees).  So, while it is imported, `kernels` is dyndq's
    kernels package, already imported (not a package of that name: transformers then passes it by)."""
    import sys

    import dyndq.kernels

    alias = "kernels" not in sys.modules
    if alias:
        sys.modules["kernels"] = dyndq.kernels
    try:
        return pytest.importorskip("compressed_tensors", reason="compressed-tensors (the torch extra: make test-torch installs it)")
    finally:
        if alias and sys.modules.get("kernels") is dyndq.kernels:
            del sys.modules["kernels"]


ct = import_compressed_tensors()
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


@pytest.mark.parametrize("preset", ["int4-asym-group", "int8-sym-channel", "nvfp4"])
def test_a_checkpoint_compressed_tensors_wrote_from_a_torch_module_reads_exactly(preset, tmp_path):
    """A torch model quantized (min-max scales), compressed by compressed-tensors' own ModelCompressor
    and saved as a checkpoint folder (safetensors + config.json by its update_config); each module's
    nodes give what its decompress_model gives."""
    import copy
    import json

    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("up_proj", torch.nn.Linear(128, 64, bias=False))
    model.add_module("down_proj", torch.nn.Linear(64, 128, bias=False))
    model = model.to(torch.float16 if preset == "int8-sym-channel" else torch.bfloat16)
    args = {"int4-asym-group": dict(num_bits=4, type="int", symmetric=False, strategy="group", group_size=32),
            "int8-sym-channel": dict(num_bits=8, type="int", symmetric=True, strategy="channel"),
            "nvfp4": dict(num_bits=4, type="float", symmetric=True, strategy="tensor_group", group_size=16)}[preset]
    kind = "nvfp4-pack-quantized" if preset == "nvfp4" else "pack-quantized"
    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**args))},
                                format=kind)
    apply_quantization_config(model, config)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            w = m.weight.data.float()
            g = w.reshape(w.shape[0], -1, args.get("group_size") or w.shape[1])
            global_scale = None
            if preset == "nvfp4":
                global_scale = (448.0 * 6.0 / w.abs().amax()).reshape(1)
                m.weight_global_scale.data.copy_(global_scale)
            scale, zero = calculate_qparams(g.amin(-1), g.amax(-1), QuantizationArgs(**args), global_scale=global_scale)
            m.weight_scale.data.copy_(scale.reshape(m.weight_scale.shape))
            if hasattr(m, "weight_zero_point") and m.weight_zero_point is not None:
                m.weight_zero_point.data.copy_(zero.reshape(m.weight_zero_point.shape))
    compressor = ModelCompressor(quantization_config=config)
    compressor.compress_model(model)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "test"}))
    compressor.update_config(str(tmp_path))
    decompressed = copy.deepcopy(model)
    compressor.decompress_model(decompressed)
    weights = {f"{name}.weight": numpy_of(m.weight.data) for name, m in decompressed.named_modules() if isinstance(m, torch.nn.Linear)}
    modules = list(ours.read(tmp_path))
    assert sorted(m.weight_name for m in modules) == sorted(weights) and {m.format for m in modules} == {kind}
    for module in modules:
        check_exact(module, weights[module.weight_name], any_nan=True)
