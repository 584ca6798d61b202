"""dyndq.plumbing.function_inputs: a Constant node of a function holding a type the Constant of its
ai.onnx opset does not take (int2 beside opset 21: Constant-25 takes it) is passed in from the main
graph by `pass_out`, and taken back by `take_in`; an input the function's author wrote is never taken.
(The quantizer's use of it, in every format: tests/quantization/test_function_weights.py.)"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

from dyndq.plumbing.function_inputs import PASSED_IN, constant_holds, pass_out, take_in


def codes(name="q"):
    return helper.make_tensor(name, T.INT2, [4], [1, -1, 0, -2])


def model(outer_name="y"):
    """x -> local::F (Constant q: int2 codes, a Constant h: float32; custom::Scale(q, h) read by an
    Add of x).  The codes' reader is of a domain ONNX does not know, which its checker leaves alone,
    as it does the contrib ops the quantizer writes: so the Constant is all it judges of them."""
    f = helper.make_function("local", "F", ["a"], ["b"], [
        helper.make_node("Constant", [], ["q"], value=codes()),
        helper.make_node("Constant", [], ["h"], value=nh.from_array(np.full(4, 0.5, np.float32), "h")),
        helper.make_node("Scale", ["q", "h"], ["w"], domain="custom"),
        helper.make_node("Add", ["a", "w"], ["b"])], [helper.make_opsetid("", 21), helper.make_opsetid("custom", 1)])
    graph = helper.make_graph([helper.make_node("F", ["x"], [outer_name], domain="local")], "g",
                              [helper.make_tensor_value_info("x", T.FLOAT, [4])],
                              [helper.make_tensor_value_info(outer_name, T.FLOAT, [4])])
    return helper.make_model(graph, functions=[f], ir_version=11,
                             opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1),
                                            helper.make_opsetid("custom", 1)])


def test_a_constant_holds_what_its_opsets_constant_takes():
    at = lambda v: [helper.make_opsetid("", v)]  # noqa: E731
    assert constant_holds(T.INT4, at(21)) and constant_holds(T.FLOAT, at(13))
    assert not constant_holds(T.INT2, at(21)) and constant_holds(T.INT2, at(25))
    assert not constant_holds(T.FLOAT4E2M1, at(21)) and constant_holds(T.FLOAT4E2M1, at(23))
    assert not constant_holds(T.FLOAT, [helper.make_opsetid("local", 1)])  # (no ai.onnx import: none)


def test_codes_a_functions_opset_cannot_hold_are_passed_in_and_taken_back():
    m = model()
    with_constant = m.SerializeToString()
    m.ir_version = 13
    with pytest.raises(onnx.shape_inference.InferenceError, match=r"Constant.*int2"):  # (as written: refused)
        onnx.checker.check_model(m, full_check=True)
    m.ir_version = 11
    assert pass_out(m) == ["q"]
    f = m.functions[0]
    assert [n.output[0] for n in f.node if n.op_type == "Constant"] == ["h"]  # (float32 stays a Constant)
    assert list(f.input) == ["a", "q"] and list(m.graph.node[0].input) == ["x", "q"]
    assert [t.name for t in m.graph.initializer] == ["q"] and m.graph.initializer[0].data_type == T.INT2
    assert {p.key for p in f.metadata_props} == {PASSED_IN}
    m.ir_version = 13  # (int2 in the main graph needs IR 13; the model is otherwise unchanged)
    onnx.checker.check_model(m, full_check=True)
    m.ir_version = 11
    assert take_in(m) == ["q"]
    assert m.SerializeToString() == with_constant


def test_a_name_used_outside_the_function_is_changed_inside_it():
    m = model(outer_name="q")  # (the main graph's output is named q too)
    [name] = pass_out(m)
    assert name != "q" and name in m.functions[0].input and name in {t.name for t in m.graph.initializer}
    assert [o.name for o in m.graph.output] == ["q"]


def test_an_input_the_author_wrote_is_never_taken_in():
    m = model()
    pass_out(m)
    del m.functions[0].metadata_props[:]  # (as if the author had written the input q and the initializer)
    before = m.SerializeToString()
    assert take_in(m) == []
    assert m.SerializeToString() == before
