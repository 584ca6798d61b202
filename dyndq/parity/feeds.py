"""The inputs a parity check runs on: the user's, and example values for the rest."""
from __future__ import annotations

import numpy as np
import onnx

from dyndq import example_inputs
from dyndq.example_inputs import OPEN_DIM


class ExamplesDoNotFit(ValueError):
    """An engine failed while running the model on example inputs made up for it (a model
    whose open dims must relate, say one twice another, needs inputs given); the engine's error
    is the cause."""

    def __init__(self, names: list[str]):
        super().__init__(f"the engine failed on the example inputs made for {', '.join(map(repr, names))} (dims "
                         f"the model leaves open take {OPEN_DIM}; give inputs that fit with --input NAME=FILE.npy)")
        self.names = names


def example_feeds(model: onnx.ModelProto, seed: int = 0, skip=()) -> dict[str, np.ndarray]:
    """One array per graph input (not an initializer, nor named in `skip`), drawn with `seed` as
    `dyndq.example_inputs` draws them (the same as quantize's evaluation)."""
    return example_inputs.example_feeds(model, np.random.default_rng(seed), skip)
