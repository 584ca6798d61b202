"""One handler per oneDNN op kind, registered in one table (`KINDS`), the JAX way.

A `Handler` holds everything the interop knows about a kind:
- `attrs`: the attribute spec, one `Attr` (name, oneDNN type, default, allowed values)
  each.  The reader's validation (`read_attrs`) and the writer's attribute types both
  derive from it, so the two cannot drift apart;
- `to_onnx(e, attrs)`: the mapping, writing the op as ONNX nodes through an `OpEmitter`;
- `onnx_types` and `from_onnx(node)`: the inverse, used by `dump` for ONNX nodes that
  `load` did not make (the op types written back as this kind, and the oneDNN attributes
  of such a node, from its ONNX attributes and constant inputs);
- `example(i, draw)`: the example-input rule for the op's input `i` (None: the default rule).

Adding a kind means adding one handler (`@handler(...)` on its mapping) in one of the family
modules that `kinds.py` imports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from dyndq.onednn.reader import show
from dyndq.opdefs import REQUIRED, AttrKind
from dyndq.wording import cut

# oneDNN's attribute types (src/graph/interface/op_def.hpp), as its graph JSON writes them
_DESCRIBE = {"s64": "an s64 integer", "f32": "an f32 number", "bool": "a bool (true/false or 0/1)",
             "string": "a string", "s64[]": "a list of s64 integers", "f32[]": "a list of f32 numbers"}
ONEDNN_TYPE = {AttrKind.INT: "s64", AttrKind.INTS: "s64[]", AttrKind.FLOAT: "f32", AttrKind.STRING: "string"}
S64 = (-2**63, 2**63 - 1)
F32_OVERFLOW = 2.0**128 - 2.0**103  # the least magnitude a float32 rounds to infinity (3.4028235e38 is its largest)
_IN_RANGE = {"s64": "an s64 integer, in [-2^63, 2^63 - 1]",
             "s64[]": "a list of s64 integers, each in [-2^63, 2^63 - 1]",
             "f32": "an f32 number a float32 holds (magnitude at most 3.4028235e+38)",
             "f32[]": "a list of f32 numbers a float32 holds (each of magnitude at most 3.4028235e+38)"}


@dataclass(frozen=True)
class Attr:
    """One attribute of a kind: its oneDNN type, its default (None: optional, absent unless given;
    REQUIRED: every op carries it) and, for a closed set, the values allowed."""

    name: str
    type: str
    default: Any = None
    allowed: tuple = ()
    note: str = ""  # said after the allowed values, e.g. what we do with them

    def describe(self) -> str:
        if self.allowed:
            words = [repr(v) for v in self.allowed]
            said = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
        else:
            said = _DESCRIBE[self.type]
        return f"{said} ({self.note})" if self.note else said

    def coerce(self, value):
        """The value as the mapping takes it, or ValueError when it is not of the attribute's type
        (with what is allowed as its message when the type is right but the value beyond it: an
        integer outside s64, a finite number a float32 would make infinite)."""
        t = self.type
        if t in _IN_RANGE and _beyond(value, t):
            raise ValueError(_IN_RANGE[t])
        if t == "bool":
            if isinstance(value, bool) or value in (0, 1):
                return bool(value)
            if value in ("true", "false", "True", "False"):
                return value.lower() == "true"
            raise ValueError
        if t == "s64" and _is_int(value):
            return value
        if t == "f32" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
        if t == "string" and isinstance(value, str):
            return value
        if t == "s64[]" and isinstance(value, list) and all(_is_int(v) for v in value):
            return value
        if t == "f32[]" and isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                             for v in value):
            return value
        raise ValueError


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _beyond(value, t: str) -> bool:
    """Whether a value of the right JSON type lies beyond oneDNN's type `t` (s64, f32, or lists)."""
    items = value if t.endswith("[]") and isinstance(value, list) else [value]
    if t.startswith("s64"):
        return any(_is_int(v) and not S64[0] <= v <= S64[1] for v in items)
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) >= F32_OVERFLOW
               for v in items)


def from_opdefs(attribute) -> Attr:
    """An attribute of one of our op definitions (opdefs) as oneDNN spells it."""
    default = attribute.default if attribute.has_default or attribute.required else None
    return Attr(attribute.name, ONEDNN_TYPE[attribute.kind], default, tuple(attribute.allowed or ()))


@dataclass
class Handler:
    kind: str
    to_onnx: Callable
    roles: tuple[str, ...] = ("src",)  # names of the inputs, for readable value names
    inputs: tuple[int, int] = (1, 1)  # how many inputs: (least, most)
    outputs: tuple[int, int] = (1, 1)
    attrs: tuple[Attr, ...] = ()
    onnx_types: tuple[str, ...] = ()  # ONNX op types `dump` writes back as this kind
    from_onnx: Callable | None = None  # (what the writer sees of the ONNX node) -> oneDNN attribute values
    onnx_inputs: int | None = None  # how many of the ONNX node's inputs are the op's (None: all); the
    #                                 rest are constants from_onnx reads as attributes
    example: Callable | None = None  # (input index, Draw) -> array or None
    spec: dict[str, Attr] = field(init=False)

    def __post_init__(self):
        self.spec = {a.name: a for a in self.attrs}

    def read_attrs(self, e) -> dict:
        """The op's attributes, checked against the spec and over its defaults.  Each problem is
        named on the emitter; a value found wrong is replaced by its default, so that the mapping
        can go on and name the op's other problems too."""
        values = {a.name: a.default for a in self.attrs if a.default is not REQUIRED}
        for key, value in e.op.attrs.items():
            a = self.spec.get(key)
            if a is None:
                known = ", ".join(self.spec) or "none"
                e.problem(cut(key), f"attribute {cut(key)}={show(value)}", f"the attributes this mapping honours: {known}")
                continue
            try:
                value = a.coerce(value)
            except ValueError as err:
                e.problem(key, show(value), str(err) or a.describe())
                continue
            if a.allowed and value not in a.allowed:
                e.problem(key, show(value), a.describe())
                continue
            values[key] = value
        for a in self.attrs:
            if a.default is REQUIRED and a.name not in e.op.attrs:
                e.problem(a.name, "missing", f"{_DESCRIBE[a.type]} (required)")
        return values

    def typed(self, values: dict) -> dict:
        """oneDNN's JSON form of attribute values: {name: {"type": ..., "value": ...}}."""
        return {k: {"type": self.spec[k].type, "value": list(v) if isinstance(v, tuple) else v}
                for k, v in values.items()}


KINDS: dict[str, Handler] = {}


def handler(kind: str, **fields):
    """Registers the decorated mapping as `kind`'s handler (fields: those of `Handler`)."""
    def register(fn):
        if kind in KINDS:
            raise ValueError(f"oneDNN kind {kind} has a handler already")
        KINDS[kind] = Handler(kind, fn, **fields)
        return fn
    return register


def inverse_table() -> dict[str, Handler]:
    """ONNX op type -> the handler `dump` writes it with."""
    table: dict[str, Handler] = {}
    for h in KINDS.values():
        for op_type in h.onnx_types:
            if op_type in table:
                raise ValueError(f"ONNX {op_type} is written back as {table[op_type].kind} and {h.kind}")
            table[op_type] = h
    return table
