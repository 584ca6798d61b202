"""What a run returns: graph outputs declared without a type (the usual way to see an
intermediate tensor), and any value of the main graph asked for by name (`run(outputs=...)`,
`dyndq run --output NAME`), on both engines: our op's outputs bit for bit, values summed by a
MatMul within a stated tolerance; a name the model cannot give is named."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from cases import call, same_bits
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.demo import build_model, demo_input
from dyndq.run_outputs import OutputNameError

ENGINES = ("reference", "onnxruntime")
# float32 MatMuls summed in each engine's own order: the demo's own tolerance
RTOL, ATOL = 1e-5, 1e-6


def tiny(extra: onnx.ValueInfoProto) -> onnx.ModelProto:
    """z = Relu(x @ w), w = DynamicDequantize(w_q, w_scale) per channel; graph outputs z and `extra`."""
    graph = helper.make_graph(
        [dyndq.make_node(["w_q", "w_scale"], ["w"], qtype="per_channel", axis=1, name="dq_w"),
         helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Relu", ["y"], ["z"], name="relu")],
        "tiny", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("z", T.FLOAT, ["batch", 3]), extra],
        [nh.from_array(np.arange(-6, 6, dtype=np.int8).reshape(4, 3), "w_q"),
         nh.from_array(np.array([0.5, 0.25, np.nan], np.float32), "w_scale")])
    return dyndq.make_model(graph, opset=21)


X = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)


@pytest.mark.parametrize("extra", [
    onnx.ValueInfoProto(name="w"),  # no type at all
    helper.make_tensor_value_info("w", 0, None),  # element type UNDEFINED
    helper.make_tensor_value_info("w", 0, [4, 3]),  # UNDEFINED, with a shape
    helper.make_tensor_value_info("w", T.FLOAT, None),  # a type, no shape
], ids=["no-type", "undefined", "undefined-with-shape", "no-shape"])
def test_an_extra_output_declared_without_a_type_runs_on_both_engines(extra):
    model = tiny(extra)
    before = model.SerializeToString()
    ref, ort = (dyndq.run(model, {"x": X}, engine=e) for e in ENGINES)
    assert list(ref) == list(ort) == ["z", "w"]
    assert ref["w"].dtype == np.float32 and same_bits(ref["w"], ort["w"])  # our op: to the bit (a NaN column too)
    np.testing.assert_allclose(ort["z"], ref["z"], rtol=RTOL, atol=ATOL)
    assert model.SerializeToString() == before


def contrib_model(extra: onnx.ValueInfoProto) -> onnx.ModelProto:
    """y = Relu(FastGelu(x)): com.microsoft::FastGelu, which ONNX cannot type and the export keeps."""
    graph = helper.make_graph(
        [helper.make_node("FastGelu", ["x"], ["g"], domain="com.microsoft", name="gelu"),
         helper.make_node("Relu", ["g"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [3])], [helper.make_tensor_value_info("y", T.FLOAT, [3]), extra])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
                             ir_version=10)


def test_an_output_whose_type_nobody_can_know_is_named():
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.run(contrib_model(onnx.ValueInfoProto(name="g")), {"x": np.ones(3, np.float32)}, engine="onnxruntime")
    assert len(e.value.problems) == 1
    message = str(e.value.problems[0])
    assert message.startswith("g: found a graph output of unknown type (made by com.microsoft::FastGelu 'gelu')")
    assert "declare it in the model" in message


def test_an_output_declared_without_a_shape_that_onnx_cannot_infer_runs():
    out = dyndq.run(contrib_model(helper.make_tensor_value_info("g", T.FLOAT, None)), {"x": np.ones(3, np.float32)},
                    engine="onnxruntime")
    assert out["g"].dtype == np.float32 and np.all(out["y"] == out["g"])


def test_an_output_onnx_types_only_once_exported_runs(tmp_path):
    """A MatMulNBits output: ONNX knows no com.microsoft op, but the export is standard ONNX."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (4, 32))
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], name="proj", domain="com.microsoft",
                            K=32, N=4, bits=4, block_size=32)
    graph = helper.make_graph(
        [node, helper.make_node("Relu", ["Y"], ["Z"], name="relu")], "g",
        [helper.make_tensor_value_info("A", T.FLOAT, ["M", 32])],
        [helper.make_tensor_value_info("Z", T.FLOAT, ["M", 4]), onnx.ValueInfoProto(name="Y")],
        [nh.from_array((codes[:, 0::2] | codes[:, 1::2] << 4).astype(np.uint8).reshape(4, 1, 16), "B"),
         nh.from_array(np.full(4, 0.5, np.float32), "scales")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                  helper.make_opsetid("com.microsoft", 1)])
    eye = np.eye(32, dtype=np.float32)
    out = dyndq.run(model, {"A": eye}, engine="onnxruntime")
    assert np.array_equal(out["Y"], ((codes - 8) * np.float32(0.5)).T.astype(np.float32))


# -- run(outputs=[...]) and run --output --------------------------------------------------------


@pytest.fixture(scope="module")
def demo():
    return build_model(), demo_input()


def main_graph_values(model):
    return ([vi.name for vi in model.graph.input] + [t.name for t in model.graph.initializer]
            + [o for n in model.graph.node for o in n.output])


def test_every_value_of_the_main_graph_on_both_engines(demo):
    model, x = demo
    names = main_graph_values(model)
    ours = [o for n in model.graph.node if n.domain == dyndq.DOMAIN for o in n.output]
    ref, ort = (dyndq.run(model, {"x": x}, engine=e, outputs=names) for e in ENGINES)
    assert list(ref) == list(ort) == names and set(ours) == {"w1_dequantized", "w2_dequantized", "w3_DynamicDequantize_out"}
    for name in names:
        a, b = ref[name], ort[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if name in ours or name in {t.name for t in model.graph.initializer} or name == "x":
            assert a.tobytes() == b.tobytes(), name  # our op, and values no engine computes: to the bit
        else:
            np.testing.assert_allclose(b.astype(np.float32), a.astype(np.float32), rtol=RTOL, atol=ATOL, err_msg=name)
    assert ref["w2_quantized"].dtype == ml_dtypes.uint4 and ref["w3_DynamicDequantize_out"].dtype == np.float16


def test_outputs_are_exactly_those_asked_for_in_their_order(demo):
    model, x = demo
    before = model.SerializeToString()
    for engine in ENGINES:
        out = dyndq.run(model, {"x": x}, engine=engine, outputs=["w3_DynamicDequantize_out", "h1"])
        assert list(out) == ["w3_DynamicDequantize_out", "h1"]
        assert list(dyndq.run(model, {"x": x}, engine=engine)) == ["y"]  # the graph's own, from their own runner
    assert model.SerializeToString() == before


def test_a_bfloat16_intermediate_comes_back_with_its_bits():
    s16 = np.array([[0.5, np.nan], [1.0, 2.0]], ml_dtypes.bfloat16)
    graph = helper.make_graph(
        [dyndq.make_node(["w4", "s16"], ["d"], qtype="per_group", group_shape=[1, 2], name="dq4"),
         helper.make_node("Cast", ["d"], ["f"], to=T.FLOAT, name="cast")], "g",
        [helper.make_tensor_value_info("w4", T.UINT4, [2, 4])], [helper.make_tensor_value_info("f", T.FLOAT, [2, 4])],
        [nh.from_array(s16, "s16")])
    model = dyndq.make_model(graph, opset=21)
    w4 = np.array([[1, 15, 0, 7], [8, 3, 2, 9]], ml_dtypes.uint4)
    ref, ort = (dyndq.run(model, {"w4": w4}, engine=e, outputs=["d"])["d"] for e in ENGINES)
    assert ref.dtype == ort.dtype == ml_dtypes.bfloat16 and ref.tobytes() == ort.tobytes()


def with_if(model_x):
    """y = If(c) then (t = Neg(x)) else (e = Abs(x)): t and e are values of the branches only."""
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", T.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", T.FLOAT, [2])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")], "g",
                              [helper.make_tensor_value_info("c", T.BOOL, []), helper.make_tensor_value_info("x", T.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("engine", ENGINES)
def test_names_the_model_cannot_give_are_each_named(engine):
    model = with_if(None)
    feeds = {"c": np.array(True), "x": np.array([1.0, -2.0], np.float32)}
    assert dyndq.run(model, feeds, engine=engine, outputs=["y", "x"])["y"].tolist() == [-1.0, 2.0]
    with pytest.raises(OutputNameError) as e:
        dyndq.run(model, feeds, engine=engine, outputs=["t", "nosuch", "y", "y"])
    assert [str(p) for p in e.value.problems] == [
        "t: found a value inside the body graph 'then', which only its node sees; allowed: a value of the main "
        "graph: a graph input, an initializer or the output of one of its nodes",
        "nosuch: found no value of that name in the model; allowed: a value of the main graph: a graph input, an "
        "initializer or the output of one of its nodes",
        "y: found a second request for it; allowed: each value asked for once"]
    with pytest.raises(OutputNameError, match=r"outputs\[1\]: found an empty name"):
        dyndq.run(model, feeds, engine=engine, outputs=["y", ""])
    with pytest.raises(OutputNameError, match="outputs: found an empty list"):
        dyndq.run(model, feeds, engine=engine, outputs=[])
    with pytest.raises(TypeError, match="not one string"):
        dyndq.run(model, feeds, engine=engine, outputs="y")


def test_a_value_the_export_loses_is_named(monkeypatch):
    """A value asked for that the export to standard ONNX no longer holds by its name is named,
    never replaced by another (the export is changed here to rename the DynamicDequantize's output)."""
    import dyndq.exporter

    real = dyndq.exporter.export

    def renaming(model, **kwargs):
        out = real(model, **kwargs)
        for n in out.graph.node:
            n.input[:] = ["w_renamed" if i == "w" else i for i in n.input]
            n.output[:] = ["w_renamed" if o == "w" else o for o in n.output]
        for o in out.graph.output:
            o.name = "w_renamed" if o.name == "w" else o.name
        return out

    monkeypatch.setattr(dyndq.exporter, "export", renaming)
    model = tiny(helper.make_tensor_value_info("y", T.FLOAT, ["batch", 3]))
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.run(model, {"x": X}, engine="onnxruntime", outputs=["w", "z"])
    assert [p.argument for p in e.value.problems] == ["w"]
    assert "removed or renamed" in str(e.value) and "the reference engine" in str(e.value)


def test_cli_run_output(tmp_path, capsys, demo):
    model, x = demo
    dyndq.save_model(model, tmp_path / "m.onnx")
    np.save(tmp_path / "x.npy", x)
    run = ("run", tmp_path / "m.onnx", "-i", f"x={tmp_path / 'x.npy'}")
    for engine in ENGINES:
        code, out, err = call(capsys, *run, "--engine", engine, "--output", "w2_dequantized", "--output", "h2")
        assert code == 0, err
        assert [line.split(":")[0] for line in out.splitlines()] == ["w2_dequantized", "h2"]
        assert out.startswith("w2_dequantized: float32[128, 64]")
    w3 = "w3_DynamicDequantize_out"  # (float16: the Cast after it gives the MatMul float32)
    code, out, err = call(capsys, *run, "--output", w3, "--output-dir", tmp_path / "out", "--engine", "onnxruntime")
    assert code == 0, err
    assert np.load(tmp_path / "out" / f"{w3}.npy").tobytes() == dyndq.run(model, {"x": x}, outputs=[w3])[w3].tobytes()
    code, out, err = call(capsys, *run, "--output", "nosuch", "--output-dir", tmp_path / "new")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "--output nosuch: found no value of that name in the model" in err
    assert not (tmp_path / "new").exists()
