"""Example inputs made up for a model: what `check --runtime-parity` and `quantize`'s evaluation
run a model on where the user gives no inputs (one piece for both, so that both draw alike).

Floats are drawn from N(0, 1), booleans at random, integers that reach a Gather's indices
(directly or through Cast, Reshape, Unsqueeze, Squeeze, Flatten, Identity) across the rows of
the table they index (token ids across an embedding's vocabulary), other integers in 0..3; a
dimension without a fixed size (`plumbing.types.open_dim`: a symbol, none, or -1 as exporters
such as paddle2onnx write a dynamic one) is OPEN_DIM long; a dim_value of 0 is a fixed, empty one.
"""
from __future__ import annotations

import numpy as np
import onnx

from dyndq.opdefs import dtypes

OPEN_DIM = 4  # the size of a dimension the model leaves open
OTHER_INTEGERS = 4  # an integer input that indexes no table: 0..3
PASS_INDICES = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")  # ops that keep an index an index


def example_feeds(model: onnx.ModelProto, rng: np.random.Generator, skip=(), cover_ends: bool = False,
                  bounds: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """One array per graph input (not an initializer, nor named in `skip`), drawn from `rng` as
    the module doc says; `cover_ends`: an index input holds its table's first and last row too.
    `bounds`: `index_bounds(model)`, when the caller has it already."""
    from dyndq.plumbing.types import open_dim, spec_of_type

    initializers = {t.name for t in model.graph.initializer}
    bounds = index_bounds(model) if bounds is None else bounds
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers or vi.name in skip:
            continue
        spec = spec_of_type(vi.type)
        if spec is None or spec.dtype is None:
            raise ValueError(f"graph input {vi.name!r}: its type is not a known tensor type; give it with --input")
        shape = tuple(OPEN_DIM if open_dim(d) else d for d in (spec.shape or ()))
        kind = dtypes.by_name(spec.dtype)
        if kind.name == "bool":
            feeds[vi.name] = rng.random(shape) < 0.5
        elif kind.is_integer:
            rows = bounds.get(vi.name, OTHER_INTEGERS)
            ids = rng.integers(0, rows, shape)
            if cover_ends and vi.name in bounds and ids.size:
                ids.flat[0], ids.flat[-1] = 0, rows - 1
            feeds[vi.name] = ids.astype(kind.numpy)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32).astype(kind.numpy)
    return feeds


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """graph input -> the rows of the smallest table whose Gather (or GatherBlockQuantized) it
    indexes (main graph), through the ops that keep an index an index (PASS_INDICES)."""
    from dyndq.scopes import value_types

    spec = value_types(model).specs_at("main")
    made_by = {o: n for n in model.graph.node for o in n.output}
    inputs = {vi.name for vi in model.graph.input}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type not in ("Gather", "GatherBlockQuantized") or len(node.input) < 2:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        axis = attrs.get("axis" if node.op_type == "Gather" else "gather_axis", 0)
        data = spec(node.input[0])
        if data is None or data.shape is None or not -len(data.shape) <= axis < len(data.shape):
            continue
        rows = data.shape[axis]
        name = node.input[1]
        while name not in inputs and name in made_by and made_by[name].op_type in PASS_INDICES:
            name = made_by[name].input[0]
        if isinstance(rows, int) and rows > 0 and name in inputs:
            bounds[name] = min(bounds.get(name, rows), rows)
    return bounds
