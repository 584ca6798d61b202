"""GPTQ written straight from the paper's equations, as the yardstick of dyndq/quantization/gptq.py (tests/quantization/test_gptq.py).

Frantar et al. 2022, "GPTQ", section 3 (from Optimal Brain Quantization): with F the columns
not yet quantized and H_F^-1 the inverse Hessian over them, quantizing column q gives

    delta_F = -(w_q - quant(w_q)) / [H_F^-1]_qq * (H_F^-1)_{:, q}        (the update of the rest)
    H_{-q}^-1 = H^-1 - 1 / [H^-1]_qq * H^-1_{:, q} H^-1_{q, :}            (q removed, Gaussian elimination)

taken here literally: one column at a time, the explicit inverse updated after each, no
Cholesky factor and no lazy batch (both of which gptq.py uses: the same sums, in another
order).  H = 2 X^T X, a dead channel's H_ii = 1, damping times mean(diag) added; with act_order
the columns by decreasing H_ii.  quant() is the group's scale and zero point by rtn's matmul rule
(dyndq's rtn.matmul_scales: the scale rule is by definition rtn's) on the group's current weights
when its first column is reached, and round half away from zero in float32 steps, written out
here on its own.
"""
from __future__ import annotations

import numpy as np

from dyndq.quantization.rtn import matmul_scales


def reference_gptq(w: np.ndarray, x: np.ndarray, *, group: int, bits: int, symmetric: bool, scale_dtype="float32",
                   damping: float = 0.01, act_order: bool = False):
    """(levels [N, K], zero levels [N, n_groups], scales [N, n_groups]) of rows `w` [N, K] for
    calibration rows `x` [M, K]."""
    w = np.array(w, np.float64)
    n, k = w.shape
    n_groups = -(-k // group)
    qmax = (1 << bits) - 1
    x = np.asarray(x, np.float64)
    h = 2.0 * x.T @ x
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    h = h[np.ix_(order, order)]
    h += damping * np.mean(np.diag(h)) * np.eye(k)
    hinv = np.linalg.inv(h)
    work = w[:, order].copy()
    position = np.argsort(order)
    levels = np.zeros((n, k), np.int64)
    zeros = np.zeros((n, n_groups), np.float32)
    scales = np.zeros((n, n_groups), np.dtype(scale_dtype))
    recips = np.zeros((n, n_groups), np.float32)
    reached = np.zeros(n_groups, bool)
    for t in range(k):
        column = order[t]
        g = column // group
        if not reached[g]:
            members = position[g * group:min((g + 1) * group, k)]
            stored, reciprocal, zero = matmul_scales(work[:, members].astype(np.float32)[:, None, :], bits, symmetric,
                                                     np.dtype(scale_dtype))
            scales[:, g], recips[:, g], zeros[:, g] = stored[:, 0], reciprocal[:, 0], zero[:, 0]
            reached[g] = True
        y = work[:, t].astype(np.float32) * recips[:, g] + zeros[:, g]  # (float32 steps)
        y64 = y.astype(np.float64)
        rounded = np.sign(y64) * np.floor(np.abs(y64) + 0.5)  # (half away from zero; exact in float64)
        level = np.clip(np.nan_to_num(rounded), 0, qmax)
        levels[:, column] = level
        quantized = (level - zeros[:, g].astype(np.float64)) * scales[:, g].astype(np.float64)
        delta = (work[:, t] - quantized) / hinv[t, t]
        work -= np.outer(delta, hinv[t, :])  # (column t itself goes to its quantized value; it is not read again)
        hinv -= np.outer(hinv[:, t], hinv[t, :]) / hinv[t, t]
    return levels, zeros.astype(np.int64), scales
