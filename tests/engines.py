"""The engines an export is for, each run one exact way, for tests: `run_onnxruntime` and
`run_openvino` take a ModelProto and NumPy feeds (ml_dtypes arrays for int4, bfloat16, float8 ...)
and return the graph's outputs as NumPy arrays of the graph's own output types.

ONNX Runtime runs through dyndq's own session (`dyndq.ort_session.OrtSession`, as `dyndq.run`
does): see its `OrtBoundary` for how each type goes in and comes out.

OpenVINO (an optional extra: `make test-openvino` installs it and runs the tests marked
`openvino`; elsewhere they are skipped, saying so) runs on its CPU plugin with f32 inference
precision (its default on a CPU with bfloat16 units is bf16, which clamps float32 constants to
bfloat16's range), no dynamic quantization, and denormals left alone.  Its Python API converts
an ml_dtypes array it is given by value, silently, into whatever it guesses (bfloat16 ones go in
as float16 bits, float8 ones as integers), so an array of a type NumPy lacks goes in as an
`openvino.Tensor` of the OpenVINO element type over the bytes ONNX packs for the array (sub-byte
types two codes a byte, low nibble first, which is OpenVINO's layout too); an output is read as its
bytes and decoded as the ONNX type.  OpenVINO has no int2, uint2 (its ONNX reader), float8 fnuz
nor float6 type: a model holding one is refused when read.  What it computes is its own (measured
on 2026.4, CPU): float32 constants lose their subnormals and the sign of zero, int64 is computed as
int32, a float32 Sub of a constant followed by a Mul by one is fused into an fma, and
DequantizeLinear multiplies in its output type.
"""
from __future__ import annotations

import io
from typing import Mapping

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from dyndq.opdefs import dtypes

OPENVINO_MISSING = "OpenVINO is not installed: `make test-openvino` installs it and runs these tests"

# Exact settings: float32 arithmetic where the model says float32 (the CPU plugin's default on a
# processor with bfloat16 units is bf16), no dynamic quantization of activations, and no FTZ/DAZ
# mode for the threads (the default, said here so that it stays so; either way the plugin zeroes
# subnormal float32 constants).
OPENVINO_CONFIG = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
                   "CPU_DENORMALS_OPTIMIZATION": False}

# ONNX element types that go in as NumPy arrays, and those that go in as bytes, by OpenVINO type name
_NATIVE = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BOOL, TensorProto.INT8,
           TensorProto.UINT8, TensorProto.INT16, TensorProto.UINT16, TensorProto.INT32, TensorProto.UINT32,
           TensorProto.INT64, TensorProto.UINT64}
_AS_BYTES = {TensorProto.BFLOAT16: "bf16", TensorProto.FLOAT8E4M3FN: "f8e4m3", TensorProto.FLOAT8E5M2: "f8e5m2",
             TensorProto.FLOAT8E8M0: "f8e8m0", TensorProto.INT4: "i4", TensorProto.UINT4: "u4",
             TensorProto.FLOAT4E2M1: "f4e2m1"}
_OPENVINO_TYPES = {"f32": TensorProto.FLOAT, "f64": TensorProto.DOUBLE, "f16": TensorProto.FLOAT16,
                   "boolean": TensorProto.BOOL, "i8": TensorProto.INT8, "u8": TensorProto.UINT8,
                   "i16": TensorProto.INT16, "u16": TensorProto.UINT16, "i32": TensorProto.INT32,
                   "u32": TensorProto.UINT32, "i64": TensorProto.INT64, "u64": TensorProto.UINT64,
                   **{ov: onnx_type for onnx_type, ov in _AS_BYTES.items()}}


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], level: str | None = None) -> list:
    """The graph's outputs on ONNX Runtime's CPU provider; `level` is the graph optimization level by
    the house's name ("off", "basic", "extended", "all"; None: "basic", as dyndq.run runs it)."""
    from dyndq.ort_session import OrtSession

    session = OrtSession(model, level=level or "basic")
    return session.run([o.name for o in model.graph.output], feeds)


def openvino_available() -> bool:
    """Whether OpenVINO imports (the package's own answer, the one `check --runtime-parity` goes by)."""
    from dyndq.parity.engines import openvino_installed

    return openvino_installed()


def needs_openvino() -> None:
    """Skip the calling test, saying why, where OpenVINO is not installed."""
    if not openvino_available():
        pytest.skip(OPENVINO_MISSING)


TORCH_MISSING = "torch and torchao are not installed (an optional extra): make test-torch installs them and runs this"


def needs_torch() -> None:
    """Skip the calling test, saying why, where torch or torchao is not installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchao") is None:
        pytest.skip(TORCH_MISSING)


def run_openvino(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list:
    """The graph's outputs on OpenVINO's CPU plugin, with OPENVINO_CONFIG."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(io.BytesIO(model.SerializeToString())), "CPU", OPENVINO_CONFIG)
    request = compiled.create_infer_request()
    inputs = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
    request.infer({name: _openvino_feed(np.asarray(value), inputs.get(name)) for name, value in feeds.items()})
    return [_openvino_output(request.get_tensor(vi.name), vi) for vi in model.graph.output]


def _openvino_feed(value: np.ndarray, elem: int | None):
    import openvino as ov

    try:
        given = dtypes.of(value.dtype).onnx
    except (KeyError, TypeError):
        given = None
    if given in _NATIVE:
        return np.ascontiguousarray(value)
    if given not in _AS_BYTES:
        raise ValueError(f"OpenVINO takes no array of {value.dtype}")
    if elem is not None and elem != given:  # (OpenVINO would take the bytes for its own type)
        raise ValueError(f"an array of {TensorProto.DataType.Name(given)} for an input of "
                         f"{TensorProto.DataType.Name(elem)}")
    packed = np.frombuffer(numpy_helper.from_array(np.ascontiguousarray(value)).raw_data, np.uint8).copy()
    return ov.Tensor(packed, list(value.shape), getattr(ov.Type, _AS_BYTES[given]))


def _openvino_output(tensor, vi: onnx.ValueInfoProto) -> np.ndarray:
    """A copy of an output tensor as an array of the graph's type for it (OpenVINO's own `data` view
    of a bf16 tensor is typed float16, and a sub-byte one is its packed bytes)."""
    elem = vi.type.tensor_type.elem_type
    got = _OPENVINO_TYPES.get(tensor.element_type.get_type_name())
    if got != elem:
        raise RuntimeError(f"OpenVINO gives {vi.name} as {tensor.element_type}, "
                           f"the graph says {TensorProto.DataType.Name(elem)}")
    shape = list(tensor.shape)
    if elem in _NATIVE:
        return np.array(tensor.data, copy=True).reshape(shape)
    raw = onnx.TensorProto(data_type=elem, dims=shape, raw_data=np.asarray(tensor.data).tobytes())
    return numpy_helper.to_array(raw)
