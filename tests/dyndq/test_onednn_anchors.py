"""oneDNN's own benchdnn graphs that hold DynamicDequantize (tests/data/onednn), as ONNX.

Each oneDNN op becomes a DynamicDequantize node of ours with the same dtypes,
shapes and attributes. Every one is valid under DynamicDequantize-2 and runs in
the kernel, bit for bit as the oracle says; the classic int8 case is also
DynamicDequantize-1 and must check, run and export bit-exactly; the newer
per_group / int4 / f16 / bf16 forms are out of version 1's reach, and version 1
must refuse each of them with problems naming exactly what is out of its reach.
"""
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from cases import oracle, oracle_2, random_array, run_ort, same_bits
from onnx import TensorProto, helper

import dyndq

DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"
ONEDNN_TYPES = {
    "s8": TensorProto.INT8, "u8": TensorProto.UINT8, "s32": TensorProto.INT32, "f32": TensorProto.FLOAT,
    "f16": TensorProto.FLOAT16, "bf16": TensorProto.BFLOAT16, "s4": TensorProto.INT4, "u4": TensorProto.UINT4,
}
ROLES = ("src", "scales", "zps")


def onednn_ops() -> list:
    return [
        pytest.param(op, id=f"{path.relative_to(DATA)}:{op['name']}:{op['id']}")
        for path in sorted(DATA.rglob("*.json"))
        for op in json.loads(path.read_text())["graph"]
        if op["kind"] == "DynamicDequantize"
    ]


def as_model(op, *, retype=None, attrs=None, shapes=None, version=None):
    """One oneDNN op as a one-node ONNX model importing org.dyndq at `version` (the newest
    by default), inputs optionally re-typed or re-shaped."""
    retype, shapes = retype or {}, shapes or {}
    attributes = {k: v["value"] for k, v in op["attrs"].items()} if attrs is None else attrs
    inputs = []
    for role, lt in zip(ROLES, op["inputs"]):
        dtype = retype.get(role, lt["dtype"])
        inputs.append(helper.make_tensor_value_info(role, ONEDNN_TYPES[dtype], shapes.get(role, lt["shape"])))
    dst = TensorProto.FLOAT if version == 1 else ONEDNN_TYPES[retype.get("scales", op["inputs"][1]["dtype"])]
    out = helper.make_tensor_value_info("dst", dst, op["outputs"][0]["shape"])
    node = helper.make_node("DynamicDequantize", [i.name for i in inputs], ["dst"], name=op["name"],
                            domain=dyndq.DOMAIN, **attributes)
    versions = None if version is None else {dyndq.DOMAIN: version}
    return dyndq.make_model(helper.make_graph([node], "onednn", inputs, [out]), versions=versions)


def test_the_anchors_are_all_here():
    assert len(list(DATA.rglob("*.json"))) == 12
    assert len(onednn_ops()) == 16  # the MLP holds three, two SDPA cases two each


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
    [ref] = dyndq.run(as_model(op), dict(zip(ROLES, arrays))).values()
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
    [ref] = dyndq.run(model, {"src": src, "scales": scales}).values()
    [ort] = run_ort(dyndq.export(model), {"src": src, "scales": scales})
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
        feeds = {"src": src, "scales": scales, "zps": zps}
        want = oracle(src, scales, zps, qtype, 3)
        [ref] = dyndq.run(model, feeds).values()
        [ort] = run_ort(dyndq.export(model), feeds)
        assert same_bits(ref, want) and same_bits(ort, want)
