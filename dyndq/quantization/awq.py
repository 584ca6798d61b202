"""AWQ: per input channel a scale, searched on the layer's activations, multiplied into the weight
before it is rounded and divided out of the activation in the graph.

Lin, Tang, Tang, Yang, Chen, Wang, Xiao, Dang, Gan and Han, "AWQ: Activation-aware Weight
Quantization for LLM Compression and Acceleration" (2023), section 3.2, on a weight W [K, N] of
X @ W (a Gemm's transposed B [N, K] the same, read along its rows):

    s = mean|x|^alpha per input channel, over every calibration row (activations.py sums |x|),
        floored at 1e-4 and divided by sqrt(max s * min s) (the authors' code does both);
    alpha in 0, 0.05, ..., 1 (`ALPHAS`) minimising the layer's output error on the calibration rows
        ||X W - X diag(1/s) Q(diag(s) W)||^2 = tr(D^T G D), D = W - diag(1/s) Q(diag(s) W), G = X^T X,
        computed from the X^T X collected (no activation is held); ties go to the smaller alpha;
        with fewer calibration rows than 3/4 K, as |B D|^2 for B [R, K] with B^T B = G (`gram_factor`,
        R <= the rows): the same sum to float64 rounding, in R K N flops instead of K^2 N;
    Q: the format's rounding by rtn's rule, so alpha 0 (s = 1) gives rtn's very codes, and the
        error chosen is never above rtn's.

MatMuls reading the same X (q, k and v of an attention; gate and up) share one s, since the graph
divides X once: their errors are summed and alpha chosen for the sum.  A weight read by several X
ties them to one s as well (a `Group`: the X and the weights linked so).

Where this differs from the paper, and why:
- 1/s is stored in X's dtype (r: the Mul's tensor, or what is folded into X's producer) and the
  weight is divided by r in float64 and rounded to its dtype, so that X diag(r) @ diag(1/r) W is
  X @ W whatever r's rounding; the search scores the very r written;
- alpha alone is searched (the paper's section 3.2; the authors' later weight-clipping search is
  not done here).

Where 1/s goes (`Scaling.place`), for each X of a group whose alpha is not 0: into the node making
X when that is exact and X has no other reader than the group's MatMuls (nor is a graph output):
- LayerNormalization: its Scale and B (a last-axis vector of K) times r;
- MatMul or Gemm with a constant 2-D weight: that weight's output channels times r (and Gemm's C
  along its last axis; an Add of a constant bias after such a MatMul, its bias too): a weight the plan quantizes is multiplied when it is rounded (its own
  group's search, done after this one, sees it so: the groups are searched from the graph's end),
  a float one in the graph;
else one Mul by r before the group's readers of X.  The report's notes say which, per X.

With scale estimation, each weight of a group is refitted (scale_estimation.refine_weight on
diag(r) G diag(r)) right after the group's search, while the calibration holds its X^T X: the
search reads the groups from the graph's end, and a refit when the walker offers the weights (from
its start) would collect every X^T X again in passes of its own.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dyndq.opdefs import Problem, ValidationError
from dyndq.quantization.activations import MAIN
from dyndq.quantization.numerics import ScaleOutOfRange

ALPHAS = tuple(i / 20 for i in range(21))  # the grid over [0, 1]
FLOOR = 1e-4  # the least s before normalising (a dead channel's mean |x| is 0)


def scales_of(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    """s (float64 [K]) for the channels' mean |x| at `alpha` (see the module doc)."""
    s = np.maximum(np.asarray(mean_abs, np.float64) ** alpha, FLOOR)
    return s / np.sqrt(s.max() * s.min())


def multiplier(mean_abs: np.ndarray, alpha: float, dtype) -> np.ndarray:
    """r = 1/s as X's dtype holds it, in float64: what the graph multiplies X by."""
    with np.errstate(over="ignore", under="ignore"):
        return (1.0 / scales_of(mean_abs, alpha)).astype(dtype).astype(np.float64)


def scaled_weight(weight: np.ndarray, axis: int, rows: np.ndarray | None = None,
                  columns: np.ndarray | None = None) -> np.ndarray:
    """`weight` ([K, N] for axis 0, [N, K] for axis 1) divided by `rows` [K] along its input channels
    and multiplied by `columns` [N] along its output channels, in float64, rounded to its dtype."""
    w = np.asarray(weight, np.float64)
    if rows is not None:
        w = w / (rows[:, None] if axis == 0 else rows[None, :])
    if columns is not None:
        w = w * (columns[None, :] if axis == 0 else columns[:, None])
    with np.errstate(over="ignore"):
        return w.astype(np.asarray(weight).dtype)


def output_error(goal: np.ndarray, dequantized: np.ndarray, r: np.ndarray, gram: np.ndarray,
                 factor: np.ndarray | None = None) -> float:
    """tr(D^T G D) with D = goal - diag(r) dequantized, all [K, N] float64 (G: X^T X, [K, K]);
    with `factor` B ([R, K], B^T B = G: `gram_factor`), |B D|^2, the same sum in R K N flops."""
    d = goal - r[:, None] * dequantized
    if factor is not None:
        e = factor @ d
        return float(np.einsum("rn,rn->", e, e))
    return float(np.einsum("kn,kn->", d, gram @ d))


def gram_factor(gram: np.ndarray, rows: int) -> np.ndarray | None:
    """B [R, K] with B^T B = G (to float64 rounding) when X^T X of `rows` calibration rows has
    R < 3/4 K (fewer rows than channels: R <= rows), else None (G itself is as cheap).
    Cholesky with diagonal pivoting (Higham, "Accuracy and Stability of Numerical Algorithms",
    10.3: backward stable on a positive semidefinite matrix), stopped after `rows` steps or once
    the largest diagonal left is below 1e-13 of G's: each alpha's error then costs R K N flops
    instead of K^2 N (NumPy has no pivoted Cholesky; LAPACK's pstrf is not reached from it)."""
    g = np.asarray(gram, np.float64)
    k = g.shape[0]
    most = min(rows, k)
    if most >= 0.75 * k:
        return None
    left = np.diag(g).copy()
    floor = 1e-13 * max(float(left.max(initial=0.0)), 0.0)
    b = np.zeros((most, k))
    for j in range(most):
        p = int(np.argmax(left))
        if not left[p] > floor:
            b = b[:j]
            break
        column = g[p] - b[:j, p] @ b[:j]
        b[j] = column / np.sqrt(left[p])
        left -= b[j] * b[j]
        left[p] = 0.0
    return b


@dataclass
class Member:
    """One weight of a group: its array, the axis of its input channels, X^T X summed over its readers,
    and the output-channel multiplier a fold into it from a later X gives (None: none)."""

    key: tuple[str, str]
    weight: np.ndarray
    axis: int
    gram: np.ndarray
    columns: np.ndarray | None = None
    rows: int | None = None  # the calibration rows summed into `gram` (None: not known)

    @classmethod
    def of(cls, key, weight, axis: int, calibration, columns=None) -> "Member":
        """The member for weight `key`, its X^T X and rows from `calibration` (Calibration.gram:
        one input's own X^T X, not a copy)."""
        gram, rows = calibration.gram(key)
        return cls(key, weight, axis, gram, columns, rows)

    def goal(self) -> np.ndarray:
        """The weight the group's output should be: [K, N] float64, a fold's multiplier applied."""
        w = np.asarray(self.weight, np.float64)
        w = w if self.axis == 0 else w.T
        return w if self.columns is None else w * self.columns[None, :]


@dataclass
class Searched:
    alpha: float
    r: np.ndarray  # float64 [K]: 1/s as stored
    errors: dict[float, float]  # alpha -> the group's output error (inf: not quantizable at it)


def search(members: list[Member], mean_abs: np.ndarray, dtype, quantize) -> Searched:
    """The alpha of `ALPHAS` whose r gives the least summed output error of `members`;
    `quantize(weight, member)` gives the weight's values as the graph dequantizes them (raising
    ScaleOutOfRange for one it cannot quantize).  No alpha quantizable: alpha 0, error inf."""
    goals = [m.goal() for m in members]
    factors = [None if m.rows is None else gram_factor(m.gram, m.rows) for m in members]
    errors, best = {}, None
    for alpha in ALPHAS:
        r = multiplier(mean_abs, alpha, dtype)
        total = 0.0
        if not (np.isfinite(r).all() and (r > 0).all()):
            total = float("inf")
        for m, goal, factor in zip(members, goals, factors):
            if total == float("inf"):
                break
            try:
                values = quantize(scaled_weight(m.weight, m.axis, r, m.columns), m)
            except ScaleOutOfRange:
                total = float("inf")
                break
            values = np.asarray(values, np.float64)
            total += output_error(goal, values if m.axis == 0 else values.T, r, m.gram, factor)
        if not np.isfinite(total):
            total = float("inf")
        errors[alpha] = total
        if best is None or total < errors[best]:
            best = alpha
    if errors[best] == float("inf"):
        best = 0.0
    return Searched(best, multiplier(mean_abs, best, dtype), errors)


class AwqError(ValidationError):
    """A weight AWQ scaled that could then not be quantized (the graph divides its input already)."""


@dataclass
class Group:
    """X values and the weights reading them that share one s."""

    values: list[str] = field(default_factory=list)
    keys: list[tuple[str, str]] = field(default_factory=list)
    inputs: list = field(default_factory=list)  # activations.LayerInput, distinct
    searched: Searched | None = None


class Scaling:
    """AWQ's scales of one quantize call: searched (`Scaling.build`), placed in the graph, and applied
    to each weight as it is rounded (`quantize`)."""

    def __init__(self):
        self.rows: dict[tuple[str, str], np.ndarray] = {}  # weight -> r (its input channels divided by it)
        self.columns: dict[tuple[str, str], np.ndarray] = {}  # weight -> r of a fold (its outputs times it)
        self.notes: list[str] = []
        self.searched_errors: dict[tuple[str, str], dict] = {}  # weight -> its group's error at each alpha
        self.refined: dict = {}  # weight -> its QuantizedWeight with scale estimation, made while X^T X is held

    def scaled(self, weight, target) -> np.ndarray:
        """The weight as awq rounds it: divided by its rows' r, times a fold's columns' r."""
        key = (target.graph, target.name)
        rows, columns = self.rows.get(key), self.columns.get(key)
        return weight if rows is None and columns is None else scaled_weight(weight, target.axis, rows, columns)

    def input_gram(self, gram: np.ndarray, target) -> np.ndarray:
        """X^T X of the scaled weight's input X diag(r) (diag(r) G diag(r); a fold's columns leave
        the input as it is), for scale estimation on top of awq."""
        r = self.rows.get((target.graph, target.name))
        return gram if r is None else gram * np.outer(r.astype(np.float64), r.astype(np.float64))

    def quantize(self, weight, target, options, refine=None):
        """The weight's numerics.QuantizedWeight: its scaled weight rounded by the format's rtn
        (then `refine(scaled, q)`'s, scale estimation's refit, where given)."""
        try:
            scaled = self.scaled(weight, target)
            q = rounded(scaled, target, options)
            return q if refine is None else refine(scaled, q)
        except ScaleOutOfRange as e:  # (left alone it would be wrong: the graph's X is scaled for it)
            raise AwqError([Problem(f"weight {target.name!r}", f"scaled by awq, {e.found}", e.allowed)]) from None

    def _refine(self, members, by_key, calibration, options) -> None:
        """Each member's weight rounded and refitted by scale estimation now, while its group's
        X^T X is held (what calibration.py would do when the walker offers it, bit for bit, without
        collecting that X^T X again in a pass of its own: `Calibration.awq_refit`, the same call); a
        weight it cannot quantize is left for then."""
        for m in members:
            try:
                self.refined[m.key] = calibration.awq_refit(self, m.weight, by_key[m.key], options)
            except AwqError:  # (calibration.py's call says it, named)
                pass

    @classmethod
    def build(cls, out: onnx.ModelProto, targets, calibration, options, read, names, progress=None) -> Scaling:
        """Search every group's alpha (from the graph's end) and place its 1/s in `out` (the model
        the walker rewrites next: its nodes and small tensors changed in place; `read(tensor)` gives a
        constant's array)."""
        self = cls()
        by_key = {(t.graph, t.name): t for t in targets}
        nodes = out.graph.node
        inits = {t.name: t for t in out.graph.initializer}
        groups = _groups(calibration)
        groups.sort(key=lambda g: -min(u.index for k in g.keys for u in by_key[k].uses))
        searched_keys: set = set()
        inserts: list[tuple[int, onnx.NodeProto]] = []
        readers = _readers(out)
        for n, group in enumerate(groups):
            if progress:
                progress(f"awq: searching the scale of {_values(group)} ({n + 1}/{len(groups)})")
            uses = [(k, u) for k in group.keys for u in by_key[k].uses]
            shown = ", ".join(dict.fromkeys(u.node for _, u in uses))
            if any(i.transposed for i in group.inputs):
                self.notes.append(f"awq: {_values(group)} read transposed (Gemm transA) by {shown}: not scaled "
                                  "(rtn's rounding)")
                searched_keys.update(group.keys)
                continue
            rows = sum(calibration.stats[i].rows for i in group.inputs)
            mean_abs = sum(calibration.stats[i].abs_sum for i in group.inputs) / max(rows, 1)
            dtype = np.dtype(group.inputs[0].dtype) if group.inputs[0].dtype != "bfloat16" else _bfloat16()
            members = [Member.of(k, read(inits[k[1]]) if k[1] in inits else _constant(out, k[1]), by_key[k].axis,
                                 calibration, self.columns.get(k))
                       for k in group.keys]

            def values_of(w, m, target_of=by_key):
                return options.fmt.dequantize(rounded(w, target_of[m.key], options), w.dtype)

            group.searched = found = search(members, mean_abs, dtype, values_of)
            searched_keys.update(group.keys)
            self.searched_errors.update({k: found.errors for k in group.keys})
            if found.alpha != 0:
                for k in group.keys:
                    self.rows[k] = found.r
            if options.scale_estimation:  # (rows and columns final: a fold into it is from a group searched before)
                self._refine(members, by_key, calibration, options)
            del members
            if found.alpha == 0:
                self.notes.append(f"awq: {_values(group)} (read by {shown}): alpha 0, no scale (rtn's rounding)")
                continue
            for value in group.values:
                mine = [(k, u) for k, u in uses if nodes[u.index].input[0] == value]
                where = _fold(out, value, {u.index for _, u in mine}, found.r, readers, inits, by_key, searched_keys,
                              self, read, names)
                if where is None:
                    where = _mul(out, value, [u.index for _, u in mine], found.r, dtype, names, inserts)
                self.notes.append(f"awq: {value!r} (read by {', '.join(dict.fromkeys(u.node for _, u in mine))}): "
                                  f"alpha {found.alpha:g}, 1/s {where}")
        for position, node in sorted(inserts, key=lambda p: -p[0]):
            nodes.insert(position, node)
        return self


def rounded(weight, target, options):
    """`weight` (of plan.Target `target`) quantized by the format's rtn rule."""
    return options.fmt.quantize(weight, target, dataclasses.replace(options, method="rtn"), options.bits)


def _bfloat16():
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def _values(group: Group) -> str:
    return ", ".join(map(repr, group.values))


def _groups(calibration) -> list[Group]:
    """The groups of calibration.inputs: X values and weights linked by reading (union-find)."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for key, inputs in calibration.inputs.items():
        for i in inputs:
            parent[find(("w", key))] = find(("x", i.value))
    groups: dict = {}
    for key, inputs in calibration.inputs.items():
        g = groups.setdefault(find(("w", key)), Group())
        g.keys.append(key)
        for i in inputs:
            if i.value not in g.values:
                g.values.append(i.value)
            if i not in g.inputs:
                g.inputs.append(i)
    return list(groups.values())


def _readers(model: onnx.ModelProto) -> dict[str, list]:
    """value name -> where it is read: ("main", index) for a main-graph node, ("other", path) for a
    node of a subgraph or function, ("output", name) for a graph output."""
    from dyndq.plumbing.walk import scopes

    out: dict[str, list] = {}
    for scope in scopes(model):
        for i, node in enumerate(scope.nodes):
            for name in node.input:
                if name:
                    out.setdefault(name, []).append(("main", i) if scope.path == MAIN else ("other", scope.path))
    for o in model.graph.output:
        out.setdefault(o.name, []).append(("output", o.name))
    return out


def _constant(model: onnx.ModelProto, name: str) -> np.ndarray:
    """A main-graph Constant node's array (a weight the plan found held so)."""
    from dyndq.plumbing.walk import constant_value, is_constant_node

    for node in model.graph.node:
        if is_constant_node(node) and node.output[0] == name:
            return numpy_helper.to_array(constant_value(node))
    raise KeyError(name)


def _fold(out, value, reader_indices, r, readers, inits, by_key, searched_keys, scaling, read, names) -> str | None:
    """Fold r into the node making `value` where that is exact (see the module doc): the words for the
    note, or None when it is not done."""
    if {where for where in readers.get(value, [])} != {("main", i) for i in reader_indices} \
            or len(readers.get(value, [])) != len(reader_indices):
        return None
    made = [(i, n) for i, n in enumerate(out.graph.node) if value in n.output]
    if len(made) != 1:
        return None
    index, node = made[0]
    if node.domain not in ("", "ai.onnx") or node.output[0] != value:
        return None
    k = len(r)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def constant(position):
        name = node.input[position] if len(node.input) > position else ""
        t = inits.get(name)
        fed = {i.name for i in out.graph.input}
        return None if t is None or name in fed else t

    def only_reader(name):
        return readers.get(name, []) == [("main", index)]

    def replace(position, array):
        """The node's constant input `position` as `array`: in place when the node is its only reader,
        else a new initializer of its own."""
        old = node.input[position]
        tensor = numpy_helper.from_array(array, old)
        if only_reader(old):
            inits[old].CopyFrom(tensor)
        else:
            tensor.name = names.fresh(f"{old}_awq")
            out.graph.initializer.append(tensor)
            node.input[position] = tensor.name

    def times_r(array):
        a = np.asarray(array)
        return (a.astype(np.float64) * r).astype(a.dtype)

    if node.op_type == "LayerNormalization":
        scale, bias = constant(1), constant(2) if len(node.input) > 2 and node.input[2] else None
        if scale is None or (len(node.input) > 2 and node.input[2] and bias is None):
            return None
        if any(int(np.prod(t.dims)) != k or (len(t.dims) and t.dims[-1] != k) for t in (scale, bias) if t is not None):
            return None
        # (whichever axes it normalises, Scale and B multiply the last one, where r goes)
        replace(1, times_r(read(scale)))
        if bias is not None:
            replace(2, times_r(read(bias)))
        return f"folded into LayerNormalization {node.name or value!r} (its Scale{' and B' if bias is not None else ''})"
    if node.op_type == "Add":  # (a MatMul's output plus a constant bias: both times r)
        return _fold_bias_add(out, node, index, value, r, readers, inits, by_key, searched_keys, scaling, read, names,
                              replace, times_r)
    if node.op_type in ("MatMul", "Gemm"):
        w = constant(1)
        if w is None or len(w.dims) != 2:
            return None
        transposed = node.op_type == "Gemm" and attrs.get("transB", 0)
        if (w.dims[0] if transposed else w.dims[1]) != k:
            return None
        bias = None
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            bias = constant(2)
            if bias is None or not bias.dims or bias.dims[-1] != k:
                return None
        key = (MAIN, w.name)
        target = by_key.get(key)
        if target is not None:  # (multiplied when it is rounded, before its own search)
            if key in searched_keys or len(target.uses) != 1 or target.keep_float or target.via:
                return None
            scaling.columns[key] = r
            what = "its weight's output channels (as it is rounded)"
        else:
            array = read(w)
            if array.dtype.kind != "f":
                return None
            replace(1, scaled_weight(array, 1 if transposed else 0, columns=r))
            what = "its float weight's output channels"
        if bias is not None:
            replace(2, times_r(read(bias)))
            what += " and C"
        return f"folded into {node.op_type} {node.name or value!r} ({what})"
    return None


def _fold_bias_add(out, node, index, value, r, readers, inits, by_key, searched_keys, scaling, read, names, replace,
                   times_r) -> str | None:
    """X = MatMul(A, W) + b, b a constant along the last axis and the MatMul's output read by the Add
    alone: r folded into b and into W's output channels (see `_fold`)."""
    fed = {i.name for i in out.graph.input}
    sides = [j for j in (0, 1) if node.input[j] in inits and node.input[j] not in fed]
    if len(sides) != 1:
        return None
    bias = inits[node.input[sides[0]]]
    product = node.input[1 - sides[0]]
    if not bias.dims or bias.dims[-1] != len(r) or readers.get(product, []) != [("main", index)]:
        return None
    made = [(i, n) for i, n in enumerate(out.graph.node) if product in n.output]
    if len(made) != 1 or made[0][1].op_type != "MatMul" or made[0][1].domain not in ("", "ai.onnx"):
        return None
    inner = _fold(out, product, {index}, r, readers, inits, by_key, searched_keys, scaling, read, names)
    if inner is None:
        return None
    replace(sides[0], times_r(read(bias)))
    return f"folded into Add {node.name or value!r} (its bias) and {inner.removeprefix('folded into ')}"


def _mul(out, value, reader_indices, r, dtype, names, inserts) -> str:
    """One Mul by r before the readers of `value` (each pointed at its output); the words for the note."""
    factor = names.fresh(f"{value}_awq_scale")
    scaled = names.fresh(f"{value}_awq")
    out.graph.initializer.append(numpy_helper.from_array(r.astype(dtype), factor))
    node = helper.make_node("Mul", [value, factor], [scaled], name=names.fresh(f"{value}_awq_Mul"))
    for i in reader_indices:
        reader = out.graph.node[i]
        reader.input[0] = scaled
    inserts.append((min(reader_indices), node))
    return f"in a Mul {node.name!r} before them"
