"""Reading a oneDNN Graph JSON (benchdnn's cases, oneDNN's graph dump) and judging its structure.

`read(source)` returns a `Graph` whose ops are in an order where every tensor is
produced before it is used, or raises `ValidationError` with every problem found:
malformed JSON, fields of the wrong kind, dtypes oneDNN does not have, a tensor id
produced twice, a consumer that describes a tensor other than its producer does,
ports that name no tensor, and cycles.  Each problem names the op (id, name, kind).
"""
from __future__ import annotations

import json
import math
import os
import reprlib
from dataclasses import dataclass, field
from typing import NamedTuple

from dyndq.opdefs import Problem, ValidationError, dtypes
from dyndq.wording import cut

GRAPH = "oneDNN graph"  # the `graph` field of problems about the file as a whole


class Tensor(NamedTuple):
    """One logical tensor as an op sees it.  (Named tuples, not dataclasses: a graph dump holds
    tens of thousands of them, and a frozen dataclass takes twice as long to make.)"""

    id: int
    dtype: dtypes.DType
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    layout_type: str
    property_type: str

    def describe(self) -> str:
        return f"{self.dtype.onednn}{list(self.shape)}"


class Op(NamedTuple):
    id: int
    name: str
    kind: str
    attrs: dict  # name -> value
    attr_types: dict  # name -> oneDNN attribute type ("s64", "bool", "string", "f32", "s64[]", "f32[]")
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    def problem(self, argument: str | None, found: str, allowed: str) -> Problem:
        """A problem of this op, its name and kind cut to a readable length (wording.cut)."""
        return Problem(argument, found, allowed, op=cut(self.kind), node=cut(self.name), op_id=self.id, graph=GRAPH)

    def said(self) -> str:
        """The op as a message names it: `op 3 'fc'`."""
        return f"op {self.id} {cut(self.name)!r}"


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
    positions: dict[int, int] = field(default_factory=dict)  # op id -> its place in the file's list of ops


def _file_problem(argument: str, found: str, allowed: str) -> Problem:
    return Problem(argument, found, allowed, graph=GRAPH)


def load_json(source) -> dict:
    """The JSON object of a path, a JSON text or a dict; ValidationError when it is not one
    (a file that is not UTF-8 text, malformed JSON, nesting deeper than the parser follows)."""
    if isinstance(source, dict):
        return source
    if isinstance(source, (str, os.PathLike)) and not (isinstance(source, str) and source.lstrip()[:1] in ("{", "[")):
        path = os.fspath(source)
        said = cut(_printable(path), 200)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ValidationError([_file_problem("file", f"{said}: {e.strerror or e}", "a readable oneDNN graph JSON file")]) from None
        except UnicodeDecodeError as e:
            raise ValidationError([_file_problem("file", f"{said}: not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r})",
                                                 "a oneDNN graph JSON file, UTF-8 text")]) from None
        except ValueError:  # a NUL character, which no path holds
            raise ValidationError([_file_problem("file", f"{said!r}: a path with a NUL character",
                                                 "a readable oneDNN graph JSON file")]) from None
    else:
        text = source
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError) as e:
        raise ValidationError([_file_problem("json", f"malformed JSON ({cut(e, 200)})", "a oneDNN graph JSON object")]) from None
    except UnicodeDecodeError as e:  # bytes that are no UTF-8 (or UTF-16/32) text
        raise ValidationError([_file_problem("json", f"bytes that are not UTF-8 text (byte {e.start}: "
                                             f"{e.object[e.start:e.start + 1]!r})", "a oneDNN graph JSON object, UTF-8 text")]) from None
    except ValueError as e:
        if "integer string conversion" not in str(e):  # (Python's limit, sys.get_int_max_str_digits)
            raise
        raise ValidationError([_file_problem("json", "an integer literal of more than 4,300 digits",
                                             "a oneDNN graph JSON object (its integers are s64: at most 19 digits)")]) from None
    except RecursionError:
        raise ValidationError([_file_problem("json", "arrays or objects nested deeper than the parser follows",
                                             "a oneDNN graph JSON object (a few levels deep)")]) from None
    if not isinstance(doc, dict):
        raise ValidationError([_file_problem("json", f"a JSON {type(doc).__name__}", "a oneDNN graph JSON object")])
    return doc


class _Short(reprlib.Repr):
    def repr_int(self, x, level):
        """An int of any size: Python refuses repr() of one over 4,300 digits."""
        try:
            return super().repr_int(x, level)
        except ValueError:
            return f"<an integer of about {int(math.log10(abs(x))) + 1} digits>"


_SHOW = _Short()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict = 3, 60, 60, 8, 6


def show(value) -> str:
    """A value of the JSON as a problem shows it: short, and safe at any depth of nesting."""
    return _SHOW.repr(value)


def unencodable(text) -> bool:
    """Whether a str holds what UTF-8 cannot encode (a lone surrogate, from an escape such as
    \\ud800): ONNX's names and strings are UTF-8."""
    if not isinstance(text, str):
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _text(value) -> str:
    """A field that should hold text, as text: the string itself, or the value shown short (a number
    of any size, a list)."""
    return value if isinstance(value, str) else show(value)


def _printable(text) -> str:
    """_text(text), with what UTF-8 cannot encode written as escapes (so that a problem prints)."""
    return _text(text).encode("utf-8", "backslashreplace").decode("utf-8")


def _is_int(x) -> bool:
    return type(x) is int  # not bool, whose type is its own


UNKNOWN_DIM = -(2**63)  # DNNL_GRAPH_UNKNOWN_DIM: a dim oneDNN infers (from the producer), also written -1
INT64_MAX = 2**63 - 1
MAX_RANK = 12  # DNNL_MAX_NDIMS
MAX_ELEMENTS = 2**53  # far beyond any real tensor; bounds what a hostile file can make us allocate


def _dim(d) -> int | None:
    """A dim as we hold it (-1 for unknown), or None when it is none."""
    if type(d) is not int:
        return None
    if d == UNKNOWN_DIM or d == -1:
        return -1
    return d if 0 <= d <= INT64_MAX else None


def _shape(shape, where: str, blame) -> tuple[tuple[int, ...] | None, list]:
    if not isinstance(shape, list):
        return None, [blame(f"{where}.shape", show(shape), "a list of dimensions")]
    if len(shape) <= MAX_RANK:  # the common case first: known dims, a sensible count
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                break
            count *= d or 1
        else:
            if count <= MAX_ELEMENTS:
                return tuple(shape), []
    if len(shape) > MAX_RANK:
        return None, [blame(f"{where}.shape", f"rank {len(shape)}", f"a rank of at most {MAX_RANK} (oneDNN's DNNL_MAX_NDIMS)")]
    dims = tuple(_dim(d) for d in shape)
    if None in dims:
        bad = shape[dims.index(None)]
        return None, [blame(f"{where}.shape", f"{show(shape)} (dimension {show(bad)})",
                            "dimensions that are integers in [0, 2^63 - 1], or -1 or -9223372036854775808 "
                            "(DNNL_GRAPH_UNKNOWN_DIM) for unknown")]
    count = 1
    for d in dims:
        count *= max(d, 1)
    if count > MAX_ELEMENTS:
        return None, [blame(f"{where}.shape", f"{list(dims)}: {count:.3g} elements", "at most 2^53 elements")]
    return dims, []


def _tensor(raw, where: str, problems: list, blame) -> Tensor | None:
    """One logical tensor, or None with its problems added."""
    if not isinstance(raw, dict):
        problems.append(blame(where, show(raw), "a logical tensor object"))
        return None
    tid = raw.get("id")
    bad = [] if type(tid) is int and -2**63 <= tid <= INT64_MAX else [
        blame(f"{where}.id", "missing" if tid is None else show(tid), "an integer tensor id (int64)")]
    name = raw.get("dtype")
    dtype = _BY_ONEDNN.get(name) if type(name) is str else None
    if dtype is None:
        known = ", ".join(d.onednn for d in dtypes.DTYPES if d.onednn)
        bad.append(blame(f"{where}.dtype", show(name), f"a oneDNN dtype: {known}"))
    shape, wrong = _shape(raw.get("shape", []), where, blame)
    bad += wrong
    stride = raw.get("stride", [])
    layout = raw.get("layout_type", "strided")
    if type(stride) is not list or not all(type(s) is int and UNKNOWN_DIM <= s <= INT64_MAX for s in stride):
        bad.append(blame(f"{where}.stride", show(stride), "a list of integer strides (int64)"))
    elif (shape is not None and stride and len(stride) != len(shape) and layout == "strided"
          and UNKNOWN_DIM not in stride):
        bad.append(blame(f"{where}.stride", f"{len(stride)} strides for a rank-{len(shape)} tensor", "one stride per dimension"))
    problems += bad
    if bad:
        return None
    return Tensor(tid, dtype, shape, tuple(stride), _text(layout), _text(raw.get("property_type", "undef")))


_BY_ONEDNN = {d.onednn: d for d in dtypes.DTYPES if d.onednn}


def _attrs(raw, blame, problems) -> tuple[dict, dict]:
    values, types = {}, {}
    if raw is None:
        return values, types
    if not isinstance(raw, dict):
        problems.append(blame("attrs", show(raw), "an object of attributes {name: {type, value}}"))
        return values, types
    for key, a in raw.items():
        if unencodable(key) or isinstance(a, dict) and unencodable(a.get("value")):
            problems.append(blame("attrs", f"{cut(key)!r}: a string UTF-8 cannot encode (a lone surrogate)",
                                  "attribute names and string values in UTF-8"))
            continue
        if not isinstance(a, dict) or "value" not in a:
            problems.append(blame(cut(key), show(a), "an attribute {\"type\": ..., \"value\": ...}"))
            continue
        values[key], types[key] = a["value"], _text(a.get("type", ""))
    return values, types


def _ops(doc: dict, problems: list) -> list[Op]:
    raw_ops = doc.get("graph")
    if not isinstance(raw_ops, list):
        problems.append(_file_problem("graph", "missing" if raw_ops is None else repr(type(raw_ops).__name__), "a list of ops"))
        return []
    ops = []
    for n, raw in enumerate(raw_ops):
        if not isinstance(raw, dict):
            problems.append(_file_problem(f"graph[{n}]", show(raw), "an op object"))
            continue
        oid, name, kind = raw.get("id"), raw.get("name", ""), raw.get("kind")

        def blame(argument, found, allowed, oid=oid, name=name, kind=kind):  # the op, as far as it can be told
            known = oid if _is_int(oid) and -2**63 <= oid <= INT64_MAX else None
            return Op(known, _printable(name), _printable(kind), {}, {}, (), ()).problem(argument, found, allowed)

        bad = len(problems)
        if not _is_int(oid) or not -2**63 <= oid <= INT64_MAX:
            problems.append(blame("id", "missing" if oid is None else show(oid), "an integer op id (int64)"))
        if unencodable(name):
            problems.append(blame("name", f"{cut(name)!r}: a string UTF-8 cannot encode (a lone surrogate)",
                                  "a name in UTF-8"))
        if not isinstance(kind, str) or not kind or unencodable(kind):
            problems.append(blame("kind", show(kind), "an op kind (a string such as \"MatMul\")"))
        attrs, types = _attrs(raw.get("attrs", {}), blame, problems)
        tensors = {}
        for side in ("inputs", "outputs"):
            lts = raw.get(side, [])
            if not isinstance(lts, list):
                problems.append(blame(side, show(lts), "a list of logical tensors"))
                lts = []
            tensors[side] = tuple(_tensor(lt, f"{side}[{i}]", problems, blame) for i, lt in enumerate(lts))
        if len(problems) == bad:
            ops.append(Op(oid, _text(name), kind, attrs, types, tensors["inputs"], tensors["outputs"]))
    return ops


def _producers(ops: list[Op], problems: list) -> dict[int, tuple[Op, Tensor]]:
    produced: dict[int, tuple[Op, Tensor]] = {}
    for op in ops:
        for i, t in enumerate(op.outputs):
            if t.id in produced:
                first = produced[t.id][0]
                problems.append(op.problem(f"outputs[{i}]", f"tensor {t.id}, which {first.said()} ({cut(first.kind)}) "
                                           "produces too", "a tensor id produced by one op only"))
            else:
                produced[t.id] = (op, t)
    return produced


def fits(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Two shapes that may describe one tensor: the same rank, and each dim equal or unknown in one."""
    return len(a) == len(b) and all(x == y or x < 0 or y < 0 for x, y in zip(a, b))


def _same_elements(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Two known shapes of other ranks or dims holding as many elements: one memory, two views."""
    return a != b and min(a + b, default=0) >= 0 and math.prod(a) == math.prod(b) and not fits(a, b)


def _agreements(ops: list[Op], produced: dict, problems: list, views: list) -> dict[int, tuple[int, ...]]:
    """Every description of a tensor must agree with its producer's (dtype and shape; a dim unknown
    in one is taken from another; a shape of as many elements is a view of the same memory,
    noted in `views`).  Returns the shapes in which an unknown dim was so filled."""
    first_seen: dict[int, tuple[Op, Tensor]] = dict(produced)
    known: dict[int, tuple[int, ...]] = {}
    for op in ops:
        for i, t in enumerate(op.inputs):
            if t.id not in first_seen:
                first_seen[t.id] = (op, t)
                continue
            other, want = first_seen[t.id]
            if t.dtype == want.dtype and _same_elements(t.shape, want.shape):
                views.append(f"tensor {t.id} is {list(want.shape)} as {other.said()} gives it and "
                             f"{list(t.shape)} as {op.said()} takes it: the same elements, reshaped")
            elif t.dtype != want.dtype or not fits(t.shape, want.shape):
                how = "produces" if t.id in produced else "takes"
                problems.append(op.problem(f"inputs[{i}]", f"tensor {t.id} as {t.describe()}",
                                           f"{want.describe()}, as {other.said()} ({cut(other.kind)}) {how} it"))
            elif t.shape != want.shape:
                base = known.get(t.id, want.shape)
                known[t.id] = tuple(x if x >= 0 else y for x, y in zip(base, t.shape))
    return known


def _filled(ops: list[Op], known: dict[int, tuple[int, ...]]) -> list[Op]:
    """The ops with every description of a tensor given the dims some description knows."""
    if not known:
        return ops

    def fill(ts):
        return tuple(t._replace(shape=known[t.id]) if t.id in known else t for t in ts)
    return [op._replace(inputs=fill(op.inputs), outputs=fill(op.outputs)) for op in ops]


def _sorted(ops: list[Op], produced: dict, problems: list) -> list[Op]:
    """Ops in an order where producers come first, the ops on a cycle each named.

    Kahn's algorithm with a ready queue, in rounds: round k holds the ops whose longest chain
    of producers has k ops, each round in the file's order (stable: the file's order where it
    can).  Each op's count of producers still to come goes down once per producer finished,
    so the whole takes time linear in the ops and tensors (and a sort per round)."""
    index = {id(op): n for n, op in enumerate(ops)}
    waiting = [0] * len(ops)  # producers (other than the op itself) still to come
    consumers: list[list[int]] = [[] for _ in ops]
    selfloops = []
    for n, op in enumerate(ops):
        producers = {index[id(produced[t.id][0])] for t in op.inputs if t.id in produced}
        if n in producers:
            selfloops.append(op)
            producers.discard(n)
        waiting[n] = len(producers)
        for p in producers:
            consumers[p].append(n)
    order: list[Op] = []
    ready = [n for n in range(len(ops)) if waiting[n] == 0]
    while ready:
        following = []
        for n in ready:
            order.append(ops[n])
            for c in consumers[n]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    following.append(c)
        ready = sorted(following)
    looped = {id(op) for op in selfloops}
    on_cycle = [op for n, op in enumerate(ops) if waiting[n] > 0 and id(op) not in looped]
    for op in selfloops + on_cycle:
        problems.append(op.problem("inputs", "an input that depends on the op's own output (a cycle)",
                                   "a graph without cycles"))
    return order


def _ports(doc: dict, key: str, problems: list) -> list[int] | None:
    ports = doc.get(key)
    if ports is None:
        return None
    if not isinstance(ports, list) or not all(_is_int(p) and -2**63 <= p <= INT64_MAX for p in ports):
        problems.append(_file_problem(key, show(ports), "a list of tensor ids (int64)"))
        return None
    return list(dict.fromkeys(ports))  # a port listed twice is one port


def read(source) -> Graph:
    """The graph in `source` (a path, a JSON text or a dict), judged; see the module doc."""
    doc = load_json(source)
    problems: list[Problem] = []
    ops = _ops(doc, problems)
    ids: set[int] = set()
    for op in ops:  # every op after the first of an id is named
        if op.id in ids:
            problems.append(op.problem("id", f"op id {op.id}, used by another op too", "a unique op id"))
        ids.add(op.id)
    produced = _producers(ops, problems)
    views: list[str] = []
    known = _agreements(ops, produced, problems, views)
    if known and not problems:
        ops = _filled(ops, known)
        produced = _producers(ops, [])
    order = _sorted(ops, produced, problems)
    in_ports, out_ports = _ports(doc, "input_ports", problems), _ports(doc, "output_ports", problems)
    notes: list[str] = list(views)
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
            notes.append(f"output port {tid} names a tensor no op produces or takes: left out")
    if out_ports is not None and not outputs:  # every port named nothing: the values no op uses
        used = {t.id for op in ops for t in op.inputs}
        outputs = [t for op in order for t in op.outputs if t.id not in used]
    for key in ("version", "engine_kind", "fpmath_mode", "fpmath_mode_apply_to_int"):
        if unencodable(doc.get(key)):
            problems.append(_file_problem(key, f"{cut(doc[key])!r}: a string UTF-8 cannot encode (a lone surrogate)",
                                          "UTF-8 text"))
    if not ops and not problems:
        problems.append(_file_problem("graph", "no ops", "at least one op"))
    if problems:
        raise ValidationError(problems)
    return Graph(_text(doc.get("version", "")), _text(doc.get("engine_kind", "cpu")), _text(doc.get("fpmath_mode", "strict")),
                 _text(doc.get("fpmath_mode_apply_to_int", "false")), order, list(inputs.values()), outputs, notes,
                 {op.id: n for n, op in enumerate(ops)})
