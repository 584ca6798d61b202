"""`example_inputs(model, seed)`: one array per graph input, with values a real run could see.

What an input is for decides its values: the src of a dequantization gets integers
over its dtype's whole range; scales are small and positive; zero points lie in the
range of the src they are subtracted from (an u8 zp beside u4 weights stays in 0..15);
a Select's condition is a random mask and a one-element value it selects (an attention
mask's fill) is minus infinity; a divisor is positive (1 to 8, as sqrt(head size) is); the src of
Sqrt and Pow is non-negative (0 to 4);
other float inputs (activations) are drawn from N(0, 1).  The same seed gives the same
arrays.
"""
from __future__ import annotations

import json

import numpy as np
import onnx

from dyndq.converters.onnx_types import spec_of_type
from dyndq.opdefs import dtypes

_DEQUANTIZERS = {"DynamicDequantize", "Dequantize"}


def _roles(model: onnx.ModelProto) -> dict[str, tuple[str, int, list[str]]]:
    """graph value name -> (oneDNN kind, input index, the op's input names), from the ops' metadata
    (models made by `load`) or from the node itself (DynamicDequantize in any model)."""
    roles: dict[str, tuple[str, int, list[str]]] = {}
    for node in model.graph.node:
        meta = {p.key: p.value for p in node.metadata_props}
        if "onednn.op" in meta:
            entry = json.loads(meta["onednn.op"])
            names = entry.get("input_names", [])
            for i, name in enumerate(names):
                roles.setdefault(name, (entry["kind"], i, names))
        elif node.op_type in ("DynamicDequantize", "Where", "Div"):
            kind = {"Where": "Select", "Div": "Divide"}.get(node.op_type, node.op_type)
            for i, name in enumerate(node.input):
                roles.setdefault(name, (kind, i, list(node.input)))
    return roles


def _integers(rng, dtype: dtypes.DType, shape, lo=None, hi=None) -> np.ndarray:
    a, b = dtypes.integer_range(dtype)
    lo, hi = max(a, lo if lo is not None else a), min(b, hi if hi is not None else b)
    draw = np.int16 if dtype.bits <= 8 else np.int64  # a quarter of the memory for the big int4 weights
    return rng.integers(lo, hi + 1, size=shape, dtype=draw).astype(dtype.numpy)


def _floats(rng, dtype: dtypes.DType, shape, lo=None, hi=None) -> np.ndarray:
    values = rng.standard_normal(shape) if lo is None else rng.uniform(lo, hi, size=shape)
    return values.astype(np.float32).astype(dtype.numpy)


def example_input(rng, name: str, dtype: dtypes.DType, shape, role, specs) -> np.ndarray:
    kind, index, names = role if role else (None, None, [])
    if dtype.name == "bool":
        return rng.random(shape) < 0.5
    if kind in _DEQUANTIZERS and index == 2 and dtype.is_integer:
        src = specs.get(names[0]) if names else None
        src_row = dtypes.by_name(src.dtype) if src is not None and src.dtype else dtype
        lo, hi = dtypes.integer_range(src_row) if src_row.is_integer else (None, None)
        return _integers(rng, dtype, shape, lo, hi)
    if dtype.is_integer:
        return _integers(rng, dtype, shape)
    if kind in _DEQUANTIZERS and index == 1:
        return _floats(rng, dtype, shape, 2.0**-8, 2.0**-4)
    if kind == "Select" and index == 2 and int(np.prod(shape)) == 1:
        return np.full(shape, -np.inf, np.float32).astype(dtype.numpy)
    if kind in ("Sqrt", "Pow") and index == 0:  # real roots and powers of non-negative values
        return _floats(rng, dtype, shape, 0.0, 4.0)
    if kind == "Divide" and index == 1:
        return _floats(rng, dtype, shape, 1.0, 8.0)
    return _floats(rng, dtype, shape)


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
        feeds[vi.name] = example_input(rng, vi.name, dtypes.by_name(spec.dtype), tuple(spec.shape), roles.get(vi.name), specs)
    return feeds
