"""dyndq.plumbing.types: ONNX's type protos and element types <-> our dtype names and TensorSpec, and
attribute kinds <-> ONNX's enums, each written here once."""
import ml_dtypes
import numpy as np
import onnx
from onnx import AttributeProto, TensorProto as T, helper

from dyndq.opdefs import AttrKind, TensorSpec
from dyndq.plumbing.types import (attribute_type_name, attribute_value, attribute_values, dtype_name, elem_type,
                                  make_attribute, onnx_type_string, open_dim, repeated_attributes, spec_of_type,
                                  type_of_spec, untyped_tensor)


def test_element_types_and_dtype_names():
    assert dtype_name(T.UNDEFINED) is None
    assert [dtype_name(t) for t in (T.FLOAT, T.INT4, T.BFLOAT16, T.FLOAT8E8M0)] == [
        "float32", "int4", "bfloat16", "float8_e8m0fnu"]
    assert dtype_name(T.STRING) == "string"  # (a type the table does not hold: ONNX's own name)
    assert dtype_name(1234) == "type1234"
    assert elem_type("int4") == elem_type(ml_dtypes.int4) == T.INT4
    assert elem_type(np.float16) == elem_type(np.dtype("float16")) == T.FLOAT16
    assert elem_type(T.UINT2) == T.UINT2
    assert onnx_type_string("float8_e4m3fn") == "tensor(float8e4m3fn)"
    assert onnx_type_string(np.float32) == "tensor(float)"


def test_a_spec_and_a_type_proto_map_both_ways():
    tp = helper.make_tensor_type_proto(T.INT8, [2, "n", None])
    spec = spec_of_type(tp)
    assert spec == TensorSpec("int8", (2, "n", None))
    back = type_of_spec(spec)
    assert spec_of_type(back) == spec
    assert spec_of_type(helper.make_tensor_type_proto(T.FLOAT, None)) == TensorSpec("float32", None)
    assert type_of_spec(TensorSpec("float32", ())).tensor_type.HasField("shape")  # rank 0 keeps its (empty) shape
    assert spec_of_type(helper.make_sequence_type_proto(tp)) is None and spec_of_type(None) is None
    like = helper.make_tensor_type_proto(T.FLOAT, ["batch", 4])
    like.tensor_type.shape.dim[0].denotation = "DATA_BATCH"
    copied = type_of_spec(TensorSpec("float16", (7, 4)), like=like)
    assert copied.tensor_type.elem_type == T.FLOAT16 and copied.tensor_type.shape == like.tensor_type.shape


def test_open_dims_are_symbols_none_and_negative_sizes_never_zero():
    assert [open_dim(d) for d in ("n", None, -1, 0, 3)] == [True, True, True, False, False]


def test_attribute_values_and_kinds():
    node = helper.make_node("X", [], [], qtype="per_group", group_shape=[1, 32], axis=0, alpha=0.5)
    assert attribute_values(node) == {"qtype": "per_group", "group_shape": (1, 32), "axis": 0, "alpha": 0.5}
    node.attribute.append(helper.make_attribute("axis", 1))
    assert repeated_attributes(node) == ["axis"] and attribute_values(node)["axis"] == 1  # the last one wins
    assert attribute_value(helper.make_attribute("s", b"\xff")) == "\ufffd"
    empty = make_attribute("group_shape", [], AttrKind.INTS)
    assert empty.type == AttributeProto.INTS and list(empty.ints) == []
    assert [attribute_type_name(k) for k in AttrKind] == [k.name for k in AttrKind]
    assert {attribute_type_name(k) for k in AttrKind} >= {"INT", "INTS", "FLOAT", "STRING"}


def test_an_undefined_element_type_is_untyped():
    assert untyped_tensor(helper.make_tensor_type_proto(T.UNDEFINED, [1]))
    assert not untyped_tensor(helper.make_tensor_type_proto(T.FLOAT, [1]))
    assert not untyped_tensor(onnx.TypeProto()) and not untyped_tensor(None)
