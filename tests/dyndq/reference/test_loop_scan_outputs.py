"""Loop on the reference engine, against ONNX Runtime: random Loop bodies, with and without
scan outputs (stacked along a new first axis, [trips, ...], as ONNX says), loop-carried values,
an omitted trip count or condition, zero trips, our op in the body, and the Loop standing in
the main graph, an If branch, a Scan body or another Loop's body.  Every value compared is
exact (integers, and our op on integers times integer-valued scales), so the engines must
agree bit for bit, and each output must have the shape the model declares for it."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from cases import same_values, vi

import dyndq

OPSETS = [helper.make_opsetid("", 21), dyndq.opset_import()]
I32 = TensorProto.INT32


@st.composite
def loops(draw):
    n_scans = draw(st.integers(0, 2))
    scans = [draw(st.sampled_from(["dequantized", "carried", "iteration"])) for _ in range(n_scans)]
    n_carried = max(draw(st.integers(0, 2)), int("carried" in scans))
    trips = draw(st.sampled_from([None, 0, 1, 2, 3]))  # M; None: omitted
    cond = draw(st.sampled_from([None, True, False]))  # the initial condition; None: omitted
    limit = draw(st.sampled_from([None, 0, 1, 2, 3]))  # the body goes on while i < limit; None: cond as it came
    if trips is None and limit is None:
        limit = draw(st.integers(0, 3))  # (a loop with neither would never end)
    dims = st.lists(st.integers(0, 3), min_size=0, max_size=2).map(tuple)
    return dict(scans=scans, carried=[draw(dims) for _ in range(n_carried)], trips=trips, cond=cond, limit=limit,
                w=draw(st.lists(st.integers(0, 3), min_size=1, max_size=2).map(tuple)),
                declared=draw(st.booleans()),  # whether the body declares its scan outputs' shapes
                place=draw(st.sampled_from(["main", "if", "scan", "loop"])),
                outer=draw(st.integers(1, 2)),  # trips of the enclosing Scan or Loop
                seed=draw(st.integers(0, 2**32 - 1)))


def trips_run(p) -> int:
    """How many times the body runs, as ONNX says."""
    go, it = p["cond"] is not False, 0
    while go and (p["trips"] is None or it < p["trips"]):
        go = it < p["limit"] if p["limit"] is not None else go
        it += 1
    return it


def scan_shape(p, kind, k):
    return {"dequantized": p["w"], "carried": p["carried"][0] if p["carried"] else (), "iteration": ()}[kind]


def loop_node(p, prefix: str) -> tuple[onnx.NodeProto, list[str]]:
    """One Loop: carried v_k += x_k; scan outputs as drawn; our op in the body."""
    c = lambda name: f"{prefix}{name}"  # noqa: E731 (every name unique in the model)
    nodes, outs = [], [c("cond_out")]
    if p["limit"] is None:
        nodes.append(helper.make_node("Identity", [c("cond_in")], [c("cond_out")]))
    else:
        nodes.append(helper.make_node("Less", [c("i"), "limit"], [c("cond_out")]))
    for k, shape in enumerate(p["carried"]):
        nodes.append(helper.make_node("Add", [c(f"v{k}_in"), f"x{k}"], [c(f"v{k}_out")]))
        outs.append(c(f"v{k}_out"))
    for k, kind in enumerate(p["scans"]):
        out = c(f"scan{k}_out")
        if kind == "dequantized":  # DynamicDequantize(w, [i + 1]): exact
            nodes += [helper.make_node("Add", [c("i"), "one"], [c(f"i1_{k}")]),
                      helper.make_node("Cast", [c(f"i1_{k}")], [c(f"f{k}")], to=TensorProto.FLOAT),
                      helper.make_node("Reshape", [c(f"f{k}"), "shape_1"], [c(f"s{k}")]),
                      dyndq.make_node(["w", c(f"s{k}")], [out], name=c(f"dq{k}"))]
        else:
            nodes.append(helper.make_node("Identity", [c("i") if kind == "iteration" else c("v0_out")], [out]))
        outs.append(out)
    elem = {"dequantized": TensorProto.FLOAT, "carried": I32, "iteration": TensorProto.INT64}
    body = helper.make_graph(
        nodes, c("body"),
        [vi(c("i"), TensorProto.INT64, []), vi(c("cond_in"), TensorProto.BOOL, [])]
        + [vi(c(f"v{k}_in"), I32, list(s)) for k, s in enumerate(p["carried"])],
        [vi(c("cond_out"), TensorProto.BOOL, [])] + [vi(c(f"v{k}_out"), I32, list(s)) for k, s in enumerate(p["carried"])]
        + [helper.make_tensor_value_info(c(f"scan{k}_out"), elem[kind], list(scan_shape(p, kind, k)) if p["declared"] else None)
           for k, kind in enumerate(p["scans"])])
    inputs = ["M" if p["trips"] is not None else "", "c" if p["cond"] is not None else ""]
    inputs += [f"v{k}_init" for k in range(len(p["carried"]))]
    outputs = [c(f"v{k}_final") for k in range(len(p["carried"]))] + [c(f"scan{k}") for k in range(len(p["scans"]))]
    return helper.make_node("Loop", inputs, outputs, body=body, name=c("loop")), outputs


def loop_outputs(p, trips):
    """(element type, shape) of each output of the Loop."""
    elem = {"dequantized": TensorProto.FLOAT, "carried": I32, "iteration": TensorProto.INT64}
    return ([(I32, list(s)) for s in p["carried"]]
            + [(elem[kind], [trips] + list(scan_shape(p, kind, k))) for k, kind in enumerate(p["scans"])])


def model_of(p):
    """The model (the Loop where p["place"] says) and the shape each graph output must have."""
    rng = np.random.default_rng(p["seed"])
    feeds = {"w": rng.integers(-128, 128, p["w"], dtype=np.int64).astype(np.int8)}
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array([1], np.int64), "shape_1")]
    inputs = [vi("w", "int8", list(p["w"]))]
    for name, value, dtype in (("M", p["trips"], np.int64), ("c", p["cond"], np.bool_), ("limit", p["limit"], np.int64)):
        if value is not None:
            feeds[name] = np.array(value, dtype)
            inputs.append(vi(name, feeds[name].dtype, []))
    for k, shape in enumerate(p["carried"]):
        for name in (f"v{k}_init", f"x{k}"):
            feeds[name] = rng.integers(-100, 100, shape, dtype=np.int64).astype(np.int32)
            inputs.append(vi(name, "int32", list(shape)))
    trips = trips_run(p)
    loop, names = loop_node(p, "")
    types = loop_outputs(p, trips)
    if p["place"] == "main":
        nodes, outputs = [loop], names
    elif p["place"] == "if":  # the Loop in both branches (each its own names)
        branches = {}
        for tag in ("then", "else"):
            node, branch_out = loop_node(p, f"{tag}_")
            branches[tag] = helper.make_graph([node], tag, [], [vi(n, t, s) for n, (t, s) in zip(branch_out, types)])
        feeds["pick"] = np.array(bool(p["seed"] % 2))
        inputs.append(vi("pick", "bool", []))
        outputs = [f"y{j}" for j in range(len(names))]
        nodes = [helper.make_node("If", ["pick"], outputs, then_branch=branches["then"], else_branch=branches["else"])]
    else:  # in a Scan body (one trip per row of `rows`) or in an outer Loop's body: each output stacked again
        outer = p["outer"]
        outputs = [f"y{j}" for j in range(len(names))]
        body_out = [vi(n, t, s) for n, (t, s) in zip(names, types)]
        if p["place"] == "scan":
            feeds["rows"] = np.zeros((outer, 1), np.float32)
            inputs.append(vi("rows", "float32", [outer, 1]))
            body = helper.make_graph([loop], "scan_body", [vi("row", "float32", [1])], body_out)
            nodes = [helper.make_node("Scan", ["rows"], outputs, body=body, num_scan_inputs=1)]
        else:
            inits.append(numpy_helper.from_array(np.array(outer, np.int64), "outer_trips"))
            body = helper.make_graph([loop, helper.make_node("Identity", ["outer_cond_in"], ["outer_cond_out"])], "outer_body",
                                     [vi("outer_i", "int64", []), vi("outer_cond_in", "bool", [])],
                                     [vi("outer_cond_out", "bool", [])] + body_out)
            nodes = [helper.make_node("Loop", ["outer_trips", ""], outputs, body=body, name="outer_loop")]
        types = [(t, [outer] + s) for t, s in types]
    if not outputs:  # a Loop with no output at all: nothing to compare
        return None, feeds, []
    graph = helper.make_graph(nodes, "g", inputs, [vi(n, t, s) for n, (t, s) in zip(outputs, types)], inits)
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=10), feeds, [s for _, s in types]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loops())
def test_random_loops_agree_with_onnxruntime(p):
    model, feeds, shapes = model_of(p)
    if model is None:
        return
    onnx.checker.check_model(model, full_check=True)
    event(f"{p['place']}: {len(p['scans'])} scan output(s), {'zero trips' if trips_run(p) == 0 else 'trips'}")
    ref = dyndq.run(model, feeds)
    ort = dyndq.run(model, feeds, engine="onnxruntime")
    for (name, a), shape in zip(ref.items(), shapes):
        assert list(a.shape) == shape, (name, a.shape, shape)
        assert same_values(a, ort[name]), name


# -- fixed cases: a Loop stacking its scan output, zero trips, and a scan output that changes shape ------------------

def two_trip_loop(scan_shape=(3, 2), body_shape=(3, 2), declared=(2, 3, 2)):
    """A Loop with M = 2 trips whose body emits x (of `body_shape`) as a scan output."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["x"], ["scan"])], "body",
        [vi("i", "int64", []), vi("cond_in", "bool", [])],
        [vi("cond_out", "bool", []), helper.make_tensor_value_info("scan", TensorProto.FLOAT, scan_shape)])
    graph = helper.make_graph([helper.make_node("Loop", ["M", ""], ["out"], body=body, name="loop")], "g",
                              [vi("M", "int64", []), vi("x", "float32", list(body_shape))],
                              [vi("out", "float32", list(declared))])
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=10)


def test_a_loop_stacks_its_scan_output_on_both_engines():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    for engine in ("reference", "onnxruntime"):
        out = dyndq.run(two_trip_loop(), {"M": np.array(2, np.int64), "x": x}, engine=engine)["out"]
        assert out.shape == (2, 3, 2) and same_values(out, np.stack([x, x])), engine


@pytest.mark.parametrize("scan_shape, want", [((3, 2), (0, 3, 2)), (None, (0, 3, 2)), ((None, 2), (0, 3, 2))])
def test_zero_trips_give_an_empty_scan_output_of_the_body_type(scan_shape, want):
    """The body's own declared shape, or the one ONNX infers for it when it declares less."""
    model = two_trip_loop(scan_shape, declared=["trips", 3, 2])
    feeds = {"M": np.array(0, np.int64), "x": np.ones((3, 2), np.float32)}
    for engine in ("reference", "onnxruntime"):
        out = dyndq.run(model, feeds, engine=engine)["out"]
        assert out.shape == want and out.dtype == np.float32, engine


def test_a_scan_output_that_changes_shape_is_named():
    """Each trip emits Range(0, i): [0], then [1] elements. ONNX Runtime refuses it as well."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Range", ["zero", "i", "step"], ["r"])],
        "body", [vi("i", "int64", []), vi("cond_in", "bool", [])], [vi("cond_out", "bool", []), vi("r", "int64", ["n"])])
    graph = helper.make_graph(
        [helper.make_node("Loop", ["M", ""], ["out"], body=body, name="growing")], "g", [vi("M", "int64", [])],
        [vi("out", "int64", ["trips", "n"])],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"), numpy_helper.from_array(np.array(1, np.int64), "step")])
    model = helper.make_model(graph, opset_imports=OPSETS, ir_version=10)
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.run(model, {"M": np.array(2, np.int64)})
    [problem] = e.value.problems
    assert problem.argument == "scan output 'r'" and problem.node == "growing" and problem.op == "ai.onnx::Loop"
    assert problem.found == "shape [1] in iteration 1" and "shape [0], as in iteration 0" in problem.allowed
    with pytest.raises(Exception):
        dyndq.run(model, {"M": np.array(2, np.int64)}, engine="onnxruntime")
