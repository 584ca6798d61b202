"""`quantize(model) -> (model, report)` and `quantize_file(src, dst)`: the whole-graph step.

`plan` finds the weights, `numerics` quantizes each (one at a time), `rewrite` makes the
nodes and tensors that stand for it, and the report says what came of it.  A model in memory
is never changed: the result is a new model holding its structure, the new tensors and the
initializers left as they were.  From a file with external data (`quantize_file`), the weights
are read one at a time and the new model's tensors written to its data file as they are
made, so the memory it takes is about the largest weight twice plus the model's structure.
"""
from __future__ import annotations

import time

import numpy as np
import onnx
from onnx import numpy_helper

from dyndq.opdefs import DOMAIN, Problem, ValidationError
from dyndq.plumbing.domain_imports import align as align_domain_imports
from dyndq.plumbing.function_inputs import pass_out
from dyndq.plumbing.ir import model_ir
from dyndq.plumbing.light import copy_fields, stored_bytes
from dyndq.plumbing.names import NameScope, all_names
from dyndq.plumbing.opsets import ai_onnx_version, import_at_least
from dyndq.plumbing.walk import is_constant_node, scopes
from dyndq.quantization import plan as planning
from dyndq.quantization import formats
from dyndq.quantization.numerics import ScaleOutOfRange
from dyndq.quantization.options import QuantizeOptions
from dyndq.quantization.report import LayerReport, QuantizeReport
from dyndq.quantization.rewrite import version_of
from dyndq.wording import plural


class NothingToQuantize(ValidationError):
    """No weight of the chosen ops could be quantized: its problems say why for each (none: the
    model has no such node reading a constant float weight, or `exclude` named every one);
    `activations` says how many read an activation, a value computed by the graph or fed at run
    time, where a weight would be; `other_weights` which nodes of other ops (Conv) read a
    constant float weight, which quantize does not take; `excluded` the nodes `exclude` left
    alone."""

    def __init__(self, problems, ops, activations: str | None = None, *, excluded=(), other_weights: str | None = None):
        self.ops = list(ops)
        self.activations = activations
        self.excluded = list(excluded)
        self.other_weights = other_weights
        super().__init__(problems)

    @property
    def reason(self) -> str:
        return self.because()

    def because(self, exclude_flag: str = "exclude") -> str:
        """The reason, naming the option that excluded weights as `exclude_flag` (the CLI: --exclude)."""
        names = self.ops[:-2] + [" or ".join(self.ops[-2:])]
        if self.problems:
            reason = f"{plural(len(self.problems), 'weight')} left alone"
        elif self.excluded:
            shown = ", ".join(map(repr, self.excluded[:5])) + (", ..." if len(self.excluded) > 5 else "")
            reason = (f"every {', '.join(names)} node's weight is excluded by {exclude_flag} "
                      f"({plural(len(self.excluded), 'node')}: {shown})")
        else:
            reason = f"no {', '.join(names)} node reads a constant float weight"
        if self.excluded and self.problems:
            reason += f"; {plural(len(self.excluded), 'node')} excluded ({exclude_flag})"
        notes = [note for note in (self.activations, self.other_weights) if note]
        return f"{reason} ({'; '.join(notes)})" if notes else reason

    def _message(self) -> str:
        return "\n".join([f"nothing to quantize: {self.reason}"] + [f"  - {p}" for p in self.problems])


def quantize(model, *, bits: int | None = None, group_size: int | None = None, symmetric: bool = False, scale_dtype=None,
             ops=planning.OPS, exclude=(), method: str = "rtn", evaluate: bool = True, seed: int = 0,
             strict: bool = False, progress=None, format: str | None = None, inputs=None,
             samples: int = 4, budget: float | None = None, format_choices=None) -> tuple[onnx.ModelProto, QuantizeReport]:
    """A copy of `model` whose constant weights of `ops` are `bits`-bit codes with per-group
    scales (and zero points unless `symmetric`) feeding DynamicDequantize-2 (-3 for 2 bits),
    and a report.

    format: "int" (integer codes of `bits` bits: 2, 4 or 8; both the default, None meaning not
    given: 4 and "int"), "mxfp4" or "nvfp4" (float4e2m1
    codes with the format's block scales, DynamicDequantize-3; docs/quantize.md states the rules).
    group_size: elements per group along the reduction axis (-1: the whole axis, per channel;
    default 128, and the format's block, 32 or 16, for mxfp4 and nvfp4, which take no other).
    scale_dtype: "float32", "float16" or "bfloat16" (default: each weight's own dtype).
    method: "rtn" (ONNX Runtime's own rounding, code for code) or "search" (lower error).
    exclude: node or weight names to leave alone.  evaluate: run both models and report the
    output error (and, for logits or distributions, top-1 agreement and KL divergence) on
    `inputs` (one feed dict or a list of them, checked first: FeedError names a feed that does
    not fit), or by default on `samples` seeded samples (`seed`; evaluate.py).  strict: raise ValidationError when a weight
    of the chosen ops cannot be quantized instead of leaving it alone.  progress: called
    with one line per weight quantized.
    budget: bits per weight (codes, scales and zero points over the weights quantized): each
    weight's format is chosen among `format_choices` (default int2, int4, int8; also mxfp4,
    nvfp4) for the least output error within it (budget.py, docs/quantize.md); bits and format
    are then not given (OptionError names either, whatever its value).
    """
    from dyndq.files import model_of

    model = model_of(model, "quantize")
    from dyndq.quantization.evaluate import checked_samples, evaluate_into, user_inputs

    options = QuantizeOptions.checked(model, bits=bits, group_size=group_size, symmetric=symmetric,
                                      scale_dtype=scale_dtype, ops=ops, exclude=exclude, method=method, seed=seed,
                                      format=format, budget=budget, format_choices=format_choices)
    samples = checked_samples(samples)
    # (before any work: a feed that does not fit is said first; a budget is chosen on them too)
    feeds = user_inputs(model, inputs) if evaluate or options.budget is not None else None
    out, report = quantize_model(model, options, strict=strict, progress=progress,
                                 feeds=budget_feeds(model, options, feeds, samples))
    if evaluate:
        evaluate_into(report, model, out, seed=options.seed, inputs=feeds, samples=samples, progress=progress)
    else:
        report.outputs_note = "not measured (evaluate=False)"
    return out, report


def rank_methods(model, *, methods=None, inputs=None, samples: int = 4, seed: int = 0, progress=None,
                 **options) -> list[tuple[str, QuantizeReport]]:
    """(method, report) for each of `methods` (default: every one), `model` quantized by it with
    the same `options` (as `quantize` takes them) and measured on the same inputs (`inputs`, or
    `samples` seeded ones; the float model run once), best first by what a task would see
    (`QuantizeReport.task_score`)."""
    from dyndq.files import model_of
    from dyndq.quantization.evaluate import Evaluation, checked_samples, user_inputs
    from dyndq.quantization.options import methods_of

    model = model_of(model, "rank_methods")
    # (by default every method the format takes: an FP4 format has its rule alone)
    checked = [QuantizeOptions.checked(model, method=m, seed=seed, **options)
               for m in (methods or methods_of(options.get("format")))]
    evaluation = Evaluation(model, seed=seed, inputs=user_inputs(model, inputs), samples=checked_samples(samples),
                            progress=progress)
    runs = []
    for options_ in checked:
        # (a budget chosen on the evaluation's inputs, as `quantize` chooses it: the user's, or the same seeded samples)
        out, report = quantize_model(model, options_,
                                     feeds=budget_feeds(model, options_, evaluation.feeds, len(evaluation.feeds)))
        report.outputs, report.outputs_note = evaluation.measure(out)
        report.inputs = evaluation.inputs_used()
        del out  # (one quantized model at a time)
        runs.append((options_.method, report))
    return sorted(runs, key=lambda run: run[1].task_score() or (float("inf"),))


class Tensors:
    """Where weights are read from and the new model's tensors go: kept in the model (the
    default), or, for a model read without its external data, read one at a time and written
    one at a time to `data` (a files.DataFile) as they come."""

    def __init__(self, loaded=None, data=None):
        self.loaded, self.data = loaded, data

    def array(self, tensor: onnx.TensorProto) -> np.ndarray:
        from dyndq.files import tensor_array

        return numpy_helper.to_array(tensor) if self.loaded is None else tensor_array(tensor, self.loaded)

    def add(self, graph: onnx.GraphProto, tensor: onnx.TensorProto) -> None:
        if self.data is None:
            graph.initializer.append(tensor)
        else:
            self.data.add(graph, self._with_data(tensor))

    def _with_data(self, tensor):
        from dyndq.files import tensor_with_data

        return tensor if self.loaded is None else tensor_with_data(tensor, self.loaded)


def quantize_model(model: onnx.ModelProto, options: QuantizeOptions, tensors: Tensors | None = None, *,
                   strict: bool = False, progress=None, feeds=None) -> tuple[onnx.ModelProto, QuantizeReport]:
    """`quantize`'s work on a model and its options judged (`QuantizeOptions.checked`), the
    weights read from and the new tensors written to `tensors` (default: the models themselves),
    a budget's widths chosen on `feeds` (a list of feed dicts: `budget_feeds`),
    the output error not measured."""
    started = time.perf_counter()
    tensors = Tensors() if tensors is None else tensors
    found = planning.plan(model, ops=options.ops, exclude=options.exclude)
    report = QuantizeReport(options, left_alone=list(found.problems), activations=found.activation_line(),
                            other_weights=found.other_weights_line(options.ops))
    if strict and found.problems:
        raise ValidationError(found.problems)
    if not found.targets:
        raise NothingToQuantize(found.problems, options.ops, found.activation_line(), excluded=found.excluded,
                                other_weights=found.other_weights_line(options.ops))
    misfits = options.fmt.fits(options, found.targets)
    if misfits:  # (before any work)
        from dyndq.quantization.options import OptionError

        raise OptionError(misfits)
    chosen = None  # (with a budget) (graph, name) -> the QuantizedWeight allocated to it
    if options.budget is not None:
        report.budget = _allocated(model, found.targets, options, tensors, feeds)
        chosen = report.budget.chosen()
    out = onnx.ModelProto()
    copy_fields(model, out, skip={"graph"})
    copy_fields(model.graph, out.graph, skip={"initializer"})
    names = NameScope(all_names(model))
    every = {scope.path: scope for scope in scopes(out)}  # (the model's scopes, by the paths the plan named)
    targets = {(t.graph, t.name): t for t in found.targets}
    new_nodes: dict[str, list] = {}  # scope path -> the nodes standing for its weights (put first)
    gone: dict[str, list] = {}  # scope path -> the Constant (and Identity) nodes whose weights no node reads as floats any more
    passing = {key: [(path, every[path].nodes[index]) for path, index in t.via] for key, t in targets.items()}
    done = version = 0  # (version: the DynamicDequantize version the nodes need, rewrite.version_of)

    def quantize_one(target, weight, scope, add) -> bool:
        nonlocal done, version
        opset = ai_onnx_version(scope.imports) or 1
        q = None if chosen is None else chosen.get((target.graph, target.name))
        layer, nodes, needs = _one_weight(target, weight, options, names, opset, every, add, q)
        version = max(version, needs)
        done += 1
        if layer is None:
            report.left_alone.append(nodes)
            return False
        report.layers.append(layer)
        new_nodes.setdefault(scope.path, []).extend(nodes)
        if progress:
            progress(f"[{done}/{len(targets)}] {layer.name} {'x'.join(map(str, layer.shape))} {layer.form}: "
                     f"rel. error {layer.relative_error:.4f} ({layer.seconds:.1f} s)")
        return True

    for path, scope in every.items():
        graph = scope.graph
        if graph is not None:
            # (the main graph's initializers are read from the model given; a nested graph's from its copy)
            originals = list(model.graph.initializer) if path == "main" else [_copy(t) for t in graph.initializer]
            del graph.initializer[:]
            for tensor in originals:
                target = targets.get((path, tensor.name))
                if target is None or target.constant_node:
                    tensors.add(graph, tensor)
                    continue
                if not quantize_one(target, tensors.array(tensor), scope, lambda t: tensors.add(graph, t)) \
                        or target.keep_float:
                    tensors.add(graph, tensor)
                    continue
                if target.listed_as_input:
                    _drop_input(graph, target.name)
                for where, identity in passing[(path, tensor.name)]:
                    gone.setdefault(where, []).append(identity)
        for node in list(scope.nodes):
            target = targets.get((path, node.output[0])) if is_constant_node(node) else None
            if target is None or not target.constant_node:
                continue
            # a graph's new tensors are initializers (a Constant node of int4 codes needs ai.onnx 21, which an
            # exporter's opset 11 or 12 graph does not import); a function has none: Constant nodes, ahead of the
            # rest (those its opset's Constant does not hold are passed in from the main graph at the end)
            made = []
            add = (lambda t: made.append(onnx.helper.make_node("Constant", [], [t.name], value=t))) \
                if scope.graph is None else (lambda t, graph=scope.graph: tensors.add(graph, t))
            if quantize_one(target, tensors.array(planning.constant_value(node)), scope, add):
                new_nodes[path][:0] = made
                if not target.keep_float:
                    gone.setdefault(path, []).append(node)
                    for where, identity in passing[(path, node.output[0])]:
                        gone.setdefault(where, []).append(identity)
    if report.budget is not None:  # (the candidates' codes, every width of every weight, are not kept with the report)
        report.budget.release()
    if strict and len(report.left_alone) > len(found.problems):
        raise ValidationError(report.left_alone)
    if not report.layers:
        raise NothingToQuantize(report.left_alone, options.ops, found.activation_line(), excluded=found.excluded,
                                other_weights=found.other_weights_line(options.ops))
    for path, nodes in gone.items():
        for node in nodes:
            del every[path].nodes[next(i for i, n in enumerate(every[path].nodes) if n is node)]
    for path, nodes in new_nodes.items():  # ahead of every node (they read constants only), in place
        scope = every[path]
        for node in reversed(nodes):
            scope.nodes.insert(0, node)
        if scope.in_function:
            import_at_least(scope.top.imports, DOMAIN, version)  # (a superset of the older ones)
    pass_out(out)  # (uint2 or float4 codes in a function importing opset 21: plumbing/function_inputs.py)
    _set_imports(out, version)
    align_domain_imports(out)  # (a function's import of our domain and the model's: one version)
    report.model_bytes_before, report.model_bytes_after = constant_bytes(model), constant_bytes(out)
    report.seconds = time.perf_counter() - started
    return out, report


def constant_bytes(model: onnx.ModelProto) -> int:
    """The bytes of every constant of the model (initializers and Constant values, every scope), sub-byte codes
    packed, from dims and dtype (the data may be on disk)."""
    from dyndq.opdefs import dtypes

    total = 0
    for scope in scopes(model):
        tensors = list(scope.graph.initializer) if scope.graph is not None else []
        tensors += [t for n in scope.nodes if is_constant_node(n) for t in [planning.constant_value(n)] if t is not None]
        for t in tensors:
            try:
                bits = dtypes.by_onnx(t.data_type).bits
            except (KeyError, LookupError, TypeError, ValueError):  # (strings and the like: one byte each)
                bits = 8
            total += -(-int(np.prod(t.dims, dtype=np.int64)) * bits // 8)
    return total


def _copy(tensor: onnx.TensorProto) -> onnx.TensorProto:
    t = onnx.TensorProto()
    t.CopyFrom(tensor)
    return t


def budget_feeds(model, options: QuantizeOptions, given: list[dict] | None, samples: int) -> list[dict] | None:
    """The inputs a budget is chosen on: the evaluation's (the user's, or its seeded samples)."""
    if options.budget is None:
        return None
    from dyndq.quantization.evaluate import seeded_samples

    return given if given is not None else seeded_samples(model, options.seed, samples)


def _allocated(model, targets, options: QuantizeOptions, tensors: Tensors, feeds):
    """The budget's allocation (budget.BudgetReport), its weights read from `tensors`; a budget
    out of the model's range is an OptionError saying what is possible."""
    from dyndq.quantization.budget import BudgetError, allocate, weight_arrays
    from dyndq.quantization.options import OptionError

    try:
        return allocate(model, targets, weight_arrays(model, targets, tensors.array), options, feeds, tensors.array)
    except BudgetError as e:
        raise OptionError([e.problem]) from None


def _one_weight(target, weight, options: QuantizeOptions, names, opset, scopes_by_path, add, chosen=None):
    """(LayerReport, nodes, the DynamicDequantize version they are), having added the weight's tensors
    (`add(tensor)`) and pointed its readers at the dequantized value; or (None, Problem, 0) for a
    weight that cannot be.  chosen: its
    QuantizedWeight, already made (a budget's allocation)."""
    started = time.perf_counter()
    # (a weight with NaN or infinity is told so, whatever else its quantization found: it is
    # looked for only where the quantization's error sums are not finite, or it failed, as a
    # NaN or an infinity makes them: a pass over every weight less)
    try:
        q = chosen if chosen is not None else options.fmt.quantize(weight, target, options, options.bits)
    except ScaleOutOfRange as e:
        if not _finite(weight):
            return None, _weight_problem(target, *NOT_FINITE), 0
        return None, _weight_problem(target, e.found, e.allowed), 0
    if not q.stats.finite and not _finite(weight):
        return None, _weight_problem(target, *NOT_FINITE), 0
    del weight
    p = formats.of(q).nodes(target.name, target.dtype, q, names, opset)
    after = 0
    for t in p.tensors:
        after += stored_bytes(t)
        add(t)
    for u in target.uses:
        node = scopes_by_path[u.graph].nodes[u.index]
        k = planning.WEIGHT_INPUT[u.op][0]
        node.input[k] = p.output
    notes = [f"also read by {', '.join(target.keep_float)}: the float weight is kept for them"] if target.keep_float else []
    other = [u.node for u in target.uses if u.axis != target.axis]
    if other:
        notes.append(f"quantized along axis {target.axis} (for {target.uses[0].node}); {', '.join(other)} "
                     "would reduce along another")
    layer = LayerReport(
        target.name, target.graph, [u.node for u in target.uses], target.ops, list(target.dims), target.dtype, p.form,
        q.stats.relative, q.stats.max_abs, q.stats.cosine, _float_bytes(target), after,
        time.perf_counter() - started, notes)
    return layer, p.nodes, version_of(q)


NOT_FINITE = ("NaN or infinity among its values", "finite weights")


def _weight_problem(target, found: str, allowed: str) -> Problem:
    """A Problem naming the weight's input of its first reader."""
    u = target.uses[0]
    return Problem(f"{planning.WEIGHT_INPUT[u.op][1]} ({target.name!r})", found, allowed,
                   op=u.op, node=u.node, node_index=u.index, graph=u.graph)


def _finite(weight: np.ndarray) -> bool:
    """Whether every value is finite, a block at a time (a bfloat16 block checked as float32)."""
    flat = weight.reshape(-1)
    step = 1 << 22
    return all(np.isfinite(flat[i:i + step].astype(np.float32)).all() for i in range(0, flat.size, step))


def _float_bytes(target) -> int:
    return int(np.prod(target.dims, dtype=np.int64)) * (4 if target.dtype == "float32" else 2)


def _drop_input(graph: onnx.GraphProto, name: str) -> None:
    for vi in list(graph.input):
        if vi.name == name:
            graph.input.remove(vi)


def _set_imports(model: onnx.ModelProto, version: int) -> None:
    """Our domain at `version`, and the IR version what the model now holds needs (int4 codes: 10)."""
    import_at_least(model.opset_import, DOMAIN, version)
    model.ir_version = max(model.ir_version, model_ir(model))
