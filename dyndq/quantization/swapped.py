"""A float model run with some of its weights swapped for others: the one measure of "the output
error with only that weight quantized" that quantize's budget (its sensitivities) and verify's
blame (which weight moved the outputs) both take.

The weights named become graph inputs (`plumbing.light.initializers_as_inputs`), so one session
serves every swap: each run feeds every one of them, its float value or the one swapped in.  A
weight can be swapped so when it is an initializer or a Constant node of the main graph (`held`).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from dyndq.plumbing.light import initializers_as_inputs
from dyndq.plumbing.walk import is_constant_node


def held(model: onnx.ModelProto) -> set[str]:
    """The names of the main graph's weights a swap can feed: its initializers and Constant nodes."""
    return {t.name for t in model.graph.initializer} | {n.output[0] for n in model.graph.node if is_constant_node(n)}


class Swapped:
    """`model` on `engine` with `floats` ({name: its float value}, each in `held(model)`) fed apart;
    call it with a sample's feeds and {name: the value swapped in} (the others get their float
    value).  `array_of` reads the other initializers whose data is on disk (a model read without its
    external data).  Raises what the engine raises when it cannot run the model."""

    def __init__(self, model: onnx.ModelProto, floats: dict, engine: str = "onnxruntime",
                 array_of=numpy_helper.to_array):
        from dyndq.runner import Runner

        probe = initializers_as_inputs(model, set(floats))
        if probe is not model:
            for t in probe.graph.initializer:
                if t.data_location == onnx.TensorProto.EXTERNAL:
                    t.CopyFrom(numpy_helper.from_array(array_of(t), t.name))
        self.floats = dict(floats)
        self.engine = engine
        self.session = Runner(probe, engine)

    def __call__(self, feed: dict, swapped: dict | None = None) -> dict[str, np.ndarray]:
        return self.session({**feed, **self.floats, **(swapped or {})})


def is_float_output(v) -> bool:
    """A finite float tensor (bfloat16 too): an output whose error is summed."""
    return isinstance(v, np.ndarray) and (v.dtype.kind == "f" or v.dtype.name == "bfloat16") and np.isfinite(
        v.astype(np.float32)).all()
