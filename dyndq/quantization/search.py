"""A data-free search for each group's scale and zero point that lowers the squared error.

Pure NumPy on one block of groups ([rows, n_groups, group_length], as `rtn` takes them).

For a group w and a zero level z, the codes q = clamp(round(w / s + z), 0, qmax) give the
error |w - s (q - z)|^2; for those codes the best scale is s* = <w, q - z> / |q - z|^2, which
lowers the error to |w|^2 - <w, q - z>^2 / |q - z|^2 (least squares), and rounding again at
s* lowers it further or keeps it.  `search` tries a few candidate windows per group (the
min-max scale shrunk by each of `SHRINK`, the window slid from the group's low end to its
high end in `SLIDE` steps), keeps the one whose least-squares error is lowest, then
alternates rounding and least squares `REFINE` times.  Each group ends with the lower of
that and RTN's error (measured after the scale is rounded to its stored dtype), so it is
never worse than RTN, group by group.

The search runs on each group scaled by a power of two that brings its largest magnitude into
[0.5, 1): exact, it changes no choice the search makes, and nothing it computes (products,
squares, sums of them) can overflow float32, which a group near float32's largest value would.

`exhaustive` is the yardstick, not a method: every zero level and a dense grid of scales,
each with its least-squares scale, which is about the best any per-group scale with an
integer zero point can do (docs/quantize.md, "How close to the limit").  It is hundreds of
times slower than `search`.
"""
from __future__ import annotations

import numpy as np

from dyndq.quantization.rtn import Levels, half_of, qmax_of, rtn

SHRINK = np.linspace(0.5, 1.0, 8)  # fractions of the min-max scale tried
SLIDE = (0.0, 1 / 3, 2 / 3, 1.0)  # where the window sits between the group's low and high ends
REFINE = 2  # rounds of (round, least-squares scale) after the best candidate


def search(groups: np.ndarray, *, bits: int, symmetric: bool, scale_dtype, rule: str = "matmul") -> Levels:
    """Levels, zero levels and scales chosen by the search (see the module doc)."""
    original = groups.astype(np.float32, copy=False)
    _, exponent = np.frexp(np.abs(original).max(axis=-1))
    g = np.ldexp(original, -exponent[..., None])
    qmax = qmax_of(bits)
    best_gain = np.full(g.shape[:-1], -np.inf, np.float32)
    best_scale = np.zeros(g.shape[:-1], np.float32)
    best_zero = np.zeros(g.shape[:-1], np.float32)
    for scale, zero in _candidates(g, bits, symmetric):
        gain, fitted = _least_squares(g, _offsets(g, scale, zero, qmax), None)
        better = gain > best_gain
        best_gain = np.where(better, gain, best_gain)
        best_scale = np.where(better, fitted, best_scale)
        best_zero = np.where(better, zero, best_zero)
    scale, zero = best_scale, best_zero
    for _ in range(REFINE):
        _, fitted = _least_squares(g, _levels(g, scale, zero, qmax), zero)
        scale = np.where(fitted != 0, fitted, scale)
    with np.errstate(over="ignore"):  # (a scale its dtype cannot hold is infinite: numerics refuses it)
        stored = np.ldexp(scale, exponent).astype(scale_dtype)
    levels = _levels(original, stored.astype(np.float32), zero, qmax)
    found = Levels(levels.astype(np.uint8), zero.astype(np.uint8), stored)
    fallback = rtn(groups, bits=bits, symmetric=symmetric, scale_dtype=scale_dtype, rule=rule)
    return _keep_better(original, found, fallback)


def exhaustive(groups: np.ndarray, *, bits: int, symmetric: bool, scales: int = 1500) -> np.ndarray:
    """The lowest squared error per group found over every zero level and `scales` scales
    (geometric, 0.25x to 1.3x the min-max scale, each refitted by least squares): [rows, n_groups]."""
    g = groups.astype(np.float64)
    qmax, half = qmax_of(bits), half_of(bits)
    low, high = g.min(axis=-1), g.max(axis=-1)
    if symmetric:
        base = np.maximum(np.abs(low), np.abs(high)) / half
        zeros = [half]
        factors = np.concatenate([-np.geomspace(0.25, 1.3, scales // 2), np.geomspace(0.25, 1.3, scales - scales // 2)])
    else:
        base = (high - low) / qmax
        zeros = range(qmax + 1)
        factors = np.geomspace(0.25, 1.3, scales)
    base = np.where(base > 0, base, 1.0)
    total = (g * g).sum(axis=-1)
    best = total.copy()
    for z in zeros:
        for f in factors:
            gain, _ = _least_squares(g, _levels(g, base * f, np.float64(z), qmax), np.float64(z))
            np.minimum(best, total - gain, out=best)
    return np.maximum(best, 0.0)


def squared_error(groups: np.ndarray, q: Levels) -> np.ndarray:
    """|w - (level - zero) * scale|^2 per group, the scale as stored: [rows, n_groups]."""
    g = groups.astype(np.float64)
    with np.errstate(invalid="ignore"):  # (an infinite scale, which numerics refuses, gives NaN)
        values = (q.levels.astype(np.float64) - q.zeros[..., None]) * q.scales.astype(np.float64)[..., None]
    return ((g - values) ** 2).sum(axis=-1)


def _candidates(g, bits, symmetric):
    """(scale, zero level) pairs, each [rows, n_groups] float32, to try for every group."""
    qmax, half = qmax_of(bits), half_of(bits)
    low, high = g.min(axis=-1), g.max(axis=-1)
    if symmetric:
        base = np.maximum(np.abs(low), np.abs(high)) / np.float32(half)
        base = np.where(base > 0, base, np.float32(1))
        zero = np.full(base.shape, half, np.float32)
        for f in SHRINK:
            for sign in (-1, 1):  # the larger side on the lowest code, or on the highest
                yield base * np.float32(sign * f), zero
        return
    base = (high - low) / np.float32(qmax)
    base = np.where(base > 0, base, np.float32(1))
    for f in SHRINK:
        scale = base * np.float32(f)
        keep_low = np.round(-low / scale)  # the window starts at the group's low end
        keep_high = qmax - np.round(high / scale)  # the window ends at its high end
        a, b = np.minimum(keep_low, keep_high), np.maximum(keep_low, keep_high)
        for t in SLIDE:
            yield scale, np.clip(np.round(a + np.float32(t) * (b - a)), 0, qmax).astype(np.float32)


def _levels(g, scale, zero, qmax):
    """clamp(round(w / scale + zero)); every element at the zero level where the scale is 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        x = g / scale[..., None]
    x += zero[..., None]
    x = np.where(scale[..., None] != 0, x, zero[..., None])
    return np.clip(np.rint(x), 0, qmax)


def _offsets(g, scale, zero, qmax):
    """clamp(round(w / scale + zero)) - zero for a scale that is never 0, in one buffer (the
    search's inner loop: w times the reciprocal, where rounding may differ from a division
    in the last bit; the codes it keeps are made again by `_levels`)."""
    x = g * (np.float32(1) / scale)[..., None]
    x += zero[..., None]
    np.rint(x, out=x)
    np.clip(x, 0, qmax, out=x)
    x -= zero[..., None]
    return x


def _least_squares(g, levels, zero):
    """(<w, d>^2 / |d|^2, <w, d> / |d|^2) per group for d = levels - zero (levels itself when
    zero is None): the error it takes off |w|^2, and the scale that does it (0 when d is all zero)."""
    d = levels if zero is None else levels - zero[..., None]
    num = np.einsum("...k,...k->...", g, d)
    den = np.einsum("...k,...k->...", d, d)
    ok = den > 0
    safe = np.where(ok, den, 1)
    return np.where(ok, num * num / safe, 0), np.where(ok, num / safe, 0)


def _keep_better(g, found: Levels, fallback: Levels) -> Levels:
    better = squared_error(g, found) < squared_error(g, fallback)
    return Levels(
        np.where(better[..., None], found.levels, fallback.levels),
        np.where(better, found.zeros, fallback.zeros),
        np.where(better, found.scales, fallback.scales),
    )
