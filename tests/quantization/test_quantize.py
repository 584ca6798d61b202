"""dyndq.quantize on graphs: every op form, shared weights, weights in subgraphs, the report,
the engines agreeing, and bad inputs named as problems."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.quantization.numerics import quantize_weight

from quantize_models import dequantized, heavy, mlp


def one_node(op, weight, *, a_shape=None, out_shape=None, opset=21, ir=10, **attrs):
    """A model of one node reading `weight` (an initializer named W): MatMul/Gemm(x, W) or Gather(W, ids)."""
    elem = helper.np_dtype_to_tensor_dtype(weight.dtype)
    if op == "Gather":
        inputs, node = [helper.make_tensor_value_info("ids", T.INT64, ["n"])], helper.make_node("Gather", ["W", "ids"], ["y"], name="node", **attrs)
    else:
        inputs, node = [helper.make_tensor_value_info("x", elem, a_shape)], helper.make_node(op, ["x", "W"], ["y"], name="node", **attrs)
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", elem, out_shape)], [nh.from_array(weight, "W")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir)


def initializers(model):
    return {t.name: nh.to_array(t) for t in model.graph.initializer}


def table_through_gather(model, rows):
    """The output of a Gather-of-every-row model on both engines (Gather is exact: its output
    is the dequantized table itself)."""
    feeds = {"ids": np.arange(rows, dtype=np.int64)}
    return [dyndq.run(model, feeds, engine=e)["y"] for e in ("reference", "onnxruntime")]


@pytest.mark.parametrize("dtype,scale_dtype", [(np.float32, None), (np.float16, None), (np.float32, "float16"),
                                               (np.float16, "float32"), (np.float32, "bfloat16")])
@pytest.mark.parametrize("hidden,group", [(256, 128), (200, 64), (96, -1)])
@pytest.mark.parametrize("bits,symmetric", [(4, False), (4, True), (8, False)])
def test_gather_tables_come_back_exactly_on_both_engines(dtype, scale_dtype, hidden, group, bits, symmetric):
    table = heavy((40, hidden), 1, dtype=dtype)
    model = one_node("Gather", table, out_shape=["n", hidden])
    out, report = dyndq.quantize(model, bits=bits, group_size=group, symmetric=symmetric, scale_dtype=scale_dtype, evaluate=False)
    assert dyndq.check(out) == []
    want = dequantized(quantize_weight(table, axis=1, group_size=group, bits=bits, symmetric=symmetric,
                                       scale_dtype=scale_dtype, rule="gather"), dtype)
    for got in table_through_gather(out, 40):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    layer, = report.layers
    assert layer.form.startswith(f"{'' if symmetric else 'u'}int{bits} ")
    assert ("per_channel" in layer.form) == (group == -1)
    assert ("Slice" in layer.form) == (hidden % group != 0 and group != -1)
    assert ("Cast" in layer.form) == (scale_dtype not in (None, np.dtype(dtype).name))


@pytest.mark.parametrize("op,shape,attrs,axis", [
    ("MatMul", (256, 48), {}, 0),
    ("MatMul", (200, 48), {}, 0),  # K not a multiple of the group: padded, then a Slice
    ("MatMul", (3, 128, 16), {}, 1),  # batched B: groups along its rows, per batch
    ("Gemm", (256, 48), {"transB": 0}, 0),
    ("Gemm", (48, 256), {"transB": 1}, 1),
])
def test_every_op_form(op, shape, attrs, axis):
    w = heavy(shape, 2)
    k = shape[axis]
    if op == "Gemm":
        a_shape, out_shape = [5, k], [5, 48]
    else:
        a_shape, out_shape = [*shape[:-2], 5, k], [*shape[:-2], 5, shape[-1]]
    model = one_node(op, w, a_shape=a_shape, out_shape=out_shape, **attrs)
    out, report = dyndq.quantize(model, group_size=64)
    assert dyndq.check(out) == []
    layer, = report.layers
    assert layer.ops == [op] and layer.shape == list(shape) and layer.nodes == ["node"]
    q = quantize_weight(w, axis=axis, group_size=64)
    dq = dequantized(q, w.dtype)
    x = np.random.default_rng(0).standard_normal(a_shape).astype(np.float32)
    want = x @ (dq.T if attrs.get("transB") else dq)
    for engine in ("reference", "onnxruntime"):
        got = dyndq.run(out, {"x": x}, engine=engine)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # (float MatMul: summed in each engine's order)
    # the report's error is that of the weight the graph holds
    assert layer.relative_error == pytest.approx(np.linalg.norm(w - dq) / np.linalg.norm(w), rel=1e-6)
    assert layer.cosine == pytest.approx(float((w * dq).sum() / np.linalg.norm(w) / np.linalg.norm(dq)), rel=1e-6)
    assert layer.max_abs_error == pytest.approx(float(np.abs(w - dq).max()), rel=1e-6)
    assert report.outputs and report.outputs[0].name == "y" and report.outputs[0].relative_error > 0
    assert "W" not in initializers(out)  # the float weight is gone


def test_a_whole_model_with_every_op_and_its_report():
    model = mlp()
    before = model.SerializeToString()
    out, report = dyndq.quantize(model, method="search")
    assert model.SerializeToString() == before  # the model passed in is never changed
    assert dyndq.check(out) == []
    assert [layer.name for layer in report.layers] == ["E", "W1", "W2"]
    assert [layer.ops for layer in report.layers] == [["Gather"], ["MatMul"], ["Gemm"]]
    # bits/32 of the float weights, plus the scales (4 bytes per group of 128 float32) and zero points (half a byte)
    assert [layer.bytes_after / layer.bytes_before for layer in report.layers[:2]] == [4 / 32 + 4 / 512 + 0.5 / 512] * 2
    assert report.layers[2].form.endswith("padded 192 -> 256 + Slice")  # (W2 is read with transB=1: K is 192)
    assert 4 / 32 < report.size_ratio < 0.16
    (o,) = report.outputs
    assert 0 < o.relative_error < 0.3 and o.cosine > 0.95  # (three layers of 4-bit weights, errors compounding)
    assert "seed 0" in report.outputs_note
    assert [n.op_type for n in out.graph.node[:3]] == ["DynamicDequantize"] * 3
    assert {o.domain: o.version for o in out.opset_import}["org.dyndq"] == 2
    text = "\n".join(report.table())
    assert "E" in text and "per_group [1, 128]" in text and "rel. error" in text
    d = report.as_dict()
    assert d["layers"][1]["name"] == "W1" and d["size_ratio"] == report.size_ratio


def test_search_beats_rtn_on_every_weight_of_a_model():
    model = mlp(k=512, n=256, seed=3)
    _, rtn = dyndq.quantize(model, evaluate=False)
    _, found = dyndq.quantize(model, method="search", evaluate=False)
    for a, b in zip(rtn.layers, found.layers):
        assert b.relative_error <= 0.97 * a.relative_error, (a.name, a.relative_error, b.relative_error)


def test_a_shared_weight_is_quantized_once():
    w = heavy((128, 32), 5)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["a"], name="first"), helper.make_node("MatMul", ["x", "W"], ["b"], name="second"),
         helper.make_node("Add", ["a", "b"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 128])], [helper.make_tensor_value_info("y", T.FLOAT, [2, 32])],
        [nh.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    out, report = dyndq.quantize(model)
    layer, = report.layers
    assert layer.nodes == ["first", "second"]
    assert [n.op_type for n in out.graph.node].count("DynamicDequantize") == 1
    assert out.graph.node[1].input[1] == out.graph.node[2].input[1] == out.graph.node[0].output[0]


def test_a_weight_another_node_reads_keeps_its_float_copy():
    w = heavy((128, 128), 6)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"), helper.make_node("Add", ["a", "W"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [128, 128])], [helper.make_tensor_value_info("y", T.FLOAT, [128, 128])],
        [nh.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    out, report = dyndq.quantize(model)
    assert "W" in initializers(out) and out.graph.node[-1].input == ["a", "W"]
    assert "add (Add)" in report.layers[0].notes[0]


def test_weights_of_subgraph_nodes_from_an_outer_graph():
    w = heavy((128, 16), 7)
    branch = lambda name: helper.make_graph(  # noqa: E731
        [helper.make_node("MatMul", ["x", "W"], [f"{name}_y"], name=f"{name}_mm")], name, [],
        [helper.make_tensor_value_info(f"{name}_y", T.FLOAT, [2, 16])])
    g = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=branch("then"), else_branch=branch("else"))], "g",
        [helper.make_tensor_value_info("c", T.BOOL, []), helper.make_tensor_value_info("x", T.FLOAT, [2, 128])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 16])], [nh.from_array(w, "W")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    out, report = dyndq.quantize(model, evaluate=False)
    layer, = report.layers
    assert sorted(layer.nodes) == ["else_mm", "then_mm"] and layer.graph == "main"
    assert dyndq.check(out) == []
    x = np.ones((2, 128), np.float32)
    dq = dequantized(quantize_weight(w, axis=0, group_size=128))
    for engine in ("reference", "onnxruntime"):
        got = dyndq.run(out, {"c": np.array(True), "x": x}, engine=engine)["y"]
        np.testing.assert_allclose(got, x @ dq, rtol=1e-5, atol=1e-5)


def test_an_old_model_listing_initializers_as_inputs():
    w = heavy((128, 16), 8)
    model = one_node("MatMul", w, a_shape=[2, 128], out_shape=[2, 16], ir=3, opset=9)
    model.graph.input.append(helper.make_tensor_value_info("W", T.FLOAT, [128, 16]))
    out, report = dyndq.quantize(model, evaluate=False)
    assert [layer.name for layer in report.layers] == ["W"]
    assert "W" not in [vi.name for vi in out.graph.input]
    assert out.ir_version >= 10  # int4 tensors


# -- bad inputs: named problems ------------------------------------------------------------------


def problems_of(excinfo):
    return [str(p) for p in excinfo.value.problems]


@pytest.mark.parametrize("kwargs,argument", [
    (dict(group_size=0), "group_size"), (dict(group_size=-2), "group_size"), (dict(group_size=True), "group_size"),
    (dict(bits=3), "bits"), (dict(method="nope"), "method"), (dict(scale_dtype="int8"), "scale_dtype"),
    (dict(ops=("Conv",)), "ops"), (dict(exclude=("nope",)), "exclude"), (dict(ops=()), "ops"), (dict(seed=-1), "seed"),
])
def test_bad_options_are_named(model, kwargs, argument):
    from dyndq.quantization import OptionError

    with pytest.raises(OptionError) as e:  # (a ValidationError: about the call, not the model)
        dyndq.quantize(model, **kwargs)
    assert isinstance(e.value, dyndq.ValidationError)
    assert [p.argument for p in e.value.problems] == [argument]


def test_every_weight_that_cannot_be_quantized_is_named():
    rng = np.random.default_rng(0)
    g = helper.make_graph([
        helper.make_node("MatMul", ["x", "fed"], ["a"], name="not_constant"),
        helper.make_node("MatMul", ["x", "override"], ["b"], name="overridable"),
        helper.make_node("Gather", ["ints", "ids"], ["c"], name="integer"),
        helper.make_node("MatMul", ["x", "wide"], ["d"], name="float64"),
        helper.make_node("MatMul", ["x", "short"], ["e"], name="short_axis"),
        helper.make_node("MatMul", ["x", "good"], ["f"], name="good"),
    ], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 64]), helper.make_tensor_value_info("fed", T.FLOAT, [64, 8]),
             helper.make_tensor_value_info("override", T.FLOAT, [64, 8]), helper.make_tensor_value_info("ids", T.INT64, [3])],
        [helper.make_tensor_value_info(n, T.FLOAT, None) for n in "abdef"] + [helper.make_tensor_value_info("c", T.INT8, None)],
        [nh.from_array(rng.standard_normal((64, 8)).astype(np.float32), "override"),
         nh.from_array(np.ones((10, 4), np.int8), "ints"), nh.from_array(rng.standard_normal((64, 8)), "wide"),
         nh.from_array(rng.standard_normal((64, 8)).astype(np.float32), "short"),
         nh.from_array(rng.standard_normal((256, 8)).astype(np.float32), "good")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    model.graph.node[4].input[1] = "short"
    out, report = dyndq.quantize(model, group_size=128, evaluate=False)
    # (an axis shorter than the group is one padded group, as ONNX Runtime quantizes it; a B fed
    # at run time is an activation, counted, not a weight left alone)
    assert [layer.name for layer in report.layers] == ["short", "good"]
    said = [str(p) for p in report.left_alone]
    assert len(said) == 3
    assert "'overridable' (MatMul): B ('override'): found an initializer that is also a graph input" in said[0]
    assert "'integer' (Gather): data ('ints'): found an int8 tensor; allowed: a float32, float16 or bfloat16 weight" in said[1]
    assert "B ('wide'): found a float64 tensor" in said[2]
    assert report.activations.startswith("1 MatMul whose B is an activation")
    with pytest.raises(dyndq.ValidationError) as e:  # strict: every one of them, and no model
        dyndq.quantize(model, group_size=128, strict=True)
    assert problems_of(e) == said


def test_nan_weights_are_left_alone_and_said():
    w = heavy((128, 8), 9)
    w[3, 3] = np.nan
    model = mlp()
    model.graph.initializer[1].CopyFrom(nh.from_array(np.pad(w, ((128, 0), (0, 184))), "W1"))
    out, report = dyndq.quantize(model, evaluate=False)
    assert [layer.name for layer in report.layers] == ["E", "W2"]
    assert "B ('W1'): found NaN or infinity among its values; allowed: finite weights" in str(report.left_alone[0])
    assert "W1" in initializers(out)


def test_nothing_to_quantize_is_a_problem():
    from dyndq.quantization import NothingToQuantize

    model = one_node("MatMul", np.ones((64, 8), np.int8), a_shape=[2, 64], out_shape=[2, 8])
    with pytest.raises(NothingToQuantize) as e:
        dyndq.quantize(model)
    assert "found an int8 tensor" in problems_of(e)[0]
    assert str(e.value).startswith("nothing to quantize: 1 weight left alone\n  - graph 'main' node 0 'node'")
    with pytest.raises(NothingToQuantize) as e:  # no node of those ops at all
        dyndq.quantize(model, ops=["Gather", "Gemm"])
    assert e.value.problems == [] and str(e.value) == "nothing to quantize: no Gather or Gemm node reads a constant float weight"


def test_exclude_by_node_or_weight_name(model):
    _, report = dyndq.quantize(model, exclude=["fc1", "E"], evaluate=False)
    assert [layer.name for layer in report.layers] == ["W2"]
    _, report = dyndq.quantize(model, ops=["Gather"], evaluate=False)
    assert [layer.name for layer in report.layers] == ["E"]


def test_bfloat16_model_runs_on_the_reference_engine():
    model = mlp(dtype=ml_dtypes.bfloat16)
    out, report = dyndq.quantize(model, evaluate=False)
    assert dyndq.check(out) == []
    y = dyndq.run(out, {"ids": np.array([0, 3])})["y"]
    assert y.dtype == ml_dtypes.bfloat16 and y.shape == (2, 256)


def test_dyndq_quantize_stays_the_function_once_the_package_is_imported():
    import dyndq.quantization.rtn  # noqa: F401  (binds dyndq.quantization, never dyndq.quantize)

    assert dyndq.quantize is dyndq.quantization.quantize
    out, report = dyndq.quantize(mlp(), evaluate=False)
    assert len(report.layers) == 3


def test_codes_over_one_mib_run_on_onnxruntime():
    """The onnxruntime engine hands an initializer over 1 MiB to ONNX Runtime as an input; one of
    int4 codes (which its Python API takes no array of) passes through its int4 boundary."""
    model = mlp(k=1024, n=1024, vocab=4096)  # E's codes: 2 MiB
    out, report = dyndq.quantize(model)
    assert report.outputs and report.outputs[0].cosine > 0.9, report.outputs_note
    ids = np.arange(4, dtype=np.int64)
    got = dyndq.run(out, {"ids": ids}, engine="onnxruntime")["y"]
    np.testing.assert_allclose(got, dyndq.run(out, {"ids": ids})["y"], rtol=1e-4, atol=1e-5)
