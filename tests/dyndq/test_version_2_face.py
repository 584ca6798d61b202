"""Version 2 through the face: make_node, make_model, check and the CLI's schema and check."""
import ml_dtypes
import numpy as np
import onnx
import pytest
from cases import same_bits, vi
from onnx import TensorProto, helper

import dyndq
from dyndq.cli import main
from dyndq.model_files import save_model


def _int4_model(group_shape=(1, 32), scales_shape=(4, 2), version=None):
    node = dyndq.make_node(["w_q", "w_scales", "w_zps"], ["w"], name="w_dq", qtype="per_group",
                           group_shape=list(group_shape), version=version)
    graph = helper.make_graph(
        [node], "g",
        [vi("w_q", TensorProto.UINT4, [4, 64]), vi("w_scales", TensorProto.FLOAT16, list(scales_shape)),
         vi("w_zps", TensorProto.UINT8, list(scales_shape))],
        [vi("w", TensorProto.FLOAT16, [4, 64])])
    return dyndq.make_model(graph)


def test_make_node_writes_group_shape_as_ints_and_judges_it():
    node = dyndq.make_node(["q", "s"], ["w"], qtype="per_group", group_shape=(1, 32))
    [gs] = [a for a in node.attribute if a.name == "group_shape"]
    assert gs.type == onnx.AttributeProto.INTS and list(gs.ints) == [1, 32]
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.make_node(["q", "s"], ["w"], name="dq", qtype="per_group")
    assert [(p.argument, p.node) for p in e.value.problems] == [("group_shape", "dq")]
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.make_node(["q", "s"], ["w"], qtype="per_group", group_shape="1,32")
    assert [p.argument for p in e.value.problems] == ["group_shape"]
    with pytest.raises(dyndq.ValidationError) as e:  # version 1 has neither per_group nor group_shape
        dyndq.make_node(["q", "s"], ["w"], qtype="per_group", group_shape=[1, 32], version=1)
    assert {p.argument for p in e.value.problems} == {"group_shape"}


def test_a_version_2_model_checks_infers_and_runs():
    model = _int4_model()
    assert {o.domain: o.version for o in model.opset_import}[dyndq.DOMAIN] == 2
    assert dyndq.check(model) == []
    onnx.checker.check_model(model, full_check=True)
    rng = np.random.default_rng(0)
    feeds = {"w_q": rng.integers(0, 16, (4, 64)).astype(ml_dtypes.uint4),
             "w_scales": rng.uniform(0.01, 0.1, (4, 2)).astype(np.float16),
             "w_zps": rng.integers(0, 16, (4, 2)).astype(np.uint8)}
    [w] = dyndq.run(model, feeds).values()
    assert w.dtype == np.float16
    assert same_bits(w, dyndq.dynamic_dequantize(*feeds.values(), qtype="per_group", group_shape=(1, 32)))


def test_check_names_group_shape_and_the_dtypes():
    problems = dyndq.check(_int4_model(group_shape=(1, 30)))
    assert [(p.node, p.argument) for p in problems if p.op] == [("w_dq", "group_shape")]
    assert "a divisor of src.shape[1] = 64" in problems[0].allowed
    node = helper.make_node("DynamicDequantize", ["q", "s"], ["y"], domain=dyndq.DOMAIN, name="dq")
    graph = helper.make_graph([node], "g", [vi("q", TensorProto.INT16, [4]), vi("s", TensorProto.DOUBLE, [1])],
                              [vi("y", TensorProto.DOUBLE, [4])])
    found = {p.argument: p.allowed for p in dyndq.check(dyndq.make_model(graph, versions={dyndq.DOMAIN: 2}))
             if p.op}
    assert found["src"] == "T1 = int8 | uint8 | int4 | uint4"
    assert found["scales"] == "T2 = float32 | float16 | bfloat16"


def test_cli_schema_and_check_show_version_2(tmp_path, capsys):
    assert main(["schema"]) == 0
    out = capsys.readouterr().out
    assert "org.dyndq::DynamicDequantize, version 2" in out
    assert "group_shape" in out and "int4, uint4" in out and "float32, float16, bfloat16" in out
    path = tmp_path / "bad.onnx"
    save_model(_int4_model(group_shape=(1, 30)), path)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "w_dq" in out and "group_shape" in out
    save_model(_int4_model(), path)
    assert main(["check", str(path)]) == 0
