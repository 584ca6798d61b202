"""The op registry: one handle per op version, keyed by (domain, op type, since_version).

A handle (`OpVersion`) holds the definition as data.  The other folders attach
their parts to it, as JAX attaches an abstract evaluation rule and a lowering
to a primitive, each from a module with the op's base name
(`dynamic_dequantize.py`):

  part             attached with         from            called as
  shape_inference  @OP.def_shape_inference  shape_inference/  fn(*input_specs, **attrs) -> output spec
  kernel           @OP.def_kernel           kernels/          fn(*arrays, **attrs) -> array
  lowering         @OP.def_lowering         converters/       fn(ctx, *input_names, **attrs) -> output name
  lowering_needs   @OP.def_lowering_needs   converters/       fn(*input_specs, **attrs) -> Needs
  lifting          @OP.def_lifting(source)  converters/       fn(node, spec_of) -> LiftPlan | Refusal

All but lifting take the op's inputs positionally and its attributes as
keyword-only arguments, so one signature describes them (a test checks it).
A part asked for and not attached raises `MissingPartError`, which names the
op version, the part and how to attach it.
"""
from __future__ import annotations

import contextlib
import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .attributes import REQUIRED, Attribute

PARTS = ("shape_inference", "kernel", "lowering", "lowering_needs", "lifting")
# where each part lives: the folder (installed as dyndq.<folder>) and the decorator
_PART_HOME = {
    "shape_inference": ("shape_inference", "def_shape_inference"),
    "kernel": ("kernels", "def_kernel"),
    "lowering": ("converters", "def_lowering"),
    "lowering_needs": ("converters", "def_lowering_needs"),
    "lifting": ("converters", "def_lifting"),
}


class MissingPartError(LookupError):
    """An op version was asked for a part nobody attached."""

    def __init__(self, op: "OpVersion", part: str):
        folder, decorator = _PART_HOME[part]
        self.op, self.part = op, part
        super().__init__(
            f"{op.qualname}-{op.since_version} has no {part}: attach one with "
            f"@{op.handle_name}.{decorator}{'(source=...)' if part == 'lifting' else ''} "
            f"in {folder}/{op.base_name}.py (and import that module in {folder}/__init__.py)"
        )


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
    dtypes: tuple[str, ...]  # our dtype names (opdefs.dtypes): "int8", "float32", "int4", ...
    doc: str


@dataclass(frozen=True)
class Needs:
    """What a node's lowering needs of the model: an ai.onnx opset, an IR version, and why;
    `by_target`: what it needs instead for an export target whose engine gets another form."""

    opset: int
    ir_version: int = 3
    why: str = ""
    by_target: dict = field(default_factory=dict, compare=False)

    def at(self, target: str) -> "Needs":
        """What the lowering needs for export target `target`."""
        return self.by_target.get(target, self)


@dataclass(frozen=True)
class LiftPlan:
    """How a standard node becomes one of ours: our node's inputs and attributes."""

    inputs: tuple[str, ...]
    attrs: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    """Why a conversion does not take a node: the one answer every lifting part and every
    rewrite rule's check gives when it says no.  `mine` is False when the node is not of the
    rule's form at all (another rule of the same pattern then gives the reason the user reads)."""

    reason: str
    mine: bool = True

    def __str__(self) -> str:
        return self.reason


def qualname(domain: str, op_type: str) -> str:
    """"org.dyndq::DynamicDequantize": how every message names an op."""
    return f"{domain}::{op_type}"


def snake_case(name: str) -> str:
    """DynamicDequantize -> dynamic_dequantize: an op's base name in every aspect folder."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


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
    lifts_from: tuple[str, str] | None = None  # (domain, op type) the lifting part takes

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.domain, self.name, self.since_version)

    @property
    def qualname(self) -> str:
        """"org.dyndq::DynamicDequantize": the op's name in every message."""
        return qualname(self.domain, self.name)

    @property
    def base_name(self) -> str:
        return snake_case(self.name)

    @property
    def handle_name(self) -> str:
        return f"{self.base_name.upper()}_{self.since_version}"

    def __repr__(self) -> str:
        return f"<OpVersion {self.qualname}-{self.since_version}>"

    # -- the definition, looked up -------------------------------------------------
    def attribute(self, name: str) -> Attribute | None:
        return next((a for a in self.attributes if a.name == name), None)

    def constraint(self, type_var: str) -> TypeConstraint:
        return next(c for c in self.type_constraints if c.name == type_var)

    def allowed_dtypes(self, param: str) -> tuple[str, ...]:
        """The dtypes an input or output may have, by its type constraint."""
        p = next(p for p in self.inputs + self.outputs if p.name == param)
        return self.constraint(p.type_var).dtypes

    def defaults(self) -> dict[str, Any]:
        """Each optional attribute and its default (None: absent, the op decides what that means)."""
        return {a.name: a.default for a in self.attributes if not a.required}

    def signature(self) -> inspect.Signature:
        """The signature every part but lifting has: inputs positional, attributes keyword-only."""
        P = inspect.Parameter
        params = [
            P(p.name, P.POSITIONAL_OR_KEYWORD, default=None if p.optional else P.empty)
            for p in self.inputs
        ]
        params += [P(a.name, P.KEYWORD_ONLY, default=P.empty if a.required else a.default) for a in self.attributes]
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

    def def_lowering(self, fn: Callable) -> Callable:
        return self._attach("lowering")(fn)

    def def_lowering_needs(self, fn: Callable) -> Callable:
        return self._attach("lowering_needs")(fn)

    def def_lifting(self, *, source: tuple[str, str]) -> Callable[[Callable], Callable]:
        """Attach the lifting of standard `source` = (domain, op type) nodes into this version."""
        self.lifts_from = (source[0] if source[0] != "ai.onnx" else "", source[1])
        return self._attach("lifting")

    def part(self, part: str) -> Callable:
        if part not in _PART_HOME:
            raise ValueError(f"unknown part {part!r}; the parts are {', '.join(PARTS)}")
        try:
            return self.parts[part]
        except KeyError:
            raise MissingPartError(self, part) from None

    @property
    def shape_inference(self) -> Callable:
        return self.part("shape_inference")

    @property
    def kernel(self) -> Callable:
        return self.part("kernel")

    @property
    def lowering(self) -> Callable:
        return self.part("lowering")

    @property
    def lowering_needs(self) -> Callable:
        return self.part("lowering_needs")

    @property
    def lifting(self) -> Callable:
        return self.part("lifting")

    def missing_parts(self) -> list[str]:
        return [p for p in PARTS if p not in self.parts]


# -- the registry ---------------------------------------------------------------------------

_REGISTRY: dict[tuple[str, str, int], OpVersion] = {}
_LISTENERS: list[Callable[[], None]] = []


def register(op: OpVersion) -> OpVersion:
    """Add an op version; registering the same handle again is harmless."""
    existing = _REGISTRY.get(op.key)
    if existing is not None and existing is not op:
        raise ValueError(f"{op!r} is already registered with a different definition")
    if existing is None:
        _REGISTRY[op.key] = op
        _changed()
    return op


def subscribe(listener: Callable[[], None]) -> None:
    """Call `listener()` after every change of the registry (the face keeps ONNX's schemas in step)."""
    if listener not in _LISTENERS:
        _LISTENERS.append(listener)


def _changed() -> None:
    for listener in list(_LISTENERS):
        listener()


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Op versions registered inside the block are removed when it ends (for tests)."""
    before = dict(_REGISTRY)
    try:
        yield
    finally:
        if _REGISTRY != before:
            _REGISTRY.clear()
            _REGISTRY.update(before)
            _changed()


def all_versions() -> list[OpVersion]:
    return sorted(_REGISTRY.values(), key=lambda o: o.key)


def versions_of(domain: str, op_type: str) -> list[int]:
    return sorted(v for (d, n, v) in _REGISTRY if d == domain and n == op_type)


def ops_of(domain: str) -> list[str]:
    """The op types of a domain."""
    return sorted({n for (d, n, _) in _REGISTRY if d == domain})


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


def newest(domain: str, op_type: str) -> OpVersion | None:
    versions = versions_of(domain, op_type)
    return _REGISTRY[(domain, op_type, versions[-1])] if versions else None


def lifters(domain: str, op_type: str) -> list[OpVersion]:
    """The op versions whose lifting takes standard (domain, op type) nodes, oldest first."""
    domain = "" if domain == "ai.onnx" else domain
    return [op for op in all_versions() if op.lifts_from == (domain, op_type) and "lifting" in op.parts]
