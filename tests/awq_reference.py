"""AWQ written again from the paper's equations, for tests/quantization/test_awq.py to compare
dyndq/quantization/awq.py with: no library's code, no X^T X shortcut, no graph.

Lin et al. 2023, "AWQ: Activation-aware Weight Quantization", section 3.2, on X [M, K] and W [K, N]:
    s = mean over rows of |x| per input channel, to the power alpha (floored at 1e-4 and divided by
        sqrt(max s * min s), as the authors' code does);
    alpha* = argmin over alpha in {0, 0.05, ..., 1} of ||X W - (X diag(1/s)) Q(diag(s) W)||^2,
        the activations themselves multiplied out (the first alpha of equal error);
    Q: round to nearest per group of `group` consecutive input channels of each output channel,
        ONNX Runtime's MatMul rule in float32 (lo = min(min, 0), hi = max(max, 0), scale = (hi - lo) /
        qmax, zero = roundf(-lo / scale), level = roundf(w * (1 / scale) + zero) clamped; symmetric:
        m = the signed extreme, scale = -m / half, zero = half).
1/s is what the graph multiplies X by, so it is taken as float32 holds it (r), and the weight
diag(1/r) W, rounded to float32, is what Q rounds.
"""
from __future__ import annotations

import numpy as np

ALPHAS = [i / 20 for i in range(21)]


def roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf: half away from zero (the fraction x - trunc(x) is exact)."""
    whole = np.trunc(x)
    return whole + np.sign(x) * (np.abs(x - whole) >= 0.5)


def rtn_columns(w: np.ndarray, bits: int, group: int, symmetric: bool):
    """(levels uint8 [K, N], zeros [K // group, N], scales float32 [K // group, N], values float32 [K, N])
    of float32 w [K, N] (K a multiple of group)."""
    f32 = np.float32
    k, n = w.shape
    qmax, half = f32(2 ** bits - 1), f32(2 ** (bits - 1))
    g = w.reshape(k // group, group, n)
    if symmetric:
        hi, lo = g.max(axis=1), g.min(axis=1)
        m = np.where(np.abs(hi) > np.abs(lo), hi, lo)
        scale = (-m / half).astype(f32)
        zero = np.full(scale.shape, half, f32)
    else:
        lo, hi = np.minimum(g.min(axis=1), f32(0)), np.maximum(g.max(axis=1), f32(0))
        scale = ((hi - lo) / qmax).astype(f32)
        zero = np.clip(roundf(f32(0) - lo / scale), 0, qmax).astype(f32)
    inverse = (f32(1) / scale).astype(f32)
    levels = np.clip(roundf((g * inverse[:, None, :]).astype(f32) + zero[:, None, :]), 0, qmax).astype(np.uint8)
    values = ((levels.astype(f32) - zero[:, None, :]) * scale[:, None, :]).astype(f32)
    return levels.reshape(k, n), zero.astype(np.uint8), scale, values.reshape(k, n)


def reference_awq(w: np.ndarray, x: np.ndarray, *, bits: int, group: int, symmetric: bool, alpha=None) -> dict:
    """alpha (the best, or the one given), s, r (float32), the levels, zeros, scales and values of
    diag(1/r) W, and every alpha's error (in ALPHAS' order)."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    mean = np.abs(x64).mean(axis=0)
    want = x64 @ w64
    group = w.shape[0] if group == -1 else group
    errors, chosen = [], {}
    for a in ALPHAS:
        s = np.maximum(mean ** a, 1e-4)
        s = s / np.sqrt(s.max() * s.min())
        r = (1 / s).astype(np.float32)
        scaled = (w64 / r.astype(np.float64)[:, None]).astype(np.float32)
        levels, zeros, scales, values = rtn_columns(scaled, bits, group, symmetric)
        got = (x64 * r.astype(np.float64)) @ values.astype(np.float64)
        errors.append(float(((want - got) ** 2).sum()))
        chosen[a] = dict(alpha=a, s=s, r=r, levels=levels, zeros=zeros, scales=scales, values=values)
    best = ALPHAS[int(np.argmin(errors))] if alpha is None else alpha
    return {**chosen[best], "errors": errors}
