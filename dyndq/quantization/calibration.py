"""The calibration of a data-aware method (gptq): the layers' inputs collected once, each weight quantized with them.

`Calibration.collect` finds each weight's inputs (activations.layer_inputs), runs the float
model on ONNX Runtime over the calibration samples (the user's --input/--inputs-dir, or
--samples seeded samples, said so in the report's notes) summing X^T X per distinct input
(activations.collect), and `quantize` rounds a weight by GPTQ with the sum of its readers'
X^T X (a weight read by several MatMuls: the squared output error of all of them).  The
statistics of every layer are held at once (K x K float64 per distinct input: 1.2 MiB for
K = 384, 128 MiB for K = 4096) beside the model, never the activations themselves.  A weight
with no input to calibrate on (a Gather's table, a node in a subgraph) is rounded by rtn, and
the notes name it.
"""
from __future__ import annotations

import dataclasses

from dyndq.quantization.activations import collect, layer_inputs
from dyndq.quantization.gptq import NotPositiveDefinite, gptq_weight
from dyndq.quantization.evaluate import describe_samples
from dyndq.wording import plural


class Seeded(list):
    """Calibration samples drawn from a seed (quantizer.budget_feeds), not given by the user."""

    seed: int = 0


class Calibration:
    def __init__(self, inputs: dict, missing: dict, stats: dict, note: str):
        self.inputs, self.missing, self.stats, self.note = inputs, missing, stats, note
        self.scaling = None  # (method "awq") awq.Scaling: its scales, searched and placed in the graph

    @classmethod
    def collect(cls, model, targets, options, feeds: list[dict], *, loaded=None, progress=None) -> Calibration:
        inputs, missing = layer_inputs(model, targets)
        stats = collect(model, [i for found in inputs.values() for i in found], feeds, loaded=loaded, progress=progress)
        seeded = isinstance(feeds, Seeded)
        note = (f"{options.method} calibrated on {describe_samples(feeds, not seeded, getattr(feeds, 'seed', 0))}"
                + ("; seeded samples are made-up inputs: give real ones with --input/--inputs-dir (inputs= in Python) "
                   "for a calibration that fits the model's data" if seeded else ""))
        return cls(inputs, missing, stats, note)

    def notes(self) -> list[str]:
        """The report's notes: on what it was calibrated, and the weights rounded by rtn instead."""
        out = [self.note]
        if self.missing:
            named = "; ".join(f"{name!r}: {why}" for (_, name), why in self.missing.items())
            out.append(f"{plural(len(self.missing), 'weight')} rounded by rtn instead (no input to calibrate on): {named}")
        return out

    def quantize(self, weight, target, options):
        """The weight's numerics.QuantizedWeight by GPTQ or AWQ (rtn's where it has no input)."""
        key = (target.graph, target.name)
        if self.scaling is not None:  # (awq: its scaled weight, a fold into it too, rounded by rtn)
            return self.scaling.quantize(weight, target, options)
        if key not in self.inputs:
            rtn = dataclasses.replace(options, method="rtn")
            return options.fmt.quantize(weight, target, rtn, options.bits)
        gram = sum(self.stats[i].gram for i in self.inputs[key])
        return gptq_weight(weight, gram, axis=target.axis, group_size=options.group_size, bits=options.bits,
                           symmetric=options.symmetric, scale_dtype=options.scale_dtype or target.dtype,
                           settings=options.gptq)


__all__ = ["Calibration", "NotPositiveDefinite", "Seeded"]
