"""GPTQ and AWQ modules: their nodes give the formats' own float16 dequantization bit for bit
(oracles in tests/safetensors_checkpoints.py, from GPTQModel's and AutoAWQ's code), every code and
zero value and the float16 extremes reached; a v1 checkpoint read as v2, or AWQ's order ignored,
fails; the tensors written weigh at most 1.10x the module's checkpoint bytes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dyndq.checkpoints import safetensors as ours
from safetensors_checkpoints import awq_oracle, awq_tensors, check_exact, gptq_oracle, gptq_tensors, written_bytes


def gptq(tensors, bits, group_size=32, checkpoint_format="gptq"):
    config = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "checkpoint_format": checkpoint_format}
    return ours.Module("model.layers.0.mlp.down_proj", "gptq", tensors, config)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("v1", [True, False])
def test_gptq_modules_dequantize_exactly(bits, act_order, v1):
    t = gptq_tensors(128, 64, bits, 32, act_order=act_order, v1=v1, seed=bits)
    check_exact(gptq(t, bits, checkpoint_format="gptq" if v1 else "gptq_v2"), gptq_oracle(t, bits, v1))


def test_a_v1_checkpoint_read_as_v2_differs():
    t = gptq_tensors(64, 32, 4, 32, v1=True, seed=1)
    with pytest.raises(AssertionError, match="values differ"):
        check_exact(gptq(t, 4, checkpoint_format="gptq_v2"), gptq_oracle(t, 4, v1=True))


def test_awq_modules_dequantize_exactly():
    t = awq_tensors(128, 64, 32, seed=3)
    check_exact(ours.Module("m.q_proj", "awq", t, {"quant_method": "awq", "bits": 4, "version": "gemm"}), awq_oracle(t, 32))


def test_awqs_packing_order_matters():
    t = awq_tensors(64, 32, 32, seed=4)
    want = awq_oracle(t, 32)
    check_exact(ours.Module("m", "awq", t, {"quant_method": "awq", "bits": 4}), want)
    # the same nibbles packed in plain order (not [0, 2, 4, 6, 1, 3, 5, 7]) must give other values
    nibbles = (t["qweight"][..., None] >> np.arange(0, 32, 4, dtype=np.int32)) & 0xF
    reordered = dict(t)
    reordered["qweight"] = ((nibbles[..., [0, 2, 4, 6, 1, 3, 5, 7]] << np.arange(0, 32, 4)).sum(-1)).astype(np.int64).astype(np.uint32).view(np.int32)
    with pytest.raises(AssertionError, match="values differ"):
        check_exact(ours.Module("m", "awq", reordered, {"quant_method": "awq", "bits": 4}), want)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_tensors_written_weigh_at_most_1_10_of_the_checkpoints(bits, act_order):
    t = gptq_tensors(1024, 256, bits, 128, act_order=act_order, seed=5)
    placed = ours.nodes(gptq(t, bits, 128))
    ratio = written_bytes(placed) / sum(a.nbytes for a in t.values())
    assert ratio <= 1.10, f"{bits}-bit: {ratio:.3f}x"


def test_awq_tensors_written_weigh_at_most_1_10_of_the_checkpoints():
    t = awq_tensors(1024, 256, 128, seed=6)
    placed = ours.nodes(ours.Module("m", "awq", t, {"quant_method": "awq", "bits": 4}))
    assert written_bytes(placed) / sum(a.nbytes for a in t.values()) <= 1.10


def test_bad_tensors_are_refused_by_name():
    import dyndq
    t = gptq_tensors(64, 32, 4, 32, seed=7)
    t["qzeros"] = t["qzeros"][:, :2]
    with pytest.raises(dyndq.ValidationError, match=r"down_proj.qzeros.*int32 \[2, 4\]"):
        ours.nodes(gptq(t, 4))
    with pytest.raises(dyndq.ValidationError, match="bits 5"):
        ours.nodes(gptq(gptq_tensors(64, 32, 4, 32), 5))


@pytest.mark.parametrize("kind", ["gptq", "awq"])
def test_codes_packed_a_few_rows_at_a_time_are_the_same(kind, monkeypatch):
    """(the codes are unpacked and packed in chunks of output rows: here one chunk a row)"""
    from dyndq.checkpoints import writer

    monkeypatch.setattr(writer, "CHUNK_BYTES", 1)
    if kind == "gptq":
        t = gptq_tensors(64, 48, 4, 32, seed=8)
        check_exact(gptq(t, 4), gptq_oracle(t, 4))
    else:
        t = awq_tensors(64, 48, 32, seed=8)
        check_exact(ours.Module("m", "awq", t, {"quant_method": "awq", "bits": 4}), awq_oracle(t, 32))


@settings(max_examples=10, deadline=None)
@given(bits=st.sampled_from([2, 3, 4, 8]), n_in=st.sampled_from([32, 64, 96]), out=st.sampled_from([32, 64]),
       act_order=st.booleans(), v1=st.booleans(), one_group=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_any_drawn_gptq_module_dequantizes_exactly(bits, n_in, out, act_order, v1, one_group, seed):
    group = n_in if one_group else 32
    t = gptq_tensors(n_in, out, bits, group, act_order=act_order, v1=v1, seed=seed)
    check_exact(gptq(t, bits, group, "gptq" if v1 else "gptq_v2"), gptq_oracle(t, bits, v1))
