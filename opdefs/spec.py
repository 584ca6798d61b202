"""TensorSpec: what shape inference knows of a value (its dtype and shape), without data.

A dim is an int (known), a str (symbolic, ONNX's dim_param) or None (unknown).
The shape is None when even the rank is unknown; the dtype is a NumPy dtype
name ("int8", "float32", ...) or None when unknown.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

Dim = Union[int, str, None]


@dataclass(frozen=True)
class TensorSpec:
    dtype: str | None
    shape: tuple[Dim, ...] | None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def size(self) -> int | None:
        """The element count, when every dim is known."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        n = 1
        for d in self.shape:
            n *= d
        return n

    @classmethod
    def of(cls, array) -> "TensorSpec":
        """The spec of a NumPy array (anything with .dtype and .shape)."""
        return cls(array.dtype.name, tuple(array.shape))

    def __str__(self) -> str:
        dtype = self.dtype or "?"
        if self.shape is None:
            return f"{dtype}[?]"
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{dtype}[{dims}]"
