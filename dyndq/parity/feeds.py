"""The inputs a parity check runs on: the user's, and example values for the rest."""
from __future__ import annotations

import numpy as np
import onnx

from dyndq.opdefs import dtypes

# A dimension the model leaves open (a symbol such as "batch" or "seq") takes this size in the example inputs.
OPEN_DIM = 4


class ExamplesDoNotFit(ValueError):
    """An engine failed while running the model on example inputs made up for it (a model
    whose open dims must relate, say one twice another, needs inputs given); the engine's error
    is the cause."""

    def __init__(self, names: list[str]):
        super().__init__(f"the engine failed on the example inputs made for {', '.join(map(repr, names))} (dims "
                         f"the model leaves open take {OPEN_DIM}; give inputs that fit with --input NAME=FILE.npy)")
        self.names = names


def example_feeds(model: onnx.ModelProto, seed: int = 0, skip=()) -> dict[str, np.ndarray]:
    """One array per graph input (not an initializer, nor named in `skip`): dims the model leaves open take OPEN_DIM;
    floats are drawn from N(0, 1); integers that index a Gather (or GatherBlockQuantized) lie in
    the range of the axis they index, other integers in 0..3; booleans are random."""
    from dyndq.plumbing.types import spec_of_type
    from dyndq.scopes import value_types

    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    spec = value_types(model).specs_at("main")
    bounds = _index_bounds(model, spec)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers or vi.name in skip:
            continue
        s = spec_of_type(vi.type)
        if s is None or s.dtype is None:
            raise ValueError(f"graph input {vi.name!r}: its type is not a known tensor type; give it with --input")
        shape = tuple(d if isinstance(d, int) else OPEN_DIM for d in (s.shape or ()))
        kind = dtypes.by_name(s.dtype)
        if kind.name == "bool":
            feeds[vi.name] = rng.random(shape) < 0.5
        elif kind.is_integer:
            feeds[vi.name] = rng.integers(0, bounds.get(vi.name, 4), shape).astype(kind.numpy)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32).astype(kind.numpy)
    return feeds


def _index_bounds(model: onnx.ModelProto, spec) -> dict[str, int]:
    """input name -> the size of the axis it indexes, for inputs that are a Gather's indices."""
    bounds = {}
    for node in model.graph.node:
        if node.op_type not in ("Gather", "GatherBlockQuantized") or len(node.input) < 2:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        axis = attrs.get("axis" if node.op_type == "Gather" else "gather_axis", 0)
        data = spec(node.input[0])
        if data is not None and data.shape is not None and -len(data.shape) <= axis < len(data.shape):
            size = data.shape[axis]
            if isinstance(size, int) and size > 0:
                bounds[node.input[1]] = min(bounds.get(node.input[1], size), size)
    return bounds
