"""The evaluation of a quantized model: on the user's inputs or seeded samples covering each
input's range, with task metrics for logits and distributions; and the report written to a file."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto as T, helper

import dyndq
from dyndq.cli import main
from dyndq.model_files import save_model
from dyndq.quantization.evaluate import index_bounds, seeded_samples, task_metrics
from dyndq.task_metrics import output_kind
from dyndq.quantization.options import OptionError
from dyndq.runner import FeedError

from quantize_models import exported_attention, mlp, stack


def test_seeded_samples_cover_the_vocabulary_through_a_cast():
    model = exported_attention(vocab=50)
    cast = helper.make_node("Cast", ["ids32"], ["ids"], to=T.INT64)
    model.graph.node.insert(0, cast)
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("ids32", T.INT32, [1, "seq"]))
    assert index_bounds(model) == {"ids32": 50}
    samples = seeded_samples(model, seed=3, samples=5)
    assert len(samples) == 5
    ids = np.concatenate([s["ids32"].ravel() for s in samples])
    assert ids.dtype == np.int32 and ids.min() == 0 and ids.max() == 49  # (the first and last row, always)
    again = seeded_samples(model, seed=3, samples=5)
    assert all(np.array_equal(a["ids32"], b["ids32"]) for a, b in zip(samples, again))


def test_task_metrics_by_hand():
    logits = [np.array([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])]
    same = task_metrics(logits, logits, "logits")
    assert same == (1.0, 0.0)
    flipped = [np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 5.0]])]
    agree, kl = task_metrics(logits, flipped, "logits")
    assert agree == 0.5
    p = np.exp(logits[0][0]) / np.exp(logits[0][0]).sum()
    q = np.exp(flipped[0][0]) / np.exp(flipped[0][0]).sum()
    assert kl == pytest.approx(float(np.sum(p * np.log(p / q))) / 2, rel=1e-12)


def test_what_an_output_is_told_by_its_values_and_its_maker():
    model = exported_attention()
    assert output_kind(model, "logits", [np.ones((1, 4, 50))]) == "logits"  # (made by MatMul)
    assert output_kind(model, "x", [np.full((1, 4, 3), 1 / 3)]) == "distribution"
    assert output_kind(model, "attention", [np.ones((1, 4, 1))]) is None  # (one value on the last axis: no choice)
    assert output_kind(model, "kT", [np.ones((1, 4, 3))]) is None  # (a Transpose's: neither)
    assert output_kind(model, "q", [np.ones((1, 4, 100))]) is None  # (a MatMul's hidden state: not logits)
    assert output_kind(model, "v", [np.ones((1, 4, 50))]) == "logits"  # (a MatMul's, as long as the vocabulary)


def test_the_users_inputs_are_what_is_measured_and_said():
    model = exported_attention()
    ids = np.arange(12, dtype=np.int64).reshape(1, 12)
    _, report = dyndq.quantize(model, inputs=[{"ids": ids}, {"ids": ids[:, ::-1].copy()}])
    assert report.outputs_note.startswith("2 samples given: ids int64[1, 12]; onnxruntime, 4 runs in ")
    (logits,) = report.outputs
    assert logits.task == "logits" and 0 <= logits.top1_agreement <= 1 and logits.kl_divergence >= 0
    _, seeded = dyndq.quantize(model, samples=2)
    assert seeded.outputs_note.startswith("2 seeded samples (seed 0; token ids across each embedding's rows): ids int64[1, 4]")
    assert seeded.outputs[0].relative_error != logits.relative_error
    assert seeded.inputs == {"source": "seeded", "seed": 0, "samples": [{"ids": "int64[1, 4]"}] * 2}


def test_a_feed_that_does_not_fit_is_named_before_any_work():
    model = exported_attention()
    with pytest.raises(FeedError) as e:
        dyndq.quantize(model, inputs=[{"ids": np.zeros((1, 3), np.int64)}, {"ids": np.zeros((1, 3), np.int32)}])
    assert [p.argument for p in e.value.problems] == ["ids (sample 2 of 2)"]
    with pytest.raises(FeedError) as e:
        dyndq.quantize(model, inputs={"tokens": np.zeros((1, 3), np.int64)})
    assert sorted(p.argument for p in e.value.problems) == ["ids", "tokens"]
    with pytest.raises(OptionError):
        dyndq.quantize(model, samples=0)


def test_a_distribution_output_is_measured_as_one():
    model = mlp(k=64, n=32)
    model.graph.node.append(helper.make_node("Softmax", ["y"], ["p"], axis=-1))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("p", T.FLOAT, ["batch", 64]))
    _, report = dyndq.quantize(model, group_size=32, samples=3)
    assert [(o.name, o.task) for o in report.outputs] == [("p", "distribution")]
    assert report.task_score() == (report.outputs[0].kl_divergence, -report.outputs[0].top1_agreement)


def test_the_command_line_takes_inputs_and_writes_a_report(tmp_path, capsys):
    model = str(tmp_path / "attention.onnx")
    save_model(exported_attention(), model)
    for i, ids in enumerate((np.arange(10), np.arange(40, 50))):
        os.makedirs(tmp_path / f"s{i}")
        np.save(tmp_path / f"s{i}" / "ids.npy", ids.reshape(1, 10).astype(np.int64))
    report = str(tmp_path / "r.json")
    assert main(["quantize", model, str(tmp_path / "q.onnx"), "--inputs-dir", str(tmp_path / "s0"),
                 "--inputs-dir", str(tmp_path / "s1"), "--report", report]) == 0
    printed = capsys.readouterr().out
    assert "output error (2 samples given: ids int64[1, 10]" in printed and f"wrote {report}" in printed
    doc = json.loads(Path(report).read_text())
    assert doc["samples_from"] == [f"--inputs-dir {tmp_path / 's0'}", f"--inputs-dir {tmp_path / 's1'}"]
    assert doc["settings"]["group_size"] == 128 and [layer["name"] for layer in doc["layers"]] == ["E", "Wq", "Wk", "Wv", "Wo"]
    assert doc["outputs"][0]["task"] == "logits" and len(doc["task_score"]) == 2
    assert doc["inputs"] == {"source": "given", "seed": None, "samples": [{"ids": "int64[1, 10]"}] * 2}
    assert doc["activations"].startswith("2 MatMuls whose B is an activation")
    md = str(tmp_path / "r.md")
    assert main(["quantize", model, str(tmp_path / "q.onnx"), "--input", f"ids={tmp_path / 's1' / 'ids.npy'}",
                 "--report", md]) == 0
    text = Path(md).read_text()
    assert "| logits |" in text and "| Wo | MatMul | 100x50 |" in text and "1 sample given: ids int64[1, 10]" in text
    try:
        import matplotlib  # noqa: F401
        assert os.path.getsize(tmp_path / "r-errors.png") > 0 and "r-errors.png" in text
    except ImportError:
        assert "no error chart: matplotlib is not installed" in capsys.readouterr().out
        assert not os.path.exists(tmp_path / "r-errors.png")


@pytest.mark.parametrize("argv,said", [
    (["--input", "ids={bad}"], "dyndq: {model}: input ids: found an int32 array of shape [1, 3]"),
    (["--input", "ids={missing}"], "no such file"),
    (["--report", "r.txt"], "--report r.txt: a report is written as FILE.json or FILE.md"),
    (["--samples", "0"], "dyndq: --samples: found 0; allowed: a whole number >= 1"),
    (["--input", "ids={bad}", "--no-evaluate"], "--no-evaluate measures none"),
])
def test_inputs_that_do_not_fit_are_usage_errors(tmp_path, capsys, argv, said):
    model = str(tmp_path / "attention.onnx")
    save_model(exported_attention(), model)
    bad = str(tmp_path / "bad.npy")
    np.save(bad, np.zeros((1, 3), np.int32))
    values = dict(bad=bad, missing=str(tmp_path / "nope.npy"), model=model)
    argv = [a.format(**values) for a in argv]
    assert main(["quantize", model, str(tmp_path / "q.onnx"), *argv]) == 2
    err = capsys.readouterr().err
    assert said.format(**values) in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "q.onnx")


def test_methods_are_ranked_on_the_same_inputs_by_what_a_task_sees():
    model = exported_attention()
    ids = {"ids": np.arange(0, 50, 3, dtype=np.int64).reshape(1, -1)}
    runs = dyndq.quantization.rank_methods(model, inputs=[ids])
    assert sorted(method for method, _ in runs) == ["rtn", "search"]
    scores = [report.task_score() for _, report in runs]
    assert scores == sorted(scores) and all(len(s) == 2 for s in scores)
    for method, report in runs:  # (each the same as quantize with that method measures it)
        _, alone = dyndq.quantize(model, method=method, inputs=ids)
        assert [(o.relative_error, o.kl_divergence) for o in alone.outputs] == \
            [(o.relative_error, o.kl_divergence) for o in report.outputs]


def test_the_command_line_ranks_methods_into_the_report(tmp_path, capsys):
    model = str(tmp_path / "attention.onnx")
    save_model(exported_attention(), model)
    assert main(["quantize", model, str(tmp_path / "q.onnx"), "--rank-methods", "--samples", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [row["method"] for row in doc["ranking"]] in (["rtn", "search"], ["search", "rtn"])
    assert doc["ranking"][0]["task_score"] <= doc["ranking"][1]["task_score"]
    assert doc["ranking"][0]["inputs"].startswith("2 seeded samples")


def test_without_matplotlib_the_markdown_report_says_why_it_has_no_chart(tmp_path, monkeypatch):
    import sys

    from dyndq.quantization.report import write_report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (import matplotlib now raises ImportError)
    _, report = dyndq.quantize(exported_attention(), samples=1)
    note = write_report(report, tmp_path / "r.md")
    assert note == "no error chart: matplotlib is not installed (pip install matplotlib draws one)"
    assert sorted(os.listdir(tmp_path)) == ["r.md"] and "errors.png" not in (tmp_path / "r.md").read_text()
    with pytest.raises(ValueError, match="as .json or .md"):
        write_report(report, tmp_path / "r.txt")


def test_a_dimension_written_as_minus_one_is_open_in_the_seeded_samples():
    """(paddle2onnx writes a dynamic batch as -1)"""
    model = mlp(k=64, n=32)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    (sample,) = seeded_samples(model, seed=0, samples=1)
    assert sample["ids"].shape == (4,)
    _, report = dyndq.quantize(model, group_size=32, samples=1)
    assert report.outputs and report.outputs_note.startswith("1 seeded sample")


def test_progress_tells_each_run_of_the_evaluation():
    lines = []
    dyndq.quantize(exported_attention(), samples=2, progress=lines.append)
    assert [line for line in lines if line.startswith("evaluating")] == [
        "evaluating: float model, sample 1/2", "evaluating: float model, sample 2/2",
        "evaluating: quantized model, sample 1/2", "evaluating: quantized model, sample 2/2"]


def test_the_float_model_runs_with_its_weights_held_once_and_as_the_runner_runs_it(tmp_path):
    """The evaluation's float run (OnOrt): its big weights fed as arrays, the model ONNX Runtime
    gets holding none of them; from a file with external data read from it, never the whole
    model loaded; the outputs those of `dyndq.run`'s Runner, bit for bit (it feeds them alike)."""
    from dyndq.model_files import read_model
    from dyndq.plumbing.light import BIG
    from dyndq.quantization.evaluate import OnOrt
    from dyndq.runner import Runner

    model = stack(layers=3, hidden=1024)  # (4 MiB weights: above BIG)
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 1024)).astype(np.float32)}
    want = Runner(model, "onnxruntime")(feeds)
    run = OnOrt(model)
    assert sorted(run.session._big) == ["w0", "w1", "w2"]
    assert all(len(t.raw_data) <= BIG for t in run.session.boundary.model.graph.initializer)
    np.testing.assert_array_equal(run(feeds)["h2"], want["h2"])
    save_model(model, tmp_path / "float.onnx", external_data=True)
    loaded = read_model(tmp_path / "float.onnx", load_data=False)
    from_file = OnOrt(loaded.model, loaded)
    assert all(t.data_location == T.EXTERNAL for t in loaded.model.graph.initializer)  # (still on disk)
    np.testing.assert_array_equal(from_file(feeds)["h2"], want["h2"])


def test_the_evaluation_from_external_data_measures_what_the_in_memory_one_does(tmp_path):
    from dyndq.quantization import quantize_file

    model = stack(layers=3, hidden=1024)
    save_model(model, tmp_path / "float.onnx", external_data=True)
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", samples=2)
    _, in_memory = dyndq.quantize(model, samples=2)
    assert report.outputs_note.startswith("2 seeded samples (seed 0): x float32[4, 1024]; onnxruntime, 4 runs in ")
    assert [(o.name, o.relative_error, o.cosine) for o in report.outputs] == \
           [(o.name, o.relative_error, o.cosine) for o in in_memory.outputs]
    assert 0 < report.outputs[0].relative_error < 1


def test_a_float_model_the_export_rewrites_is_evaluated_whole_from_external_data(tmp_path):
    """A model with a function (or ops outside ai.onnx, or nested graphs) is exported whole, as
    the Runner does: from a file with external data, its data loaded for the run."""
    from dyndq.quantization import quantize_file

    model = stack(layers=2, hidden=1024)
    model.graph.node[1].output[0] = "h1_in"
    model.graph.node.append(helper.make_node("Twice", ["h1_in"], ["h1"], domain="local", name="twice"))
    model.functions.append(helper.make_function("local", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                                [helper.make_opsetid("", 21)]))
    model.opset_import.append(helper.make_opsetid("local", 1))
    save_model(model, tmp_path / "float.onnx", external_data=True)
    report = quantize_file(tmp_path / "float.onnx", tmp_path / "q.onnx", samples=1)
    _, in_memory = dyndq.quantize(model, samples=1)
    assert report.outputs_note.startswith("1 seeded sample (seed 0): x float32[4, 1024]; onnxruntime, 2 runs in ")
    assert [o.relative_error for o in report.outputs] == [o.relative_error for o in in_memory.outputs]


def _drawn_chart(monkeypatch, report, path):
    """The figure error_chart saves, drawn (as savefig draws it), caught at savefig."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from dyndq.quantization.report import error_chart

    saved, real = [], Figure.savefig

    def spy(fig, *a, **kw):
        saved.append((fig, kw.get("dpi") or fig.dpi))
        return real(fig, *a, **kw)

    monkeypatch.setattr(Figure, "savefig", spy)
    assert error_chart(report, str(path)) == f"wrote {path}"
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig, dpi = saved[0]
    FigureCanvasAgg(fig)  # (closed after saving: a canvas of its own again, to measure it on)
    fig.set_dpi(dpi)
    fig.canvas.draw()
    return fig


@pytest.mark.parametrize("count,name", [(3, "W{i}"), (60, "model.layers.{i}.self_attn.q_proj.weight"),
                                        (12, "/model/encoder/layer.{i}/attention/self/query/MatMul_quant_weight_"
                                             "of_a_very_long_exporter_name")])
def test_the_error_chart_shows_every_label_whole_with_room_for_each_weight(tmp_path, monkeypatch, count, name):
    """Every text (the axis labels, the title, each weight's name) inside the picture, none over
    another, and each weight's bar a row of its own at least 12 pixels high: the chart was cramped,
    its axis label cut off, once the names were long or many."""
    pytest.importorskip("matplotlib")
    from dyndq.quantization.options import QuantizeOptions
    from dyndq.quantization.report import LayerReport, QuantizeReport

    rng = np.random.default_rng(0)
    layers = [LayerReport(name.format(i=i), "main", ["n"], ["MatMul"], [64, 64], "float32",
                          ("uint4" if i % 3 else "uint2") + " per_group [32, 1]", float(rng.uniform(0.05, 0.6)),
                          0.01, 0.99, 100, 20, 0.1) for i in range(count)]
    report = QuantizeReport(QuantizeOptions(), layers=layers)
    fig = _drawn_chart(monkeypatch, report, tmp_path / "c.png")
    renderer = fig.canvas.get_renderer()
    width, height = fig.canvas.get_width_height()
    ax = fig.axes[0]
    labels = [t for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
    names = [t for t in labels if t.get_text() in {layer.name for layer in layers} or "\u2026" in t.get_text()]
    assert len(names) == count  # (each weight named)
    texts = [ax.xaxis.label, ax.yaxis.label, ax.title, *labels]
    if ax.get_legend():
        texts.append(ax.get_legend())
    for t in texts:
        if not (getattr(t, "get_text", None) and not t.get_text()):
            box = t.get_window_extent(renderer)
            assert box.x0 >= -1 and box.y0 >= -1 and box.x1 <= width + 1 and box.y1 <= height + 1, (t, box, width, height)
    boxes = sorted((t.get_window_extent(renderer) for t in names), key=lambda b: b.y0)
    assert all(a.y1 <= b.y0 + 0.5 for a, b in zip(boxes, boxes[1:]))  # (no name over another)
    rows = ax.get_window_extent(renderer).height / count
    assert rows >= 12, rows
