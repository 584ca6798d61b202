"""The reference engine across graph scopes: sibling If branches with their own types, bodies
seeing outer values, Loop with its cond omitted, functions calling functions listed after them.

Each of these failed on the code before its fix."""
from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq


# -- types per graph scope ------------------------------------------------------------------

def _branch(name: str, zp_dtype, n: int, axis: int) -> onnx.GraphProto:
    """A body that makes its own `zp` and `sc` (the same names in both branches)."""
    nodes = [helper.make_node("Constant", [], ["zp"], value=nh.from_array(np.arange(n).astype(zp_dtype))),
             helper.make_node("Constant", [], ["sc"], value=nh.from_array(np.full(n, 0.5, np.float32))),
             dyndq.make_node(["w", "sc", "zp"], [f"o_{name}"], name=f"dq_{name}", qtype="per_channel", axis=axis)]
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"o_{name}", T.FLOAT, [4, 3])])


def if_model(then_branch, else_branch) -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_branch, else_branch=else_branch)], "g",
        [helper.make_tensor_value_info("c", T.BOOL, []), helper.make_tensor_value_info("w", T.INT8, [4, 3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [4, 3])])
    return dyndq.make_model(g)


W43 = np.arange(12, dtype=np.int8).reshape(4, 3)


def _expected(zp_dtype, n, axis):
    shape = (n, 1) if axis == 0 else (1, n)
    return ((W43.astype(np.int64) - np.arange(n).astype(zp_dtype).astype(np.int64).reshape(shape))
            .astype(np.float32) * np.float32(0.5))


@pytest.mark.parametrize("then_, else_", [
    ((np.int32, 4, 0), (np.int8, 4, 0)),   # zp int32 in one branch, int8 in the other
    ((np.int8, 4, 0), (np.int32, 4, 0)),
    ((np.int8, 3, 1), (np.int8, 4, 0)),    # sc with 3 elements in one, 4 in the other
])
def test_sibling_branches_keep_their_own_types(then_, else_):
    m = if_model(_branch("then", *then_), _branch("else", *else_))
    assert dyndq.check(m) == []
    exported = dyndq.export(m)
    onnx.checker.check_model(exported, full_check=True)
    for c, spec in ((True, then_), (False, else_)):
        for engine in ("reference", "onnxruntime"):
            y = dyndq.run(m, {"c": np.array(c), "w": W43}, engine=engine)["y"]
            assert np.array_equal(y, _expected(*spec)), (c, engine)


def test_a_body_still_sees_outer_values():
    from dyndq.scopes import value_types

    m = if_model(_branch("then", np.int8, 4, 0), _branch("else", np.int32, 3, 1))
    types = value_types(m)
    then_, else_ = types.at("main/if.then_branch"), types.at("main/if.else_branch")
    assert then_["w"].tensor_type.elem_type == else_["w"].tensor_type.elem_type == T.INT8  # from main
    assert then_["zp"].tensor_type.elem_type == T.INT8 and else_["zp"].tensor_type.elem_type == T.INT32
    assert "zp" not in types.at("main")


# -- Loop with its cond omitted ---------------------------------------------------------------

def loop_model(with_cond: bool) -> onnx.ModelProto:
    """acc = sum over 3 iterations of DynamicDequantize(w, s), with Loop's cond given or omitted."""
    body = helper.make_graph(
        [dyndq.make_node(["w", "s"], ["d"], name="dq"),
         helper.make_node("Add", ["acc_in", "d"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond_in", T.BOOL, []),
         helper.make_tensor_value_info("acc_in", T.FLOAT, [3])],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), helper.make_tensor_value_info("acc_out", T.FLOAT, [3])])
    inits = [nh.from_array(np.array(3, np.int64), "M"), nh.from_array(np.zeros(3, np.float32), "acc0"),
             nh.from_array(np.array([1, -2, 3], np.int8), "w"), nh.from_array(np.array([0.5], np.float32), "s")]
    if with_cond:
        inits.append(nh.from_array(np.array(True), "c"))
    g = helper.make_graph([helper.make_node("Loop", ["M", "c" if with_cond else "", "acc0"], ["acc"], body=body)], "g",
                          [], [helper.make_tensor_value_info("acc", T.FLOAT, [3])], inits)
    return dyndq.make_model(g)


@pytest.mark.parametrize("with_cond", [True, False])
@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_loop_without_cond_runs_its_iterations(engine, with_cond):
    acc = dyndq.run(loop_model(with_cond), {}, engine=engine)["acc"]
    assert np.array_equal(acc, np.array([1.5, -3.0, 4.5], np.float32))


# -- functions calling functions listed after them --------------------------------------------

def test_functions_calling_functions_listed_after_them_run():
    inner = helper.make_function("local", "Inner", ["w", "s"], ["y"], [dyndq.make_node(["w", "s"], ["y"])],
                                 [helper.make_opsetid("", 21), dyndq.opset_import()])
    outer = helper.make_function("local", "Outer", ["w", "s"], ["y"], [helper.make_node("Inner", ["w", "s"], ["y"], domain="local")],
                                 [helper.make_opsetid("", 21), helper.make_opsetid("local", 1)])
    g = helper.make_graph([helper.make_node("Outer", ["w", "s"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("w", T.INT8, [3]), helper.make_tensor_value_info("s", T.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1), dyndq.opset_import()],
                          ir_version=10, functions=[outer, inner])
    before = m.SerializeToString()
    feeds = {"w": np.array([1, 2, 3], np.int8), "s": np.array([0.5], np.float32)}
    for engine in ("reference", "onnxruntime"):
        assert dyndq.run(m, feeds, engine=engine)["y"].tolist() == [0.5, 1.0, 1.5]
    assert m.SerializeToString() == before
