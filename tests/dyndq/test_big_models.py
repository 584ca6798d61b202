"""Models over 2 GiB: check, export, lift and run them, in memory and on disk.

One model of 2 GiB + 64 MiB of int8 weights is built once for the module (about 2.1 GiB of
memory, twice that while numpy's bytes are copied into the proto); the weights feed Gather ->
DynamicDequantize, so running it touches two rows only. Peak memory is measured by
benchmarks/bench_big_model.py, not here.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.plumbing.light import nbytes

# Over 2 GiB of memory (about 15 GiB at peak while protobuf copies): not in the default `make
# test`, which fits a laptop; `make test-big` runs these, and .ci/run runs both.
pytestmark = pytest.mark.big

COLS = 64
ROWS = (2**31 + 2**26) // COLS


@pytest.fixture(scope="module")
def big_model() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Gather", ["w", "idx"], ["rows"], name="pick"),
         dyndq.make_node(["rows", "scales", "zps"], ["y"], name="dq", qtype="per_channel", axis=1)], "big",
        [helper.make_tensor_value_info("idx", T.INT64, [None])], [helper.make_tensor_value_info("y", T.FLOAT, [None, COLS])],
        [nh.from_array(np.full(COLS, 0.5, np.float32), "scales"), nh.from_array(np.ones(COLS, np.int8), "zps")])
    model = dyndq.make_model(g)
    # (filled in place: protobuf copies a message into a repeated field by serializing it, which
    # a tensor over 2 GiB cannot be)
    w = np.zeros((ROWS, COLS), np.int8)
    w[-1] = np.arange(COLS, dtype=np.int8)
    tensor = model.graph.initializer.add(name="w", data_type=T.INT8, dims=[ROWS, COLS])
    tensor.raw_data = w.tobytes()
    del w
    return model


def expected_rows() -> np.ndarray:
    last = (np.arange(COLS, dtype=np.float32) - 1) * np.float32(0.5)
    return np.stack([np.full(COLS, -0.5, np.float32), last])


def test_check_export_lift_and_run_a_model_over_2_gib(big_model, tmp_path):
    assert nbytes(big_model.graph.initializer[-1]) > 2**31
    assert dyndq.check(big_model) == []
    exported = dyndq.export(big_model)
    assert dyndq.DOMAIN not in {n.domain for n in exported.graph.node}
    lifted = dyndq.lift(exported)
    assert dyndq.check(lifted) == []
    del lifted
    feeds = {"idx": np.array([0, ROWS - 1], np.int64)}
    assert np.array_equal(dyndq.run(big_model, feeds)["y"], expected_rows())
    assert np.array_equal(dyndq.run(exported, feeds, engine="onnxruntime")["y"], expected_rows())
