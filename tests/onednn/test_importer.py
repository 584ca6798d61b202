"""dyndq.onednn, point by point: each mapped kind against a NumPy oracle of oneDNN's documented
semantics (tests/data/onednn/kinds/), bad graphs refused with every problem named, the round
trips between ONNX and oneDNN JSON, int4 packing, example inputs, ports and names, and the CLI."""
import copy
import json
import math
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from cases import run_onnxruntime, same_bits
from onnx import TensorProto, helper

import dyndq
from dyndq import onednn
from dyndq.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"


KIND_FILES = sorted((DATA / "kinds").glob("*.json"))
GOOD = sorted(p for p in DATA.rglob("*.json")  # anchors and kinds (upstream/ has its own test)
              if not {"bad", "upstream"} & set(p.relative_to(DATA).parts))
MHA = DATA / "complex_fusion/mha/sdpa-compressed-kv-implicit-causal-mask-int8-gs128.json"


def _f(x):
    return np.asarray(x).astype(np.float64)


def _erf(x):
    return np.vectorize(math.erf)(x)


def _softmax_inf_as_zero(x, axis):
    top = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - np.where(np.isneginf(top), 0, top))
    out = e / np.sum(e, axis=axis, keepdims=True)
    return np.where(np.isneginf(top), 0.0, out)


def _layer_norm(x, gamma, beta, begin_norm_axis, epsilon, **_):
    axes = tuple(range(begin_norm_axis % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + epsilon) * gamma + beta


def _rms_norm(x, gamma, begin_norm_axis, epsilon, **_):
    """oneDNN's layer normalization under its rms_norm flag: the mean taken as 0."""
    axes = tuple(range(begin_norm_axis % x.ndim, x.ndim))
    return x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + epsilon) * gamma


def _quantize(x, scale, zp, dtype):
    lo, hi = (-128, 127) if dtype == np.int8 else (0, 255)
    return np.clip(np.round(np.float32(x) / np.float32(scale) + np.float32(zp)), lo, hi).astype(dtype)


# kind -> (oracle of the inputs and attributes, exact?)  Formulas from doc/graph/operations/*.md
ORACLES = {
    "Add": (lambda a, b, **_: _f(a) + _f(b), True),
    "Subtract": (lambda a, b, **_: _f(a) - _f(b), True),
    "Multiply": (lambda a, b, **_: _f(a) * _f(b), True),
    "Divide": (lambda a, b, **_: _f(a) / _f(b), True),
    "Maximum": (lambda a, b, **_: np.maximum(_f(a), _f(b)), True),
    "Minimum": (lambda a, b, **_: np.minimum(_f(a), _f(b)), True),
    "BiasAdd": (lambda a, b, data_format, **_: _f(a) + _f(b).reshape([-1] + [1] * (a.ndim - 2)
                                                                    if data_format == "NCX" else [-1]), True),
    "Clamp": (lambda a, min, max, **_: np.clip(_f(a), min, max), True),
    "Elu": (lambda a, alpha, **_: np.where(_f(a) > 0, _f(a), alpha * np.expm1(_f(a))), False),
    "Tanh": (lambda a, **_: np.tanh(_f(a)), False),
    "LayerNorm": (lambda a, g, b, **k: _layer_norm(_f(a), _f(g), _f(b), **k), False),
    "RMSNorm": (lambda a, g, **k: _rms_norm(_f(a), _f(g), **k), False),
    "SoftMaxBackward": (lambda dd, d, axis, **_: _f(d) * (_f(dd) - np.sum(_f(dd) * _f(d), axis=axis, keepdims=True)), False),
    "Sigmoid": (lambda a, **_: 1 / (1 + np.exp(-_f(a))), False),
    "ReLU": (lambda a, **_: np.maximum(_f(a), 0), True),
    "Exp": (lambda a, **_: np.exp(_f(a)), False),
    "Sqrt": (lambda a, **_: np.sqrt(_f(a)), True),
    "GELU": (lambda a, **_: _f(a) / 2 * (1 + _erf(_f(a) / math.sqrt(2))), False),
    "Pow": (lambda a, beta, **_: _f(a) ** beta, False),
    "SoftMax": (lambda a, axis, **_: _softmax_inf_as_zero(_f(a), axis), False),
    "GenIndex": (lambda a, axis, **_: np.indices(a.shape)[axis], True),
    "GreaterEqual": (lambda a, b, **_: a >= b, True),
    "Select": (lambda c, a, b, **_: np.where(c, a, b), True),
    "TypeCast": (lambda a, **_: a, True),
    "MatMul": (lambda a, b, transpose_b, **_: _f(a) @ (np.swapaxes(_f(b), -1, -2) if transpose_b else _f(b)), False),
    "StaticReshape": (lambda a, **_: a.reshape(a.shape[0], -1), True),
    "StaticTranspose": (lambda a, order, **_: np.transpose(a, [d % a.ndim for d in order]), True),
    "Reorder": (lambda a, **_: a, True),
    "ReduceSum": (lambda a, axes, keep_dims, **_: np.sum(_f(a), axis=tuple(axes), keepdims=keep_dims), False),
    "ReduceMax": (lambda a, axes, keep_dims, **_: np.max(_f(a), axis=tuple(axes), keepdims=keep_dims), True),
    "Concat": (lambda *a, axis, **_: np.concatenate(a, axis=axis), True),
    "Quantize": (lambda a, scales, zps, axis, **_: _quantize(a, np.reshape(scales, (1, -1)), np.reshape(zps, (1, -1)), np.int8), True),
    "Dequantize": (lambda a, scales, zps, **_: (_f(a) - zps[0]) * np.float32(scales[0]), True),
    "DynamicQuantize": (lambda a, s, z, **_: _quantize(a, s, z.astype(np.float32), np.uint8), True),
    "DynamicDequantize": (lambda a, s, z, group_shape, **_: (
        (_f(a) - np.repeat(np.repeat(_f(z), 2, axis=1), 1, axis=0)).astype(np.float32)
        * np.repeat(s.astype(np.float32), 2, axis=1)), True),
}


def test_every_mapped_kind_has_a_file_and_an_oracle():
    assert {p.stem for p in KIND_FILES} == set(onednn.KINDS) == set(ORACLES)
    anchor_kinds = {op["kind"] for p in GOOD for op in json.loads(p.read_text())["graph"]}
    assert anchor_kinds <= set(onednn.KINDS)


def _as(value, dtype):
    return np.asarray(value).astype(np.float32).astype(dtype) if dtype.kind == "f" or dtype.name == "bfloat16" else np.asarray(value).astype(dtype)


@pytest.mark.parametrize("path", KIND_FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract")  # softmax of the all -inf row
def test_each_kind_follows_onednns_documented_semantics(path, engine):
    doc = json.loads(path.read_text())
    [op] = doc["graph"]
    model, _ = onednn.load(path)
    feeds = onednn.example_inputs(model, seed=5)
    if op["kind"] == "SoftMax":  # a row of all minus infinity: zeros under inf_as_zero, not NaN
        feeds[model.graph.input[0].name][1] = -np.inf
    names = [i.name for i in model.graph.input]
    [got] = (dyndq.run(model, feeds) if engine == "reference" else run_onnxruntime(model, feeds)).values()
    oracle, exact = ORACLES[op["kind"]]
    attrs = {k: v["value"] for k, v in op["attrs"].items()}
    with np.errstate(invalid="ignore"):  # the all minus infinity row of SoftMax
        want = _as(oracle(*(feeds[n] for n in names), **attrs), got.dtype)
    assert got.shape == tuple(op["outputs"][0]["shape"])
    if exact:
        assert np.array_equal(got, want) or same_bits(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                   rtol=float(np.finfo(np.float32).eps) * 64 if got.dtype == np.float32 else 2.0**-10,
                                   atol=1e-6)
    if op["kind"] == "SoftMax":
        assert (got[1] == 0).all() and np.isfinite(got).all()


def _one_op(kind, attrs, inputs, output):
    """A one-op graph; inputs and output as (dtype, shape)."""
    def lt(i, dtype, shape):
        return {"id": i, "dtype": dtype, "shape": shape, "stride": [], "layout_type": "strided", "property_type": "variable"}
    return {"version": "3.7.0", "graph": [{
        "id": 0, "name": kind.lower(), "kind": kind,
        "attrs": {k: {"type": "", "value": v} for k, v in attrs.items()},
        "inputs": [lt(i, *x) for i, x in enumerate(inputs)], "outputs": [lt(len(inputs), *output)]}]}


def test_matmul_with_a_rank_1_src_and_a_bias_keeps_the_declared_unit_dim():
    """oneDNN unsqueezes a 1-D src to [1, d] (transpose has no effect on it); the JSON declares
    the dst [1, n], numpy's MatMul gives [n]: same elements, the declared shape wins."""
    model, _ = onednn.load(_one_op("MatMul", {"transpose_a": True}, [("f32", [4]), ("f32", [4, 3]), ("f32", [3])],
                                   ("f32", [1, 3])))
    feeds = onednn.example_inputs(model, 0)
    src, weights, bias = feeds.values()
    for engine in ("reference", "onnxruntime"):
        [got] = dyndq.run(model, feeds, engine=engine).values()
        np.testing.assert_allclose(got, (src @ weights + bias)[None, :], rtol=1e-6)


def test_no_broadcast_when_auto_broadcast_is_none():
    doc = _one_op("Subtract", {"auto_broadcast": "none"}, [("f32", [2, 3]), ("f32", [3])], ("f32", [2, 3]))
    [p] = _problems(doc)
    assert (p.op, p.argument) == ("Subtract", "auto_broadcast") and "[3]" in p.found


def test_attributes_out_of_reach_are_named():
    problems = _problems(_one_op("MatMul", {"accumulation_mode": "s32"}, [("f32", [2, 2]), ("f32", [2, 2])], ("f32", [2, 2])))
    assert [(p.op, p.argument) for p in problems] == [("MatMul", "accumulation_mode")]
    problems = _problems(_one_op("TypeCast", {}, [("f32", [2])], ("s8", [2])))
    assert [(p.op, p.argument) for p in problems] == [("TypeCast", "outputs[0]")]
    problems = _problems(_one_op("Quantize", {"scales": [0.5, 0.5], "qtype": "per_tensor"}, [("f32", [2])], ("u8", [2])))
    assert [(p.op, p.argument) for p in problems] == [("Quantize", "scales")]


def test_dynamic_quantize_per_channel_takes_one_scale_per_channel():
    doc = _one_op("DynamicQuantize", {"qtype": "per_channel", "axis": 1},
                  [("f32", [2, 3]), ("f32", [2])], ("s8", [2, 3]))
    [p] = _problems(doc)
    assert (p.op, p.argument) == ("DynamicQuantize", "inputs[1]") and "3 elements" in p.allowed
    doc["graph"][0]["inputs"][1]["shape"] = [3]
    model, _ = onednn.load(doc)
    src, scales = onednn.example_inputs(model, 0).values()
    [got] = dyndq.run(model, {model.graph.input[0].name: src, model.graph.input[1].name: scales}).values()
    assert np.array_equal(got, _quantize(src, scales[None, :], 0, np.int8))


def test_the_package_ships_in_the_wheel():
    """pyproject lists packages one by one: dyndq.onednn must be among them, or the wheel
    would leave the interop out."""
    import tomllib

    root = Path(__file__).resolve().parents[2]
    packages = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert (root / "dyndq" / "onednn" / "__init__.py").is_file() and "dyndq.onednn" in packages
    assert not list((root / "dyndq").glob("onednn_*.py"))


# -- bad graphs: every problem, naming the op ---------------------------------------------------


def _doc(path=MHA):
    return json.loads(Path(path).read_text())


def _problems(doc):
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(doc)
    return e.value.problems


def test_unknown_kinds_and_unhonoured_attributes_are_all_named_at_once():
    doc = _doc()
    doc["graph"][3]["kind"] = "Frobnicate"  # genindex_row
    doc["graph"][7]["attrs"]["mode"]["value"] = "sideways"  # softmax
    doc["graph"][1]["attrs"]["fancy"] = {"type": "bool", "value": True}  # matmul
    problems = _problems(doc)
    found = {(p.op_id, p.node, p.op, p.argument) for p in problems}
    assert found == {(3, "genindex_row", "Frobnicate", "kind"), (7, "softmax", "SoftMax", "mode"),
                     (1, "matmul", "MatMul", "fancy")}


def test_a_tensor_produced_twice_is_named():
    doc = _doc()
    doc["graph"][4]["outputs"][0]["id"] = 17  # genindex_col now writes genindex_row's tensor
    problems = _problems(doc)
    assert any(p.op_id == 4 and "17" in p.found and "produces too" in p.found for p in problems)


def test_a_consumer_that_disagrees_with_the_producer_is_named():
    doc = _doc()
    doc["graph"][2]["inputs"][0]["dtype"] = "f32"  # div takes matmul's f16 output as f32
    doc["graph"][5]["inputs"][0]["shape"] = [1, 32, 32, 16]  # mask_greater_equal, wrong shape
    problems = _problems(doc)
    assert {(p.op_id, p.argument) for p in problems} == {(2, "inputs[0]"), (5, "inputs[0]")}
    assert all("as op" in p.allowed for p in problems)


def test_a_declared_output_the_op_does_not_compute_is_named():
    doc = _doc(DATA / "kinds/MatMul.json")
    doc["graph"][0]["outputs"][0]["shape"] = [2, 3, 6]  # [2,3,4] @ [5,4]^T is [2,3,5]
    [p] = _problems(doc)
    assert (p.op_id, p.node, p.op) == (0, "matmul", "MatMul") and "declared shape [2, 3, 6]" in p.found
    assert "[2, 3, 5]" in p.allowed


def test_a_cycle_is_named():
    doc = _doc()
    doc["graph"][1]["inputs"][0] = copy.deepcopy(doc["graph"][2]["outputs"][0])  # matmul takes div's output
    doc["graph"][1]["inputs"][0]["shape"] = [1, 32, 32, 128]
    doc["graph"][2]["outputs"][0]["shape"] = [1, 32, 32, 128]
    problems = _problems(doc)
    assert any("cycle" in p.found for p in problems)


def test_missing_ids_are_named():
    doc = _doc()
    del doc["graph"][0]["inputs"][1]["id"]
    doc["output_ports"] = [50, 999]
    problems = _problems(doc)
    assert any(p.op_id == 0 and p.argument == "inputs[1].id" for p in problems)
    assert not any(p.argument == "output_ports" for p in problems)  # a port naming nothing is a note


def test_malformed_json_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"graph": [')
    [p] = _problems(str(bad))
    assert p.argument == "json" and "malformed" in p.found
    [p] = _problems({"version": "3.7.0"})
    assert p.argument == "graph"


def test_an_unknown_dtype_is_named():
    doc = _doc()
    doc["graph"][0]["inputs"][2]["dtype"] = "s3"
    problems = _problems(doc)
    assert any(p.op_id == 0 and p.argument == "inputs[2].dtype" and "'s3'" in p.found for p in problems)


# -- tensors, ports, names, metadata ----------------------------------------------------------


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


# -- example inputs ---------------------------------------------------------------------------


def test_example_inputs_are_values_a_real_run_could_see_and_deterministic():
    model, _ = onednn.load(DATA / "complex_fusion/mlp/gated-mlp-int4.json")
    a, b = onednn.example_inputs(model, 7), onednn.example_inputs(model, 7)
    assert all(np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a)
    src, zps, scales = a["deq_down_src_23"], a["deq_down_zps_25"], a["deq_down_scales_24"]
    assert src.dtype == ml_dtypes.uint4 and src.astype(np.int64).min() == 0 and src.astype(np.int64).max() == 15
    assert zps.dtype == np.uint8 and zps.max() <= 15  # u8 zero points of u4 weights stay in 0..15
    assert scales.dtype == np.float16 and (scales > 0).all() and (scales < 0.1).all()
    masked, _ = onednn.load(MHA)
    feeds = onednn.example_inputs(masked, 0)
    assert np.isneginf(feeds["Select_else_5"].astype(np.float32)).all() and (feeds["div_src_1_4"] >= 1).all()


# -- int4 packing -------------------------------------------------------------------------------


def test_int4_packing_follows_physical_offsets():
    a = np.arange(-8, 8).reshape(4, 4).astype(ml_dtypes.int4)
    dense = onednn.pack_int4(a)
    assert dense[0] == ((-7 & 15) << 4 | (-8 & 15)) and len(dense) == 8
    # transposed layout: element [i, j] at offset i + 4 j
    packed = onednn.pack_int4(a, strides=[1, 4])
    assert packed[0] == ((int(a[1, 0]) & 15) << 4 | (int(a[0, 0]) & 15))
    assert np.array_equal(onednn.unpack_int4(packed, (4, 4), [1, 4], signed=True), a)
    u = np.arange(15).reshape(3, 5).astype(ml_dtypes.uint4)
    assert np.array_equal(onednn.unpack_int4(onednn.pack_int4(u), (3, 5), None, signed=False), u)
    with pytest.raises(ValueError):
        onednn.unpack_int4(b"\x00", (4, 4), [1, 4], signed=True)


# -- round trips ----------------------------------------------------------------------------------


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


def _hand_model():
    """DynamicDequantize feeding a MatMul and an Add, in plain ONNX (no oneDNN metadata)."""
    vi = helper.make_tensor_value_info
    nodes = [dyndq.make_node(["w", "s", "z"], ["wd"], name="deq", qtype="per_channel", axis=1),
             helper.make_node("MatMul", ["x", "wd"], ["y"], name="mm"),
             helper.make_node("Add", ["y", "b"], ["out"], name="bias")]
    g = helper.make_graph(nodes, "hand", [vi("x", TensorProto.FLOAT, [2, 4]), vi("w", TensorProto.INT8, [4, 3]),
                                          vi("s", TensorProto.FLOAT, [3]), vi("z", TensorProto.INT8, [3]),
                                          vi("b", TensorProto.FLOAT, [3])],
                          [vi("out", TensorProto.FLOAT, [2, 3])])
    return dyndq.make_model(g)


def test_load_of_dump_gives_back_the_computation():
    model = _hand_model()
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
    model = _hand_model()
    model.graph.node.append(helper.make_node("LpNormalization", ["out"], ["n"], name="norm"))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros(3, np.float32), "b"))
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.dump(model)
    found = {(p.node, p.argument) for p in e.value.problems}
    assert ("norm", "op_type") in found and ("bias", "b") in found


# -- the CLI ----------------------------------------------------------------------------------------


def test_cli_imports_runs_and_exports(tmp_path, capsys):
    out, inputs, back = tmp_path / "m.onnx", tmp_path / "in", tmp_path / "back.json"
    assert main(["import-onednn", str(MHA), str(out), "--inputs-dir", str(inputs)]) == 0
    files = sorted(inputs.glob("*.npy"))
    assert len(files) == 9
    args = [f"--input={f.stem}={f}" for f in files]
    assert main(["run", str(out), *args]) == 0
    assert main(["run", str(out), *args, "--engine", "onnxruntime"]) == 0
    assert main(["export-onednn", str(out), str(back)]) == 0
    kinds = lambda doc: sorted((op["id"], op["kind"]) for op in doc["graph"])  # noqa: E731
    assert kinds(json.loads(back.read_text())) == kinds(_doc())


def test_the_bad_example_of_the_readme_is_refused_whole():
    problems = _problems(str(DATA / "bad/unknown-kinds.json"))
    assert [(p.op_id, p.op, p.argument) for p in problems] == [(3, "GenIndexFancy", "kind"), (7, "SoftMax", "mode")]


def test_cli_export_onednn_refuses_with_every_problem(tmp_path, capsys):
    model = _hand_model()
    model.graph.node.append(helper.make_node("LpNormalization", ["out"], ["n"], name="norm"))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    assert main(["export-onednn", str(path), str(tmp_path / "m.json")]) == 1
    assert "'norm'" in capsys.readouterr().err and not (tmp_path / "m.json").exists()


def test_cli_names_every_problem_and_writes_nothing(tmp_path, capsys):
    doc = _doc()
    doc["graph"][3]["kind"] = "Frobnicate"
    doc["graph"][4]["kind"] = "Frobnicate"
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(doc))
    assert main(["import-onednn", str(src), str(tmp_path / "m.onnx")]) == 1
    err = capsys.readouterr().err
    assert "2 problems" in err and "genindex_row" in err and "genindex_col" in err
    assert not (tmp_path / "m.onnx").exists()
    assert main(["import-onednn", str(tmp_path / "missing.json"), str(tmp_path / "m.onnx")]) == 2
