"""Running one engine setting: ONNX Runtime at an optimization level (with transformers
disabled, session config entries), OpenVINO's CPU with a config; and the reference.

Each run returns name -> array for the names asked (the graph's outputs, or values inside it
exposed as outputs: `exposed`).  Each engine runs through dyndq's one runner of it, fed as `dyndq
run` feeds it (int4/uint4, bfloat16 included): `dyndq.ort_session.OrtSession`,
`dyndq.openvino_session.OpenVinoSession`, `dyndq.reference_session.ReferenceSession`.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx

from dyndq.openvino_session import ARITHMETIC as OPENVINO_EXACT  # noqa: F401  (the settings searched)
from dyndq.ort_session import LEVELS as ORT_LEVELS  # noqa: F401  (the levels compared)


@dataclass(frozen=True)
class Setting:
    """One engine setting to compare: the engine, its setting's name, and the export of a model
    holding our op that it runs (None: the model as given)."""

    engine: str  # "onnxruntime" | "openvino"
    name: str  # an ORT level, or "default" (OpenVINO)
    export: str | None = None

    def __str__(self) -> str:
        through = f" (export target {self.export})" if self.export else ""
        return f"{self.engine} {self.name}{through}"


@dataclass
class Tweak:
    """What a run changes from the setting: ORT transformers disabled, ORT session config entries,
    OpenVINO config entries, MatMulNBits nodes (by name) run at accuracy_level 0."""

    disabled: tuple[str, ...] = ()
    config: dict[str, str] = field(default_factory=dict)
    accuracy_0: tuple[str, ...] = ()


def exposed(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of `model` whose graph outputs are its own and then `names` (values inside the main
    graph), each typed as ONNX infers it where the model declares no type (engines want types)."""
    from dyndq.run_outputs import with_outputs

    outputs = [o.name for o in model.graph.output]
    extra = [n for n in names if n not in outputs]
    if not extra:
        return model
    try:
        typed = onnx.shape_inference.infer_shapes(model)
    except Exception:  # (over 2 GiB, or a model ONNX cannot infer: the outputs go untyped)
        typed = model
    return with_outputs(typed, outputs + extra)


def run_onnxruntime(model: onnx.ModelProto, level: str, feeds: Mapping[str, object], names: Sequence[str],
                    tweak: Tweak = Tweak(), optimized: list | None = None) -> dict[str, np.ndarray]:
    """`names` on ONNX Runtime at `level`; with `optimized` (a list), the graph it optimized is appended to it
    (without the Casts `OrtSession`'s boundary adds)."""
    from dyndq.ort_session import OrtSession

    with tempfile.TemporaryDirectory(prefix="dyndq-parity-") as folder:
        path = os.path.join(folder, "optimized.onnx") if optimized is not None else None
        session = OrtSession(model, level=level, optimized_model_path=path, disabled_optimizers=tweak.disabled,
                             config=tweak.config)
        values = dict(zip(names, session.run(list(names), feeds)))
        if path is not None:
            graph = onnx.load(path, load_external_data=False)
            kept = [n for n in graph.graph.node if n.name not in session.boundary.added]
            del graph.graph.node[:]
            graph.graph.node.extend(kept)
            optimized.append(graph)
    return values


def run_engine(engine: str, model: onnx.ModelProto, feeds: Mapping[str, object], names: Sequence[str],
               tweak: Tweak = Tweak(), properties: list | None = None) -> dict[str, np.ndarray]:
    """`names` on `engine`'s runner (any but ONNX Runtime, whose levels and transformers
    `run_onnxruntime` takes) with `tweak.config`; with `properties` (a list), the values the session
    holds for its `arithmetic_settings`' keys are appended to it as a dict."""
    from dyndq.runner import session_class

    session = session_class(engine)(model, config=tweak.config)
    if properties is not None:
        properties.append({k: session.property_text(k) for k in arithmetic_settings(engine)})
    return dict(zip(names, session.run(names, feeds)))


def run_openvino(model: onnx.ModelProto, feeds: Mapping[str, object], names: Sequence[str],
                 tweak: Tweak = Tweak(), properties: list | None = None) -> dict[str, np.ndarray]:
    """`names` on OpenVINO's CPU plugin with `tweak.config` (`run_engine`); with `properties`, the
    values the compiled model holds for OPENVINO_EXACT's keys."""
    return run_engine("openvino", model, feeds, names, tweak, properties)


def arithmetic_settings(engine: str) -> dict:
    """The engine's settings that change the arithmetic, each with the value that keeps float32
    exact (its runner module's ARITHMETIC: OpenVINO's), searched when it differs; {} for none."""
    from dyndq.runner import session_module

    return dict(getattr(session_module(engine), "ARITHMETIC", {}))


def run_reference(model: onnx.ModelProto, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Every value of the main graph on the reference engine (onnx.reference, with our kernel for our op
    and the exact lift of ONNX Runtime's contrib ops): the graph's exact meaning."""
    from dyndq.reference_session import ReferenceSession

    # (a model holding our op was checked by its export, which the check makes first)
    return ReferenceSession(model).values(feeds)
