"""Scale estimation written straight from its equations, one row and one group at a time: the yardstick
of dyndq/quantization/scale_estimation.py (tests/quantization/test_scale_estimation.py).

A row w of a weight of X @ W (the row of W^T along the reduction axis) dequantized to w' costs
(w - w') G (w - w')^T on the calibration rows, G = X^T X.  With its groups fitted one after the
other, group g (columns c, H = G[c, c]) with the other groups' errors d_h fixed costs

    E(d_g) = d_g H d_g^T + 2 d_g . b,    b = sum_{h != g} G[c, h] d_h^T

With the levels q fixed, dE/ds = 0 gives s = q'(H w_g + b) / (q' H q'), q' = q - z; with the zero
free, w'_g = s q - m 1 and (s, m) solve the 2 x 2 normal equations [q; -1] H [q; -1]^T (s, m) =
[q; -1] (H w_g + b); z = clamp(round(m / s)), then s again for that z.  The candidates are the
method's (s0, z0) (kept unless beaten), and s0 f for f in 1.05, 1.0, ..., 0.6 with z0 and
(asymmetric) with the zero that keeps the window's centre, each rounded and screened by the
error's diagonal part, sum_l H_ll d_l^2 + 2 d . b; then from the method's own refit (two rounds)
and from the three best screened candidates (ties to the earlier; three rounds, the first at the
candidate itself) rounds of (round, measure by the whole H, keep the best, refit).  Levels are
rounded as ONNX Runtime's matmul rule rounds them, against the scale as stored: clamp(roundf(w *
(1 / s) + z), 0, qmax) in float32 steps, written out here on its own.

With R < K calibration rows, G is damped first (`reference_damped`): G + lam m I, m the mean of G's
diagonal, lam = 0.25 (K / R - 1) (a ridge: the error d G d^T + lam m |d|^2, which a few rows, rank
R < K, cannot make blind to the directions they miss).
"""
from __future__ import annotations

import numpy as np

FACTORS = [1.0 - 0.05 * i for i in range(-1, 9)]
REFITS = 2


def _round_half_away(x: float) -> float:
    whole = np.trunc(x)
    return float(whole + np.sign(x)) if abs(x - whole) == 0.5 else float(np.round(x))


def _levels(w32: np.ndarray, stored, zero: float, qmax: int) -> np.ndarray:
    s = np.float32(stored)
    reciprocal = np.float32(1) / s if s != 0 else np.float32(0)
    out = np.zeros(len(w32), np.uint8)
    for i, x in enumerate(w32):
        v = np.float32(np.float32(x * reciprocal) + np.float32(zero))
        if np.isnan(v):
            continue
        out[i] = int(min(max(_round_half_away(float(v)), 0.0), qmax))
    return out


def _cost(w, h, b, levels, zero, stored) -> float:
    d = w - (levels.astype(np.float64) - float(zero)) * float(np.float32(stored))
    return float(d @ h @ d + 2.0 * d @ b)


def _refit(w, h, b, levels, zero, scale, qmax, symmetric):
    q = levels.astype(np.float64)
    a = h @ w + b
    if not symmetric:
        p = np.stack([q, -np.ones_like(q)])
        m2 = p @ h @ p.T
        det = m2[0, 0] * m2[1, 1] - m2[0, 1] * m2[1, 0]
        if det > 1e-12 * abs(m2[0, 0] * m2[1, 1]):
            s, m = np.linalg.solve(m2, p @ a)
            if s != 0 and np.isfinite(m / s):
                zero = float(min(max(_round_half_away(m / s), 0.0), qmax))
    centred = q - zero
    den = centred @ h @ centred
    if den > 0:
        fitted = (centred @ a) / den
        if np.isfinite(fitted):
            scale = fitted
    return scale, zero


def reference_damped(gram, rows: int, damping: float = 0.25) -> np.ndarray:
    """G + lam m I, lam = damping (K / rows - 1), m the mean of G's diagonal (G as it is where m is 0
    or rows >= K)."""
    g = np.asarray(gram, np.float64)
    k = g.shape[0]
    m = np.mean(np.diag(g))
    if m <= 0:
        return g
    lam = damping * (k / rows - 1)
    if lam <= 0:
        return g
    return g + lam * m * np.eye(k)


def reference_scale_estimation(w, gram, levels, zeros, scales, *, group: int, bits: int, symmetric: bool):
    """(levels [N, n_groups * group], zeros [N, n_groups], scales [N, n_groups]) refitted from the
    method's (`levels`, `zeros`, `scales`, the scales in their stored dtype) for rows `w` [N, K]."""
    w = np.asarray(w, np.float64)
    g_full = np.asarray(gram, np.float64)
    n, k = w.shape
    qmax = (1 << bits) - 1
    levels, zeros, scales = levels.copy(), zeros.copy(), scales.copy()
    dtype = scales.dtype
    for row in range(n):
        col_group = np.arange(k) // group
        d = w[row] - (levels[row, :k].astype(np.float64) - zeros[row, col_group]) * scales[row, col_group].astype(
            np.float32).astype(np.float64)
        for g in range(scales.shape[1]):
            c = np.arange(g * group, min((g + 1) * group, k))
            others = np.setdiff1d(np.arange(k), c)
            h = g_full[np.ix_(c, c)]
            b = g_full[np.ix_(c, others)] @ d[others]
            wg = w[row, c]
            w32 = wg.astype(np.float32)
            best = (levels[row, c].copy(), float(zeros[row, g]), scales[row, g])
            best_cost = _cost(wg, h, b, *best)
            s0 = float(np.float32(scales[row, g]))
            z0 = float(zeros[row, g])
            chains = [_refit(wg, h, b, best[0], z0, s0, qmax, symmetric)]
            starts = []
            for f in FACTORS:
                starts.append((s0 * f, z0))
                if not symmetric:
                    if s0 != 0:
                        centre = (qmax / 2.0 - z0) * s0
                        z = float(min(max(_round_half_away(qmax / 2.0 - centre / (s0 * f)), 0.0), qmax))
                    else:
                        z = z0
                    starts.append((s0 * f, z))
            tried = []
            for scale, zero in starts:
                stored = np.array(np.float32(scale)).astype(dtype)[()]
                lv = _levels(w32, stored, zero, qmax)
                e = wg - (lv.astype(np.float64) - zero) * float(np.float32(stored))
                screen = float(np.sum(np.diag(h) * e * e) + 2.0 * e @ b)
                tried.append((screen if np.isfinite(screen) else np.inf, (float(np.float32(stored)), zero)))
            order = sorted(range(len(tried)), key=lambda i: tried[i][0])  # (stable: ties to the earlier)
            chains = [(chains[0], REFITS)] + [(tried[i][1], REFITS + 1) for i in order[:3]]
            for (scale, zero), rounds in chains:
                for _ in range(rounds):
                    stored = np.array(np.float32(scale)).astype(dtype)[()]
                    lv = _levels(w32, stored, zero, qmax)
                    cost = _cost(wg, h, b, lv, zero, stored)
                    if cost < best_cost:
                        best_cost, best = cost, (lv, zero, stored)
                    scale, zero = _refit(wg, h, b, lv, zero, float(np.float32(stored)), qmax, symmetric)
            levels[row, c], zeros[row, g], scales[row, g] = best[0], best[1], best[2]
            d[c] = wg - (best[0].astype(np.float64) - best[1]) * float(np.float32(best[2]))
    return levels, zeros, scales
