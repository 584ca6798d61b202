"""IR versions: the lowest a model's opsets, functions and element types need.

onnx.helper.find_min_ir_version_for knows opsets only; a model holding an element type newer
than the first IR versions (anywhere: an input, an initializer, a value_info, a Constant)
needs that IR version whatever its opsets are, and model-local functions need IR 8.  Export,
lift and quantize stamp what these rules give: `make_model` stamps the newest IR version,
which ONNX Runtime may refuse (1.31 loads IR <= 13 while onnx 1.23 stamps 14).
"""
from __future__ import annotations

import onnx

from dyndq.opdefs import dtypes

from .walk import graphs

# Model-local functions need at least this IR version.
FUNCTIONS_IR = 8
INT4_IR = dtypes.by_name("int4").ir


def type_ir(elem: int) -> int:
    """The IR version that first has element type `elem` (the dtype table's, from onnx.proto: 9
    float8, 10 int4/uint4, 11 float4e2m1, 12 float8e8m0, 13 int2/uint2, 14 float6); 0 for the
    first IR versions' types and for a code the table lacks."""
    try:
        return dtypes.by_onnx(elem).ir
    except KeyError:
        return 0


def ir_version_for(opset_imports) -> int:
    """The lowest IR version the opsets need."""
    return onnx.helper.find_min_ir_version_for(list(opset_imports), ignore_unknown=True)


def model_ir(model: onnx.ModelProto) -> int:
    """The lowest IR version the model needs: its opsets, its functions, its element types."""
    ir = max(ir_version_for(model.opset_import), types_ir(model))
    return max(ir, FUNCTIONS_IR) if len(model.functions) else ir


def types_ir(model: onnx.ModelProto) -> int:
    """The lowest IR version the element types the model holds need (0 when any will do)."""
    found = set()

    def visit_type(tp: onnx.TypeProto) -> None:
        kind = tp.WhichOneof("value")
        if kind == "tensor_type":
            found.add(tp.tensor_type.elem_type)
        elif kind == "sparse_tensor_type":
            found.add(tp.sparse_tensor_type.elem_type)
        elif kind in ("sequence_type", "optional_type"):
            visit_type(getattr(tp, kind).elem_type)
        elif kind == "map_type":
            visit_type(tp.map_type.value_type)

    for g in graphs(model.graph):
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            visit_type(vi.type)
        found.update(t.data_type for t in g.initializer)
        found.update(attribute_types(g.node))
    for f in model.functions:
        found.update(attribute_types(f.node))
    return max((type_ir(t) for t in found), default=0)


def attribute_types(nodes) -> set[int]:
    """The element types nodes make: of their tensor attributes (Constant) and Cast's `to`."""
    found = set()
    for node in nodes:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                found.add(a.t.data_type)
            elif a.name == "to" and a.type == onnx.AttributeProto.INT:
                found.add(a.i)
    return found
