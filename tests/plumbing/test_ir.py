"""dyndq.plumbing.ir: the lowest IR version a model needs, from its opsets, its functions and every
element type it holds anywhere (an input, an initializer, a body's value, a Constant, a Cast's `to`).
The IR version of each type is the dtype table's, held to onnx.proto by tests/opdefs/test_dtypes.py;
the numbers here (IR 7 for opset 13, 10 for opset 21 and int4, 13 for int2) are onnx.proto's."""
import numpy as np
from onnx import TensorProto as T, helper, numpy_helper as nh

from dyndq.plumbing.ir import FUNCTIONS_IR, attribute_types, model_ir, types_ir


def model(nodes=(), opset=13, inputs=(), initializers=(), functions=()):
    graph = helper.make_graph(list(nodes), "g", list(inputs), [helper.make_tensor_value_info("y", T.FLOAT, [1])],
                              list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], functions=list(functions))


def test_the_opsets_alone_decide_when_every_type_is_an_old_one():
    assert model_ir(model(opset=13)) == 7
    assert model_ir(model(opset=21)) == 10
    assert types_ir(model(inputs=[helper.make_tensor_value_info("x", T.BFLOAT16, [1])])) == 0


def test_an_element_type_anywhere_needs_its_ir_version():
    assert model_ir(model(inputs=[helper.make_tensor_value_info("x", T.INT4, [2])])) == 10
    assert model_ir(model(initializers=[helper.make_tensor("w", T.INT2, [2], [1, -1])])) == 13
    body = helper.make_graph([helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", T.INT4, [1], [1]))],
                             "then", [], [helper.make_tensor_value_info("k", T.INT4, [1])])
    other = helper.make_graph([], "else", [], [helper.make_tensor_value_info("k", T.INT4, [1])])
    branch = helper.make_node("If", ["c"], ["k"], then_branch=body, else_branch=other)
    assert model_ir(model([branch], inputs=[helper.make_tensor_value_info("c", T.BOOL, [])])) == 10
    cast = helper.make_node("Cast", ["x"], ["y"], to=T.FLOAT8E8M0)
    assert model_ir(model([cast])) == 12


def test_a_model_local_function_needs_ir_8_and_its_constants_types_count():
    plain = helper.make_function("local", "F", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                 [helper.make_opsetid("", 13)])
    assert model_ir(model(functions=[plain], opset=13)) == FUNCTIONS_IR == 8
    codes = helper.make_function("local", "G", [], ["b"], [
        helper.make_node("Constant", [], ["b"], value=nh.from_array(np.zeros(1, np.float32), "b")),
        helper.make_node("Constant", [], ["u"], value=helper.make_tensor("u", T.UINT2, [1], [3]))],
        [helper.make_opsetid("", 25)])
    assert model_ir(model(functions=[codes], opset=13)) == 13


def test_attribute_types_are_those_of_tensor_attributes_and_casts():
    nodes = [helper.make_node("Constant", [], ["k"], value=helper.make_tensor("k", T.INT4, [1], [1])),
             helper.make_node("Cast", ["x"], ["y"], to=T.BFLOAT16),
             helper.make_node("Relu", ["y"], ["z"])]
    assert attribute_types(nodes) == {T.INT4, T.BFLOAT16}
