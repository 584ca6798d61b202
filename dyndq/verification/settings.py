"""Engine settings: both models run on each setting asked, and a difference the weights do not explain
pinned on the setting.

The settings: the reference engine (our kernel: always, the yardstick), ONNX Runtime at each level
asked (`--level`: "off", "basic", "extended", "all"; "basic" by default) and OpenVINO's CPU at its
defaults (`--engine openvino`, where it is installed), each run by `outputs.runner`.

The rule (docs/verify.md): on each setting but the reference, the quantized model's outputs are
compared with the reference engine's outputs of the same quantized model, and the float model's
likewise: d = max |a - b| / max |b| over the samples, per output (parity's measure).  The same
weights run on both sides, so the weights cannot explain a difference there; the float model's d
is what the engine's own arithmetic moves at that setting.  A setting is a finding when the
quantized model's d exceeds the allowance max(parity's TOLERANCE, SLACK x the float model's d, the
output type's epsilon: one unit in the last place of a float16 or bfloat16 output).
Parity's own search (`dyndq.runtime_parity` on the model that setting ran, with the sample where d
was largest) then names the cause (an ONNX Runtime transformer, a MatMulNBits node's accuracy_level,
an OpenVINO setting) and the first node whose output differs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from dyndq.parity import EngineMissing
from dyndq.parity.engines import ORT_LEVELS
from dyndq.parity.metrics import TOLERANCE
from dyndq.runner import SESSIONS

ENGINES = tuple(SESSIONS)  # ("reference", "onnxruntime", "openvino"): dyndq's one runner of each
LEVELS = ORT_LEVELS  # ("off", "basic", "extended", "all"): as `dyndq check --runtime-parity --level` names them
DEFAULT_ENGINES = ("reference", "onnxruntime")
DEFAULT_LEVELS = ("basic",)  # (what `dyndq.run` runs)
# The float model's own difference at a setting, doubled: room for the quantized model's other sums
# (a MatMulNBits' blocks summed in its own order) without hiding an int8 or bfloat16 computation,
# which moves a result by 1e-3 and more where float32 reordering moves it by 1e-6.
SLACK = 2.0


class SettingRefused(ValueError):
    """An engine or level asked for that verify does not compare on (the CLI's usage error)."""


class NotInstalled(EngineMissing, SettingRefused):
    """An engine asked for that is not installed."""


@dataclass(frozen=True)
class EngineSetting:
    engine: str  # "reference" | "onnxruntime" | "openvino"
    setting: str  # "our kernel" | an ONNX Runtime level | "defaults"

    def __str__(self) -> str:
        if self.engine == "onnxruntime":
            return f"onnxruntime ({'optimizations off' if self.setting == 'off' else self.setting + ' optimizations'})"
        return f"{self.engine} ({'CPU defaults' if self.engine == 'openvino' else self.setting})"


REFERENCE = EngineSetting("reference", "our kernel")


def settings_asked(engines=None, levels=None) -> list[EngineSetting]:
    """The settings compared: the reference engine first, then each engine of `engines` (of ENGINES;
    None: DEFAULT_ENGINES), ONNX Runtime at each of `levels` (of LEVELS; None: DEFAULT_LEVELS).
    SettingRefused (a ValueError) names an unknown engine or level, or levels without ONNX Runtime;
    an engine not installed is `dyndq.parity.EngineMissing` and SettingRefused both."""
    from dyndq.converters.engines import ENGINES as TABLE
    from dyndq.runner import session_module

    engines = tuple(dict.fromkeys(DEFAULT_ENGINES if engines is None else engines))
    for engine in engines:
        if engine not in ENGINES:
            raise SettingRefused(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    if levels is not None:
        for level in levels:
            if level not in LEVELS:
                raise SettingRefused(f"unknown level {level!r}; choose one of: {', '.join(LEVELS)}")
        if "onnxruntime" not in engines:
            raise SettingRefused("a level is ONNX Runtime's: ask for the engine onnxruntime with it")
    for engine in engines:
        if engine != "reference" and not session_module(engine).installed():
            raise NotInstalled(f"{TABLE[engine].title} is not installed ({session_module(engine).INSTALL})")
    out = [REFERENCE]
    for engine in engines:
        if engine == "onnxruntime":
            out += [EngineSetting(engine, level) for level in dict.fromkeys(levels or DEFAULT_LEVELS)]
        elif engine == "openvino":
            out.append(EngineSetting(engine, "defaults"))
    return out


@dataclass
class SettingVerdict:
    """A setting whose outputs of the quantized model moved from the reference engine's more than the
    float model's did (the rule above), with what parity's search found."""

    engine: str
    setting: str
    output: str
    difference: float  # the quantized model's max |a - b| / max |b|, engine against the reference engine
    float_difference: float  # the float model's, likewise
    allowance: float  # max(TOLERANCE, SLACK * float_difference, the output type's epsilon)
    culprits: list = field(default_factory=list)  # parity's Causes
    node: object = None  # parity's FirstDivergence, or None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"engine": self.engine, "setting": self.setting,
                "culprits": [c.as_dict() for c in self.culprits],
                "node": self.node.as_dict() if self.node is not None else None,
                "figures": {"output": self.output, "difference": self.difference,
                            "float_difference": self.float_difference, "allowance": self.allowance},
                "notes": list(self.notes)}

    def lines(self) -> list[str]:
        shown = EngineSetting(self.engine, self.setting)
        out = [f"  setting      {shown}: {self.output} moved {self.difference:.3g} of max |b| from the reference "
               f"engine's on the quantized model; the float model's {self.float_difference:.3g} (allowance "
               f"{self.allowance:.3g})"]
        out += [f"               culprit: {c.kind} {c.name}: {c.what}" for c in self.culprits]
        if not self.culprits:
            out.append("               culprit: none named by parity's search (see its notes)")
        if self.node is not None:
            out.append(f"               {self.node}")
        out += [f"               note: {n}" for n in self.notes]
        return out


def differences(runs: list[dict], reference: list[dict]) -> dict[str, tuple[float, int]]:
    """Per float output: (the largest max |a - b| / max |b| over the samples, the sample where it is)."""
    from dyndq.parity.metrics import compare
    from dyndq.verification.outputs import floating

    out = {}
    for name in reference[0]:
        if not all(floating(np.asarray(r[name])) for r in reference) or name not in runs[0]:
            continue
        each = [compare(name, np.asarray(a[name]), np.asarray(b[name])).relative for a, b in zip(runs, reference)]
        worst = int(np.argmax(each))
        out[name] = (float(each[worst]), worst)
    return out


def unexplained(quantized: onnx.ModelProto, runs: dict, feeds: list[dict]) -> tuple[list[SettingVerdict], list[str]]:
    """The settings the rule finds (each diagnosed by parity's search), and a note per setting not judged.
    `runs`: {EngineSetting: (the float model's runs, the quantized model's runs)}, the reference among them."""
    if REFERENCE not in runs:
        return [], ["engine settings: not judged: the reference engine did not run both models"] if len(runs) else []
    float_ref, quantized_ref = runs[REFERENCE]
    found = []
    for setting, (floats, ours) in runs.items():
        if setting == REFERENCE:
            continue
        ours_d, floats_d = differences(ours, quantized_ref), differences(floats, float_ref)
        worst = None
        for name, (d, sample) in ours_d.items():
            f = floats_d.get(name, (0.0, 0))[0]
            allowance = max(TOLERANCE, SLACK * f, _ulp(quantized_ref[sample][name]))
            if d > allowance and (worst is None or d / allowance > worst[0]):
                worst = (d / allowance, SettingVerdict(setting.engine, setting.setting, name, d, f, allowance), sample)
        if worst is not None:
            verdict, sample = worst[1], worst[2]
            _diagnose(quantized, setting, feeds[sample], verdict)
            found.append(verdict)
    return found, []


def _ulp(output) -> float:
    """One unit in the last place of an output's largest value, relative to it: its type's epsilon
    (float16 9.8e-4, bfloat16 7.8e-3).  A float16 output cannot be compared closer than that: two
    kernels summing in float32 in another order round apart by one unit (ONNX Runtime's float16
    MatMulNBits against our kernel: 6.2e-4 where the float16 MatMul agrees exactly)."""
    import ml_dtypes

    try:
        return float(ml_dtypes.finfo(np.asarray(output).dtype).eps)
    except (TypeError, ValueError):  # (not a float type: held to the others)
        return 0.0


def _diagnose(quantized: onnx.ModelProto, setting: EngineSetting, feed: dict, verdict: SettingVerdict) -> None:
    """Parity's search (its bisections and its first node), on the model the setting ran and the sample named."""
    from dyndq.parity import runtime_parity
    from dyndq.verification.outputs import engine_model
    from dyndq.wording import first_line

    levels = [setting.setting] if setting.engine == "onnxruntime" else None
    try:
        report = runtime_parity(engine_model(quantized, setting.engine), engines=[setting.engine], levels=levels,
                                feeds=feed)
    except Exception as e:  # (parity cannot run it: the finding stands, the search is said)
        verdict.notes.append(f"parity's search could not run: {first_line(e)}")
        return
    comparison, = report.comparisons
    verdict.culprits, verdict.node = list(comparison.causes), comparison.first_divergence
    verdict.notes += comparison.notes
    if comparison.agrees:
        verdict.notes.append("on the sample where it moved most, parity finds the setting agreeing with "
                             f"{report.reference}")
