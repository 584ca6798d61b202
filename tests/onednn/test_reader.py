"""Reading oneDNN graph JSON (dyndq/onednn/reader.py): every malformed, oversized or unencodable
input, and every bad graph (unknown kinds, a tensor produced twice, cycles, missing ids, duplicate
op ids, ...) gets named problems (ValidationError; exit 1 from the CLI, nothing written), never a
traceback or a huge allocation; a long chain loads in either file order.  The reader is fuzzed:
hypothesis builds JSON of any structure and mutates the anchors; the only outcomes allowed are a
model or a ValidationError."""
import copy
import json
import os
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dyndq
from cases import graph, lt, op
from dyndq import onednn
from dyndq.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"

ADD = json.loads((DATA / "kinds" / "Add.json").read_text())

ANCHORS = sorted(p for p in DATA.rglob("*.json") if not {"kinds", "bad", "upstream"} & set(p.parts))


def _with(path, value, doc=ADD):
    doc = copy.deepcopy(doc)
    *head, last = path
    target = doc
    for key in head:
        target = target[key]
    target[last] = value
    return doc


def _problems(source):
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(source)
    return e.value.problems


SHAPE = ("graph", 0, "inputs", 0, "shape")


@pytest.mark.parametrize("shape, words", [
    ([10**12 * 1.0], "dimension 1000000000000.0"),
    ([2**31, 2**31, 2**31], "elements"),
    ([2**62, 2**62], "elements"),
    ([2**64, 3], "dimension 18446744073709551616"),
    ([-2, 3], "dimension -2"),
    ([1] * 100, "rank 100"),
    ([True, 3], "dimension True"),
    ("3x4", "'3x4'"),
])
def test_shapes_are_checked_in_the_reader(shape, words):
    [p] = _problems(_with(SHAPE, shape))
    assert (p.op_id, p.argument) == (0, "inputs[0].shape") and words in p.found


def test_a_shape_within_bounds_but_too_big_for_example_inputs_is_refused_naming_the_tensor():
    doc = _with(SHAPE, [2**31, 4])
    doc = _with(("graph", 0, "inputs", 1, "shape"), [4], doc)
    doc = _with(("graph", 0, "outputs", 0, "shape"), [2**31, 4], doc)
    model, _ = onednn.load(doc)
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.example_inputs(model)
    [p] = e.value.problems
    assert p.argument == f"input {model.graph.input[0].name}" and "17,179,869,184 bytes" in p.found  # f16
    add = onednn.load(ADD)[0]
    feeds = onednn.example_inputs(add, max_bytes=10**6)  # a budget that fits
    assert set(feeds) == {i.name for i in add.graph.input}
    with pytest.raises(dyndq.ValidationError):
        onednn.example_inputs(onednn.load(ADD)[0], max_bytes=8)


def test_deep_nesting_non_utf8_files_and_unencodable_names_are_named(tmp_path):
    [p] = _problems('{"graph": ' + "[" * 50000 + "]" * 50000 + "}")
    assert p.argument == "json" and "nested" in p.found
    utf16 = tmp_path / "g.json"
    utf16.write_bytes(json.dumps(ADD).encode("utf-16"))
    [p] = _problems(utf16)
    assert p.argument == "file" and "not UTF-8" in p.found
    onnx_file = tmp_path / "m.onnx"
    onnx_file.write_bytes(b"\x08\x0a\x12\x04\xff\xfe\x00\x01")
    [p] = _problems(onnx_file)
    assert p.argument == "file"
    [p] = _problems(_with(("graph", 0, "name"), "\ud800"))
    assert p.argument == "name" and "surrogate" in p.found and "\\ud800" in str(p)
    [p] = _problems(_with(("graph", 0, "attrs", "auto_broadcast", "value"), "\udfff"))
    assert p.argument == "attrs" and "surrogate" in p.found
    [p] = _problems(_with(("version",), "3.\ud800"))
    assert p.argument == "version"
    deep_attr = _with(("graph", 0, "attrs", "auto_broadcast", "value"), json.loads("[" * 500 + "]" * 500))
    [p] = _problems(deep_attr)
    assert p.argument == "auto_broadcast" and len(p.found) < 100


def test_the_cli_says_every_problem_exits_1_and_writes_nothing(tmp_path, capsys):
    cases = {
        "huge.json": json.dumps(_with(SHAPE, [2**62, 2**62])),
        "deep.json": '{"graph": ' + "[" * 50000 + "]" * 50000 + "}",
        "surrogate.json": json.dumps(_with(("graph", 0, "name"), "\ud800")),
    }
    for name, text in cases.items():
        src = tmp_path / name
        src.write_text(text)
        out, inputs = tmp_path / f"{name}.onnx", tmp_path / f"{name}-in"
        assert main(["import-onednn", str(src), str(out), "--inputs-dir", str(inputs)]) == 1, name
        err = capsys.readouterr().err
        assert "problem" in err and "Traceback" not in err
        assert not out.exists() and not inputs.exists()
    src = tmp_path / "utf16.json"
    src.write_bytes(json.dumps(ADD).encode("utf-16"))
    assert main(["import-onednn", str(src), str(tmp_path / "u.onnx")]) == 1
    assert "not UTF-8" in capsys.readouterr().err and not (tmp_path / "u.onnx").exists()


def test_import_onednn_over_the_input_budget_writes_neither_model_nor_inputs(tmp_path, capsys):
    big = _with(SHAPE, [2**20, 4])
    big = _with(("graph", 0, "inputs", 1, "shape"), [4], big)
    big = _with(("graph", 0, "outputs", 0, "shape"), [2**20, 4], big)
    src, out, inputs = tmp_path / "big.json", tmp_path / "big.onnx", tmp_path / "in"
    src.write_text(json.dumps(big))
    assert main(["import-onednn", str(src), str(out), "--inputs-dir", str(inputs), "--max-input-bytes", "1000000"]) == 1
    err = capsys.readouterr().err
    assert "8,388,608 bytes" in err and "--max-input-bytes" in err  # f16
    assert not out.exists() and not inputs.exists()
    assert main(["import-onednn", str(src), str(out), "--inputs-dir", str(inputs)]) == 0
    assert out.exists() and len(os.listdir(inputs)) == 2


# -- numbers and names beyond what a message or a dtype holds -----------------------------------


KIND = {p.stem: json.loads(p.read_text()) for p in (DATA / "kinds").glob("*.json")}


def _attr(kind, key, value):
    return _with(("graph", 0, "attrs", key, "value"), value, KIND[kind])


def test_an_integer_of_more_digits_than_python_converts_is_named(tmp_path, capsys):
    """Python refuses to turn an integer literal of over 4,300 digits into an int (and a dict
    holding such an int into a repr): named, in a file and in a dict alike."""
    text = json.dumps(ADD).replace('"id": 0', '"id": ' + "9" * 5000, 1)
    [p] = _problems(text)
    assert p.argument == "json" and "4,300 digits" in p.found
    src = tmp_path / "digits.json"
    src.write_text(text)
    assert main(["import-onednn", str(src), str(tmp_path / "d.onnx")]) == 1
    err = capsys.readouterr().err
    assert "4,300 digits" in err and "Traceback" not in err and len(err) < 1000
    [p] = _problems(_with(SHAPE, [10**5000, 3]))
    assert p.argument == "inputs[0].shape" and "5001 digits" in p.found and len(p.found) < 200


def test_a_path_with_a_nul_character_or_of_5000_characters_is_named_short():
    [p] = _problems("graph\x00.json")
    assert p.argument == "file" and "NUL" in p.found
    [p] = _problems("x" * 5000 + ".json")
    assert p.argument == "file" and len(str(p)) < 400 and "5,005 characters" in p.found


@pytest.mark.parametrize("source", [b"\xff\xfe\x00", b"\x80{}", bytearray(b"\xc3(")])
def test_bytes_that_are_no_text_are_named(source):
    [p] = _problems(source)
    assert p.argument == "json" and "not UTF-8 text" in p.found


@pytest.mark.parametrize("kind, key, value", [
    ("StaticTranspose", "order", [2**63, 0, 1]),
    ("StaticTranspose", "order", [0, -2**63 - 1, 1]),
    ("StaticReshape", "shape", [2**63]),
    ("Dequantize", "axis", 2**63),
    ("SoftMax", "axis", -2**64),
    ("ReduceSum", "axes", [2**100]),
])
def test_s64_attributes_beyond_int64_are_named(kind, key, value):
    [p] = _problems(_attr(kind, key, value))
    assert (p.argument, p.op_id) == (key, 0) and "s64" in p.allowed


@pytest.mark.filterwarnings("error")  # no NumPy overflow warning may leak either
@pytest.mark.parametrize("kind, key, value", [
    ("Clamp", "max", 1e300), ("Clamp", "min", -1e39), ("Elu", "alpha", 2**200), ("Pow", "beta", 1e300),
    ("LayerNorm", "epsilon", 3.5e38), ("Dequantize", "scales", [0.5, 1e300, 0.25]),
])
def test_f32_attributes_beyond_float32_are_named_not_made_infinite(kind, key, value):
    [p] = _problems(_attr(kind, key, value))
    assert p.argument == key and "float32" in p.allowed


@pytest.mark.filterwarnings("error")
def test_f32_attributes_up_to_the_largest_float32_stay_finite():
    model, _ = onednn.load(_attr("Clamp", "max", 3.4028235e38))
    assert onednn.dump(model)["graph"][0]["attrs"]["max"]["value"] == 3.4028235e38


def test_the_cli_names_an_f32_attribute_beyond_float32_and_writes_nothing(tmp_path, capsys):
    src, out = tmp_path / "clamp.json", tmp_path / "clamp.onnx"
    src.write_text(json.dumps(_attr("Clamp", "max", 1e300)))
    assert main(["import-onednn", str(src), str(out)]) == 1
    err = capsys.readouterr().err
    assert "max: found 1e+300" in err and "Warning" not in err and not out.exists()


@pytest.mark.parametrize("order", [[2**62, 0, 1], [0, 1, 5], [0, 0, 1], [0, 1]])
def test_a_static_transpose_order_that_is_no_permutation_is_named(order):
    [p] = _problems(_attr("StaticTranspose", "order", order))
    assert p.argument == "order" and "permutation" in p.allowed


def test_a_matmul_of_a_rank_0_tensor_is_named():
    doc = _with(("graph", 0, "inputs", 0, "shape"), [], KIND["MatMul"])
    [p] = _problems(_with(("graph", 0, "inputs", 0, "stride"), [], doc))
    assert p.argument == "inputs[0]" and "rank" in p.allowed


def test_a_huge_op_name_is_cut_in_messages_and_kept_in_the_model(tmp_path, capsys):
    name = "x" * 5_000_000
    doc = _with(("graph", 0, "name"), name)
    bad = _with(("graph", 0, "attrs", "auto_broadcast", "value"), "sideways", doc)
    [p] = _problems(bad)
    assert len(str(p)) < 500 and "5,000,000 characters" in str(p)
    huge_key = _with(("graph", 0, "attrs"), {"k" * 1_000_000: {"type": "s64", "value": 1}}, doc)
    [p] = _problems(huge_key)
    assert len(str(p)) < 500 and "1,000,000 characters" in str(p)
    unknown = _with(("graph", 0, "kind"), "K" * 1_000_000, doc)
    [p] = _problems(unknown)
    assert len(str(p)) < 2000
    model, _ = onednn.load(doc)  # the name is the op's: kept whole, for dump to write back
    assert name in [n.name for n in model.graph.node] and onednn.dump(model)["graph"][0]["name"] == name
    values = [v for n in model.graph.node for v in list(n.input) + list(n.output)]
    assert max(len(v) for v in values) < 200
    src = tmp_path / "long.json"
    src.write_text(json.dumps(bad))
    assert main(["import-onednn", str(src), str(tmp_path / "long.onnx")]) == 1
    assert len(capsys.readouterr().err) < 1000


# -- fuzzing ---------------------------------------------------------------------------------------


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats(allow_nan=False) |
    st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20)

KEYS = ["id", "name", "kind", "attrs", "inputs", "outputs", "dtype", "shape", "stride", "layout_type",
        "property_type", "value", "type", "graph", "input_ports", "output_ports", "version"]


def _outcome(doc) -> None:
    """load either returns a model or raises ValidationError: nothing else (no warning either)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model, report = onednn.load(doc)
    except dyndq.ValidationError as e:
        assert e.problems and all(str(p) for p in e.problems)
        return
    assert model.graph.node


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6))
def test_any_json_object_is_a_model_or_named_problems(doc):
    _outcome(doc)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


BEYOND = [2**63, -2**63 - 1, 2**62, 10**5000, 1e300, -1e39, float("inf"), float("nan")]

ANCHOR_DOCS = [json.loads(p.read_text()) for p in ANCHORS if p.stat().st_size < 20000] + list(KIND.values())


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_anchors_are_models_or_named_problems(data):
    doc = copy.deepcopy(data.draw(st.sampled_from(ANCHOR_DOCS)))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        path = data.draw(st.sampled_from(paths))
        action = data.draw(st.sampled_from(["replace", "delete", "dim", "dtype", "id", "number"]))
        *head, last = path
        parent = doc
        for key in head:
            parent = parent[key]
        if action == "delete":
            del parent[last]
        elif action == "dim":
            parent[last] = data.draw(st.sampled_from([-1, -9223372036854775808, 0, 2**63, 2**31, -5, 1.5, "7"]))
        elif action == "dtype":
            parent[last] = data.draw(st.sampled_from(["f8_e4m3", "f8_e5m2", "s32", "boolean", "u4", "f64", "x"]))
        elif action == "id":
            parent[last] = data.draw(st.integers(-3, 60))
        elif action == "number":  # beyond s64, beyond float32, beyond what Python turns into text
            parent[last] = data.draw(st.sampled_from(BEYOND + [[b, 0, 1] for b in BEYOND]))
        else:
            parent[last] = data.draw(json_values)
    _outcome(doc)


MHA = DATA / "complex_fusion/mha/sdpa-compressed-kv-implicit-causal-mask-int8-gs128.json"


def _doc(path=MHA):
    return json.loads(Path(path).read_text())


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


ROOT = Path(__file__).resolve().parents[2]


def _chain(n: int, reverse: bool = False) -> dict:
    """A oneDNN graph of n ReLU ops in a row, in file order or reversed (every consumer first)."""
    def tensor(i):
        return {"id": i, "dtype": "f32", "shape": [2, 8], "stride": [8, 1], "layout_type": "strided",
                "property_type": "undef"}
    ops = [{"id": i, "name": f"relu_{i}", "kind": "ReLU", "attrs": {}, "inputs": [tensor(i)], "outputs": [tensor(i + 1)]}
           for i in range(n)]
    return {"version": "3.7.0", "engine_kind": "cpu", "fpmath_mode": "strict", "input_ports": [0],
            "output_ports": [n], "graph": ops[::-1] if reverse else ops}


def test_a_chain_of_20000_ops_loads_in_either_file_order_alike():
    """The reader sorts with a ready queue (a rescan of every op per round once took over a minute
    here); how long it takes is the benchmark's to measure (benchmarks/bench_onednn_import.py)."""
    models = []
    for reverse in (False, True):
        model, report = onednn.load(_chain(20000, reverse))
        models.append(model)
    assert report.ops == 20000 and len(models[0].graph.node) == 20000
    assert [n.name for n in models[0].graph.node] == [n.name for n in models[1].graph.node]


def test_duplicate_op_ids_are_each_named_once():
    doc = graph(op(0, "ReLU", [lt(0, "f32", [2])], [lt(1, "f32", [2])]), op(0, "Exp", [lt(1, "f32", [2])], [lt(2, "f32", [2])]),
                op(0, "Exp", [lt(2, "f32", [2])], [lt(3, "f32", [2])]))
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(doc)
    assert [p.argument for p in e.value.problems] == ["id", "id"]
