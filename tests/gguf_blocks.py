"""GGUF tensors for the tests of dyndq.checkpoints.gguf, and the one check of their nodes.

`quantized` makes a tensor with gguf's own quantizer (where `gguf.quants.quantize` has one);
`drawn` draws raw blocks: random bytes (every code value of every field reached at the sizes the
tests draw), with the float16 fields of the first blocks set to the extremes (±0, subnormals, the
largest finite, ±inf, quiet and signalling NaNs of both signs) and the one-byte scales taking
every byte value in turn.  `check_exact` builds the tensor's nodes,
runs them on the reference engine (our kernel) and, exported for target onnxruntime, on ONNX
Runtime, and compares both with `gguf.quants.dequantize`, bit for bit (as uint32).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dyndq
from dyndq.checkpoints import gguf as ours
from engines import run_onnxruntime

gguf = pytest.importorskip("gguf", reason="the `gguf` package (the test extra installs it: make test)")

# the byte offsets of each type's float16 fields in its block (scales, mins, super-block scales)
FLOAT16_FIELDS = {
    "F16": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_NL": (0,), "IQ4_XS": (0,), "TQ1_0": (52,), "TQ2_0": (64,), "IQ2_XXS": (0,), "IQ3_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
}
# the byte offsets of each type's one-byte scales (MXFP4's exponent, NVFP4's e4m3): every byte value is drawn in turn
SCALE_BYTES = {"MXFP4": (0,), "NVFP4": (0, 1, 2, 3)}
SPECIAL_HALVES = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x7C00, 0xFC00,
                           0x7E00, 0xFE00, 0x7C01, 0xFD55, 0x3C00, 0xBC00, 0x0200], np.uint16)


def qtype(name: str):
    """gguf's type of that name (the test skipped, saying so, where the installed gguf lacks it)."""
    if name not in gguf.GGMLQuantizationType.__members__:
        pytest.skip(f"the installed gguf has no type {name}")
    return gguf.GGMLQuantizationType[name]


def write_gguf(path, tensors: dict, architecture: str = "llama", **metadata) -> None:
    """A GGUF file holding `tensors` (name -> (type name, bytes)) by gguf's own writer, with
    `metadata` written by the writer's own adders (block_count=1 -> writer.add_block_count(1))."""
    writer = gguf.GGUFWriter(str(path), architecture)
    for key, value in metadata.items():
        getattr(writer, f"add_{key}")(value)
    for name, (type_name, data) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype(type_name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def known(names) -> list[str]:
    """Those of `names` the installed gguf has (NVFP4 came in gguf 0.19)."""
    return [n for n in names if n in gguf.GGMLQuantizationType.__members__]


def with_quantizer(names) -> list[str]:
    """Those of `names` gguf's quantizer makes (the others' tensors are drawn raw blocks only)."""
    return [n for n in known(names) if quantized(n, (1, block_of(n)[0])) is not None]


def block_of(name: str) -> tuple[int, int]:
    return gguf.GGML_QUANT_SIZES[qtype(name)]


def drawn(name: str, rows: int, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Raw blocks of type `name`, uint8 [rows, n_blocks * size]: random bytes, the float16 fields
    of the first blocks (row-major) set to SPECIAL_HALVES, one value each."""
    size = block_of(name)[1]
    data = np.random.default_rng(seed).integers(0, 256, (rows * n_blocks, size), dtype=np.uint8)
    for i, at in enumerate(FLOAT16_FIELDS.get(name, ())):
        special = np.roll(SPECIAL_HALVES, i)[:rows * n_blocks]
        data[:len(special), at:at + 2] = special.view(np.uint8).reshape(-1, 2)
    if name == "IQ1_M":  # its float16 d is the top nibbles of the four 16-bit scale words at byte 48
        special = SPECIAL_HALVES[:rows * n_blocks]
        words = data[:len(special), 48:56].copy().view(np.uint16)
        words[:] = (words & 0x0FFF) | (((special[:, None] >> (4 * np.arange(4, dtype=np.uint16))) & 0xF) << 12)
        data[:len(special), 48:56] = words.view(np.uint8)
    for i, at in enumerate(SCALE_BYTES.get(name, ())):
        data[:, at] = (np.arange(rows * n_blocks) + 64 * i) % 256
    return data.reshape(rows, n_blocks * size)


def quantized(name: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray | None:
    """gguf's own quantization of a heavy-tailed float tensor, or None where gguf has no quantizer."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_t(3, shape) * rng.choice([1e-3, 0.05, 1.0, 30.0], (*shape[:-1], 1))).astype(np.float32)
    try:
        return gguf.quants.quantize(values, qtype(name))
    except NotImplementedError:
        return None


def model_of(placed, shape) -> onnx.ModelProto:
    out = helper.make_tensor_value_info(placed.output, TensorProto.FLOAT, list(shape))
    graph = helper.make_graph(placed.nodes, "gguf_tensor", [], [out], initializer=placed.tensors)
    return dyndq.make_model(graph, opset=placed.opset)


def check_exact(name: str, data: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The nodes of GGUF tensor `data` (uint8 bytes [*shape[:-1], row bytes]) of type `name` give
    gguf.quants.dequantize's float32 bits on the reference engine and on ONNX Runtime; returns them."""
    with np.errstate(all="ignore"):  # (inf * 0 and inf - inf, which the drawn scales make on purpose)
        want = gguf.quants.dequantize(data, qtype(name)).astype(np.float32, copy=False).reshape(shape)
    placed = ours.nodes(ours.GGUFTensor(f"t_{name}", name, shape, data))
    model = model_of(placed, shape)
    assert dyndq.check(model) == []
    with np.errstate(all="ignore"):  # (the reference engine's NumPy meets the same inf - inf)
        reference = dyndq.run(model, {})[placed.output]
    got = {"reference": reference, "onnxruntime": run_onnxruntime(dyndq.export(model, target="onnxruntime"), {})[0]}
    for engine, values in got.items():
        assert values.dtype == np.float32 and values.shape == want.shape, (engine, values.dtype, values.shape)
        differ = np.flatnonzero(values.view(np.uint32) != want.view(np.uint32))
        assert not differ.size, (f"{name} on {engine}: {differ.size} of {want.size} values differ from gguf's, the first at "
                                 f"{differ[0]}: {values.flat[differ[0]].view(np.uint32):#010x}, "
                                 f"gguf {want.flat[differ[0]].view(np.uint32):#010x}")
    return want


def written_bytes(placed, tables: bool = False) -> int:
    """The bytes of the tensors the nodes hold (each as ONNX stores it: int4 two to a byte): those
    of the tensor's own, or (`tables`) of its lookup tables, which a model holds once per type."""
    return sum(len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes for t in placed.tensors
               if (t.name in placed.tables) == tables)
