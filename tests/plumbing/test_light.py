"""dyndq.plumbing.light: a view of a model without the data of its big initializers (what ONNX's
checker, shape inference and version converter are given, so that a model over 2 GiB never passes
through one protobuf message), and tensor sizes counted from dims and dtypes."""
import ml_dtypes
import numpy as np
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.plumbing.light import BIG, initializers_as_inputs, light_view, nbytes, stored_bytes


def test_the_light_view_keeps_types_not_data():
    w = nh.from_array(np.zeros(BIG + 1, np.int8), "w")
    g = helper.make_graph([helper.make_node("Identity", ["w"], ["y"])], "g", [],
                          [helper.make_tensor_value_info("y", T.INT8, [BIG + 1])], [w, nh.from_array(np.ones(3, np.int8), "small")])
    m = dyndq.make_model(g)
    light = light_view(m)
    assert [t.name for t in light.graph.initializer] == ["small"]
    assert [(vi.name, vi.type.tensor_type.elem_type) for vi in light.graph.input] == [("w", T.INT8)]
    assert light.ByteSize() < 1000 and len(m.graph.initializer) == 2  # the model itself is untouched
    assert nbytes(w) == BIG + 1


def test_a_model_with_nothing_big_is_its_own_view():
    m = dyndq.make_model(helper.make_graph([], "g", [], [], [nh.from_array(np.ones(3, np.int8), "small")]))
    assert light_view(m) is m and initializers_as_inputs(m, set()) is m


def test_a_constant_node_named_becomes_an_input_of_its_type_and_shape():
    nodes = [helper.make_node("Constant", [], ["k"], value=nh.from_array(np.ones((2, 3), np.float16), "k")),
             helper.make_node("Identity", ["k"], ["y"])]
    m = dyndq.make_model(helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", T.FLOAT16, [2, 3])]))
    view = initializers_as_inputs(m, {"k"})
    assert [n.op_type for n in view.graph.node] == ["Identity"] and len(m.graph.node) == 2
    [k] = view.graph.input
    assert (k.name, k.type.tensor_type.elem_type, [d.dim_value for d in k.type.tensor_type.shape.dim]) == ("k", T.FLOAT16, [2, 3])


def test_sizes_from_dims_and_dtypes_and_as_stored():
    codes = nh.from_array(np.zeros((4, 5), ml_dtypes.int4), "q")
    assert nbytes(codes) == 20  # (one element per byte, as NumPy holds int4)
    assert stored_bytes(codes) == 10  # packed two per byte on disk
    assert nbytes(helper.make_tensor("f", T.FLOAT, [3, 0], [])) == 0
