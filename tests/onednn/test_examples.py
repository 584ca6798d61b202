"""dyndq.onednn's example inputs (dyndq/onednn/examples.py): values a real run could see, the same
for a seed, and outputs that stay finite on every anchor, kind file and the gated MLP."""
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import dyndq
from dyndq import onednn

DATA = Path(__file__).resolve().parents[1] / "data" / "onednn"

MHA = DATA / "complex_fusion/mha/sdpa-compressed-kv-implicit-causal-mask-int8-gs128.json"

ANCHORS = sorted(p for p in DATA.rglob("*.json") if not {"kinds", "bad", "upstream"} & set(p.parts)
                 and "gated-mlp" not in p.name)


@pytest.mark.parametrize("path", ANCHORS + sorted((DATA / "kinds").glob("*.json")), ids=lambda p: p.stem)
def test_example_inputs_give_finite_outputs(path):
    """The anchors (the gated MLP in the test below) and each kind, with their example inputs: no
    output holds an infinity or a NaN (SoftMax's kind file is checked without its -inf row)."""
    model, _ = onednn.load(path)
    for name, value in dyndq.run(model, onednn.example_inputs(model, 0)).items():
        if value.dtype.kind == "f" or value.dtype.name == "bfloat16":
            assert np.isfinite(value.astype(np.float64)).all(), name


@pytest.mark.big  # about 1.3 GB on the reference engine
def test_the_gated_mlp_gives_finite_outputs():
    model, _ = onednn.load(DATA / "complex_fusion/mlp/gated-mlp-int4.json")
    [y] = dyndq.run(model, onednn.example_inputs(model, 0)).values()
    assert np.isfinite(y.astype(np.float32)).all() and 0.05 < np.abs(y.astype(np.float32)).mean() < 20


def test_example_inputs_are_values_a_real_run_could_see_and_deterministic():
    model, _ = onednn.load(DATA / "complex_fusion/mlp/gated-mlp-int4.json")
    a, b = onednn.example_inputs(model, 7), onednn.example_inputs(model, 7)
    assert all(np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a)
    src, zps, scales = a["deq_down_src_23"], a["deq_down_zps_25"], a["deq_down_scales_24"]
    assert src.dtype == ml_dtypes.uint4 and src.astype(np.int64).min() == 0 and src.astype(np.int64).max() == 15
    assert zps.dtype == np.uint8 and zps.max() <= 15  # u8 zero points of u4 weights stay in 0..15
    assert scales.dtype == np.float16 and (scales > 0).all() and (scales < 0.1).all()
    masked, _ = onednn.load(MHA)
    feeds = onednn.example_inputs(masked, 0)
    assert np.isneginf(feeds["Select_else_5"].astype(np.float32)).all() and (feeds["div_src_1_4"] >= 1).all()
