"""dyndq.task_metrics: top-1 agreement and KL divergence, worked by hand for each kind."""
import numpy as np
import pytest

from dyndq.task_metrics import row_sums


def _kl(p, q):
    return float(np.sum(p * np.log(p / q)))


def test_logits_log_distributions_and_distributions_give_one_answer():
    logits = np.array([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]])
    other = np.array([[1.0, 2.0, 0.0], [0.0, 0.0, 5.0]])
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    q = np.exp(other) / np.exp(other).sum(-1, keepdims=True)
    want = _kl(p[0], q[0]) + _kl(p[1], q[1])
    for kind, a, b in (("logits", logits, other), ("log-distribution", np.log(p), np.log(q)), ("distribution", p, q)):
        agree, rows, kl = row_sums(a, b, kind)
        assert (agree, rows) == (1, 2), kind
        assert kl == pytest.approx(want, rel=1e-9), kind
    assert row_sums(logits, logits, "logits") == (2, 2, 0.0)


def test_a_distribution_with_a_zero_stays_finite():
    # (an engine's zero where the reference has mass: KL against an exact 0 would be infinite)
    agree, rows, kl = row_sums(np.array([0.5, 0.5]), np.array([1.0, 0.0]), "distribution")
    assert (agree, rows) == (1, 1) and np.isfinite(kl) and kl > 10


def test_an_unknown_kind_is_named():
    with pytest.raises(ValueError, match="kind: found 'probabilities'; allowed: logits, log-distribution, distribution"):
        row_sums(np.zeros((1, 2)), np.zeros((1, 2)), "probabilities")
