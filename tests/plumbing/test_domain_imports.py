"""dyndq.plumbing.domain_imports.align: our domain imported at one version by a model and every
function whose nodes use it (ONNX's checker resolves a function's nodes under both imports and
refuses the model where the versions differ), the newest among them or the one a caller pins."""
import onnx
import pytest
from onnx import TensorProto as T, helper

import dyndq
from dyndq.plumbing.domain_imports import align

D = dyndq.DOMAIN


def model(main_version, function_version, main_uses=True):
    """main: (DynamicDequantize of w) -> local::F, whose DynamicDequantize takes a and s; imports as given."""
    f = helper.make_function("local", "F", ["a", "s"], ["b"], [dyndq.make_node(["a", "s"], ["b"])],
                             [helper.make_opsetid("", 21), helper.make_opsetid(D, function_version)])
    nodes = [helper.make_node("F", ["w", "s"], ["y"], domain="local")]
    if main_uses:
        nodes = [dyndq.make_node(["w", "s"], ["w0"]), helper.make_node("F", ["w", "s"], ["y0"], domain="local"),
                 helper.make_node("Add", ["w0", "y0"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("w", T.INT8, [2]),
                                           helper.make_tensor_value_info("s", T.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    return helper.make_model(graph, functions=[f], ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("local", 1), helper.make_opsetid(D, main_version)])


def versions(m):
    return [{o.domain: o.version for o in m.opset_import}[D], {o.domain: o.version for o in m.functions[0].opset_import}[D]]


def test_the_model_and_its_functions_take_the_newest_import_among_them():
    m = model(1, 2)
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(m, full_check=True)  # (what align is for)
    align(m)
    assert versions(m) == [2, 2]
    onnx.checker.check_model(m, full_check=True)
    m = model(3, 1)
    align(m)
    assert versions(m) == [3, 3]


def test_the_models_import_counts_only_where_its_own_nodes_use_the_domain():
    m = model(3, 1, main_uses=False)
    align(m)
    assert versions(m) == [1, 1]


def test_a_pinned_version_is_kept_and_a_function_importing_a_newer_one_is_refused_by_name():
    m = model(1, 1)
    align(m, {D: 2})
    assert versions(m) == [2, 2]
    m = model(1, 3)
    before = m.SerializeToString()
    with pytest.raises(dyndq.ValidationError) as e:
        align(m, {D: 2})
    [p] = e.value.problems
    assert p.graph == "function local::F" and p.found == "version 3" and "version 2" in p.allowed
    assert m.SerializeToString() == before  # (nothing changed on a refusal)


def test_a_model_whose_functions_do_not_use_the_domain_is_left_alone():
    m = model(1, 2)
    del m.functions[0].node[:]
    m.functions[0].node.append(helper.make_node("Identity", ["a"], ["b"]))
    before = m.SerializeToString()
    align(m)
    assert m.SerializeToString() == before
