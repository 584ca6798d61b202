"""What a run returns: the graph's outputs, or the values asked for by name (`run(..., outputs=[...])`).

Any value of the main graph can be asked for: a graph input, an initializer, or the output
of any of its nodes (ours, a function call, an If/Loop/Scan node).  Asked-for values become
the graph outputs of a copy of the model, so both engines return them as they return graph
outputs, int4/uint4 and bfloat16 ones included; the model passed in is left as it is.

ONNX Runtime needs the type of every graph output, where the reference engine needs none:
`exported_for_onnxruntime` writes in what ONNX infers (`value_types`), on the model or on its
export, and names each output whose type is neither declared nor inferable, and each that the
export removed or renamed: never another value in its place.
"""
from __future__ import annotations

from typing import Sequence

import onnx

from dyndq.plumbing.names import op_name
from dyndq.plumbing.walk import graphs
from dyndq.opdefs import Problem, ValidationError

_ALLOWED = "a value of the main graph: a graph input, an initializer or the output of one of its nodes"


class OutputNameError(ValidationError):
    """Outputs asked for that the model cannot give by that name (no value of the main graph
    has it, or it was asked twice): a mistake in the request, each problem naming it."""


def with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy of `model` whose graph outputs are `names`, in that order, each with the type the
    model declares for it (as a graph output, in value_info, as an input or initializer), or none;
    OutputNameError naming each name that is not a value of the main graph."""
    names = asked_outputs(model, names)
    declared = _declared_types(model.graph)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.output[:]
    for name in names:
        out.graph.output.append(declared[name] if declared[name] is not None else onnx.ValueInfoProto(name=name))
    return out


def asked_outputs(model: onnx.ModelProto, names: Sequence[str]) -> list[str]:
    """`names` as a list, each a value of the main graph, each once; else OutputNameError naming
    every name that is not."""
    if isinstance(names, (str, bytes)):
        raise TypeError("outputs must be a list of value names, not one string")
    names = list(names)
    values = _declared_types(model.graph)
    problems = []
    if not names:
        problems.append(Problem("outputs", "an empty list", "one value name or more (or None: the graph's outputs)"))
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            found = "an empty name" if name == "" else f"{type(name).__name__} {name!r}"
            problems.append(Problem(f"outputs[{i}]", found, "a value name (a non-empty string)"))
        elif name in names[:i]:
            problems.append(Problem(name, "a second request for it", "each value asked for once"))
        elif name not in values:
            problems.append(Problem(name, _where(model, name), _ALLOWED))
    if problems:
        raise OutputNameError(problems)
    return names


def _declared_types(graph: onnx.GraphProto) -> dict[str, onnx.ValueInfoProto | None]:
    """Each value of the graph (not of its bodies) -> a ValueInfoProto with its declared type, or None."""
    values: dict[str, onnx.ValueInfoProto | None] = {}
    for node in graph.node:
        values.update((o, None) for o in node.output if o)
    for t in list(graph.initializer) + [s.values for s in graph.sparse_initializer]:
        values[t.name] = onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
    for vi in graph.input:
        values[vi.name] = vi if vi.HasField("type") else values.get(vi.name)
    for vi in list(graph.value_info) + list(graph.output):  # (the last declaration wins: a graph output's)
        if vi.name in values and vi.HasField("type"):
            values[vi.name] = vi
    return values


def _where(model: onnx.ModelProto, name: str) -> str:
    """Why `name` is not a value of the main graph: one of a body's or a function's, or none."""
    for g in list(graphs(model.graph))[1:]:
        if name in {o for n in g.node for o in n.output} | {vi.name for vi in g.input}:
            return f"a value inside the body graph '{g.name}', which only its node sees"
    for f in model.functions:
        if name in {o for n in f.node for o in n.output} | set(f.input):
            return f"a value inside the model-local function {f.domain}::{f.name}"
    return "no value of that name in the model"


def exported_for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """`dyndq.export(model, target="onnxruntime", own_ops=False)` with every graph output of `model` kept by name and typed, as ONNX
    Runtime needs (and export's own check, which asks for what check_model(full_check=True) asks).

    An output that declares no type, or no shape, gets what ONNX infers on the model; one that
    ONNX cannot type there (made by a contrib op, say, which the export turns into standard ONNX)
    is left out of the export and put back after it, typed by what ONNX infers on the export.
    ValidationError names each output still of unknown type, and each the export removed or renamed.
    """
    from dyndq.exporter import export

    typed, unknown = _with_inferred_types(model)
    declared = {o.name: o for o in model.graph.output}
    if unknown:
        kept = [o for o in typed.graph.output if o.name not in unknown]
        del typed.graph.output[:]
        typed.graph.output.extend(kept)
    exported = export(typed, target="onnxruntime", own_ops=False)  # (standard ops in forms ORT runs)
    problems = []
    if unknown:
        from dyndq.checker import value_types

        inferred = value_types(exported).at("main")
        values = _declared_types(exported.graph)
        for name in unknown:
            theirs = inferred.get(name)
            if name not in values:
                continue  # (named below, with every output the export lost)
            if theirs is not None and theirs.WhichOneof("value") is not None:
                exported.graph.output.append(onnx.helper.make_value_info(name, theirs))
            elif _declared_elem(declared[name]):  # its element type, without a shape: enough for ONNX Runtime
                exported.graph.output.append(declared[name])
            else:
                problems.append(Problem(name, f"a graph output of unknown type ({_maker(model, name)})",
                                        "a type ONNX Runtime can read: declare it in the model (ONNX infers none, "
                                        "nor on the standard export), or run on the reference engine"))
    kept_names = {o.name for o in exported.graph.output}
    problems += [Problem(o.name, "a value that the export to standard ONNX (which ONNX Runtime runs) removed or renamed",
                         "a value the export keeps, or the reference engine")
                 for o in model.graph.output if o.name not in kept_names and o.name not in {p.argument for p in problems}]
    if problems:
        raise ValidationError(problems)
    return exported


def _with_inferred_types(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of the model whose graph outputs carry the types and shapes ONNX infers where they
    declare none (no type, element type UNDEFINED, or no shape); and the names of those that
    ONNX cannot type and shape."""
    lacking = [o for o in model.graph.output if _lacks_type(o)]
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if not lacking:
        return out, []
    from dyndq.checker import value_types

    inferred = value_types(model).at("main")
    unknown = []
    for mine in out.graph.output:
        if not _lacks_type(mine):
            continue
        theirs = inferred.get(mine.name)
        if theirs is not None and theirs.WhichOneof("value") is not None and not _lacks_type(
                onnx.helper.make_value_info(mine.name, theirs)):
            mine.type.CopyFrom(theirs)
        else:
            unknown.append(mine.name)
    return out, unknown


def _lacks_type(vi: onnx.ValueInfoProto) -> bool:
    if not vi.HasField("type"):
        return True
    if vi.type.WhichOneof("value") != "tensor_type":  # a sequence, map or optional: as declared
        return False
    return not vi.type.tensor_type.elem_type or not vi.type.tensor_type.HasField("shape")


def _declared_elem(vi: onnx.ValueInfoProto) -> bool:
    return vi.HasField("type") and (vi.type.WhichOneof("value") != "tensor_type" or vi.type.tensor_type.elem_type != 0)


def _maker(model: onnx.ModelProto, name: str) -> str:
    node = next((n for n in model.graph.node if name in n.output), None)
    if node is None:
        return "not made by a node"
    return f"made by {op_name(node)} {node.name!r}" if node.name else f"made by {op_name(node)}"
