"""converters/engines.py, the engine table: every list of engines derives from its rows (export's
targets, quantize's --emit forms, the forms a written file is checked as, the engines parity compares
and dyndq.run runs, the CLI's choices, the tests' runners), and every runner a row names exists."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import engines as test_engines
from dyndq.cli import build_parser
from dyndq.converters.engines import ENGINES, compared
from dyndq.runner import SESSIONS, session_class, session_module

ROWS = tuple(ENGINES)  # ("onnx", "onnxruntime", "openvino")
RUNNERS = {r for e in ENGINES.values() for r in (e.runner, *e.loads_on)}


def _choices(command: str, option: str) -> tuple:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return tuple(next(a for a in sub._actions if option in a.option_strings).choices)


def test_every_list_of_engines_is_the_tables():
    from dyndq.converters.rules import TARGETS
    from dyndq.ort_session import LEVELS
    from dyndq.parity import ENGINES as PARITY
    from dyndq.quantization import EMITS
    from dyndq.runner import ENGINES as RUN
    from dyndq.written import FORMS

    assert TARGETS == ROWS == ("onnx", "onnxruntime", "openvino")
    assert EMITS == ("dyndq", *ROWS, "onednn-json") and FORMS == ("dyndq", *ROWS)
    assert PARITY == tuple(compared()) == ("onnxruntime", "openvino")
    assert compared() == {"onnxruntime": ("onnx", "onnxruntime"), "openvino": ("openvino",)}
    assert RUN == tuple(e.runner for e in ENGINES.values() if not e.deviations) == ("reference", "onnxruntime")
    assert _choices("export", "--target") == ROWS
    assert _choices("quantize", "--emit") == EMITS
    assert _choices("check", "--engine") == (*PARITY, "all")
    assert _choices("run", "--engine") == RUN
    assert _choices("check", "--level") == LEVELS
    assert set(test_engines.RUNNERS) == RUNNERS


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_every_runner_a_row_names_is_registered_with_its_parts(runner):
    module = session_module(runner)
    assert SESSIONS[runner].startswith(module.__name__ + ".") and callable(session_class(runner))
    assert callable(module.user_session) and module.INSTALL and isinstance(module.installed(), bool)
    if module.installed():
        assert module.version()


def test_a_written_file_loads_first_on_the_runner_of_its_target_but_standard_onnx():
    """Standard ONNX is checked on ONNX Runtime first (the engine most users load it in), onnx.reference
    where ONNX Runtime has no kernel for an op of it; every other target on its own engine."""
    assert {name: e.loads_on for name, e in ENGINES.items()} == {
        "onnx": ("onnxruntime", "reference"), "onnxruntime": ("onnxruntime",), "openvino": ("openvino",)}
    assert all(e.loads_on[0] == e.runner for name, e in ENGINES.items() if name != "onnx")


def _dequantize_linear():
    x = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    scale = np.linspace(0.01, 3, 16).astype(np.float32)
    graph = helper.make_graph([helper.make_node("DequantizeLinear", ["x", "scale"], ["y"], axis=1)], "dql",
                              [helper.make_tensor_value_info("x", TensorProto.INT8, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
                              [numpy_helper.from_array(scale, "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), {"x": x}


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_every_runner_runs_the_same_bits_through_the_tests_run_on(runner):
    """(A float32 DequantizeLinear: every engine's bits are the reference's; an engine not installed
    here is skipped, saying so.)"""
    if not session_module(runner).installed():
        pytest.skip(f"{runner} is not installed here: `make test-{runner}` installs it")
    model, feeds = _dequantize_linear()
    [want] = test_engines.run_on("reference", model, feeds)
    [got] = test_engines.run_on(runner, model, feeds)
    assert got.tobytes() == want.tobytes() and got.dtype == want.dtype


@pytest.mark.parametrize("engine", [e.runner for e in ENGINES.values() if not e.deviations])
def test_dyndq_run_runs_every_engine_without_deviations(engine):
    """A row without deviations is an engine of dyndq.run: the Runner must know how to run it."""
    import dyndq

    model, feeds = _dequantize_linear()
    [want] = test_engines.run_on("reference", model, feeds)
    assert dyndq.run(model, feeds, engine=engine)["y"].tobytes() == want.tobytes()
