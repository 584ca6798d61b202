"""Between ONNX's type protos and our TensorSpec / NumPy dtype names."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from dyndq.opdefs import TensorSpec

# ONNX names some types differently from NumPy ("FLOAT" is float32); the rest
# (bfloat16, float8 ..., string) have no NumPy dtype, so we name them as ONNX does.
_NUMPY_NAMES = {
    TensorProto.FLOAT: "float32",
    TensorProto.DOUBLE: "float64",
    TensorProto.FLOAT16: "float16",
    TensorProto.BOOL: "bool",
    TensorProto.INT8: "int8",
    TensorProto.UINT8: "uint8",
    TensorProto.INT16: "int16",
    TensorProto.UINT16: "uint16",
    TensorProto.INT32: "int32",
    TensorProto.UINT32: "uint32",
    TensorProto.INT64: "int64",
    TensorProto.UINT64: "uint64",
}


def dtype_name(elem_type: int) -> str | None:
    """NumPy's name for an ONNX element type (ONNX's own, lower-cased, if NumPy has none)."""
    if elem_type == TensorProto.UNDEFINED:
        return None
    if elem_type in _NUMPY_NAMES:
        return _NUMPY_NAMES[elem_type]
    return TensorProto.DataType.Name(elem_type).lower()


def elem_type(dtype) -> int:
    """ONNX's element type for a NumPy dtype (or its name)."""
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def onnx_type_string(dtype) -> str:
    """ONNX's name of a tensor type, as in schemas: "tensor(float)", "tensor(int8)"."""
    return f"tensor({TensorProto.DataType.Name(elem_type(dtype)).lower()})"


def spec_of_type(tp: onnx.TypeProto | None) -> TensorSpec | None:
    """The spec of a tensor TypeProto; None when it is not a tensor type."""
    if tp is None or tp.WhichOneof("value") != "tensor_type":
        return None
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return TensorSpec(dtype_name(tt.elem_type), None)
    dims = []
    for d in tt.shape.dim:
        kind = d.WhichOneof("value")
        dims.append(d.dim_value if kind == "dim_value" else d.dim_param if kind == "dim_param" else None)
    return TensorSpec(dtype_name(tt.elem_type), tuple(dims))


def type_of_spec(spec: TensorSpec, like: onnx.TypeProto | None = None) -> onnx.TypeProto:
    """A tensor TypeProto for a spec; dims are copied from `like` (keeping denotations) when given."""
    tp = onnx.TypeProto()
    tp.tensor_type.elem_type = elem_type(spec.dtype)
    if like is not None and like.tensor_type.HasField("shape"):
        tp.tensor_type.shape.CopyFrom(like.tensor_type.shape)
    elif spec.shape is not None:
        shape = tp.tensor_type.shape
        shape.SetInParent()  # rank 0 still needs an (empty) shape
        for d in spec.shape:
            dim = shape.dim.add()
            if isinstance(d, int):
                dim.dim_value = d
            elif isinstance(d, str):
                dim.dim_param = d
    return tp


def attribute_values(node: onnx.NodeProto) -> dict:
    """A node's attributes as Python values (strings decoded)."""
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return out
