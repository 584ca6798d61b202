"""The output error of a quantized model: both models run on the same seeded random inputs.

The inputs are `dyndq.parity.example_feeds`'s (floats from N(0, 1), a Gather's indices over
the rows it gathers from, other integers in 0..3, booleans at random; a dimension without a
fixed size 4 long).  Both models run on ONNX Runtime through `dyndq.run`'s Runner (the
quantized one exported to standard ONNX first; its basic graph optimizations only, so the
dequantized weights are the graph's exactly).
"""
from __future__ import annotations

import numpy as np
import onnx

from dyndq.quantization.numerics import ErrorStats
from dyndq.quantization.report import OutputDifference
from dyndq.wording import first_line

ENGINE = "onnxruntime"


def output_error(float_model: onnx.ModelProto, quantized: onnx.ModelProto, *,
                 seed: int = 0) -> tuple[list[OutputDifference], str]:
    """(per output errors, how they were measured) or ([], why they were not)."""
    from dyndq.parity import example_feeds
    from dyndq.runner import Runner  # (not runner(): its cache would keep both sessions, weights and all)

    try:
        feeds = example_feeds(float_model, seed)
        want = Runner(float_model, ENGINE)(feeds)
        got = Runner(quantized, ENGINE)(feeds)
    except Exception as e:  # noqa: BLE001 - a model the engine cannot run, inputs it refuses: said, not raised
        return [], f"not measured: {first_line(e)}"
    errors, unbounded = [], []
    for name, w in want.items():
        g = got[name]
        if not isinstance(w, np.ndarray) or w.dtype.kind != "f" and w.dtype.name != "bfloat16":
            continue
        if not np.isfinite(w.astype(np.float32)).all():  # (an error against infinity or NaN means nothing)
            unbounded.append(name)
            continue
        stats = ErrorStats()
        stats.add(w.ravel(), g.ravel())
        errors.append(OutputDifference(name, stats.relative, stats.max_abs, stats.cosine))
    note = f"seeded random inputs, seed {seed}, {ENGINE}"
    if unbounded:
        note += f"; left out: {', '.join(unbounded)}, where the float model gives NaN or infinity"
    return errors, note if errors else f"not measured: no float output with finite values ({note})"
