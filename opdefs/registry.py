"""The op registry: one handle per op version, keyed by (domain, op type, since_version).

A handle (`OpVersion`) holds the definition as data.  The other folders attach
their part to it, as JAX attaches an abstract evaluation rule and a lowering to
a primitive: `shape_inference/` the shape function, `kernels/` the kernel,
`converters/` the lowering to standard ONNX.  All three take the op's inputs
positionally and its attributes as keyword-only arguments, so one signature
describes them all (a test checks it).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

PARTS = ("shape_inference", "kernel", "converter")


@dataclass(frozen=True)
class Attribute:
    name: str
    type: type  # str or int: the Python type of the value
    default: Any
    doc: str
    allowed: tuple | None = None  # the permitted values, when they are a closed set


@dataclass(frozen=True)
class Param:
    """A formal input or output."""

    name: str
    type_var: str
    doc: str
    optional: bool = False


@dataclass(frozen=True)
class TypeConstraint:
    name: str
    dtypes: tuple[str, ...]  # NumPy dtype names: "int8", "float32", ...
    doc: str


@dataclass(eq=False)
class OpVersion:
    """One version of one op: its definition, and the parts attached to it."""

    name: str
    domain: str
    since_version: int
    doc: str
    inputs: tuple[Param, ...]
    outputs: tuple[Param, ...]
    attributes: tuple[Attribute, ...]
    type_constraints: tuple[TypeConstraint, ...]
    parts: dict[str, Callable] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.domain, self.name, self.since_version)

    def __repr__(self) -> str:
        return f"<OpVersion {self.domain}::{self.name}-{self.since_version}>"

    # -- the definition, looked up -------------------------------------------------
    def attribute(self, name: str) -> Attribute | None:
        return next((a for a in self.attributes if a.name == name), None)

    def constraint(self, type_var: str) -> TypeConstraint:
        return next(c for c in self.type_constraints if c.name == type_var)

    def defaults(self) -> dict[str, Any]:
        return {a.name: a.default for a in self.attributes}

    def signature(self) -> inspect.Signature:
        """The signature every part must have: inputs positional, attributes keyword-only."""
        P = inspect.Parameter
        params = [
            P(p.name, P.POSITIONAL_OR_KEYWORD, default=None if p.optional else P.empty)
            for p in self.inputs
        ]
        params += [P(a.name, P.KEYWORD_ONLY, default=a.default) for a in self.attributes]
        return inspect.Signature(params)

    # -- parts ---------------------------------------------------------------------
    def _attach(self, part: str) -> Callable[[Callable], Callable]:
        def attach(fn: Callable) -> Callable:
            self.parts[part] = fn
            return fn

        return attach

    def def_shape_inference(self, fn: Callable) -> Callable:
        return self._attach("shape_inference")(fn)

    def def_kernel(self, fn: Callable) -> Callable:
        return self._attach("kernel")(fn)

    def def_converter(self, fn: Callable) -> Callable:
        return self._attach("converter")(fn)

    @property
    def shape_inference(self) -> Callable:
        return self.parts["shape_inference"]

    @property
    def kernel(self) -> Callable:
        return self.parts["kernel"]

    @property
    def converter(self) -> Callable:
        return self.parts["converter"]

    def missing_parts(self) -> list[str]:
        return [p for p in PARTS if p not in self.parts]


_REGISTRY: dict[tuple[str, str, int], OpVersion] = {}


def register(op: OpVersion) -> OpVersion:
    """Add an op version; registering the same handle again is harmless."""
    existing = _REGISTRY.get(op.key)
    if existing is not None and existing is not op:
        raise ValueError(f"{op!r} is already registered with a different definition")
    _REGISTRY[op.key] = op
    return op


def all_versions() -> list[OpVersion]:
    return sorted(_REGISTRY.values(), key=lambda o: o.key)


def versions_of(domain: str, op_type: str) -> list[int]:
    return sorted(v for (d, n, v) in _REGISTRY if d == domain and n == op_type)


def domains() -> set[str]:
    return {d for (d, _, _) in _REGISTRY}


def newest_domain_version(domain: str) -> int:
    """The newest opset version of a domain: the largest since_version of its ops."""
    return max(v for (d, _, v) in _REGISTRY if d == domain)


def resolve(domain: str, op_type: str, opset_version: int) -> OpVersion | None:
    """The op version a node uses under an opset import: the largest since_version
    not above the imported version, exactly as ONNX resolves schemas."""
    candidates = [v for v in versions_of(domain, op_type) if v <= opset_version]
    return _REGISTRY[(domain, op_type, max(candidates))] if candidates else None
