"""`dyndq.verify(quantized, source)`: a quantized ONNX model checked against what it was made from.

Weight by weight (weights.py: each quantized weight, in every form the lift reads, matched to its
source tensor and given one status: identical, rtn, requantized, layout with its kind, differs,
unmatched, float), and, when the source is a float ONNX model, output by output (outputs.py:
cosine, relative error, top-1 agreement and KL per output, on each engine setting asked), each
held to a stated relative error (`tolerance`); where one is beyond it (or when asked), which weight
is to blame (blame.py: the output error with only that weight quantized, ranked); and a setting
whose outputs moved more than the float model's did, pinned by parity's search (settings.py).
docs/verify.md holds the report's schema and what is still to come.
"""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field

import numpy as np
import onnx

from dyndq.verification.outputs import OutputVerdict
from dyndq.verification.decodes import forget
from dyndq.verification.settings import REFERENCE, EngineSetting, SettingVerdict, settings_asked
from dyndq.verification.weights import CheckpointSource, OnnxSource, WeightVerdict, verify_weights

SAMPLES = 4
# An output's relative error ||q - f|| / ||f|| above which it is a finding.  A fixed bound, not one
# predicted from the weights: a wrong weight would raise its own prediction.  0.5 is past what a
# faithful round to nearest moves outputs by at 4 bits and up (0.11 to 0.23 on the tests' MLPs, 0.22 to
# 0.39 on MiniLM at 4 bits, block 32; 0.016 at Q8_0), and short of what a wrong layout does (a weight's
# error near 1.4: an output's near 1 or more).  2-bit RTN moves them past it (0.76 to 0.9 on the tests'
# MLPs): a user who accepts that says so with `tolerance` (docs/verify.md).
TOLERANCE = 0.5


@dataclass
class VerifyReport:
    quantized: str
    source: str
    source_kind: str  # "onnx" or the checkpoint's format ("GGUF", ...)
    weights: list[WeightVerdict] = field(default_factory=list)
    outputs: list[OutputVerdict] = field(default_factory=list)
    settings: list[SettingVerdict] = field(default_factory=list)  # engine settings the weights do not explain
    blame: list = field(default_factory=list)  # blame.Blame, the weights most to blame first
    tolerance: float = TOLERANCE  # the relative error an output may move by
    unused: list[str] = field(default_factory=list)  # source tensors no weight matched
    inputs: str = ""  # which inputs the outputs were compared on
    outputs_note: str = ""  # why no output was compared
    blame_note: str = ""  # how the blame was measured, or why not

    def within(self, o: OutputVerdict) -> bool:
        return bool(o.relative <= self.tolerance)  # (a NaN is not)

    @property
    def beyond(self) -> list[OutputVerdict]:
        """The outputs that moved more than the tolerance, on any engine."""
        return [o for o in self.outputs if not self.within(o)]

    @property
    def also(self) -> list[dict]:
        """[{"rule", "weights"}]: another quantizer's rule that gives the same codes as the rule named on
        these rtn weights (NNCF's where ONNX Runtime's matched), said once for the report."""
        by_rule: dict[str, list[str]] = {}
        for w in self.weights:
            if w.also:
                by_rule.setdefault(w.also, []).append(w.weight)
        return [{"rule": rule, "weights": names} for rule, names in by_rule.items()]

    @property
    def findings(self) -> list[WeightVerdict]:
        return [w for w in self.weights if not w.faithful]

    @property
    def faithful(self) -> bool:
        return not self.findings and not self.beyond and not self.settings

    def as_dict(self) -> dict:
        return {"quantized": self.quantized, "source": self.source, "weights": [w.as_dict() for w in self.weights],
                "outputs": [{**o.as_dict(), "within": self.within(o)} for o in self.outputs],
                "settings": [s.as_dict() for s in self.settings],
                "blame": [b.as_dict() for b in self.blame], "tolerance": self.tolerance,
                "source_kind": self.source_kind, "unused_source": list(self.unused), "inputs": self.inputs,
                "outputs_note": self.outputs_note, "blame_note": self.blame_note, "also": self.also,
                "faithful": self.faithful}

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for w in self.weights:
            key = f"layout {w.kind}" if w.kind else w.status
            counts[key] = counts.get(key, 0) + 1
        said = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        parts = [f"{len(self.findings) + len(self.settings)} finding(s)"] if self.findings or self.settings else []
        if self.beyond:
            parts.append(f"{len(self.beyond)} output(s) beyond relative error {self.tolerance:g}")
        verdict = ", ".join(parts) or "faithful"
        return f"{self.quantized} against {self.source}: {len(self.weights)} weight(s): {said or 'none'}; {verdict}"

    def table(self) -> list[str]:
        lines = []
        for w in self.weights:
            figures = [f"{w.kind}" if w.kind else "", f"{w.codes_off} level(s) off" if w.codes_off is not None else "",
                       f"relative error {w.error:.3g}" if w.error is not None else ""]
            head = f"  {w.status:<12} {w.weight}" + (f" <- {w.source}" if w.source else "")
            lines.append(head + "".join(f"  {f}" for f in figures if f) + (f"  ({w.matched})" if w.matched else ""))
            if w.rule:
                lines.append(f"               {'against' if w.status != 'rtn' else 'exactly'} {w.rule}")
            if w.note:
                lines.append(f"               {w.note}")
        rtn = sum(w.status == "rtn" for w in self.weights)
        for a in self.also:
            which = f"every rtn weight ({rtn})" if len(a["weights"]) == rtn else \
                f"{len(a['weights'])} of the {rtn} rtn weights: {', '.join(a['weights'])}"
            lines.append(f"  {a['rule']} gives the same codes as the rule named for {which}")
        lines += [f"  unused source tensor: {n}" for n in self.unused]
        if self.outputs:
            lines.append(f"  outputs on {self.inputs}:")
            for o in self.outputs:
                task = f"  top-1 {o.top1:.4f}  KL {o.kl:.3g}" if o.top1 is not None else ""
                past = "" if self.within(o) else f"  beyond the tolerance {self.tolerance:g}"
                lines.append(f"    {EngineSetting(o.engine, o.setting)} {o.name}: cosine {o.cosine:.6f}  "
                             f"relative {o.relative:.3g}{task}{past}")
        if self.outputs_note:
            lines.append(f"  outputs: {self.outputs_note}")
        for s in self.settings:
            lines += s.lines()
        if self.blame:
            lines.append(f"  to blame ({self.blame_note}), largest first:")
            lines += [f"    {b.line()}" for b in self.blame]
        elif self.blame_note:
            lines.append(f"  to blame: {self.blame_note}")
        return lines


def _source_of(source):
    """(OnnxSource or CheckpointSource, its name in the report, its kind)."""
    from dyndq.model_files import model_of

    if isinstance(source, onnx.ModelProto):
        return OnnxSource(source), "<model>", "onnx"
    path = os.fspath(source)
    if path.lower().endswith(".onnx"):
        return OnnxSource(model_of(path, "verify")), path, "onnx"
    from dyndq.checkpoints import open_checkpoint

    ckpt = open_checkpoint(path)
    return CheckpointSource(ckpt), path, ckpt.format


def verify(quantized, source, *, inputs=None, samples: int = SAMPLES, seed: int = 0, outputs: bool = True,
           engines=None, levels=None, tolerance: float = TOLERANCE, blame: bool | None = None,
           blame_top: int | None = None) -> VerifyReport:
    """The report of `quantized` (a ModelProto or an ONNX file) against `source` (a float ONNX model
    or file, a .gguf file, a safetensors checkpoint file or folder).  `inputs`: one feed dict or a
    list of them to compare the outputs on (None: `samples` seeded samples, said in the report);
    `outputs=False` compares weights only; `engines` ("reference", "onnxruntime", "openvino"; None:
    the first two) and `levels` (ONNX Runtime's: "off", "basic", "extended", "all"; None: "basic"):
    the engine settings the outputs are compared on (settings.py).  `tolerance`: the relative error
    an output may move by before it is a finding.  `blame`: rank the weights by the output error
    each gives alone (None: only where an output is beyond the tolerance; True: always; False:
    never), the `blame_top` largest kept (None: blame.TOP).  Neither model is modified."""
    from dyndq.model_files import model_of

    asked = settings_asked(engines, levels)  # (an unknown or missing engine refused before any work)

    if isinstance(tolerance, bool) or not (isinstance(tolerance, numbers.Real) and np.isfinite(tolerance)
                                           and tolerance >= 0):
        raise ValueError(f"tolerance {tolerance!r}: a relative error, a finite number >= 0")
    if blame_top is not None and (not isinstance(blame_top, int) or blame_top < 1):
        raise ValueError(f"blame_top {blame_top!r}: a whole number >= 1")
    if blame and not outputs:
        raise ValueError("blame runs the float source on the inputs; outputs=False runs nothing")
    model = model_of(quantized, "verify")
    src, shown, kind = _source_of(source)
    report = VerifyReport(os.fspath(quantized) if isinstance(quantized, (str, os.PathLike)) else "<model>", shown, kind,
                          tolerance=float(tolerance))
    try:
        _judged(report, model, src, kind, inputs, samples, seed, outputs, asked, blame, blame_top)
    finally:
        forget()  # (the decodes' values, held from the weights' verdicts through the blame, let go)
    for w in report.weights:
        w.decoded = None  # (each holds the lifted model: the report outlives it)
    return report


def _judged(report: VerifyReport, model, src, kind: str, inputs, samples: int, seed: int, outputs: bool, asked,
            blame, blame_top) -> None:
    """The report's weights, outputs, settings and blame, filled in."""
    from dyndq.runner import ORT_LEVEL
    from dyndq.verification import blame as B

    report.weights, report.unused = verify_weights(model, src, hold=True)
    if not outputs:
        report.outputs_note = "not compared (weights only)"
    elif kind != "onnx":
        report.outputs_note = f"not compared: the source is a {kind} checkpoint, not a model to run"
    else:
        from dyndq.verification.outputs import compare, samples_for
        from dyndq.verification.settings import unexplained

        feeds, report.inputs = samples_for(src.model, inputs, seed, samples)
        report.outputs, notes, runs = compare(model, src.model, feeds, asked)
        report.settings, more = unexplained(model, runs, feeds)
        report.outputs_note = "; ".join(notes + more)
        if blame or (blame is None and report.beyond):
            # (the float source's outputs as compare ran them, on the engines blame runs: not run again)
            ran = {s.engine: runs[s][0] for s in (REFERENCE, EngineSetting("onnxruntime", ORT_LEVEL)) if s in runs}
            report.blame, report.blame_note = B.blamed(src.model, src.values, report.weights, feeds,
                                                       B.TOP if blame_top is None else blame_top, ran)
    if blame and kind != "onnx":
        report.blame_note = f"not measured: the source is a {kind} checkpoint, not a model to run"


__all__ = ["OutputVerdict", "SettingVerdict", "VerifyReport", "WeightVerdict", "verify"]
