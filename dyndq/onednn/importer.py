"""`load(path_or_dict)`: a oneDNN graph as an ONNX model, with a report of what was done.

All or nothing: every op is mapped by its kind's handler (kinds.py) and every problem of every op is
collected; any problem raises `ValidationError` with all of them, and no model is
returned.  The finished model must pass `dyndq.check`, and every value's dtype and
shape as ONNX infers them must be what the JSON declares; a disagreement is a
problem of the op that produced the value.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
import re
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import helper

from dyndq.plumbing.types import spec_of_type
from dyndq.onednn.emitter import NAME_BASE, OpEmitter, Refused
from dyndq.onednn.kinds import KINDS, REFUSED
from dyndq.onednn.reader import GRAPH, Graph, Op, Tensor, fits, read
from dyndq.opdefs import Problem, ValidationError
from dyndq.wording import cut

OPSET = 21
METADATA = ("version", "engine_kind", "fpmath_mode", "fpmath_mode_apply_to_int")


@dataclass
class ImportReport:
    ops: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # kind -> how many ops
    onnx_nodes: int = 0
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds.items()))
        return (f"{self.ops} oneDNN ops ({kinds}) -> {self.onnx_nodes} ONNX nodes; "
                f"{len(self.inputs)} inputs, {len(self.outputs)} outputs")


_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")


def value_names(graph: Graph) -> dict[int, str]:
    """Readable, unique names: the producer's (or first consumer's) op name, the tensor's role
    there, and its id: `deq_gate_dst_3`, `fc_gate_src_5`."""
    names: dict[int, str] = {}
    for op in graph.ops:
        base = _base(op)
        for i, t in enumerate(op.outputs):
            names[t.id] = f"{base}_{'dst' if i == 0 else f'dst{i}'}_{t.id}"
    for op in graph.ops:
        base = _base(op)
        roles = KINDS[op.kind].roles if op.kind in KINDS else ()
        for i, t in enumerate(op.inputs):
            names.setdefault(t.id, f"{base}_{roles[i] if i < len(roles) else f'in{i}'}_{t.id}")
    return names


def _base(op: Op) -> str:
    """What the names of an op's values start with: its name made safe (and at most NAME_BASE
    characters: the tensor id at the end keeps names unique), or its kind."""
    return (_UNSAFE.sub("_", op.name[:NAME_BASE]).strip("_") or op.kind.lower())[:NAME_BASE]


def _value_info(name: str, t: Tensor) -> onnx.ValueInfoProto:
    shape = [d if d >= 0 else None for d in t.shape]
    return helper.make_tensor_value_info(name, t.dtype.onnx, shape)


def node_names(graph: Graph) -> dict[int, str]:
    """op id -> node name: the op's name, with `#id` added where several ops share it
    (ONNX Runtime refuses two nodes of one name)."""
    count: dict[str, int] = {}
    for op in graph.ops:
        count[op.name] = count.get(op.name, 0) + 1
    return {op.id: op.name if op.name and count[op.name] == 1 else f"{op.name or op.kind}#{op.id}" for op in graph.ops}


def _map_ops(graph: Graph, names: dict[int, str], op_names: dict[int, str]) -> tuple[list, list, list[Problem], Graph]:
    """Every op mapped by its handler, in order; returns the nodes, initializers, problems and
    the graph with each shape the JSON leaves unknown as the producer computes it."""
    nodes, initializers, problems = [], [], []
    taken = set(names.values()) | set(op_names.values())
    canonical = {t.id: t.shape for t in graph.inputs}  # the shape a value has in the ONNX graph
    canonical.update((t.id, t.shape) for op in graph.ops for t in op.outputs)
    inferred: dict[int, tuple[int, ...]] = {}  # tensor id -> the shape its producer computes (see _resolved)
    ops, notes = [], []
    for op in graph.ops:
        if inferred:
            op = op._replace(inputs=tuple(t._replace(shape=inferred[t.id]) if t.id in inferred else t for t in op.inputs))
        ops.append(op)
        h = KINDS.get(op.kind)
        if op.kind in REFUSED:
            problems.append(op.problem("kind", repr(cut(op.kind)), REFUSED[op.kind]))
            continue
        if h is None:
            problems.append(op.problem("kind", repr(cut(op.kind)), f"a kind with a mapping: {', '.join(sorted(KINDS))}"))
            continue
        e = OpEmitter(op, names, taken, op_names[op.id], graph.positions.get(op.id))
        try:
            for i, t in enumerate(op.inputs):
                if canonical.get(t.id, t.shape) != t.shape:
                    e.view(i, t.shape)
            e.arity(h.inputs, h.outputs)
            h.to_onnx(e, h.read_attrs(e))
        except Refused:
            pass
        problems += e.problems
        if not e.problems:
            nodes += e.nodes
            initializers += e.initializers
            if any(d < 0 for t in op.outputs for d in t.shape):
                declared = {t.id: t.shape for t in op.outputs}
                ops[-1] = op = _resolved(op, e, names)
                for t in op.outputs:
                    if t.shape != declared[t.id]:
                        inferred[t.id] = canonical[t.id] = t.shape
                        notes.append(f"tensor {t.id} is {_written(declared[t.id])} in the JSON: {list(t.shape)}, as "
                                     f"{op.said()} computes it")
    if inferred:
        by_id = {t.id: t for op in ops for t in op.outputs}
        graph = replace(graph, ops=ops, outputs=[by_id.get(t.id, t) for t in graph.outputs], notes=graph.notes + notes)
    return nodes, initializers, problems, graph


def _written(shape: tuple[int, ...]) -> str:
    return "of unknown rank" if shape == (-1,) else f"{list(shape)} (-1: unknown)"


def _resolved(op: Op, e: OpEmitter, names: dict[int, str]) -> Op:
    """The op with each output shape the JSON leaves unknown (a dim written -1 or
    DNNL_GRAPH_UNKNOWN_DIM, or the rank: a shape written as that one dim) as ONNX infers it from
    the op's nodes and its inputs, which is how oneDNN infers it from the producer.  An output
    ONNX cannot infer keeps its shape, for the checks after to name."""
    from dyndq.scopes import value_types

    made = {o for n in e.nodes for o in n.output} | {i.name for i in e.initializers}
    sources = dict.fromkeys(i for n in e.nodes for i in n.input if i and i not in made)
    shapes = {names[t.id]: t for t in op.inputs}
    graph_inputs = [_value_info(name, shapes[name]) for name in sources if name in shapes]
    outputs = [helper.make_value_info(names[t.id], onnx.TypeProto()) for t in op.outputs]
    import dyndq

    model = dyndq.make_model(helper.make_graph(e.nodes, "op", graph_inputs, outputs, initializer=e.initializers),
                             opset=OPSET)
    types = value_types(model).at("main")
    resolved = []
    for t in op.outputs:
        spec = spec_of_type(types.get(names[t.id]))
        computed = tuple(spec.shape) if spec is not None and spec.shape is not None else None
        unknown_rank = t.shape == (-1,)
        if (computed is not None and all(isinstance(d, int) for d in computed)
                and (fits(computed, t.shape) or unknown_rank)):
            t = t._replace(shape=computed)
        resolved.append(t)
    return op._replace(outputs=tuple(resolved))


def _disagreements(model: onnx.ModelProto, graph: Graph, names: dict[int, str]) -> tuple[list[Problem], list]:
    """Each op output whose inferred dtype or shape differs from the declared one, as problems,
    and the (op, output index) whose declared shape holds as many elements as the computed one
    (oneDNN lets an op's dst be another view of what it computes: [256] for numpy's [1, 256])."""
    from dyndq.checker import value_types
    from dyndq.plumbing.types import spec_of_type

    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    for out in bare.graph.output:  # inferred from the inputs alone, not from what the JSON declares
        out.ClearField("type")
    types = value_types(bare)
    problems, views, viewed = [], [], set()
    for op in graph.ops:
        upstream = any(t.id in viewed for t in op.inputs)  # computed from a value about to be reshaped
        for i, t in enumerate(op.outputs):
            spec = spec_of_type(types.get(names[t.id]))
            if spec is None:
                continue
            if spec.dtype is not None and spec.dtype != t.dtype.name:
                problems.append(op.problem(f"outputs[{i}]", f"declared dtype {t.dtype.onednn}",
                                           f"{spec.dtype}, what the op computes from its inputs"))
            elif (spec.shape is not None and all(isinstance(d, int) for d in spec.shape)
                  and not fits(tuple(spec.shape), t.shape)):
                viewed.add(t.id)
                if upstream:
                    continue
                if min(t.shape, default=0) >= 0 and math.prod(spec.shape) == math.prod(t.shape):
                    views.append((op, i))
                else:
                    problems.append(op.problem(f"outputs[{i}]", f"declared shape {list(t.shape)}",
                                               f"{list(spec.shape)}, what the op computes from its inputs"))
    return problems, views


def _reshaped(model: onnx.ModelProto, views: list, names: dict[int, str]) -> onnx.ModelProto:
    """The model with each (op, output) of `views` computed under a fresh name and reshaped to the
    shape the JSON declares, by a node of the op's."""
    wanted = {names[op.outputs[i].id]: (op, op.outputs[i]) for op, i in views}
    nodes = []
    for node in model.graph.node:
        nodes.append(node)
        for k, out in enumerate(node.output):
            if out in wanted:
                op, t = wanted[out]
                computed, shape = f"{out}/computed", f"{out}/declared_shape"
                node.output[k] = computed
                model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(t.shape, np.int64), shape))
                reshape = helper.make_node("Reshape", [computed, shape], [out], name=f"{out}/as_declared")
                helper.set_metadata_props(reshape, {"onednn.id": str(op.id)})
                nodes.append(reshape)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def build(graph: Graph, name: str = "onednn") -> tuple[onnx.ModelProto, ImportReport]:
    import dyndq

    names, op_names = value_names(graph), node_names(graph)
    nodes, initializers, problems, graph = _map_ops(graph, names, op_names)
    if problems:
        raise ValidationError(problems)
    inputs = [_value_info(names[t.id], t) for t in graph.inputs]
    outputs = [_value_info(names[t.id], t) for t in graph.outputs]
    g = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = dyndq.make_model(g, opset=OPSET)
    for _ in graph.ops:  # each round reshapes the first views on a path; later ones are then seen anew
        problems, views = _disagreements(model, graph, names)
        if problems:
            raise ValidationError(problems)
        if not views:
            break
        model = _reshaped(model, views, names)
    io = {t.id for t in graph.inputs + graph.outputs}
    declared = {t.id: t for op in graph.ops for t in op.outputs if t.id not in io}
    model.graph.value_info.extend(_value_info(names[i], t) for i, t in declared.items())
    meta = {f"onednn.{k}": getattr(graph, k) for k in METADATA}
    meta["onednn.tensors"] = _tensor_notes(graph)
    helper.set_model_props(model, meta)
    by_name = {op_names[op.id]: op for op in graph.ops}
    problems = [_at_op(p, by_name) for p in dyndq.check(model)]
    if problems:
        raise ValidationError(problems)
    kinds: dict[str, int] = {}
    for op in graph.ops:
        kinds[op.kind] = kinds.get(op.kind, 0) + 1
    report = ImportReport(len(graph.ops), kinds, len(nodes), [i.name for i in inputs], [o.name for o in outputs],
                          list(graph.notes))
    return model, report


def _tensor_notes(graph: Graph) -> str:
    """What ONNX has no place for, kept for `dump`: each tensor's property type and layout type
    (each op keeps how it describes its own tensors: emitter.OpEmitter.tag)."""
    import json

    seen = {}
    for op in graph.ops:
        for t in op.inputs + op.outputs:
            seen.setdefault(str(t.id), [t.property_type, t.layout_type])
    return json.dumps(seen, separators=(",", ":"))


def _at_op(p: Problem, by_name: dict[str, Op]) -> Problem:
    """A problem `dyndq.check` found, told as the oneDNN op's (id, name, kind) where it is one's."""
    op = by_name.get(p.node)
    if op is None:
        return p
    return op.problem(p.argument, p.found, p.allowed)


def load(source) -> tuple[onnx.ModelProto, ImportReport]:
    """The oneDNN graph in `source` (a path, a JSON text or a dict) as an ONNX model, and a report.
    Raises ValidationError with every problem found; never returns a partial model."""
    with _no_collection():
        graph = read(source)
        return build(graph, _graph_name(source))


@contextlib.contextmanager
def _no_collection():
    """The cyclic garbage collector paused: a large graph makes hundreds of thousands of objects
    (none in a cycle), and the collector's passes over them took a sixth of a 20,000-op load."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _graph_name(source) -> str:
    name = "onednn"
    if isinstance(source, os.PathLike) or isinstance(source, str) and source.lstrip()[:1] not in ("{", "["):
        name = re.sub(r"\.json$", "", os.path.basename(os.fspath(source))) or name  # the graph is named after its file
        name = name.encode("utf-8", "backslashreplace").decode("utf-8")  # a file name need not be UTF-8
    return name


__all__ = ["GRAPH", "ImportReport", "load", "value_names"]
