"""The output error of a quantized model: both models run on the same seeded random inputs.

Inputs: a float input is drawn from N(0, 1); an integer input that is a Gather's indices
(token ids) is drawn uniformly over the rows of what it gathers from; another integer input
over its dtype's range, a bool one at random;
a dimension without a fixed size is DIM long.  Both models run on ONNX Runtime through
`dyndq.run`'s runner (the quantized one exported to standard ONNX first; its basic graph
optimizations only, so the dequantized weights are the graph's exactly).
"""
from __future__ import annotations

import numpy as np
import onnx

from dyndq.converters.onnx_types import spec_of_type
from dyndq.opdefs import dtypes
from dyndq.quantize.numerics import ErrorStats
from dyndq.quantize.report import OutputError
from dyndq.wording import first_line

DIM = 4
ENGINE = "onnxruntime"


def output_error(float_model: onnx.ModelProto, quantized: onnx.ModelProto, *, seed: int = 0) -> tuple[list[OutputError], str]:
    """(per output errors, how they were measured) or ([], why they were not)."""
    from dyndq.runner import Runner  # (not runner(): its cache would keep both sessions, weights and all)

    try:
        feeds = random_inputs(float_model, seed)
        want = Runner(float_model, ENGINE)(feeds)
        got = Runner(quantized, ENGINE)(feeds)
    except Exception as e:  # noqa: BLE001 - a model the engine cannot run, inputs it refuses: said, not raised
        return [], f"not measured: {first_line(e)}"
    errors = []
    for name, w in want.items():
        g = got[name]
        if not isinstance(w, np.ndarray) or w.dtype.kind != "f" and w.dtype.name != "bfloat16":
            continue
        stats = ErrorStats()
        stats.add(w.ravel(), g.ravel())
        errors.append(OutputError(name, stats.relative, stats.max_abs, stats.cosine))
    note = f"seeded random inputs, seed {seed}, {ENGINE}"
    return errors, note if errors else f"not measured: no float output ({note})"


def random_inputs(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    initializers = {t.name: t for t in model.graph.initializer}
    rows = _index_ranges(model, initializers)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        spec = spec_of_type(vi.type)
        if spec is None or spec.dtype is None or spec.shape is None:
            raise ValueError(f"graph input {vi.name!r} has no known dtype and rank")
        shape = tuple(d if isinstance(d, int) else DIM for d in spec.shape)
        dtype = dtypes.by_name(spec.dtype)
        if dtype.name == "bool":
            feeds[vi.name] = rng.random(shape) < 0.5
        elif dtype.is_integer:
            lo, hi = (0, rows[vi.name] - 1) if vi.name in rows else dtypes.integer_range(dtype)
            feeds[vi.name] = rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype.numpy)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32).astype(dtype.numpy)
    return feeds


def _index_ranges(model, initializers) -> dict[str, int]:
    """graph input -> how many rows the Gather it indexes has (the smallest, if several)."""
    rows: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in initializers:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = initializers[node.input[0]].dims
            n = dims[axis % len(dims)]
            rows[node.input[1]] = min(rows.get(node.input[1], n), n)
    return rows
