"""opdefs/dtypes.py, the one dtype table: each row against onnx and ml_dtypes, its IR version and
first opset against what ONNX defines, and each engine's carriage against the runners' own tests."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx.defs
import pytest

from dyndq.opdefs import DYNAMIC_DEQUANTIZE_3, dtypes


@pytest.mark.parametrize("row", dtypes.DTYPES, ids=str)
def test_each_row_names_onnxs_type_and_its_numpy_dtype(row):
    assert onnx.TensorProto.DataType.Name(row.onnx) == row.onnx_name
    if row.numpy_type:
        assert onnx.helper.tensor_dtype_to_np_dtype(row.onnx) == row.numpy
        assert dtypes.of(row.numpy) is row


@pytest.mark.parametrize("row", [d for d in dtypes.DTYPES if d.numpy_type], ids=str)
def test_each_rows_bits_are_its_dtypes(row):
    """ml_dtypes' own width for its types (int4 is 4 bits in a byte), NumPy's item size for the others."""
    info = (ml_dtypes.iinfo if row.is_integer else ml_dtypes.finfo) if row.ml_dtype else None
    assert row.bits == (info(row.numpy).bits if info else row.numpy.itemsize * 8)


# the IR version that first has each type, as onnx.proto's comments give them (IR 9 float8, 10 int4, 11
# float4e2m1, 12 float8e8m0, 13 int2, 14 float6): an oracle of its own, onnx has no table of them
IR = {"float8_e4m3fn": 9, "float8_e4m3fnuz": 9, "float8_e5m2": 9, "float8_e5m2fnuz": 9, "int4": 10, "uint4": 10,
      "float4_e2m1fn": 11, "float8_e8m0fnu": 12, "int2": 13, "uint2": 13, "float6_e2m3fn": 14, "float6_e3m2fn": 14}


def test_each_rows_ir_version_is_onnx_protos():
    assert {d.name: d.ir for d in dtypes.DTYPES if d.ir} == IR


def _first(op: str, dtype: str) -> int:
    """The first version of ai.onnx's `op` whose type constraints take `dtype` (0: its first version)."""
    name = onnx.helper.tensor_dtype_to_string(dtypes.by_name(dtype).onnx).removeprefix("TensorProto.").lower()
    versions = sorted({onnx.defs.get_schema(op, v).since_version for v in range(1, onnx.defs.onnx_opset_version() + 1)
                       if onnx.defs.has(op, v)})
    for v in versions:
        if any(f"tensor({name})" in c.allowed_type_strs for c in onnx.defs.get_schema(op, v).type_constraints):
            return 0 if v == versions[0] else v
    raise AssertionError(f"no version of {op} takes {dtype}")


@pytest.mark.parametrize("dtype", sorted(set(DYNAMIC_DEQUANTIZE_3.allowed_dtypes("src"))
                                         | set(DYNAMIC_DEQUANTIZE_3.allowed_dtypes("scales"))))
def test_each_rows_first_opset_is_the_one_onnx_defs_give(dtype):
    """A code type: the first opset whose Cast and DequantizeLinear both take it; a scale type: its Cast's
    (bfloat16 scales are Cast to float32 before a DequantizeLinear)."""
    codes = DYNAMIC_DEQUANTIZE_3.allowed_dtypes("src")
    want = max(_first("Cast", dtype), _first("DequantizeLinear", dtype) if dtype in codes else 0)
    assert dtypes.by_name(dtype).opset == want


def test_each_engines_carriage_is_one_its_runner_knows():
    assert {d.onnxruntime for d in dtypes.DTYPES} <= {dtypes.ORT_NUMPY, dtypes.ORT_BITS, dtypes.ORT_WIDE,
                                                      dtypes.ORT_PACKED, None}
    # the types ONNX Runtime's Python API takes as NumPy arrays are NumPy's own
    assert all(not d.ml_dtype for d in dtypes.DTYPES if d.onnxruntime == dtypes.ORT_NUMPY)
    assert all(d.bits == 4 and d.is_integer for d in dtypes.DTYPES if d.onnxruntime == dtypes.ORT_WIDE)
    openvino = [d.openvino for d in dtypes.DTYPES if d.openvino]
    assert len(set(openvino)) == len(openvino)  # (an OpenVINO type reads back as one ONNX type)


def test_a_user_defined_dtype_is_told_apart_whatever_its_kind():
    """ml_dtypes' float8_e5m2 says its kind is "f": what marks ml_dtypes' types is that NumPy does not define them."""
    assert np.dtype(ml_dtypes.float8_e5m2).kind == "f" and dtypes.by_name("float8_e5m2").ml_dtype
    assert not dtypes.by_name("float16").ml_dtype and not dtypes.by_name("string").ml_dtype


def test_the_narrow_integer_types_are_the_code_types_of_a_byte_or_less():
    """The code types ONNX Runtime's fused ops and its round to nearest take (fused.py, verification/codes.py)."""
    narrow = {d.name: dtypes.narrow_integer_bits(d) for d in dtypes.DTYPES if dtypes.narrow_integer_bits(d)}
    assert narrow == {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "int8": 8, "uint8": 8}
