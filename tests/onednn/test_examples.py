"""What used to take by hand (issue 21, point 5) and example inputs that stay finite (point 4):
`dyndq run --inputs-dir`, `export-onednn --weights-as-inputs` (and dump's option), dump's
inverses of Reshape, ReduceSum/ReduceMax and QuantizeLinear, and run's count of infinities."""
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
from dyndq import onednn
from dyndq.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"
MHA = DATA / "complex_fusion/mha/sdpa-compressed-kv-implicit-causal-mask-int8-gs128.json"
vi = helper.make_tensor_value_info


def test_run_takes_every_input_from_a_folder_and_names_the_missing(tmp_path, capsys):
    model, inputs = tmp_path / "m.onnx", tmp_path / "in"
    assert main(["import-onednn", str(MHA), str(model), "--inputs-dir", str(inputs)]) == 0
    capsys.readouterr()
    assert main(["run", str(model), "--inputs-dir", str(inputs)]) == 0
    by_folder = capsys.readouterr().out
    args = [f"--input={f.stem}={f}" for f in sorted(inputs.glob("*.npy"))]
    assert main(["run", str(model), *args]) == 0
    assert capsys.readouterr().out == by_folder
    (inputs / "div_src_1_4.npy").rename(tmp_path / "divisor.npy")
    (inputs / "stray.npy").write_bytes((tmp_path / "divisor.npy").read_bytes())
    assert main(["run", str(model), "--inputs-dir", str(inputs)]) == 2
    err = capsys.readouterr().err
    assert "no file for 1 input: div_src_1_4 (div_src_1_4.npy)" in err
    assert main(["run", str(model), "--inputs-dir", str(inputs), "--input", f"div_src_1_4={tmp_path / 'divisor.npy'}"]) == 0
    out, err = capsys.readouterr()
    assert out == by_folder and "stray.npy is for no input" in err


def _weighted_model():
    """MatMul with weights, Reshape, ReduceSum, ReduceMax and QuantizeLinear, all with constants."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="fc"),
             helper.make_node("Reshape", ["y", "shape"], ["r"], name="flat"),
             helper.make_node("ReduceMax", ["r", "axes"], ["m"], name="top", keepdims=1),
             helper.make_node("Sub", ["r", "m"], ["d"], name="shift"),
             helper.make_node("ReduceSum", ["d", "axes"], ["s"], name="total", keepdims=0),
             helper.make_node("QuantizeLinear", ["s", "scale", "zp"], ["q"], name="quant")]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([3, 2], np.int64), "shape"),
             numpy_helper.from_array(np.array([1], np.int64), "axes"),
             numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
             numpy_helper.from_array(np.array(-3, np.int8), "zp")]
    g = helper.make_graph(nodes, "weighted", [vi("x", TensorProto.FLOAT, [2, 4])], [vi("q", TensorProto.INT8, [3])],
                          inits)
    return dyndq.make_model(g)


def test_dump_maps_reshape_the_reductions_and_quantize_linear_back():
    model = _weighted_model()
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(model)
    [p] = e.value.problems  # the weights only: shape, axes, scale and zp are read as attributes
    assert (p.node, p.argument) == ("fc", "w") and "--weights-as-inputs" in p.allowed
    weights = {}
    doc = onednn.dump(model, weights_as_inputs=True, weights=weights)
    ops = {op["name"]: op for op in doc["graph"]}
    assert [op["kind"] for op in doc["graph"]] == ["MatMul", "StaticReshape", "ReduceMax", "Subtract", "ReduceSum",
                                                   "Quantize"]
    assert ops["flat"]["attrs"]["shape"] == {"type": "s64[]", "value": [3, 2]}
    assert ops["total"]["attrs"] == {"axes": {"type": "s64[]", "value": [1]}, "keep_dims": {"type": "bool", "value": False}}
    assert ops["quant"]["attrs"]["zps"] == {"type": "s64[]", "value": [-3]}
    [(name, w)] = weights.items()
    port = ops["fc"]["inputs"][1]
    assert port["property_type"] == "constant" and port["id"] in doc["input_ports"] and name == "fc_weights_%d" % port["id"]
    again, _ = onednn.load(json.loads(json.dumps(doc)))
    x = np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)
    [want] = dyndq.run(model, {"x": x}).values()
    feeds = {again.graph.input[0].name: x, **weights}
    for engine in ("reference", "onnxruntime"):
        [got] = dyndq.run(again, feeds, engine=engine).values()
        assert np.array_equal(got, want)


def test_export_onednn_weights_as_inputs_writes_them_beside_the_json_and_run_takes_them(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "m.json"
    onnx.save(_weighted_model(), src)
    assert main(["export-onednn", str(src), str(out)]) == 1
    assert "--weights-as-inputs" in capsys.readouterr().err and not out.exists()
    assert main(["export-onednn", str(src), str(out), "--weights-as-inputs"]) == 0
    assert "wrote " + str(tmp_path / "m-weights" / "fc_weights_") in capsys.readouterr().out
    back = tmp_path / "back.onnx"
    assert main(["import-onednn", str(out), str(back)]) == 0
    x = tmp_path / "x"
    x.mkdir()
    np.save(x / "fc_src_1.npy", np.ones((2, 4), np.float32))
    capsys.readouterr()
    assert main(["run", str(back), "--inputs-dir", str(x), "--inputs-dir", str(tmp_path / "m-weights")]) == 0
    assert capsys.readouterr().out.startswith("quant_dst_")


@pytest.mark.filterwarnings("ignore:divide by zero", "ignore:invalid value")
def test_run_counts_infinities_and_nans(tmp_path, capsys):
    g = helper.make_graph([helper.make_node("Div", ["a", "b"], ["c"], name="div")], "g",
                          [vi("a", TensorProto.FLOAT, [4]), vi("b", TensorProto.FLOAT, [4])],
                          [vi("c", TensorProto.FLOAT, [4])])
    path = tmp_path / "m.onnx"
    onnx.save(dyndq.make_model(g), path)
    np.save(tmp_path / "a.npy", np.array([1, -1, 0, 2], np.float32))
    np.save(tmp_path / "b.npy", np.array([0, 0, 0, 4], np.float32))
    assert main(["run", str(path), "--inputs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "min 0.5  max 0.5  mean 0.5  (2 infinite, 1 NaN)  first" in out


ANCHORS = sorted(p for p in DATA.rglob("*.json") if not {"kinds", "bad", "upstream"} & set(p.parts)
                 and "gated-mlp" not in p.name)


@pytest.mark.parametrize("path", ANCHORS + sorted((DATA / "kinds").glob("*.json")), ids=lambda p: p.stem)
def test_example_inputs_give_finite_outputs(path):
    """The anchors (the gated MLP in the test below) and each kind, with their example inputs: no
    output holds an infinity or a NaN (SoftMax's kind file is checked without its -inf row)."""
    model, _ = onednn.load(path)
    for name, value in dyndq.run(model, onednn.example_inputs(model, 0)).items():
        if value.dtype.kind == "f" or value.dtype.name == "bfloat16":
            assert np.isfinite(value.astype(np.float64)).all(), name


@pytest.mark.big  # about 1.3 GB on the reference engine
def test_the_gated_mlp_gives_finite_outputs():
    model, _ = onednn.load(DATA / "complex_fusion/mlp/gated-mlp-int4.json")
    [y] = dyndq.run(model, onednn.example_inputs(model, 0)).values()
    assert np.isfinite(y.astype(np.float32)).all() and 0.05 < np.abs(y.astype(np.float32)).mean() < 20
