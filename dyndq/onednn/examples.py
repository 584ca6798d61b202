"""`example_inputs(model, seed)`: one array per graph input, with values a real run could see.

What an input is for decides its values: each oneDNN kind's handler holds the rule for
its inputs (`Handler.example`: a dequantization's scales and zero points, a divisor, the
src of Sqrt ...), and an input no rule speaks for gets the default: a random mask for
bool, integers over the dtype's whole range, N(0, 1) for floats (activations).  The op
an input feeds is read from the ops' metadata (models made by `load`) or, for other
models, from the node through the handlers' inverse table.  The same seed gives the
same arrays.
"""
from __future__ import annotations

import json

import numpy as np
import onnx

from dyndq.converters.onnx_types import spec_of_type
from dyndq.onednn.kinds import KINDS, inverse_table
from dyndq.opdefs import dtypes



def _roles(model: onnx.ModelProto) -> dict[str, tuple[str, int, list[str]]]:
    """graph value name -> (oneDNN kind, input index, the op's input names)."""
    inverse = inverse_table()
    roles: dict[str, tuple[str, int, list[str]]] = {}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        if "onednn.op" in meta:
            entry = json.loads(meta["onednn.op"])
            names = entry.get("input_names", [])
            for i, name in enumerate(names):
                roles.setdefault(name, (entry["kind"], i, names))
        elif node.op_type in inverse and "onednn.id" not in meta:
            for i, name in enumerate(node.input):
                roles.setdefault(name, (inverse[node.op_type].kind, i, list(node.input)))
    return roles


class Draw:
    """What an example-input rule draws with: one input's dtype and shape, and the dtypes of the
    other inputs of the op it feeds."""

    def __init__(self, rng, dtype: dtypes.DType, shape, names: list[str], specs: dict):
        self.rng, self.dtype, self.shape, self.names, self.specs = rng, dtype, shape, names, specs

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def input_dtype(self, i: int) -> dtypes.DType | None:
        spec = self.specs.get(self.names[i]) if i < len(self.names) else None
        return dtypes.by_name(spec.dtype) if spec is not None and spec.dtype else None

    def integers(self, lo=None, hi=None) -> np.ndarray:
        a, b = dtypes.integer_range(self.dtype)
        lo, hi = max(a, lo if lo is not None else a), min(b, hi if hi is not None else b)
        draw = np.int16 if self.dtype.bits <= 8 else np.int64  # a quarter of the memory for the big int4 weights
        return self.rng.integers(lo, hi + 1, size=self.shape, dtype=draw).astype(self.dtype.numpy)

    def floats(self, lo=None, hi=None) -> np.ndarray:
        values = self.rng.standard_normal(self.shape) if lo is None else self.rng.uniform(lo, hi, size=self.shape)
        return values.astype(np.float32).astype(self.dtype.numpy)

    def full(self, value) -> np.ndarray:
        return np.full(self.shape, value, np.float32).astype(self.dtype.numpy)


def example_input(rng, dtype: dtypes.DType, shape, role, specs) -> np.ndarray:
    kind, index, names = role if role else (None, None, [])
    if dtype.name == "bool":
        return rng.random(shape) < 0.5
    draw = Draw(rng, dtype, shape, names, specs)
    rule = KINDS[kind].example if kind in KINDS else None
    value = rule(index, draw) if rule is not None else None
    if value is not None:
        return value
    return draw.integers() if dtype.is_integer else draw.floats()


def example_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """name -> array for every graph input that is not an initializer (see the module doc)."""
    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    specs = {vi.name: spec_of_type(vi.type) for vi in model.graph.input}
    roles = _roles(model)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        spec = specs[vi.name]
        if spec is None or spec.dtype is None or spec.shape is None or not all(isinstance(d, int) for d in spec.shape):
            raise ValueError(f"graph input {vi.name!r}: {spec}: example inputs need a known dtype and shape")
        feeds[vi.name] = example_input(rng, dtypes.by_name(spec.dtype), tuple(spec.shape), roles.get(vi.name), specs)
    return feeds
