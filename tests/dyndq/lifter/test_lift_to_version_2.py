"""dyndq.lift to version 2: DequantizeLinear with int4/uint4 x, float16/bfloat16 scales or
block_size becomes DynamicDequantize-2; forms version 1 expresses stay version 1 unless the
model already imports version 2; export(lift(m)) runs in ONNX Runtime with the bits of m."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from cases import oracle_2, same_bits, vi

import dyndq
from dyndq.opdefs import dtypes
from dyndq.plumbing.opsets import ORT_MAX_OPSET

NP = {"int8": np.int8, "uint8": np.uint8, "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4,
      "float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7), "uint4": (0, 15)}
V1_FORM = ("int8", "uint8")


def domain_version(model):
    return next((o.version for o in model.opset_import if o.domain == dyndq.DOMAIN), None)


@st.composite
def dql_graphs(draw):
    x = draw(st.sampled_from(["int8", "uint8", "int4", "uint4"]))
    t = draw(st.sampled_from(["float32", "float16", "bfloat16"]))
    form = draw(st.sampled_from(["tensor", "axis", "blocked"]))
    low = 21 if x in ("int4", "uint4") or form == "blocked" else 19 if t != "float32" else 13 if form == "axis" else 10
    opset = draw(st.sampled_from([o for o in (10, 13, 19, 21, 23, 25) if o >= low]))
    rank = draw(st.integers(1, 3))
    attrs = {}
    if form == "blocked":
        axis = draw(st.integers(-rank, rank - 1))
        block = draw(st.sampled_from([1, 2, 4, 32]))
        blocks = draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank))
        shape = [b * block if i == axis % rank else b for i, b in enumerate(blocks)]
        sshape = blocks
        attrs = {"axis": axis, "block_size": block}
    elif form == "axis":
        shape = draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank))
        axis = draw(st.integers(-rank, rank - 1))
        sshape = [shape[axis]]
        attrs = {"axis": axis}
    else:
        shape = draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank))
        sshape = draw(st.sampled_from([[], [1]] if opset >= 13 else [[]]))
    return dict(x=x, t=t, form=form, opset=opset, shape=shape, sshape=sshape, attrs=attrs,
                with_zp=draw(st.booleans()), as_init=draw(st.booleans()),
                imports_v2=draw(st.booleans()), seed=draw(st.integers(0, 2**32 - 1)))


def build(p):
    rng = np.random.default_rng(p["seed"])
    lo, hi = RANGE[p["x"]]
    arrays = {"x": rng.integers(lo, hi, p["shape"], endpoint=True).astype(NP[p["x"]]),
              "s": np.asarray((rng.standard_normal(p["sshape"]) * 0.1).astype(np.float32).astype(NP[p["t"]]))}
    if p["with_zp"]:
        arrays["z"] = np.asarray(rng.integers(lo, hi, p["sshape"], endpoint=True).astype(NP[p["x"]]))
    names = list(arrays)
    inputs = [vi("x", p["x"], p["shape"])]
    inits, feeds = [], {"x": arrays["x"]}
    for n in names[1:]:
        if p["as_init"]:
            inits.append(numpy_helper.from_array(arrays[n], n))
        else:
            inputs.append(vi(n, arrays[n].dtype.name, list(arrays[n].shape)))
            feeds[n] = arrays[n]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", names, ["y"], name="dql", **p["attrs"]),
         helper.make_node("Cast", ["y"], ["n"], to=onnx.TensorProto.FLOAT, name="widen")],
        "g", inputs, [vi("y", p["t"], p["shape"]), vi("n", "float32", p["shape"])], initializer=inits)
    imports = [helper.make_opsetid("", p["opset"])]
    if p["imports_v2"]:
        imports.append(dyndq.opset_import(2))
    model = helper.make_model(graph, opset_imports=imports,
                              ir_version=max(10, onnx.helper.find_min_ir_version_for(imports, ignore_unknown=True)))
    return model, feeds, arrays


def ort_can_run(p) -> bool:
    """ONNX Runtime's DequantizeLinear has no bfloat16 scales, and refuses a
    block_size beside a one-element scale ("block_size must be 0 for per-tensor quantization")."""
    return (p["t"] != "bfloat16" and p["opset"] <= ORT_MAX_OPSET
            and not (p["form"] == "blocked" and int(np.prod(p["sshape"])) == 1))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dql_graphs())
def test_export_of_lift_runs_in_onnxruntime_with_the_bits_of_the_original(p):
    model, feeds, arrays = build(p)
    onnx.checker.check_model(model, full_check=True)
    before = model.SerializeToString()
    lifted, report = dyndq.lift_with_report(model)
    assert model.SerializeToString() == before
    assert report.count == 1, report.skipped
    assert dyndq.check(lifted) == []
    v1_form = p["x"] in V1_FORM and p["t"] == "float32" and p["form"] != "blocked"
    # the lowest version that expresses the node, unless the model already imports a newer one
    assert domain_version(lifted) == (2 if p["imports_v2"] or not v1_form else 1)
    event(f"{p['form']} {p['x']} {p['t']} -> version {domain_version(lifted)}")
    exported = dyndq.export(lifted)
    onnx.checker.check_model(exported, full_check=True)
    axis = p["attrs"].get("axis", 1)
    group_shape = None
    if p["form"] == "blocked":
        r = len(p["shape"])
        group_shape = [p["attrs"]["block_size"] if i == axis % r else 1 for i in range(r)]
    qtype = {"tensor": "per_tensor", "axis": "per_channel", "blocked": "per_group"}[p["form"]]
    y = oracle_2(arrays["x"], arrays["s"], arrays.get("z"), qtype, axis, group_shape)
    want = {"y": y, "n": y.astype(np.float32)}
    got = dyndq.run(exported, feeds, engine="onnxruntime")
    for name in want:
        assert same_bits(got[name], want[name]), name
    if ort_can_run(p):  # the original model itself, in ONNX Runtime: the same bits
        original = dyndq.run(model, feeds, engine="onnxruntime")
        for name in want:
            assert same_bits(original[name], got[name]), name
    ours = dyndq.run(lifted, feeds)  # and our kernel on the lifted graph
    for name in want:
        assert same_bits(ours[name], want[name]), name


def _dql(x, s, z=None, *, opset=21, imports=(), **attrs):
    names = ["x", "s"] + (["z"] if z else [])
    inputs = [vi(n, *d) for n, d in zip(names, [x, s] + ([z] if z else []))]
    graph = helper.make_graph([helper.make_node("DequantizeLinear", names, ["y"], name="dql", **attrs)], "g", inputs,
                              [vi("y", s[0], x[1])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *imports], ir_version=10)


@pytest.mark.parametrize("x, s, z, attrs, version, lifted_attrs", [
    (("int8", [2, 4]), ("float32", []), ("int8", []), {}, 1, {"qtype": b"per_tensor"}),
    (("int4", [2, 4]), ("float32", []), ("int4", []), {}, 2, {"qtype": b"per_tensor"}),
    (("uint8", [2, 4]), ("float16", [4]), ("uint8", [4]), {"axis": 1}, 2, {"qtype": b"per_channel", "axis": 1}),
    (("uint4", [2, 64]), ("float16", [2, 2]), ("uint4", [2, 2]), {"axis": 1, "block_size": 32}, 2,
     {"qtype": b"per_group", "group_shape": [1, 32]}),
    (("int8", [6, 4]), ("bfloat16", [3, 4]), None, {"axis": 0, "block_size": 2}, 2,
     {"qtype": b"per_group", "group_shape": [2, 1]}),
])
def test_lift_rules(x, s, z, attrs, version, lifted_attrs):
    lifted = dyndq.lift(_dql(x, s, z, **attrs))
    [node] = lifted.graph.node
    assert (node.domain, node.op_type, domain_version(lifted)) == (dyndq.DOMAIN, "DynamicDequantize", version)
    assert {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute} == lifted_attrs


def test_version_1_forms_beside_a_version_2_form_are_covered_by_version_2():
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["a", "s"], ["ya"], name="eight_bit"),
         helper.make_node("DequantizeLinear", ["b", "s"], ["yb"], name="four_bit")], "g",
        [vi("a", "int8", [4]), vi("b", "int4", [4]), vi("s", "float32", [])],
        [vi("ya", "float32", [4]), vi("yb", "float32", [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 2 and domain_version(lifted) == 2
    feeds = {"a": np.array([-128, -1, 0, 127], np.int8), "b": np.array([-8, -1, 0, 7], ml_dtypes.int4),
             "s": np.array(0.5, np.float32)}
    want = dyndq.run(model, feeds, engine="onnxruntime")
    got = dyndq.run(dyndq.export(lifted), feeds, engine="onnxruntime")
    assert all(same_bits(got[k], want[k]) for k in want)


def test_a_model_importing_version_1_gets_version_2_when_a_node_needs_it():
    model = _dql(("uint4", [4]), ("float32", []), opset=21, imports=[dyndq.opset_import(1)])
    assert domain_version(dyndq.lift(model)) == 2


@pytest.mark.parametrize("x, s, z, attrs, reason", [
    (("int4", [2, 5]), ("float32", [2, 3]), ("int4", [2, 3]), {"axis": 1, "block_size": 2}, "not a multiple"),
    (("int4", [2, 4]), ("float32", []), ("int8", []), {}, "x_zero_point is int8, not x's dtype int4"),
])
def test_what_version_2_leaves_alone_and_why(x, s, z, attrs, reason):
    model = _dql(x, s, z, opset=23, **attrs)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 0 and reason in report.skipped[0].reason
    assert lifted.SerializeToString() == model.SerializeToString()


@pytest.mark.parametrize("x, s, attrs, reason", [
    (("int16", [2, 4]), ("float16", []), {}, "x is int16"),
    (("uint4", [2, 4]), ("float16", []), {"output_dtype": onnx.TensorProto.FLOAT}, "output_dtype FLOAT"),
])
def test_what_version_2_leaves_to_version_3(x, s, attrs, reason):
    """Version 2's lifting refuses these (saying why); version 3's takes them, output_dtype kept."""
    model = _dql(x, s, None, opset=23, **attrs)
    node = model.graph.node[0]
    specs = {v.name: dyndq.TensorSpec(dtypes.by_onnx(v.type.tensor_type.elem_type).name,
                                      tuple(d.dim_value for d in v.type.tensor_type.shape.dim))
             for v in model.graph.input}
    refusal = dyndq.DYNAMIC_DEQUANTIZE_2.lifting(node, specs.get)
    assert reason in str(refusal)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and domain_version(lifted) == 3
    assert {a.name for a in lifted.graph.node[0].attribute} >= set(attrs)
