"""Scale estimation: each group's scale and zero point refitted to the layer's output error on calibration data.

On top of an integer method (rtn, search, gptq; any method that writes integer codes per group):
for a weight W of X @ W, held as rows of its reduction axis K (W^T: [N, K]), a row's output
error on the calibration rows X is d X^T X d^T with d = w - w' (w' the dequantized row), so
what the scales are fitted to is G = X^T X (activations.py), not the weight error |d|^2.

Per group g of a row (columns c of the group, H = G[c, c], the group's block), with the codes'
levels q fixed and q' = q - z:

    the least-squares scale:   s = q'^T (H w_g + b) / (q'^T H q')
    with the zero point free:  w'_g = s q - m 1, (s, m) from the 2 x 2 normal equations of the
                               same error, then z = clamp(round(m / s)) and s refitted for it.

b is the pull of the other groups' errors on this one, b = sum over groups h != g of G[c, h] d_h:
the whole row's error, the other groups held fixed, is d_g^T H d_g + 2 d_g^T b + a constant, so
fitting each group in turn with b (one sweep over the groups, block coordinate descent on the full
X^T X) lowers the layer's error itself, not a per-group stand-in that drops the cross-group terms.
Inside GPTQ (`gptq_group_fit`) b is left out (b = 0): the errors of the groups before are already
fed into the weights the group is fitted on, and those of the groups after are GPTQ's to feed.

The search per group, vectorised over the rows (NNCF's scale estimation does the same kind of
search: a few rectifications of the initial scale, then a grid of candidate scales below it, kept
by the output error; it weights each channel by its mean |x| where this uses the full X^T X, and
keeps its zero points fixed):
  1. the method's own scale, zero point and codes (the incumbent: kept unless beaten);
  2. candidate scales s0 * f for f in FACTORS (s0: the method's scale), each with the method's zero
     point and (asymmetric) the zero point that keeps the window's centre: each stored in the
     scale dtype, the codes rounded against that stored scale (rtn's rounding, rtn.matmul_levels),
     and screened by the diagonal part of the error (sum of H_ll d_l^2 + 2 d . b, no product
     with H: on drawn layers, the same final error within 0.5% as measuring every candidate by
     the whole H, at 2 to 3 times less time);
  3. from the incumbent's refit and from each row's TOP best screened candidates, rounds of
     (store, round, measure by the whole H, refit) (REFITS refits after each chain's start);
  4. the group keeps the lowest error measured (strictly lower than the incumbent's to replace it).
Each measure is one product q'H (`_Fit`: the error and both fits are sums of it), 12 per group:
N L^2 flops each; the chains of stage 3 are measured a round at a time, stacked as rows of one
product (fewer, larger products: each row's sums are the ones it gets alone, bit for bit).
Every error is measured with the scale as stored (float16 and bfloat16 round the fitted value)
and the codes rounded against it, so what is written is what was measured, and the written
codes, scales and zero points are the method's choice bit for bit on every engine.  A layer's
output error on the calibration data is never above the method's without it, up to float64
rounding of the sums (each group's step can only lower the whole row's error; with GPTQ, `gptq_weight_estimated` keeps the lower of GPTQ
with and without it).

X^T X damped when the calibration rows are fewer than K (`damped`): what is fitted to is G + lam m
I, m the mean of G's diagonal and lam = DAMPING (K / rows - 1) (K the input's length, rows the
calibration rows summed into G), a ridge toward the weight error, as GPTQ damps its Hessian.  With
fewer rows than K, G has rank rows at most: a fit to it alone moves the groups' errors into the
directions no calibration row has, where a held-out input has some (drawn: 4 rows for K = 128, the
held-out error 1.1x to 1.7x rtn's undamped, below rtn's damped).  With as many rows as K or more, G
is fitted as it is (PP-OCR's gptq with scale estimation lost held-out accuracy to any damping
there).  DAMPING = 0.25 was chosen by held-out error on drawn layers (4 to 1024 rows for K = 256)
and checked on the trained models (docs/quantize.md, "Against the peers").  A caller giving no row
count (rows=None) fits G as it is.

A method that changes the weight before rounding it (AWQ's per-channel scales) takes scale
estimation by `refine_weight` on the weight it rounds, with the X^T X of what that weight is
multiplied by (diag(1/a) X^T X diag(1/a) for W diag(a)).

Integer codes only: MXFP4's shared power-of-two scales and NVFP4's E4M3 block scales with a
tensor scale are refused (options.py), not refitted.
"""
from __future__ import annotations

import numpy as np

from dyndq.quantization.gptq import factored, gptq_levels
from dyndq.quantization.numerics import ROUNDINGS, from_rows
from dyndq.quantization.rtn import Levels, half_of, matmul_levels, matmul_scales, qmax_of, round_half_away

FACTORS = tuple(1.0 - 0.05 * i for i in range(-1, 9))  # 1.05 down to 0.6 times the method's scale
DAMPING = 0.25  # lam = DAMPING * (K / rows - 1), rows < K: the ridge added to X^T X for the fit (`damped`, the module doc)
REFITS = 2  # rounds of (round against the stored scale, least-squares refit) from each chain of stage 2
TOP = 3  # each row's best screened candidates of stage 1 measured and refitted (beside the method's own)
STACKED = 1 << 20  # the most weights of stage 2's chains stacked at once (8 MiB a float64 copy)


def levels_of(q, bits: int, symmetric: bool) -> Levels:
    """A 2-D numerics.QuantizedWeight's levels [N, n_groups * group], zero levels and scales
    [N, n_groups] as rows of its reduction axis (gptq.py's layout)."""
    codes = np.asarray(q.codes)
    levels = codes.astype(np.int16) + (half_of(bits) if symmetric else 0)
    n_groups = q.scales.shape[q.axis]
    zeros = (np.full(q.scales.shape, half_of(bits), np.uint8) if symmetric
             else np.asarray(q.zero_points).astype(np.uint8))
    scales = np.asarray(q.scales)
    if q.axis == 0:
        levels, zeros, scales = levels.T, zeros.T, scales.T
    assert scales.shape[1] == n_groups
    return Levels(np.ascontiguousarray(levels.astype(np.uint8)), np.ascontiguousarray(zeros),
                  np.ascontiguousarray(scales))


def refine_levels(rows: np.ndarray, gram: np.ndarray, start: Levels, *, group: int, bits: int, symmetric: bool,
                  scale_dtype) -> Levels:
    """`start` (the method's levels of `rows` [N, K], float weights) with each group's scale and
    zero point refitted to the output error on `gram` (X^T X, [K, K]): one sweep over the groups,
    each fitted with the other groups' errors as they stand (see the module doc)."""
    w = np.asarray(rows, np.float64)
    g_full = np.asarray(gram, np.float64)
    n, k = w.shape
    levels, zeros, scales = start.levels.copy(), start.zeros.copy(), start.scales.copy()
    qmax = qmax_of(bits)
    diff = w - dequantized(levels[:, :k], zeros, scales, group)  # (every group's error as it stands)
    for g in range(scales.shape[1]):
        c0, c1 = g * group, min((g + 1) * group, k)
        h = g_full[c0:c1, c0:c1]
        pull = diff @ g_full[:, c0:c1] - diff[:, c0:c1] @ h  # (b: the other groups' errors through G)
        incumbent = (levels[:, c0:c1], zeros[:, g].astype(np.float32), scales[:, g])
        lv, z, s = fit_group(w[:, c0:c1], h, pull, incumbent, qmax=qmax, symmetric=symmetric, scale_dtype=scale_dtype)
        levels[:, c0:c1], zeros[:, g], scales[:, g] = lv, z.astype(np.uint8), s
        diff[:, c0:c1] = w[:, c0:c1] - (lv.astype(np.float64) - z.astype(np.float64)[:, None]) * _f64(s)[:, None]
    return Levels(levels, zeros, scales)


def damped(gram: np.ndarray, rows: int | None) -> np.ndarray:
    """What the groups are fitted to: X^T X plus DAMPING * (K / rows - 1) times the mean of its
    diagonal on the diagonal (the module doc); `gram` itself where `rows` is None, at least K, or
    its diagonal is all 0."""
    if rows is None:
        return gram
    g = np.asarray(gram, np.float64)
    k = len(g)
    mean = np.mean(np.diag(g)) if k else 0.0
    if not mean > 0:  # (no activation: nothing to fit to either way)
        return g
    lam = DAMPING * (k / max(int(rows), 1) - 1)
    if not lam > 0:  # (as many rows as K or more: G is of full rank, fitted as it is)
        return g
    return g + lam * mean * np.eye(k)


def dequantized(levels, zeros, scales, group: int) -> np.ndarray:
    """(level - zero) * scale in float64, [N, K] for levels [N, K]."""
    k = levels.shape[1]
    per_column = np.arange(k) // group
    return (levels.astype(np.float64) - zeros.astype(np.float64)[:, per_column]) * _f64(scales)[:, per_column]


def fit_group(w: np.ndarray, h: np.ndarray, pull, incumbent, *, qmax: int, symmetric: bool, scale_dtype):
    """(levels [N, L] uint8, zero levels [N] float32, scales [N] as stored) of one group's rows `w`
    [N, L] (float64) whose error d = w - w' costs d H d^T + 2 d . pull (`pull` None: 0), starting
    from the `incumbent` (levels, zero levels, stored scales), which is kept unless beaten."""
    scale_dtype = np.dtype(scale_dtype)
    h = (h + h.T) / 2.0  # (X^T X is symmetric; its sums may not be to the last bit)
    pull = np.zeros_like(w) if pull is None else pull
    fit = _Fit(w, h, pull, qmax, symmetric)
    w32 = w.astype(np.float32)
    inc_levels, inc_zero, inc_scale = incumbent
    best_levels = np.array(inc_levels, np.uint8)
    best_zero = np.asarray(inc_zero, np.float32).copy()
    best_scale = np.asarray(inc_scale).astype(scale_dtype)

    def keep(levels, zero, stored, error):
        nonlocal best_error
        better = error < best_error  # (a NaN or infinite error, a scale the dtype cannot hold, never is)
        if better.any():
            best_error = np.where(better, error, best_error)
            best_levels[better], best_zero[better], best_scale[better] = levels[better], zero[better], stored[better]

    best_error, *incumbent_refit = fit.measure(best_levels, best_zero, best_scale)
    s0, z0 = _f64(best_scale), best_zero.copy()
    # stage 1: every candidate window rounded against its stored scale and screened by the error's
    # diagonal part (sum of H_ll d_l^2 + 2 d . b: no product with H), cheaply
    diagonal = np.diag(h)
    screened, scales_tried, zeros_tried = [], [], []
    for scale, zero in _starts(s0, z0, qmax, symmetric):
        stored = _stored(scale, scale_dtype)
        d = w - (_rounded(w32, stored, zero, qmax).astype(np.float64) - zero.astype(np.float64)[:, None]) * _f64(
            stored)[:, None]
        with np.errstate(over="ignore", invalid="ignore"):
            screen = np.einsum("nl,l->n", d * d, diagonal) + 2.0 * np.einsum("nl,nl->n", d, pull)
        screened.append(np.where(np.isnan(screen), np.inf, screen))
        scales_tried.append(_f64(stored))
        zeros_tried.append(zero)
    # stage 2: from the method's own refit and each row's TOP best screened candidates, rounds of
    # (store, round, measure by the whole H, refit); each round of every chain in one stacked
    # product, then kept in the chains' order (as if run one chain after the other)
    ranked = np.argsort(np.stack(screened), axis=0, kind="stable")[:TOP]
    n = len(w)
    per_batch = max(1, STACKED // max(1, w.size))
    rows = np.arange(n)
    scales_tried, zeros_tried = np.stack(scales_tried), np.stack(zeros_tried)
    chains = [(incumbent_refit, REFITS)] + [((scales_tried[pick, rows], zeros_tried[pick, rows]), REFITS + 1)
                                            for pick in ranked]
    state = [start for start, _ in chains]
    measured = [[] for _ in chains]
    for step in range(max(rounds for _, rounds in chains)):
        active = [i for i, (_, rounds) in enumerate(chains) if rounds > step]
        for b0 in range(0, len(active), per_batch):
            batch = active[b0:b0 + per_batch]
            zero = np.concatenate([state[i][1] for i in batch])
            stored = _stored(np.concatenate([state[i][0] for i in batch]), scale_dtype)
            levels = _rounded(np.tile(w32, (len(batch), 1)), stored, zero, qmax)
            error, scale, new_zero = fit.measure(levels, zero, stored, copies=len(batch))
            for slot, i in enumerate(batch):
                part = slice(slot * n, (slot + 1) * n)
                measured[i].append((levels[part], zero[part], stored[part], error[part]))
                state[i] = (scale[part], new_zero[part])
    for chain in measured:
        for one in chain:
            keep(*one)
    return best_levels, best_zero, best_scale


def _starts(s0, z0, qmax, symmetric):
    """The candidate (scales, zero levels) of stage 1: the method's scale times each of FACTORS,
    with its zero levels and (asymmetric) with the zero levels keeping its window's centre."""
    for f in FACTORS:
        yield s0 * f, z0
        if not symmetric:  # (the window [-z s0, (qmax - z) s0] narrowed about its centre)
            centre = (qmax / 2.0 - z0.astype(np.float64)) * s0
            with np.errstate(divide="ignore", invalid="ignore"):
                z = np.where(s0 != 0, qmax / 2.0 - centre / (s0 * f), z0)
            yield s0 * f, np.clip(round_half_away(z), 0, qmax).astype(np.float32)


class _Fit:
    """One group's error and least-squares refit for given levels, from one product q H per call.

    With a = H w + b and c = w H w + 2 w . b per row, the error of w' = s q' (q' = q - z) is
    c - 2 s q'.a + s^2 q'H q'; the fits' sums for q or for another zero follow from q'H q',
    q'H 1 and q'.a (with 1H1, 1.a and c, fixed per group)."""

    def __init__(self, w, h, pull, qmax, symmetric):
        wh = w @ h
        self.h, self.qmax, self.symmetric = h, qmax, symmetric
        self.a = wh + pull
        self.c = np.einsum("nl,nl->n", wh, w) + 2.0 * np.einsum("nl,nl->n", w, pull)
        self.one_h_one = h.sum()
        self.a_one = self.a.sum(axis=1)

    def measure(self, levels, zero, stored, copies: int = 1):
        """(error of these levels, zero levels and stored scales; the refitted scale and zero level
        for these levels, a degenerate fit keeping the row's own); `copies` candidates of every
        row stacked (levels [copies * N, L]: one product for all, each row's sums its own)."""
        a, c, a_one = ((self.a, self.c, self.a_one) if copies == 1 else
                       (np.tile(self.a, (copies, 1)), np.tile(self.c, copies), np.tile(self.a_one, copies)))
        z, s = zero.astype(np.float64), _f64(stored)
        qc = levels.astype(np.float64) - z[:, None]  # (q' itself: codes and zero one higher give the very same sums)
        qch = qc @ self.h
        c_h_c, c_h_one, c_a = np.einsum("nl,nl->n", qch, qc), qch.sum(axis=1), np.einsum("nl,nl->n", qc, a)
        with np.errstate(over="ignore", invalid="ignore"):
            error = c - 2.0 * s * c_a + s * s * c_h_c
        new_zero = zero.astype(np.float32)
        if not self.symmetric:  # (w' = s q - m: the 2 x 2 normal equations in (s, m), then z = m / s rounded)
            q_h_one = c_h_one + z * self.one_h_one
            q_h_q = c_h_c + 2.0 * z * c_h_one + z * z * self.one_h_one
            q_a = c_a + z * a_one
            a12, a22 = -q_h_one, self.one_h_one
            det = q_h_q * a22 - a12 * a12
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                fs = (q_a * a22 + a12 * a_one) / det
                fm = (-q_h_q * a_one - a12 * q_a) / det
                ratio = np.where((det > 1e-12 * np.abs(q_h_q * a22)) & (fs != 0) & np.isfinite(fm / fs), fm / fs, z)
            new_zero = np.clip(round_half_away(ratio), 0, self.qmax).astype(np.float32)
        shift = z - new_zero.astype(np.float64)  # (q - z_new = q' + shift)
        numerator = c_a + shift * a_one
        denominator = c_h_c + 2.0 * shift * c_h_one + shift * shift * self.one_h_one
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            fitted = numerator / denominator
        return error, np.where((denominator > 0) & np.isfinite(fitted), fitted, s), new_zero


def _stored(scale: np.ndarray, scale_dtype) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(scale, np.float64).astype(np.float32).astype(scale_dtype)


def _f64(stored: np.ndarray) -> np.ndarray:
    return np.asarray(stored).astype(np.float32).astype(np.float64)


def reciprocal_of(stored: np.ndarray) -> np.ndarray:
    """The float32 reciprocal of the stored scale (0 for a zero scale): what codes are rounded with."""
    s = _f64(stored).astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(s != 0, np.float32(1) / s, np.float32(0)).astype(np.float32)


def _rounded(w32, stored, zero, qmax) -> np.ndarray:
    """rtn's codes of float32 rows `w32` [N, L] against the stored scales [N] and zero levels [N]."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return matmul_levels(w32[:, None, :], reciprocal_of(stored)[:, None], zero[:, None], np.float32(qmax))[:, 0, :]


def output_error(rows: np.ndarray, gram: np.ndarray, q: Levels, group: int) -> float:
    """The layer's squared output error on the calibration rows, trace(D G D^T), D = rows - dequantized."""
    w = np.asarray(rows, np.float64)
    d = w - dequantized(q.levels[:, :w.shape[1]], q.zeros, q.scales, group)
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.einsum("nk,nk->", d @ np.asarray(gram, np.float64), d))


def gptq_group_fit(gram: np.ndarray, *, bits: int, symmetric: bool, scale_dtype):
    """GPTQ's fitter of a group reached (gptq.gptq_levels' `group_fit`): the scale and zero point
    of the group's weights as GPTQ has updated them, rtn's refitted to the error on the group's
    block of X^T X (b = 0, see the module doc), returned as matmul_scales returns them (the
    reciprocal: of the stored scale, the codes rounded against what is written)."""
    g_full = np.asarray(gram, np.float64)
    qmax = qmax_of(bits)

    def fit(current: np.ndarray, columns: np.ndarray):
        current = np.asarray(current, np.float64)
        stored, reciprocal, zero = matmul_scales(current.astype(np.float32)[:, None, :], bits, symmetric, scale_dtype)
        stored, zero = stored[:, 0], zero[:, 0]
        start = _rounded(current.astype(np.float32), stored, zero, qmax)
        h = g_full[np.ix_(columns, columns)]
        _, zero, stored = fit_group(current, h, None, (start, zero, stored), qmax=qmax, symmetric=symmetric,
                                    scale_dtype=scale_dtype)
        return stored, reciprocal_of(stored), zero

    return fit


def refine_weight(weight: np.ndarray, q, gram: np.ndarray, *, bits: int, symmetric: bool,
                  calibration_rows: int | None = None):
    """A 2-D weight's numerics.QuantizedWeight `q` (a data-free method's: rtn, search) with its
    groups' scales and zero points refitted on `gram` (`refine_levels`) damped for
    `calibration_rows` (`damped`), in the same layout."""
    gram = damped(gram, calibration_rows)
    weight = np.asarray(weight)
    rows = np.ascontiguousarray(weight.T if q.axis == 0 else weight)
    start = levels_of(q, bits, symmetric)
    refined = refine_levels(rows.astype(np.float64), gram, start, group=q.group, bits=bits, symmetric=symmetric,
                            scale_dtype=q.scales.dtype)
    return from_rows(rows, refined, weight.shape, q.axis, q.group, bits, symmetric)


def gptq_weight_estimated(weight: np.ndarray, gram: np.ndarray, *, axis: int, group_size: int, bits: int,
                          symmetric: bool, scale_dtype, settings, calibration_rows: int | None = None):
    """GPTQ with each group's scale and zero point fitted by `gptq_group_fit` when GPTQ reaches
    the group (on the weights as its updates left them: NNCF's order too), or plain GPTQ where
    that gives the layer a lower output error on `gram` (a scale fitted to one group changes the
    updates fed to the later ones, so it is not lower by construction): the lower of the two.
    GPTQ's Hessian is `gram` (GPTQ damps it itself); the groups' fit and the choice are on
    `gram` damped for `calibration_rows` (`damped`)."""
    weight = np.asarray(weight)
    rows = np.ascontiguousarray(weight.T if axis == 0 else weight)
    length = rows.shape[1]
    group = length if group_size == -1 else group_size
    scale_dtype = np.dtype(scale_dtype or weight.dtype)
    common = dict(group=group, bits=bits, symmetric=symmetric, scale_dtype=scale_dtype, settings=settings)
    w64 = rows.astype(np.float64)
    fit_on = damped(gram, calibration_rows)
    common["factor"] = factored(gram, settings)  # (the same Hessian's Cholesky for both: once)
    fitted = gptq_levels(w64, gram, group_fit=gptq_group_fit(fit_on, bits=bits, symmetric=symmetric,
                                                                scale_dtype=scale_dtype), **common)
    plain = gptq_levels(w64, gram, **common)
    better = output_error(rows, fit_on, fitted, group) <= output_error(rows, fit_on, plain, group)
    return from_rows(rows, fitted if better else plain, weight.shape, axis, group, bits, symmetric)


def quantize(weight: np.ndarray, target, options, gram: np.ndarray, calibration_rows: int | None = None):
    """The weight (plan.Target `target`) by `options.method` with scale estimation on `gram` of
    `calibration_rows` rows (calibration.py's entry; `damped`): GPTQ with its groups fitted as it
    reaches them, or the data-free method's weight refitted."""
    scale_dtype = options.scale_dtype or target.dtype
    if options.method not in ("gptq", *ROUNDINGS):
        # (awq changes the weight before rounding it: calibration.py refits its scaled weight with
        # refine_weight, on X^T X of the scaled input)
        raise NotImplementedError(f"scale estimation is not wired to method {options.method!r}: its calibration "
                                  "calls refine_weight on the weight it rounds")
    if options.method == "gptq":
        return gptq_weight_estimated(weight, gram, axis=target.axis, group_size=options.group_size, bits=options.bits,
                                     symmetric=options.symmetric, scale_dtype=scale_dtype, settings=options.gptq,
                                     calibration_rows=calibration_rows)
    q = options.fmt.quantize(weight, target, options, options.bits)
    return refine_weight(weight, q, gram, bits=options.bits, symmetric=options.symmetric,
                         calibration_rows=calibration_rows)
