"""Running one engine setting: ONNX Runtime at an optimization level (with transformers
disabled, session config entries), OpenVINO's CPU with a config; and the reference.

Each run returns name -> array for the names asked (the graph's outputs, or values inside it
exposed as outputs: `exposed`).  ONNX Runtime is fed through `dyndq.ort_session.OrtSession`, as
`dyndq run --engine onnxruntime` feeds it (int4/uint4, bfloat16 included).
"""
from __future__ import annotations

import io
import os
import tempfile
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np
import onnx

ORT_LEVELS = ("off", "basic", "extended", "all")
# OpenVINO's CPU settings that change the arithmetic, each with the value that keeps float32 exact
# (measured on 2026.4: its bf16 inference hint and its dynamic quantization of activations each
# move an int4 MatMul's result on their own).
OPENVINO_EXACT = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


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
    OpenVINO config entries."""

    disabled: tuple[str, ...] = ()
    config: dict[str, str] = field(default_factory=dict)


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


def openvino_installed() -> bool:
    try:
        import openvino  # noqa: F401
    except ImportError:
        return False
    return True


def openvino_version() -> str:
    import openvino

    return openvino.get_version()


def run_openvino(model: onnx.ModelProto, feeds: Mapping[str, object], names: Sequence[str],
                 tweak: Tweak = Tweak(), properties: list | None = None) -> dict[str, np.ndarray]:
    """`names` on OpenVINO's CPU plugin with `tweak.config`; with `properties` (a list), the values the
    compiled model holds for OPENVINO_EXACT's keys are appended to it as a dict."""
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(io.BytesIO(model.SerializeToString())), "CPU", dict(tweak.config))
    if properties is not None:
        properties.append({k: _property_text(compiled.get_property(k)) for k in OPENVINO_EXACT})
    request = compiled.create_infer_request()
    request.infer({name: _openvino_feed(value) for name, value in feeds.items()})
    return {name: _openvino_value(request.get_tensor(name)) for name in names}


def _property_text(value) -> str:
    """A property as OpenVINO's config takes it ("bf16", not "<Type: 'bfloat16'>")."""
    return value.to_string() if hasattr(value, "to_string") else str(value)


def _openvino_feed(value):
    """NumPy's own dtypes as they are; bfloat16 as an OpenVINO bf16 tensor over its bits (OpenVINO
    takes no ml_dtypes array).  (int4 feeds: as their bytes, packed the way ONNX packs them.)"""
    import openvino as ov

    value = np.ascontiguousarray(value)
    if value.dtype.name == "bfloat16":
        return ov.Tensor(value.view(np.uint16).copy(), list(value.shape), ov.Type.bf16)
    if value.dtype.name in ("int4", "uint4"):
        packed = np.frombuffer(onnx.numpy_helper.from_array(value).raw_data, np.uint8).copy()
        return ov.Tensor(packed, list(value.shape), ov.Type.i4 if value.dtype.name == "int4" else ov.Type.u4)
    return value


def _openvino_value(tensor) -> np.ndarray:
    import ml_dtypes

    kind = tensor.element_type.get_type_name()
    if kind == "bf16":
        return np.array(tensor.data, copy=True).view(np.uint16).view(ml_dtypes.bfloat16).reshape(list(tensor.shape))
    return np.array(tensor.data, copy=True).reshape(list(tensor.shape))


def run_reference(model: onnx.ModelProto, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Every value of the main graph on the reference engine (onnx.reference, with our kernel for our op
    and the exact lift of ONNX Runtime's contrib ops): the graph's exact meaning."""
    from dyndq.reference import reference_evaluator, runnable_model

    # (a model holding our op was checked by its export, which the check makes first)
    evaluator = reference_evaluator(runnable_model(model))
    values = evaluator.run(None, dict(feeds), intermediate=True)
    return {k: v for k, v in values.items() if isinstance(v, np.ndarray)}
