"""dyndq.example_inputs: the inputs parity and quantize's evaluation make up for a model."""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from dyndq.example_inputs import OPEN_DIM, example_feeds, index_bounds
from dyndq.parity import example_feeds as parity_feeds
from dyndq.quantization.evaluate import seeded_samples


def _embedding_model():
    """ids (an exporter's -1 batch, then 5) -> Cast -> Gather on a table of 37 rows; x: float [-1, 3]."""
    table = numpy_helper.from_array(np.zeros((37, 2), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
         helper.make_node("Gather", ["table", "ids64"], ["e"]),
         helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [-1, 5]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, None), helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [table])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def test_ids_through_a_cast_span_the_table_and_open_dims_take_open_dim():
    model = _embedding_model()
    assert index_bounds(model) == {"ids": 37}
    feeds = example_feeds(model, np.random.default_rng(0), cover_ends=True)
    assert feeds["ids"].shape == (OPEN_DIM, 5) and feeds["ids"].dtype == np.int32
    assert feeds["ids"].min() == 0 and feeds["ids"].max() == 36
    assert feeds["x"].shape == (OPEN_DIM, 3) and feeds["x"].dtype == np.float32


def test_parity_and_the_evaluation_draw_alike():
    model = _embedding_model()
    ours = parity_feeds(model, seed=7)
    again = example_feeds(model, np.random.default_rng(7))
    assert all(np.array_equal(ours[k], again[k]) for k in ours)
    first = seeded_samples(model, seed=7, samples=2)[0]
    assert first["ids"].shape == ours["ids"].shape  # (the same shapes: an exporter's -1 open in both)


def test_a_zero_dim_is_a_fixed_empty_size_that_the_made_up_feeds_keep_and_onnx_runtime_runs():
    """(ONNX's IR gives a dim_value as the size: 0 is an empty dimension, not an open one; ONNX
    Runtime refuses a feed of another size there, and the feed check says so too)"""
    import pytest

    import dyndq
    from dyndq.runner import FeedError

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [0, -1, "n", None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = example_feeds(model, np.random.default_rng(0))
    assert feeds["x"].shape == (0, OPEN_DIM, OPEN_DIM, OPEN_DIM)
    for engine in ("reference", "onnxruntime"):
        assert dyndq.run(model, feeds, engine=engine)["y"].shape == (0, OPEN_DIM, OPEN_DIM, OPEN_DIM)
        with pytest.raises(FeedError, match="dimension 0 = 0"):
            dyndq.run(model, {"x": np.zeros((2, 1, 1, 1), np.float32)}, engine=engine)
