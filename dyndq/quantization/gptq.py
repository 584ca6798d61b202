"""GPTQ: each weight's columns rounded one at a time, the error fed forward through the inverse Hessian.

Frantar, Ashkboos, Hoefler and Alistarh, "GPTQ: Accurate Post-Training Quantization for
Generative Pre-trained Transformers" (2022), Algorithm 1, on a weight W of X @ W, held here as
rows of its reduction axis K (W^T: [N, K], the paper's [d_row, d_col]):

    H = 2 X^T X over the calibration rows (activations.py: the sum of x^T x, doubled);
    a dead input channel (H_ii = 0: always 0 on the calibration data) gets H_ii = 1;
    H += damping * mean(diag H) * I;  U = the upper Cholesky factor of H^-1 (H^-1 = U^T U);
    for each column i in order (act_order: by decreasing H_ii):
        q_i = the column rounded with its group's scale and zero point;
        e = (w_i - q_i) / U_ii;  the columns after i in this block: w_j -= e * U_ij;
    after each block of `block_size` columns, the columns after it: W -= E @ U[block, after]
    (the paper's lazy batch: the same sums, fewer passes over W).

Where this differs from the paper's reference code, and why:
- a group's scale and zero point are rtn's (rtn.matmul_scales: ONNX Runtime's matmul rule) on
  the group's weights as they are when the first of its columns is reached, every update so
  far applied (the reference reads them from W as it stood at the start of the block when a
  group starts inside one); with act_order the groups are still the usual consecutive runs of
  the axis, so the codes, scales and zero points are written in the usual layout (the
  reference's act-order groups follow the permuted order and need a g_idx no op here reads);
- a dead channel's weights are kept (the reference sets them to 0): they are rounded with no
  error fed from them, so on inputs where that channel is not 0 the weight is still there;
- a column's codes are rtn's rule on the float32 of its updated weights (`matmul_levels`), so
  a weight no update moved gets rtn's very code; the error is measured against (q - z) * s
  with the scale as stored.

With scale estimation (scale_estimation.py), a group's scale and zero point are fitted to the
output error when the group is reached (`group_fit`), in place of rtn's.

Pure NumPy, float64 throughout; the cost is the column loop: about 2 N K^2 flops for the updates
plus a K^3 Cholesky and a triangular inverse per weight (the Hessian is the caller's: activations.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dyndq.quantization.numerics import QuantizedWeight, from_rows
from dyndq.quantization.rtn import Levels, matmul_levels, matmul_scales, qmax_of

DAMPING = 0.01
BLOCK_SIZE = 128


@dataclass(frozen=True)
class GptqSettings:
    damping: float = DAMPING  # times the mean of H's diagonal, added to it
    block_size: int = BLOCK_SIZE  # columns per lazy batch (changes the order of sums only)
    act_order: bool = False  # columns by decreasing H_ii


class NotPositiveDefinite(ValueError):
    """H + damping did not factor (damping too small for a nearly singular X^T X, or so large that
    it overflows)."""


def gptq_weight(weight: np.ndarray, gram: np.ndarray, *, axis: int, group_size: int, bits: int, symmetric: bool,
                scale_dtype, settings: GptqSettings = GptqSettings(), group_fit=None) -> QuantizedWeight:
    """2-D `weight` (reduction axis `axis`) quantized by GPTQ with the calibration rows' X^T X
    `gram` (K x K): numerics.QuantizedWeight in quantize_weight's layout.  `group_fit`: see gptq_levels."""
    weight = np.asarray(weight)
    rows = weight.T if axis == 0 else weight
    length = rows.shape[1]
    group = length if group_size == -1 else group_size
    q = gptq_levels(rows.astype(np.float64), gram, group=group, bits=bits,
                    symmetric=symmetric, scale_dtype=np.dtype(scale_dtype or weight.dtype), settings=settings,
                    group_fit=group_fit)
    return from_rows(np.ascontiguousarray(rows), q, weight.shape, axis, group, bits, symmetric)


def gptq_levels(w: np.ndarray, gram: np.ndarray, *, group: int, bits: int, symmetric: bool, scale_dtype,
                settings: GptqSettings = GptqSettings(), group_fit=None, factor=None) -> Levels:
    """Levels [N, n_groups * group] (the last group padded with level 0), zero levels and
    scales [N, n_groups] of rows `w` [N, K] (float64) for the calibration rows' X^T X `gram`
    [K, K] (the Hessian H = 2 X^T X is made by `factored`; see the module doc).
    `group_fit(current, columns)`: a group's (stored scales, float32 reciprocals, float32 zero
    levels) from its weights as updated when it is reached (`current` [N, length], float64;
    `columns` its indices in K) in place of rtn's (scale_estimation.gptq_group_fit).
    `factor`: `factored(gram, settings)` when the caller has it already."""
    n, k = w.shape
    n_groups = -(-k // group)
    qmax = np.float32(qmax_of(bits))
    order, u = factored(gram, settings) if factor is None else factor
    position = np.empty(k, np.int64)
    position[order] = np.arange(k)
    work = w[:, order].copy()  # (its columns in the order they are rounded)
    levels = np.zeros((n, n_groups * group), np.uint8)
    zeros = np.zeros((n, n_groups), np.uint8)
    scales = np.zeros((n, n_groups), scale_dtype)
    reciprocal = np.zeros((n, n_groups), np.float32)
    zero = np.zeros((n, n_groups), np.float32)
    reached = np.zeros(n_groups, bool)
    block = max(1, int(settings.block_size))
    for start in range(0, k, block):
        end = min(start + block, k)
        errors = np.zeros((n, end - start))
        for t in range(start, end):
            column = order[t]
            g = column // group
            if not reached[g]:  # (its scale from its weights now: the updates of this block so far applied)
                members = position[g * group:min((g + 1) * group, k)]
                current = work[:, members]
                later = members >= end  # (not yet given this block's errors: the lazy batch's pending part)
                if later.any():
                    current[:, later] -= errors[:, :t - start] @ u[start:t][:, members[later]]
                if group_fit is not None:
                    columns = np.arange(g * group, min((g + 1) * group, k))
                    scales[:, g], reciprocal[:, g], zero[:, g] = group_fit(current, columns)
                else:
                    stored, inverse, level_zero = matmul_scales(current.astype(np.float32)[:, None, :], bits,
                                                                symmetric, scale_dtype)
                    scales[:, g], reciprocal[:, g], zero[:, g] = stored[:, 0], inverse[:, 0], level_zero[:, 0]
                zeros[:, g] = zero[:, g]
                reached[g] = True
            x = work[:, t]
            with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
                level = matmul_levels(x.astype(np.float32)[:, None, None], reciprocal[:, g, None], zero[:, g, None],
                                      qmax)[:, 0, 0]
                value = (level.astype(np.float64) - zero[:, g]) * scales[:, g].astype(np.float64)
            levels[:, column] = level
            error = (x - value) / u[t, t]
            if not np.isfinite(error).all():  # (a scale its dtype cannot hold: numerics refuses it; no update)
                error = np.nan_to_num(error, nan=0.0, posinf=0.0, neginf=0.0)
            work[:, t + 1:end] -= np.outer(error, u[t, t + 1:end])
            errors[:, t - start] = error
        work[:, end:] -= errors @ u[start:end, end:]
    return Levels(levels, zeros, scales)


def factored(gram: np.ndarray, settings: GptqSettings = GptqSettings()) -> tuple[np.ndarray, np.ndarray]:
    """(the columns' order, U of the damped Hessian H = 2 `gram` in that order): what gptq_levels
    rounds with, computed once for two calls on the same Hessian (scale_estimation.gptq_weight_estimated)."""
    k = len(gram)
    diagonal = 2.0 * np.diag(np.asarray(gram, np.float64))  # (H's diagonal, a dead channel's made 1 below)
    dead = diagonal == 0
    diagonal[dead] = 1.0
    order = np.argsort(-diagonal, kind="stable") if settings.act_order else np.arange(k)
    # (the Hessian made as the factoriser's argument alone: it lets go of it once factored)
    return order, upper_inverse_cholesky(_hessian(gram, dead, order if settings.act_order else None, settings.damping))


def _hessian(gram: np.ndarray, dead: np.ndarray, order: np.ndarray | None, damping: float) -> np.ndarray:
    """H = 2 `gram` (rows and columns in `order`, None: as they are), a dead channel's H_ii 1, plus
    `damping` times the mean of its diagonal on it: one K x K float64 array made (module doc)."""
    h = np.array(gram, np.float64) if order is None else np.asarray(gram, np.float64)[np.ix_(order, order)]
    h *= 2.0
    dead = dead if order is None else dead[order]
    h[dead, dead] = 1.0
    k = len(h)
    with np.errstate(over="ignore"):  # (an overflow is refused by upper_inverse_cholesky, named)
        h[np.diag_indices(k)] += damping * np.mean(np.diag(h))
    return h


def upper_inverse_cholesky(h: np.ndarray) -> np.ndarray:
    """U, upper triangular, with H^-1 = U^T U (the paper's Cholesky form of the inverse Hessian),
    from one Cholesky factorisation and one triangular inverse: with J the reversal of the axis
    and J H J = M M^T (M lower), U = J M^-1 J (upper, and U^T U = J (J H J)^-1 J = H^-1), where
    inverting H and factoring the inverse would take a factorisation and an inverse more.  H is
    symmetric positive definite after damping, so nothing here takes a general (LU) inverse:
    M^-1 is `lower_inverse`'s, by blocks.  Passed `h` as its only reference (gptq_levels does),
    H is let go of once factored: at most about 2.5 K x K float64 arrays are held at once."""
    try:
        if not np.isfinite(h).all():  # (a damping of 1e308 times the diagonal's mean overflows)
            raise np.linalg.LinAlgError("not finite")
        lower = np.linalg.cholesky(h[::-1, ::-1])
        del h
        inverse = lower_inverse(lower)
        del lower  # (before the contiguous copy below: K x K float64 fewer at the peak)
        u = np.ascontiguousarray(inverse[::-1, ::-1])
        del inverse
        if not np.isfinite(u).all():
            raise np.linalg.LinAlgError("its inverse is not finite")
    except np.linalg.LinAlgError as e:
        raise NotPositiveDefinite(str(e)) from None
    return u


TRIANGLE_BLOCK = 64  # the order below which lower_inverse substitutes row by row


def lower_inverse(m: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The inverse of lower-triangular `m` with a nonzero diagonal (a Cholesky factor), exactly lower
    triangular, written into `out` (zeros, `m`'s shape; None: made): by halves, [[A, 0], [C, D]]^-1 =
    [[A^-1, 0], [-D^-1 C A^-1, D^-1]], the halves' own inverses by the same rule into their blocks of
    `out` down to TRIANGLE_BLOCK, then forward substitution one row at a time.  NumPy has no
    triangular inverse (LAPACK's trtri, which SciPy wraps, is not reached from it); written here so
    the work is matrix products (BLAS) rather than a general LU inverse."""
    n = m.shape[0]
    out = np.zeros_like(m) if out is None else out
    if n <= TRIANGLE_BLOCK:
        for i in range(n):  # (row i of M^-1: (e_i - M[i, :i] @ M^-1[:i, :]) / M[i, i])
            out[i, :i] = -(m[i, :i] @ out[:i, :i]) / m[i, i]
            out[i, i] = 1.0 / m[i, i]
        return out
    half = n // 2
    a_inv = lower_inverse(m[:half, :half], out[:half, :half])
    d_inv = lower_inverse(m[half:, half:], out[half:, half:])
    out[half:, :half] = -(d_inv @ (m[half:, :half] @ a_inv))
    return out
