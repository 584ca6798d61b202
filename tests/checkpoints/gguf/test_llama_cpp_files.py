"""GGUF files of a real model made by llama.cpp's own converter and quantizer (all-MiniLM-L6-v2 in
F32, Q4_K_M, Q6_K, Q8_0 and IQ4_NL: tests/llama_cpp_ggufs.py): every tensor of each, read by
dyndq.checkpoints.gguf.read, gives through its nodes gguf.quants.dequantize's float32 bits on the
reference engine and on ONNX Runtime.  `make test-gguf-real` makes the files and runs these;
`make test` runs them where the files are there, and skips them, saying so, where they are not."""
from __future__ import annotations

import pytest

from dyndq.checkpoints import gguf as ours
import llama_cpp_ggufs as made

pytestmark = pytest.mark.llama_cpp
WHY_NOT = made.missing()
KINDS = ("F32", *made.QUANTS)


def gguf_files():
    """(path, type histogram) of each GGUF file llama.cpp made here, F32 first: what the import's
    end-to-end test (onto the MiniLM ONNX export) walks."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    yield from made.files()


@pytest.mark.parametrize("kind", KINDS)
def test_every_tensor_of_llama_cpps_file_dequantizes_exactly(kind):
    from gguf_blocks import check_exact  # (imports gguf, skipping where it is not installed)

    if WHY_NOT:
        pytest.skip(WHY_NOT)
    seen = []
    for tensor in ours.read(made.path_of(kind)):
        check_exact(tensor.type_name, tensor.data, tensor.shape)
        seen.append(tensor.type_name)
    assert len(seen) == sum(made.histogram(made.path_of(kind)).values()) > 0


@pytest.mark.parametrize("kind", made.QUANTS)
def test_llama_cpps_quantizer_wrote_the_type_asked_for(kind):
    """(so that a quantizer writing everything F32 or F16 cannot pass the test above vacuously)"""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    counts = made.histogram(made.path_of(kind))
    main = {"Q4_K_M": "Q4_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0", "IQ4_NL": "IQ4_NL"}[kind]
    assert counts.get(main, 0) > 0, counts


def test_the_helper_yields_each_file_with_its_histogram():
    listed = list(gguf_files())
    assert [p.name for p, _ in listed] == [f"minilm-{k}.gguf" for k in KINDS]
    assert all(sum(h.values()) > 0 for _, h in listed)
