"""Opset imports: reading and editing a model's or a function's, and resolving our nodes by them.

ONNX resolves a node's schema by the opset its scope imports for the node's domain (the
model's for the main graph and its bodies, a function's own for its nodes); ai.onnx is
written "" or "ai.onnx".  Every command reads and edits imports through these functions.
"""
from __future__ import annotations

import onnx

from dyndq.opdefs import OpVersion, domains, resolve

# The newest ai.onnx opset ONNX Runtime 1.31 runs; models are made no newer.
ORT_MAX_OPSET = 26

def scope_opsets(imports) -> dict[str, int]:
    """{domain: version} of a scope's opset imports (a model's or a function's)."""
    return {o.domain: o.version for o in imports}


def op_version(node: onnx.NodeProto, opsets: dict[str, int]) -> OpVersion | None:
    """The op version of ours a node resolves to under the opset imports of its scope: the
    largest not above the version its scope imports, as ONNX resolves schemas.  The one
    lookup check, export, lift and run share (a scope without an import of the node's domain
    resolves nothing: the node is judged or lowered where it stands, never by another
    scope's imports)."""
    if node.domain not in domains() or node.domain not in opsets:
        return None
    return resolve(node.domain, node.op_type, opsets[node.domain])


def import_at_least(imports, domain: str, version: int) -> None:
    """Import `domain` at `version` at least among a model's or a function's opset imports (an
    import already there is kept when newer)."""
    for o in imports:
        if o.domain == domain:
            o.version = max(o.version, version)
            return
    imports.append(onnx.helper.make_opsetid(domain, version))


def import_if_absent(imports, domain: str, version: int) -> None:
    """Import `domain` at `version` unless the imports already hold it (at whatever version)."""
    if all(o.domain != domain for o in imports):
        imports.append(onnx.helper.make_opsetid(domain, version))


def ai_onnx_version(imports) -> int | None:
    """The ai.onnx opset among opset imports (its domain written "" or "ai.onnx"), or None."""
    return next((o.version for o in imports if o.domain in ("", "ai.onnx")), None)


def set_opset(imports, domain: str, version: int) -> None:
    """Import `domain` at exactly `version` (ai.onnx written "" or "ai.onnx")."""
    for o in imports:
        if o.domain == domain or (domain == "" and o.domain == "ai.onnx"):
            o.version = version
            return
    imports.append(onnx.helper.make_opsetid(domain, version))


def drop_opset(imports, domain: str) -> bool:
    """Remove `domain` from the imports; whether it was there."""
    drop = [o for o in imports if o.domain == domain]
    for o in drop:
        imports.remove(o)
    return bool(drop)
