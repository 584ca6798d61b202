"""A made-up op with two versions goes through every generic path of the face.

`test.toy::Scale` is registered in a scoped registry (removed after each test):
version 1 is y = x (an identity, lifted from ai.onnx Identity), version 2 adds
an INT attribute `factor`: y = x * factor.  Nothing in dyndq/ names it; if a
generic path still assumed DynamicDequantize, one of these tests would fail.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dyndq
from dyndq.cli import main
from dyndq.model_files import save_model
from dyndq.opdefs import (AttrKind, Attribute, LiftPlan, Refusal, Needs, OpVersion, Param, Problem,
                          TensorSpec, TypeConstraint, ValidationError, register, registry)

DOMAIN = "test.toy"


def _define(version: int) -> OpVersion:
    attributes = () if version == 1 else (Attribute("factor", AttrKind.INT, 2, "What x is multiplied by."),)
    return OpVersion(
        name="Scale", domain=DOMAIN, since_version=version, doc=f"Toy op, version {version}.",
        inputs=(Param("x", "T", "Input."),), outputs=(Param("y", "T", "Output."),),
        attributes=attributes, type_constraints=(TypeConstraint("T", ("float32",), "float32 only."),),
    )


def _attach(op: OpVersion) -> None:
    v2 = op.since_version == 2

    def shape(x, **attrs):
        problems = []
        if x.dtype not in (None, "float32"):
            problems.append(Problem("x", f"dtype {x.dtype}", "T = float32"))
        if attrs.get("factor", 1) < 0:
            problems.append(Problem("factor", str(attrs["factor"]), "an integer >= 0"))
        if problems:
            raise ValidationError(problems)
        return TensorSpec("float32", x.shape)

    def kernel(x, **attrs):
        shape(TensorSpec.of(x), **attrs)
        return (x * np.float32(attrs.get("factor", 1))).astype(np.float32)

    def lowering(ctx, x, **attrs):
        if not v2:
            return ctx.op("Identity", x, hint="y")
        return ctx.op("Mul", x, ctx.const(np.array(attrs["factor"], np.float32), "factor"), hint="y")

    def needs(x, **attrs):
        return Needs(7, why="Mul" if v2 else "Identity")

    def lifting(node, spec):
        s = spec(node.input[0])
        if s is None or s.dtype != "float32":
            return Refusal("x is not known to be float32")
        return LiftPlan((node.input[0],), {})

    # each part with the signature of its version (inputs positional, attributes keyword-only)
    if v2:
        op.def_shape_inference(lambda x, *, factor=2: shape(x, factor=factor))
        op.def_kernel(lambda x, *, factor=2: kernel(x, factor=factor))
        op.def_lowering(lambda ctx, x, *, factor=2: lowering(ctx, x, factor=factor))
        op.def_lowering_needs(lambda x, *, factor=2: needs(x, factor=factor))
    else:
        op.def_shape_inference(lambda x: shape(x))
        op.def_kernel(lambda x: kernel(x))
        op.def_lowering(lambda ctx, x: lowering(ctx, x))
        op.def_lowering_needs(lambda x: needs(x))
        op.def_lifting(source=("", "Identity"))(lifting)


@pytest.fixture
def toy():
    with registry.scope():
        ops = [register(_define(v)) for v in (1, 2)]
        for op in ops:
            _attach(op)
        yield ops
    assert not onnx.defs.has("Scale", DOMAIN)  # the scope took its ONNX schema away too


def _model(version: int | None, **attrs) -> onnx.ModelProto:
    node = dyndq.make_node(["x"], ["y"], name="toy", op_type="Scale", domain=DOMAIN, version=version, **attrs)
    graph = helper.make_graph([node, helper.make_node("Relu", ["y"], ["r"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("r", TensorProto.FLOAT, [3])])
    versions = None if version is None else {DOMAIN: version}
    return dyndq.make_model(graph, opset=17, versions=versions)


X = np.array([-1.0, 0.5, 3.0], np.float32)


def test_make_node_judges_by_the_version_it_will_be_imported_at(toy):
    assert dyndq.make_node(["x"], ["y"], op_type="Scale", domain=DOMAIN, factor=3).attribute[0].i == 3
    with pytest.raises(ValidationError) as e:  # version 1 has no factor
        dyndq.make_node(["x"], ["y"], op_type="Scale", domain=DOMAIN, version=1, factor=3)
    assert e.value.problems[0].argument == "factor" and "test.toy::Scale-1" in e.value.problems[0].allowed
    with pytest.raises(ValidationError) as e:  # judged by version 2's shape function
        dyndq.make_node(["x"], ["y"], op_type="Scale", domain=DOMAIN, factor=-1)
    assert [p.argument for p in e.value.problems] == ["factor"]


def test_make_model_imports_the_toy_domain(toy):
    assert {o.domain: o.version for o in _model(None, factor=3).opset_import}[DOMAIN] == 2
    assert {o.domain: o.version for o in _model(1).opset_import}[DOMAIN] == 1


def test_check_and_onnx_know_both_versions(toy):
    assert dyndq.check(_model(None, factor=3)) == []
    assert dyndq.check(_model(1)) == []
    bad = _model(1)
    bad.graph.node[0].attribute.append(helper.make_attribute("factor", 3))  # not an attribute of version 1
    [p] = dyndq.check(bad)
    assert (p.op, p.node, p.argument) == ("test.toy::Scale", "toy", "factor")
    assert onnx.defs.get_schema("Scale", 2, DOMAIN).since_version == 2


def test_the_reference_evaluator_runs_the_imported_version(toy):
    [r2] = dyndq.reference_evaluator(_model(None, factor=3)).run(None, {"x": X})
    [r1] = dyndq.reference_evaluator(_model(1)).run(None, {"x": X})
    assert r2.tolist() == [0.0, 1.5, 9.0] and r1.tolist() == [0.0, 0.5, 3.0]
    [d] = dyndq.reference_evaluator(_model(2)).run(None, {"x": X})  # version 2's default factor
    assert d.tolist() == [0.0, 1.0, 6.0]


def test_export_lowers_each_version_with_its_own_parts(toy):
    for model, want in ((_model(None, factor=3), "Mul"), (_model(1), "Identity")):
        exported, report = dyndq.export_with_report(model)
        assert [n.op_type for n in exported.graph.node if n.op_type != "Constant"] == [want, "Relu"]
        assert DOMAIN not in {o.domain for o in exported.opset_import}
        assert report.lowered[0].op.startswith("test.toy::Scale-")
        [ort] = dyndq.run(exported, {"x": X}, engine="onnxruntime").values()
        [ref] = dyndq.run(model, {"x": X}).values()
        assert np.array_equal(ort.view(np.uint32), ref.view(np.uint32))


def test_export_opset_too_low_is_named_by_the_needs(toy):
    with pytest.raises(dyndq.ExportError, match=r"needs 7 \(Mul\)"):
        dyndq.export(_model(None, factor=3), opset=6)


def test_lift_asks_the_toy_handles(toy):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="id")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    lifted, report = dyndq.lift_with_report(model)
    assert [(n.domain, n.op_type) for n in lifted.graph.node] == [(DOMAIN, "Scale")]
    assert {o.domain: o.version for o in lifted.opset_import}[DOMAIN] == 1
    assert report.summary().startswith("lifted 1 Identity node(s)")
    assert dyndq.check(lifted) == []


def test_the_cli_shows_and_checks_the_toy(toy, tmp_path, capsys):
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert "test.toy::Scale, version 1" in out and "test.toy::Scale, version 2" in out
    assert "factor  INT   2" in " ".join(out.split("\n"))
    path = tmp_path / "toy.onnx"
    save_model(_model(None, factor=3), path)
    assert main(["check", str(path)]) == 0
    bad = _model(1)
    bad.graph.node[0].attribute.append(helper.make_attribute("factor", 3))
    save_model(bad, path)
    assert main(["check", str(path)]) == 1
    assert "factor" in capsys.readouterr().out


def test_the_toy_is_gone_after_its_scope():
    assert "Scale" not in dyndq.opdefs.ops_of(DOMAIN)
    assert not onnx.defs.has("Scale", DOMAIN)
