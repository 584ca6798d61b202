"""GGUF files in: the tensors of a file gguf's own writer made, read one at a time (views of the
memory-mapped file), each written as nodes that give exactly what gguf dequantizes from the same
bytes; a tensor of a type no registered type writes, or of the wrong length, refused by name."""
from __future__ import annotations

import numpy as np
import pytest

import dyndq
from dyndq.checkpoints import gguf as ours
from gguf_blocks import check_exact, drawn, quantized, write_gguf


def test_a_files_tensors_are_read_one_at_a_time_and_dequantize_exactly(tmp_path):
    tensors = {"blk.0.attn_q.weight": ("Q4_K", drawn("Q4_K", 4, 2, seed=5)),
               "blk.0.ffn_up.weight": ("Q8_0", quantized("Q8_0", (3, 64), seed=6)),
               "token_embd.weight": ("Q6_K", drawn("Q6_K", 2, 1, seed=7)),
               "blk.0.attn_norm.weight": ("F32", np.arange(32, dtype=np.float32).reshape(1, 32).view(np.uint8))}
    write_gguf(tmp_path / "m.gguf", tensors)
    read = ours.read(tmp_path / "m.gguf")
    assert iter(read) is read  # (a generator: the file's tensors one at a time)
    seen = []
    for tensor in read:
        type_name, data = tensors[tensor.name]
        assert tensor.type_name == type_name and isinstance(tensor.data, np.memmap)
        assert tensor.data.tobytes() == data.tobytes()
        check_exact(tensor.type_name, tensor.data, tensor.shape)
        seen.append(tensor.name)
    assert seen == list(tensors)


def test_the_shape_is_numpys_with_the_row_last(tmp_path):
    write_gguf(tmp_path / "m.gguf", {"w": ("Q4_0", drawn("Q4_0", 6, 2, seed=8).reshape(2, 3, -1))})
    [tensor] = ours.read(tmp_path / "m.gguf")
    assert tensor.shape == (2, 3, 64) and tensor.data.shape == (2, 3, 36)


@pytest.mark.parametrize("type_name", ["Q8_1", "Q8_K", "I32"])
def test_a_tensor_of_a_type_not_taken_is_refused_naming_it_and_its_type(type_name):
    tensor = ours.GGUFTensor("blk.3.ffn_down.weight", type_name, (2, 256), np.zeros((2, 66), np.uint8))
    with pytest.raises(ours.UnsupportedType) as e:
        ours.nodes(tensor)
    assert isinstance(e.value, dyndq.ValidationError)
    assert "'blk.3.ffn_down.weight'" in str(e.value) and f"of type {type_name} (a type no GGUF block type" in str(e.value)


def test_a_tensor_whose_bytes_do_not_make_its_rows_is_refused():
    tensor = ours.GGUFTensor("w", "Q4_0", (2, 64), np.zeros((2, 35), np.uint8))
    with pytest.raises(dyndq.ValidationError, match=r"'w'.*35 bytes per row of 64 Q4_0 values.*36"):
        ours.nodes(tensor)


def test_names_are_fresh_in_the_models_scope():
    from dyndq.plumbing.names import NameScope

    names = NameScope({"w_float16_bits"})
    placed = ours.nodes(ours.GGUFTensor("w", "F16", (1, 4), np.zeros((1, 8), np.uint8)), names)
    made = [t.name for t in placed.tensors] + [o for n in placed.nodes for o in n.output]
    assert "w_float16_bits" not in made and len(set(made)) == len(made)
