"""How far an engine's output is from the reference's: the numbers a user decides by.

An output agrees when max |a - b| <= TOLERANCE * max |b| (a the engine's, b the reference's):
float32 sums of K terms in another order (MatMul, Softmax, LayerNormalization) move a result by
about sqrt(K) * 2^-24 of its terms' size (1e-6 and below for the models here); int8 activations
or bfloat16 arithmetic move it by 1e-3 and more.  A non-float output agrees only bit for bit.
For an output whose last axis is logits or a distribution (`dyndq.task_metrics.output_kind`), also the share
of rows whose top-1 index agrees and the mean KL divergence KL(reference || engine) over rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dyndq.opdefs import dtypes
from dyndq.task_metrics import row_sums

TOLERANCE = 1e-4


@dataclass(frozen=True)
class OutputParity:
    name: str
    agrees: bool
    max_abs: float  # max |a - b|
    scale: float  # max |b|
    frobenius: float  # ||a - b|| / ||b||
    top1_agreement: float | None = None  # share of rows whose argmax agrees (logits, distributions)
    kl: float | None = None  # mean KL(reference || engine) over rows (logits, distributions)

    @property
    def differs(self) -> bool:
        return not self.agrees

    @property
    def relative(self) -> float:
        """max |a - b| / max |b|."""
        if self.scale:
            return self.max_abs / self.scale
        return 0.0 if self.max_abs == 0 else float("inf")

    def as_dict(self) -> dict:
        out = {"name": self.name, "agrees": self.agrees, "max_abs": _json(self.max_abs),
               "relative": _json(self.relative), "frobenius": _json(self.frobenius)}
        if self.top1_agreement is not None:
            out["top1_agreement"] = self.top1_agreement
            out["kl"] = _json(self.kl)
        return out

    def __str__(self) -> str:
        head = f"{self.name}: {'agrees' if self.agrees else 'differs'}"
        if self.scale == 0 and self.max_abs == 0:
            return head
        text = (f"{head}: max |a - b| {self.max_abs:.3g} ({self.relative:.2g} of max |b|), "
                f"relative Frobenius {self.frobenius:.2g}")
        if self.top1_agreement is not None:
            text += f", top-1 agreement {self.top1_agreement:.3g}, KL {self.kl:.2g}"
        return text


def _json(x: float):
    return x if np.isfinite(x) else str(x)  # (JSON has no inf nor nan)


def compare(name: str, a, b, kind: str | None = None) -> OutputParity:
    """`a` (an engine's) against `b` (the reference's); `kind` is `output_kind`'s answer."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return OutputParity(name, False, float("inf"), 0.0, float("inf"))
    if not (_floating(a) and _floating(b)):
        same = bool(np.array_equal(a, b))
        return OutputParity(name, same, 0.0 if same else float("inf"), 0.0, 0.0 if same else float("inf"))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if not np.array_equal(nan_a, nan_b):
        return OutputParity(name, False, float("nan"), float("nan"), float("nan"))
    d = np.where(nan_a, 0.0, a64 - b64)
    finite = np.where(nan_b, 0.0, b64)
    max_abs = float(np.abs(d).max(initial=0.0)) if not np.isnan(d).any() else float("inf")
    scale = float(np.abs(finite).max(initial=0.0))
    norm = float(np.linalg.norm(finite))
    frobenius = float(np.linalg.norm(d)) / norm if norm else (0.0 if max_abs == 0 else float("inf"))
    top1 = kl = None
    if kind is not None and a.ndim >= 1 and a.shape[-1] >= 2 and a.size:
        top1, kl = _rows(a64, b64, kind)
    return OutputParity(name, max_abs <= TOLERANCE * scale, max_abs, scale, frobenius, top1, kl)


def _rows(a: np.ndarray, b: np.ndarray, kind: str) -> tuple[float, float]:
    """(top-1 agreement, mean KL(reference || engine)) over rows: `b` is the reference."""
    agree, rows, kl = row_sums(b, a, kind)
    return agree / rows, kl / rows


def _floating(a: np.ndarray) -> bool:
    """A float array, ml_dtypes' bfloat16 and float8 too (NumPy's kind of those is "V")."""
    return a.dtype.name in {d.name for d in dtypes.DTYPES if d.is_float}
