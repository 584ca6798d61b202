"""Mixed widths under a size budget: which format each weight gets (`quantize(model, budget=BITS)`).

What the budget counts: the bytes of the initializers written for the weights quantized (codes,
packed as stored, scales, zero points, NVFP4's tensor scale, a padded axis' Slice bounds), times
8, over the number of elements of those weights.  Weights left alone (and every other
initializer) are not counted.  The model written holds at most that many bits per weight.

How the widths are chosen:
1. every weight is quantized at every choice (int2, int4, int8 with the options' group size and
   method; mxfp4, nvfp4 when asked), and each candidate's bytes counted as written; with a
   data-aware method (gptq, awq, any with scale estimation) each integer candidate is the
   method's own at that width, on the statistics collected once (`calibrated_candidates`);
2. its sensitivity: the model's output error with only that weight at that choice (the others
   float), on the samples the evaluation uses (the user's inputs, or its seeded samples:
   evaluate.py) - the squared error of every float output over their squared norm.  One ONNX Runtime
   session runs them all (quantization/swapped.py, which verify's blame shares): the weights
   quantized are made graph inputs, fed float or dequantized.  A weight that cannot be fed so (a
   nested graph's, a function's) and a model ONNX Runtime cannot run fall back to the weight's own
   squared reconstruction error;
3. each weight's choices on their lower convex hull (bytes against error), and the steps up the
   hulls ordered by error saved per byte: the allocation at a budget is the longest prefix of
   that one order that fits (so a larger budget takes every step a smaller one took), then
   the later steps that still fit;
4. the errors of single weights are added (first order: independent errors add in square);
   since they only nearly do, every prefix that fits (when there are more than 8 allocations in
   all: six spread over the prefixes, the longest two among them), the filled allocation and
   every uniform choice that fits are run jointly on the same feeds, and the one with the least measured error is kept (ties: fewer
   bytes).  So on those feeds the result is never worse than any uniform width the budget holds
   (uniform int4 included).  That the error never rises with the budget is measured by the
   tests, not proven: the filled allocation, and the prefixes left out beyond 8, are not
   nested from one budget to a larger one.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from dyndq.opdefs import Problem
from dyndq.plumbing.light import stored_bytes
from dyndq.plumbing.names import NameScope
from dyndq.plumbing.walk import is_constant_node
from dyndq.quantization import formats
from dyndq.quantization.numerics import ScaleOutOfRange
from dyndq.quantization.swapped import Swapped, held, is_float_output as _is_float


class BudgetError(ValueError):
    """A budget this model's weights cannot be held to, or buys nothing: `problem` says what is possible."""

    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem


@dataclass
class Candidate:
    choice: str
    q: object  # QuantizedWeight
    bytes: int  # of the initializers written for it
    relative: float  # reconstruction error |W - W'| / |W|
    error: float = 0.0  # the model's relative squared output error with only this weight quantized so
    method: str = ""  # what made it (a data-aware method's candidates: calibrated_candidates)
    rows: object = None  # (awq) float64 [K], r = 1/s: the graph multiplies the weight's input by it; None: not scaled


@dataclass
class WeightChoices:
    key: tuple[str, str]  # (graph path, weight name), as plan.Target names it
    elements: int
    candidates: list[Candidate]
    chosen: int = 0  # index into candidates
    step_gain: float | None = None  # error saved per byte by the step that chose it (None: not a step's)
    why: str = ""

    @property
    def name(self) -> str:
        return self.key[1]


@dataclass
class BudgetReport:
    budget: float  # bits per weight asked for
    choices: tuple[str, ...]
    weights: list[WeightChoices]
    sensitivity: str  # how each candidate's error was measured
    considered: list[tuple[str, int, float, float]] = field(default_factory=list)  # (label, bytes, predicted, measured)
    kept: str = ""  # which of `considered` was kept

    @property
    def elements(self) -> int:
        return sum(w.elements for w in self.weights)

    @property
    def bytes(self) -> int:
        return sum(w.candidates[w.chosen].bytes for w in self.weights)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.bytes / self.elements

    def chosen(self) -> dict:
        """(graph, name) -> the QuantizedWeight chosen."""
        return {w.key: w.candidates[w.chosen].q for w in self.weights}

    def rows(self) -> dict:
        """(graph, name) -> awq's r of the candidate chosen (the weights it scales): calibrated_candidates."""
        return {w.key: w.candidates[w.chosen].rows for w in self.weights if w.candidates[w.chosen].rows is not None}

    def release(self) -> None:
        """Drop every candidate's arrays (their figures stay): the model is written."""
        for w in self.weights:
            for c in w.candidates:
                c.q = None

    def lines(self) -> list[str]:
        out = [f"budget {self.budget:g} bits per weight (codes, scales and zero points over the weights quantized): "
               f"{self.bits_per_weight:.4f} spent ({self.bytes} bytes over {self.elements} weights); kept: {self.kept}",
               f"  sensitivity: {self.sensitivity}"]
        for w in self.weights:
            c = w.candidates[w.chosen]
            each = ", ".join(f"{x.choice} {8 * x.bytes / w.elements:.3f} b/w err {x.error:.3g}" for x in w.candidates)
            out.append(f"  {w.name}: {c.choice}{' by ' + c.method if c.method else ''} ({w.why}; {each})")
        out.append("  allocations run jointly (bytes, predicted / measured relative squared output error):")
        out += [f"    {label}: {b} bytes, {p:.4g} / {m:.4g}" for label, b, p, m in self.considered]
        return out

    def as_dict(self) -> dict:
        return {"budget": self.budget, "choices": list(self.choices), "bits_per_weight": self.bits_per_weight,
                "bytes": self.bytes, "elements": self.elements, "sensitivity": self.sensitivity, "kept": self.kept,
                "weights": [{"name": w.name, "graph": w.key[0], "chosen": w.candidates[w.chosen].choice,
                             "method": w.candidates[w.chosen].method,
                             "step_gain": w.step_gain, "why": w.why,
                             "candidates": [{"choice": c.choice, "method": c.method, "bytes": c.bytes, "bits_per_weight": 8 * c.bytes / w.elements,
                                             "relative_error": c.relative, "output_error": c.error}
                                            for c in w.candidates]} for w in self.weights],
                "considered": [{"label": label, "bytes": b, "predicted": p, "measured": m}
                               for label, b, p, m in self.considered]}


def allocate(model: onnx.ModelProto, targets, arrays: dict, options, feeds: list[dict] | None = None,
             array_of=numpy_helper.to_array, calibration=None) -> BudgetReport:
    """The choice of each target (plan.Target) whose float weight is `arrays[(graph, name)]`, under
    options.budget bits per weight; raises BudgetError when the budget is out of the model's range.
    feeds: the samples (feed dicts) the sensitivities and allocations are measured on (default:
    the evaluation's seeded ones, evaluate.seeded_samples); array_of: reads the model's other initializers (a model read without its
    external data); calibration: a data-aware method's (calibration.Calibration), whose candidates
    are made by that method (calibrated_candidates)."""
    weights = []
    made = None if calibration is None else calibrated_candidates(targets, arrays, options, calibration)
    for t in targets:
        w = arrays.get((t.graph, t.name))
        if w is None or not np.isfinite(w.astype(np.float32)).all():
            continue  # (the quantizer names it as left alone)
        cands = ([c for c in (_candidate(t, w, choice, options) for choice in options.format_choices) if c is not None]
                 if made is None else made.get((t.graph, t.name), []))
        if cands:
            weights.append(WeightChoices((t.graph, t.name), int(w.size), cands))
    if not weights:
        return BudgetReport(options.budget, options.format_choices, [], "no weight")
    elements = sum(w.elements for w in weights)
    cheapest = sum(min(c.bytes for c in w.candidates) for w in weights)
    dearest = sum(max(c.bytes for c in w.candidates) for w in weights)
    lo, hi = 8 * cheapest / elements, 8 * dearest / elements
    if options.budget < lo or options.budget > hi + 1e-9:
        raise BudgetError(Problem("budget", f"{options.budget:g} bits per weight",
                                  f"from {np.ceil(lo * 1e4) / 1e4:.4f} (every weight at its cheapest of "
                                  f"{','.join(options.format_choices)}) to {np.floor(hi * 1e4) / 1e4:.4f} (every weight "
                                  "at its dearest; more buys nothing) for these weights"))
    limit = int(np.floor(options.budget * elements / 8 + 1e-9))
    run, how = _runner(model, [w.key for w in weights], arrays, feeds, options.seed, array_of)
    for w in weights:
        for c in w.candidates:
            c.error = run({w.key: c}) if run else _own_error(arrays[w.key], c)
    report = BudgetReport(options.budget, options.format_choices, weights, how)
    steps = _steps(weights)
    # the allocations to run jointly: every prefix of the steps that fits, and each uniform choice that fits
    start = [_cheapest(w) for w in weights]
    allocations = []
    current, gains, spent = list(start), [None] * len(weights), sum(w.candidates[i].bytes for w, i in zip(weights, start))
    allocations.append(("greedy, 0 steps", list(current), list(gains)))
    for n, (gain, i, to) in enumerate(steps, 1):
        extra = weights[i].candidates[to].bytes - weights[i].candidates[current[i]].bytes
        if spent + extra > limit:
            break
        spent += extra
        current[i], gains[i] = to, gain
        allocations.append((f"greedy, {n} steps", list(current), list(gains)))
    filled, fill_gains, fill_spent = list(current), list(gains), spent
    for gain, i, to in steps[len(allocations) - 1:]:  # (the steps past the prefix that still fit, in order)
        frm = filled[i]
        extra = weights[i].candidates[to].bytes - weights[i].candidates[frm].bytes
        if fill_spent + extra <= limit and _next_on_hull(weights[i], frm) == to:
            fill_spent += extra
            filled[i], fill_gains[i] = to, gain
    if filled != current:
        allocations.append(("greedy, filled past the prefix", filled, fill_gains))
    for choice in options.format_choices:
        picks = [next((k for k, c in enumerate(w.candidates) if c.choice == choice), None) for w in weights]
        if None not in picks and sum(w.candidates[k].bytes for w, k in zip(weights, picks)) <= limit:
            allocations.append((f"uniform {choice}", picks, [None] * len(weights)))
    if len(allocations) > 8:  # (the prefixes' last few and a spread of the rest: the measured runs stay few)
        greedy = [a for a in allocations if a[0].startswith("greedy, ") and a[0].endswith("steps")]
        keep = sorted(set(np.linspace(0, len(greedy) - 1, 6).round().astype(int)) | {len(greedy) - 2})
        allocations = [greedy[k] for k in keep if k >= 0] + [a for a in allocations if a not in greedy]
    best = None
    for label, picks, step_gains in allocations:
        b = sum(w.candidates[k].bytes for w, k in zip(weights, picks))
        predicted = sum(w.candidates[k].error for w, k in zip(weights, picks))
        measured = run({w.key: w.candidates[k] for w, k in zip(weights, picks)}) if run else predicted
        report.considered.append((label, b, predicted, measured))
        if best is None or (measured, b) < best[0]:
            best = ((measured, b), label, picks, step_gains)
    _, report.kept, picks, step_gains = best
    for w, k, g in zip(weights, picks, step_gains):
        w.chosen, w.step_gain = k, g
        w.why = (f"{report.kept}, measured best" if report.kept.startswith("uniform") else
                 "its cheapest choice" if g is None else f"step up taken at {g:.3g} error saved per byte")
    return report


def _candidate(target, weight, choice, options) -> Candidate | None:
    bits, name = formats.choices()[choice]
    fmt = formats.get(name)
    try:
        q = fmt.quantize(weight, target, options, bits)
    except ScaleOutOfRange:
        return None
    # (the bytes as the quantizer writes them: its tensors, placed under throwaway names)
    p = fmt.nodes(target.name, target.dtype, q, NameScope(set()), 21)
    size = sum(stored_bytes(t) for t in p.tensors)
    return Candidate(choice, q, size, q.stats.relative)


def calibrated_candidates(targets, arrays: dict, options, calibration) -> dict:
    """(graph, name) -> the Candidates of a data-aware method (options.method gptq or awq, or any with
    scale estimation), one per choice: each integer width made by the method as `quantize(method=...,
    bits=b)` alone makes it, on the statistics collected once (`calibration`: every width of a weight
    made before they are dropped); an FP4 choice by its format's own rule (no data-aware method applies
    to it), and a weight with no input to calibrate on by rtn, which each Candidate's method says."""
    import dataclasses

    from dyndq.quantization.gptq import NotPositiveDefinite

    out = {}
    by_key = {(t.graph, t.name): t for t in targets}
    what = options.method + (" + scale estimation" if options.scale_estimation else "")
    every = formats.choices()
    fp4 = [c for c in options.format_choices if every[c][1] != "int"]
    ints = [c for c in options.format_choices if every[c][1] == "int"]
    for key, t in by_key.items():
        w = arrays.get(key)
        if w is None or not np.isfinite(w.astype(np.float32)).all():
            continue
        out[key] = [c for c in (_candidate(t, w, choice, dataclasses.replace(options, method="rtn",
                                                                              scale_estimation=False))
                                for choice in fp4) if c is not None]
        for c in out[key]:
            c.method = "its format's rule (no data-aware method applies to it)"
    if options.method == "awq":
        _awq_candidates(by_key, arrays, options, calibration, ints, out, what)
        return _ordered(out, options.format_choices)
    for key in calibration_order(calibration, by_key):
        if key not in out:
            continue
        t, w = by_key[key], arrays[key]
        calibration.done = _kept  # (every width of this weight on the same statistics: dropped after the last)
        try:
            for choice in ints:
                bits = every[choice][0]
                try:
                    q = calibration.quantize(w, t, dataclasses.replace(options, bits=bits, format="int"))
                except (ScaleOutOfRange, NotPositiveDefinite):  # (that width left out, as the data-free one is)
                    continue
                out[key].append(_counted(t, choice, q, what if key in calibration.inputs else "rtn (no input to "
                                                                                               "calibrate on)"))
        finally:
            del calibration.done
            calibration.done(key)
    return _ordered(out, options.format_choices)


def _kept(key) -> None:
    """Calibration.done while a weight's widths are made: its statistics kept."""


def calibration_order(calibration, by_key: dict) -> list:
    """The weights in the order their statistics are collected (calibration.walker_order: the passes run once)."""
    inputs = list(calibration.inputs)
    return inputs + [k for k in by_key if k not in calibration.inputs]


def _ordered(out: dict, choices) -> dict:
    order = {c: i for i, c in enumerate(choices)}
    return {k: sorted(v, key=lambda c: order[c.choice]) for k, v in out.items()}


def _counted(target, choice: str, q, method: str, rows=None, weight=None) -> Candidate:
    """A Candidate of `q`, its bytes as the quantizer writes them (`rows`: awq's r, its relative error
    then that of the weight the graph reads, diag(r) Q, against `weight`)."""
    p = formats.of(q).nodes(target.name, target.dtype, q, NameScope(set()), 21)
    c = Candidate(choice, q, sum(stored_bytes(x) for x in p.tensors), q.stats.relative, method=method, rows=rows)
    if rows is not None:
        w = weight.astype(np.float64)
        c.relative = float(np.linalg.norm(w - as_read(c, weight)) / max(np.linalg.norm(w), 1e-300))
    return c


def _awq_candidates(by_key, arrays, options, calibration, ints, out, what) -> None:
    """awq's candidates: per group of weights reading the same X (awq._groups) and per width, alpha
    searched as `quantize(method="awq", bits=b)` searches it (awq.search, on the group's X^T X), each
    member's scaled weight rounded (and refitted by scale estimation when asked) at that width.  No fold
    into a quantized weight's output channels: a later X's r would tie that weight to the later
    group's width, so r is always placed in a Mul (place_rows)."""
    import dataclasses

    from dyndq.quantization import awq, scale_estimation

    every = formats.choices()
    for group in awq._groups(calibration):
        keys, stats, members = [k for k in group.keys if k in out], None, None
        transposed = any(i.transposed for i in group.inputs)
        if keys and not transposed:
            stats = {i: calibration.stats[i] for i in group.inputs}
            rows = sum(stats[i].rows for i in group.inputs)
            mean_abs = sum(stats[i].abs_sum for i in group.inputs) / max(rows, 1)
            dtype = _dtype(group.inputs[0].dtype)
            # (Member.of carries the rows too: with few of them awq's search measures its errors on a
            # factor of X^T X, as awq alone does, so each width's alpha is awq alone's)
            members = [awq.Member.of(k, arrays[k], by_key[k].axis, calibration) for k in keys]
        for choice in ints:
            o = dataclasses.replace(options, bits=every[choice][0], format="int")
            if not keys:
                continue
            if transposed:  # (awq alone leaves X read transposed unscaled: rtn's rounding)
                for k in keys:
                    try:
                        out[k].append(_counted(by_key[k], choice, awq.rounded(arrays[k], by_key[k], o),
                                               "rtn (its input read transposed: awq does not scale it)"))
                    except ScaleOutOfRange:
                        pass
                continue

            def values_of(w, m, o=o):
                return o.fmt.dequantize(awq.rounded(w, by_key[m.key], o), w.dtype)

            found = awq.search(members, mean_abs, dtype, values_of)
            r = None if found.alpha == 0 else found.r
            for m in members:
                t = by_key[m.key]
                try:
                    scaled = m.weight if r is None else awq.scaled_weight(m.weight, t.axis, r)
                    q = awq.rounded(scaled, t, o)
                    if options.scale_estimation:
                        gram = m.gram if r is None else m.gram * np.outer(r, r)
                        q = scale_estimation.refine_weight(scaled, q, gram, bits=o.bits, symmetric=o.symmetric)
                except ScaleOutOfRange:
                    continue
                out[m.key].append(_counted(t, choice, q, f"{what} (alpha {found.alpha:g})", r, m.weight))
        del stats, members  # (the group's statistics: dropped with its weights)
        for k in group.keys:
            calibration.done(k)
    for key in by_key:  # (a weight with no input to calibrate on: rtn, as awq alone rounds it)
        if key in out and key not in calibration.inputs:
            t = by_key[key]
            for choice in ints:
                o = dataclasses.replace(options, bits=every[choice][0], format="int")
                try:
                    out[key].append(_counted(t, choice, awq.rounded(arrays[key], t, o), "rtn (no input to calibrate on)"))
                except ScaleOutOfRange:
                    pass


def _dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def as_read(c: Candidate, weight: np.ndarray) -> np.ndarray:
    """The weight the quantized graph reads in its float place: the candidate dequantized, times awq's r
    along its input channels (the Mul by r before it, moved onto the weight: X diag(r) Q = X (diag(r) Q))."""
    d = dequantized(c.q, weight.dtype)
    if c.rows is None:
        return d
    axis = c.q.axis
    r = c.rows[:, None] if axis == 0 else c.rows[None, :]
    return (d.astype(np.float64) * r).astype(weight.dtype)


def place_rows(out: onnx.ModelProto, targets, rows: dict, calibration, names, read) -> list[str]:
    """awq's r of each weight a budget chose (`rows`: (graph, name) -> r) placed in `out`; the notes'
    lines.  Where every reader of X chose one width, its r goes where awq alone puts it (folded into a
    LayerNormalization, a float weight or a Gemm's C where exact: awq._fold), except into a quantized
    weight's output channels (that weight's width is chosen apart, and its codes were made without
    it); else one Mul by r per X and width, before the readers that chose it."""
    from dyndq.quantization import awq

    by_key = {(t.graph, t.name): t for t in targets}
    inserts, notes, seen = [], [], {}
    for key, r in rows.items():
        for i in calibration.inputs.get(key, []):
            readers = [u.index for u in by_key[key].uses if out.graph.node[u.index].input[0] == i.value]
            entry = seen.setdefault(i.value, {}).setdefault(r.tobytes(), (r, _dtype(i.dtype), [], []))
            entry[2].extend(readers)
            entry[3].append(key[1])
    readers_of = awq._readers(out)
    inits = {t.name: t for t in out.graph.initializer}
    for value, by_r in seen.items():
        for r, dtype, readers, weights in by_r.values():
            where = None
            if len(by_r) == 1:  # (no quantized weight folded into: every key counts as searched already)
                where = awq._fold(out, value, set(readers), r, readers_of, inits, by_key, set(by_key), None, read, names)
            if where is None:
                where = awq._mul(out, value, sorted(set(readers)), r, dtype, names, inserts)
            notes.append(f"awq with a budget: {value!r} (read by the weights {', '.join(weights)}): 1/s {where}")
    for position, node in sorted(inserts, key=lambda p: -p[0]):
        out.graph.node.insert(position, node)
    return notes


def _cheapest(w: WeightChoices) -> int:
    return min(range(len(w.candidates)), key=lambda k: (w.candidates[k].bytes, w.candidates[k].error))


def _steps(weights: list[WeightChoices]) -> list[tuple[float, int, int]]:
    """(error saved per byte, weight index, candidate index to move to): the steps up each weight's
    lower convex hull, in one order, most error saved per byte first (a weight's own steps come in
    hull order since their gains fall)."""
    out = []
    for i, w in enumerate(weights):
        hull = _hull(w)
        for a, b in zip(hull, hull[1:]):
            ca, cb = w.candidates[a], w.candidates[b]
            out.append(((ca.error - cb.error) / (cb.bytes - ca.bytes), i, b))
    return heapq.nlargest(len(out), out, key=lambda s: (s[0], -s[1]))


def _hull(w: WeightChoices) -> list[int]:
    """The candidates on the weight's lower convex hull (bytes against error), cheapest first."""
    order = sorted(range(len(w.candidates)), key=lambda k: (w.candidates[k].bytes, w.candidates[k].error))
    hull = [order[0]]
    for k in order[1:]:
        c = w.candidates[k]
        if c.error >= w.candidates[hull[-1]].error:
            continue  # (dearer and no better: never chosen)
        while len(hull) >= 2:
            a, b = w.candidates[hull[-2]], w.candidates[hull[-1]]
            if (a.error - b.error) / (b.bytes - a.bytes) <= (b.error - c.error) / (c.bytes - b.bytes):
                hull.pop()  # (b lies on or above the line from a to c)
            else:
                break
        hull.append(k)
    return hull


def _next_on_hull(w: WeightChoices, k: int) -> int | None:
    h = _hull(w)
    return h[h.index(k) + 1] if k in h and h.index(k) + 1 < len(h) else None


def _own_error(weight: np.ndarray, c: Candidate) -> float:
    """The data-free fallback: the weight's squared reconstruction error |W - W'|^2."""
    return float(c.relative ** 2 * np.sum(weight.astype(np.float64) ** 2))


def _runner(model: onnx.ModelProto, keys, arrays, feeds, seed: int, array_of):
    """(run(weights) -> relative squared output error with `weights` ({key: Candidate})
    dequantized and the rest float, how it is measured), or (None, why it falls back)."""
    main = [k for k in keys if k[0] == "main" and k[1] in held(model)]  # (initializers and Constant nodes of the main graph)
    own = "; the others by their own squared reconstruction error" if len(main) < len(keys) else ""
    try:
        from dyndq.quantization.evaluate import SAMPLES, seeded_samples

        if not main:
            raise ValueError("no weight is a constant of the main graph")
        # the model with those weights as graph inputs, fed the float weight or a dequantized one each run
        samples = seeded_samples(model, seed, SAMPLES) if feeds is None else list(feeds)
        session = Swapped(model, {k[1]: arrays[k] for k in main}, "onnxruntime", array_of)
        want = [session(f) for f in samples]
        norm = sum(float(np.sum(v.astype(np.float64) ** 2)) for w in want for v in w.values() if _is_float(v))
    except Exception as e:  # noqa: BLE001 - a model ONNX Runtime cannot run: the data-free fallback, said
        from dyndq.wording import first_line

        return None, f"each weight's own squared reconstruction error (the model could not be run: {first_line(e)})"

    def run(chosen: dict) -> float:
        fed, own_errors = {}, 0.0
        for k, c in chosen.items():
            if k in main:
                fed[k[1]] = as_read(c, arrays[k])
            else:  # (not fed: its own squared error, over the outputs' squared norm)
                own_errors += _own_error(arrays[k], c) / max(norm, 1e-30)
        err = 0.0
        for f, w in zip(samples, want):
            got = session(f, fed)
            err += sum(float(np.sum((got[n].astype(np.float64) - v.astype(np.float64)) ** 2))
                       for n, v in w.items() if _is_float(v))
        return (err / norm if norm else err) + own_errors

    return run, (f"the model's relative squared output error with only that weight quantized so, "
                 f"on the evaluation's {len(samples)} samples, ONNX Runtime{own}")


def dequantized(q, dtype) -> np.ndarray:
    """The weight the graph gives back for `q` (its format's dequantize: our kernel, as its nodes)."""
    return formats.of(q).dequantize(q, dtype)


def weight_arrays(model: onnx.ModelProto, targets, array_of=numpy_helper.to_array) -> dict:
    """(graph, name) -> the float weight of each target: an initializer of its scope (read with
    `array_of`) or a Constant node's value."""
    from dyndq.plumbing.walk import scopes

    wanted = {(t.graph, t.name) for t in targets}
    out = {}
    for scope in scopes(model):
        if scope.graph is not None:
            for t in scope.graph.initializer:
                if (scope.path, t.name) in wanted:
                    out[scope.path, t.name] = array_of(t)
        for node in scope.nodes:
            if is_constant_node(node) and (scope.path, node.output[0]) in wanted:
                out[scope.path, node.output[0]] = array_of(node.attribute[0].t)
    return out
