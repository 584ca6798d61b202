"""dump, the writer of oneDNN graph JSON (dyndq/onednn/writer.py): what it writes, load reads (or it
refuses, saying why), dump of load keeps kinds, attributes, dtypes, shapes and names, load of dump
computes the same; the inverses of Reshape, the reductions and QuantizeLinear; a node without a
kind is named alone; a loaded graph is written back in its file's order, with its strides and
layouts."""
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
from cases import hand_model, same_bits, weighted_model
from dyndq import onednn
from dyndq.cli import main
from dyndq.onednn.kinds import inverse_table
from dyndq.opdefs import dtypes

DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"

ONEDNN_DTYPES = [d for d in dtypes.DTYPES if d.onednn]

BOOL, F32, U8 = dtypes.by_name("bool"), dtypes.by_name("float32"), dtypes.by_name("uint8")


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype.onnx, shape)


def _const(name, value, dtype):
    return numpy_helper.from_array(np.asarray(value).astype(dtype.numpy), name)


def _one_node(op_type: str, d: dtypes.DType) -> onnx.ModelProto:
    """A model of one `op_type` node named 'n' whose data inputs (and output, where the op keeps
    the dtype) are of dtype d; constants a kind reads as attributes are float32 or int64."""
    s = [2, 3]
    inputs, names, constants, out, attrs = [_vi("a", d, s)], ["a"], [], _vi("y", d, s), {}
    if op_type in ("Add", "Sub", "Mul", "Div", "Max", "Min", "GreaterOrEqual", "Concat"):
        inputs.append(_vi("b", d, s))
        names.append("b")
    if op_type == "GreaterOrEqual":
        out = _vi("y", BOOL, s)
    elif op_type == "Concat":
        out, attrs = _vi("y", d, [4, 3]), {"axis": 0}
    elif op_type == "Where":
        inputs, names = [_vi("c", BOOL, s), _vi("a", d, s), _vi("b", d, s)], ["c", "a", "b"]
    elif op_type == "MatMul":
        inputs, names, out = [_vi("a", d, [2, 3]), _vi("b", d, [3, 4])], ["a", "b"], _vi("y", d, [2, 4])
    elif op_type == "Cast":
        out, attrs = _vi("y", F32, s), {"to": F32.onnx}
    elif op_type == "Clip":
        names, constants = ["a", "lo", "hi"], [_const("lo", -1.0, F32), _const("hi", 1.0, F32)]
    elif op_type == "Reshape":
        names, constants, out = ["a", "shape"], [_const("shape", [3, 2], dtypes.by_name("int64"))], _vi("y", d, [3, 2])
    elif op_type == "Transpose":
        out = _vi("y", d, [3, 2])
    elif op_type in ("ReduceSum", "ReduceMax"):
        names, constants, out = ["a", "axes"], [_const("axes", [1], dtypes.by_name("int64"))], _vi("y", d, [2, 1])
    elif op_type == "Softmax":
        attrs = {"axis": -1}
    elif op_type == "Elu":
        attrs = {"alpha": 0.5}
    elif op_type == "LayerNormalization":
        inputs += [_vi("g", d, [3]), _vi("bb", d, [3])]
        names += ["g", "bb"]
    elif op_type == "QuantizeLinear":
        names, constants, out = ["a", "scale"], [_const("scale", 0.5, F32)], _vi("y", U8, s)
    elif op_type == "DynamicDequantize":
        inputs, names, out = [_vi("a", d, s), _vi("scale", F32, [1])], ["a", "scale"], _vi("y", F32, s)
    domain = "org.dyndq" if op_type == "DynamicDequantize" else ""
    node = helper.make_node(op_type, names, ["y"], name="n", domain=domain, **attrs)
    return dyndq.make_model(helper.make_graph([node], "one", inputs, [out], constants))


def _round_trip(op_type: str, d: dtypes.DType) -> str | None:
    """None when dump of a one-node model either refuses it, each problem saying what is allowed
    at the node (or, for a type ONNX itself has no such node for, naming it as ONNX's checker
    does), or writes a graph load reads back with the model's input and output types; else why not."""
    model = _one_node(op_type, d)
    try:
        doc = onednn.dump(model)
    except dyndq.ValidationError as e:
        named = all(p.allowed and (p.node == "n" or "node name: n" in p.found) for p in e.problems)
        return None if e.problems and named else f"refused without saying where or why: {e}"
    try:
        again, _ = onednn.load(json.loads(json.dumps(doc)))
    except dyndq.ValidationError as e:
        return f"written, then refused by load: {e}"
    initializers = {t.name for t in model.graph.initializer}
    types = [[(vi.type.tensor_type.elem_type, [x.dim_value for x in vi.type.tensor_type.shape.dim])
              for vi in list(m.graph.input) + list(m.graph.output) if vi.name not in initializers] for m in (again, model)]
    return None if types[0] == types[1] else f"load gives {types[0]}, the model has {types[1]}"


def test_every_kind_and_dtype_the_exporter_can_write_imports_or_is_refused_with_a_reason():
    """Every ONNX op type dump writes as a kind, with each dtype oneDNN names (inputs and, where
    the op keeps the dtype, output): 27 op types x 15 dtypes."""
    failures = {f"{t} {d.onednn}": why for t in sorted(inverse_table()) for d in ONEDNN_DTYPES
                if (why := _round_trip(t, d)) is not None}
    assert not failures, f"{len(failures)} pairs: " + "\n".join(f"{k}: {v}" for k, v in failures.items())


def test_what_oneDNN_does_not_take_is_refused_on_export_saying_what_it_takes():
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(_one_node("Relu", dtypes.by_name("float64")))
    [p] = e.value.problems
    assert (p.node, p.op, p.argument, p.found) == ("n", "Relu", "inputs[0]", "dtype f64")
    assert p.allowed.startswith("bf16, f16, f32") and "ReLU" in p.allowed


def test_the_cli_refuses_such_an_export_and_writes_nothing(tmp_path, capsys):
    src, out = tmp_path / "relu.onnx", tmp_path / "relu.json"
    onnx.save(_one_node("Relu", dtypes.by_name("float64")), src)
    assert main(["export-onednn", str(src), str(out)]) == 1
    assert "what oneDNN's ReLU takes" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize("b_shape", [[], [5], [1, 1]], ids=["host-scalar", "tensor", "one-element"])
@pytest.mark.parametrize("swap", [False, True], ids=["tensor-first", "tensor-second"])
@pytest.mark.parametrize("kind, op", [("Add", np.add), ("Subtract", np.subtract)])
def test_s32_add_and_subtract_are_exact_and_saturate_to_s32_on_both_engines(kind, op, swap, b_shape):
    lt = {"layout_type": "strided", "property_type": "variable"}
    a = np.array([2**31 - 1, -2**31, 5, 0, -100], np.int32)
    b = np.array([7, -7, 2**31 - 1, -2**31, 3], np.int32)[:1 if b_shape != [5] else 5].reshape(b_shape)
    x, y = (b, a) if swap else (a, b)
    out = list(np.broadcast_shapes(x.shape, y.shape))
    doc = {"version": "3.9.0", "graph": [{
        "id": 0, "name": "mask", "kind": kind, "attrs": {},
        "inputs": [{"id": 0, "dtype": "s32", "shape": list(x.shape), "stride": [], **lt},
                   {"id": 1, "dtype": "s32", "shape": list(y.shape), "stride": [], **lt}],
        "outputs": [{"id": 2, "dtype": "s32", "shape": out, "stride": [], **lt}]}]}
    model, _ = onednn.load(doc)
    want = np.clip(op(x.astype(np.int64), y.astype(np.int64)), -2**31, 2**31 - 1).astype(np.int32)
    for engine in ("reference", "onnxruntime"):
        [got] = dyndq.run(model, {model.graph.input[0].name: x, model.graph.input[1].name: y}, engine=engine).values()
        assert got.dtype == np.int32 and np.array_equal(got, want), engine
    assert [op["kind"] for op in onednn.dump(model)["graph"]] == [kind]


def test_a_node_without_a_kind_is_named_alone_beside_the_problems_of_the_others():
    """No false "a graph input or output no op uses" for the values of a refused node."""
    f64 = dtypes.by_name("float64")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu"), helper.make_node("Neg", ["y"], ["z"], name="neg")],
                          "g", [_vi("x", f64, [2])], [_vi("z", f64, [2])])
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(dyndq.make_model(g))
    assert sorted((p.node, p.argument) for p in e.value.problems) == [("neg", "op_type"), ("relu", "inputs[0]")]
    g = helper.make_graph([helper.make_node("Neg", ["x"], ["y"], name="neg"), helper.make_node("Relu", ["y"], ["z"], name="relu")],
                          "g", [_vi("x", F32, [2])], [_vi("z", F32, [2])])
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(dyndq.make_model(g))
    assert [(p.node, p.argument) for p in e.value.problems] == [("neg", "op_type")]


def _lt(i, shape, stride, layout="strided", prop="variable"):
    return {"id": i, "dtype": "f32", "shape": shape, "stride": stride, "layout_type": layout, "property_type": prop}


def test_dump_writes_a_loaded_graph_back_in_its_order_with_its_strides():
    """A transposed src, PyTorch's undef layout with an unknown stride, and consumers listed
    before their producers: dump gives the file's ops back as they were."""
    doc = {"version": "3.9.0", "engine_kind": "cpu", "fpmath_mode": "strict", "fpmath_mode_apply_to_int": "false",
           "input_ports": [0], "output_ports": [3], "graph": [
               {"id": 7, "name": "last", "kind": "Exp", "attrs": {},
                "inputs": [_lt(2, [3, 2], [2, 1])], "outputs": [_lt(3, [3, 2], [2, 1])]},
               {"id": 5, "name": "middle", "kind": "StaticTranspose", "attrs": {"order": {"type": "s64[]", "value": [1, 0]}},
                "inputs": [_lt(1, [2, 3], [-9223372036854775808], "undef")], "outputs": [_lt(2, [3, 2], [2, 1])]},
               {"id": 6, "name": "first", "kind": "ReLU", "attrs": {},
                "inputs": [_lt(0, [2, 3], [1, 2])], "outputs": [_lt(1, [2, 3], [-9223372036854775808], "undef")]},
           ]}
    model, _ = onednn.load(doc)
    assert [n.name for n in model.graph.node] == ["first", "middle", "last"]  # ONNX's order: producers first
    assert onednn.dump(model) == doc


def _layout_changes(path: Path) -> list[str]:
    """How dump(load(file)) differs from the file in its order of ops and in the strides, layout
    and property type of each tensor whose shape it writes as the file does."""
    doc = json.loads(path.read_text())
    back = onednn.dump(onednn.load(doc)[0])
    if [op["id"] for op in back["graph"]] != [op["id"] for op in doc["graph"]]:
        return [f"ops in the order {[op['id'] for op in back['graph']]}"]
    changes = []
    for a, b in zip(doc["graph"], back["graph"]):
        for side in ("inputs", "outputs"):
            for t, u in zip(a[side], b[side]):
                kept = [k for k in ("stride", "layout_type", "property_type") if k in t]
                if t["shape"] == u["shape"] and [t[k] for k in kept] != [u[k] for k in kept]:
                    changes.append(f"op {a['id']} tensor {t['id']}: {[u[k] for k in kept]}, not {[t[k] for k in kept]}")
    return changes


def test_dump_of_every_graph_here_keeps_the_file_order_and_each_tensor_layout():
    """The anchors, the kinds' graphs and the upstream copies (all but Dropout's): a dim the file
    leaves unknown is written as computed, so only tensors of the file's shape are compared."""
    paths = sorted(p for p in DATA.rglob("*.json") if "bad" not in p.parts and "dropout" not in p.name)
    changes = {str(p.relative_to(DATA)): c for p in paths if (c := _layout_changes(p))}
    assert len(paths) > 60 and not changes, changes


# -- the JSON and its weights: all or nothing -------------------------------------------------------


def _two_layers(path):
    """A float model of two MatMul layers (two weights), saved to `path`."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((256, 256), (256, 128)))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
                           helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2")], "two",
                          [_vi("x", F32, [2, 256])], [_vi("y", F32, [2, 128])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(dyndq.make_model(g), path)


def _failing_second_save(monkeypatch):
    save, calls = np.save, []

    def failing(f, *args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return save(f, *args, **kwargs)

    monkeypatch.setattr(np, "save", failing)


def _listing(folder):
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", [["export-onednn", "--weights-as-inputs"],
                                     ["quantize", "--emit", "onednn-json", "--no-evaluate"]],
                         ids=["export-onednn", "quantize"])
def test_a_failed_weight_write_leaves_neither_json_nor_weights(tmp_path, monkeypatch, capsys, command):
    src, out = tmp_path / "in" / "m.onnx", tmp_path / "out" / "m.json"
    src.parent.mkdir()
    out.parent.mkdir()
    _two_layers(src)
    argv = [command[0], str(src), str(out), *command[1:]]
    with monkeypatch.context() as m:
        _failing_second_save(m)
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err
    assert os.listdir(tmp_path / "out") == []  # no JSON, no weights folder, no staging file
    assert main(argv) == 0  # a write that succeeds, then one that fails over it: the first is kept whole
    before = _listing(tmp_path / "out")
    assert sorted(before) == ["m-weights/" + n for n in sorted(os.listdir(out.parent / "m-weights"))] + ["m.json"]
    with monkeypatch.context() as m:
        _failing_second_save(m)
        assert main(argv) == 2
    assert _listing(tmp_path / "out") == before and sorted(os.listdir(tmp_path / "out")) == ["m-weights", "m.json"]


def test_an_unwritable_target_leaves_no_weights_folder(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    _two_layers(src)
    (tmp_path / "m.json").mkdir()  # the JSON's path is a folder
    assert main(["export-onednn", str(src), str(tmp_path / "m.json"), "--weights-as-inputs"]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert not (tmp_path / "m-weights").exists()
    (tmp_path / "m.json").rmdir()
    (tmp_path / "m-weights").write_text("a file where the weights' folder goes")
    assert main(["export-onednn", str(src), str(tmp_path / "m.json"), "--weights-as-inputs"]) == 2
    assert "is not a folder" in capsys.readouterr().err and not (tmp_path / "m.json").exists()


def test_import_onednn_writes_the_model_and_its_inputs_all_or_nothing(tmp_path, monkeypatch, capsys):
    src, out, inputs = DATA / "kinds" / "Add.json", tmp_path / "add.onnx", tmp_path / "add-in"
    argv = ["import-onednn", str(src), str(out), "--inputs-dir", str(inputs)]
    assert main(argv + ["--seed", "1"]) == 0
    before = _listing(tmp_path)
    with monkeypatch.context() as m:
        _failing_second_save(m)
        assert main(argv) == 2  # another seed: other inputs; the second cannot be written
    assert "No space left on device" in capsys.readouterr().err
    assert _listing(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["add-in", "add.onnx"]


# -- what load leaves in a model's metadata, edited by hand ----------------------------------------


def _with_metadata(key: str, value: str, on_model: bool = False) -> onnx.ModelProto:
    model, _ = onednn.load(DATA / "kinds" / "Add.json")
    targets = [model] if on_model else [n for n in model.graph.node if any(p.key == key for p in n.metadata_props)]
    for target in targets:
        for p in target.metadata_props:
            if p.key == key:
                p.value = value
    return model


@pytest.mark.parametrize("key, value, on_model", [
    ("onednn.op", "{", False), ("onednn.op", "[]", False), ("onednn.op", "{}", False),
    ("onednn.op", '{"id": 0, "name": "add", "kind": "Add", "attrs": {}, "inputs": [0, 1], "outputs": [2]}', False),
    ("onednn.op", "1" * 5000, False), ("onednn.op", "[" * 3000 + "]" * 3000, False),
    ("onednn.id", "zz", False), ("onednn.tensors", "[]", True), ("onednn.tensors", '{"x": [1]}', True),
], ids=["malformed", "a-list", "empty", "no-names", "5000-digits", "deep", "id-not-int", "tensors-list", "tensors-keys"])
def test_metadata_not_as_load_writes_it_is_named_by_dump_and_ignored_by_example_inputs(key, value, on_model):
    model = _with_metadata(key, value, on_model)
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(model)
    assert [p.argument for p in e.value.problems] == [f"metadata {'onednn.op' if key == 'onednn.id' else key}"]
    assert set(onednn.example_inputs(model)) == {i.name for i in model.graph.input}


GOOD = sorted(p for p in DATA.rglob("*.json")  # anchors and kinds (upstream/ has its own test)
              if not {"bad", "upstream"} & set(p.relative_to(DATA).parts))


@pytest.mark.parametrize("path", GOOD, ids=lambda p: str(p.relative_to(DATA)))
def test_dump_of_load_keeps_kinds_attributes_dtypes_shapes_and_names(path):
    doc = json.loads(path.read_text())
    model = onednn.load(doc)[0]
    back = onednn.dump(model)
    again = onednn.load(back)[0]  # and the trip back gives the very same ONNX graph
    for field in ("node", "input", "output", "initializer", "value_info"):
        assert list(getattr(again.graph, field)) == list(getattr(model.graph, field)), field
    key = lambda op: op["id"]  # noqa: E731
    for a, b in zip(sorted(doc["graph"], key=key), sorted(back["graph"], key=key)):
        assert (a["id"], a["name"], a["kind"], a["attrs"]) == (b["id"], b["name"], b["kind"], b["attrs"])
        for side in ("inputs", "outputs"):
            assert [(t["id"], t["dtype"], t["shape"]) for t in a[side]] == [(t["id"], t["dtype"], t["shape"]) for t in b[side]]
    assert back["fpmath_mode"] == doc["fpmath_mode"] and back["version"] == doc["version"]
    assert back["output_ports"] == list(dict.fromkeys(doc.get("output_ports", back["output_ports"])))


def test_load_of_dump_gives_back_the_computation():
    model = hand_model()
    doc = onednn.dump(model)
    assert [op["kind"] for op in doc["graph"]] == ["DynamicDequantize", "MatMul", "Add"]
    assert doc["graph"][0]["attrs"]["qtype"] == {"type": "string", "value": "per_channel"}
    again, _ = onednn.load(json.loads(json.dumps(doc)))
    feeds = onednn.example_inputs(model, 3)
    renamed = dict(zip([i.name for i in again.graph.input], feeds.values()))
    [want] = dyndq.run(model, feeds).values()
    [got] = dyndq.run(again, renamed).values()
    assert same_bits(got, want)


def test_load_of_dump_of_a_float16_model_computes_the_same():
    """Native float16 Add and Mul in the model; float32 between exact Casts after the trip: the same
    bits, as each is one IEEE operation rounded once.  (Not so for Sigmoid: the reference evaluator
    computes a float16 Sigmoid with float16 intermediates, the imported graph in float32.)"""
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"], name="add"),
                           helper.make_node("Mul", ["c", "a"], ["d"], name="mul")], "f16",
                          [vi("a", TensorProto.FLOAT16, [3, 4]), vi("b", TensorProto.FLOAT16, [4])],
                          [vi("d", TensorProto.FLOAT16, [3, 4])])
    model = dyndq.make_model(g)
    again, _ = onednn.load(onednn.dump(model))
    feeds = onednn.example_inputs(model, 1)
    [want] = dyndq.run(model, feeds).values()
    [got] = dyndq.run(again, dict(zip([i.name for i in again.graph.input], feeds.values()))).values()
    assert same_bits(got, want)


def test_dump_refuses_what_onednn_cannot_express_naming_each():
    model = hand_model()
    model.graph.node.append(helper.make_node("LpNormalization", ["out"], ["n"], name="norm"))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(3, np.float32), "b"))
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(model)
    found = {(p.node, p.argument) for p in e.value.problems}
    assert ("norm", "op_type") in found and ("bias", "b") in found


def test_dump_maps_reshape_the_reductions_and_quantize_linear_back():
    model = weighted_model()
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


@pytest.mark.parametrize("src, scales, attrs, bad", [
    (TensorProto.INT2, TensorProto.FLOAT, {}, {"src"}),
    (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT16, {}, {"src"}),
    (TensorProto.FLOAT4E2M1, TensorProto.FLOAT8E8M0, {"output_dtype": TensorProto.FLOAT},
     {"src", "scales", "output_dtype"}),
    (TensorProto.INT8, TensorProto.FLOAT, {"output_dtype": TensorProto.BFLOAT16}, {"output_dtype"}),
    (TensorProto.UINT4, TensorProto.BFLOAT16, {"output_dtype": TensorProto.BFLOAT16}, set()),
    (TensorProto.INT8, TensorProto.FLOAT16, {}, set()),
])
def test_version_3_nodes_are_written_where_oneDNN_has_their_types_and_named_where_not(src, scales, attrs, bad):
    """oneDNN's DynamicDequantize takes s4/u4/s8/u8 codes and f32/f16/bf16 scales, dst of the
    scales' dtype: a version-3 node of those is written as it is (its output_dtype, the scales'
    own, left out), any other is refused naming each argument oneDNN lacks."""
    node = dyndq.make_node(["x", "s"], ["y"], name="dq", version=3, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", src, [4]),
                                            helper.make_tensor_value_info("s", scales, [1])],
                              [helper.make_tensor_value_info("y", 0, None)])
    model = dyndq.make_model(graph, versions={dyndq.DOMAIN: 3})
    if not bad:
        [op] = onednn.dump(model)["graph"]
        assert op["kind"] == "DynamicDequantize" and op["attrs"] == {}
        return
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(model)
    named = {p.argument for p in e.value.problems if p.node == "dq"}
    assert bad <= named <= bad | {"x", "s"}, str(e.value)


def tf2onnx_like_model() -> onnx.ModelProto:
    """What tf2onnx writes, in small: a batch dim without a size, a Reshape to a shape computed at
    run time (Shape, Gather, Slice, Concat), which ONNX's shape inference cannot give a rank,
    then a Softmax over axis -1 and a MatMul on that value of unknown rank."""
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"], name="dense/MatMul"),
             helper.make_node("Relu", ["h"], ["r"], name="dense/Relu"),
             helper.make_node("Shape", ["r"], ["s"], name="flatten/Shape"),
             helper.make_node("Gather", ["s", "one"], ["n"], name="flatten/n", axis=0),
             helper.make_node("Unsqueeze", ["n", "zero"], ["n1"], name="flatten/n1"),
             helper.make_node("Slice", ["s", "zero", "n1"], ["head"], name="flatten/head"),
             helper.make_node("Concat", ["head", "minus1"], ["shape"], name="flatten/shape", axis=0),
             helper.make_node("Reshape", ["r", "shape"], ["flat"], name="flatten/Reshape"),
             helper.make_node("Softmax", ["flat"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "W2"], ["y"], name="dense_1/MatMul")]
    inits = [_const("W1", np.full((16, 32), 0.1), F32), _const("W2", np.full((32, 8), 0.1), F32),
             numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    g = helper.make_graph(nodes, "tf2onnx", [_vi("x", F32, ["unk__6", 16])], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def test_a_value_of_unknown_rank_is_named_so_and_nothing_untrue_follows():
    """Each value of unknown rank is named once as of unknown rank (never taken as rank 0), and the
    ops reading it are not judged on a rank made up for it (no "axis: found -1; allowed: an
    integer in [0, -1]", no "rank 0")."""
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(tf2onnx_like_model(), weights_as_inputs=True)
    said = [str(p) for p in e.value.problems]
    unknown = "found a value of unknown rank (ONNX's shape inference cannot find it); allowed: a tensor of known " \
              "rank: oneDNN's graph JSON writes each tensor's dims"
    assert [s.split(": ", 1)[0] for s in said if unknown in s] == [
        "graph 'tf2onnx' node 7 'flatten/Reshape' (Reshape)", "graph 'tf2onnx' node 8 'softmax' (Softmax)",
        "graph 'tf2onnx' node 9 'dense_1/MatMul' (MatMul)"], said
    assert [s.split(": ", 2)[1] for s in said if unknown in s] == ["flat", "p", "y"]
    assert not [s for s in said if "rank 0" in s or "[0, -1]" in s], said
    # the rest: the ops oneDNN has no kind for, and the shape StaticReshape takes as an attribute only
    rest = sorted(s.split(": ", 2)[1] + ": " + s.split(": ", 2)[2].split(";")[0] for s in said if unknown not in s)
    assert rest == ["inputs[1]: found a value computed in the graph", "op_type: found Gather", "op_type: found Shape",
                    "op_type: found Slice", "op_type: found Unsqueeze"], rest


def test_an_axis_of_a_scalar_says_what_a_scalar_takes():
    """A SoftMax over a rank-0 tensor: its axis is judged against rank 0 in words that are true
    (not "an integer in [0, -1]")."""
    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=-1)], "g",
                          [_vi("x", F32, [])], [_vi("y", F32, [])])
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=7))
    said = [str(p) for p in e.value.problems]
    assert any("axis: found -1; allowed: 0 (its tensor is of rank 0, a scalar: no other axis)" in s for s in said), said
    assert not [s for s in said if "[0, -1]" in s], said


@pytest.mark.parametrize("code", [999, -1, 0])
def test_an_output_dtype_no_dtype_has_is_named_not_an_internal_error(tmp_path, capsys, code):
    """(export-onednn of such a node was exit 70: a KeyError in the dtype table.)"""
    from cases import call

    node = helper.make_node("DynamicDequantize", ["x", "s"], ["y"], domain=dyndq.DOMAIN, name="dq", output_dtype=code)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.INT8, [4]),
                                            helper.make_tensor_value_info("s", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    model = dyndq.make_model(graph, versions={dyndq.DOMAIN: 3})
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(model)
    assert [p.argument for p in e.value.problems] == ["output_dtype"] and f"found {code}" in str(e.value)
    onnx.save(model, tmp_path / "m.onnx")
    exit_code, out, err = call(capsys, "export-onednn", tmp_path / "m.onnx", tmp_path / "m.json")
    assert exit_code == 1 and "output_dtype: found" in err and "internal error" not in err
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]
