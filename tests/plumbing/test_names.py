"""How messages name a node's op (dyndq.plumbing.names.op_name), the one formatter of "domain::type"."""
from onnx import helper

from dyndq.plumbing.names import op_name


def test_an_op_of_the_default_domain_is_named_by_its_type_alone_and_any_other_with_its_domain():
    assert op_name(helper.make_node("MatMul", ["a", "b"], ["c"])) == "MatMul"
    assert op_name(helper.make_node("MatMul", ["a", "b"], ["c"], domain="ai.onnx")) == "MatMul"
    assert op_name(helper.make_node("MatMulNBits", ["a"], ["c"], domain="com.microsoft")) == "com.microsoft::MatMulNBits"
