"""Which weights to quantize: every constant weight of the chosen ops, and why the others are not.

The weight of MatMul is B (quantized along its rows, the reduction axis -2; a 1-D B along its
only axis), of Gemm B (along axis 0, or 1 with transB=1), of Gather its data (along the last
axis, as ONNX Runtime quantizes it: for an embedding table [vocabulary, hidden], groups run
along hidden).  A weight is a constant of the node's scope or of a scope enclosing it, as ONNX
resolves names: an initializer, or a Constant node's value (the only constants a model-local
function holds).  Anything else (a value computed by the graph, a graph or function input, an
initializer that is also a graph input and so can be fed at run time, an integer or float64
tensor, an empty one, an axis shorter than the group) is left alone and named as a `Problem`.

A weight read by several nodes is one `Target`, quantized once along the axis of its first
reader in graph order; a reader of it that is not quantized (another op, an excluded node, a
graph output) keeps the float weight alive beside the quantized one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from dyndq.plumbing.types import attribute_values, dtype_name
from dyndq.plumbing.walk import is_constant_node, scopes
from dyndq.opdefs import Problem
from dyndq.wording import a as article

OPS = ("MatMul", "Gemm", "Gather")
WEIGHT_INPUT = {"MatMul": (1, "B"), "Gemm": (1, "B"), "Gather": (0, "data")}
FLOATS = ("float32", "float16", "bfloat16")
QUANTIZED = ("DynamicDequantize", "DequantizeLinear")  # a weight made by one of these is quantized already
IR_INPUTS_ARE_CONSTANT = 4  # below IR 4 every initializer is also listed among the graph inputs


@dataclass(frozen=True)
class Use:
    """One node reading a weight, and the axis it would have it quantized along."""

    graph: str  # the node's graph path ("main", "main/loop.body")
    index: int  # the node's index in its graph
    node: str  # the node's name, or OP#index
    op: str
    axis: int


@dataclass
class Target:
    """One weight to quantize: an initializer, or a Constant node's value."""

    name: str
    graph: str  # the path of the scope that holds it (a graph, or a function)
    dims: tuple[int, ...]
    dtype: str
    axis: int
    rule: str  # ONNX Runtime's rounding rule for its op: "matmul" or "gather" (rtn.py)
    uses: list[Use] = field(default_factory=list)
    keep_float: list[str] = field(default_factory=list)  # readers that still need the float weight
    listed_as_input: bool = False  # (IR < 4) also among the graph inputs: drop it there with it
    constant_node: bool = False  # held by a Constant node (in a function, the only constants there are)

    @property
    def ops(self) -> list[str]:
        return list(dict.fromkeys(u.op for u in self.uses))


@dataclass
class Plan:
    targets: list[Target]
    problems: list[Problem]  # weights left alone, and why


def label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"{node.op_type}#{index}"


def names_of(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """(node names, weight names: initializers and Constant outputs) of every scope, for judging `exclude`."""
    nodes, weights = set(), set()
    for scope in scopes(model):
        nodes.update(label(n, i) for i, n in enumerate(scope.nodes))
        weights.update(n.output[0] for n in scope.nodes if is_constant_node(n))
        if scope.graph is not None:
            weights.update(t.name for t in scope.graph.initializer)
    return nodes, weights


def plan(model: onnx.ModelProto, *, ops, exclude, group_size: int) -> Plan:
    """The weights of `model` to quantize (see the module doc)."""
    targets: dict[tuple[str, str], Target] = {}
    problems: list[Problem] = []
    constant_inputs = model.ir_version < IR_INPUTS_ARE_CONSTANT
    every = scopes(model)
    exclude = set(exclude)
    for scope in every:
        for i, node in enumerate(scope.nodes):
            if node.domain in ("", "ai.onnx") and node.op_type in ops and label(node, i) not in exclude:
                _judge(scope, i, node, exclude, group_size, constant_inputs, targets, problems)
    _find_other_readers(every, targets)
    return Plan(list(targets.values()), problems)


def _judge(scope, i, node, exclude, group_size, constant_inputs, targets, problems) -> None:
    """Make the weight `node` reads a target (or a use of one), or say why it is not one."""
    k, arg = WEIGHT_INPUT[node.op_type]
    name = node.input[k] if len(node.input) > k else ""

    def problem(found: str, allowed: str) -> None:
        problems.append(Problem(f"{arg} ({name!r})", found, allowed, op=node.op_type,
                                node=node.name or None, node_index=i, graph=scope.path))

    if name in exclude or not name:
        return
    holder = scope.resolve(name)
    tensor = holder.constant(name) if holder is not None else None
    is_input = holder is not None and holder.fed(name)
    if tensor is None and is_input and holder.graph is not None:
        tensor = next((t for t in holder.graph.initializer if t.name == name), None)
    if tensor is None:
        if holder is not None and holder.graph is None and is_input:
            problem("an input of a model-local function", "a constant weight (an initializer or a Constant node); "
                    "a function's inputs are not constants")
        elif holder is not None and (maker := _dequantizer(name, holder)) is not None:  # (quantized already)
            problem(f"the output of {maker[1].op_type} {label(maker[1], maker[0])!r}, a weight quantized already",
                    "a constant float weight (an initializer or a Constant node)")
        else:
            problem("a value computed by the graph or fed at run time, not an initializer",
                    "a constant weight (an initializer or a Constant node)")
        return
    if is_input and not constant_inputs:
        problem("an initializer that is also a graph input (it can be fed at run time)",
                "a constant weight (an initializer that is not a graph input)")
        return
    dtype = dtype_name(tensor.data_type)
    dims = tuple(tensor.dims)
    if dtype not in FLOATS:
        problem(f"{article(dtype or tensor.data_type)} tensor", "a float32, float16 or bfloat16 weight")
        return
    if not dims or 0 in dims:
        problem(f"a tensor of shape {list(dims)}", "a weight with at least one element along every axis")
        return
    axis = _axis(node, len(dims))
    if axis is None:
        problem(f"a tensor of shape {list(dims)}", "a 2-D B for Gemm")
        return
    if group_size != -1 and group_size > dims[axis]:
        problem(f"shape {list(dims)}: its axis {axis} ({dims[axis]} long) is shorter than the group size {group_size}",
                "a group size no larger than the axis (or -1: one group per whole axis)")
        return
    key = (holder.path, name)
    if key not in targets:
        rule = "gather" if node.op_type == "Gather" else "matmul"
        in_node = holder.constant(name) is not None and not any(t.name == name for t in (
            holder.graph.initializer if holder.graph is not None else ()))
        targets[key] = Target(name, holder.path, dims, dtype, axis, rule, listed_as_input=is_input,
                              constant_node=in_node)
    targets[key].uses.append(Use(scope.path, i, label(node, i), node.op_type, axis))


def _dequantizer(name: str, scope):
    """(index, node) of the DynamicDequantize or DequantizeLinear node of `scope` that makes
    `name`, through the Slice and Cast that follow it; None when no such node does."""
    made = scope.maker(name)
    while made is not None and made[1].op_type in ("Slice", "Cast") and made[1].input:
        made = scope.maker(made[1].input[0])
    return made if made is not None and made[1].op_type in QUANTIZED else None


def _axis(node: onnx.NodeProto, rank: int) -> int | None:
    if node.op_type == "MatMul":
        return rank - 2 if rank >= 2 else 0
    if node.op_type == "Gemm":
        return (1 if attribute_values(node).get("transB", 0) else 0) if rank == 2 else None
    return rank - 1  # Gather


def _find_other_readers(every, targets) -> None:
    """Note in each target every reader that is not one of its quantized uses (the same name
    read where it resolves to the target's scope)."""
    by_name: dict[str, list[Target]] = {}
    for t in targets.values():
        by_name.setdefault(t.name, []).append(t)
    uses = {(u.graph, u.index, t.name) for t in targets.values() for u in t.uses}
    for scope in every:
        for i, node in enumerate(scope.nodes):
            k = WEIGHT_INPUT.get(node.op_type, (None,))[0]
            for j, name in enumerate(node.input):
                for t in by_name.get(name, ()):
                    if not (j == k and (scope.path, i, name) in uses) and _resolves_to(scope, name, t):
                        t.keep_float.append(f"{label(node, i)} ({node.op_type})")
        for out in scope.outputs:
            for t in by_name.get(out, ()):
                if _resolves_to(scope, out, t):
                    t.keep_float.append(f"graph output {out!r}")


def _resolves_to(scope, name: str, target: Target) -> bool:
    holder = scope.resolve(name)
    return holder is not None and holder.path == target.graph
