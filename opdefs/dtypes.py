"""The one dtype table: ONNX element type <-> our dtype name <-> NumPy dtype <-> oneDNN's name.

Our dtype name (what `TensorSpec.dtype` holds) is NumPy's name for the dtype,
with ml_dtypes supplying the types NumPy lacks ("int4", "uint4", "bfloat16",
"float8_e4m3fn", ...), exactly as `onnx.numpy_helper.to_array` returns them.
The ONNX codes are `onnx.TensorProto.DataType` values, written out here so
that the low layers need no onnx import (a test checks them against onnx).
oneDNN's names are those of its graph JSON (`"s8"`, `"bf16"`, ...).

Every dtype conversion in the product goes through this table.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # noqa: F401  (registers int4, bfloat16, ... as NumPy dtypes)
import numpy as np


@dataclass(frozen=True)
class DType:
    name: str  # our name: NumPy's / ml_dtypes' ("float32", "int4", "bfloat16")
    onnx: int  # onnx.TensorProto.DataType value
    onnx_name: str  # onnx.TensorProto.DataType name ("FLOAT", "INT4")
    onednn: str | None = None  # oneDNN graph's name ("f32", "s4"), when oneDNN has the type
    numpy_type: bool = True  # whether NumPy (with ml_dtypes) has a dtype for it

    @property
    def numpy(self) -> np.dtype:
        """The NumPy dtype (ml_dtypes' for int4, bfloat16, float8 ...)."""
        if not self.numpy_type:
            raise LookupError(f"{self.name} has no NumPy dtype")
        return np.dtype(self.name)

    @property
    def bits(self) -> int:
        """Bits per element (4 for int4/uint4, whose NumPy arrays still use a byte each)."""
        return _BITS.get(self.name, self.numpy.itemsize * 8 if self.numpy_type else 0)

    @property
    def is_integer(self) -> bool:
        return self.name in _INTEGERS

    @property
    def is_float(self) -> bool:
        return self.name in _FLOATS

    def __str__(self) -> str:
        return self.name


_ROWS = (
    # name, ONNX code, ONNX name, oneDNN name
    ("float32", 1, "FLOAT", "f32"),
    ("uint8", 2, "UINT8", "u8"),
    ("int8", 3, "INT8", "s8"),
    ("uint16", 4, "UINT16", None),
    ("int16", 5, "INT16", None),
    ("int32", 6, "INT32", "s32"),
    ("int64", 7, "INT64", "s64"),
    ("string", 8, "STRING", None),
    ("bool", 9, "BOOL", "boolean"),
    ("float16", 10, "FLOAT16", "f16"),
    ("float64", 11, "DOUBLE", "f64"),
    ("uint32", 12, "UINT32", None),
    ("uint64", 13, "UINT64", None),
    ("complex64", 14, "COMPLEX64", None),
    ("complex128", 15, "COMPLEX128", None),
    ("bfloat16", 16, "BFLOAT16", "bf16"),
    ("float8_e4m3fn", 17, "FLOAT8E4M3FN", "f8_e4m3"),
    ("float8_e4m3fnuz", 18, "FLOAT8E4M3FNUZ", None),
    ("float8_e5m2", 19, "FLOAT8E5M2", "f8_e5m2"),
    ("float8_e5m2fnuz", 20, "FLOAT8E5M2FNUZ", None),
    ("uint4", 21, "UINT4", "u4"),
    ("int4", 22, "INT4", "s4"),
    ("float4_e2m1fn", 23, "FLOAT4E2M1", "f4_e2m1"),
    ("float8_e8m0fnu", 24, "FLOAT8E8M0", "e8m0"),
    ("uint2", 25, "UINT2", None),
    ("int2", 26, "INT2", None),
    ("float6_e2m3fn", 27, "FLOAT6E2M3", None),
    ("float6_e3m2fn", 28, "FLOAT6E3M2", None),
)
_BITS = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2, "float4_e2m1fn": 4, "float6_e2m3fn": 6, "float6_e3m2fn": 6}
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


DTYPES: tuple[DType, ...] = tuple(DType(n, code, onnx_name, onednn, _has_numpy(n)) for n, code, onnx_name, onednn in _ROWS)
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


def integer_range(dtype) -> tuple[int, int]:
    """(smallest, largest) value of an integer dtype (int4: -8, 7)."""
    row = dtype if isinstance(dtype, DType) else (by_name(dtype) if isinstance(dtype, str) else of(dtype))
    if not row.is_integer:
        raise TypeError(f"{row.name} is not an integer dtype")
    signed = not row.name.startswith("u")
    return (-(1 << (row.bits - 1)), (1 << (row.bits - 1)) - 1) if signed else (0, (1 << row.bits) - 1)
