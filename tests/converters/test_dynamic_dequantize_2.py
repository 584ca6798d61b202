"""The DynamicDequantize-2 converter: every node form lowers to standard ONNX that
`onnx.checker` fully checks and ONNX Runtime runs with, bit for bit, what our kernel,
ONNX's reference evaluator (running our kernel) and a plain NumPy oracle compute."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from cases import oracle_2, same_bits, vi

import dyndq
from dyndq.plumbing.opsets import ORT_MAX_OPSET
from dyndq.converters.dynamic_dequantize import dynamic_dequantize_2_needs
from dyndq.plumbing.walk import walk
from dyndq.opdefs import TensorSpec
from dyndq.ort_session import OrtSession

SRC = ["int8", "uint8", "int4", "uint4"]
T2 = ["float32", "float16", "bfloat16"]
ZPS = [None, "int8", "uint8", "int32", "int4", "uint4"]
NP = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4,
      "float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1), "int4": (-8, 7), "uint4": (0, 15)}


def ints(rng, dtype, shape, extremes=True):
    lo, hi = RANGE[dtype]
    a = np.asarray(rng.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64))
    if extremes and a.size:
        mask = rng.random(a.shape) < 0.3
        a[mask] = rng.choice([lo, hi, lo + 1, hi - 1, 0], size=int(mask.sum()))
    return a.astype(NP[dtype])


def floats(rng, dtype, shape, kind):
    if kind == "normal":
        a = rng.standard_normal(shape) * 0.05
    elif kind == "pow2":
        a = np.ldexp(1.0, rng.integers(-30, 30, shape))
    else:  # subnormal in float32, float16 and bfloat16; huge; specials
        pool = [1e-40, -3e-39, 6e-8, -1e-5, 3e38, -6e4, 65504.0, np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 0.1]
        a = rng.choice(np.array(pool), size=shape)
    with np.errstate(all="ignore"):
        return np.asarray(np.asarray(a, np.float32).astype(NP[dtype]))


def ort_run(model: onnx.ModelProto, feeds: dict, level: str = "basic") -> list:
    """ONNX Runtime on an exported model, int4 and bfloat16 feeds and outputs included
    (through the runner's exact boundary conversions), basic optimizations unless told, one thread."""
    return OrtSession(model, level=level, threads=1).run(None, feeds)


@st.composite
def forms(draw):
    """One DynamicDequantize-2 node: dtypes, qtype, shapes, group shape, and where its inputs come from."""
    src = draw(st.sampled_from(SRC))
    t2 = draw(st.sampled_from(T2))
    zp = draw(st.sampled_from(ZPS + ["like src"] * 4))  # zps of src's dtype half the time: DequantizeLinear
    zp = src if zp == "like src" else zp
    qtype = draw(st.sampled_from(["per_tensor", "per_channel", "per_group"]))
    rank = draw(st.integers(0 if qtype == "per_tensor" else 1, 4))
    attrs, group_shape = {"qtype": qtype}, None
    if qtype == "per_group":
        groups = draw(st.lists(st.sampled_from([1, 1, 2, 3, 4, 8]), min_size=rank, max_size=rank))
        if draw(st.booleans()):  # mostly one grouped dim, as weights are quantized
            keep = draw(st.integers(0, rank - 1))
            groups = [g if i == keep else 1 for i, g in enumerate(groups)]
        blocks = draw(st.lists(st.integers(0, 3), min_size=rank, max_size=rank))
        shape = tuple(b * g for b, g in zip(blocks, groups))
        sshape = tuple(blocks)
        zshape = sshape
        group_shape = tuple(groups)
        attrs["group_shape"] = list(groups)
    else:
        shape = tuple(draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank)))
        if qtype == "per_channel":
            axis = draw(st.integers(-rank, rank - 1))
            attrs["axis"] = axis
            sshape = (shape[axis],)
            zshape = draw(st.sampled_from([sshape, (1,), ()]))
        else:
            sshape = draw(st.sampled_from([(1,), ()]))
            zshape = draw(st.sampled_from([(1,), ()]))
    return dict(src=src, t2=t2, zp=zp, qtype=qtype, shape=shape, sshape=sshape, zshape=zshape, attrs=attrs,
                group_shape=group_shape,
                scales_as=draw(st.sampled_from(["input", "initializer"])),
                zps_as=draw(st.sampled_from(["input", "initializer"])),
                opset=draw(st.sampled_from([13, 19, 21, 23, ORT_MAX_OPSET])),
                place=draw(st.sampled_from(PLACES)),
                kind=draw(st.sampled_from(["normal", "pow2", "extreme"])),
                seed=draw(st.integers(0, 2**32 - 1)),
                # inputs declared with symbolic dims, and ONNX Runtime without its optimizations
                # (which fold a Shape of a static shape away, hiding a Shape it has no kernel for)
                symbolic=draw(st.booleans()), optimized=draw(st.booleans()))


# Where the node stands: the main graph (every value typed), or a model-local function (nothing
# typed: one lowering for every call), its attributes written on it or given by the call.
PLACES = ["main", "function", "function, attributes by reference"]


def arrays_of(p):
    rng = np.random.default_rng(p["seed"])
    src = ints(rng, p["src"], p["shape"])
    scales = floats(rng, p["t2"], p["sshape"], p["kind"])
    zps = None if p["zp"] is None else ints(rng, p["zp"], p["zshape"])
    return src, scales, zps


def model_of(p, src, scales, zps):
    names = ["src", "scales"] + ([] if zps is None else ["zps"])
    values = dict(src=src, scales=scales, zps=zps)
    dims = lambda name, shape: [f"{name}_{i}" for i in range(len(shape))] if p.get("symbolic") else list(shape)  # noqa: E731
    inputs, inits, feeds = [vi("src", p["src"], dims("src", src.shape))], [], {"src": src}
    for name in names[1:]:
        if p[f"{name}_as"] == "initializer":
            inits.append(numpy_helper.from_array(values[name], name))
        else:
            inputs.append(vi(name, values[name].dtype, dims(name, values[name].shape)))
            feeds[name] = values[name]
    node = dyndq.make_node(names, ["dst"], name="dq", version=2, **p["attrs"])
    imports = [helper.make_opsetid("", p["opset"]), dyndq.opset_import(2)]
    functions = []
    if p["place"] != "main":
        node, functions = in_a_function(node, p["place"].endswith("by reference"), imports)
        imports = imports + [helper.make_opsetid("local", 1)]
    graph = helper.make_graph([node], "g", inputs, [vi("dst", p["t2"], list(src.shape))], initializer=inits)
    return helper.make_model(graph, opset_imports=imports, functions=functions, ir_version=10), feeds


def in_a_function(node, by_reference: bool, imports):
    """(a call of local::Deq, [Deq]): Deq holds the node; with `by_reference` each of the
    node's attributes is a reference to an attribute of Deq, which the call gives."""
    body = onnx.NodeProto()
    body.CopyFrom(node)
    call = helper.make_node("Deq", list(node.input), list(node.output), domain="local", name="call")
    if by_reference:
        del body.attribute[:]
        for a in node.attribute:
            body.attribute.append(onnx.AttributeProto(name=a.name, type=a.type, ref_attr_name=a.name))
            call.attribute.append(a)
    f = helper.make_function("local", "Deq", list(node.input), list(node.output), [body], imports,
                             attributes=[a.name for a in node.attribute] if by_reference else [])
    return call, [f]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forms())
def test_every_form_exports_and_runs_in_onnxruntime_bit_for_bit(p):
    """Every form, in the main graph and inside a model-local function (where the lowering
    cannot see dst's dtype), with normal, power-of-two and special scales (NaN, Inf,
    subnormals): ONNX Runtime's bits are the kernel's and the oracle's (float16 NaNs 0x7E00)."""
    src, scales, zps = arrays_of(p)
    model, feeds = model_of(p, src, scales, zps)
    assert dyndq.check(model) == []
    before = model.SerializeToString()
    exported, report = dyndq.export_with_report(model)
    event(f"{p['place']}: {p['qtype']} {p['t2']} -> {report.lowered[0].form}")
    assert model.SerializeToString() == before  # never mutated
    onnx.checker.check_model(exported, full_check=True)
    assert not any(site.node.domain == dyndq.DOMAIN for site in walk(exported))
    kwargs = dict(qtype=p["qtype"], axis=p["attrs"].get("axis", 1), group_shape=p["group_shape"])
    want = oracle_2(src, scales, zps, **kwargs)
    kernel = dyndq.dynamic_dequantize(src, scales, zps, **kwargs)
    [reference] = dyndq.reference_evaluator(model).run(None, feeds)
    [got] = ort_run(exported, feeds, "basic" if p["optimized"] else "off")
    assert same_bits(kernel, want)
    assert same_bits(reference, want)
    assert same_bits(got, want), (p, exported.graph.node)
    # int4 anywhere needs IR >= 10; the opset is raised to what the form needs, never lowered below ORT's
    opset = next(o.version for o in exported.opset_import if o.domain == "")
    assert opset >= p["opset"] or p["opset"] > ORT_MAX_OPSET
    if "int4" in (p["src"], p["zp"]) or "uint4" in (p["src"], p["zp"]):
        assert exported.ir_version >= 10 and opset >= 21


# -- which standard ops each form becomes ---------------------------------------------------------


def _one(src, scales, zps=None, *, opset=21, **attrs):
    """A model with one node; src, scales, zps given as (dtype, shape)."""
    names = ["src", "scales"] + ([] if zps is None else ["zps"])
    inputs = [vi(n, d, list(s)) for n, (d, s) in zip(names, [src, scales] + ([zps] if zps else []))]
    graph = helper.make_graph([dyndq.make_node(names, ["dst"], name="dq", version=2, **attrs)], "g", inputs,
                              [vi("dst", scales[0], list(src[1]))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), dyndq.opset_import(2)], ir_version=10)


def ops(model):
    return [n.op_type for n in model.graph.node if n.op_type != "Constant"]


def report_of(model, **kw):
    return dyndq.export_with_report(model, **kw)


@pytest.mark.parametrize("t2", ["float32", "float16"])
@pytest.mark.parametrize("src", ["int4", "uint4", "int8"])
def test_blocked_one_grouped_dim_is_one_dequantize_linear_21(src, t2):
    model = _one((src, (4, 64)), (t2, (4, 2)), (src, (4, 2)), qtype="per_group", group_shape=[1, 32])
    exported, report = report_of(model)
    # float16: scales Cast to float32, NaNs made the one quiet NaN, one Cast to float16 (see _narrow)
    assert ops(exported) == (["DequantizeLinear"] if t2 == "float32" else
                             ["Cast", "DequantizeLinear", "IsNaN", "Where", "Cast"])
    [dql] = [n for n in exported.graph.node if n.op_type == "DequantizeLinear"]
    assert {a.name: a.i for a in dql.attribute} == {"axis": 1, "block_size": 32}
    assert report.lowered[0].form == "DequantizeLinear (blocked)"
    assert report.opset >= 21


def test_per_group_all_ones_is_per_element_block_size_1():
    exported = dyndq.export(_one(("uint4", (3, 5)), ("float32", (3, 5)), qtype="per_group", group_shape=[1, 1]))
    [dql] = exported.graph.node
    assert {a.name: a.i for a in dql.attribute} == {"axis": 0, "block_size": 1}


def test_bfloat16_scales_cast_to_float32_and_back_once():
    exported = dyndq.export(_one(("int4", (8, 4)), ("bfloat16", (2, 4)), ("int4", (2, 4)),
                                 qtype="per_group", group_shape=[4, 1]))
    assert ops(exported) == ["Cast", "DequantizeLinear", "Cast"]
    casts = [n for n in exported.graph.node if n.op_type == "Cast"]
    assert [c.attribute[0].i for c in casts] == [TensorProto.FLOAT, TensorProto.BFLOAT16]


@pytest.mark.parametrize("zp", ["int8", "int32", "uint4"])
def test_zero_points_of_another_dtype_take_the_integer_route(zp):
    exported, report = report_of(_one(("int4", (4, 6)), ("float16", (4, 3)), (zp, (4, 3)),
                                      qtype="per_group", group_shape=[1, 2]))
    assert "DequantizeLinear" not in ops(exported)
    assert report.lowered[0].form == "integer arithmetic"
    # never a subtraction in int32 or a float type: Sub only on int64 values
    inferred = onnx.shape_inference.infer_shapes(exported, strict_mode=True)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info)}
    subs = [n for n in exported.graph.node if n.op_type == "Sub"]
    assert subs and all(types[i] == TensorProto.INT64 for n in subs for i in n.input)
    # and no Reshape/Expand of an int4 or bfloat16 tensor (ONNX Runtime has none)
    for n in exported.graph.node:
        if n.op_type in ("Reshape", "Expand", "Unsqueeze", "Gather"):
            assert types.get(n.input[0]) in (TensorProto.FLOAT, TensorProto.INT64), n


def test_more_than_one_grouped_dim_takes_the_integer_route():
    exported = dyndq.export(_one(("uint4", (4, 6)), ("float32", (2, 3)), ("uint4", (2, 3)),
                                 qtype="per_group", group_shape=[2, 2]))
    assert "DequantizeLinear" not in ops(exported)


def test_one_int4_zero_point_under_per_channel_is_never_expanded_as_int4():
    exported = dyndq.export(_one(("int4", (2, 6)), ("float32", (6,)), ("int4", (1,)), qtype="per_channel", axis=1))
    assert "DequantizeLinear" not in ops(exported)
    assert "Expand" not in ops(exported)


def test_version_1_forms_under_version_2_lower_as_version_1_does():
    model = _one(("int8", (2, 3)), ("float32", (3,)), ("int32", (3,)), opset=13, qtype="per_channel", axis=1)
    v1 = helper.make_model(model.graph, opset_imports=[helper.make_opsetid("", 13), dyndq.opset_import(1)],
                           ir_version=7)
    a, b = dyndq.export(model), dyndq.export(v1)
    assert a.graph == b.graph
    assert next(o.version for o in a.opset_import if o.domain == "") == 13


# -- opsets, IR, and opset= too low --------------------------------------------------------------


@pytest.mark.parametrize("src, scales, zps, attrs, opset", [
    (("int8", (2, 4)), ("float16", (1,)), None, {"qtype": "per_tensor"}, 10),
    (("uint8", (2, 4)), ("float16", (4,)), ("uint8", (4,)), {"qtype": "per_channel", "axis": 1}, 13),
    (("int8", (2, 4)), ("bfloat16", (4,)), None, {"qtype": "per_channel", "axis": 1}, 13),
    (("int8", (2, 4)), ("float32", (2, 2)), None, {"qtype": "per_group", "group_shape": [1, 2]}, 21),
    (("int4", (2, 4)), ("float32", ()), None, {"qtype": "per_tensor"}, 21),
    (("int8", (2, 4)), ("bfloat16", (1, 2)), ("int32", (1, 2)), {"qtype": "per_group", "group_shape": [2, 2]}, 13),
    (("int8", (2, 4)), ("float32", (1, 2)), ("int32", (1, 2)), {"qtype": "per_group", "group_shape": [2, 2]}, 11),
])
def test_needs_and_raised_opset(src, scales, zps, attrs, opset):
    specs = [TensorSpec(*src), TensorSpec(*scales), None if zps is None else TensorSpec(*zps)]
    needs = dynamic_dequantize_2_needs(*specs, **attrs)
    assert needs.opset == opset
    model = _one(src, scales, zps, opset=10, **attrs)
    exported, report = report_of(model)
    assert report.opset == opset and report.converted == (opset != 10)  # built at opset 10
    onnx.checker.check_model(exported, full_check=True)
    int4 = "int4" in (src[0], (zps or ("",))[0])
    assert exported.ir_version == max(onnx.helper.find_min_ir_version_for(list(exported.opset_import)),
                                      10 if int4 else 0)
    with pytest.raises(dyndq.ExportError, match=rf"main: DynamicDequantize 'dq' needs {opset} \("):
        dyndq.export(model, opset=opset - 1)


def test_export_error_names_every_node_and_what_each_needs():
    a = dyndq.make_node(["w", "s"], ["d1"], name="blocked", version=2, qtype="per_group", group_shape=[1, 2])
    b = dyndq.make_node(["h", "t"], ["d2"], name="half", version=2, qtype="per_tensor")
    graph = helper.make_graph([a, b], "g", [vi("w", "uint4", [2, 4]), vi("s", "float32", [2, 2]),
                                            vi("h", "int8", [3]), vi("t", "float16", [1])],
                              [vi("d1", "float32", [2, 4]), vi("d2", "float16", [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), dyndq.opset_import(2)], ir_version=10)
    with pytest.raises(dyndq.ExportError) as e:
        dyndq.export(model, opset=17)
    text = str(e.value)
    assert "'blocked' needs 21 (blocked DequantizeLinear (block_size), int4/uint4 tensors)" in text
    assert "'half'" not in text  # float16 scales go through float32 and a Cast: opset 10 is enough


# (the shared table's version-2 rows, exported with scales/zps as inputs and as initializers and run
# in ONNX Runtime: tests/test_opcheck.py)


@pytest.mark.parametrize("x_type, axis, with_zp", [("int4", 1, True), ("uint4", 0, False), ("uint8", -1, True),
                                                   ("int8", 0, True)])
def test_blocked_dequantize_linear_with_a_padded_axis_lifts_exactly(x_type, axis, with_zp):
    """A blocked axis that is not a multiple of block_size (ONNX rounds the block count up): the
    constant codes are padded to whole blocks, and a Slice cuts the result back; bit for bit."""
    import ml_dtypes
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    shape, block = (40, 6), 16
    a = axis % 2
    sshape = tuple(-(-d // block) if i == a else d for i, d in enumerate(shape))
    kind = getattr(ml_dtypes, x_type, None) or np.dtype(x_type)
    lo, hi = {"int4": (-8, 7), "uint4": (0, 15), "uint8": (0, 255), "int8": (-128, 127)}[x_type]
    inits = [numpy_helper.from_array(rng.integers(lo, hi + 1, shape).astype(kind), "x"),
             numpy_helper.from_array((rng.random(sshape) * 0.1).astype(np.float32), "s")]
    if with_zp:
        inits.append(numpy_helper.from_array(rng.integers(lo, hi + 1, sshape).astype(kind), "z"))
    node = helper.make_node("DequantizeLinear", [t.name for t in inits], ["y"], axis=axis, block_size=block, name="dq")
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    lifted, report = dyndq.lift_with_report(model)
    assert report.count == 1 and "(padded) + Slice" in report.lifted[0][2]
    expected = OrtSession(model, level="all").run(None, {})[0]  # (ONNX Runtime at its defaults)
    assert dyndq.run(lifted, {}, engine="reference")["y"].tobytes() == expected.tobytes()
    assert dyndq.run(lifted, {}, engine="onnxruntime")["y"].tobytes() == expected.tobytes()


@pytest.mark.openvino
@pytest.mark.parametrize("x_type", ["uint4", "int8"])
def test_a_padded_axis_exported_for_openvino_keeps_its_slice(x_type):
    """OpenVINO's DequantizeLinear refuses a short last block (x.shape[axis] % block_size != 0):
    for it the padded codes and their Slice stay (the join into one DequantizeLinear is for the
    engines that take it); bit for bit with the reference engine."""
    from engines import needs_openvino, run_openvino

    needs_openvino()
    rng = np.random.default_rng(5)
    kind = getattr(ml_dtypes, x_type, None) or np.dtype(x_type)
    codes = rng.integers(0, 8, (48, 6)).astype(kind)  # (40 rows used: the last block of 16 is 8 short)
    inits = [numpy_helper.from_array(codes, "x"), numpy_helper.from_array((rng.random((3, 6)) * 0.1).astype(np.float32), "s")]
    nodes = [dyndq.make_node(["x", "s"], ["d"], name="ddq", version=2, qtype="per_group", group_shape=[16, 1]),
             helper.make_node("Slice", ["d", "starts", "ends", "axes"], ["y"], name="cut")]
    inits += [numpy_helper.from_array(np.array([v], np.int64), n) for n, v in (("starts", 0), ("ends", 40), ("axes", 0))]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [40, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), dyndq.opset_import(2)], ir_version=10)
    onnx_form = dyndq.export(model)
    assert [n.op_type for n in onnx_form.graph.node].count("Slice") == 0  # (joined: the short last block)
    for_openvino = dyndq.export(model, target="openvino")
    assert "Slice" in [n.op_type for n in for_openvino.graph.node]
    want = dyndq.run(model, {}, engine="reference")["y"]
    assert run_openvino(for_openvino, {})[0].tobytes() == want.tobytes()
