"""The one registry of rewrite rules: every conversion between forms of the op.

A rule is a pattern (the domain and op type of the node it starts from), a check and a
rewrite, registered by decorating the rewrite, as onnx2torch's `add_converter` and
onnxscript's rewrite rules are:

    @rule("MatMulNBits -> DynamicDequantize + MatMul", kind=LIFT, pattern=(MS_DOMAIN, "MatMulNBits"),
          check=_lift_check, targets=("onnx",))
    def _lift(found, node, view) -> Rewrite: ...

`check(node, view)` returns what the rewrite needs (any object) or a `Refusal` saying why
the node is not taken; `rewrite(found, node, view)` returns the `Rewrite` and refuses
nothing.  The kind says which command applies the rule:

- LIFT: a standard or contrib form -> ours (`lift`; export target "onnx" also applies the
  lifts whose `targets` hold it, to bring contrib ops back to standard ONNX through ours);
- WRITE: ours -> the own op of an export target (e.g. MatMulNBits for "onnxruntime"),
  applied by `export` for the targets the rule names, before the opset is chosen;
- LOWER: ours -> standard ONNX, applied by `export` for every target, in passes of
  increasing `order` (rules of one order are tried in one pass, in registration order);
- QUANTIZE: a constant -> ours (a float weight -> its codes, scales and DynamicDequantize),
  applied by `quantize`.  Its rules start from a constant, not a node (`check(held, view)`,
  `rewrite(found, held, view)` with a walker.Held), and are made for one call: the quantizer
  builds its rule from the weights it found and the options it was given and hands it to
  `apply` with its store (dependency injection: converters/ never imports the quantizer, which
  is the face).

Every command applies its rules through `apply`, which walks every scope of the model
(converters/walker.py: `rewrite_model` for rules of nodes, `rewrite_constants` for rules of
constants).  A module of rules is imported by converters/__init__.py; adding a
form is adding one module (docs/house.md shows the smallest real one).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import onnx

from dyndq.opdefs import Refusal, domains
from dyndq.plumbing.names import NameScope
from dyndq.plumbing.opsets import op_version

from .engines import ENGINES as _ENGINE_TABLE
from .rewrite import GraphView, Rewrite
from .walker import Outcome, Store, rewrite_constants, rewrite_model

LIFT, WRITE, LOWER, QUANTIZE = "lift", "write", "lower", "quantize"
KINDS = (LIFT, WRITE, LOWER, QUANTIZE)
TARGETS = tuple(_ENGINE_TABLE)  # the engine table's rows: ("onnx", "onnxruntime", "openvino")
OURS = object()  # a pattern's domain: any domain of the op registry (ours, or a test's toy op's)


@dataclass(frozen=True)
class Rule:
    name: str  # what it does, in a few words: "MatMulNBits -> DynamicDequantize + MatMul"
    kind: str  # LIFT, WRITE, LOWER or QUANTIZE
    pattern: tuple  # (domain or OURS or None, op type or None): the node it starts from (None: any; QUANTIZE: any constant)
    check: Callable[[onnx.NodeProto, GraphView], object]
    rewrite: Callable[[object, onnx.NodeProto, GraphView], Rewrite]
    targets: tuple[str, ...] = ()  # the export targets that apply it (LOWER: every target)
    makes: str = ""  # what a refusal is named after when several rules refuse one node: "not <makes>: ..."
    options: dict | None = None  # option name -> check(value) -> None or why the value is refused
    order: int = 0

    def takes(self, node) -> bool:
        if self.kind == QUANTIZE:  # (a constant: walker.Held; its check judges it)
            return True
        domain, op_type = self.pattern
        node_domain = "" if node.domain == "ai.onnx" else node.domain
        if domain is OURS:
            domain_ok = node_domain in domains()
        else:
            domain_ok = domain is None or node_domain == domain
        return domain_ok and (op_type is None or node.op_type == op_type)


_RULES: list[Rule] = []


def rule(name: str, *, kind: str, pattern: tuple, check: Callable, targets=(), makes: str = "", options=None,
         order: int = 0) -> Callable[[Callable], Callable]:
    """Register the decorated function as the rewrite of a rule (see the module doc)."""
    if kind not in KINDS:
        raise ValueError(f"rule {name!r}: kind {kind!r}, not one of {', '.join(KINDS)}")
    unknown = set(targets) - set(TARGETS)
    if unknown:
        raise ValueError(f"rule {name!r}: unknown targets {sorted(unknown)}; the targets are {', '.join(TARGETS)}")

    def attach(rewrite: Callable) -> Callable:
        _RULES.append(Rule(name, kind, tuple(pattern), check, rewrite, tuple(targets) if kind != LOWER else TARGETS,
                           makes or name, dict(options or {}), order))
        return rewrite

    return attach


def says_why(found: Callable[[onnx.NodeProto, GraphView], object]) -> Callable[[onnx.NodeProto, GraphView], object]:
    """A check written to return a sentence where it refuses (the contrib rules' long chains of
    tests read best so): the sentence becomes the Refusal."""

    def check(node, view):
        result = found(node, view)
        return Refusal(result) if isinstance(result, str) else result

    check.__doc__ = found.__doc__
    return check


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Rules registered inside the block are removed when it ends (for tests)."""
    before = list(_RULES)
    try:
        yield
    finally:
        _RULES[:] = before


def rules(kind: str | None = None, target: str | None = None) -> list[Rule]:
    """The registered rules of `kind` that `target` applies (every one when None), in registration order."""
    return [r for r in _RULES if (kind is None or r.kind == kind) and (target is None or target in r.targets)]


def passes(kind: str, target: str | None = None) -> list[list[Rule]]:
    """The rules of `kind` for `target`, grouped in passes of increasing order."""
    found = rules(kind, target)
    return [[r for r in found if r.order == order] for order in sorted({r.order for r in found})]


def option_problems(options: dict) -> list[str]:
    """Why the options given (None: not given) are refused by the rules that take them (whatever
    the target: a target none of whose rules takes an option ignores it), or that no rule does."""
    problems = []
    for name, value in options.items():
        if value is None:
            continue
        takers = [r for r in _RULES if name in r.options]
        if not takers:
            problems.append(f"{name}: no rewrite rule takes this option")
        for r in takers:
            why = r.options[name](value)
            if why:
                problems.append(why)
    return list(dict.fromkeys(problems))


def apply(model: onnx.ModelProto, chosen: list[Rule], types, names: NameScope,
          options: dict | None = None, store: Store | None = None) -> list[Outcome]:
    """Apply `chosen` rules to `model` in place through the walker: each node (each constant, for
    rules of kind QUANTIZE, read and written through `store`) is offered to the rules whose
    pattern takes it, in order; the first whose check passes rewrites it.  A node every rule
    refused comes back with the reasons (several rules: each named "not <makes>"); a node no
    rule's form fits (every refusal not `mine`) is not reported.  Rules of nodes and of
    constants are not applied together."""
    constants = {r.kind == QUANTIZE for r in chosen}
    if len(constants) > 1:
        raise ValueError("rules of constants (QUANTIZE) and of nodes are applied apart")

    def convert(node, view):
        refused = []
        for r in chosen:
            if not r.takes(node):
                continue
            found = r.check(node, view)
            if isinstance(found, Refusal):
                refused.append((r, found))
                continue
            result = r.rewrite(found, node, view)
            if r.kind != QUANTIZE:
                result.op = op_version(node, view.imports)
            return result
        mine = [(r, f) for r, f in refused if f.mine]
        if not mine:
            return None
        if len(mine) == 1:
            return mine[0][1]
        return Refusal("; ".join(f"not {r.makes}: {f.reason}" for r, f in mine))

    if constants == {True}:
        return rewrite_constants(model, convert, names, store, options)
    return rewrite_model(model, convert, types, names, options)


def foreign_forms() -> set[tuple[str, str]]:
    """(domain, op type) of every form another engine defines that a rule lifts into ours for
    export target "onnx" (ONNX Runtime's contrib ops): what that target cannot keep."""
    return {r.pattern for r in rules(LIFT, "onnx")}
