"""dyndq.run: both engines, bit for bit; feed checking; the per-model cache."""
from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
from cases import close_after_matmul, same_values


from dyndq import runner as run_module


# (every valid row run on both engines, bit for bit with the kernel and the oracle: tests/test_opcheck.py)


def _mlp():
    from dyndq.demo import build_model, demo_input

    return build_model(), {"x": demo_input()}


def test_mlp_engines_agree_and_inputs_untouched():
    model, feeds = _mlp()
    before_model = model.SerializeToString()
    x0 = feeds["x"].copy()
    ref = dyndq.run(model, feeds)
    ort = dyndq.run(model, feeds, engine="onnxruntime")
    assert close_after_matmul(ref["y"], ort["y"])  # (the MatMuls' sums; our op's outputs: test_run_version_2_on_onnxruntime.py)
    assert model.SerializeToString() == before_model
    assert np.array_equal(feeds["x"], x0)


def test_run_takes_a_path(tmp_path):
    model, feeds = _mlp()
    onnx.save(model, tmp_path / "m.onnx")
    assert same_values(dyndq.run(str(tmp_path / "m.onnx"), feeds)["y"], dyndq.run(model, feeds)["y"])
    assert close_after_matmul(dyndq.run(tmp_path / "m.onnx", feeds, engine="onnxruntime")["y"], dyndq.run(model, feeds)["y"])


# -- the cache ----------------------------------------------------------------------------


@pytest.fixture
def builds(monkeypatch):
    """Count the Runners built."""
    run_module.clear_cache()
    count = {"n": 0}
    real = run_module.Runner.__init__

    def counting(self, *a, **kw):
        count["n"] += 1
        real(self, *a, **kw)

    monkeypatch.setattr(run_module.Runner, "__init__", counting)
    yield count
    run_module.clear_cache()


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_cache_builds_once_per_model(builds, engine):
    model, feeds = _mlp()
    first = dyndq.run(model, feeds, engine=engine)
    for _ in range(3):
        again = dyndq.run(model, feeds, engine=engine)
    assert builds["n"] == 1
    assert np.array_equal(first["y"], again["y"])
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    dyndq.run(copy, feeds, engine=engine)  # an identical model shares the entry
    assert builds["n"] == 1


def test_cache_sees_a_model_changed_in_place(builds):
    model, feeds = _mlp()
    before = dyndq.run(model, feeds, engine="onnxruntime")["y"]
    b2 = next(t for t in model.graph.initializer if t.name == "b2")
    b2.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(b2) + np.float32(1), "b2"))
    after = dyndq.run(model, feeds, engine="onnxruntime")["y"]
    assert builds["n"] == 2
    assert np.array_equal(after, before + np.float32(1)) or not np.array_equal(after, before)
    assert not np.array_equal(after, before)


def test_cache_is_bounded(builds, monkeypatch):
    monkeypatch.setattr(run_module, "CACHE_SIZE", 2)
    model, feeds = _mlp()
    variants = []
    for i in range(4):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        m.doc_string = f"variant {i}"
        variants.append(m)
        dyndq.run(m, feeds)
    assert len(run_module._cache) == 2
    dyndq.run(variants[0], feeds)  # evicted: built again
    assert builds["n"] == 5


def test_runner_is_separate_per_engine(builds):
    model, feeds = _mlp()
    assert run_module.runner(model, "reference") is run_module.runner(model, "reference")
    assert run_module.runner(model, "reference") is not run_module.runner(model, "onnxruntime")


# -- feeds ----------------------------------------------------------------------------------


def _problems(excinfo):
    return {p.argument: p for p in excinfo.value.problems}


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_missing_input(engine):
    model, _ = _mlp()
    with pytest.raises(dyndq.ValidationError, match="x: found no feed") as e:
        dyndq.run(model, {}, engine=engine)
    assert set(_problems(e)) == {"x"}


def test_unknown_input():
    model, feeds = _mlp()
    with pytest.raises(dyndq.ValidationError, match="'xx'|xx: found a feed") as e:
        dyndq.run(model, feeds | {"xx": feeds["x"]})
    assert set(_problems(e)) == {"xx"}
    assert "the graph's inputs: 'x'" in str(e.value)


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
@pytest.mark.parametrize(
    "value, words",
    [
        (np.zeros((4, 64), np.float64), "float64"),
        (np.zeros((4, 64), np.int8), "int8"),
        (np.zeros((4, 64, 1), np.float32), "rank 3"),
        (np.zeros(64, np.float32), "rank 1"),
        (np.zeros((4, 63), np.float32), "dimension 1 is 63"),
        ([[0.5] * 64], "float64"),  # a Python list is converted by NumPy's rules, then judged
    ],
)
def test_wrong_feed(engine, value, words):
    model, _ = _mlp()
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.run(model, {"x": value}, engine=engine)
    assert set(_problems(e)) == {"x"}
    assert words in str(e.value) and "float32[batch,64]" in str(e.value)


def test_every_feed_problem_at_once():
    model, feeds = _mlp()
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.run(model, {"nope": feeds["x"]})
    assert set(_problems(e)) == {"nope", "x"}


def test_symbolic_dims_take_any_size():
    """Only the shapes are compared: NumPy's and ONNX Runtime's float32 MatMul may
    sum in different orders for some shapes (e.g. one row), which no choice of ours
    about DynamicDequantize can change."""
    model, _ = _mlp()
    for batch in (1, 7, 0):
        x = np.ones((batch, 64), np.float32)
        ref = dyndq.run(model, {"x": x})["y"]
        ort = dyndq.run(model, {"x": x}, engine="onnxruntime")["y"]
        assert ref.shape == ort.shape == (batch, 16)
        np.testing.assert_allclose(ref, ort, rtol=1e-5, atol=1e-6)


def test_initializer_inputs_are_optional_and_overridable():
    """A graph input with an initializer is a default: it may be fed, or not."""
    node = dyndq.make_node(["src", "scales"], ["dst"], name="dq")
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("src", TensorProto.INT8, [3]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("dst", TensorProto.FLOAT, [3])],
        [numpy_helper.from_array(np.array([0.5], np.float32), "scales")],
    )
    model = dyndq.make_model(graph)
    src = np.array([-2, 0, 4], np.int8)
    for engine in ("reference", "onnxruntime"):
        assert dyndq.run(model, {"src": src}, engine=engine)["dst"].tolist() == [-1.0, 0.0, 2.0]
        got = dyndq.run(model, {"src": src, "scales": np.array([2.0], np.float32)}, engine=engine)["dst"]
        assert got.tolist() == [-4.0, 0.0, 8.0]


# -- the model and the call ------------------------------------------------------------------


def test_unknown_engine():
    model, feeds = _mlp()
    with pytest.raises(ValueError, match="unknown engine 'tvm'.*reference, onnxruntime"):
        dyndq.run(model, feeds, engine="tvm")


def test_not_a_model():
    with pytest.raises(TypeError, match="ModelProto"):
        dyndq.run(b"bytes", {})
    with pytest.raises(TypeError, match="mapping"):
        dyndq.run(_mlp()[0], [np.zeros((1, 64), np.float32)])


@pytest.mark.parametrize("engine", ["reference", "onnxruntime"])
def test_invalid_model_names_every_problem(engine):
    node = helper.make_node("DynamicDequantize", ["src", "scales", "zps"], ["dst"], name="dq",
                            domain=dyndq.DOMAIN, qtype="per_channel", axis=3)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("src", TensorProto.INT64, [2, 3]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("zps", TensorProto.INT64, [3]),
        ],
        [helper.make_tensor_value_info("dst", TensorProto.FLOAT, [2, 3])],
    )
    with pytest.raises(dyndq.ValidationError) as e:
        dyndq.run(dyndq.make_model(graph), {}, engine=engine)
    assert {"src", "zps"} <= {p.argument for p in e.value.problems}
    assert all(p.node == "dq" for p in e.value.problems)


def test_both_engines_run_a_model_whose_outputs_have_no_shape():
    """onnx.checker's full check wants graph outputs with shapes; the reference engine runs
    without them, and so does ONNX Runtime's path (ONNX's inference fills them in)."""
    graph = helper.make_graph(
        [dyndq.make_node(["x", "s"], ["y"], name="dq"), helper.make_node("Relu", ["y"], ["r"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [2, 3]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)])
    model = dyndq.make_model(graph)
    before = model.SerializeToString()
    feeds = {"x": np.array([[-2, 0, 3], [127, -128, 1]], np.int8), "s": np.array([0.5], np.float32)}
    ref, ort = dyndq.run(model, feeds), dyndq.run(model, feeds, engine="onnxruntime")
    assert np.array_equal(ref["r"], ort["r"]) and ref["r"][1, 0] == 63.5
    assert model.SerializeToString() == before
