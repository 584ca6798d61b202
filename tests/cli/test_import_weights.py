"""`dyndq import-weights`: exit 0 with the file written (staged, checked, loading on the engine of
each --emit), the report printed and as JSON; exit 1 for problems (a tensor whose shape fits not
its weight, nothing matched, a --names entry naming nothing), exit 2 for usage (no -o, a --names
file that is not a JSON map, a checkpoint of no format read, a missing file), nothing written then;
external data in gives external data out; the input model unchanged."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import dyndq
from dyndq.cli import main
from dyndq.model_files import load_model, save_model
from engines import openvino_available, run_on
from gguf_models import EMBED, Q, expected, float_model, gguf_tensors, ids, source_weights, with_outputs, write_gguf


@pytest.fixture
def files(tmp_path):
    src = source_weights()
    tensors = gguf_tensors(src)
    write_gguf(tmp_path / "m.gguf", tensors)
    save_model(float_model(src), tmp_path / "float.onnx")
    return tmp_path, tensors


@pytest.mark.parametrize("emit", ["dyndq", "onnx", "onnxruntime", "openvino"])
def test_each_emit_is_written_and_loads_on_its_engine(files, emit, capsys):
    d, tensors = files
    before = (d / "float.onnx").read_bytes()
    assert main(["import-weights", str(d / "float.onnx"), str(d / "m.gguf"), "-o", str(d / "out.onnx"),
                 "--emit", emit]) == 0
    out = capsys.readouterr().out
    assert (d / "float.onnx").read_bytes() == before
    assert out.startswith(f"wrote {d / 'out.onnx'}: 7 weight(s) from 7 GGUF tensor(s), 0 left float, "
                          f"1 checkpoint tensor(s) unused; emit {emit}")
    assert "unused: blk.0.attn_v.weight (GGUF Q8_0 [128, 256])" in out
    model = load_model(d / "out.onnx")
    assert dyndq.check(model) == []
    if emit == "openvino" and not openvino_available():
        assert "not loaded on OpenVINO: it is not installed here" in out
        return
    runner = {"dyndq": "reference", "onnx": "onnxruntime", "onnxruntime": "onnxruntime", "openvino": "openvino"}[emit]
    if emit == "onnxruntime":  # (the embedding is a GatherBlockQuantized there: the rows it gathers, "e")
        assert "GatherBlockQuantized" in [n.op_type for n in model.graph.node]
        probe, want = onnx.ModelProto(), expected(tensors)[EMBED][ids()["ids"]]
        probe.CopyFrom(model)
        probe.graph.output.append(onnx.helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, list(want.shape)))
        got = run_on(runner, probe, ids())[-1:]
    else:
        probe = with_outputs(model, [EMBED])
        got = run_on(runner, probe, ids(), **({"config": __import__("engines").OPENVINO_CONFIG} if runner == "openvino" else {}))
        want = expected(tensors)[EMBED]
    assert np.asarray(got[0]).view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_json_report(files, capsys):
    d, _ = files
    assert main(["import-weights", str(d / "float.onnx"), str(d / "m.gguf"), "-o", str(d / "out.onnx"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["weight"]: r for r in report["imported"]}
    assert rows[Q]["tensor"] == "blk.0.attn_q.weight" and rows[Q]["how"] == "by GGUF's name map"
    assert report["unused"] == [{"tensor": "blk.0.attn_v.weight", "kind": "GGUF Q8_0", "shape": [128, 256]}]
    assert report["architecture"] == "llama" and report["left_float"] == []


def test_names_file(files, capsys):
    d, tensors = files
    save_model(float_model(source_weights(), names={Q: "w_q_custom"}), d / "renamed.onnx")
    (d / "map.json").write_text(json.dumps({"blk.0.attn_q.weight": "w_q_custom"}))
    assert main(["import-weights", str(d / "renamed.onnx"), str(d / "m.gguf"), "-o", str(d / "out.onnx"),
                 "--names", str(d / "map.json")]) == 0
    assert "w_q_custom <- blk.0.attn_q.weight (GGUF Q8_0, by --names, as stored)" in capsys.readouterr().out


def test_problems_exit_1_and_write_nothing(files, capsys):
    d, tensors = files
    bad = dict(tensors)
    bad["blk.0.attn_q.weight"] = tensors["blk.0.attn_v.weight"]
    write_gguf(d / "bad.gguf", bad)
    assert main(["import-weights", str(d / "float.onnx"), str(d / "bad.gguf"), "-o", str(d / "out.onnx")]) == 1
    err = capsys.readouterr().err
    assert "checkpoint tensor 'blk.0.attn_q.weight'" in err and "[128, 256]" in err
    write_gguf(d / "none.gguf", {"unrelated.weight": ("F32", np.ones((3, 5), np.float32))})
    assert main(["import-weights", str(d / "float.onnx"), str(d / "none.gguf"), "-o", str(d / "out.onnx")]) == 1
    assert "no tensor of its 1 matched" in capsys.readouterr().err
    (d / "map.json").write_text(json.dumps({"nope": Q}))
    assert main(["import-weights", str(d / "float.onnx"), str(d / "m.gguf"), "-o", str(d / "out.onnx"),
                 "--names", str(d / "map.json")]) == 1
    assert "--names entry 'nope'" in capsys.readouterr().err
    assert not (d / "out.onnx").exists()


def test_usage_errors_exit_2_and_write_nothing(files, capsys):
    d, _ = files
    assert main(["import-weights", str(d / "float.onnx"), str(d / "m.gguf")]) == 2  # (no -o)
    (d / "map.json").write_text("{not json")
    assert main(["import-weights", str(d / "float.onnx"), str(d / "m.gguf"), "-o", str(d / "out.onnx"),
                 "--names", str(d / "map.json")]) == 2
    assert "not JSON" in capsys.readouterr().err
    (d / "list.json").write_text("[1, 2]")
    assert main(["import-weights", str(d / "float.onnx"), str(d / "m.gguf"), "-o", str(d / "out.onnx"),
                 "--names", str(d / "list.json")]) == 2
    assert main(["import-weights", str(d / "float.onnx"), str(d / "float.onnx"), "-o", str(d / "out.onnx")]) == 2
    assert "not a checkpoint dyndq reads" in capsys.readouterr().err
    assert main(["import-weights", str(d / "float.onnx"), str(d / "missing.gguf"), "-o", str(d / "out.onnx")]) == 2
    assert main(["import-weights", str(d / "float.onnx"), str(d / "m.gguf"), "-o", str(d / "float.onnx")]) == 2
    assert not (d / "out.onnx").exists()


def test_external_data_in_gives_external_data_out(files, capsys):
    d, tensors = files
    save_model(float_model(source_weights()), d / "ext.onnx", external_data=True)
    assert main(["import-weights", str(d / "ext.onnx"), str(d / "m.gguf"), "-o", str(d / "out.onnx")]) == 0
    assert "its tensors are in out.onnx.data, beside it" in capsys.readouterr().out
    model = onnx.load(str(d / "out.onnx"), load_external_data=False)
    assert any(onnx.external_data_helper.uses_external_data(t) for t in model.graph.initializer)
    got = dyndq.run(with_outputs(load_model(d / "out.onnx"), [Q]), ids())[Q]
    assert (got.view(np.uint32) == expected(tensors)[Q].view(np.uint32)).all()
