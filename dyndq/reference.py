"""Running graphs that hold our op in `onnx.reference.ReferenceEvaluator`.

`reference_evaluator(model)` builds an evaluator that runs each of our ops
through its kernel wherever the op stands: the main graph, If/Loop/Scan
bodies, model-local functions.  ONNX's evaluator hands custom ops down to
subgraphs but not to model-local functions, which it builds with its own class;
our subclass adds our ops to every evaluator it builds, nested ones included.

It also runs DequantizeLinear at opsets 10 and 13, which `onnx.reference`
lacks, with the kernel's exact arithmetic (at opset 19 and later ONNX's own
implementation runs), its own Loop, and the ops `dyndq.reference_ops` corrects
where onnx.reference's meaning is not ONNX's (BatchNormalization before opset
14, OneHot).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_loop import Loop as _OnnxLoop

from dyndq.plumbing.opsets import op_version
from dyndq.reference_ops import CORRECTED, CorrectedOp
from dyndq.plumbing.walk import with_nested
from dyndq.kernels import numpy_kernel
from dyndq.kernels.geometry import view
from dyndq.opdefs import PER_CHANNEL, PER_TENSOR, Problem, ValidationError, all_versions, newest_domain_version

__all__ = ["DequantizeLinear", "Loop", "DyndqReferenceEvaluator", "NotRunnable", "reference_evaluator", "our_ops",
           "op_class", "runnable_model"]


class OurOp(OpRun):
    """The base of the evaluator's class for each op of ours (one class per domain and op
    type, as ReferenceEvaluator keys them): it resolves the op version from the opset
    imports in force, as ONNX does, and runs that version's kernel with its defaults."""

    op_domain = ""
    op_type = ""
    op_schema = None  # attributes come from the node; defaults from the op version's definition

    def __init__(self, onnx_node, run_params, schema=None):
        super().__init__(onnx_node, run_params, schema)
        # the imports of the graph or function the node stands in; a lone node runs at the newest
        opsets = {self.op_domain: newest_domain_version(self.op_domain), **(run_params.get("opsets") or {})}
        self.op_version = op_version(onnx_node, opsets)
        if self.op_version is None:
            raise ValidationError([Problem("opset_import", f"{self.op_domain!r} at version {opsets[self.op_domain]}",
                                           f"a version at which {self.op_type} exists")])

    def _run(self, *inputs, **attributes):
        op = self.op_version
        attrs = op.defaults()
        for name, value in attributes.items():
            spec = op.attribute(name)
            if spec is not None and value is not None:
                attrs[name] = spec.kind.coerce(value.decode() if isinstance(value, bytes) else value)
        try:
            return (op.kernel(*inputs, **attrs),)
        except ValidationError as e:  # name the node and the values fed to it, not just the op's parameter
            names = dict(zip((p.name for p in op.inputs), self.onnx_node.input))
            raise ValidationError([
                dataclasses.replace(p, op=op.qualname, node=self.onnx_node.name or None,
                                    found=f"{p.found} (value {names[p.argument]!r})"
                                    if names.get(p.argument, p.argument) != p.argument else p.found)
                for p in e.problems
            ]) from None


_CLASSES: dict[tuple[str, str], type[OpRun]] = {}


def op_class(domain: str, op_type: str) -> type[OpRun]:
    """The OpRun class for one op of ours (made once; named as the op, as ONNX requires)."""
    key = (domain, op_type)
    if key not in _CLASSES:
        _CLASSES[key] = type(op_type, (OurOp,), {"op_domain": domain, "op_type": op_type,
                                                "__doc__": f"{domain}::{op_type}, run by our kernel."})
    return _CLASSES[key]


def our_ops() -> list[type[OpRun]]:
    """An OpRun class for each op of ours now registered."""
    return [op_class(d, n) for d, n in sorted({(o.domain, o.name) for o in all_versions()})]


class DequantizeLinear(CorrectedOp):
    """ai.onnx DequantizeLinear: ours at opsets 10 and 13 (onnx.reference has none
    for them), ONNX's own from opset 19 on."""

    since_versions = frozenset({10, 13})

    def _run(self, x, x_scale, x_zero_point=None, axis=None):
        return (dequantize_linear(x, x_scale, x_zero_point, axis=axis, opset=self.since_version),)


_DQL_X = ("int8", "uint8", "int32")


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=None, opset: int = 13) -> np.ndarray:
    """ONNX DequantizeLinear-10/13: y = float32(int64(x) - int64(x_zero_point)) * x_scale.

    Opset 10: scalar scale and zero point.  Opset 13: also 1-D per-axis ones (axis, default 1).
    """
    problems = []
    x, x_scale = np.asarray(x), np.asarray(x_scale)
    if x.dtype.name not in _DQL_X:
        problems.append(Problem("x", f"dtype {x.dtype.name}", " | ".join(_DQL_X)))
    if x_scale.dtype != np.float32:
        problems.append(Problem("x_scale", f"dtype {x_scale.dtype.name}", "float32"))
    if x_zero_point is not None:
        x_zero_point = np.asarray(x_zero_point)
        if x_zero_point.dtype != x.dtype:
            problems.append(Problem("x_zero_point", f"dtype {x_zero_point.dtype.name}", f"x's dtype {x.dtype.name}"))
        elif x.dtype.name == "int32" and np.any(x_zero_point != 0):
            problems.append(Problem("x_zero_point", "non-zero int32 zero points", "0 for int32 x"))
    channel_axis = None
    if x_scale.ndim == 0 or (x_scale.ndim == 1 and x_scale.size == 1):  # per tensor, as ONNX Runtime reads it
        if x_zero_point is not None and x_zero_point.size != 1:
            problems.append(Problem("x_zero_point", f"shape {list(x_zero_point.shape)}", "x_scale's shape"))
    elif opset >= 13 and x_scale.ndim == 1:
        a = 1 if axis is None else int(axis)
        if not -x.ndim <= a < x.ndim:
            problems.append(Problem("axis", str(a), f"[{-x.ndim}, {x.ndim - 1}]"))
        else:
            channel_axis = a % x.ndim
            if x_scale.shape[0] != x.shape[channel_axis]:
                problems.append(Problem("x_scale", f"{x_scale.shape[0]} elements", f"x.shape[axis] = {x.shape[channel_axis]}"))
            if x_zero_point is not None and x_zero_point.shape != x_scale.shape:
                problems.append(Problem("x_zero_point", f"shape {list(x_zero_point.shape)}", "x_scale's shape"))
    else:
        allowed = "a scalar" if opset < 13 else "a scalar or a 1-D tensor"
        problems.append(Problem("x_scale", f"shape {list(x_scale.shape)}", allowed))
    if problems:
        raise ValidationError(problems)
    out = np.empty(x.shape, np.float32)
    vshape, varies = view(x.shape, PER_TENSOR if channel_axis is None else PER_CHANNEL, channel_axis or 0, None)
    return numpy_kernel.dequantize(x, x_scale, x_zero_point, vshape, varies, out)


class Loop(_OnnxLoop):
    """ai.onnx Loop as the ONNX spec says and ONNX Runtime runs it, written whole: onnx.reference's
    (1.23) gives wrong results without an error.  It reads an omitted `cond` (None) as false, so
    the loop runs zero times; it concatenates scan outputs along their first axis (np.vstack: a
    [3, 2] value over 2 trips gives [6, 2]) where ONNX stacks them ([2, 3, 2]); it seeds outer
    values over the loop-carried ones (a body input named like an outer value would read the
    outer value); and with zero trips it fails on scan outputs.  Here zero trips give scan
    outputs of shape [0, ...], their other dims as the body's output type gives them (0 where
    unknown, [0] when the rank is), as ONNX Runtime gives them."""

    op_domain = ""

    def _run(self, M, cond=None, *initial, context=None, body=None, attributes=None, bindings=None):
        names = self.body.input_names
        trips = None if M is None else int(np.asarray(M).reshape(-1)[0])
        go = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        carried = list(initial)
        scans: list[list] = [[] for _ in range(self.K)]
        it = 0
        while go and (trips is None or it < trips):
            feeds = dict(context or {})  # outer values first: the body's own inputs shadow them
            feeds[names[0]] = np.array(it, np.int64)
            feeds[names[1]] = np.array(go)
            feeds.update(zip(names[2:], carried))
            # (onnx < 1.23 has no `bindings`: passed only when the evaluator gives some)
            outputs = self._run_body(feeds, attributes=attributes, **({} if bindings is None else {"bindings": bindings}))
            go = bool(np.asarray(outputs[0]).reshape(-1)[0])
            carried = list(outputs[1 : 1 + self.N])
            for k in range(self.K):
                scans[k].append(outputs[1 + self.N + k])
            it += 1
        return self._check_and_fix_outputs(tuple(carried + [self._stacked(k, v) for k, v in enumerate(scans)]))

    def _scan_output(self, k: int) -> onnx.ValueInfoProto:
        return _body(self.onnx_node).output[1 + self.N + k]

    def _problem(self, k: int, found: str, allowed: str) -> ValidationError:
        return ValidationError([Problem(f"scan output {self._scan_output(k).name!r}", found, allowed,
                                        op="ai.onnx::Loop", node=self.onnx_node.name or None)])

    def _stacked(self, k: int, values: list) -> np.ndarray:
        """The k-th scan output: one value per trip, stacked along a new first axis."""
        if not values:
            return self._empty(k)
        arrays = [np.asarray(v) for v in values]
        for i, a in enumerate(arrays):
            if a.shape != arrays[0].shape:
                raise self._problem(k, f"shape {list(a.shape)} in iteration {i}",
                                    f"shape {list(arrays[0].shape)}, as in iteration 0 (a scan output keeps one shape)")
        return np.stack(arrays)

    def _empty(self, k: int) -> np.ndarray:
        tp = self._scan_output(k).type
        tensor = tp.tensor_type if tp.WhichOneof("value") == "tensor_type" else None
        if tensor is None or not tensor.elem_type:
            raise self._problem(k, "zero iterations, and an element type neither declared nor inferred",
                                "a scan output of known element type (its body output's type)")
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tensor.shape.dim] if tensor.HasField("shape") else []
        return np.zeros([0] + dims, onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))


def _body(loop: onnx.NodeProto) -> onnx.GraphProto | None:
    return next((a.g for a in loop.attribute if a.name == "body"), None)


def _loop_outputs_typed(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model, or a copy whose Loop bodies' outputs carry the types ONNX infers for them,
    when a Loop has scan outputs: a loop that runs zero times gives them the shape and element
    type its body would have, which ONNX Runtime reads off its own inference.  (Model-local
    functions have no types: a Loop there reads what its body declares.)"""
    from dyndq.plumbing.walk import graphs
    from dyndq.scopes import inferred_model

    loops = [_body(n) for g in graphs(model.graph) for n in g.node if n.op_type == "Loop" and n.domain in ("", "ai.onnx")]
    if not any(body is not None and len(body.output) > len(body.input) - 1 for body in loops):  # no scan output
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inferred = inferred_model(model)  # (nodes as they are: the walk below pairs them by position)
    for mine, theirs in zip(graphs(out.graph), graphs(inferred.graph)):
        for a, b in zip(mine.node, theirs.node):
            if a.op_type == "Loop" and a.domain in ("", "ai.onnx") and _body(a) is not None:
                for va, vb in zip(_body(a).output, _body(b).output):
                    if vb.HasField("type"):
                        va.type.CopyFrom(vb.type)
    return out


class DyndqReferenceEvaluator(ReferenceEvaluator):
    """A ReferenceEvaluator that knows our ops in every graph and function it builds."""

    def __init__(self, proto: Any, *args, new_ops: list[type[OpRun]] | None = None, **kwargs):
        # Caller's classes first: for a key given twice, ONNX keeps the first.
        ours = our_ops() + [DequantizeLinear, Loop, *CORRECTED]
        ops = list(new_ops or []) + [c for c in ours if c not in (new_ops or [])]
        if isinstance(proto, onnx.ModelProto):
            proto = _loop_outputs_typed(_functions_in_call_order(proto))
        super().__init__(proto, *args, new_ops=ops, **kwargs)


def _functions_in_call_order(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model, or a copy whose model-local functions come after every function they call.

    ReferenceEvaluator builds functions in the order the model lists them, each knowing only
    the ones before it, so a function that calls one listed after it fails ("Node type 'Inner'
    ... is unknown"), while ONNX itself (and ONNX Runtime) accept any order."""
    functions = {(f.domain, f.name): f for f in model.functions}
    callees = {
        key: {(n.domain, n.op_type) for node in f.node for n in with_nested(node)} & functions.keys()
        for key, f in functions.items()
    }
    order: list[tuple[str, str]] = []
    state: dict[tuple[str, str], str] = {}

    def visit(key):
        if state.get(key) == "done" or state.get(key) == "visiting":  # (a cycle: left for ONNX to refuse)
            return
        state[key] = "visiting"
        for callee in sorted(callees[key]):
            visit(callee)
        state[key] = "done"
        order.append(key)

    for key in functions:
        visit(key)
    if order == list(functions):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.functions[:]
    copy.functions.extend(functions[key] for key in order)
    return copy




def reference_evaluator(model, **kwargs) -> ReferenceEvaluator:
    """An `onnx.reference.ReferenceEvaluator` for `model` (a ModelProto, GraphProto,
    FunctionProto, NodeProto, or a path) that runs our ops through our kernel.

    Keyword arguments go to ReferenceEvaluator (verbose, functions, new_ops, ...).
    """
    return DyndqReferenceEvaluator(model, **kwargs)


# -- what the reference engine runs: nodes of other domains lifted exactly -------------------------

# The domains whose ops onnx.reference implements (besides ours and model-local functions).
_ONNX_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")
_WAY_OUT = ("an op of ONNX, of dyndq or of a model-local function, or one the exact lift turns into ours; to run this "
            "one, engine='onnxruntime' (dyndq run --engine onnxruntime)")


class NotRunnable(ValidationError):
    """Nodes the reference engine cannot run (an op of a domain onnx.reference lacks, which the
    exact lift does not turn into ours), each named with why and the way out."""


def runnable_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model as the reference engine runs it: itself, or, when a node stands in a domain that
    neither onnx.reference nor dyndq implements (ONNX Runtime's contrib ops), its exact lift
    (`dyndq.lift_with_report`, which turns those it can into our op, value for value).

    NotRunnable names each node still of such a domain after the lift, with the lift's reason and
    the way out (the ONNX Runtime engine), and each graph output the lift removed or renamed."""
    from dyndq.plumbing.walk import walk

    if not holds_foreign_ops(model):
        return model
    from dyndq.lifter import lift_with_report

    lifted, report = lift_with_report(model)
    reasons = {(s.graph, s.node): s.reason for s in report.skipped}
    problems = []
    for site in walk(lifted):
        node = site.node
        if not _foreign(node, lifted):
            continue
        reason = reasons.get((site.graph, node.name or (node.output[0] if node.output else "")))
        found = (f"an op onnx.reference lacks, which the exact lift left alone: {reason}" if reason else
                 "an op onnx.reference lacks, which no exact lift turns into DynamicDequantize")
        problems.append(Problem(None, found, _WAY_OUT, op=f"{node.domain}::{node.op_type}", node=node.name or None,
                                node_index=site.index, graph=site.graph))
    values = {o for n in lifted.graph.node for o in n.output} | {t.name for t in lifted.graph.initializer} | {
        vi.name for vi in lifted.graph.input}
    problems += [Problem(o.name, "a graph output that the exact lift (the reference engine's way to run the model's "
                                 "contrib ops) removed or renamed",
                         "a value the lift keeps; to see this one, engine='onnxruntime' (dyndq run --engine onnxruntime)")
                 for o in model.graph.output if o.name not in values]
    if problems:
        raise NotRunnable(problems)
    return lifted


def holds_foreign_ops(model: onnx.ModelProto) -> bool:
    """Whether a node in any scope of the model stands in a domain that neither onnx.reference,
    nor dyndq, nor a model-local function implements (ONNX Runtime's contrib ops): the reference
    engine runs such a model through its exact lift, which reads their constants."""
    from dyndq.plumbing.walk import walk

    return any(_foreign(site.node, model) for site in walk(model))


def _foreign(node: onnx.NodeProto, model: onnx.ModelProto) -> bool:
    """A node of a domain neither onnx.reference, nor dyndq, nor a model-local function implements."""
    from dyndq.opdefs import domains

    if node.domain in _ONNX_DOMAINS or node.domain in domains():
        return False
    return not any(f.domain == node.domain and f.name == node.op_type for f in model.functions)

