"""Every registered GGUF block type: its nodes give gguf.quants.dequantize's float32 bits, on the
reference engine and on ONNX Runtime, for tensors gguf's quantizer made and for drawn raw blocks
(extreme float16 scales included), and the tensors written weigh at most its ratio of the GGUF bytes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dyndq.checkpoints import gguf as ours
from gguf_blocks import block_of, check_exact, drawn, known, quantized, with_quantizer, written_bytes

TYPES = ours.names()


@pytest.mark.parametrize("name", with_quantizer(TYPES))
def test_tensors_of_ggufs_own_quantizer_dequantize_exactly(name):
    check_exact(name, quantized(name, (6, 512), seed=1), (6, 512))


def test_ggufs_quantizer_makes_the_types_it_should():
    """(so that a gguf losing a quantizer does not quietly leave its types to drawn blocks alone)"""
    assert {"F32", "F16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4"} <= set(with_quantizer(TYPES))


@pytest.mark.parametrize("name", TYPES)
def test_drawn_blocks_with_extreme_scales_dequantize_exactly(name):
    block, _ = block_of(name)
    n_blocks = 2048 // block  # (16 x 2048 values: every code and scale value of every type, at these seeds)
    want = check_exact(name, drawn(name, 16, n_blocks, seed=2), (16, n_blocks * block))
    assert np.isfinite(want).any() and (want != 0).any()


@pytest.mark.parametrize("name", TYPES)
def test_a_tensor_of_more_dims_keeps_its_shape(name):
    block, _ = block_of(name)
    check_exact(name, drawn(name, 6, 2, seed=3).reshape(2, 3, -1), (2, 3, 2 * block))


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(known(TYPES)), rows=st.integers(1, 5), n_blocks=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_any_drawn_blocks_dequantize_exactly(name, rows, n_blocks, seed):
    check_exact(name, drawn(name, rows, n_blocks, seed), (rows, n_blocks * block_of(name)[0]))


@pytest.mark.parametrize("name", TYPES)
def test_the_tensors_written_weigh_at_most_the_types_ratio_of_the_gguf_bytes(name):
    """(its lookup tables apart, which a model needs once per type: at most 17 kB)"""
    block, size = block_of(name)
    data = drawn(name, 64, 4096 // block, seed=4)
    placed = ours.nodes(ours.GGUFTensor("w", name, (64, 4096), data))
    ratio = written_bytes(placed) / data.nbytes
    assert ratio <= ours.get(name).ratio, f"{name}: {ratio:.3f}x the GGUF tensor's bytes"
    assert written_bytes(placed, tables=True) <= 17 * 1024  # (IQ1_S's grid, 2048 x 8, the largest)


def test_the_registered_blocks_are_ggufs():
    for name in known(TYPES):
        kind = ours.get(name)
        assert (kind.block, kind.size) == block_of(name), name


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "Q2_K", "TQ2_0"])
def test_codes_packed_a_few_rows_at_a_time_are_the_same(name, monkeypatch):
    """(the packed codes are made in chunks of rows: here one row a chunk)"""
    from dyndq.checkpoints import writer

    monkeypatch.setattr(writer, "CHUNK_BYTES", 1)
    block, _ = block_of(name)
    check_exact(name, drawn(name, 5, 2, seed=9), (5, 2 * block))
