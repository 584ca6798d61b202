"""dyndq.export: whole models lowered to standard ONNX that ONNX Runtime runs bit-exactly."""
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from cases import oracle, run_ort, same_values as same, vi

import dyndq
from dyndq.plumbing.opsets import ORT_MAX_OPSET

def ai_onnx(model):
    return next(o.version for o in model.opset_import if o.domain == "")


def domains(model):
    return {o.domain for o in model.opset_import}


# -- property-based: one DynamicDequantize -------------------------------------------------------

INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int32": (-(2**31), 2**31 - 1)}


def _ints(rng, dtype, shape, extremes=False):
    lo, hi = INT_RANGE[dtype]
    a = np.asarray(rng.integers(lo, hi, size=shape, endpoint=True, dtype=np.int64))
    if extremes and a.size:
        mask = rng.random(a.shape) < 0.5
        a[mask] = rng.choice([lo, hi, lo + 1, hi - 1], size=int(mask.sum()))
    return a.astype(dtype)


def _scales(rng, kind, shape):
    if kind == "normal":
        return np.asarray(rng.standard_normal(shape) * 0.05, np.float32)
    if kind == "pow2":
        return np.asarray(np.ldexp(np.float32(1), rng.integers(-20, 20, shape)), np.float32)
    if kind == "extreme":  # subnormal, huge (the product overflows), and IEEE specials
        pool = np.array([1e-40, -3e-39, 3e38, -1e37, np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0], np.float32)
        return np.asarray(rng.choice(pool, size=shape), np.float32)
    raise ValueError(kind)


@st.composite
def single_node_graphs(draw):
    src_dtype = draw(st.sampled_from(["int8", "uint8"]))
    zp_dtype = draw(st.sampled_from([None, "int8", "uint8", "int32"]))
    qtype = draw(st.sampled_from(["per_tensor", "per_channel"]))
    rank = draw(st.integers(1 if qtype == "per_channel" else 0, 4))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=rank, max_size=rank)))
    if qtype == "per_channel":
        axis = draw(st.integers(-rank, rank - 1))
        scale_shape = (shape[axis],)
        zp_shape = draw(st.sampled_from([scale_shape, (1,), ()]))
        attrs = {"qtype": qtype, "axis": axis}
    else:
        scale_shape = draw(st.sampled_from([(1,), ()]))
        zp_shape = draw(st.sampled_from([(1,), ()]))
        attrs = {"qtype": qtype}
    return dict(
        src_dtype=src_dtype, zp_dtype=zp_dtype, shape=shape, scale_shape=scale_shape, zp_shape=zp_shape,
        attrs=attrs,
        scales_as=draw(st.sampled_from(["input", "initializer", "constant"])),
        zps_as=draw(st.sampled_from(["input", "initializer", "constant"])),
        declare=draw(st.sampled_from(["static", "symbolic"])),  # (an unranked input fails check_model)
        opset=draw(st.sampled_from([10, 11, 13, 17, 19, 21, ORT_MAX_OPSET])),
        scale_kind=draw(st.sampled_from(["normal", "pow2", "extreme"])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def build_single(p):
    rng = np.random.default_rng(p["seed"])
    src = _ints(rng, p["src_dtype"], p["shape"])
    scales = _scales(rng, p["scale_kind"], p["scale_shape"])
    zps = None if p["zp_dtype"] is None else _ints(rng, p["zp_dtype"], p["zp_shape"], extremes=True)
    if p["declare"] == "static":
        src_shape = list(p["shape"])
    else:
        src_shape = [f"d{i}" for i in range(len(p["shape"]))]
    inputs, inits, nodes, feeds = [vi("src", p["src_dtype"], src_shape)], [], [], {"src": src}
    names = ["src"]
    for name, array, where in (("scales", scales, p["scales_as"]), ("zps", zps, p["zps_as"])):
        if array is None:
            continue
        names.append(name)
        if where == "input":
            inputs.append(vi(name, array.dtype, list(array.shape)))
            feeds[name] = array
        elif where == "initializer":
            inits.append(numpy_helper.from_array(array, name))
        else:
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array)))
    nodes.append(dyndq.make_node(names, ["dst"], name="dq", **p["attrs"]))
    graph = helper.make_graph(nodes, "one", inputs, [vi("dst", TensorProto.FLOAT, list(p["shape"]))], initializer=inits)
    model = dyndq.make_model(graph, opset=p["opset"])
    return model, feeds, (src, scales, zps)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(single_node_graphs())
def test_random_single_node_graphs_run_bit_exactly_in_onnxruntime(p):
    model, feeds, (src, scales, zps) = build_single(p)
    before = model.SerializeToString()
    exported, report = dyndq.export_with_report(model)
    assert model.SerializeToString() == before
    assert report.count == 1
    onnx.checker.check_model(exported, full_check=True)
    assert dyndq.DOMAIN not in domains(exported)
    assert all(n.domain == "" for n in exported.graph.node)
    # per_channel DequantizeLinear needs 13; zps of another dtype take the integer route (10)
    dql = p["zp_dtype"] is None or p["zp_dtype"] == p["src_dtype"]
    need = 13 if p["attrs"]["qtype"] == "per_channel" and dql else 10
    assert ai_onnx(exported) == max(p["opset"], need)
    assert exported.ir_version == onnx.helper.find_min_ir_version_for(list(exported.opset_import), True)
    [got] = run_ort(exported, feeds)
    want = dyndq.dynamic_dequantize(src, scales, zps, **p["attrs"])
    assert same(got, want)
    assert same(got, oracle(src, scales, zps, **p["attrs"]))


# -- property-based: the op between MatMul, Add and Relu ---------------------------------------


@st.composite
def layer_graphs(draw):
    return dict(
        src_dtype=draw(st.sampled_from(["int8", "uint8"])),
        zp_dtype=draw(st.sampled_from([None, "int8", "uint8", "int32"])),
        qtype=draw(st.sampled_from(["per_tensor", "per_channel"])),
        axis=draw(st.sampled_from([0, 1, -1, -2])),
        m=draw(st.integers(0, 3)), k=draw(st.integers(0, 5)), n=draw(st.integers(0, 5)),
        one_zp=draw(st.booleans()),
        as_inputs=draw(st.booleans()),
        opset=draw(st.sampled_from([11, 13, 21])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def build_layer(p):
    """y = Relu(MatMul(x, DynamicDequantize(w)) + b), every value exact in float32: the
    products and sums are small integers times powers of two, so any summation order agrees."""
    rng = np.random.default_rng(p["seed"])
    k, n = p["k"], p["n"]
    w = _ints(rng, p["src_dtype"], (k, n))
    qtype = p["qtype"]
    axis = p["axis"] if qtype == "per_channel" else 1
    channels = (k, n)[axis]
    sshape = (channels,) if qtype == "per_channel" else (1,)
    scales = np.ldexp(np.float32(1), rng.integers(-4, 4, sshape)).astype(np.float32)
    zps = None
    if p["zp_dtype"]:
        zshape = (1,) if p["one_zp"] or qtype == "per_tensor" else sshape
        lo, hi = (-300, 300) if p["zp_dtype"] == "int32" else INT_RANGE[p["zp_dtype"]]
        zps = rng.integers(lo, hi, zshape, endpoint=True).astype(p["zp_dtype"])
    x = rng.integers(-8, 8, (p["m"], k), endpoint=True).astype(np.float32)
    b = rng.integers(-1000, 1000, (n,)).astype(np.float32)
    names = ["w", "scales"] + (["zps"] if zps is not None else [])
    arrays = dict(w=w, scales=scales, zps=zps)
    attrs = {"qtype": qtype, **({"axis": axis} if qtype == "per_channel" else {})}
    nodes = [
        dyndq.make_node(names, ["w_f"], name="w_dq", **attrs),
        helper.make_node("MatMul", ["x", "w_f"], ["mm"], name="mm"),
        helper.make_node("Add", ["mm", "b"], ["biased"], name="add"),
        helper.make_node("Relu", ["biased"], ["y"], name="relu"),
    ]
    inputs, inits, feeds = [vi("x", "float32", [p["m"], k])], [numpy_helper.from_array(b, "b")], {"x": x}
    for name in names:
        if p["as_inputs"] or name == "w":
            inputs.append(vi(name, arrays[name].dtype, list(arrays[name].shape)))
            feeds[name] = arrays[name]
        else:
            inits.append(numpy_helper.from_array(arrays[name], name))
    graph = helper.make_graph(nodes, "layer", inputs, [vi("y", "float32", [p["m"], n]), vi("w_f", "float32", [k, n])],
                              initializer=inits)
    return dyndq.make_model(graph, opset=p["opset"]), feeds


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layer_graphs())
def test_random_layers_run_bit_exactly_in_onnxruntime(p):
    model, feeds = build_layer(p)
    exported = dyndq.export(model)
    onnx.checker.check_model(exported, full_check=True)
    want = dyndq.reference_evaluator(model).run(None, feeds)
    got = run_ort(exported, feeds)
    assert all(same(g, w) for g, w in zip(got, want))
    ops = [n.op_type for n in exported.graph.node]
    assert ops[-3:] == ["MatMul", "Add", "Relu"]  # the other nodes, in their order


# -- opsets and IR versions ---------------------------------------------------------------------


def _per_channel_model(opset, extra_nodes=(), extra_outputs=(), **kwargs):
    nodes = [dyndq.make_node(["q", "s"], ["d"], qtype="per_channel", axis=1, name="weights")] + list(extra_nodes)
    graph = helper.make_graph(nodes, "g", [vi("q", "int8", [2, 3]), vi("s", "float32", [3])],
                              [vi("d", "float32", [2, 3])] + list(extra_outputs))
    return dyndq.make_model(graph, opset=opset, **kwargs)


def _feeds():
    return {"q": np.array([[-128, 0, 127], [1, 2, 3]], np.int8), "s": np.array([0.5, 0.25, 3.0], np.float32)}


def test_opset_11_with_per_channel_comes_out_at_13_with_other_nodes_converted():
    extra = [helper.make_node("Squeeze", ["d3"], ["sq"], axes=[0], name="squeeze"),
             helper.make_node("Unsqueeze", ["d"], ["d3"], axes=[0], name="unsqueeze"),
             helper.make_node("ReduceSum", ["d"], ["total"], axes=[1], keepdims=0, name="sum")]
    extra = [extra[1], extra[0], extra[2]]
    model = _per_channel_model(11, extra, [vi("sq", "float32", [2, 3]), vi("total", "float32", [2])])
    exported, report = dyndq.export_with_report(model)
    assert (report.opset_before, report.opset, report.converted) == (11, 13, True)
    assert ai_onnx(exported) == 13 and exported.ir_version == 7
    onnx.checker.check_model(exported, full_check=True)
    by_name = {n.name: n for n in exported.graph.node}
    assert len(by_name["squeeze"].input) == 2 and len(by_name["unsqueeze"].input) == 2  # axes became inputs
    assert len(by_name["sum"].input) == 2
    assert [a.i for a in by_name["weights"].attribute if a.name == "axis"] == [1]
    got = run_ort(exported, _feeds())
    want = dyndq.reference_evaluator(model).run(None, _feeds())
    assert all(same(g, w) for g, w in zip(got, want))


def test_a_high_enough_opset_is_kept():
    for opset in (13, 21, ORT_MAX_OPSET):
        exported, report = dyndq.export_with_report(_per_channel_model(opset))
        assert ai_onnx(exported) == opset and not report.converted


def test_per_tensor_only_models_need_opset_10():
    graph = helper.make_graph([dyndq.make_node(["q", "s"], ["d"], name="dq")], "g",
                              [vi("q", "uint8", [4]), vi("s", "float32", [1])], [vi("d", "float32", [4])])
    for opset, expected in ((9, 10), (10, 10), (11, 11)):
        exported = dyndq.export(dyndq.make_model(graph, opset=opset))
        assert ai_onnx(exported) == expected
        [got] = run_ort(exported, {"q": np.arange(4, dtype=np.uint8), "s": np.array([2.0], np.float32)})
        assert same(got, np.arange(4, dtype=np.float32) * 2)


def test_per_channel_with_zps_of_another_dtype_takes_the_integer_route_and_needs_only_opset_10():
    graph = helper.make_graph([dyndq.make_node(["q", "s", "z"], ["d"], qtype="per_channel", axis=0, name="dq")], "g",
                              [vi("q", "uint8", [3, 2]), vi("s", "float32", [3]), vi("z", "int32", [3])],
                              [vi("d", "float32", [3, 2])])
    feeds = {"q": np.array([[0, 255], [7, 9], [128, 1]], np.uint8), "s": np.array([0.5, 3.0, -1.0], np.float32),
             "z": np.array([-2**31, 2**31 - 1, 5], np.int32)}
    for opset, expected in ((10, 10), (11, 11), (13, 13)):
        exported, report = dyndq.export_with_report(dyndq.make_model(graph, opset=opset))
        assert (ai_onnx(exported), report.converted) == (expected, False)
        assert report.lowered[0].form == "integer arithmetic"
        [got] = run_ort(exported, feeds)
        assert same(got, oracle(feeds["q"], feeds["s"], feeds["z"], "per_channel", 0))


def test_opset_argument_asks_for_a_target_and_fails_clearly_when_too_low():
    model = _per_channel_model(13)
    assert ai_onnx(dyndq.export(model, opset=17)) == 17
    with pytest.raises(dyndq.ExportError, match=r"opset 11 is too low.*>= 13.*'weights'"):
        dyndq.export(model, opset=11)
    with pytest.raises(dyndq.ExportError, match="newer"):
        dyndq.export(model, opset=onnx.defs.onnx_opset_version() + 1)


def test_a_model_newer_than_onnxruntime_comes_down_to_its_opset_by_default():
    exported = dyndq.export(_per_channel_model(onnx.defs.onnx_opset_version()))
    assert ai_onnx(exported) == ORT_MAX_OPSET
    run_ort(exported, _feeds())


def test_ir_version_is_the_lowest_the_opsets_need_not_the_newest_make_model_stamps():
    graph = helper.make_graph([dyndq.make_node(["q", "s"], ["d"], qtype="per_channel", axis=0, name="dq")], "g",
                              [vi("q", "int8", [3]), vi("s", "float32", [3])], [vi("d", "float32", [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), dyndq.opset_import()])
    assert model.ir_version == onnx.IR_VERSION
    exported = dyndq.export(model)
    assert exported.ir_version == 10  # opset 21 needs IR 10
    run_ort(exported, {"q": np.zeros(3, np.int8), "s": np.ones(3, np.float32)})


def test_a_model_importing_only_our_domain_gets_the_lowest_ai_onnx_that_works():
    graph = helper.make_graph([dyndq.make_node(["q", "s"], ["d"], qtype="per_channel", axis=0, name="dq")], "g",
                              [vi("q", "int8", [3]), vi("s", "float32", [3])], [vi("d", "float32", [3])])
    model = helper.make_model(graph, opset_imports=[dyndq.opset_import()], ir_version=8)
    exported = dyndq.export(model)
    assert [(o.domain, o.version) for o in exported.opset_import] == [("", 13)]


def test_our_domain_stays_when_something_still_uses_it_and_a_graph_without_our_op_is_untouched():
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [vi("x", "float32", [2])],
                              [vi("y", "float32", [2])])
    model = dyndq.make_model(graph, opset=17)
    exported, report = dyndq.export_with_report(model)
    assert report.count == 0 and report.domain_removed
    assert [n.op_type for n in exported.graph.node] == ["Relu"] and ai_onnx(exported) == 17


# -- the whole model: subgraphs, functions, and everything else kept -----------------------------


def _branch(name, node_name, inputs, **attrs):
    return helper.make_graph([dyndq.make_node(inputs, [f"{name}_out"], name=node_name, **attrs)], name, [],
                             [vi(f"{name}_out", "float32", [2, 3])])


def test_nodes_inside_if_branches_and_loop_bodies_are_lowered():
    then = _branch("then", "then_dq", ["q", "s"], qtype="per_channel", axis=1)
    els = _branch("else", "else_dq", ["q", "s1"])
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         dyndq.make_node(["q", "s1", "z"], ["scan_y"], name="loop_dq")],
        "body", [vi("i", "int64", []), vi("cond_in", "bool", [])],
        [vi("cond_out", "bool", []), vi("scan_y", "float32", [2, 3])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els, name="choose"),
             helper.make_node("Loop", ["n", ""], ["ys"], body=body, name="repeat")]
    graph = helper.make_graph(
        nodes, "g",
        [vi("c", "bool", []), vi("n", "int64", []), vi("q", "int8", [2, 3]), vi("s", "float32", [3]),
         vi("s1", "float32", [1]), vi("z", "int32", [1])],
        [vi("y", "float32", [2, 3]), vi("ys", "float32", [None, 2, 3])])
    model = dyndq.make_model(graph, opset=13)
    exported, report = dyndq.export_with_report(model)
    onnx.checker.check_model(exported, full_check=True)
    assert sorted((r.graph, r.node, r.form) for r in report.lowered) == [
        ("main/choose.else_branch", "else_dq", "DequantizeLinear"),
        ("main/choose.then_branch", "then_dq", "DequantizeLinear"),
        ("main/repeat.body", "loop_dq", "integer arithmetic"),
    ]
    assert dyndq.DOMAIN not in domains(exported)
    feeds = {**_feeds(), "n": np.array(2, np.int64), "s1": np.array([0.5], np.float32),
             "z": np.array([-(2**31)], np.int32)}
    q = feeds["q"]
    per_channel = dyndq.dynamic_dequantize(q, feeds["s"], qtype="per_channel", axis=1)
    per_tensor = dyndq.dynamic_dequantize(q, feeds["s1"])
    looped = dyndq.dynamic_dequantize(q, feeds["s1"], feeds["z"])
    for c, want in ((True, per_channel), (False, per_tensor)):
        feeds["c"] = np.array(c)
        y, ys = run_ort(exported, feeds)
        assert same(y, want) and same(ys, np.stack([looped, looped]))


def test_nodes_inside_model_local_functions_are_lowered_and_onnxruntime_runs_them():
    fn = helper.make_function(
        "my.fns", "Dequant", ["q", "s", "z"], ["y"],
        [dyndq.make_node(["q", "s", "z"], ["y"], qtype="per_channel", axis=-1, name="fn_dq")],
        [helper.make_opsetid("", 13), dyndq.opset_import()])
    graph = helper.make_graph(
        [helper.make_node("Dequant", ["q", "s", "z"], ["y"], domain="my.fns", name="call")], "g",
        [vi("q", "int8", [2, 3]), vi("s", "float32", [3]), vi("z", "int32", [3])], [vi("y", "float32", [2, 3])])
    model = dyndq.make_model(graph, opset=13, functions=[fn])
    model.opset_import.append(helper.make_opsetid("my.fns", 1))
    exported, report = dyndq.export_with_report(model)
    onnx.checker.check_model(exported, full_check=True)
    assert report.lowered[0].graph == "function my.fns::Dequant"
    assert dyndq.DOMAIN not in domains(exported) and dyndq.DOMAIN not in domains(exported.functions[0])
    feeds = {**_feeds(), "z": np.array([2**31 - 1, -(2**31), 5], np.int32)}
    [got] = run_ort(exported, feeds)
    assert same(got, dyndq.dynamic_dequantize(feeds["q"], feeds["s"], feeds["z"], qtype="per_channel", axis=-1))


def test_functions_at_an_old_opset_are_converted_with_the_model():
    fn = helper.make_function("my.fns", "SqueezeIt", ["x"], ["y"],
                              [helper.make_node("Squeeze", ["x"], ["y"], axes=[0])], [helper.make_opsetid("", 11)])
    nodes = [dyndq.make_node(["q", "s"], ["d"], qtype="per_channel", axis=1, name="dq"),
             helper.make_node("Unsqueeze", ["d"], ["d3"], axes=[0]),
             helper.make_node("SqueezeIt", ["d3"], ["y"], domain="my.fns")]
    graph = helper.make_graph(nodes, "g", [vi("q", "int8", [2, 3]), vi("s", "float32", [3])],
                              [vi("y", "float32", [2, 3])])
    model = dyndq.make_model(graph, opset=11, functions=[fn])
    model.opset_import.append(helper.make_opsetid("my.fns", 1))
    exported = dyndq.export(model)
    assert [(o.domain, o.version) for o in exported.functions[0].opset_import] == [("", 13)]
    assert len(exported.functions[0].node[-1].input) == 2
    onnx.checker.check_model(exported, full_check=True)
    [got] = run_ort(exported, _feeds())
    assert same(got, dyndq.dynamic_dequantize(*_feeds().values(), qtype="per_channel", axis=1))


def test_everything_else_is_kept(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    nodes = [dyndq.make_node(["q", "s", "z"], ["d"], qtype="per_channel", axis=1, name="weights"),
             helper.make_node("MatMul", ["d", "w"], ["y"], name="mm", doc_string="the layer")]
    nodes[0].doc_string = "dequantize the weights"
    graph = helper.make_graph(
        nodes, "net", [vi("q", "int8", [2, 3]), vi("s", "float32", [3])], [vi("y", "float32", [2, 4])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array([1, 2, 3], np.int8), "z")],
        value_info=[vi("d", "float32", [2, 3])], doc_string="graph doc")
    model = dyndq.make_model(graph, opset=11, producer_name="maker", producer_version="9.9",
                             doc_string="model doc", model_version=7, domain="com.example")
    helper.set_model_props(model, {"author": "me", "license": "MIT"})
    onnx.save(model, tmp_path / "in.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="weights.bin", size_threshold=0)
    loaded = onnx.load(tmp_path / "in.onnx", load_external_data=False)
    before = loaded.SerializeToString()
    exported = dyndq.export(loaded)
    assert loaded.SerializeToString() == before  # the input is never mutated
    for field in ("producer_name", "producer_version", "doc_string", "model_version", "domain"):
        assert getattr(exported, field) == getattr(model, field)
    assert [(p.key, p.value) for p in exported.metadata_props] == [("author", "me"), ("license", "MIT")]
    assert exported.graph.name == "net" and exported.graph.doc_string == "graph doc"
    assert [i.name for i in exported.graph.input] == ["q", "s"] and [o.name for o in exported.graph.output] == ["y"]
    assert [v.name for v in exported.graph.value_info] == ["d"]
    for a, b in zip(exported.graph.initializer, loaded.graph.initializer):
        assert a == b and a.data_location == TensorProto.EXTERNAL
    by_name = {n.name: n for n in exported.graph.node}
    assert by_name["mm"].doc_string == "the layer" and by_name["weights"].doc_string == "dequantize the weights"
    assert by_name["weights"].op_type == "DequantizeLinear"  # the original name stays on the last node
    onnx.save(exported, tmp_path / "out.onnx")
    [got] = run_ort(tmp_path / "out.onnx", _feeds())
    d = dyndq.dynamic_dequantize(*_feeds().values(), np.array([1, 2, 3], np.int8), qtype="per_channel", axis=1)
    assert same(got, d @ w)


def test_new_names_never_collide_with_existing_ones():
    nodes = [helper.make_node("Identity", ["q"], ["dq/src_int64"], name="dq/Cast"),
             dyndq.make_node(["dq/src_int64", "s", "z"], ["d"], name="dq")]
    graph = helper.make_graph(nodes, "g", [vi("q", "int8", [4]), vi("s", "float32", []), vi("z", "int32", [])],
                              [vi("d", "float32", [4])])
    exported = dyndq.export(dyndq.make_model(graph))
    onnx.checker.check_model(exported, full_check=True)
    outs = [o for n in exported.graph.node for o in n.output]
    names = [n.name for n in exported.graph.node]
    assert len(outs) == len(set(outs)) and len(names) == len(set(names))
    q = np.array([-128, 0, 5, 127], np.int8)
    [got] = run_ort(exported, {"q": q, "s": np.array(0.5, np.float32), "z": np.array(2**31 - 1, np.int32)})
    assert same(got, oracle(q, np.array(0.5, np.float32), np.array(2**31 - 1, np.int32)))


def test_an_invalid_model_raises_validation_error_with_every_problem():
    nodes = [dyndq.make_node(["q", "s3"], ["a"], name="bad_len"),
             dyndq.make_node(["q", "s3"], ["b"], qtype="per_channel", axis=5, name="bad_axis")]
    graph = helper.make_graph(nodes, "g", [vi("q", "int8", [2, 3]), vi("s3", "float32", [3])],
                              [vi("a", "float32", [2, 3]), vi("b", "float32", [2, 3])])
    model = dyndq.make_model(graph)
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.export(model)
    assert e.value.problems == dyndq.check(model)
    assert {p.node for p in e.value.problems} == {"bad_len", "bad_axis"}


def test_export_refuses_what_is_not_a_model():
    with pytest.raises(TypeError):
        dyndq.export(onnx.GraphProto())


def test_report_counts_and_summary():
    exported, report = dyndq.export_with_report(_per_channel_model(11))
    assert report.count == 1 and report.lowered[0].node == "weights" and report.lowered[0].qtype == "per_channel"
    assert (report.opset, report.ir_version) == (13, 7)
    assert report.summary() == "lowered 1 DynamicDequantize node(s); ai.onnx opset 13 (converted from 11), IR version 7"


def test_a_function_at_an_older_opset_than_the_model_is_converted_when_lowered_into():
    fn = helper.make_function(
        "my.fns", "DqSqueeze", ["q", "s"], ["y"],
        [dyndq.make_node(["q", "s"], ["d"], qtype="per_channel", axis=1, name="fn_dq", version=1),
         helper.make_node("Unsqueeze", ["d"], ["d3"], axes=[0]),
         helper.make_node("Squeeze", ["d3"], ["y"], axes=[0])],
        [helper.make_opsetid("", 11), dyndq.opset_import(1)])  # version 1: its integer route needs opset 10
    graph = helper.make_graph(
        [helper.make_node("DqSqueeze", ["q", "s"], ["y"], domain="my.fns")], "g",
        [vi("q", "int8", [2, 3]), vi("s", "float32", [3])], [vi("y", "float32", [2, 3])])
    model = dyndq.make_model(graph, opset=13, functions=[fn])
    model.opset_import.append(helper.make_opsetid("my.fns", 1))
    exported = dyndq.export(model)
    [f] = exported.functions
    assert [(o.domain, o.version) for o in f.opset_import] == [("", 13)]
    assert [len(n.input) for n in f.node if n.op_type in ("Squeeze", "Unsqueeze")] == [2, 2]
    onnx.checker.check_model(exported, full_check=True)
    [got] = run_ort(exported, _feeds())
    assert same(got, dyndq.dynamic_dequantize(*_feeds().values(), qtype="per_channel", axis=1))
