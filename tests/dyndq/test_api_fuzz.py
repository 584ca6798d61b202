"""The API fuzzed: dyndq.quantize, export, lift, check and run on small models of the suite, with
options drawn from valid and invalid values (of the right kind and of the wrong one).  Whatever is
drawn, each raises only what it documents: `dyndq.ValidationError` (its subclasses OptionError,
FeedError, NothingToQuantize, OutputNameError, NotRunnable among them) and, for export,
`dyndq.ExportError`; run's ValueError for an unknown engine; check raises nothing.  Never a
KeyError, IndexError, ZeroDivisionError or MemoryError from inside.

Bounded and deterministic as tests/cli/test_fuzz.py is (the default profile of tests/conftest.py;
EXAMPLES each; DYNDQ_FUZZ_EXAMPLES draws more).  run's feeds are drawn within each input's declared
type and, for the ids a Gather reads, within its table: an index beyond it is the engine's own
error to give (ONNX Runtime's, onnx.reference's), which the CLI tells as exit 1."""
from __future__ import annotations

import math
import os
from datetime import timedelta

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dyndq
from dyndq.demo import build_model, demo_input

from quantize_models import mlp

EXAMPLES = int(os.environ.get("DYNDQ_FUZZ_EXAMPLES", "40"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=timedelta(seconds=60), suppress_health_check=[HealthCheck.too_slow])


def _models() -> dict[str, onnx.ModelProto]:
    small = mlp(k=32, n=16, vocab=8)
    quantized = dyndq.quantize(small, evaluate=False, group_size=16)[0]
    two_bits = dyndq.quantize(small, evaluate=False, group_size=16, bits=2)[0]
    bad = build_model()
    next(n for n in bad.graph.node if n.domain == dyndq.DOMAIN).attribute.append(onnx.helper.make_attribute("axis", 9))
    return {"float": small, "quantized": quantized, "two bits": two_bits, "demo": build_model(),
            "standard": dyndq.export(build_model()), "onnxruntime": dyndq.export(quantized, target="onnxruntime"),
            "invalid": bad}


MODELS = _models()
NAMES = sorted(MODELS)


def _fresh(name: str) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(MODELS[name])
    return copy


def _unchanged(name: str, model: onnx.ModelProto) -> None:
    assert model.SerializeToString() == MODELS[name].SerializeToString(), f"{name}: the model passed in was changed"


IDS = {"ids": np.array([0, 7, 3], np.int64)}
QUANTIZE_OPTIONS = {
    "bits": [2, 4, 8, 3, "4", None, 4.0],
    "group_size": [None, -1, 0, 1, 16, 32, 128, 1000, 2**40, 1.5, True, "16"],
    "symmetric": [True, False, "yes"],
    "scale_dtype": [None, "float16", "bfloat16", "float32", "int8", np.float16, 5],
    "ops": [("MatMul",), "Gather", ["Gemm", "MatMul"], (), ("Conv",), 5, None],
    "exclude": [(), "W1", ["nope"], "E", 7, None],
    "method": ["rtn", "search", "x", None],
    "evaluate": [True, False],
    "seed": [0, 3, -1, 1.5, "1"],
    "strict": [True, False],
    "format": ["int", "mxfp4", "nvfp4", "fp8", None],
    "inputs": [None, IDS, [IDS, IDS], [], {"nope": np.zeros(2, np.int64)}, {"ids": np.zeros(2, np.float32)},
               {"ids": np.zeros(0, np.int64)}, "ids", [None]],
    "samples": [1, 2, 0, "2", -3],
    "budget": [None, 4.3, 2.0, 8.5, 0, -1, math.nan, math.inf, "4"],
    "format_choices": [None, "int2,int4", ["mxfp4"], "x", (), ["int8", "int8"], 3],
}


@st.composite
def options(draw, table: dict) -> dict:
    keys = draw(st.lists(st.sampled_from(sorted(table)), max_size=5, unique=True))
    return {k: draw(st.sampled_from(table[k])) for k in keys}


@SETTINGS
@given(st.sampled_from(["float", "quantized", "demo", "onnxruntime"]), options(QUANTIZE_OPTIONS))
def test_quantize_raises_only_what_it_documents(name, drawn):
    model = _fresh(name)
    try:
        out, report = dyndq.quantize(model, **drawn)
    except dyndq.ValidationError:
        pass
    else:
        assert dyndq.check(out) == [], (name, drawn)
    _unchanged(name, model)


@SETTINGS
@given(st.sampled_from(NAMES), options({
    "opset": [None, 13, 17, 19, 21, 23, 25, 28, 0, -1, 40, "21", 21.0],
    "target": ["onnx", "onnxruntime", "openvino", "x", None],
    "accuracy_level": [None, 0, 4, 5, -1, "0"],
    "own_ops": [True, False],
}))
def test_export_raises_only_what_it_documents(name, drawn):
    model = _fresh(name)
    try:
        out = dyndq.export(model, **drawn)
    except (dyndq.ValidationError, dyndq.ExportError):
        pass
    except TypeError as e:  # (an argument of the wrong kind, named: "opset must be an int, not str")
        assert any(str(e).startswith(f"{k} must be ") for k in drawn), (name, drawn, e)
    else:
        assert dyndq.check(out) == [], (name, drawn)
    _unchanged(name, model)


@SETTINGS
@given(st.sampled_from(NAMES))
def test_lift_and_check_raise_only_what_they_document(name):
    model = _fresh(name)
    problems = dyndq.check(model)
    assert (problems != []) == (name == "invalid")
    try:
        lifted = dyndq.lift(model)
    except dyndq.ValidationError:
        assert name == "invalid"
    else:
        assert dyndq.check(lifted) == [] or name == "invalid"
    _unchanged(name, model)


def _feeds(draw, model: onnx.ModelProto) -> dict:
    """Feeds for the model's inputs: fitting ones (ids within the table), or one missing, one
    unknown, one of another dtype or rank."""
    feeds = {}
    for vi in model.graph.input:
        if vi.name == "ids":
            feeds["ids"] = np.array(draw(st.lists(st.integers(-8, 7), max_size=4)), np.int64)
        elif vi.name == "x":
            feeds["x"] = demo_input()
    mistake = draw(st.sampled_from([None, "missing", "unknown", "dtype", "rank"]))
    name = next(iter(feeds), None)
    if mistake == "missing" and name:
        del feeds[name]
    elif mistake == "unknown":
        feeds["nope"] = np.zeros(2, np.float32)
    elif mistake == "dtype" and name:
        feeds[name] = feeds[name].astype(np.float64)
    elif mistake == "rank" and name:
        feeds[name] = feeds[name][None]
    return feeds


@SETTINGS
@given(st.data(), st.sampled_from(NAMES), st.sampled_from(["reference", "onnxruntime"]),
       st.sampled_from([None, ["y"], ["nope"], ["h"], []]))
def test_run_raises_only_what_it_documents(data, name, engine, outputs):
    model = _fresh(name)
    feeds = _feeds(data.draw, model)
    try:
        dyndq.run(model, feeds, engine=engine, outputs=outputs)
    except dyndq.ValidationError:
        pass
    _unchanged(name, model)


def test_run_names_an_unknown_engine():
    with pytest.raises(ValueError, match="unknown engine 'x'"):
        dyndq.run(_fresh("demo"), {"x": demo_input()}, engine="x")
