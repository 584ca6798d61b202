"""The attribute vocabulary of op definitions: kinds, defaults, required attributes.

A kind is named as ONNX names its attribute types (`AttributeProto.INT`,
`OpSchema.AttrType.INT`, ...), so the face maps a kind to ONNX's enums by
name, in one place (`dyndq.plumbing.types`), without this module
importing onnx.
"""
from __future__ import annotations

import enum
import operator
from dataclasses import dataclass
from typing import Any


class AttrKind(enum.Enum):
    INT = "int"
    INTS = "ints"
    FLOAT = "float"
    STRING = "string"

    def coerce(self, value) -> Any:
        """The value as this kind holds it (a tuple for INTS), or TypeError saying what was wrong.

        bool is refused for INT (True is not an axis); a str is refused for INTS (it is a
        sequence of characters, not of ints); NumPy integers are taken (operator.index)."""
        if self is AttrKind.INT:
            return _index(value)
        if self is AttrKind.INTS:
            if isinstance(value, (str, bytes)) or not _iterable(value):
                raise TypeError(f"{_what(value)}, not a list of integers")
            items = list(value)
            try:
                return tuple(_index(v) for v in items)
            except TypeError:
                bad = next(v for v in items if not _is_index(v))
                raise TypeError(f"a list holding {_what(bad)}") from None
        if self is AttrKind.FLOAT:
            if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(value, "__float__"):
                raise TypeError(f"{_what(value)}, not a number")
            return float(value)
        if not isinstance(value, str):
            raise TypeError(f"{_what(value)}, not a string")
        return value


_INT64 = (-(2**63), 2**63 - 1)  # what an ONNX INT attribute holds


def _index(value) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{value!r} (bool), not an integer")
    try:
        i = operator.index(value)
    except TypeError:
        raise TypeError(f"{_what(value)}, not an integer") from None
    if not _INT64[0] <= i <= _INT64[1]:
        raise TypeError(f"{i}, beyond the int64 range of an ONNX attribute")
    return i


def _is_index(value) -> bool:
    try:
        _index(value)
    except TypeError:
        return False
    return True


def _iterable(value) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _what(value) -> str:
    return f"{value!r} ({type(value).__name__})"


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()  # the default of an attribute every node must carry


@dataclass(frozen=True)
class Attribute:
    """A formal attribute. default is a value, None (optional, no default: the op decides
    what its absence means), or REQUIRED."""

    name: str
    kind: AttrKind
    default: Any
    doc: str
    allowed: tuple | None = None  # the permitted values, when they are a closed set

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def has_default(self) -> bool:
        return self.default is not None and self.default is not REQUIRED
