"""A light view of a model: its structure and types without the data of its big initializers.

ONNX's checker, shape inference and version converter take a model by serializing it,
and a protobuf message cannot pass 2 GiB: a model with more weights than that (kept
as external data on disk, which exists for exactly this) raised EncodeError in check,
export and run.  None of those need the weights' values, only their names, dtypes and
shapes, so they are given this view: every initializer of the main graph bigger than
`BIG` becomes a graph input of the same type (what ONNX infers from an initializer is
its type), and its bytes are not copied.  The view holds the weights of no big tensor,
so it costs next to nothing whatever the model's size.
"""
from __future__ import annotations

import onnx
from google.protobuf.descriptor import FieldDescriptor

from dyndq.opdefs import dtypes

BIG = 1 << 20  # bytes: smaller initializers stay in the view (their values may matter, e.g. a Reshape's shape)


def big_initializers(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in model.graph.initializer if nbytes(t) > BIG]


def nbytes(tensor: onnx.TensorProto) -> int:
    """The size of a tensor's data, from its dims and dtype. (Not ByteSize() nor len(raw_data):
    with protobuf's upb backend each of those builds a copy of the data, doubling the memory a
    2 GiB tensor takes.)"""
    count = 1
    for d in tensor.dims:
        count *= d
    try:
        itemsize = dtypes.by_onnx(tensor.data_type).numpy.itemsize
    except (KeyError, LookupError, TypeError, ValueError):  # strings and the like: one byte per element
        itemsize = 1
    return count * itemsize


def light_view(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model itself when it has no big initializer; else a copy without their data."""
    return initializers_as_inputs(model, {t.name for t in big_initializers(model)})


def initializers_as_inputs(model: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """The model itself when `names` is empty; else a copy in which each initializer of the main
    graph named in `names`, and each Constant node of it making a tensor so named, is a graph input
    of its type and shape instead, its data left out."""
    from .walk import is_constant_node

    if not names:
        return model
    light = onnx.ModelProto()
    copy_fields(model, light, skip={"graph"})
    copy_fields(model.graph, light.graph, skip={"initializer", "node"})
    inputs = {vi.name for vi in model.graph.input}
    for t in model.graph.initializer:
        if t.name not in names:
            light.graph.initializer.append(t)
        elif t.name not in inputs:  # (IR < 4 lists initializers among the inputs already)
            light.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    for node in model.graph.node:
        value = node.attribute[0] if is_constant_node(node) and node.output[0] in names else None
        if value is None or value.type != onnx.AttributeProto.TENSOR:
            light.graph.node.append(node)
        else:
            light.graph.input.append(onnx.helper.make_tensor_value_info(node.output[0], value.t.data_type,
                                                                        list(value.t.dims)))
    return light


def copy_fields(src, dst, skip: set[str]) -> None:
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        repeated = fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == FieldDescriptor.LABEL_REPEATED  # (protobuf 6 / older)
        if repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def stored_bytes(t: onnx.TensorProto) -> int:
    """A tensor's bytes as the model stores them: its raw_data (sub-byte codes packed), else its
    size from dims and dtype (nbytes). The benchmarks measure sizes with it too."""
    return len(t.raw_data) if t.HasField("raw_data") else nbytes(t)
