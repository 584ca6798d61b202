"""`run` checks every output against the type the graph declares for it (element type, rank,
each fixed dimension; a symbolic dimension takes any size) on either engine, and refuses one
that does not fit with a problem naming the output, from Python and from `dyndq run`."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from cases import vi

import dyndq
from dyndq.cli import main
from dyndq.model_files import save_model
from dyndq.runner import OutputError

ENGINES = ("reference", "onnxruntime")


def reshaped(declared) -> onnx.ModelProto:
    """y = Reshape(x, shape): its shape is known only when it runs; the graph declares `declared`."""
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "g",
                              [vi("x", "float32", [2, 3]), vi("shape", "int64", [len(declared)])],
                              [vi("y", "float32", declared)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def feeds(shape):
    return {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "shape": np.array(shape, np.int64)}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_fixed_dimension_that_does_not_fit_is_named(engine):
    with pytest.raises(OutputError) as e:
        dyndq.run(reshaped([2, 3]), feeds([3, 2]), engine=engine)
    [p] = e.value.problems
    assert (p.argument, p.found) == ("y", "a float32 array of shape [3, 2] (dimension 0 is 3)")
    assert p.allowed == "dimension 0 = 2: float32[2,3], the type of graph output 'y'"
    assert isinstance(e.value, dyndq.ValidationError)


@pytest.mark.parametrize("engine", ENGINES)
def test_symbolic_dimensions_take_any_size(engine):
    for shape in ([3, 2], [6, 1], [1, 6]):
        assert dyndq.run(reshaped(["rows", "cols"]), feeds(shape), engine=engine)["y"].shape == tuple(shape)
    assert dyndq.run(reshaped([None, 2]), feeds([3, 2]), engine=engine)["y"].shape == (3, 2)
    with pytest.raises(OutputError, match=r"dimension 1 is 1\); allowed: dimension 1 = 2"):
        dyndq.run(reshaped(["rows", 2]), feeds([6, 1]), engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_rank_is_checked(engine):
    model = reshaped([2, 3])
    model.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "k"  # the rank of y: known only when it runs
    with pytest.raises(OutputError, match=r"y: found a float32 array of shape \[1, 2, 3\] \(rank 3\); allowed: rank 2"):
        dyndq.run(model, feeds([1, 2, 3]), engine=engine)


def test_the_element_type_is_checked():
    """A Cast to float16 whose output the graph declares float32. (ONNX's checker refuses this
    model, so the onnxruntime engine, which exports it first, refuses it before it runs.)"""
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16)], "g",
                              [vi("x", "float32", [2])], [vi("y", "float32", [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    with pytest.raises(OutputError) as e:
        dyndq.run(model, {"x": np.ones(2, np.float32)})
    [p] = e.value.problems
    assert p.argument == "y" and p.found == "a float16 array of shape [2]" and p.allowed.startswith("float32[2]")
    with pytest.raises(dyndq.ValidationError):
        dyndq.run(model, {"x": np.ones(2, np.float32)}, engine="onnxruntime")


def test_every_output_that_does_not_fit_is_named_and_those_declared_loosely_pass():
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], [name]) for name in ("a", "b", "c", "d")], "g",
        [vi("x", "float32", [2, 3]), vi("shape", "int64", [2])],
        [vi("a", "float32", [2, 3]), vi("b", "float32", [3, 3]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, None),  # no shape: any
         helper.make_tensor_value_info("d", TensorProto.UNDEFINED, None)])  # no type at all: any
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    with pytest.raises(OutputError) as e:
        dyndq.run(model, feeds([3, 2]))
    assert [p.argument for p in e.value.problems] == ["a", "b"]


def test_the_cli_names_the_output_and_shows_no_result(tmp_path, capsys):
    save_model(reshaped([2, 3]), tmp_path / "m.onnx")
    for name, value in feeds([3, 2]).items():
        np.save(tmp_path / f"{name}.npy", value)
    argv = ["run", str(tmp_path / "m.onnx"), "-i", f"x={tmp_path / 'x.npy'}", "-i", f"shape={tmp_path / 'shape.npy'}"]
    for engine in ENGINES:
        capsys.readouterr()
        assert main(argv + ["--engine", engine]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err.splitlines() == [
            f"dyndq: {tmp_path / 'm.onnx'}: the {engine} engine gave outputs that do not fit their declared types: 1 problem",
            "  - output y: found a float32 array of shape [3, 2] (dimension 0 is 3); "
            "allowed: dimension 0 = 2: float32[2,3], the type of graph output 'y'"]
        assert main(argv + ["--engine", engine, "--output-dir", str(tmp_path / engine)]) == 1
        assert not (tmp_path / engine / "y.npy").exists()
