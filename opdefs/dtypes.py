"""The one dtype table: ONNX element type <-> our dtype name <-> NumPy dtype <-> oneDNN's name,
and what each type asks of the rest: its bits, the IR version and ai.onnx opset that first hold
it, and how ONNX Runtime's and OpenVINO's Python APIs carry an array of it.

Our dtype name (what `TensorSpec.dtype` holds) is NumPy's name for the dtype,
with ml_dtypes supplying the types NumPy lacks ("int4", "uint4", "bfloat16",
"float8_e4m3fn", ...), exactly as `onnx.numpy_helper.to_array` returns them.
The ONNX codes are `onnx.TensorProto.DataType` values, written out here so
that the low layers need no onnx import (a test checks them against onnx).
oneDNN's names are those of its graph JSON (`"s8"`, `"bf16"`, ...).

Every dtype conversion in the product goes through this table, and a new code type is a row
here (and the kernel's): `dyndq.plumbing.ir` stamps IR versions from its `ir`, the lowerings
choose opsets from its `opset`, dyndq's ONNX Runtime and OpenVINO runners feed and read it as
its `onnxruntime` and `openvino` say.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers int4, bfloat16, ... as NumPy dtypes)
import numpy as np


# How each engine's Python API carries an array of a type in and out (dyndq's runners read these):
# ONNX Runtime (dyndq.ort_session):
ORT_NUMPY = "numpy"  # as a NumPy array, both ways
ORT_BITS = "bits"  # in: an OrtValue of the ONNX type over the array's bit patterns; out: through a Cast to float32
ORT_WIDE = "wide"  # in and out through an exact Cast from and to int8/uint8 (int4/uint4)
ORT_PACKED = "packed"  # in: an OrtValue filled with the bytes ONNX packs for the array; never out
# OpenVINO (dyndq.openvino_session): an array of a NumPy dtype goes in as it is, an ml_dtypes one as an
# openvino.Tensor of the row's OpenVINO type over the bytes ONNX packs for it; None: no such type there.


@dataclass(frozen=True)
class DType:
    """One element type: its names in each place, its width, the ONNX versions that first hold it,
    and how each engine's Python API carries it."""

    name: str  # our name: NumPy's / ml_dtypes' ("float32", "int4", "bfloat16")
    onnx: int  # onnx.TensorProto.DataType value
    onnx_name: str  # onnx.TensorProto.DataType name ("FLOAT", "INT4")
    onednn: str | None = None  # oneDNN graph's name ("f32", "s4"), when oneDNN has the type
    numpy_type: bool = True  # whether NumPy (with ml_dtypes) has a dtype for it
    bits: int = 0  # bits per element (4 for int4/uint4, whose NumPy arrays still use a byte each)
    ir: int = 0  # the IR version that first has the type (onnx.proto), 0 for the first IR versions' types
    # the ai.onnx opset whose Cast (and DequantizeLinear, for a code type) first takes it, 0 for their
    # first versions' types (bfloat16: Cast's 13; its scales are Cast to float32 before a DequantizeLinear)
    opset: int = 0
    onnxruntime: str | None = None  # how ONNX Runtime's Python API carries it (ORT_*); None: it has no such tensors
    openvino: str | None = None  # OpenVINO's element type name ("f32", "bf16", "i4"); None: it has no such type

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype (ml_dtypes' for int4, bfloat16, float8 ...)."""
        if not self.numpy_type:
            raise LookupError(f"{self.name} has no NumPy dtype")
        return np.dtype(self.name)

    @property
    def ml_dtype(self) -> bool:
        """Whether its NumPy dtype is ml_dtypes' (NumPy has none): engines' Python APIs take no such array."""
        return self.numpy_type and self.numpy.isbuiltin == 2  # (a user-defined type: its kind says nothing)

    @property
    def is_integer(self) -> bool:
        return self.name in _INTEGERS

    @property
    def is_float(self) -> bool:
        return self.name in _FLOATS

    def __str__(self) -> str:
        return self.name


_N, _B, _W, _P = ORT_NUMPY, ORT_BITS, ORT_WIDE, ORT_PACKED
_ROWS = (
    # name              ONNX  ONNX name        oneDNN      bits IR opset ONNX Runtime OpenVINO
    ("float32",            1, "FLOAT",          "f32",        32, 0,  0,   _N,          "f32"),
    ("uint8",              2, "UINT8",          "u8",          8, 0,  0,   _N,          "u8"),
    ("int8",               3, "INT8",           "s8",          8, 0,  0,   _N,          "i8"),
    ("uint16",             4, "UINT16",         None,         16, 0,  21,  _N,          "u16"),
    ("int16",              5, "INT16",          None,         16, 0,  21,  _N,          "i16"),
    ("int32",              6, "INT32",          "s32",        32, 0,  0,   _N,          "i32"),
    ("int64",              7, "INT64",          "s64",        64, 0,  0,   _N,          "i64"),
    ("string",             8, "STRING",         None,          0, 0,  0,   _N,          None),
    ("bool",               9, "BOOL",           "boolean",     8, 0,  0,   _N,          "boolean"),
    ("float16",           10, "FLOAT16",        "f16",        16, 0,  0,   _N,          "f16"),
    ("float64",           11, "DOUBLE",         "f64",        64, 0,  0,   _N,          "f64"),
    ("uint32",            12, "UINT32",         None,         32, 0,  0,   _N,          "u32"),
    ("uint64",            13, "UINT64",         None,         64, 0,  0,   _N,          "u64"),
    ("complex64",         14, "COMPLEX64",      None,         64, 0,  0,   _N,          None),
    ("complex128",        15, "COMPLEX128",     None,        128, 0,  0,   _N,          None),
    ("bfloat16",          16, "BFLOAT16",       "bf16",       16, 0,  13,  _B,          "bf16"),
    ("float8_e4m3fn",     17, "FLOAT8E4M3FN",   "f8_e4m3",     8, 9,  19,  _B,          "f8e4m3"),
    ("float8_e4m3fnuz",   18, "FLOAT8E4M3FNUZ", None,          8, 9,  19,  _B,          None),
    ("float8_e5m2",       19, "FLOAT8E5M2",     "f8_e5m2",     8, 9,  19,  _B,          "f8e5m2"),
    ("float8_e5m2fnuz",   20, "FLOAT8E5M2FNUZ", None,          8, 9,  19,  _B,          None),
    ("uint4",             21, "UINT4",          "u4",          4, 10, 21,  _W,          "u4"),
    ("int4",              22, "INT4",           "s4",          4, 10, 21,  _W,          "i4"),
    ("float4_e2m1fn",     23, "FLOAT4E2M1",     "f4_e2m1",     4, 11, 23,  None,        "f4e2m1"),
    ("float8_e8m0fnu",    24, "FLOAT8E8M0",     "e8m0",        8, 12, 24,  _B,          "f8e8m0"),
    ("uint2",             25, "UINT2",          None,          2, 13, 25,  _P,          None),
    ("int2",              26, "INT2",           None,          2, 13, 25,  _P,          None),
    ("float6_e2m3fn",     27, "FLOAT6E2M3",     None,          6, 14, 28,  None,        None),
    ("float6_e3m2fn",     28, "FLOAT6E3M2",     None,          6, 14, 28,  None,        None),
)
_INTEGERS = {"uint8", "int8", "uint16", "int16", "int32", "int64", "uint32", "uint64", "uint4", "int4", "uint2", "int2"}
_FLOATS = {"float32", "float16", "float64", "bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
           "float8_e5m2fnuz", "float4_e2m1fn", "float8_e8m0fnu", "float6_e2m3fn", "float6_e3m2fn"}


def _has_numpy(name: str) -> bool:
    if name == "string":
        return False
    try:
        np.dtype(name)
    except TypeError:
        return False
    return True


DTYPES: tuple[DType, ...] = tuple(
    DType(n, code, onnx_name, onednn, _has_numpy(n), bits, ir, opset, ort, ov)
    for n, code, onnx_name, onednn, bits, ir, opset, ort, ov in _ROWS)
_BY_NAME = {d.name: d for d in DTYPES}
_BY_ONNX = {d.onnx: d for d in DTYPES}
_BY_ONEDNN = {d.onednn: d for d in DTYPES if d.onednn}


def by_name(name: str) -> DType:
    """The row of a dtype name ("float32", "int4"); KeyError for a name not in the table."""
    return _BY_NAME[name]


def by_onnx(code: int) -> DType:
    """The row of an ONNX element type (TensorProto.FLOAT ...); KeyError for an unknown one."""
    return _BY_ONNX[int(code)]


def by_onednn(name: str) -> DType:
    """The row of a oneDNN graph dtype name ("f32", "s4"); KeyError for an unknown one."""
    return _BY_ONEDNN[name]


def of(dtype) -> DType:
    """The row of a NumPy dtype (or anything np.dtype takes); KeyError when the table lacks it."""
    return _BY_NAME[np.dtype(dtype).name]


def name_of(dtype) -> str:
    """Our name of a NumPy dtype: its NumPy name ("float32", "int4", ">f4" -> "float32")."""
    return np.dtype(dtype).name


def narrow_integer_bits(row: DType) -> int | None:
    """2, 4 or 8 for an integer type of at most a byte (the codes of ONNX Runtime's MatMulNBits and
    GatherBlockQuantized, and of its round to nearest); None for any other type."""
    return row.bits if row.is_integer and row.bits <= 8 else None


def integer_range(dtype) -> tuple[int, int]:
    """(smallest, largest) value of an integer dtype (int4: -8, 7)."""
    row = dtype if isinstance(dtype, DType) else (by_name(dtype) if isinstance(dtype, str) else of(dtype))
    if not row.is_integer:
        raise TypeError(f"{row.name} is not an integer dtype")
    signed = not row.name.startswith("u")
    return (-(1 << (row.bits - 1)), (1 << (row.bits - 1)) - 1) if signed else (0, (1 << row.bits) - 1)
