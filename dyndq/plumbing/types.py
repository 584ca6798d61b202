"""Between ONNX's protos and our data: type protos <-> TensorSpec, attribute kinds <-> ONNX's enums.

Part of the ONNX plumbing below converters/: the lowerings and liftings need it, and
converters/ never imports the face.  Element types go through the one
dtype table (`dyndq.opdefs.dtypes`); attribute kinds map to ONNX's enums here
and nowhere else (schema registration, `check` and the CLI's schema table use it).
"""
from __future__ import annotations

import onnx
from onnx import AttributeProto, TensorProto
from onnx.defs import OpSchema

from dyndq.opdefs import AttrKind, TensorSpec, dtypes

# -- element types ------------------------------------------------------------------------------


def dtype_name(elem_type: int) -> str | None:
    """Our dtype name of an ONNX element type (None for UNDEFINED; ONNX's own name,
    lower-cased, for a type the table does not know yet)."""
    if elem_type == TensorProto.UNDEFINED:
        return None
    try:
        return dtypes.by_onnx(elem_type).name
    except KeyError:
        return TensorProto.DataType.Name(elem_type).lower() if elem_type in TensorProto.DataType.values() else f"type{elem_type}"


def elem_type(dtype) -> int:
    """ONNX's element type for a dtype name, a NumPy dtype, or an ONNX element type itself."""
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype
    name = dtype if isinstance(dtype, str) else dtypes.name_of(dtype)
    return dtypes.by_name(name).onnx


def onnx_type_string(dtype) -> str:
    """ONNX's name of a tensor type, as in schemas: "tensor(float)", "tensor(int4)"."""
    return f"tensor({dtypes.by_onnx(elem_type(dtype)).onnx_name.lower()})"


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


def open_dim(dim) -> bool:
    """Whether a dimension of a spec (`spec_of_type`'s) leaves its size open: a symbol (dim_param),
    no value at all, or a negative dim_value (-1, as exporters such as paddle2onnx write a dynamic
    one, and ONNX Runtime reads it). A dim_value of 0 is a fixed size: ONNX's IR gives a
    dim_value as the dimension's size and empty tensors are valid, and ONNX Runtime refuses a
    feed of any other size there."""
    return not isinstance(dim, int) or dim < 0


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


# -- attributes ---------------------------------------------------------------------------------

# Each kind of our attribute vocabulary and ONNX's names for it: AttrKind's names are ONNX's.
ATTRIBUTE_PROTO_TYPE = {k: AttributeProto.AttributeType.Value(k.name) for k in AttrKind}
SCHEMA_ATTR_TYPE = {k: getattr(OpSchema.AttrType, k.name) for k in AttrKind}


def attribute_type_name(kind: AttrKind) -> str:
    """ONNX's name of an attribute kind: "INT", "INTS", "FLOAT", "STRING"."""
    return AttributeProto.AttributeType.Name(ATTRIBUTE_PROTO_TYPE[kind])


def attribute_value(attr: AttributeProto):
    """One attribute as a Python value (strings decoded; lists of ints as tuples)."""
    v = onnx.helper.get_attribute_value(attr)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if attr.type in (AttributeProto.INTS, AttributeProto.FLOATS):
        return tuple(v)
    return v


def repeated_attributes(node: onnx.NodeProto) -> list[str]:
    """The names of the attributes a node carries more than once, each once, in order."""
    names = [a.name for a in node.attribute]
    return list(dict.fromkeys(n for n in names if names.count(n) > 1))


def attribute_values(node: onnx.NodeProto) -> dict:
    """A node's attributes as Python values (the last one wins for a name given twice)."""
    return {a.name: attribute_value(a) for a in node.attribute}


def make_attribute(name: str, value, kind: AttrKind) -> AttributeProto:
    """An AttributeProto of our kind (so that an empty INTS list still gets its type)."""
    return onnx.helper.make_attribute(name, list(value) if kind is AttrKind.INTS else value,
                                      attr_type=ATTRIBUTE_PROTO_TYPE[kind])


def untyped_tensor(tp: onnx.TypeProto | None) -> bool:
    """A tensor type whose element type is UNDEFINED (0): what a model declares for a value
    whose type nobody knows (e.g. one made by an op of an unknown domain).  Read as unknown;
    ONNX's dtype tables raise ValueError on it."""
    return tp is not None and tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.elem_type == 0
