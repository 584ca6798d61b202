"""Our op is resolved by the opset imports of the scope it stands in (the model, a function, a
function called by a function), in check, export, lift and run on both engines; attribute
references (`axis` given by the caller, or passed on by reference through another function)
resolve in each scope."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, helper

from cases import same_bits, vi

import dyndq
from dyndq.cli import main
from dyndq.model_files import save_model
from dyndq.plumbing.walk import walk

ONNX = helper.make_opsetid("", 21)
LOCAL = helper.make_opsetid("local", 1)
W = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
S = np.array([0.5, -2.0, 0.25], np.float32)  # one scale per row: per_channel along axis 0
WANT = dyndq.dynamic_dequantize(W, S, qtype="per_channel", axis=0)


def ref(name: str, to: str) -> AttributeProto:
    """An INT attribute `name` given by reference to the function's attribute `to`."""
    return AttributeProto(name=name, type=AttributeProto.INT, ref_attr_name=to)


def deq(version: int = 2) -> onnx.FunctionProto:
    """local::Deq(w, s) = DynamicDequantize(w, s, per_channel, axis=<its caller's `axis`>); the
    only scope importing org.dyndq."""
    node = helper.make_node("DynamicDequantize", ["w", "s"], ["y"], domain=dyndq.DOMAIN, name="dq", qtype="per_channel")
    node.attribute.append(ref("axis", "axis"))
    return helper.make_function("local", "Deq", ["w", "s"], ["y"], [node], [ONNX, dyndq.opset_import(version)],
                                attributes=["axis"])


def outer() -> onnx.FunctionProto:
    """local::Outer(w, s) = Deq(w, s, axis=<its caller's `ax`>): it imports no org.dyndq at all."""
    call = helper.make_node("Deq", ["w", "s"], ["y"], domain="local", name="inner_call")
    call.attribute.append(ref("axis", "ax"))
    return helper.make_function("local", "Outer", ["w", "s"], ["y"], [call], [ONNX, LOCAL], attributes=["ax"])


def model_of(nodes, functions, *, imports=(ONNX, LOCAL), inputs=None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs or [vi("w", "int8", [3, 4]), vi("s", "float32", [3])],
                              [vi("y", "float32", [3, 4])])
    return helper.make_model(graph, opset_imports=list(imports), functions=functions, ir_version=10)


def only_a_function_imports_our_domain(axis=0) -> onnx.ModelProto:
    """A model whose own opset_import lacks org.dyndq, while its function Deq imports it."""
    return model_of([helper.make_node("Deq", ["w", "s"], ["y"], domain="local", name="call", axis=axis)], [deq()])


def through_a_function_that_does_not_import_it(ax=0) -> onnx.ModelProto:
    """main -> Outer(ax) -> Deq(axis=ax by reference) -> DynamicDequantize(axis by reference)."""
    return model_of([helper.make_node("Outer", ["w", "s"], ["y"], domain="local", name="call", ax=ax)], [deq(), outer()])


def in_an_if_branch() -> onnx.ModelProto:
    """The call to Deq stands in both branches of an If of the main graph."""
    branch = lambda tag: helper.make_graph(  # noqa: E731
        [helper.make_node("Deq", ["w", "s"], [f"y_{tag}"], domain="local", name=f"call_{tag}", axis=0)],
        tag, [], [vi(f"y_{tag}", "float32", [3, 4])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("then"), else_branch=branch("else"), name="pick")
    return model_of([node], [deq()], inputs=[vi("c", "bool", []), vi("w", "int8", [3, 4]), vi("s", "float32", [3])])


MODELS = {
    "only a function imports org.dyndq": (only_a_function_imports_our_domain, {}),
    "through a function that does not import it": (through_a_function_that_does_not_import_it, {}),
    "called in an If branch": (in_an_if_branch, {"c": np.array(True)}),
}


@pytest.mark.parametrize("name", MODELS)
def test_check_export_and_run_on_both_engines(name):
    build, extra = MODELS[name]
    model = build()
    onnx.checker.check_model(model, full_check=True)
    assert dyndq.check(model) == []
    before = model.SerializeToString()
    exported, report = dyndq.export_with_report(model)
    onnx.checker.check_model(exported, full_check=True)
    assert report.count >= 1 and all(n.op == "org.dyndq::DynamicDequantize-2" for n in report.lowered)
    assert not any(site.node.domain == dyndq.DOMAIN for site in walk(exported))
    assert not any(o.domain == dyndq.DOMAIN for o in exported.opset_import)
    feeds = {"w": W, "s": S, **extra}
    for engine in ("reference", "onnxruntime"):
        assert same_bits(dyndq.run(model, feeds, engine=engine)["y"], WANT), engine
    assert model.SerializeToString() == before


def test_lift_leaves_the_function_alone_and_its_export_still_runs():
    model = through_a_function_that_does_not_import_it()
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 0
    assert lifted.functions[0] == model.functions[0]
    assert same_bits(dyndq.run(dyndq.export(lifted), {"w": W, "s": S}, engine="onnxruntime")["y"], WANT)


def test_the_cli_exports_and_runs_it(tmp_path, capsys):
    """`dyndq export` and `dyndq run --engine onnxruntime` ended in an internal error (exit 70)."""
    save_model(only_a_function_imports_our_domain(), tmp_path / "m.onnx")
    np.save(tmp_path / "w.npy", W)
    np.save(tmp_path / "s.npy", S)
    assert main(["export", str(tmp_path / "m.onnx"), str(tmp_path / "e.onnx")]) == 0
    feeds = ["-i", f"w={tmp_path / 'w.npy'}", "-i", f"s={tmp_path / 's.npy'}"]
    for engine in ("reference", "onnxruntime"):
        capsys.readouterr()
        assert main(["run", str(tmp_path / "m.onnx"), *feeds, "--engine", engine, "--output-dir", str(tmp_path / engine)]) == 0
        assert capsys.readouterr().err == ""
        assert same_bits(np.load(tmp_path / engine / "y.npy"), WANT)


def test_a_value_passed_down_two_calls_is_judged_with_the_whole_chain():
    """A reference passed on by reference (main gives Outer `ax`, Outer gives Deq `axis`) is
    judged with the value at the top of the chain."""
    problems = [p for p in dyndq.check(through_a_function_that_does_not_import_it(ax="0")) if p.op]
    assert len(problems) == 1, problems
    [p] = problems
    assert p.argument == "axis" and "STRING" in p.found and p.node == "dq"
    assert p.graph == "function local::Deq (called by function local::Outer node inner_call, called by main node call)"
    with pytest.raises(dyndq.ValidationError):
        dyndq.export(through_a_function_that_does_not_import_it(ax="0"))


def test_the_version_is_the_one_the_function_imports():
    """per_group exists from version 2 on: inside a function importing org.dyndq 1 the node is
    judged at version 1 (and refused), importing 2 at version 2 (and run), whatever the model
    imports (here: nothing of org.dyndq)."""
    from dyndq.plumbing.opsets import op_version  # (the one lookup by scope that check, export, lift and run share)

    node = dyndq.make_node(["w", "s"], ["y"], name="dq", version=2, qtype="per_group", group_shape=[1, 2])
    s = np.array([[0.5, 2], [-1, 0.25], [4, 1]], np.float32)
    for version, valid in ((1, False), (2, True)):
        f = helper.make_function("local", "Grouped", ["w", "s"], ["y"], [node], [ONNX, dyndq.opset_import(version)])
        model = model_of([helper.make_node("Grouped", ["w", "s"], ["y"], domain="local")], [f],
                         inputs=[vi("w", "int8", [3, 4]), vi("s", "float32", [3, 2])])
        [site] = [s for s in walk(model) if s.node.domain == dyndq.DOMAIN]
        assert site.op.since_version == version
        assert op_version(site.node, {}) is None  # never resolved by another scope's (absent) import
        problems = [p for p in dyndq.check(model) if p.op]
        assert (problems == []) == valid, problems
        if valid:
            want = dyndq.dynamic_dequantize(W, s, qtype="per_group", group_shape=[1, 2])
            for engine in ("reference", "onnxruntime"):
                assert same_bits(dyndq.run(model, {"w": W, "s": s}, engine=engine)["y"], want)
        else:
            assert {p.argument for p in problems} >= {"group_shape"}
            assert all(p.graph == "function local::Grouped" for p in problems)
