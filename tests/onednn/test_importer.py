"""dyndq.onednn.load (dyndq/onednn/importer.py) beyond each kind's mapping: graph inputs and outputs
from ports (left out, naming nothing, listed twice), names and metadata, strides, dims the JSON
leaves unknown taken from their producer; and the package in the wheel."""
import json
from pathlib import Path

import numpy as np
import pytest

import dyndq
from cases import both, graph, lt, op
from dyndq import onednn

DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"


def test_the_interop_is_a_package_of_its_own():
    """dyndq.onednn is a package, no onednn_*.py module left beside it (that the wheel holds it,
    as every package of the tree: tests/test_packaging.py)."""
    root = Path(__file__).resolve().parents[2]
    assert (root / "dyndq" / "onednn" / "__init__.py").is_file()
    assert not list((root / "dyndq").glob("onednn_*.py"))


def test_ports_names_and_metadata():
    model, report = onednn.load(DATA / "complex_fusion/mlp/gated-mlp-int4.json")
    names = [i.name for i in model.graph.input]
    assert names == ["deq_gate_src_0", "deq_gate_scales_1", "deq_gate_zps_2", "fc_gate_src_5", "deq_up_src_8",
                     "deq_up_scales_9", "deq_up_zps_10", "deq_down_src_23", "deq_down_scales_24", "deq_down_zps_25"]
    assert [o.name for o in model.graph.output] == ["fc_down_dst_28"]  # port 5, listed twice, appears once
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["onednn.fpmath_mode"] == "f16" and meta["onednn.version"] == "3.12.0"
    nodes = {n.name: {p.key: p.value for p in n.metadata_props} for n in model.graph.node}
    assert nodes["deq_gate"]["onednn.id"] == "4" and nodes["fc_down"]["onednn.id"] == "29"
    assert json.loads(nodes["fc_gate"]["onednn.op"])["kind"] == "MatMul"


def test_a_transposed_stride_is_the_same_logical_tensor():
    model, _ = onednn.load(DATA / "op/f32/dynamicdq_s4.json")
    src = model.graph.input[0]
    assert [d.dim_value for d in src.type.tensor_type.shape.dim] == [1, 32, 128, 32]


def test_ports_left_out_are_found_and_ports_naming_nothing_are_noted():
    model, report = onednn.load(DATA / "complex_fusion/mha/sdpa-compressed-k-int8-gs32.json")
    assert model.graph.input[-1].name.endswith("_45")
    assert any("input port 6" in n for n in report.notes) and any("tensor 45" in n for n in report.notes)


UNKNOWN = -9223372036854775808  # DNNL_GRAPH_UNKNOWN_DIM


def test_an_unknown_dim_is_taken_from_the_producer():
    model, _ = onednn.load(graph(op(0, "ReLU", [lt(0, "f32", [2, 3])], [lt(1, "f32", [2, UNKNOWN])]),
                                 op(1, "Exp", [lt(1, "f32", [UNKNOWN, 3])], [lt(2, "f32", [-1, 3])])))
    declared = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim] for vi in model.graph.value_info}
    assert list(declared.values()) == [[2, 3]]


def test_an_unknown_dim_of_a_graph_input_is_left_symbolic_and_example_inputs_say_so():
    model, _ = onednn.load(graph(op(0, "ReLU", [lt(0, "f32", [UNKNOWN, 3])], [lt(1, "f32", [UNKNOWN, 3])])))
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert not dim.HasField("dim_value")
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.example_inputs(model)
    [p] = e.value.problems
    assert p.argument == f"input {model.graph.input[0].name}" and "known dtype and shape" in p.allowed
    x = np.ones((5, 3), np.float32)
    for got in both(model, {model.graph.input[0].name: x}):
        assert list(got.values())[0].shape == (5, 3)


def test_two_known_dims_that_differ_are_still_named():
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(graph(op(0, "ReLU", [lt(0, "f32", [2, 3])], [lt(1, "f32", [2, UNKNOWN])]),
                          op(1, "Exp", [lt(1, "f32", [4, 3])], [lt(2, "f32", [4, 3])])))
    assert [(p.op_id, p.argument) for p in e.value.problems] == [(1, "inputs[0]")]


def test_output_ports_that_name_no_tensor_are_dropped_with_a_note():
    model, report = onednn.load(graph(op(0, "ReLU", [lt(0, "f32", [2])], [lt(1, "f32", [2])]), outputs=[1, 77]))
    assert [o.name for o in model.graph.output] == ["relu_0_dst_1"]
    assert any("output port 77" in n for n in report.notes)
    model, report = onednn.load(graph(op(0, "ReLU", [lt(0, "f32", [2])], [lt(1, "f32", [2])]), outputs=[77]))
    assert [o.name for o in model.graph.output] == ["relu_0_dst_1"]  # every port named nothing: the unused values
