"""quantize_file: the external-data path (weights read and written one at a time) on a small
model forced to use it, atomic writes, and the other forms it emits."""
from __future__ import annotations

import os
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper as nh

import dyndq
from dyndq.model_files import save_model
from dyndq.kernels import parallel
from dyndq.quantization import quantize_file

from quantize_models import heavy, mlp, stack


def arrays(model):
    return {t.name: nh.to_array(t) for t in model.graph.initializer}


def test_external_data_in_external_data_out_same_as_in_memory(tmp_path):
    model = mlp()
    save_model(model, tmp_path / "float.onnx", external_data=True)
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", method="search")
    assert os.path.exists(tmp_path / "q.onnx.data")
    written = onnx.load(tmp_path / "q.onnx", load_external_data=False)
    assert any(t.data_location == T.EXTERNAL for t in written.graph.initializer)
    in_memory, memory_report = dyndq.quantize(model, method="search")
    got, want = arrays(dyndq.load_model(tmp_path / "q.onnx")), arrays(in_memory)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert [layer.relative_error for layer in report.layers] == [layer.relative_error for layer in memory_report.layers]
    assert [o.relative_error for o in report.outputs] == [o.relative_error for o in memory_report.outputs]
    assert dyndq.check(dyndq.load_model(tmp_path / "q.onnx")) == []


def test_weights_are_read_and_written_one_at_a_time(tmp_path, monkeypatch):
    """Six weights of 4 MiB each: the memory Python and NumPy take while quantizing from and to
    external data stays near twice one weight (the weight read, its copy in groups) plus each
    thread's scratch arrays (numerics.BLOCK_ELEMENTS elements at a time: their float64 error sums,
    the block's copy, its levels; 2 to 4 MiB each, measured), not the model's six."""
    monkeypatch.setenv(parallel.THREADS_ENV, "2")  # (the scratch is per thread: as many as on a 2-core machine)
    save_model(stack(hidden=1024), tmp_path / "float.onnx", external_data=True)
    tracemalloc.start()
    try:
        quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", evaluate=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one = 1024 * 1024 * 4
    threads = parallel.threads_for(one // 4, 16, None)  # (a 1024 x 1024 weight's 16 blocks: at most 2 threads here)
    scratch = 4 << 20  # per thread (numerics.BLOCK_ELEMENTS = 64K elements: 3 float64 sums are 1.5 MiB of it)
    assert peak < 2 * one + threads * scratch, f"peak {peak / one:.2f} weights, {threads} thread(s)"
    assert os.path.getsize(tmp_path / "q.onnx.data") < 0.14 * 6 * one


def test_a_failure_midway_leaves_no_file(tmp_path):
    model = stack(layers=3)
    w = nh.to_array(model.graph.initializer[2]).copy()
    w[0, 0] = np.inf
    model.graph.initializer[2].CopyFrom(nh.from_array(w, "w2"))
    save_model(model, tmp_path / "float.onnx", external_data=True)
    with pytest.raises(dyndq.ValidationError) as e:
        quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", strict=True, evaluate=False)
    assert "NaN or infinity" in str(e.value)
    assert sorted(os.listdir(tmp_path)) == ["float.onnx", "float.onnx.data"]


def test_emit_standard_onnx_from_external_data(tmp_path):
    save_model(stack(layers=2, hidden=256), tmp_path / "float.onnx", external_data=True)
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", emit="onnx")
    out = dyndq.load_model(tmp_path / "q.onnx")
    assert {n.op_type for n in out.graph.node} == {"DequantizeLinear", "MatMul"}
    assert "org.dyndq" not in {o.domain for o in out.opset_import}
    assert report.outputs and report.outputs[0].cosine > 0.97  # (over 4 seeded samples; 0.979 measured)


def test_emit_a_onednn_graph_with_its_weights(tmp_path):
    save_model(stack(layers=2, hidden=256), tmp_path / "float.onnx")
    saved = {}
    quantize_file(tmp_path / "float.onnx", tmp_path / "q.json", emit="onednn-json", save_weights=saved.update, evaluate=False)
    import json

    doc = json.loads((tmp_path / "q.json").read_text())
    kinds = [op["kind"] for op in doc["graph"]]
    assert kinds.count("DynamicDequantize") == 2 and kinds.count("MatMul") == 2
    assert len(saved) == 6 and sorted(a.dtype.name for a in saved.values()) == ["float32"] * 2 + ["uint4"] * 4


@pytest.mark.parametrize("k", [256, 200])  # (200: codes padded to whole blocks, then a Slice)
def test_emit_onnxruntime_contrib_ops_as_its_own_quantizer_writes_them(tmp_path, k):
    """--emit onnxruntime: MatMulNBits and GatherBlockQuantized (dyndq.export, target onnxruntime),
    holding ONNX Runtime's own quantizer's bytes for the same weights (its default configuration)."""
    ort_quant = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")
    model = mlp(k=k, n=96)
    save_model(model, tmp_path / "float.onnx")
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", emit="onnxruntime", ops=("MatMul", "Gather"))
    out = dyndq.load_model(tmp_path / "q.onnx")
    assert {"MatMulNBits", "GatherBlockQuantized"} <= {n.op_type for n in out.graph.node}
    assert report.outputs and report.outputs[0].cosine > 0.95
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    theirs = ort_quant.MatMulNBitsQuantizer(copy, op_types_to_quantize=("MatMul", "Gather"))
    theirs.process()
    ours = {n.op_type: [arrays(out)[i] for i in n.input if i in arrays(out)] for n in out.graph.node}
    ort = {n.op_type: [arrays(theirs.model.model)[i] for i in n.input if i in arrays(theirs.model.model)]
            for n in theirs.model.model.graph.node}
    for op in ("MatMulNBits", "GatherBlockQuantized"):
        assert len(ours[op]) == len(ort[op])
        for a, b in zip(ours[op], ort[op]):
            np.testing.assert_array_equal(a, b)


# -- the output staged, checked and measured as written, then put in place --------------------------

def _sessions(monkeypatch) -> list[tuple[list[str], str | None]]:
    """(op types, path) of every ONNX Runtime session the evaluation makes, as they are made."""
    from dyndq import ort_session

    made, real = [], ort_session.OrtSession.__init__

    def spy(self, exported, **kw):
        made.append((sorted({n.op_type for n in exported.graph.node}), kw.get("path")))
        real(self, exported, **kw)

    monkeypatch.setattr(ort_session.OrtSession, "__init__", spy)
    return made


@pytest.mark.parametrize("emit,ops", [("onnxruntime", {"MatMulNBits", "GatherBlockQuantized"}),
                                      ("onnx", {"DequantizeLinear"})])
def test_the_evaluation_measures_the_file_as_written_on_onnxruntime(tmp_path, monkeypatch, emit, ops):
    """With --emit onnxruntime the file holds MatMulNBits where the model in memory holds
    DynamicDequantize: what is measured is the file, read by ONNX Runtime itself from where it is
    staged, not the model in memory exported otherwise."""
    save_model(mlp(), tmp_path / "float.onnx")
    made = _sessions(monkeypatch)
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", emit=emit, samples=2)
    (float_ops, float_path), (q_ops, q_path) = made
    assert float_path is None and "DequantizeLinear" not in float_ops
    assert ops <= set(q_ops) and "DynamicDequantize" not in q_ops, q_ops
    assert os.path.dirname(q_path) != str(tmp_path) and os.path.basename(q_path) == "q.onnx"  # (its staging place)
    assert "; onnxruntime, the file as written, 4 runs in " in report.outputs_note
    assert report.outputs and report.outputs[0].cosine > 0.95
    written = {n.op_type for n in dyndq.load_model(tmp_path / "q.onnx").graph.node}
    assert ops <= written


@pytest.mark.parametrize("external_data", [False, True])
@pytest.mark.parametrize("emit", ["dyndq", "onnxruntime"])
def test_an_interrupt_during_the_evaluation_leaves_nothing_written(tmp_path, monkeypatch, emit, external_data):
    """All or nothing: Ctrl-C while the staged output is measured leaves no output (and no staging file)."""
    from dyndq.quantization import evaluate

    save_model(mlp(), tmp_path / "float.onnx", external_data=external_data)
    before = sorted(os.listdir(tmp_path))

    def interrupted(self, quantized, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate.Evaluation, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", emit=emit)
    assert sorted(os.listdir(tmp_path)) == before


def test_an_interrupt_before_placing_leaves_the_model_it_would_replace_whole(tmp_path):
    save_model(mlp(), tmp_path / "float.onnx")
    save_model(mlp(seed=5), tmp_path / "q.onnx")
    before = (tmp_path / "q.onnx").read_bytes()

    def interrupted(report):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", evaluate=False, before_placing=interrupted)
    assert (tmp_path / "q.onnx").read_bytes() == before and sorted(os.listdir(tmp_path)) == ["float.onnx", "q.onnx"]


def test_the_input_itself_as_the_output_is_refused_unless_asked(tmp_path):
    from dyndq.atomic_writes import ModelFileError

    save_model(mlp(), tmp_path / "m.onnx")
    before = (tmp_path / "m.onnx").read_bytes()
    os.symlink("m.onnx", tmp_path / "link.onnx")
    for dst in ("m.onnx", "link.onnx"):
        with pytest.raises(ModelFileError, match="is the input model itself"):
            quantize_file(tmp_path / "m.onnx", tmp_path / dst, evaluate=False)
    assert (tmp_path / "m.onnx").read_bytes() == before
    quantize_file(tmp_path / "m.onnx", tmp_path / "m.onnx", evaluate=False, overwrite=True)
    assert (tmp_path / "m.onnx").read_bytes() != before


def test_the_onednn_graph_is_read_back_and_measured_as_written(tmp_path):
    save_model(stack(layers=2, hidden=256), tmp_path / "float.onnx")
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "q.json", emit="onednn-json", samples=2)
    assert "onnxruntime, the oneDNN graph as written, read back by dyndq's reader, 4 runs in " in report.outputs_note
    assert report.outputs and report.outputs[0].cosine > 0.95


@pytest.mark.parametrize("emit", ["onnx", "onnxruntime"])
def test_weights_left_alone_in_external_data_are_written_into_a_model_in_another_folder(tmp_path, emit):
    """A weight left alone (the Gather's table, with --ops MatMul) pointed into the input's data
    file, by a name the written model then resolved beside itself: in another folder, no such file."""
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    save_model(mlp(), tmp_path / "in" / "float.onnx", external_data=True)
    report = quantize_file(tmp_path / "in" / "float.onnx", tmp_path / "out" / "q.onnx", emit=emit, ops=("MatMul",),
                           samples=1)
    assert report.outputs and "the file as written" in report.outputs_note
    written = dyndq.load_model(tmp_path / "out" / "q.onnx")
    assert "E" in {t.name for t in written.graph.initializer}
    y = dyndq.run(written, {"ids": np.array([0, 63], np.int64)}, engine="onnxruntime")["y"]
    assert y.shape == (2, 256)
