"""Which checkpoint tensor becomes which float weight of the model, and read which way round.

The float weights are the main graph's float initializers of more than one element, and the
float tensors of more than one element its Constant nodes make (`value`: a weight an exporter
folded into a Constant is imported as an initializer is, the Constant node going).  How the
graph reads one says its orientation against the checkpoint's [out, in] (torch's order):
MatMul's B is [in, out] (`transposed`: a Transpose follows the decode), a Transpose node, Gemm's B
with transB=1 and Gather's table read it as stored.  A square weight goes by that; any other by
its shape (equal: as stored; reversed: transposed).

The matching, in this order: by name (the checkpoint tensor's name is the weight's); by the
format's own name map (GGUF's TensorNameMap); by the --names map (checkpoint tensor ->
initializer); by shape and closeness of the checkpoint's dequantized values to the float weight
(the relative error ||w' - w|| / ||w||, the best below CLOSE_ENOUGH).  One checkpoint tensor may
stand for several weights (tied embeddings: one decode read by both).  Weights inside subgraphs
or functions are not imported: a tensor naming one is refused by name.

Mixtures of experts: a 3-D checkpoint tensor (GGUF's stacked experts, [E, out, in]) matches a 3-D
weight as a matrix does (its last two axes as stored or swapped), or, through the name map, each
per-expert 2-D weight (`...experts.3.w1.weight`: the name without the index is the stacked
tensor's) takes its expert's slice (`Checkpoint.expert`, added to the tensors as "name[3]"); a
fused gate_up weight takes the checkpoint's gate and up joined (a tensor made here, "gate+up")
where the name map knows the fused name, else is refused naming both.
"""
from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from dyndq.opdefs import Problem, ValidationError
from dyndq.plumbing.walk import graphs

FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
CLOSE_ENOUGH = 0.5  # the largest relative error a by-shape match takes (unrelated weights: about 1.4)
STORED, TRANSPOSED = "as stored", "transposed"


@dataclass
class Weight:
    name: str
    shape: tuple[int, ...]
    dtype: int
    reads: set = field(default_factory=set)  # STORED / TRANSPOSED, from the nodes reading it
    held_by: str = "initializer"  # or "Constant" (a main-graph Constant node's `value`)


@dataclass
class Match:
    weight: str
    tensor: str
    how: str  # "name", "name map", "--names", "shape"
    orientation: str  # STORED or TRANSPOSED
    error: float | None = None  # a by-shape match's relative error
    # a tensor made here of checkpoint tensors: ((name, expert index or None), ...): an expert's
    # slice of a 3-D tensor, or a fused gate_up of two
    parts: tuple = ()


def float_weights(model: onnx.ModelProto) -> dict[str, Weight]:
    """The main graph's float initializers and Constant tensors of more than one element, with how
    its nodes read them."""
    out = {t.name: Weight(t.name, tuple(t.dims), t.data_type) for t in model.graph.initializer
           if t.data_type in FLOATS and int(np.prod(t.dims)) > 1}
    for name, t in constant_tensors(model.graph).items():
        if t.data_type in FLOATS and int(np.prod(t.dims)) > 1 and name not in out:
            out[name] = Weight(name, tuple(t.dims), t.data_type, held_by="Constant")
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, i))
    for node in model.graph.node:
        for i, name in enumerate(node.input):
            w = out.get(name)
            if w is not None and len(w.shape) == 3:
                w.reads |= _expert_reads(node, i, consumers)
            if w is None or len(w.shape) != 2:
                continue
            if node.op_type == "MatMul" and i == 1:
                w.reads.add(TRANSPOSED)
            elif node.op_type == "Gemm" and i == 1:
                trans = next((a.i for a in node.attribute if a.name == "transB"), 0)
                w.reads.add(STORED if trans else TRANSPOSED)
            elif node.op_type == "Transpose" or (node.op_type == "Gather" and i == 0):
                w.reads.add(STORED)
    return out


def _expert_reads(node, i: int, consumers: dict) -> set:
    """How a node reads a 3-D weight [E, ., .] (a mixture of experts' stacked weights): a batched
    MatMul's B is [E, in, out] (TRANSPOSED); an expert taken by Gather on axis 0 is read as the 2-D
    weight it is (MatMul's B: TRANSPOSED; a Transpose: STORED)."""
    if node.op_type == "MatMul" and i == 1:
        return {TRANSPOSED}
    if node.op_type == "Transpose" and i == 0:
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [])
        return {STORED} if perm == [0, 2, 1] else set()
    if node.op_type != "Gather" or i != 0 or next((a.i for a in node.attribute if a.name == "axis"), 0) != 0:
        return set()
    reads = set()
    for user, j in consumers.get(node.output[0], []):
        if user.op_type == "MatMul" and j == 1:
            reads.add(TRANSPOSED)
        elif user.op_type == "Transpose":
            reads.add(STORED)
    return reads


def constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """output name -> the tensor of each Constant node of `graph` holding one (`value`)."""
    return {n.output[0]: a.t for n in graph.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")
            and len(n.output) == 1 for a in n.attribute if a.name == "value"}


def nested_weights(model: onnx.ModelProto) -> set[str]:
    """Names of initializers inside If/Loop/Scan bodies and of Constants in functions (not imported)."""
    names = set()
    for g in list(graphs(model.graph))[1:]:
        names.update(t.name for t in g.initializer)
    for f in model.functions:
        names.update(n.output[0] for n in f.node if n.op_type == "Constant")
    return names


def orientation(shape: tuple[int, ...], w: Weight) -> str | None:
    """How weight `w` holds a checkpoint tensor of `shape`: STORED, TRANSPOSED, or None (it fits not)."""
    shape = tuple(shape)
    matrix = len(shape) in (2, 3)  # (3-D: a mixture of experts' [E, out, in], each expert a matrix)
    square = matrix and shape[-1] == shape[-2]
    if square and w.shape == shape:
        return TRANSPOSED if w.reads == {TRANSPOSED} else STORED
    if w.shape == shape:
        return STORED
    if matrix and w.shape == (*shape[:-2], shape[-1], shape[-2]):
        return TRANSPOSED
    return None


def match(model: onnx.ModelProto, checkpoint, tensors: dict, names_map: dict | None = None,
          values=None) -> tuple[list[Match], list[Problem]]:
    """The matches of checkpoint tensors (`tensors`: name -> SourceTensor) onto the model's float
    weights, and the problems (a tensor whose shape fits not its weight, a --names entry naming
    nothing, a weight inside a subgraph).  `values(name)`: a weight's float values (by-shape)."""
    weights = float_weights(model)
    nested = nested_weights(model)
    matches: dict[str, Match] = {}
    problems: list[Problem] = []

    def take(weight: str, tensor: str, how: str, parts: tuple = ()) -> None:
        if weight in matches:
            return
        if weight in nested and weight not in weights:
            problems.append(Problem(f"weight {weight!r}", f"inside a subgraph or function (matched {how} to "
                                    f"checkpoint tensor {tensor!r})", "a weight of the main graph: only those are imported"))
            return
        w = weights[weight]
        way = orientation(tensors[tensor].shape, w)
        if way is None:
            problems.append(Problem(f"checkpoint tensor {tensor!r}", f"shape {list(tensors[tensor].shape)} (matched {how} "
                                    f"to weight {weight!r} of shape {list(w.shape)})",
                                    "the weight's shape or, for a matrix, its transpose"))
            return
        matches[weight] = Match(weight, tensor, how, way, parts=parts)

    known = set(weights) | nested
    stacked = [name for name, t in tensors.items() if len(t.shape) == 3]  # (the checkpoint's own, before any slice)
    for name in tensors:  # 1. by name
        if name in known:
            take(name, name, "by name")
    for weight in weights:  # 2. the format's own name map
        if weight not in matches:
            mapped = checkpoint.mapped_name(weight)
            if mapped in tensors:
                take(weight, mapped, f"by {checkpoint.format}'s name map")
            else:  # (a mixture of experts' weights: one expert of a 3-D tensor, or a fused gate_up of two)
                _experts_mapped(checkpoint, weights[weight], tensors, take, problems)
    for tensor, weight in (names_map or {}).items():  # 3. --names
        sliced = _EXPERT_OF.match(tensor)
        if tensor not in tensors and sliced and sliced.group(1) in tensors:  # ("blk.0.ffn_up_exps.weight[3]")
            _slice(checkpoint, tensors, sliced.group(1), int(sliced.group(2)))
        if tensor not in tensors:
            problems.append(Problem(f"--names entry {tensor!r}", "no tensor of that name in the checkpoint",
                                    "a tensor of the checkpoint"))
        elif weight not in known:
            problems.append(Problem(f"--names entry {tensor!r}", f"initializer {weight!r}: none in the model",
                                    "a float initializer of the model"))
        elif weight in matches and matches[weight].tensor != tensor:
            problems.append(Problem(f"--names entry {tensor!r}", f"initializer {weight!r}, matched {matches[weight].how} "
                                    f"to {matches[weight].tensor!r} already", "one tensor per initializer"))
        else:
            take(weight, tensor, "by --names", _parts_of(tensor, tensors))
    if values is not None:  # 4. by shape and closeness
        _by_shape(weights, tensors, matches, values)
        _experts_by_shape(checkpoint, weights, tensors, matches, values, stacked)
    return list(matches.values()), problems


# a model's weight of one expert (transformers 4's Mixtral `...block_sparse_moe.experts.3.w1.weight`,
# Qwen-MoE's and OLMoE's `...mlp.experts.3.gate_proj.weight`): the name llama.cpp's converter gives
# the stacked experts is that name without the index (its merged name, which gguf's name map knows)
_EXPERT_NAME = re.compile(r"^(.*\.experts)\.(\d+)\.(.+)$")
_EXPERT_OF = re.compile(r"^(.+)\[(\d+)\]$")  # an expert's slice: "blk.0.ffn_up_exps.weight[3]"
# transformers 5's fused experts hold gate and up as one [E, 2 * I, H] (`gate, up = ....chunk(2)`: gate first)
_GATE_UP = "gate_up_proj"


def _experts_mapped(checkpoint, w: Weight, tensors: dict, take, problems: list) -> None:
    """Weight `w`, which the name map found no tensor for, as part of a mixture of experts: one
    expert of a 3-D checkpoint tensor (its name without the expert's index mapped), or a fused
    gate_up [E, 2 * I, H] whose gate and up the checkpoint holds apart (each mapped, concatenated
    along the rows, gate first) where the name map knows the fused name for the architecture, else
    refused naming both."""
    how = f"by {checkpoint.format}'s name map"
    one = _EXPERT_NAME.match(w.name)
    if one:
        stacked = checkpoint.mapped_name(f"{one.group(1)}.{one.group(3)}")
        index = int(one.group(2))
        if stacked in tensors and _slice(checkpoint, tensors, stacked, index) is not None:
            take(w.name, f"{stacked}[{index}]", f"{how}, expert {index}", ((stacked, index),))
        return
    if not w.name.removesuffix(".weight").endswith(_GATE_UP) or len(w.shape) != 3:
        return
    gate, up = (checkpoint.mapped_name(w.name.replace(_GATE_UP, part)) for part in ("gate_proj", "up_proj"))
    if gate not in tensors or up not in tensors:
        return
    if checkpoint.mapped_name(w.name) is None:
        problems.append(Problem(f"weight {w.name!r}", f"a fused gate_up; the checkpoint holds its gate {gate!r} and up "
                                f"{up!r} apart, and {checkpoint.format}'s name map of {checkpoint.architecture!r} knows "
                                "no fused gate_up (the halves' order is not known for it)",
                                "a fused gate_up the name map knows, or the model's gate and up apart"))
        return
    name = f"{gate}+{up}"
    if name not in tensors:
        tensors[name] = _joined(name, tensors[gate], tensors[up])
    take(w.name, name, f"{how}, gate and up joined", ((gate, None), (up, None)))


def _slice(checkpoint, tensors: dict, tensor: str, index: int):
    """Expert `index` of 3-D tensor `tensor`, added to `tensors` as "tensor[index]" (None: the
    format cannot slice it, or no such expert)."""
    name = f"{tensor}[{index}]"
    if name not in tensors:
        found = checkpoint.expert(tensor, index)
        if found is None:
            return None
        tensors[name] = found
    return tensors[name]


def _parts_of(tensor: str, tensors: dict) -> tuple:
    sliced = _EXPERT_OF.match(tensor)
    return ((sliced.group(1), int(sliced.group(2))),) if sliced and sliced.group(1) in tensors else ()


def _joined(name: str, gate, up):
    """A SourceTensor of `gate` and `up` (each [E, I, H]) concatenated along their rows (axis -2),
    gate first: their decodes and one Concat (copies: exact)."""
    from dyndq.checkpoints.source import SourceTensor
    from dyndq.checkpoints.writer import Written

    if gate.shape[:-2] != up.shape[:-2] or gate.shape[-1] != up.shape[-1]:
        raise ValidationError([Problem(f"checkpoint tensors {gate.name!r} and {up.name!r}",
                                       f"shapes {list(gate.shape)} and {list(up.shape)}",
                                       "a gate and an up of one shape but their rows (to join them)")])
    shape = (*gate.shape[:-2], gate.shape[-2] + up.shape[-2], gate.shape[-1])

    def make_nodes(names, weight):
        from dyndq.plumbing.names import NameScope

        names = names if names is not None else NameScope()  # (one scope for both decodes: their names apart)
        a, b = gate.nodes(names, weight), up.nodes(names, weight)
        out = names.fresh(f"{weight}_joined")
        node = onnx.helper.make_node("Concat", [a.output, b.output], [out], axis=-2, name=names.fresh(f"{weight}_Concat"))
        return Written(a.nodes + b.nodes + [node], a.tensors + b.tensors, out, f"gate: {a.form}; up: {b.form}; Concat",
                       max(a.opset, b.opset), a.tables + b.tables, a.dtype)

    def make_values():
        return np.concatenate([gate.values(), up.values()], axis=-2)

    kind = gate.kind if gate.kind == up.kind else f"{gate.kind} + {up.kind}"
    return SourceTensor(name, shape, kind, gate.nbytes + up.nbytes, make_nodes, make_values,
                        f"gate {gate.name} and up {up.name} joined along the rows, gate first")


def unused(tensors: dict, matches: list[Match]) -> list[tuple]:
    """(name, kind, shape) of each checkpoint tensor no match uses, and of each expert of a 3-D
    tensor whose other experts are used ("name[i]"); the tensors made here are not listed."""
    whole = {m.tensor for m in matches if not m.parts}
    experts: dict[str, set] = {}
    for m in matches:
        for name, index in m.parts:
            if index is None:
                whole.add(name)
            else:
                experts.setdefault(name, set()).add(index)
    made = {m.tensor for m in matches if m.parts}
    out = []
    for t in tensors.values():
        if t.name in whole or t.name in made:
            continue
        if t.name in experts:
            out += [(f"{t.name}[{i}]", t.kind, tuple(t.shape[1:])) for i in range(t.shape[0]) if i not in experts[t.name]]
        elif not _EXPERT_OF.match(t.name) or _EXPERT_OF.match(t.name).group(1) not in tensors:
            out.append((t.name, t.kind, t.shape))
    return out


def relative_error(ours: np.ndarray, theirs: np.ndarray, dtype=np.float64) -> float:
    """||ours - theirs|| / ||theirs|| (||ours|| where theirs is all zeros), computed in `dtype`
    (the import's by-shape matching: float32, as its weights are, where float64 copies of every
    candidate would double what it holds; verify: float64)."""
    a, b = np.asarray(ours, dtype), np.asarray(theirs, dtype)
    with np.errstate(all="ignore"):
        norm = float(np.linalg.norm(b))
        return float(np.linalg.norm(a - b)) / norm if norm else float(np.linalg.norm(a))


def _by_shape(weights: dict, tensors: dict, matches: dict, values) -> None:
    left = [w for w in weights.values() if w.name not in matches]
    candidates = {t: [w for w in left if orientation(s.shape, w) is not None] for t, s in tensors.items()}
    best: dict[str, tuple[float, str]] = {}
    for tensor, fitting in candidates.items():
        if not fitting:
            continue
        with np.errstate(all="ignore"):  # (a drawn or damaged tensor's inf * 0 in its format's dequantization)
            decoded = tensors[tensor].values()  # (one tensor's values at a time)
        for w in fitting:
            theirs = np.asarray(values(w.name), np.float32)  # (float32 already: not copied)
            ours = np.swapaxes(decoded, -1, -2) if orientation(tensors[tensor].shape, w) == TRANSPOSED else decoded
            error = relative_error(ours, theirs, np.float32)
            del theirs, ours
            if np.isfinite(error) and error < CLOSE_ENOUGH and (w.name not in best or error < best[w.name][0]):
                best[w.name] = (error, tensor)
        del decoded
    for weight, (error, tensor) in best.items():
        matches[weight] = Match(weight, tensor, "by shape", orientation(tensors[tensor].shape, weights[weight]), error)


def _experts_by_shape(checkpoint, weights: dict, tensors: dict, matches: dict, values, stacked: list[str]) -> None:
    """The 2-D weights left, matched by shape and closeness to the experts of the checkpoint's 3-D
    tensors (an export's per-expert weights under names no map knows, `onnx::MatMul_12`): each
    expert's slice decoded alone (`Checkpoint.expert`: one expert's values at a time), compared with
    each weight of its shape; a weight takes the closest below CLOSE_ENOUGH."""
    left = [w for w in weights.values() if w.name not in matches and len(w.shape) == 2]
    best: dict[str, tuple[float, str, int]] = {}
    for tensor in stacked:
        n_expert, *shape = tensors[tensor].shape
        fitting = [w for w in left if orientation(tuple(shape), w) is not None]
        for index in range(n_expert) if fitting else ():
            part = checkpoint.expert(tensor, index)
            if part is None:
                break
            with np.errstate(all="ignore"):
                decoded = part.values()
            for w in fitting:
                theirs = np.asarray(values(w.name), np.float32)
                ours = decoded.T if orientation(tuple(shape), w) == TRANSPOSED else decoded
                error = relative_error(ours, theirs, np.float32)
                if np.isfinite(error) and error < CLOSE_ENOUGH and (w.name not in best or error < best[w.name][0]):
                    best[w.name] = (error, tensor, index)
            del decoded
    for weight, (error, tensor, index) in best.items():
        name = f"{tensor}[{index}]"
        _slice(checkpoint, tensors, tensor, index)
        matches[weight] = Match(weight, name, "by shape", orientation(tensors[name].shape, weights[weight]), error,
                                ((tensor, index),))


class WeightValues:
    """`values(name)`: a float weight's values as float32 (an initializer's, its external data read
    when `loaded` says where, or a Constant's), each read from the model once: the by-shape
    matching compares a weight with every checkpoint tensor of its shape, and a weight read again
    is read from a float32 copy in a temporary file (mapped, the pages the OS's), not from the
    model, whose external data would be read and converted once per candidate, nor held in
    memory, where all the candidates together would be the whole float model.  `reads` counts
    the reads from the model."""

    def __init__(self, model: onnx.ModelProto, loaded=None):
        self.by_name = {**constant_tensors(model.graph), **{t.name: t for t in model.graph.initializer}}
        self.loaded = loaded
        self.cached: dict[str, tuple] = {}  # name -> (temporary file, shape)
        self.reads = 0

    def __call__(self, name: str) -> np.ndarray:
        if name in self.cached:
            f, shape = self.cached[name]
            return np.memmap(f, np.float32, "r", shape=shape)
        self.reads += 1
        tensor = self.by_name[name]
        if self.loaded is not None:
            from dyndq.model_files import tensor_array

            array = tensor_array(tensor, self.loaded)
        else:
            array = numpy_helper.to_array(tensor)
        array = np.ascontiguousarray(array, np.float32)
        f = tempfile.TemporaryFile()  # (removed when closed: by close(), or when the object goes)
        f.write(array.data)
        f.flush()
        self.cached[name] = (f, array.shape)
        return array

    def close(self) -> None:
        for f, _ in self.cached.values():
            f.close()
        self.cached.clear()


def weight_values(model: onnx.ModelProto, loaded=None) -> WeightValues:
    """name -> the weight's float32 values, each read from the model once (WeightValues)."""
    return WeightValues(model, loaded)


__all__ = ["CLOSE_ENOUGH", "Match", "STORED", "TRANSPOSED", "Weight", "WeightValues", "constant_tensors", "float_weights", "match", "orientation", "unused",
           "relative_error",
           "ValidationError"]
