"""Building graphs with our ops: nodes, the opset import, and models ONNX Runtime loads."""
from __future__ import annotations

import numbers
import operator

import onnx

from dyndq.plumbing.types import make_attribute
from dyndq.wording import a as article
from dyndq.opdefs import (DOMAIN, OpVersion, domains, dtypes, Problem, TensorSpec, ValidationError,
                          newest_domain_version, ops_of, resolve, versions_of)

# The newest ai.onnx opset ONNX Runtime 1.31 runs; models are made no newer.
ORT_MAX_OPSET = 26

DEFAULT_OP = "DynamicDequantize"


def op_version(op_type: str = DEFAULT_OP, domain: str = DOMAIN, version: int | None = None) -> OpVersion:
    """The handle a node of `op_type` resolves to when its model imports `domain` at
    `version` (the domain's newest version by default); ValidationError when there is none."""
    versions = versions_of(domain, op_type)
    if not versions:
        ops = ", ".join(ops_of(domain)) or "none"
        raise ValidationError([Problem("op_type", repr(op_type), f"an op of domain {domain!r}: {ops}")])
    newest = newest_domain_version(domain)
    if version is None:
        version = newest
    op = resolve(domain, op_type, _version_number(version))
    if op is None or version > newest:
        raise ValidationError([Problem("version", repr(version), f"a version of {domain!r} in 1..{newest} "
                                                                 f"({op_type} exists from version {versions[0]})")])
    return op


def _version_number(version) -> int:
    if isinstance(version, bool):
        raise ValidationError([Problem("version", repr(version), "an integer")])
    try:
        return operator.index(version)
    except TypeError:
        raise ValidationError([Problem("version", f"{version!r} ({type(version).__name__})", "an integer")]) from None


def make_node(inputs, outputs, *, name: str | None = None, op_type: str = DEFAULT_OP, domain: str = DOMAIN,
              version: int | None = None, **attributes) -> onnx.NodeProto:
    """A node of our domain (DynamicDequantize by default), e.g. `inputs` [src, scales] or
    [src, scales, zps], with the attributes given (and only those).

    It is judged by the op version the node will be imported at: `version` (the newest of
    the domain by default, as `make_model` imports).  An attribute that version does not
    declare, a value of the wrong kind, and the attribute rules of the op's shape function
    are refused here, at once, with every problem named.
    """
    op = op_version(op_type, domain, version)
    problems: list[Problem] = []
    inputs, outputs = _names(inputs, "inputs", problems), _names(outputs, "outputs", problems)
    coerced = {}
    for key, value in attributes.items():
        spec = op.attribute(key)
        if spec is None:
            known = ", ".join(a.name for a in op.attributes)
            problems.append(Problem(key, "an attribute this op does not have",
                                    f"the attributes of {op.qualname}-{op.since_version}: {known}"))
            continue
        try:
            coerced[key] = spec.kind.coerce(value)
        except TypeError as e:
            problems.append(Problem(key, str(e), f"a value of kind {spec.kind.name}"))
    for a in op.attributes:
        if a.required and a.name not in attributes:
            problems.append(Problem(a.name, "missing", f"{article(a.kind.name)} attribute (required)"))
    if not problems:
        # The op's shape function judges the attributes; with nothing known of the
        # inputs, attributes are all it judges.
        unknown = TensorSpec(None, None)
        try:
            op.shape_inference(*[unknown] * sum(not p.optional for p in op.inputs), **{**op.defaults(), **coerced})
        except ValidationError as e:
            problems += e.problems
    if inputs is not None:
        n_required = sum(not p.optional for p in op.inputs)
        if not n_required <= len(inputs) <= len(op.inputs):
            want = " or ".join(f"[{', '.join(p.name for p in op.inputs[:n])}]" for n in range(n_required, len(op.inputs) + 1))
            problems.append(Problem("inputs", f"{len(inputs)} inputs", want))
    if outputs is not None and len(outputs) != len(op.outputs):
        problems.append(Problem("outputs", f"{len(outputs)} outputs", f"[{', '.join(p.name for p in op.outputs)}]"))
    if problems:
        where = dict(op=op.qualname, node=name, node_index=None, graph=None)
        raise ValidationError([p.at(**where) for p in problems])
    node = onnx.helper.make_node(op.name, inputs, outputs, name=name, domain=domain)
    # sorted by name, as onnx.helper.make_node writes them
    node.attribute.extend(make_attribute(k, coerced[k], op.attribute(k).kind) for k in sorted(coerced))
    return node


def _names(names, what: str, problems: list[Problem]) -> list[str] | None:
    """A list of value names; a bare string is refused (it would be split into characters)."""
    if isinstance(names, (str, bytes)) or not all(isinstance(n, str) for n in _iter(names)):
        problems.append(Problem(what, repr(names), "a list of value names (strings)"))
        return None
    return list(names)


def _iter(names):
    try:
        return list(names)
    except TypeError:
        return [None]


def opset_import(version: int | None = None, domain: str = DOMAIN) -> onnx.OperatorSetIdProto:
    """The opset import a model needs for our domain (the newest version by default)."""
    return onnx.helper.make_opsetid(domain, newest_domain_version(domain) if version is None else version)


def ir_version_for(opset_imports) -> int:
    """The lowest IR version the opsets need. `make_model` stamps the newest one, which
    ONNX Runtime may refuse (1.31 loads IR <= 13 while onnx 1.23 stamps 14)."""
    return onnx.helper.find_min_ir_version_for(list(opset_imports), ignore_unknown=True)


def _version_needed(graph: onnx.GraphProto, domain: str) -> int | None:
    """The lowest version of `domain` whose ops hold every node of it in `graph` (its subgraphs
    included): the node's attributes, and the types its graph declares for its inputs (a node
    whose inputs' types are not declared needs the newest); None (the newest) for no node."""
    from dyndq.plumbing.walk import graphs

    need = None
    for g in graphs(graph):
        declared = {vi.name: vi.type.tensor_type.elem_type for vi in [*g.input, *g.value_info, *g.output]}
        declared.update({t.name: t.data_type for t in g.initializer})
        declared.update({n.output[0]: a.t.data_type for n in g.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
                         for a in n.attribute if a.name == "value"})
        for n in g.node:
            if n.domain == domain:
                lowest = next((v for v in versions_of(domain, n.op_type)
                               if _holds(resolve(domain, n.op_type, v), n, declared)), newest_domain_version(domain))
                need = max(need or 0, lowest)
    return need


def _holds(op: OpVersion, node: onnx.NodeProto, declared: dict) -> bool:
    """Whether `op` has every attribute of the node and takes the declared dtype of each input."""
    if any(op.attribute(a.name) is None for a in node.attribute):
        return False
    for param, name in zip(op.inputs, node.input):
        if not name:
            continue
        code = declared.get(name, 0)
        try:
            dtype = dtypes.by_onnx(code).name
        except KeyError:
            return False  # not declared: only the newest version is sure to hold it
        if dtype not in op.allowed_dtypes(param.name):
            return False
    return True


def make_model(graph: onnx.GraphProto, *, opset: int = 21, versions: dict[str, int] | None = None,
               **kwargs) -> onnx.ModelProto:
    """A model of `graph` importing ai.onnx at `opset`, our domain and every other registered
    domain its nodes use (each at the version its nodes need, or as `versions` says), at the
    lowest IR version they need.  A domain of ours that model-local functions (`functions=`) use
    is imported at one version by the model and all of them (the newest among their imports and
    what the graph's nodes need: ONNX's checker resolves a function's nodes under its import and
    the model's, and refuses the model where they differ; dyndq.plumbing.domain_imports); a
    function needing a newer version than `versions` pins is refused, by name (ValidationError)."""
    from dyndq.plumbing.domain_imports import align
    from dyndq.plumbing.walk import graphs

    newest = onnx.defs.onnx_opset_version()
    if isinstance(opset, bool) or not isinstance(opset, numbers.Integral) or not 1 <= int(opset) <= newest:
        raise ValidationError([Problem("opset", repr(opset), f"an ai.onnx opset in 1..{newest} (this onnx's newest)")])
    opset = int(opset)
    versions = dict(versions or {})
    used = {n.domain for g in graphs(graph) for n in g.node} & domains()
    imports = [onnx.helper.make_opsetid("", opset)]
    for domain in sorted(used | {DOMAIN} | set(versions)):
        imports.append(opset_import(versions[domain] if domain in versions else _version_needed(graph, domain), domain))
    kwargs.setdefault("ir_version", ir_version_for(imports))
    model = onnx.helper.make_model(graph, opset_imports=imports, **kwargs)
    align(model, {d: v for d, v in versions.items() if d in domains()})  # (the functions are the model's copies)
    return model
