"""`runtime_parity(model)`: does each engine setting compute what the model means?

The model's exact meaning is the reference engine's result (onnx.reference, with our kernel for
our op and the exact lift of ONNX Runtime's contrib ops); where it cannot run the model, ONNX
Runtime's with every graph optimization off.  Each engine setting (ONNX Runtime at each
optimization level, OpenVINO's CPU with its defaults) runs the same inputs and each output is
compared within a tolerance for float sums in another order (`metrics`).  For a setting that
differs the check then finds which rewrite or setting is responsible (`bisect`, with the names
of `ort_rewrites` and `engines.OPENVINO_EXACT`), what it did, and the first node whose output
differs (`divergence`).  A model holding our op is checked through its exports for each engine
(ONNX Runtime: standard ONNX, "onnx", and its own ops, "onnxruntime"; OpenVINO: target
"openvino"), each comparison saying which export it ran.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from dyndq.converters.engines import ENGINES as TABLE, compared
from dyndq.runner import session_module
from dyndq.opdefs import ValidationError
from dyndq.parity import bisect, divergence, ort_rewrites
from dyndq.parity import engines as engine_runs
from dyndq.parity.engines import ORT_LEVELS, Setting, Tweak
from dyndq.parity.feeds import ExamplesDoNotFit, example_feeds
from dyndq.parity.metrics import compare
from dyndq.parity.report import Cause, Comparison, ParityReport
from dyndq.plumbing.types import open_dim
from dyndq.engine_failures import explained, lacking
from dyndq.task_metrics import output_kind
from dyndq.wording import engine_error, first_line

# the engines compared: the engine table's runners that load its targets' files ("onnxruntime",
# "openvino"), each on the exports it loads (the table's `loads_on`)
ENGINES = tuple(compared())


class EngineMissing(ValueError):
    """An engine asked for is not installed."""


def runtime_parity(model: onnx.ModelProto | str | os.PathLike, *, engines: Sequence[str] = ("onnxruntime",),
                   levels: Sequence[str] | None = None, feeds: Mapping[str, np.ndarray] | None = None, seed: int = 0,
                   diagnose: bool = True, progress: Callable[[str], None] | None = None,
                   label: str | None = None) -> ParityReport:
    """Compare each setting of `engines` (of ENGINES: "onnxruntime", "openvino") with the model's meaning
    (see the module doc): ONNX Runtime at each of `levels`, any other engine at its defaults.

    `levels`: ONNX Runtime's levels compared (default: every one, "off" included); `feeds`: inputs
    given (the others get example values, `example_feeds`), each checked against the graph's inputs and
    fed as `dyndq.run` feeds it (a feed that does not fit raises `dyndq.runner.FeedError` naming it);
    `diagnose=False`: no search for causes and first nodes; `progress(text)` is told each step."""
    from dyndq.model_files import model_of
    from dyndq.opdefs import domains
    from dyndq.runner import fitting_feeds, graph_inputs

    started = time.perf_counter()
    say = progress or (lambda text: None)
    for engine in engines:
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    for engine in engines:
        if not session_module(engine).installed():
            raise EngineMissing(f"{TABLE[engine].title} is not installed ({session_module(engine).INSTALL})")
    levels = tuple(ORT_LEVELS if levels is None else levels)
    for level in levels:
        if level not in ORT_LEVELS:
            raise ValueError(f"unknown level {level!r}; choose one of: {', '.join(ORT_LEVELS)}")
    model = model_of(model, "runtime_parity")
    given = dict(feeds or {})
    examples = example_feeds(model, seed, skip=given)
    inputs = graph_inputs(model)
    fed = fitting_feeds(inputs, {**examples, **given})
    # the made-up inputs whose sizes were guessed (a dim the model leaves open): where the engine
    # fails, those may be why, and the user is asked for inputs; with none guessed the failure is
    # the engine's own, told as such
    guessed = [name for name, spec, _ in inputs if name in examples
               and (spec is None or spec.shape is None or any(open_dim(d) for d in spec.shape))]

    ours = any(o.domain in domains() for o in model.opset_import)
    runs = _runs(model, ours, engines)
    say("reference: running")
    t0 = time.perf_counter()
    reference, what, stand_in = _meaning(model, ours, fed, runs, guessed)
    reference_seconds = time.perf_counter() - t0
    if stand_in and len(runs["onnxruntime"]) == 1:  # (ONNX Runtime off is the meaning: not compared with itself)
        levels = tuple(level for level in levels if level != "off")

    report = ParityReport(label or model.graph.name or "model", what)
    for engine in dict.fromkeys(("onnxruntime", *engines)):  # (ONNX Runtime's always: it may stand in for the meaning)
        report.versions[engine] = session_module(engine).version()
    for vi in model.graph.input:
        if vi.name in fed:
            value = np.asarray(fed[vi.name])
            report.inputs.append({"name": vi.name, "dtype": value.dtype.name, "shape": list(value.shape),
                                  "given": vi.name in given})

    # ONNX Runtime at each level; every other engine at its defaults
    settings = [Setting("onnxruntime", level, target) for target in runs["onnxruntime"] for level in levels]
    if "onnxruntime" not in engines:
        settings = []
    settings += [Setting(engine, "default", target) for engine in engines if engine != "onnxruntime"
                 for target in runs.get(engine, {})]
    # (judged on the model and on the meaning's values: logits, a distribution, or neither)
    kinds = {o.name: output_kind(model, o.name, [reference[o.name]]) for o in model.graph.output if o.name in reference}
    sessions = diagnosis = 0
    for k, setting in enumerate(settings, 1):
        say(f"[{k}/{len(settings)}] {setting}: running")
        checker = _Checker(setting, runs[setting.engine][setting.export], fed, reference, kinds)
        comparison = Comparison(setting)
        t0 = time.perf_counter()
        try:
            comparison.outputs = checker.compare(Tweak())
        except Exception as e:  # (the engine cannot load or run it: said, and counted as differing)
            # (an op it has no kernel for is no fault of the inputs made up)
            if guessed and setting.engine == "onnxruntime" and setting.name == "off" and lacking(e) is None:
                raise ExamplesDoNotFit(guessed) from e
            comparison.error = explained(e, checker.model)
        comparison.seconds = time.perf_counter() - t0
        sessions += 1
        if not comparison.agrees and comparison.error is None and diagnose:
            say(f"[{k}/{len(settings)}] {setting}: differs; looking for the cause")
            try:
                _diagnose(checker, comparison, say)
            except Exception as e:  # (a session the search made failed: the comparison stands, the search is said)
                comparison.notes.append(f"the search for the cause stopped: {engine_error(e)}")
            diagnosis += checker.runs - 1
        report.comparisons.append(comparison)
    report.cost = {"seconds": round(time.perf_counter() - started, 4),
                   "compared_sessions_seconds": round(reference_seconds + sum(c.seconds for c in report.comparisons), 4),
                   "compared_sessions": sessions + 1, "diagnosis_sessions": diagnosis}
    return report


def _runs(model: onnx.ModelProto, ours: bool, engines: Sequence[str]) -> dict[str, dict[str | None, onnx.ModelProto]]:
    """engine -> {export target (None: the model as given) -> the model that engine runs}."""
    if not ours:
        return {engine: {None: model} for engine in ENGINES}
    from dyndq.exporter import export  # (it checks the model first: a ValidationError names every problem)

    # each engine's exports: "onnx", standard ONNX only, in the forms the engine runs (target "onnx" but
    # for the types ONNX Runtime has no kernel for, float4 codes say); its own target, its own ops
    # (MatMulNBits, ...) where they express a node exactly.  (ONNX Runtime's always: with optimizations
    # off it stands in for the reference engine where that cannot run the model.)
    return {engine: {target: export(model, target=engine, own_ops=target == engine) for target in targets}
            for engine, targets in compared().items() if engine in engines or engine == "onnxruntime"}


def _meaning(model, ours, fed, runs, guessed) -> tuple[dict, str, bool]:
    """Every value of the main graph as the model means it, what computed them, and whether ONNX Runtime
    with optimizations off stood in for the reference engine."""
    import onnxruntime as ort

    from dyndq.reference import NotRunnable
    from dyndq.reference_ops import untrusted_nodes, untrusted_text

    untrusted = untrusted_nodes(model)
    if untrusted:  # (an op whose reference result is not the meaning: ONNX Runtime with optimizations off stands in)
        why = f"is not trusted for {untrusted_text(untrusted)}"
    else:
        try:
            values = engine_runs.run_reference(model, fed)
            return values, "the reference engine (onnx.reference" + (", our kernel for our op)" if ours else ")"), False
        except Exception as e:  # (onnx.reference lacks an op, or fails: ONNX Runtime with optimizations off stands in)
            if isinstance(e, ValidationError) and not isinstance(e, NotRunnable):
                # our kernel names a problem in the values it was given: never compared past
                if guessed:
                    raise ExamplesDoNotFit(guessed) from e
                raise
            missing = lacking(e)
            why = f"cannot run it: {missing.what() if missing is not None else first_line(e)}"
    try:
        values = _ort_off_everything(next(iter(runs["onnxruntime"].values())), fed)
    except Exception as e:
        if guessed and lacking(e) is None:  # (an op it has no kernel for is no fault of the inputs made up)
            raise ExamplesDoNotFit(guessed) from e
        raise
    return values, f"ONNX Runtime {ort.__version__} with graph optimizations off (the reference engine {why})", True


class _Checker:
    """One engine setting on one model: runs it with a tweak, compares with the reference."""

    def __init__(self, setting: Setting, model: onnx.ModelProto, feeds, reference, kinds):
        self.setting, self.model, self.feeds, self.reference, self.kinds = setting, model, feeds, reference, kinds
        self.names = [o.name for o in model.graph.output]
        self.runs = 0

    def run(self, tweak: Tweak, names: Sequence[str] | None = None, extra: list | None = None) -> dict:
        self.runs += 1
        model = ort_rewrites.at_accuracy_0(self.model, tweak.accuracy_0) if tweak.accuracy_0 else self.model
        model = model if names is None else engine_runs.exposed(model, names)
        asked = self.names if names is None else [o.name for o in model.graph.output]
        if self.setting.engine == "onnxruntime":
            return engine_runs.run_onnxruntime(model, self.setting.name, self.feeds, asked, tweak, extra)
        return engine_runs.run_engine(self.setting.engine, model, self.feeds, asked, tweak, extra)

    def compare(self, tweak: Tweak) -> list:
        values = self.run(tweak)
        return [compare(n, values[n], self.reference[n], self.kinds.get(n)) for n in self.names if n in self.reference]

    def agrees(self, tweak: Tweak) -> bool:
        return all(p.agrees for p in self.compare(tweak))


def _diagnose(checker: _Checker, comparison: Comparison, say) -> None:
    setting = checker.setting
    optimized = None
    if setting.engine == "onnxruntime":
        graphs: list = []
        checker.run(Tweak(), extra=graphs)
        optimized = graphs[0]
        if setting.name != "off":
            _ort_causes(checker, comparison, optimized, say)
        if not comparison.causes:  # (not a rewrite: the model's own accuracy_level, which every level runs)
            _accuracy_causes(checker, comparison, say)
        candidates = divergence.surviving(checker.model, optimized)
    else:
        settings = engine_runs.arithmetic_settings(setting.engine)
        if settings:
            _setting_causes(checker, comparison, settings, say)
        candidates = divergence.node_outputs(checker.model)
    say(f"{setting}: looking for the first node that differs")
    try:
        found, why = divergence.first_divergence(checker.model, lambda names: checker.run(Tweak(), names),
                                                 checker.reference, candidates, optimized)
    except Exception as e:  # (the engine refuses the model with values exposed)
        found, why = None, f"the engine cannot run the model with its values exposed: {first_line(e)}"
    comparison.first_divergence = found
    if why:
        comparison.notes.append(why)


def _ort_causes(checker: _Checker, comparison: Comparison, optimized: onnx.ModelProto, say) -> None:
    names = ort_rewrites.transformers(checker.setting.name)
    say(f"{checker.setting}: bisecting {len(names)} transformers")
    found, runs = bisect.culprits(names, lambda off: checker.agrees(Tweak(disabled=ort_rewrites.disabled_names(off))))
    comparison.bisection = {"sessions": runs, "over": len(names)}
    if found is None:
        comparison.notes.append("with every transformer known disabled it still differs: the cause is not a "
                                "graph rewrite (or one of a name this ONNX Runtime does not know)")
        return
    graphs: list = []  # (the graph with every culprit disabled: one session for them all)
    checker.run(Tweak(disabled=ort_rewrites.disabled_names(found)), extra=graphs)
    for name in found:
        if len(found) > 1:
            with_it: list = []
            checker.run(Tweak(disabled=ort_rewrites.disabled_names([f for f in found if f != name])), extra=with_it)
            after = with_it[0]
        else:
            after = optimized
        what = ort_rewrites.changes(graphs[0], after)
        known = ort_rewrites.KNOWN.get(name)
        if known is not None:
            text, (key, value) = known
            fixed = checker.agrees(Tweak(config={key: value}))
            what = (f"{text}: {what}; with session option {key}={value} it "
                    f"{'agrees' if fixed else 'still differs'} (measured)")
        comparison.causes.append(Cause("transformer", name, what))


def _accuracy_causes(checker: _Checker, comparison: Comparison, say) -> None:
    """Which MatMulNBits nodes' own accuracy_level (`ort_rewrites.accuracy_levels`) make it differ, by halves."""
    levels = ort_rewrites.accuracy_levels(checker.model)
    if not levels:
        return
    names = list(levels)
    say(f"{checker.setting}: bisecting {len(names)} MatMulNBits nodes' accuracy_level")
    found, runs = bisect.culprits(names, lambda off: checker.agrees(Tweak(accuracy_0=tuple(off))))
    if found is None:
        comparison.notes.append(f"with accuracy_level 0 on each of the {len(names)} MatMulNBits nodes that set one it "
                                "still differs: the cause is not their accuracy level")
        return
    together = " with the others named" if len(found) > 1 else ""
    for name in found:
        comparison.causes.append(Cause("accuracy_level", name, (
            f"com.microsoft::MatMulNBits {name!r} holds accuracy_level {levels[name]} (its attribute"
            f"{'; 4 quantizes its input A to int8' if levels[name] == 4 else ''}); with accuracy_level 0 there"
            f"{together} it agrees (measured; found in {runs} session(s) among the {len(names)} node(s) that set one)")))


def _setting_causes(checker: _Checker, comparison: Comparison, exact: dict, say) -> None:
    """Which of the engine's settings that change the arithmetic (`exact`: each with its exact value,
    OpenVINO's ARITHMETIC) make it differ, by halves."""
    names = list(exact)
    say(f"{checker.setting}: bisecting {len(names)} settings")
    found, runs = bisect.culprits(names, lambda off: checker.agrees(Tweak(config={k: exact[k] for k in off})))
    comparison.bisection = {"sessions": runs, "over": len(names)}
    if found is None:
        comparison.notes.append(f"with {', '.join(f'{k}={v}' for k, v in exact.items())} it still "
                                "differs: the cause is none of these settings")
        return
    defaults: list = []
    checker.run(Tweak(), extra=defaults)
    for name in found:
        others = [f for f in found if f != name]
        if not others:
            alone = f"; with {name}={exact[name]} it agrees (measured)"
        elif checker.agrees(Tweak(config={k: exact[k] for k in others})):
            alone = "; it moves the result only together with the others (measured)"
        else:
            alone = "; it moves the result on its own, the others set exact (measured)"
        comparison.causes.append(Cause("setting", name, f"{defaults[0][name]} by default on this CPU "
                                                        f"({name}={exact[name]} turns it off){alone}"))


def _ort_off_everything(model: onnx.ModelProto, feeds) -> dict:
    """Every value of the main graph on ONNX Runtime with optimizations off (the reference's stand-in)."""
    names = divergence.node_outputs(model)
    try:
        exposed = engine_runs.exposed(model, names)
    except Exception:  # (values ONNX cannot type: the graph's outputs only)
        exposed = model
    asked = [o.name for o in exposed.graph.output]
    return engine_runs.run_onnxruntime(exposed, "off", feeds, asked)
