"""oneDNN's own benchdnn graphs that hold DynamicDequantize (tests/data/onednn), through dyndq.onednn.

Each anchor imports, passes dyndq.check, and runs with its example inputs on the
reference engine and on ONNX Runtime: every DynamicDequantize output agrees to the
bit between the engines, and the final outputs agree within one unit in the last
place of their dtype (see `within_one_ulp`).

Each oneDNN DynamicDequantize op alone (`as_model`, now made by dyndq.onednn.load) is
valid under DynamicDequantize-2 and runs in the kernel bit for bit as the oracle says;
the classic int8 case is also DynamicDequantize-1 and must check, run and export
bit-exactly; the newer per_group / int4 / f16 / bf16 forms are out of version 1's
reach, and version 1 must refuse each with problems naming exactly what is out of reach.
"""
import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dyndq
from cases import oracle, oracle_2, random_array, run_ort, same_bits
from engines import run_onnxruntime
from dyndq import onednn


DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"

ANCHORS = sorted(p for p in DATA.rglob("*.json") if not {"kinds", "bad", "upstream"} & set(p.parts))

MLP = DATA / "complex_fusion" / "mlp" / "gated-mlp-int4.json"

ROLES = ("src", "scales", "zps")


def onednn_ops() -> list:
    return [
        pytest.param(op, id=f"{path.relative_to(DATA)}:{op['name']}:{op['id']}")
        for path in ANCHORS
        for op in json.loads(path.read_text())["graph"]
        if op["kind"] == "DynamicDequantize"
    ]


def as_model(op, *, retype=None, attrs=None, shapes=None, version=None):
    """One oneDNN op as a one-node ONNX model made by dyndq.onednn.load, inputs optionally re-typed
    or re-shaped (dst follows scales' dtype), importing org.dyndq at `version` (the newest by default;
    version 1's dst is float32)."""
    retype, shapes = retype or {}, shapes or {}
    op = copy.deepcopy(op)
    if attrs is not None:
        op["attrs"] = {k: {"type": "string" if isinstance(v, str) else "s64", "value": v} for k, v in attrs.items()}
    for role, lt in zip(ROLES, op["inputs"]):
        lt["dtype"] = retype.get(role, lt["dtype"])
        lt["shape"] = shapes.get(role, lt["shape"])
        lt["stride"] = []
    op["outputs"][0]["dtype"] = op["inputs"][1]["dtype"]
    model, _ = onednn.load({"version": "3.7.0", "graph": [op]})
    if version is not None:
        for imp in model.opset_import:
            if imp.domain == dyndq.DOMAIN:
                imp.version = version
        if version == 1:
            model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    return model


def feeds_of(model, arrays):
    return dict(zip([i.name for i in model.graph.input], arrays))


def with_dequantized_outputs(model) -> tuple[onnx.ModelProto, list[str]]:
    """A copy whose graph outputs also hold every DynamicDequantize's dst."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    types = {vi.name: vi for vi in list(out.graph.value_info) + list(out.graph.output)}
    names = [n.output[0] for n in out.graph.node if n.op_type == "DynamicDequantize"]
    have = {o.name for o in out.graph.output}
    out.graph.output.extend(copy.deepcopy(types[n]) for n in names if n not in have)
    return out, names


def close(got, want) -> bool:
    """Same dtype and shape, and |got - want| <= 2^-10 * max|want| (two float16 ulps at the output's
    largest magnitude; exact equality for outputs that are a DynamicDequantize's).

    Why: the graphs compute in float32 (float16 inputs cast exactly) and round to float16 after
    each op, as the JSON's dtypes say.  The engines' float32 results differ only by summation
    order in MatMul and exp's last bits (~1e-7 relative), so an intermediate lands on the other
    side of a float16 rounding boundary now and then (one ulp, 2^-11 relative); through softmax
    (probabilities summing to 1) and the last MatMul such a flip moves an output by at most about
    one ulp of the output's largest magnitude.  Measured on the anchors (seeds 0-2) and the gated
    MLP: at most 0.33 of this bound."""
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    g, w = got.astype(np.float64), want.astype(np.float64)
    return bool(np.abs(g - w).max(initial=0) <= 2.0**-10 * np.abs(w).max(initial=0))


# -- the anchors, whole --------------------------------------------------------------------------


def test_the_anchors_are_all_here():
    assert len(ANCHORS) == 12
    assert len(onednn_ops()) == 16  # the MLP holds three, two SDPA cases two each


# The gated MLP's whole run (int4 weights of 4096 x 14336, dequantized, on both engines) peaks at
# about 4 GiB: a `big` test (make test-big), not in the default suite, which fits in 2 GiB.
_WHOLE_RUNS = [pytest.param(p, marks=pytest.mark.big) if p.name == "gated-mlp-int4.json" else p for p in ANCHORS]


@pytest.mark.parametrize("path", _WHOLE_RUNS, ids=lambda p: str(p.relative_to(DATA)))
def test_each_anchor_imports_checks_and_runs_on_both_engines(path):
    model, report = onednn.load(path)
    doc = json.loads(path.read_text())
    assert report.ops == len(doc["graph"])
    assert dyndq.check(model) == []
    probe, dequantized = with_dequantized_outputs(model)
    feeds = onednn.example_inputs(model, seed=1)
    ref = dyndq.run(probe, feeds)
    ort = dict(zip([o.name for o in probe.graph.output], run_onnxruntime(dyndq.export(probe), feeds)))
    assert dequantized and all(same_bits(ort[n], ref[n]) for n in dequantized)
    for out in model.graph.output:
        assert np.isfinite(ref[out.name].astype(np.float32)).all()
        assert close(ort[out.name], ref[out.name])


def test_the_dequantized_values_are_the_oracles():
    """The sdpa int4 case: each DynamicDequantize's dst is the oracle's on the example inputs."""
    path = DATA / "complex_fusion/mha/sdpa-compressed-kv-int4-gs32.json"
    model, _ = onednn.load(path)
    probe, dequantized = with_dequantized_outputs(model)
    feeds = onednn.example_inputs(model, seed=2)
    ref = dyndq.run(probe, feeds)
    for node in model.graph.node:
        if node.op_type == "DynamicDequantize":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            attrs["qtype"] = attrs["qtype"].decode()
            want = oracle_2(*(feeds[i] for i in node.input), **attrs)
            assert same_bits(ref[node.output[0]], want)


# -- each DynamicDequantize op alone ---------------------------------------------------------------


@pytest.mark.parametrize("op", onednn_ops())
def test_each_onednn_op_is_valid_under_version_2(op):
    assert dyndq.check(as_model(op)) == []


@pytest.mark.parametrize("op", onednn_ops())
def test_each_onednn_op_runs_in_the_kernel_bit_for_bit(op):
    """The op on data drawn in its dtypes and shapes: the kernel and the reference evaluator
    against the oracle (int64 subtraction, float32 product, one rounding to T2)."""
    rng = np.random.default_rng(op["id"] % 2**32)
    arrays = [random_array(rng, lt["dtype"], tuple(lt["shape"]), onednn=True) for lt in op["inputs"]]
    attrs = {k: v["value"] for k, v in op["attrs"].items()}
    want = oracle_2(*arrays + [None] * (3 - len(arrays)), **attrs)
    assert same_bits(dyndq.dynamic_dequantize(*arrays, **attrs), want)
    model = as_model(op)
    [ref] = dyndq.run(model, feeds_of(model, arrays)).values()
    assert same_bits(ref, want)


@pytest.mark.parametrize("op", onednn_ops())
def test_each_onednn_op_is_judged_by_version_1(op):
    problems = dyndq.check(as_model(op, version=1))
    assert all(p.node == op["name"] for p in problems)
    found = {p.argument for p in problems}
    types = [lt["dtype"] for lt in op["inputs"]]
    expected = set()
    if op["attrs"]["qtype"]["value"] not in ("per_tensor", "per_channel"):
        expected |= {"qtype"}
    if "group_shape" in op["attrs"]:
        expected |= {"group_shape"}  # an attribute version 1 does not have
    if types[0] not in ("s8", "u8"):
        expected |= {"src"}
    if types[1] != "f32":
        expected |= {"scales"}
    if len(types) > 2 and types[2] not in ("s8", "u8", "s32"):
        expected |= {"zps"}
    assert found == expected
    if "qtype" in found:
        [p] = [p for p in problems if p.argument == "qtype"]
        assert p.found == "'per_group'" and "'per_channel'" in p.allowed


def test_the_classic_int8_case_checks_runs_and_exports_bit_exactly():
    """op/f32/dynamicdq.json: s8 [2,64,3,3], per_channel on axis 1, f32 scales [64], no zps."""
    [op] = [p.values[0] for p in onednn_ops() if p.id.startswith("op/f32/dynamicdq.json")]
    model = as_model(op, version=1)
    assert dyndq.check(model) == []
    onnx.checker.check_model(model, full_check=True)
    rng = np.random.default_rng(3)
    src = rng.integers(-128, 128, (2, 64, 3, 3), dtype=np.int8)
    scales = rng.uniform(0.001, 0.1, 64).astype(np.float32)
    feeds = feeds_of(model, [src, scales])
    [ref] = dyndq.run(model, feeds).values()
    [ort] = run_ort(dyndq.export(model), feeds)
    want = oracle(src, scales, None, "per_channel", 1)
    assert same_bits(ref, want) and same_bits(ort, want)


def test_the_harness_rewrites_of_the_compressed_k_case_fit_version_1_once_scales_are_f32():
    """benchdnn rewrites sdpa-compressed-k-int8-gs32 to per_tensor (scales and zps [1]) and to
    per_channel on axis 3 (scales [32], one zp broadcast): with f32 scales, both are version 1."""
    [op] = [p.values[0] for p in onednn_ops() if "compressed-k-int8" in p.id]
    per_tensor = as_model(op, retype={"scales": "f32"}, attrs={"qtype": "per_tensor"},
                          shapes={"scales": [1], "zps": [1]}, version=1)
    per_channel = as_model(op, retype={"scales": "f32"}, attrs={"qtype": "per_channel", "axis": 3},
                           shapes={"scales": [32], "zps": [1]}, version=1)
    rng = np.random.default_rng(4)
    src = rng.integers(-128, 128, (1, 32, 128, 32), dtype=np.int8)
    for model, scales, zps, qtype in (
        (per_tensor, np.array([0.05], np.float32), np.array([-3], np.int8), "per_tensor"),
        (per_channel, rng.uniform(0.01, 1, 32).astype(np.float32), np.array([7], np.int8), "per_channel"),
    ):
        assert dyndq.check(model) == []
        feeds = feeds_of(model, [src, scales, zps])
        want = oracle(src, scales, zps, qtype, 3)
        [ref] = dyndq.run(model, feeds).values()
        [ort] = run_ort(dyndq.export(model), feeds)
        assert same_bits(ref, want) and same_bits(ort, want)
