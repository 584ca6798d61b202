"""OpenVINO, the one runner of it: `OpenVinoSession(model, config=...)`, fed and read one way.

OpenVINO is an optional extra (`pip install 'dyndq[openvino]'`; `make test-openvino`), imported
only when a session is made.  Its CPU plugin runs the model with `config` (its defaults when none:
what `check --runtime-parity` compares; `EXACT` for float32 arithmetic where the model says
float32).  Its Python API converts an ml_dtypes array it is given by value, silently, into
whatever it guesses (bfloat16 ones go in as float16 bits, float8 ones as integers), so an array of
a type NumPy lacks goes in as an `openvino.Tensor` of OpenVINO's element type (the dtype table's
`openvino` column) over the bytes ONNX packs for the array (sub-byte types two codes a byte, low
nibble first, which is OpenVINO's layout too); an output is read as its bytes and decoded as the
ONNX type of OpenVINO's element type.  OpenVINO has no int2, uint2 (its ONNX reader), float8 fnuz
nor float6 type: a model holding one is refused when read, an array of one refused by name.

`dyndq.runtime_parity` runs OpenVINO through `OpenVinoSession`, the check of a written file makes
its session through `user_session` (its defaults), and so do the tests.
"""
from __future__ import annotations

import io
import os
from typing import Mapping, Sequence

import numpy as np
import onnx

from dyndq.opdefs import dtypes

# OpenVINO's CPU settings that change the arithmetic, each with the value that keeps float32 exact
# (measured on 2026.4: its bf16 inference hint and its dynamic quantization of activations each
# move an int4 MatMul's result on their own): the settings `check --runtime-parity` searches.
ARITHMETIC = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
# Exact settings: float32 arithmetic where the model says float32 (the CPU plugin's default on a
# processor with bfloat16 units is bf16, which clamps float32 constants to bfloat16's range), no
# dynamic quantization of activations, and no FTZ/DAZ mode for the threads (the default, said here
# so that it stays so; either way the plugin zeroes subnormal float32 constants).
EXACT = {**ARITHMETIC, "CPU_DENORMALS_OPTIMIZATION": False}


INSTALL = "pip install 'openvino>=2026.4'"  # (the optional extra's pin)


def installed() -> bool:
    """Whether OpenVINO imports."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def version() -> str:
    import openvino

    return openvino.get_version()


class OpenVinoSession:
    """A model compiled on OpenVINO's CPU plugin: `run(names, feeds)`.  `model`: a ModelProto, or
    a path (OpenVINO reads the file there, its external data too, as a user's `read_model` does);
    `config`: the CPU plugin's settings (None: its defaults)."""

    def __init__(self, model: onnx.ModelProto | str | os.PathLike, config: Mapping[str, object] | None = None):
        import openvino as ov

        core = ov.Core()
        if isinstance(model, onnx.ModelProto):
            read = core.read_model(io.BytesIO(model.SerializeToString()))
            self.inputs = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
        else:
            read = core.read_model(os.fspath(model))
            self.inputs = {}
        self.compiled = core.compile_model(read, "CPU", dict(config or {}))

    def property_text(self, key: str) -> str:
        """A property of the compiled model as OpenVINO's config takes it ("bf16", not "<Type: 'bfloat16'>")."""
        value = self.compiled.get_property(key)
        return value.to_string() if hasattr(value, "to_string") else str(value)

    def run(self, names: Sequence[str], feeds: Mapping[str, object]) -> list[np.ndarray]:
        """The values `names` on `feeds`, each an array of the ONNX type of OpenVINO's element type."""
        request = self.compiled.create_infer_request()
        request.infer({name: _feed(np.asarray(value), self.inputs.get(name)) for name, value in feeds.items()})
        return [_value(request.get_tensor(name)) for name in names]


def user_session(source) -> OpenVinoSession:
    """OpenVINO's CPU session of a model file (or a ModelProto) at its default settings, as a
    user's `compile_model(read_model(path), "CPU")` makes it (its error is OpenVINO's own, raised)."""
    return OpenVinoSession(source)


_BY_OPENVINO = {d.openvino: d for d in dtypes.DTYPES if d.openvino}


def _feed(value: np.ndarray, elem: int | None):
    """A NumPy array of a NumPy dtype as it is; one of ml_dtypes' as an openvino.Tensor over ONNX's bytes."""
    import openvino as ov

    try:
        row = dtypes.of(value.dtype)
    except (KeyError, TypeError):
        row = None
    if row is None or row.openvino is None:
        raise ValueError(f"OpenVINO takes no array of {value.dtype}")
    if not row.ml_dtype:
        return np.ascontiguousarray(value)
    if elem and elem != row.onnx:  # (OpenVINO would take the bytes for its own type)
        raise ValueError(f"an array of {row.onnx_name} for an input of {onnx.TensorProto.DataType.Name(elem)}")
    packed = np.frombuffer(onnx.numpy_helper.from_array(np.ascontiguousarray(value)).raw_data, np.uint8).copy()
    return ov.Tensor(packed, list(value.shape), getattr(ov.Type, row.openvino))


def _value(tensor) -> np.ndarray:
    """A copy of an output tensor as an array of the ONNX type of its element type (OpenVINO's own
    `data` view of a bf16 tensor is typed float16, and a sub-byte one is its packed bytes)."""
    kind = tensor.element_type.get_type_name()
    row = _BY_OPENVINO.get(kind)
    if row is None:
        raise RuntimeError(f"OpenVINO gives a tensor of {kind}, a type the dtype table does not map")
    shape = list(tensor.shape)
    if not row.ml_dtype:
        return np.array(tensor.data, copy=True).reshape(shape)
    raw = onnx.TensorProto(data_type=row.onnx, dims=shape, raw_data=np.asarray(tensor.data).tobytes())
    return onnx.numpy_helper.to_array(raw)
