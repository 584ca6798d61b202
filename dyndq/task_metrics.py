"""What a task sees of two outputs whose last axis is logits or a distribution: how many rows keep
their top-1 answer, and KL(reference || other) between the rows' distributions.  One piece for
`check --runtime-parity` (an engine against the model's meaning) and quantize's evaluation (the
quantized model against the float one).

kind: "logits" (the distributions are their softmax), "log-distribution" (a LogSoftmax's: the
log-probabilities themselves), "distribution" (a Softmax's: rows renormalized after negatives are
clipped, since an engine's rows sum to 1 within rounding only, and a probability floored at 1e-12,
since KL against an exact 0 is infinite).
"""
from __future__ import annotations

import numpy as np

KINDS = ("logits", "log-distribution", "distribution")
FLOOR = 1e-12  # the smallest probability a distribution's row is taken to hold


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
