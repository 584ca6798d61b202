"""The calibration of a data-aware method (gptq): the layers' inputs collected in passes, each weight quantized with them.

`Calibration.collect` finds each weight's inputs (activations.layer_inputs) and splits them into
groups whose statistics fit a memory bound (`calibration_memory`, bytes); a pass runs the float
model on ONNX Runtime over the calibration samples (the user's --input/--inputs-dir, or --samples
seeded samples, said so in the report's notes) with only one group's inputs exposed, summing X^T X
per distinct input (activations.collect).  `quantize` rounds a weight by GPTQ with the sum of its
readers' X^T X (a weight read by several MatMuls: the squared output error of all of them), and
once every weight reading an input is quantized that input's statistics are dropped: what is held
at once is one group's statistics (K x K float64 per distinct input: 1.2 MiB for K = 384, 128 MiB
for K = 4096) beside the model, never the activations themselves.

The groups follow the order the walker offers the weights (the main graph's initializers in the
model's order, then its Constant nodes: converters/walker.py), so each pass runs once; `stats`
is a mapping that runs the pass of an input's group when it is asked for an input not held (a
method reading the statistics in another order gets them too, at the cost of a pass more).  Each
input's sums are those of the same samples in the same order whatever else is exposed, so the
codes are bit for bit those of one pass (tests/quantization/test_calibration_passes.py).

The bound by default (`default_bound`): the larger of one weight's statistics (the least that
works: one layer at a time, the issue's bound) and a quarter of the model's weights.  Why a
quarter: while a pass runs, ONNX Runtime is fed the model's weights (one copy) beside the model
the caller holds (another, when it is in memory), so a quarter keeps the calibration under 2.5x
the model with room for a sample's activations, and it makes the passes few (about four times
the statistics over the model's bytes) where one layer at a time would run a pass per layer or two.

A weight with no input to calibrate on (a Gather's table, a node in a subgraph) is rounded by
rtn, and the notes name it.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from dyndq.opdefs import Problem
from dyndq.quantization import scale_estimation
from dyndq.quantization.activations import ActivationStats, MappedWeights, collect, layer_inputs
from dyndq.quantization.gptq import NotPositiveDefinite, gptq_weight
from dyndq.quantization.evaluate import describe_samples
from dyndq.wording import plural

MODEL_SHARE = 4  # the default bound: the model's weights' bytes over this (or one weight's statistics, if more)


class Seeded(list):
    """Calibration samples drawn from a seed (quantizer.budget_feeds), not given by the user."""

    seed: int = 0


class Calibration:
    def __init__(self, inputs: dict, missing: dict, stats: Mapping, note: str):
        self.inputs, self.missing, self.stats, self.note = inputs, missing, stats, note
        self.scaling = None  # (method "awq") awq.Scaling: its scales, searched and placed in the graph

    @classmethod
    def collect(cls, model, targets, options, feeds: list[dict], *, loaded=None, progress=None) -> Calibration:
        """The weights' inputs found and grouped within `options.calibration_memory` (None: the
        default bound), the first group's pass run (a model or a sample ONNX Runtime refuses is
        said before any weight is quantized); OptionError when the bound is below one weight's
        statistics."""
        inputs, missing = layer_inputs(model, targets)
        inputs = {key: inputs[key] for key in walker_order(model, inputs)}
        bound, chosen = bound_of(model, inputs, options)
        seeded = isinstance(feeds, Seeded)
        what = options.method + (" with scale estimation" if options.scale_estimation else "")
        note = (f"{what} calibrated on {describe_samples(feeds, not seeded, getattr(feeds, 'seed', 0))}"
                + ("; seeded samples are made-up inputs: give real ones with --input/--inputs-dir (inputs= in Python) "
                   "for a calibration that fits the model's data" if seeded else ""))
        passes = Passes(model, inputs, feeds, bound, chosen, loaded=loaded, progress=progress)
        passes.start()
        return cls(inputs, missing, passes, note)

    def notes(self) -> list[str]:
        """The report's notes: on what it was calibrated, in how many passes, and the weights rounded by rtn instead."""
        out = [self.note]
        if self.missing:
            named = "; ".join(f"{name!r}: {why}" for (_, name), why in self.missing.items())
            out.append(f"{plural(len(self.missing), 'weight')} rounded by rtn instead (no input to calibrate on): {named}")
        if isinstance(self.stats, Passes) and self.stats.groups:
            out.append(self.stats.said())
        return out

    def quantize(self, weight, target, options):
        """The weight's numerics.QuantizedWeight by GPTQ or AWQ, or by a data-free method with scale
        estimation (rtn's where it has no input)."""
        key = (target.graph, target.name)
        try:
            if self.scaling is not None and key in self.scaling.refined:  # (awq: refitted as its group was searched)
                return self.scaling.refined.pop(key)
            if self.scaling is not None and not (options.scale_estimation and key in self.inputs):
                return self.scaling.quantize(weight, target, options)  # (awq: its scaled weight, a fold's too, by rtn)
            if key not in self.inputs:
                rtn = dataclasses.replace(options, method="rtn")
                return options.fmt.quantize(weight, target, rtn, options.bits)
            if self.scaling is not None:  # (awq with scale estimation)
                return self.awq_refit(self.scaling, weight, target, options)
            gram, rows = self.gram(key)
            if options.scale_estimation:
                return scale_estimation.quantize(weight, target, options, gram, rows)
            return gptq_weight(weight, gram, axis=target.axis, group_size=options.group_size, bits=options.bits,
                               symmetric=options.symmetric, scale_dtype=options.scale_dtype or target.dtype,
                               settings=options.gptq)
        finally:
            self.done(key)

    def gram(self, key) -> tuple:
        """(X^T X summed over the weight `key`'s inputs, the calibration rows summed into it: scale
        estimation damps X^T X for few rows)."""
        grams = [self.stats[i].gram for i in self.inputs[key]]
        gram = grams[0] if len(grams) == 1 else sum(grams)  # (one input: its own, not a copy of K x K)
        return gram, sum(self.stats[i].rows for i in self.inputs[key])

    def awq_refit(self, scaling, weight, target, options):
        """awq with scale estimation: the weight scaled by `scaling` (awq.Scaling) rounded, then
        refitted on its scaled input's X^T X (Scaling._refine calls it as each group is searched,
        before `self.scaling` is set; this class's `quantize` for a weight not refitted then: one
        computation, the same bits either way)."""
        gram, rows = self.gram((target.graph, target.name))
        gram = scaling.input_gram(gram, target)

        def refine(scaled, q):
            return scale_estimation.refine_weight(scaled, q, gram, bits=options.bits, symmetric=options.symmetric,
                                                  calibration_rows=rows)

        return scaling.quantize(weight, target, options, refine=refine)

    def done(self, key) -> None:
        """The weight `key` ((graph, name)) is quantized: the statistics no other weight still needs are dropped
        (awq's without scale estimation too: its scales were searched before the walker)."""
        if isinstance(self.stats, Passes):
            self.stats.done(key)

    def close(self) -> None:
        """Every statistic dropped and the passes' mapped weights removed (quantize_model, once the walker is done)."""
        if isinstance(self.stats, Passes):
            self.stats.close()


def walker_order(model, inputs: dict) -> list:
    """The keys of `inputs` ((graph, name)) in the order the walker offers their weights: the
    main graph's initializers in the model's order, then its Constant nodes (only the main graph's
    weights have inputs here: activations.layer_inputs)."""
    from dyndq.quantization.activations import MAIN

    position = {}
    for t in model.graph.initializer:
        position.setdefault((MAIN, t.name), len(position))
    for n in model.graph.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
            position.setdefault((MAIN, n.output[0]), len(position))
    return sorted(inputs, key=lambda key: position.get(key, len(position)))


def weight_bytes(inputs: list) -> int:
    """The bytes of the statistics one weight needs at once (its distinct inputs')."""
    return sum(ActivationStats.bytes_for(i.k) for i in dict.fromkeys(inputs))


def default_bound(model, inputs: dict) -> int:
    """The larger of one weight's statistics (the largest) and a quarter of the model's weights (see the module doc)."""
    from dyndq.plumbing.light import nbytes

    largest = max((weight_bytes(found) for found in inputs.values()), default=0)
    return max(largest, sum(nbytes(t) for t in model.graph.initializer) // MODEL_SHARE)


def bound_of(model, inputs: dict, options) -> tuple[int, bool]:
    """(the bound in bytes, whether the user chose it); OptionError when the chosen one is below
    the statistics of the weight that needs the most."""
    chosen = getattr(options, "calibration_memory", None)
    if chosen is None:
        return default_bound(model, inputs), False
    largest = max(inputs.items(), key=lambda item: weight_bytes(item[1]), default=None)
    if largest is not None and weight_bytes(largest[1]) > chosen:
        from dyndq.quantization.options import OptionError

        need = weight_bytes(largest[1])
        raise OptionError([Problem("calibration_memory", f"{chosen} bytes ({mib(chosen)})",
                                   f"at least {need} bytes ({mib(need)}): the statistics of weight "
                                   f"{largest[0][1]!r}, which are held whole while it is quantized")])
    return chosen, True


def mib(n: int) -> str:
    """Bytes in MiB (GiB from 1 GiB up), for the notes and errors."""
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def grouped(inputs: dict, bound: int) -> list[list]:
    """The distinct inputs in groups, in the weights' order: each weight's inputs join the group
    being made while the group's statistics stay within `bound`, else start the next one (an input
    two neighbouring groups need is held through both: counted in each)."""
    groups, current, held = [], [], 0
    for found in inputs.values():
        new = [i for i in dict.fromkeys(found) if i not in current]
        size = sum(ActivationStats.bytes_for(i.k) for i in new)
        if current and held + size > bound:
            groups.append(current)
            current = list(dict.fromkeys(found))
            held = weight_bytes(found)
            continue
        current += new
        held += size
    if current:
        groups.append(current)
    return groups


class Passes(Mapping):
    """LayerInput -> its ActivationStats, held a group at a time: asked for an input not held,
    it runs the pass of the next group holding it (the held inputs that group shares kept, the
    others dropped); `done(key)` drops the inputs no weight left needs."""

    def __init__(self, model, inputs: dict, feeds, bound: int, chosen: bool, *, loaded=None, progress=None):
        self.model, self.feeds, self.bound, self.chosen, self.loaded, self.progress = (
            model, feeds, bound, chosen, loaded, progress)
        self.groups = grouped(inputs, bound)
        self.every = sum(ActivationStats.bytes_for(i.k) for i in {i for g in self.groups for i in g})
        self.waiting = {}  # input -> the weights not yet quantized that read it
        for key, found in inputs.items():
            for i in found:
                self.waiting.setdefault(i, set()).add(key)
        self.held: dict = {}
        self.mapped = None  # (activations.MappedWeights: made with the first pass, closed with the last)
        self.current = -1
        self.runs = 0
        self.seconds = 0.0
        self.most = 0  # the most bytes of statistics held at once

    def start(self) -> None:
        if self.groups:
            self._pass(0)

    def __getitem__(self, i):
        if i not in self.held:
            if i not in self.waiting:
                raise KeyError(i)
            after = [g for g in range(self.current + 1, len(self.groups)) if i in self.groups[g]]
            self._pass(after[0] if after else next(g for g, group in enumerate(self.groups) if i in group))
        return self.held[i]

    def __iter__(self):
        return iter(self.waiting)

    def __len__(self):
        return len(self.waiting)

    def done(self, key) -> None:
        for i, weights in self.waiting.items():
            weights.discard(key)
            if not weights:
                self.held.pop(i, None)
        if not any(self.waiting.values()):
            self.close()

    def close(self) -> None:
        self.held = {}
        if self.mapped is not None:
            self.mapped.close()
            self.mapped = None

    def _pass(self, g: int) -> None:
        group = self.groups[g]
        self.held = {i: s for i, s in self.held.items() if i in group}  # (the rest dropped before the run)
        wanted = [i for i in group if i not in self.held]
        started = time.perf_counter()
        count = len(self.groups)
        progress = self.progress and (lambda line: self.progress(f"pass {g + 1}/{count}: {line}"))
        if self.mapped is None:
            self.mapped = MappedWeights(self.model, self.loaded)
        self.held.update(collect(self.model, wanted, self.feeds, loaded=self.loaded, progress=progress,
                                 mapped=self.mapped))
        self.seconds += time.perf_counter() - started
        self.runs += 1
        self.current = g
        self.most = max(self.most, sum(ActivationStats.bytes_for(i.k) for i in self.held))

    def said(self) -> str:
        """The passes in a few words, for the report's notes."""
        bound = (f"--calibration-memory {mib(self.bound)}" if self.chosen
                 else f"the default bound {mib(self.bound)}: a quarter of the model's weights, or one weight's statistics")
        return (f"the layers' inputs collected in {self.runs} pass{'' if self.runs == 1 else 'es'} over the samples "
                f"({self.runs * len(self.feeds)} ONNX Runtime runs in {self.seconds:.2f} s), at most {mib(self.most)} "
                f"of statistics held at once ({bound}; every layer's at once: {mib(self.every)})")


__all__ = ["Calibration", "NotPositiveDefinite", "Seeded"]
