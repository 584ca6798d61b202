"""Each domain of ours imported at one version by a model and every function using it.

ONNX's checker (checker.cc: `check_model_local_functions`, `check_opset_compatibility`)
resolves each node of a model-local function twice, under the function's import of the node's
domain and under the model's, and refuses the model where the two give schemas of different
since_versions; where the model does not import the domain, the first function's import stands
for the model's.  Every version of our ops is a since_version of its own (DynamicDequantize 1,
2 and 3), so a node of ours in a function resolves alike only where the imports are equal.

Each version of ours is a superset of the one before (a node valid under one means the same
under the next: DESIGN, the op's versions), so `align` raises the imports to the newest among
them, after checking that it holds every node it raises (the node's attributes, and the types its
old version takes); a node it would not hold, or a function needing a newer version than the one
a caller pinned, is refused by name (ValidationError).
"""
from __future__ import annotations

import onnx

from dyndq.opdefs import OpVersion, Problem, ValidationError, domains, resolve

from .walk import walk


def align(model: onnx.ModelProto, pinned: dict[str, int] | None = None) -> None:
    """Import each registered domain at one version in `model` and in every function whose nodes
    use it, in place: the newest among their imports, or `pinned[domain]` (the model's import a
    caller chose; a function importing a newer one is refused)."""
    pinned = pinned or {}
    for domain in sorted(domains()):
        users: dict[str, list] = {}  # scope ("main" or "function dom::Name") -> its sites of the domain's nodes
        for site in walk(model):
            if site.node.domain == domain:
                users.setdefault(site.scope, []).append(site)
        functions = {f"function {f.domain}::{f.name}": f for f in model.functions}
        imports = {"main": model.opset_import, **{path: functions[path].opset_import for path in users if path != "main"}}
        found = {path: _version(imports[path], domain) for path in imports}
        if not any(path != "main" for path in users) or not any(found.values()):
            continue  # (no function uses the domain: nothing for the checker to compare)
        # (the imports of the scopes whose nodes use it: the model's counts only where its own nodes do)
        counted = [v for path, v in found.items() if v and path in users]
        target = pinned.get(domain) or max(counted or [v for v in found.values() if v])
        problems = []
        for path, sites in users.items():
            have = found[path]
            if have == target:
                continue
            if have is None or have > target:
                problems.append(Problem(f"opset import of {domain}", f"version {have}" if have else "none",
                                        f"version {target}, the model's (ONNX's checker resolves a function's nodes "
                                        f"under both imports)", graph=path))
                continue
            problems += [_not_held(site, domain, have, target) for site in sites
                         if not _holds(site.node, resolve(domain, site.node.op_type, have),
                                       resolve(domain, site.node.op_type, target))]
        if problems:
            raise ValidationError(problems)
        for path in users:
            _set(imports[path], domain, target)
        if found["main"] is not None:
            _set(model.opset_import, domain, target)


def _holds(node: onnx.NodeProto, old: OpVersion | None, new: OpVersion | None) -> bool:
    """Whether version `new` holds a node that version `old` held: every attribute it has, and
    every type `old` takes for each input (the types of a function's values are not known)."""
    if old is None or new is None:
        return False
    if any(new.attribute(a.name) is None for a in node.attribute):
        return False
    return all(set(old.allowed_dtypes(p.name)) <= set(new.allowed_dtypes(p.name)) for p in old.inputs)


def _not_held(site, domain: str, have: int, target: int) -> Problem:
    name = site.node.name or None
    return Problem(f"opset import of {domain}", f"version {have}",
                   f"version {target}, which the model and its other functions import; {site.node.op_type}-{target} "
                   f"does not hold this node", op=site.node.op_type, node=name, node_index=site.index, graph=site.graph)


def _version(imports, domain: str) -> int | None:
    return next((o.version for o in imports if o.domain == domain), None)


def _set(imports, domain: str, version: int) -> None:
    for o in imports:
        if o.domain == domain:
            o.version = version
