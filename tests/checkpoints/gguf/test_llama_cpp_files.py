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


@pytest.mark.parametrize("kind", made.QUANTS)
def test_llama_cpps_file_imported_onto_the_minilm_export_computes_the_dequantized_model(kind):
    """`dyndq.import_weights` of llama.cpp's file onto the MiniLM ONNX export (`make
    test-trained-export`): every weight matched (torch's `onnx::MatMul_*` names by shape and
    closeness, the rest by gguf's BERT name map), and the model's sentence embeddings equal those of
    the float model holding gguf.quants.dequantize's weights (oriented as the graph reads them):
    bit for bit on the reference engine (the same MatMul operands in NumPy), within 1e-5 of the
    largest on ONNX Runtime (a weight computed at run time against one stored, which its MatMul
    prepacks and may sum in another order)."""
    import gguf
    import numpy as np
    import onnx

    import dyndq
    import trained_models
    from engines import run_onnxruntime

    if WHY_NOT:
        pytest.skip(WHY_NOT)
    if (why := trained_models.minilm_missing()) is not None:
        pytest.skip(why)
    model = onnx.load(str(trained_models.path_of("minilm")))
    out, report = dyndq.import_weights(model, made.path_of(kind))
    assert not report.left_float and not report.unused, report.table()
    raw = {t.name: t for t in gguf.GGUFReader(str(made.path_of(kind))).tensors}
    weights = {}
    for row in report.imported:
        t = raw[row.tensor]
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(tuple(reversed(t.shape.tolist())))
        weights[row.weight] = values.T if row.orientation == "transposed" else values
    by_shape = [row for row in report.imported if row.how == "by shape"]
    assert by_shape and max(row.error for row in by_shape) < 0.1  # (each close to the float weight it replaced)
    assert any(row.how == "by GGUF's name map" for row in report.imported)
    oracle = onnx.ModelProto()
    oracle.CopyFrom(model)
    for t in oracle.graph.initializer:
        if t.name in weights:
            assert tuple(t.dims) == weights[t.name].shape, t.name
            t.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(weights[t.name]), t.name))
    feeds = trained_models.batched(trained_models.minilm_inputs("held", 4))
    ours, theirs = dyndq.run(out, feeds), dyndq.run(oracle, feeds)
    for name, value in theirs.items():
        assert (ours[name].view(np.uint32) == value.view(np.uint32)).all(), (kind, name)
    got = run_onnxruntime(dyndq.export(out, target="onnxruntime"), feeds)
    for value, name in zip(got, [o.name for o in out.graph.output]):
        np.testing.assert_allclose(value, theirs[name], rtol=1e-5, atol=1e-5 * float(np.abs(theirs[name]).max()))
