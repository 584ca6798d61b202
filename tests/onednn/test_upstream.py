"""oneDNN graphs at full scale (issue 21): f8 through ONNX's FLOAT8E4M3FN / FLOAT8E5M2, SoftMax's
stats output, s32 inputs of binary ops, unknown dims, output ports naming nothing, linear-time
import, and the upstream graphs of oneDNN's benchdnn inputs (tests/data/onednn/upstream)."""
import importlib.util
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import dyndq
from dyndq import onednn

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "tests" / "data" / "onednn" / "upstream"
UNKNOWN = -9223372036854775808  # DNNL_GRAPH_UNKNOWN_DIM


def _bench(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def lt(i, dtype, shape, prop="variable"):
    return {"id": i, "dtype": dtype, "shape": shape, "stride": [], "layout_type": "strided", "property_type": prop}


def graph(*ops, inputs=None, outputs=None):
    doc = {"version": "3.9.0", "graph": list(ops)}
    if inputs is not None:
        doc["input_ports"] = inputs
    if outputs is not None:
        doc["output_ports"] = outputs
    return doc


def op(i, kind, ins, outs, **attrs):
    types = {bool: "bool", int: "s64", float: "f32", str: "string"}
    typed = {k: {"type": (("f32[]" if isinstance(v[0], float) else "s64[]") if isinstance(v, list) else types[type(v)]),
                 "value": v} for k, v in attrs.items()}
    return {"id": i, "name": f"{kind.lower()}_{i}", "kind": kind, "attrs": typed, "inputs": ins, "outputs": outs}


def both(model, feeds):
    return dyndq.run(model, feeds), dyndq.run(model, feeds, engine="onnxruntime")


# -- f8 -----------------------------------------------------------------------------------------

F8 = [("f8_e4m3", ml_dtypes.float8_e4m3fn), ("f8_e5m2", ml_dtypes.float8_e5m2)]


def test_onednn_f8_names_are_onnx_float8e4m3fn_and_float8e5m2():
    from dyndq.opdefs import dtypes

    assert dtypes.by_onednn("f8_e4m3").onnx_name == "FLOAT8E4M3FN"  # finite only, max 448, NaN 0x7f
    assert dtypes.by_onednn("f8_e5m2").onnx_name == "FLOAT8E5M2"  # IEEE-like, with infinities
    assert dtypes.by_onednn("f8_e4m3").numpy == np.dtype(ml_dtypes.float8_e4m3fn)


@pytest.mark.parametrize("name, f8", F8)
@pytest.mark.parametrize("qtype", ["per_tensor", "per_channel"])
def test_dequantize_of_f8_is_exact_on_both_engines(name, f8, qtype):
    scales = [0.5] if qtype == "per_tensor" else [0.5, 0.25, 2.0]
    model, _ = onednn.load(graph(op(0, "Dequantize", [lt(0, name, [4, 3])], [lt(1, "f32", [4, 3])],
                                    qtype=qtype, axis=1, scales=scales)))
    [x] = onednn.example_inputs(model, 1).values()
    assert x.dtype == f8
    ref, ort = both(model, {model.graph.input[0].name: x})
    want = x.astype(np.float32) * np.float32(scales if qtype == "per_channel" else scales[0])
    for got in (ref, ort):
        [y] = got.values()
        assert np.array_equal(y, want)


@pytest.mark.parametrize("name, f8", F8)
def test_quantize_to_f8_rounds_to_nearest_even_and_saturates_on_both_engines(name, f8):
    model, _ = onednn.load(graph(op(0, "Quantize", [lt(0, "f32", [64])], [lt(1, name, [64])], scales=[0.25])))
    x = np.concatenate([np.linspace(-200, 200, 60), [1e6, -1e6, 0.0, 3.3]]).astype(np.float32)
    big = float(ml_dtypes.finfo(f8).max)
    want = np.clip(x / np.float32(0.25), -big, big).astype(f8)
    for got in both(model, {model.graph.input[0].name: x}):
        [y] = got.values()
        assert y.dtype == f8 and np.array_equal(y.view(np.uint8), want.view(np.uint8))


def test_f8_with_zero_points_is_refused():
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(graph(op(0, "Dequantize", [lt(0, "f8_e4m3", [4])], [lt(1, "f32", [4])], scales=[0.5], zps=[3])))
    [p] = e.value.problems
    assert (p.op, p.argument) == ("Dequantize", "zps") and "f8" in p.allowed


def test_typecast_to_f8_and_back():
    model, _ = onednn.load(graph(op(0, "TypeCast", [lt(0, "f32", [8])], [lt(1, "f8_e5m2", [8])]),
                                 op(1, "TypeCast", [lt(1, "f8_e5m2", [8])], [lt(2, "f32", [8])])))
    x = np.array([0.1, 1, 3, 7.5, -2, 57344, 1e-3, 100], np.float32)
    for got in both(model, {model.graph.input[0].name: x}):
        [y] = got.values()
        assert np.array_equal(y, x.astype(ml_dtypes.float8_e5m2).astype(np.float32))


# -- SoftMax's stats -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "inf_as_zero"])
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract")  # the all minus infinity row
def test_softmax_stats_is_the_logsumexp_along_the_axis(mode):
    model, report = onednn.load(graph(op(0, "SoftMax", [lt(0, "f32", [3, 5])], [lt(1, "f32", [3, 5]), lt(2, "f32", [3, 1])],
                                         axis=-1, mode=mode)))
    assert len(model.graph.output) == 2
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32) * 4
    if mode == "inf_as_zero":
        x[1] = -np.inf
    want = np.log(np.sum(np.exp(x.astype(np.float64) - x.max(1, keepdims=True)), 1, keepdims=True)) + x.max(1, keepdims=True)
    for got in both(model, {model.graph.input[0].name: x}):
        dst, stats = got.values()
        keep = [0, 2] if mode == "inf_as_zero" else [0, 1, 2]
        np.testing.assert_allclose(stats[keep], want[keep], rtol=1e-6)
        if mode == "inf_as_zero":
            assert stats[1, 0] == np.inf and (dst[1] == 0).all()
            np.testing.assert_allclose(np.exp(x - stats), dst, rtol=1e-5, atol=1e-7)  # what backward graphs rely on


# -- s32 inputs of binary ops ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["Add", "Multiply", "Subtract"])
def test_an_s32_input_beside_a_float_one_is_widened_exactly(kind):
    model, _ = onednn.load(graph(op(0, kind, [lt(0, "f32", [2, 4]), lt(1, "s32", [1, 4])], [lt(2, "f32", [2, 4])],
                                    auto_broadcast="numpy")))
    a = np.arange(8, dtype=np.float32).reshape(2, 4) / 3
    b = np.array([[0, -7, 2**20, -(2**24)]], np.int32)
    want = {"Add": np.add, "Multiply": np.multiply, "Subtract": np.subtract}[kind](a, b.astype(np.float32))
    for got in both(model, dict(zip([i.name for i in model.graph.input], (a, b)))):
        [y] = got.values()
        assert np.array_equal(y, want)


def test_two_s32_inputs_are_refused_where_onednn_takes_no_s32():
    """oneDNN's Add and Subtract take s32 with s32 into s32 (tested with the writer); Multiply
    takes no s32, and s32 with s32 gives no float dst."""
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(graph(op(0, "Multiply", [lt(0, "s32", [2]), lt(1, "s32", [2])], [lt(2, "s32", [2])])))
    assert {p.argument for p in e.value.problems} == {"inputs[0]", "outputs[0]"}
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(graph(op(0, "Add", [lt(0, "s32", [2]), lt(1, "s32", [2])], [lt(2, "f32", [2])])))
    assert [p.argument for p in e.value.problems] == ["outputs[0]"]


# -- unknown dims and ports ----------------------------------------------------------------------


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


def test_dropout_is_refused_saying_why():
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(UPSTREAM / "pattern/f32/softmax_dropout.json")
    [p] = e.value.problems
    assert (p.op, p.argument) == ("Dropout", "kind") and "random numbers" in p.allowed


# -- linear time -----------------------------------------------------------------------------


def test_a_chain_of_20000_ops_loads_in_either_file_order_alike():
    """The reader sorts with a ready queue (before: a rescan of every op per round, which took
    over a minute here).  A generous bound, as the machine is shared; the benchmark
    (benchmarks/bench_onednn_import.py) measures it."""
    chain = _bench("bench_onednn_import").chain
    models = []
    for reverse in (False, True):
        start = time.perf_counter()
        model, report = onednn.load(chain(20000, reverse))
        assert time.perf_counter() - start < 20
        models.append(model)
    assert report.ops == 20000 and len(models[0].graph.node) == 20000
    assert [n.name for n in models[0].graph.node] == [n.name for n in models[1].graph.node]


def test_duplicate_op_ids_are_each_named_once():
    doc = graph(op(0, "ReLU", [lt(0, "f32", [2])], [lt(1, "f32", [2])]), op(0, "Exp", [lt(1, "f32", [2])], [lt(2, "f32", [2])]),
                op(0, "Exp", [lt(2, "f32", [2])], [lt(3, "f32", [2])]))
    with pytest.raises(dyndq.ValidationError) as e:
        onednn.load(doc)
    assert [p.argument for p in e.value.problems] == ["id", "id"]


# -- the upstream graphs -------------------------------------------------------------------------

def _manifest() -> dict[str, tuple[str, str, str]]:
    """path -> (commit, verdict, reason), from the upstream folder's MANIFEST.tsv."""
    rows = (line.split("\t") for line in (UPSTREAM / "MANIFEST.tsv").read_text().splitlines() if not line.startswith("#"))
    return {path: (commit, verdict, reason) for path, commit, verdict, reason in rows}


MANIFEST = _manifest()
EXPECTED_STEP = {"ok": "ok", "refused": "load"}  # the step the judge stops at, by the manifest's verdict
BIG = {"complex_fusion/mha-f32-softmax/sdpa-plain-wo-mask-f16-with-f32-softmax.json",  # 1.9 GB peak
       "complex_fusion/mha/jsons/torchbench/graph-100002-4077425134136159961.json",  # 1.3 GB peak
       "complex_fusion/mha/sdpa-plain-bottom-right-implicit-causal-mask-f16-f32.json"}  # 3.9 GB peak
UPSTREAM_GRAPHS = [pytest.param(p, id=str(p.relative_to(UPSTREAM)),
                                marks=[pytest.mark.big] if str(p.relative_to(UPSTREAM)) in BIG else [])
                   for p in sorted(UPSTREAM.rglob("*.json"))]


@pytest.mark.parametrize("path", UPSTREAM_GRAPHS)
def test_each_upstream_graph_imports_checks_runs_and_agrees(path):
    """Each copied graph is judged as MANIFEST.tsv says: ok, or refused at load (Dropout)."""
    step, detail = _bench("onednn_upstream").judge(path)
    assert step == EXPECTED_STEP[MANIFEST[str(path.relative_to(UPSTREAM))][1]], detail


def test_the_manifest_holds_every_copied_graph_at_the_commit_the_readme_names():
    readme = (UPSTREAM / "README.md").read_text()
    copied = sorted(str(p.relative_to(UPSTREAM)) for p in UPSTREAM.rglob("*.json"))
    for path in copied:
        commit, verdict, reason = MANIFEST[path]
        assert f"| `{path}` | {commit} |" in readme and reason.endswith("copied here"), path
    assert sorted(p for p, (_, _, reason) in MANIFEST.items() if reason.endswith("copied here")) == copied
    assert {verdict for _, verdict, _ in MANIFEST.values()} <= {"ok", "refused", "not run", "not fetched"}


def test_the_docs_give_the_manifest_counts():
    """docs/onednn.md's table of verdicts and its count of the copied graphs are the manifest's."""
    import re

    docs = (ROOT / "docs" / "onednn.md").read_text()
    counts = {}
    for _, verdict, _ in MANIFEST.values():
        counts[verdict] = counts.get(verdict, 0) + 1
    table = {row[0].split(":")[0]: int(row[1]) for row in re.findall(r"^\| ([a-z][^|]*?) \| (\d+) \|", docs, re.M)}
    assert table == counts
    copied = [p for p in MANIFEST if MANIFEST[p][2].endswith("copied here")]
    data = ROOT / "tests" / "data" / "onednn"
    anchors = [p for p in data.rglob("*.json") if p.relative_to(data).parts[0] in ("op", "complex_fusion")]
    ok = len(anchors) + sum(MANIFEST[p][1] == "ok" for p in copied)
    assert f"    {ok} of {len(anchors) + len(copied)} upstream graphs import, check, run on both engines and agree" in docs
    assert f"{len(MANIFEST)} in all" in docs
