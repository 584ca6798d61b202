"""Which weights to quantize: every constant weight of the chosen ops, and why the others are not.

The weight of MatMul is B (quantized along its rows, the reduction axis -2; a 1-D B along its
only axis), of Gemm B (along axis 0, or 1 with transB=1), of Gather its data (along the last
axis, as ONNX Runtime quantizes it: for an embedding table [vocabulary, hidden], groups run
along hidden).  A weight is a constant of the node's scope or of a scope enclosing it, as ONNX
resolves names: an initializer, or a Constant node's value (`value`, `value_float`,
`value_floats`; the only constants a model-local function holds, and where paddle2onnx, tf2onnx
and jax2tf put every weight), read directly or through Identity nodes (which go with it).  A
value computed by the graph or fed at run time (the K of an attention's Q @ K^T) is an
activation, not a weight: it is counted (`Plan.activations`), never named as a weight left
alone.  A weight that cannot be quantized (a function input, an initializer that is also a
graph input and so can be fed at run time, an integer or float64 tensor, an empty one, one
quantized already) is left alone and named as a `Problem`.  An axis shorter than the group is
one short group, padded as ONNX Runtime's quantizer pads it (numerics.py).

A weight read by several nodes is one `Target`, quantized once along the axis of its first
reader in graph order; a reader of it that is not quantized (another op, an excluded node, a
graph output) keeps the float weight alive beside the quantized one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from dyndq.plumbing.types import attribute_values, dtype_name
from dyndq.plumbing.walk import constant_value, is_constant_node, scopes  # noqa: F401  (constant_value: as plan.py has it)
from dyndq.opdefs import Problem
from dyndq.wording import a as article, plural

OPS = ("MatMul", "Gemm", "Gather")
WEIGHT_INPUT = {"MatMul": (1, "B"), "Gemm": (1, "B"), "Gather": (0, "data")}
# the weights of ops quantize never takes (weight-only quantization of OPS): counted, to say so
OTHER_WEIGHTS = {"Conv": (1,), "ConvTranspose": (1,), "LSTM": (1, 2), "GRU": (1, 2), "RNN": (1, 2)}
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
    via: list[tuple[str, int]] = field(default_factory=list)  # (graph, index) of Identity nodes between it and a use
    listed_as_input: bool = False  # (IR < 4) also among the graph inputs: drop it there with it
    constant_node: bool = False  # held by a Constant node (in a function, the only constants there are)

    @property
    def ops(self) -> list[str]:
        return list(dict.fromkeys(u.op for u in self.uses))


@dataclass
class Plan:
    targets: list[Target]
    problems: list[Problem]  # weights left alone, and why
    activations: list[Use] = field(default_factory=list)  # nodes whose weight input is computed or fed: not weights
    excluded: list[str] = field(default_factory=list)  # the nodes of those ops `exclude` left alone, by it
    # op -> how many of its nodes read a constant float weight quantize does not take (Conv's; an op of OPS not
    # among `ops`)
    other_weights: dict[str, int] = field(default_factory=dict)

    def other_weights_line(self, ops) -> str | None:
        """"3 Conv nodes read a constant float weight, which quantize does not quantize (...)"; None when none do."""
        if not self.other_weights:
            return None
        out = []
        for taken in (False, True):  # (ops quantize never takes, then those left out of `ops`)
            counts = {op: n for op, n in self.other_weights.items() if (op in OPS) == taken}
            if counts:
                why = (f"not among the ops asked for ({', '.join(ops)})" if taken else
                       f"which quantize does not quantize: it quantizes the weights of {', '.join(OPS[:-1])} and "
                       f"{OPS[-1]} only")
                verb = "reads" if sum(counts.values()) == 1 else "read"
                out.append(f"{' and '.join(plural(n, f'{op} node') for op, n in counts.items())} {verb} a constant "
                           f"float weight, {why}")
        return "; ".join(out)

    def activation_line(self) -> str | None:
        """"2 MatMuls whose B is an activation ..., not a weight", per op; None when there are none."""
        if not self.activations:
            return None
        counts: dict[str, int] = {}
        for u in self.activations:
            counts[u.op] = counts.get(u.op, 0) + 1
        parts = [f"{plural(n, op)} whose {WEIGHT_INPUT[op][1]} is" if n == 1 else f"{n} {op}s whose {WEIGHT_INPUT[op][1]} is"
                 for op, n in counts.items()]
        return (f"{' and '.join(parts)} an activation (computed by the graph or fed at run time), not a weight: "
                "left as they are")


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


def plan(model: onnx.ModelProto, *, ops, exclude) -> Plan:
    """The weights of `model` to quantize (see the module doc)."""
    targets: dict[tuple[str, str], Target] = {}
    problems: list[Problem] = []
    activations: list[Use] = []
    constant_inputs = model.ir_version < IR_INPUTS_ARE_CONSTANT
    excluded: list[str] = []
    every = scopes(model)
    exclude = set(exclude)
    for scope in every:
        for i, node in enumerate(scope.nodes):
            if node.domain in ("", "ai.onnx") and node.op_type in ops:
                if label(node, i) in exclude or _judge(scope, i, node, exclude, constant_inputs, targets,
                                                       problems, activations):
                    excluded.append(label(node, i))
    _find_other_readers(every, targets)
    return Plan(list(targets.values()), problems, activations, excluded, _other_weights(every, ops))


def _other_weights(every, ops) -> dict[str, int]:
    """op -> its nodes that read a constant float weight (rank 2 or more) and are not of `ops`."""
    positions = {**OTHER_WEIGHTS, **{op: (k,) for op, (k, _) in WEIGHT_INPUT.items() if op not in ops}}
    counts: dict[str, int] = {}
    for scope in every:
        for node in scope.nodes:
            if node.domain not in ("", "ai.onnx") or node.op_type not in positions:
                continue
            for k in positions[node.op_type]:
                if k < len(node.input) and node.input[k] and _float_constant(scope, node.input[k]):
                    counts[node.op_type] = counts.get(node.op_type, 0) + 1
                    break
    return counts


def _float_constant(scope, name: str) -> bool:
    holder, name, tensor, _ = _source(scope, name)
    if tensor is None and holder is not None and holder.graph is not None:  # (IR < 4: listed among the inputs too)
        tensor = next((t for t in holder.graph.initializer if t.name == name), None)
    return tensor is not None and dtype_name(tensor.data_type) in FLOATS and len(tensor.dims) >= 2


def _source(scope, name: str):
    """(holder scope, name, tensor or None, Identity nodes passed) for the value `name` read in
    `scope`: followed back through Identity nodes to the constant (or not) they pass on."""
    via = []
    holder = scope.resolve(name)
    while holder is not None:
        made = holder.maker(name)
        if made is None or made[1].op_type != "Identity" or made[1].domain not in ("", "ai.onnx") or not made[1].input:
            break
        via.append((holder.path, made[0]))
        name = made[1].input[0]
        holder = holder.resolve(name)
    tensor = holder.constant(name) if holder is not None else None
    if tensor is None and holder is not None and (made := holder.maker(name)) is not None and is_constant_node(made[1]):
        tensor = constant_value(made[1])
    return holder, name, tensor, via


def _judge(scope, i, node, exclude, constant_inputs, targets, problems, activations) -> bool:
    """Make the weight `node` reads a target (or a use of one), or say why it is not one; True when
    `exclude` names its weight (nothing said: it is left alone as asked)."""
    k, arg = WEIGHT_INPUT[node.op_type]
    name = node.input[k] if len(node.input) > k else ""

    def problem(found: str, allowed: str) -> None:
        problems.append(Problem(f"{arg} ({name!r})", found, allowed, op=node.op_type,
                                node=node.name or None, node_index=i, graph=scope.path))

    if not name:
        return False
    if name in exclude:
        return True
    holder, name, tensor, via = _source(scope, name)
    if via and name in exclude:
        return True
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
        else:  # (an activation: Q @ K^T's K, a weight fed at run time; not a weight to quantize)
            activations.append(Use(scope.path, i, label(node, i), node.op_type, -1))
        return False
    if is_input and not constant_inputs:
        problem("an initializer that is also a graph input (it can be fed at run time)",
                "a constant weight (an initializer that is not a graph input)")
        return False
    dtype = dtype_name(tensor.data_type)
    dims = tuple(tensor.dims)
    if dtype not in FLOATS:
        problem(f"{article(dtype or tensor.data_type)} tensor", "a float32, float16 or bfloat16 weight")
        return False
    if not dims or 0 in dims:
        problem(f"a tensor of shape {list(dims)}", "a weight with at least one element along every axis")
        return False
    axis = _axis(node, len(dims))
    if axis is None:
        problem(f"a tensor of shape {list(dims)}", "a 2-D B for Gemm")
        return False
    key = (holder.path, name)
    if key not in targets:
        rule = "gather" if node.op_type == "Gather" else "matmul"
        in_node = not any(t.name == name for t in (holder.graph.initializer if holder.graph is not None else ()))
        targets[key] = Target(name, holder.path, dims, dtype, axis, rule, listed_as_input=is_input,
                              constant_node=in_node)
    targets[key].uses.append(Use(scope.path, i, label(node, i), node.op_type, axis))
    targets[key].via.extend(v for v in via if v not in targets[key].via)
    return False


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
    """Note in each target every reader that is not one of its quantized uses nor an Identity
    passing it on to them (the same name, or an Identity's output, read where it resolves to
    where the target or that Identity is)."""
    makers = {scope.path: scope for scope in every}
    aliases: dict[str, list[tuple[Target, str]]] = {}  # name -> (target, path of the scope defining it)
    for t in targets.values():
        aliases.setdefault(t.name, []).append((t, t.graph))
        for path, index in t.via:
            aliases.setdefault(makers[path].nodes[index].output[0], []).append((t, path))
    uses = {id(t): {(u.graph, u.index) for u in t.uses} for t in targets.values()}
    passing = {id(t): set(t.via) for t in targets.values()}
    for scope in every:
        for i, node in enumerate(scope.nodes):
            k = WEIGHT_INPUT.get(node.op_type, (None,))[0]
            for j, name in enumerate(node.input):
                for t, path in aliases.get(name, ()):
                    mine = (j == k and (scope.path, i) in uses[id(t)]) or (scope.path, i) in passing[id(t)]
                    if not mine and _resolves_to(scope, name, path):
                        t.keep_float.append(f"{label(node, i)} ({node.op_type})")
        for out in scope.outputs:
            for t, path in aliases.get(out, ()):
                if _resolves_to(scope, out, path):
                    t.keep_float.append(f"graph output {out!r}")


def _resolves_to(scope, name: str, path: str) -> bool:
    holder = scope.resolve(name)
    return holder is not None and holder.path == path
