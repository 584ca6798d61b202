"""What a task sees of two outputs whose last axis is logits or a distribution: which outputs those
are (`output_kind`, the one judge), how many rows keep their top-1 answer, and KL(reference || other)
between the rows' distributions.  One piece for `check --runtime-parity` (an engine against the
model's meaning) and quantize's evaluation (the quantized model against the float one).

kind: "logits" (the distributions are their softmax), "log-distribution" (a LogSoftmax's: the
log-probabilities themselves), "distribution" (a Softmax's: rows renormalized after negatives are
clipped, since an engine's rows sum to 1 within rounding only, and a probability floored at 1e-12,
since KL against an exact 0 is infinite).
"""
from __future__ import annotations

import numpy as np
import onnx

KINDS = ("logits", "log-distribution", "distribution")
FLOOR = 1e-12  # the smallest probability a distribution's row is taken to hold
SUMS_TO_ONE = 1e-3  # how far from 1 a distribution's row may sum, in an engine's rounding
# the ops a language model's head (logits as long as the vocabulary) is made by
LOGIT_MAKERS = ("MatMul", "Gemm", "Add", "MatMulNBits", "Einsum")
# the ops that keep a value's values: an output is judged by what made it before them
_PASSING = ("Identity", "Reshape", "Squeeze", "Flatten")


def output_kind(model: onnx.ModelProto, name: str, values) -> str | None:
    """What the last axis of `name`, a value of the model's main graph, holds, judged on the model
    and on `values` (its arrays, one per sample): "distribution", "log-distribution", "logits", or
    None (neither, or no choice: rank 0, or one value on the last axis, or not floats).

    - "distribution": made by a Softmax over its last axis, or every row of every sample
      non-negative and summing to 1 (within SUMS_TO_ONE: a normalization by hand, or a Softmax
      behind an Identity);
    - "log-distribution": made by a LogSoftmax over its last axis, or every row's exp summing to 1
      (a LogSoftmax behind a Reshape);
    - "logits": its name says logits (taken at its word: a head cast, scaled or sliced is logits
      still), or it is made by MatMul, Gemm, Add, MatMulNBits or Einsum (through Identity, Reshape,
      Squeeze, Flatten) and as long on its last axis as an embedding has rows (a language model's
      head; a hidden state is made by the same ops).

    A Softmax or LogSoftmax over another axis makes neither of its last axis: its rows do not sum
    to 1 (before opset 13 the default axis, 1, flattens every axis from it on)."""
    arrays = [np.asarray(v) for v in values]
    if not arrays or not all(_floating(a) for a in arrays) or arrays[0].ndim == 0 or arrays[0].shape[-1] < 2:
        return None
    rows = [a.astype(np.float64) for a in arrays]
    made_by = {o: n for n in model.graph.node for o in n.output}
    node = made_by.get(name)
    if node is not None and node.op_type in ("Softmax", "LogSoftmax") and node.domain in ("", "ai.onnx"):
        if _over_last_axis(node, model, rows[0].ndim):
            return "distribution" if node.op_type == "Softmax" else "log-distribution"
    with np.errstate(all="ignore"):
        if all((r >= 0).all() and np.allclose(r.sum(axis=-1), 1.0, atol=SUMS_TO_ONE) for r in rows):
            return "distribution"
        if all((r <= 0).all() and np.allclose(np.exp(r).sum(axis=-1), 1.0, atol=SUMS_TO_ONE) for r in rows):
            return "log-distribution"
    if "logit" in name.lower():
        return "logits"
    while node is not None and node.op_type in _PASSING and node.input:
        node = made_by.get(node.input[0])
    if node is None or node.op_type not in LOGIT_MAKERS:
        return None
    from dyndq.example_inputs import index_bounds

    return "logits" if rows[0].shape[-1] in index_bounds(model).values() else None


def _over_last_axis(node: onnx.NodeProto, model: onnx.ModelProto, rank: int) -> bool:
    """Whether a Softmax or LogSoftmax normalizes along the last axis of its rank-`rank` output."""
    from dyndq.plumbing.opsets import ai_onnx_version

    opset = ai_onnx_version(model.opset_import) or 1
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
    return axis % rank == rank - 1 if -rank <= axis < rank else False


def _floating(a: np.ndarray) -> bool:
    """A float array, ml_dtypes' bfloat16 and float8 too (NumPy's kind of those is "V")."""
    from dyndq.opdefs import dtypes

    return a.dtype.name in {d.name for d in dtypes.DTYPES if d.is_float}


def row_sums(reference: np.ndarray, other: np.ndarray, kind: str) -> tuple[int, int, float]:
    """(rows whose top-1 index agrees, rows, KL(reference || other) summed over rows, in nats),
    rows along the last axis; summed, so that samples can be added up as they come."""
    p_rows = np.asarray(reference, np.float64).reshape(-1, np.shape(reference)[-1])
    q_rows = np.asarray(other, np.float64).reshape(-1, np.shape(other)[-1])
    log_p, log_q = _log_probabilities(p_rows, kind), _log_probabilities(q_rows, kind)
    p = np.exp(log_p)
    kl = float(np.sum(np.where(p > 0, p * (log_p - log_q), 0.0)))
    return int((p_rows.argmax(-1) == q_rows.argmax(-1)).sum()), p_rows.shape[0], kl


def _log_probabilities(rows: np.ndarray, kind: str) -> np.ndarray:
    if kind == "logits":
        shifted = rows - rows.max(-1, keepdims=True)
        return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    if kind == "log-distribution":
        return rows
    if kind == "distribution":
        p = np.maximum(np.clip(rows, 0, None), FLOOR)
        return np.log(p / p.sum(-1, keepdims=True))
    raise ValueError(f"kind: found {kind!r}; allowed: {', '.join(KINDS)}")
