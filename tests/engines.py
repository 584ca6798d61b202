"""The engines an export is for, each run one exact way, for tests: `run_onnxruntime` and
`run_openvino` take a ModelProto and NumPy feeds (ml_dtypes arrays for int4, bfloat16, float8 ...)
and return the graph's outputs as NumPy arrays of the graph's own output types; `run_on(engine,
...)` runs any runner the engine table names (`RUNNERS`, derived from it).

Each goes through dyndq's one runner of the engine (`dyndq.runner.SESSIONS`): ONNX Runtime through
`dyndq.ort_session.OrtSession` (see its `OrtBoundary` for how each type goes in and comes out),
OpenVINO through `dyndq.openvino_session.OpenVinoSession` (how each type goes in and comes out: its
module doc), the reference engine through `dyndq.reference_session.ReferenceSession`.  A test of a
runner itself checks it against an oracle of its own, and says so.

OpenVINO (an optional extra: `make test-openvino` installs it and runs the tests marked
`openvino`; elsewhere they are skipped, saying so) runs on its CPU plugin with its exact settings
(`OPENVINO_CONFIG`: f32 inference precision, no dynamic quantization, denormals left alone), and
an output of another type than the graph declares is refused.  What it computes is its own
(measured on 2026.4, CPU): float32 constants lose their subnormals and the sign of zero, int64 is
computed as int32, a float32 Sub of a constant followed by a Mul by one is fused into an fma, and
DequantizeLinear multiplies in its output type.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from dyndq.converters.engines import ENGINES
from dyndq.opdefs import dtypes
from dyndq.openvino_session import EXACT as OPENVINO_CONFIG  # (the tests' OpenVINO settings)

OPENVINO_MISSING = "OpenVINO is not installed: `make test-openvino` installs it and runs these tests"
# every runner the engine table names (each row's runner and those its files load on)
RUNNERS = tuple(dict.fromkeys([e.runner for e in ENGINES.values()] + [r for e in ENGINES.values() for r in e.loads_on]))


def run_on(engine: str, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], **settings) -> list:
    """The graph's outputs on `engine`'s runner (one of RUNNERS), made with its `settings`."""
    from dyndq.runner import session_class

    return session_class(engine)(model, **settings).run([o.name for o in model.graph.output], feeds)


def run_onnxruntime(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], level: str | None = None) -> list:
    """The graph's outputs on ONNX Runtime's CPU provider; `level` is the graph optimization level by
    the house's name ("off", "basic", "extended", "all"; None: "basic", as dyndq.run runs it)."""
    return run_on("onnxruntime", model, feeds, level=level or "basic")


def openvino_available() -> bool:
    """Whether OpenVINO imports (the package's own answer, the one `check --runtime-parity` goes by)."""
    from dyndq.openvino_session import installed

    return installed()


def needs_openvino() -> None:
    """Skip the calling test, saying why, where OpenVINO is not installed."""
    if not openvino_available():
        pytest.skip(OPENVINO_MISSING)


TORCH_MISSING = "torch and torchao are not installed (an optional extra): make test-torch installs them and runs this"


def needs_torch() -> None:
    """Skip the calling test, saying why, where torch or torchao is not installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchao") is None:
        pytest.skip(TORCH_MISSING)


def run_openvino(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list:
    """The graph's outputs on OpenVINO's CPU plugin, with OPENVINO_CONFIG, each of the graph's type."""
    got = run_on("openvino", model, feeds, config=OPENVINO_CONFIG)
    for vi, value in zip(model.graph.output, got):
        elem = vi.type.tensor_type.elem_type
        if value.dtype != dtypes.by_onnx(elem).numpy:
            raise RuntimeError(f"OpenVINO gives {vi.name} as {dtypes.of(value.dtype).onnx_name}, "
                               f"the graph says {TensorProto.DataType.Name(elem)}")
    return got
