"""Reading a oneDNN Graph JSON (benchdnn's cases, oneDNN's graph dump) and judging its structure.

`read(source)` returns a `Graph` whose ops are in an order where every tensor is
produced before it is used, or raises `ValidationError` with every problem found:
malformed JSON, fields of the wrong kind, dtypes oneDNN does not have, a tensor id
produced twice, a consumer that describes a tensor other than its producer does,
ports that name no tensor, and cycles.  Each problem names the op (id, name, kind).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from dyndq.opdefs import Problem, ValidationError, dtypes

GRAPH = "oneDNN graph"  # the `graph` field of problems about the file as a whole


@dataclass(frozen=True)
class Tensor:
    """One logical tensor as an op sees it."""

    id: int
    dtype: dtypes.DType
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    layout_type: str
    property_type: str

    def describe(self) -> str:
        return f"{self.dtype.onednn}{list(self.shape)}"


@dataclass(frozen=True)
class Op:
    id: int
    name: str
    kind: str
    attrs: dict  # name -> value
    attr_types: dict  # name -> oneDNN attribute type ("s64", "bool", "string", "f32", "s64[]", "f32[]")
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    def problem(self, argument: str | None, found: str, allowed: str) -> Problem:
        return Problem(argument, found, allowed, op=self.kind, node=self.name, op_id=self.id, graph=GRAPH)


@dataclass
class Graph:
    version: str
    engine_kind: str
    fpmath_mode: str
    fpmath_mode_apply_to_int: str
    ops: list[Op]  # producers before consumers
    inputs: list[Tensor]  # graph inputs, in port order, then the unproduced tensors found in the graph
    outputs: list[Tensor]
    notes: list[str] = field(default_factory=list)  # what was accepted but changed (ports naming no tensor ...)


def _file_problem(argument: str, found: str, allowed: str) -> Problem:
    return Problem(argument, found, allowed, graph=GRAPH)


def load_json(source) -> dict:
    """The JSON object of a path, a JSON text or a dict; ValidationError when it is not one."""
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, os.PathLike)) and not (isinstance(source, str) and source.lstrip().startswith("{")):
        path = os.fspath(source)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ValidationError([_file_problem("file", f"{path}: {e.strerror or e}", "a readable oneDNN graph JSON file")]) from None
    else:
        text = source
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise ValidationError([_file_problem("json", f"malformed JSON ({e})", "a oneDNN graph JSON object")]) from None
    if not isinstance(doc, dict):
        raise ValidationError([_file_problem("json", f"a JSON {type(doc).__name__}", "a oneDNN graph JSON object")])
    return doc


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _tensor(raw, where: str, problems: list, blame) -> Tensor | None:
    """One logical tensor, or None with its problems added."""
    if not isinstance(raw, dict):
        problems.append(blame(where, f"{raw!r}", "a logical tensor object"))
        return None
    bad = []
    tid = raw.get("id")
    if not _is_int(tid):
        bad.append(blame(f"{where}.id", "missing" if tid is None else repr(tid), "an integer tensor id"))
    name = raw.get("dtype")
    try:
        dtype = dtypes.by_onednn(name)
    except (KeyError, TypeError):
        known = ", ".join(d.onednn for d in dtypes.DTYPES if d.onednn)
        bad.append(blame(f"{where}.dtype", repr(name), f"a oneDNN dtype: {known}"))
        dtype = None
    shape = raw.get("shape", [])
    if not isinstance(shape, list) or not all(_is_int(d) and d >= -1 for d in shape):
        bad.append(blame(f"{where}.shape", repr(shape), "a list of dimensions (integers >= 0, -1 for unknown)"))
        shape = []
    stride = raw.get("stride", [])
    if not isinstance(stride, list) or not all(_is_int(s) for s in stride):
        bad.append(blame(f"{where}.stride", repr(stride), "a list of integer strides"))
        stride = []
    elif stride and len(stride) != len(shape) and raw.get("layout_type", "strided") == "strided":
        bad.append(blame(f"{where}.stride", f"{len(stride)} strides for a rank-{len(shape)} tensor", "one stride per dimension"))
    problems += bad
    if bad:
        return None
    return Tensor(tid, dtype, tuple(shape), tuple(stride), str(raw.get("layout_type", "strided")),
                  str(raw.get("property_type", "undef")))


def _attrs(raw, blame, problems) -> tuple[dict, dict]:
    values, types = {}, {}
    if raw is None:
        return values, types
    if not isinstance(raw, dict):
        problems.append(blame("attrs", repr(raw), "an object of attributes {name: {type, value}}"))
        return values, types
    for key, a in raw.items():
        if not isinstance(a, dict) or "value" not in a:
            problems.append(blame(key, repr(a), "an attribute {\"type\": ..., \"value\": ...}"))
            continue
        values[key], types[key] = a["value"], a.get("type", "")
    return values, types


def _ops(doc: dict, problems: list) -> list[Op]:
    raw_ops = doc.get("graph")
    if not isinstance(raw_ops, list):
        problems.append(_file_problem("graph", "missing" if raw_ops is None else repr(type(raw_ops).__name__), "a list of ops"))
        return []
    ops = []
    for n, raw in enumerate(raw_ops):
        if not isinstance(raw, dict):
            problems.append(_file_problem(f"graph[{n}]", repr(raw), "an op object"))
            continue
        oid, name, kind = raw.get("id"), raw.get("name", ""), raw.get("kind")
        label = Op(oid if _is_int(oid) else None, str(name), str(kind), {}, {}, (), ())

        def blame(argument, found, allowed, label=label):
            return label.problem(argument, found, allowed)

        bad = len(problems)
        if not _is_int(oid):
            problems.append(blame("id", "missing" if oid is None else repr(oid), "an integer op id"))
        if not isinstance(kind, str) or not kind:
            problems.append(blame("kind", repr(kind), "an op kind (a string such as \"MatMul\")"))
        attrs, types = _attrs(raw.get("attrs", {}), blame, problems)
        tensors = {}
        for side in ("inputs", "outputs"):
            lts = raw.get(side, [])
            if not isinstance(lts, list):
                problems.append(blame(side, repr(lts), "a list of logical tensors"))
                lts = []
            tensors[side] = tuple(_tensor(lt, f"{side}[{i}]", problems, blame) for i, lt in enumerate(lts))
        if len(problems) == bad:
            ops.append(Op(oid, str(name), kind, attrs, types, tensors["inputs"], tensors["outputs"]))
    return ops


def _producers(ops: list[Op], problems: list) -> dict[int, tuple[Op, Tensor]]:
    produced: dict[int, tuple[Op, Tensor]] = {}
    for op in ops:
        for i, t in enumerate(op.outputs):
            if t.id in produced:
                first = produced[t.id][0]
                problems.append(op.problem(f"outputs[{i}]", f"tensor {t.id}, which op {first.id} {first.name!r} "
                                           f"({first.kind}) produces too", "a tensor id produced by one op only"))
            else:
                produced[t.id] = (op, t)
    return produced


def _agreements(ops: list[Op], produced: dict, problems: list) -> None:
    """Every description of a tensor must agree with its producer's (dtype and shape)."""
    first_seen: dict[int, tuple[Op, Tensor]] = dict(produced)
    for op in ops:
        for i, t in enumerate(op.inputs):
            if t.id not in first_seen:
                first_seen[t.id] = (op, t)
                continue
            other, want = first_seen[t.id]
            if (t.dtype, t.shape) != (want.dtype, want.shape):
                how = "produces" if t.id in produced else "takes"
                problems.append(op.problem(f"inputs[{i}]", f"tensor {t.id} as {t.describe()}",
                                           f"{want.describe()}, as op {other.id} {other.name!r} ({other.kind}) {how} it"))


def _sorted(ops: list[Op], produced: dict, problems: list) -> list[Op]:
    """Ops in an order where producers come first (stable: the file's order where it can);
    the ops on a cycle are each named."""
    waiting = {op.id: {t.id for t in op.inputs if t.id in produced and produced[t.id][0] is not op} for op in ops}
    selfloops = [op for op in ops if any(t.id in produced and produced[t.id][0] is op for t in op.inputs)]
    done: set[int] = set()
    order: list[Op] = []
    remaining = list(ops)
    while remaining:
        ready = [op for op in remaining if all(produced[t][0].id in done for t in waiting[op.id])]
        if not ready:
            break
        for op in ready:
            done.add(op.id)
            order.append(op)
        remaining = [op for op in remaining if op.id not in done]
    for op in selfloops + [op for op in remaining if op not in selfloops]:
        problems.append(op.problem("inputs", "an input that depends on the op's own output (a cycle)",
                                   "a graph without cycles"))
    return order


def _ports(doc: dict, key: str, problems: list) -> list[int] | None:
    ports = doc.get(key)
    if ports is None:
        return None
    if not isinstance(ports, list) or not all(_is_int(p) for p in ports):
        problems.append(_file_problem(key, repr(ports), "a list of tensor ids"))
        return None
    return list(dict.fromkeys(ports))  # a port listed twice is one port


def read(source) -> Graph:
    """The graph in `source` (a path, a JSON text or a dict), judged; see the module doc."""
    doc = load_json(source)
    problems: list[Problem] = []
    ops = _ops(doc, problems)
    ids = [op.id for op in ops]
    for op in ops:
        if ids.count(op.id) > 1 and op is not next(o for o in ops if o.id == op.id):
            problems.append(op.problem("id", f"op id {op.id}, used by another op too", "a unique op id"))
    produced = _producers(ops, problems)
    _agreements(ops, produced, problems)
    order = _sorted(ops, produced, problems)
    in_ports, out_ports = _ports(doc, "input_ports", problems), _ports(doc, "output_ports", problems)
    notes: list[str] = []
    seen: dict[int, Tensor] = {}
    for op in ops:
        for t in op.inputs + op.outputs:
            seen.setdefault(t.id, t)
    consumed = [t for op in order for t in op.inputs if t.id not in produced]
    inputs: dict[int, Tensor] = {}
    for tid in in_ports or []:
        if tid in produced:
            op = produced[tid][0]
            problems.append(op.problem("input_ports", f"tensor {tid}, which this op produces", "graph inputs no op produces"))
        elif tid not in seen:
            notes.append(f"input port {tid} names no tensor of the graph: left out")
        else:
            inputs[tid] = seen[tid]
    for t in consumed:
        if t.id not in inputs:
            if in_ports is not None:
                notes.append(f"tensor {t.id} is used but not listed in input_ports: it became a graph input")
            inputs[t.id] = t
    outputs: list[Tensor] = []
    if out_ports is None:
        used = {t.id for op in ops for t in op.inputs}
        outputs = [t for op in order for t in op.outputs if t.id not in used]
    for tid in out_ports or []:
        if tid in produced:
            outputs.append(produced[tid][1])
        elif tid in inputs:
            outputs.append(inputs[tid])
        else:
            problems.append(_file_problem("output_ports", f"tensor {tid}, which no op produces or takes",
                                          "tensor ids of the graph"))
    if not ops and not problems:
        problems.append(_file_problem("graph", "no ops", "at least one op"))
    if problems:
        raise ValidationError(problems)
    return Graph(str(doc.get("version", "")), str(doc.get("engine_kind", "cpu")), str(doc.get("fpmath_mode", "strict")),
                 str(doc.get("fpmath_mode_apply_to_int", "false")), order, list(inputs.values()), outputs, notes)
