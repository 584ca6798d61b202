"""Arrays in words: what `dyndq run` prints for each output, for anyone who wants the same.

- `summary(name, array)`: one line, "NAME: DTYPE[SHAPE]  min ..  max ..  mean ..  first [..]", the
  infinite and NaN values counted rather than skipped; ml_dtypes' bfloat16, float8, int4 and uint4
  included.
- `describe(name, value)`: the lines for a value an engine gave: a tensor, a sequence of tensors
  (one line each), or no value.
"""
from __future__ import annotations

import numpy as np

from dyndq.wording import plural


def summary(name: str, a: np.ndarray) -> str:
    """One line: the name, dtype and shape, then for numbers the min, max and mean of the finite
    values (the infinite and NaN ones counted) and the first six values."""
    head = f"{name}: {a.dtype.name}{list(a.shape)}"
    if a.size == 0:
        return f"{head}  (empty)"
    # (ml_dtypes' bfloat16, float8, int4 and uint4 are of NumPy kind "V": judged by name)
    floating = a.dtype.kind == "f" or a.dtype.name == "bfloat16" or a.dtype.name.startswith("float8")
    if a.dtype.kind in "fiub" or floating or a.dtype.name in ("int4", "uint4"):
        numeric = a.astype(np.float64) if a.dtype.kind != "b" else a.astype(np.int8)
        finite = numeric[np.isfinite(numeric)] if floating else numeric.ravel()
        stats = "no finite values" if finite.size == 0 else (
            f"min {finite.min():.6g}  max {finite.max():.6g}  mean {finite.mean():.6g}"
        )
        if finite.size < a.size:  # said, not skipped: an overflow in the run is what one wants to know
            inf, nan = int(np.isinf(numeric).sum()), int(np.isnan(numeric).sum())
            stats += "  (" + ", ".join(w for w in (f"{inf} infinite" if inf else "", f"{nan} NaN" if nan else "") if w) + ")"
        first = np.array2string(a.ravel()[:6], precision=6, separator=", ")
        more = ", ...]" if a.size > 6 else ""
        return f"{head}  {stats}  first {first[:-1] + more if more else first}"
    return head


def describe(name: str, value) -> list[str]:
    """The lines for one value an engine gave: a tensor's summary; for a sequence (a list of
    tensors), its length, then each item's summary indented; for no value (None), that."""
    if isinstance(value, list):
        return [f"{name}: a sequence of {plural(len(value), 'tensor')}"] + [
            "  " + summary(f"{name}[{i}]", item) for i, item in enumerate(value)]
    if value is None:
        return [f"{name}: (no value)"]
    return [summary(name, value)]
