"""The reference engine, the one runner of it: `ReferenceSession(model)`, fed and read one way.

ONNX's `ReferenceEvaluator` with our kernel for our ops (`dyndq.reference`), on the model as the
reference engine runs it (`runnable_model`: ONNX Runtime's contrib ops through their exact lift).
`dyndq.run(engine="reference")`, `dyndq.runtime_parity`'s meaning of a model and the check of a
written file make their evaluators here; NumPy arrays of every dtype go in and come out as they
are (ml_dtypes' int4, bfloat16, float8 ... included).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx


class ReferenceSession:
    """The reference engine made ready for one model: `run(names, feeds)`, `values(feeds)`.
    Making it raises what the engine refuses (`dyndq.reference.NotRunnable` names a node of a
    domain it cannot run); our nodes are not judged here (`dyndq.check` does that)."""

    def __init__(self, model: onnx.ModelProto):
        from dyndq.reference import reference_evaluator, runnable_model

        self.evaluator = reference_evaluator(runnable_model(model))

    def run(self, names: Sequence[str] | None, feeds: Mapping[str, object]) -> list:
        """The values `names` (None: the graph's outputs) on `feeds`."""
        return self.evaluator.run(None if names is None else list(names), dict(feeds))

    def values(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Every tensor value of the main graph on `feeds` (inputs, initializers, each node's outputs)."""
        values = self.evaluator.run(None, dict(feeds), intermediate=True)
        return {k: v for k, v in values.items() if isinstance(v, np.ndarray)}


INSTALL = "pip install onnx"  # (a dependency of dyndq: installed with it)


def version() -> str:
    return onnx.__version__


def installed() -> bool:
    """The reference engine is onnx's own: always here."""
    return True


def user_session(source) -> ReferenceSession:
    """The reference engine's session of a model (or a model file), as `dyndq.run` makes it."""
    if not isinstance(source, onnx.ModelProto):
        from dyndq.model_files import load_model

        source = load_model(source)
    return ReferenceSession(source)
