"""`quantize(model) -> (model, report)` and `quantize_file(src, dst)`: the whole-graph step.

`plan` finds the weights; the quantize rule (`WeightRule`, a rule of kind QUANTIZE) has each
quantized in the options' format (formats/, one weight at a time) and the format's nodes and
tensors made for it; the walker (converters/walker.py) applies the rule over every scope,
placing those, pointing the readers at them and fixing the opset imports; the report says what
came of it.  A model in memory is never changed: the result is a new model holding its
structure, the new tensors and the initializers left as they were.  From a file with external
data (`quantize_file`), the walker reads the weights through the store (`Tensors`) one at a
time, and the store writes the new model's tensors to its data file as the walker comes to
them, so the memory it takes is about the largest weight twice plus the model's structure.
"""
from __future__ import annotations

import time

import numpy as np
import onnx
from onnx import numpy_helper

from dyndq.converters.rewrite import Rewrite
from dyndq.converters.rules import QUANTIZE, Rule, apply
from dyndq.converters.walker import Store
from dyndq.model_files import Moved
from dyndq.opdefs import DOMAIN, Problem, Refusal, ValidationError
from dyndq.plumbing.light import copy_fields, stored_bytes
from dyndq.plumbing.names import NameScope, all_names
from dyndq.plumbing.walk import is_constant_node, scopes
from dyndq.quantization import formats, plan as planning
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
             samples: int = 4, budget: float | None = None, format_choices=None,
             **gptq) -> tuple[onnx.ModelProto, QuantizeReport]:
    """A copy of `model` whose constant weights of `ops` are `bits`-bit codes with per-group
    scales (and zero points unless `symmetric`) feeding DynamicDequantize-2 (-3 for 2 bits),
    and a report.

    format: "int" (integer codes of `bits` bits: 2, 4 or 8; both the default, None meaning not
    given: 4 and "int"), "mxfp4" or "nvfp4" (float4e2m1
    codes with the format's block scales, DynamicDequantize-3; docs/quantize.md states the rules).
    group_size: elements per group along the reduction axis (-1: the whole axis, per channel;
    default 128, and the format's block, 32 or 16, for mxfp4 and nvfp4, which take no other).
    scale_dtype: "float32", "float16" or "bfloat16" (default: each weight's own dtype).
    method: "rtn" (ONNX Runtime's own rounding, code for code), "search" (lower error), "gptq"
    (calibrated on `inputs`, or `samples` seeded samples: gptq.py; its options damping, block_size
    and act_order, given as keywords, and calibration_memory: the bytes of layer statistics held at
    once, or a size such as "512MiB", in as many passes over the samples as that takes: calibration.py) or "awq" (calibrated so too: a scale per input channel,
    divided out of the activation in the graph: awq.py).
    scale_estimation=True (a keyword): on top of the method, each group's scale and zero point
    refitted to the layer's output error on the calibration inputs (integer formats;
    scale_estimation.py).
    exclude: node or weight names to leave alone.  evaluate: run both models and report the
    output error (and, for logits or distributions, top-1 agreement and KL divergence) on
    `inputs` (one feed dict or a list of them, checked first: FeedError names a feed that does
    not fit), or by default on `samples` seeded samples (`seed`; evaluate.py).  strict: raise ValidationError when a weight
    of the chosen ops cannot be quantized instead of leaving it alone.  progress: called
    with one line per weight quantized.
    budget: bits per weight (codes, scales and zero points over the weights quantized): each
    weight's format is chosen among `format_choices` (default int2, int4, int8; also mxfp4,
    nvfp4) for the least output error within it (budget.py, docs/quantize.md), each integer
    candidate made by `method` (and scale estimation) as it alone makes it at that width; bits and
    format are then not given (OptionError names either, whatever its value).
    """
    from dyndq.model_files import model_of

    model = model_of(model, "quantize")
    from dyndq.quantization.evaluate import checked_samples, evaluate_into, user_inputs

    options = QuantizeOptions.checked(model, bits=bits, group_size=group_size, symmetric=symmetric,
                                      scale_dtype=scale_dtype, ops=ops, exclude=exclude, method=method, seed=seed,
                                      format=format, budget=budget, format_choices=format_choices, **gptq)
    samples = checked_samples(samples)
    # (before any work: a feed that does not fit is said first; a budget and gptq are chosen on them too)
    feeds = user_inputs(model, inputs) if evaluate or options.budget is not None or options.data_aware else None
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
    from dyndq.model_files import model_of
    from dyndq.quantization.evaluate import Evaluation, checked_samples, user_inputs
    from dyndq.quantization.numerics import DATA_AWARE
    from dyndq.quantization.options import methods_of

    model = model_of(model, "rank_methods")
    # (by default every method the format takes: an FP4 format has its rule alone)
    # (by default not the data-aware methods: calibrated on the very inputs the ranking measures on, they would be
    # flattered; gptq's own options go to it alone)
    methods = methods or [m for m in methods_of(options.get("format")) if m not in DATA_AWARE]
    checked = [QuantizeOptions.checked(model, method=m, seed=seed, **{key: value for key, value in options.items()
                                                                      if m == "gptq" or key not in GPTQ_OPTIONS})
               for m in methods]
    evaluation = Evaluation(model, seed=seed, inputs=user_inputs(model, inputs), samples=checked_samples(samples),
                            progress=progress)
    runs = []
    for options_ in checked:
        # (a budget chosen on the evaluation's inputs, as `quantize` chooses it: the user's, or the same seeded samples)
        out, report = quantize_model(model, options_,
                                     feeds=budget_feeds(model, options_, evaluation.feeds if evaluation.given else None,
                                                      len(evaluation.feeds)))
        report.outputs, report.outputs_note = evaluation.measure(out)
        report.inputs = evaluation.inputs_used()
        del out  # (one quantized model at a time)
        runs.append((options_.method, report))
    return sorted(runs, key=lambda run: run[1].task_score() or (float("inf"),))


GPTQ_OPTIONS = ("damping", "block_size", "act_order", "calibration_memory")


class Tensors(Moved, Store):
    """The walker's store for quantize: where weights are read from and the new model's tensors
    go.  By default in memory: the new model holds its tensors.  For a model read without its
    external data (`loaded`, with `data` a files.DataFile): each weight read one at a time, and
    each tensor of the new model written to `data` as the walker comes to it, in the model's
    order, so that what is in memory at once is about one weight and what is made of it.

    `structure(model)` is the model the walker rewrites: the model's structure, with each
    initializer of the main graph a placeholder (its name, type and shape; which of the given
    model's initializers it stands for in `external_data`) whose data the store reads from the
    model given and puts in place (the whole tensor) when the walker keeps it: the weights
    quantized away are never copied.  In memory, the initializers the walker keeps are copied in
    once the walk is done (`fill`), after the calibration's statistics and sessions are gone: a
    table kept float (a Gather's, where only MatMul is quantized) is not held twice during the
    calibration's passes (on all-MiniLM-L6-v2, 47 MiB of its 86 MiB)."""

    def __init__(self, loaded=None, data=None):
        super().__init__(loaded, data)  # (put: model_files.Moved's, one tensor read and written at a time)
        self.originals: list[onnx.TensorProto] = []

    def structure(self, model: onnx.ModelProto) -> onnx.ModelProto:
        out = onnx.ModelProto()
        copy_fields(model, out, skip={"graph"})
        copy_fields(model.graph, out.graph, skip={"initializer"})
        self.originals = list(model.graph.initializer)
        for i, t in enumerate(self.originals):
            stand_in = out.graph.initializer.add()  # (its fields set one by one: ListFields would copy the data)
            stand_in.name, stand_in.data_type = t.name, t.data_type
            stand_in.dims.extend(t.dims)
            stand_in.data_location = onnx.TensorProto.EXTERNAL
            stand_in.external_data.add(key=_STANDS_FOR, value=str(i))
        return out

    def array(self, tensor: onnx.TensorProto) -> np.ndarray:
        from dyndq.model_files import tensor_array

        tensor = self._original(tensor)
        return numpy_helper.to_array(tensor) if self.loaded is None else tensor_array(tensor, self.loaded)

    def keep(self, tensor: onnx.TensorProto) -> None:
        if self.data is None:  # (in memory: left a placeholder until `fill`)
            return
        stored = self.put(self._original(tensor))
        if stored is not tensor:
            tensor.CopyFrom(stored)

    def fill(self, model: onnx.ModelProto) -> None:
        """Each placeholder still in `model`'s main graph (an initializer kept in memory) given the
        data of the tensor it stands for."""
        for tensor in model.graph.initializer:
            original = self._original(tensor)
            if original is not tensor:
                tensor.CopyFrom(original)

    def _original(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        if tensor.data_location == onnx.TensorProto.EXTERNAL and len(tensor.external_data) == 1 \
                and tensor.external_data[0].key == _STANDS_FOR:
            return self.originals[int(tensor.external_data[0].value)]
        return tensor


_STANDS_FOR = "dyndq.quantize.stands_for"  # (a placeholder's one external_data key: the index of the tensor it stands for)


def quantize_model(model: onnx.ModelProto, options: QuantizeOptions, tensors: Tensors | None = None, *,
                   strict: bool = False, progress=None, feeds=None) -> tuple[onnx.ModelProto, QuantizeReport]:
    """`quantize`'s work on a model and its options judged (`QuantizeOptions.checked`), the
    weights read from and the new tensors written to `tensors` (default: the models themselves),
    a budget's widths chosen on `feeds` (a list of feed dicts: `budget_feeds`),
    the output error not measured.  The weights are found here (plan.py) and quantized by one
    rule of kind QUANTIZE that the walker applies (converters/walker.py: it places the nodes
    and tensors, points the readers at them, and fixes the opset imports).  BLAS is held to one
    thread meanwhile, so that the codes are the same at any thread count (reproducible.py)."""
    from dyndq.quantization.reproducible import one_blas_thread

    with one_blas_thread():
        return _quantized_model(model, options, tensors, strict=strict, progress=progress, feeds=feeds)


def _quantized_model(model: onnx.ModelProto, options: QuantizeOptions, tensors: Tensors | None, *, strict: bool,
                     progress, feeds) -> tuple[onnx.ModelProto, QuantizeReport]:
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
    calibration = None  # (a data-aware method) the layers' inputs collected on `feeds`
    if options.data_aware:
        from dyndq.quantization.calibration import Calibration

        calibration = Calibration.collect(model, found.targets, options, feeds, loaded=tensors.loaded,
                                          progress=progress)
    if options.budget is not None:
        report.budget = _allocated(model, found.targets, options, tensors, feeds, calibration)
        chosen = report.budget.chosen()
    out = tensors.structure(model)
    names = NameScope(all_names(model))
    if options.method == "awq" and report.budget is not None:  # (each weight's r at the width chosen: budget.py)
        from dyndq.quantization.budget import place_rows

        report.notes += place_rows(out, found.targets, report.budget.rows(), calibration, names, tensors.array)
        found = planning.plan(out, ops=options.ops, exclude=options.exclude)
    elif options.method == "awq":  # (its scales searched, their 1/s placed in `out`: the plan's indices found again)
        from dyndq.quantization.awq import Scaling

        calibration.scaling = Scaling.build(out, found.targets, calibration, options, tensors.array, names, progress)
        found = planning.plan(out, ops=options.ops, exclude=options.exclude)
    rule = WeightRule(found.targets, options, report, {scope.path: scope for scope in scopes(out)}, chosen, progress,
                      calibration if chosen is None else None)  # (a budget's weights are made already)
    try:
        apply(out, [rule.rule()], None, names, store=tensors)
    finally:
        if calibration is not None:  # (its statistics and mapped weights gone before the evaluation's sessions)
            calibration.close()
    tensors.fill(out)
    if calibration is not None:  # (after the walker: its passes, run as the weights came, counted; awq's scales next)
        report.notes += calibration.notes() + (calibration.scaling.notes if calibration.scaling is not None else [])
    if report.budget is not None:  # (the candidates' codes, every width of every weight, are not kept with the report)
        report.budget.release()
    if strict and len(report.left_alone) > len(found.problems):
        raise ValidationError(report.left_alone)
    if not report.layers:
        raise NothingToQuantize(report.left_alone, options.ops, found.activation_line(), excluded=found.excluded,
                                other_weights=found.other_weights_line(options.ops))
    report.model_bytes_before, report.model_bytes_after = constant_bytes(model), constant_bytes(out)
    report.seconds = time.perf_counter() - started
    return out, report


class WeightRule:
    """The quantize rule for one call: each weight the plan found (plan.Target), offered by the
    walker as the constant holding it, quantized in the options' format (or as a budget chose),
    its nodes and tensors made by the format, its readers pointed at them; a weight that cannot
    be is named in the report as left alone."""

    def __init__(self, targets, options: QuantizeOptions, report: QuantizeReport, scopes_by_path: dict, chosen,
                 progress, calibration=None):
        self.targets = {(t.graph, t.name): t for t in targets}
        self.calibration = calibration
        self.options, self.report, self.every, self.chosen, self.progress = options, report, scopes_by_path, chosen, progress
        self.done = 0

    def rule(self) -> Rule:
        return Rule("weight -> codes + DynamicDequantize", QUANTIZE, (None, None), self.check, self.rewrite)

    def check(self, held, view):
        """(target, QuantizedWeight, when it started) for a weight to quantize; a Refusal naming why
        one cannot be (its Problem goes to the report); not mine: any other constant."""
        target = self.targets.get((held.scope.path, held.name))
        if target is None or target.constant_node != (held.node is not None):
            return Refusal("not a weight of the plan", mine=False)
        weight = view.read(held.tensor)
        started = time.perf_counter()  # (the layer's seconds: its quantizing and its nodes, the reading left out)
        chosen = None if self.chosen is None else self.chosen.get((target.graph, target.name))
        q = _quantized(target, weight, self.options, chosen, self.calibration)
        del weight
        if isinstance(q, Problem):
            self.done += 1
            self.report.left_alone.append(q)
            return Refusal(str(q))
        return target, q, started

    def rewrite(self, found, held, view) -> Rewrite:
        target, q, started = found
        opset = view.imports.get("", view.imports.get("ai.onnx")) or 1
        p = formats.of(q).nodes(target.name, target.dtype, q, view.names, opset)
        after = sum(stored_bytes(t) for t in p.tensors)
        rewires = [(self.every[u.graph].nodes[u.index], planning.WEIGHT_INPUT[u.op][0], p.output) for u in target.uses]
        passing = [] if target.keep_float else [self.every[path].nodes[index] for path, index in target.via]
        notes = [f"also read by {', '.join(target.keep_float)}: the float weight is kept for them"] if target.keep_float else []
        other = [u.node for u in target.uses if u.axis != target.axis]
        if other:
            notes.append(f"quantized along axis {target.axis} (for {target.uses[0].node}); {', '.join(other)} "
                         "would reduce along another")
        layer = LayerReport(
            target.name, target.graph, [u.node for u in target.uses], target.ops, list(target.dims), target.dtype, p.form,
            q.stats.relative, q.stats.max_abs, q.stats.cosine, _float_bytes(target), after,
            time.perf_counter() - started, notes)
        self.report.layers.append(layer)
        self.done += 1
        if self.progress:
            self.progress(f"[{self.done}/{len(self.targets)}] {layer.name} {'x'.join(map(str, layer.shape))} {layer.form}: "
                          f"rel. error {layer.relative_error:.4f} ({layer.seconds:.1f} s)")
        return Rewrite(([held.node] if held.node is not None else []) + passing, p.nodes, p.tensors, p.form,
                       domains={DOMAIN: version_of(q)}, rewires=rewires)


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


def budget_feeds(model, options: QuantizeOptions, given: list[dict] | None, samples: int) -> list[dict] | None:
    """The inputs a budget is chosen on, and a data-aware method (gptq) calibrated on: the
    evaluation's (the user's, or its seeded samples, a calibration.Seeded list)."""
    if options.budget is None and not options.data_aware:
        return None
    from dyndq.quantization.calibration import Seeded
    from dyndq.quantization.evaluate import seeded_samples

    if given is not None:
        return given
    drawn = Seeded(seeded_samples(model, options.seed, samples))
    drawn.seed = options.seed
    return drawn


def _allocated(model, targets, options: QuantizeOptions, tensors: Tensors, feeds, calibration=None):
    """The budget's allocation (budget.BudgetReport), its weights read from `tensors`; a budget
    out of the model's range is an OptionError saying what is possible."""
    from dyndq.quantization.budget import BudgetError, allocate, weight_arrays
    from dyndq.quantization.options import OptionError

    try:
        return allocate(model, targets, weight_arrays(model, targets, tensors.array), options, feeds, tensors.array,
                        calibration)
    except BudgetError as e:
        raise OptionError([e.problem]) from None


def _quantized(target, weight, options: QuantizeOptions, chosen=None, calibration=None):
    """The weight's QuantizedWeight in the options' format (`chosen`: made already, a budget's
    allocation; `calibration`: a data-aware method's, calibration.py), or the Problem of a weight
    that cannot be quantized."""
    # (a weight with NaN or infinity is told so, whatever else its quantization found: it is
    # looked for only where the quantization's error sums are not finite, or it failed, as a
    # NaN or an infinity makes them: a pass over every weight less)
    from dyndq.quantization.gptq import NotPositiveDefinite

    try:
        if chosen is not None:
            q = chosen
        elif calibration is not None:
            q = calibration.quantize(weight, target, options)
        else:
            q = options.fmt.quantize(weight, target, options, options.bits)
    except NotPositiveDefinite:
        return _weight_problem(target, f"its inputs' X^T X plus damping {options.damping:g} not positive definite "
                                       "(it did not factor)", "a damping with which it factors: larger where X^T X "
                                                              "is nearly singular (default 0.01)")
    except ScaleOutOfRange as e:
        if not _finite(weight):
            return _weight_problem(target, *NOT_FINITE)
        return _weight_problem(target, e.found, e.allowed)
    if not q.stats.finite and not _finite(weight):
        return _weight_problem(target, *NOT_FINITE)
    return q


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


