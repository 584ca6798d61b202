"""The output error of a quantized model: both models run on the same inputs, the user's or seeded samples.

The inputs are the user's (`inputs`: one feed dict or a list of them, each a sample; checked
against the graph's inputs before anything is quantized, a feed that does not fit raising
`FeedError` naming it), or `samples` seeded samples, drawn as `dyndq.example_inputs` draws
them for `check --runtime-parity` too (floats from N(0, 1), booleans at random, integers that
reach a Gather's indices across the rows of the table they index, other integers in 0..3, a
dimension without a fixed size 4 long), the first sample holding each index input's first and
last row (token ids across every embedding's vocabulary).

Per float output: the relative error, the largest difference and the cosine over every sample;
for an output whose last axis is a distribution (a Softmax's, or non-negative rows summing to 1),
a log-distribution (a LogSoftmax's) or logits (named "...logits...", or made by MatMul, Gemm or
Add and as long on its last axis as an embedding has rows, a language model's head), as
`dyndq.task_metrics.output_kind` judges it on the float model's outputs (as `check
--runtime-parity` does), also what a task sees: how often the top-1 answer along that axis stays
the same, and the mean KL divergence KL(float || quantized) of the distributions (of
softmax(logits) for logits), in nats.

Both models run on ONNX Runtime as `dyndq.run`'s Runner runs them (the quantized one exported
to standard ONNX first; its basic graph optimizations only, so the dequantized weights are the
graph's exactly), one after the other: the float model's session is dropped before the
quantized one's is made.  The memory this takes is held to about the float model's weights
once beside what the caller holds (`OnOrt`): the float model's big weights are fed as arrays
held once (read from its external data file when it has one, never the whole model loaded),
ONNX Runtime's arena is off (a dequantized weight's memory goes back after its MatMul), and
the quantized model's outputs are compared a sample at a time, as they come, against the
float model's, the only outputs kept.
"""
from __future__ import annotations

import time

import numpy as np
import onnx

from dyndq.example_inputs import example_feeds, index_bounds
from dyndq.runner import ORT_LEVEL, Runner
from dyndq.task_metrics import output_kind, row_sums
from dyndq.quantization.numerics import ErrorStats
from dyndq.quantization.report import OutputDifference
from dyndq.wording import first_line, plural

ENGINE = "onnxruntime"
SAMPLES = 4  # seeded samples by default: the evaluation's cost is this many runs of each model


def checked_samples(samples) -> int:
    """`samples` as a whole number >= 1, or OptionError."""
    import numbers

    from dyndq.opdefs import Problem
    from dyndq.quantization.options import OptionError

    if isinstance(samples, bool) or not isinstance(samples, numbers.Integral) or samples < 1:
        raise OptionError([Problem("samples", repr(samples), "a whole number >= 1")])
    return int(samples)


def user_inputs(model: onnx.ModelProto, inputs) -> list[dict] | None:
    """`inputs` (None, one feed dict or a list of them) as a list of feed dicts fitting the
    graph's inputs; FeedError naming each feed that does not fit (and in which sample)."""
    from dyndq.opdefs import Problem
    from dyndq.runner import FeedError, check_feeds, graph_inputs
    from dyndq.opdefs import ValidationError

    if inputs is None:
        return None
    samples = [inputs] if isinstance(inputs, dict) else list(inputs)
    if not samples:
        raise FeedError([Problem("inputs", "an empty list", "one feed dict or a list of them (None: seeded samples)")])
    declared = graph_inputs(model)
    checked = []
    for i, feeds in enumerate(samples):
        try:
            checked.append(check_feeds(declared, feeds))
        except ValidationError as e:
            where = f" (sample {i + 1} of {len(samples)})" if len(samples) > 1 else ""
            raise FeedError([Problem(f"{p.argument}{where}", p.found, p.allowed) for p in e.problems]) from None
        except TypeError as e:
            raise FeedError([Problem(f"inputs[{i}]", first_line(e), "a dict of input name to array")]) from None
    return checked


def seeded_samples(model: onnx.ModelProto, seed: int, samples: int = SAMPLES) -> list[dict]:
    """`samples` seeded feed dicts covering each input's valid range (`dyndq.example_inputs`),
    the first holding each index input's first and last row."""
    bounds = index_bounds(model)
    return [example_feeds(model, np.random.default_rng([seed, i]), cover_ends=i == 0, bounds=bounds)
            for i in range(samples)]


def describe_samples(samples: list[dict], given: bool, seed: int, tables: bool = False) -> str:
    """Which inputs the evaluation used, in a few words."""
    shapes = ", ".join(f"{name} {v.dtype.name}{list(v.shape)}" for name, v in samples[0].items() if hasattr(v, "shape"))
    ids = "; token ids across each embedding's rows" if tables else ""
    source = f"{plural(len(samples), 'sample')} given" if given else f"{plural(len(samples), 'seeded sample')} (seed {seed}{ids})"
    return f"{source}: {shapes}" if shapes else source


class NotMeasured(Exception):
    """The float model could not be run on the evaluation's inputs (the engine refused the model
    or a feed: an index out of range, say); the message says why, as "not measured: ..."."""


class Unloadable(Exception):
    """The quantized file as written does not make a session on its engine (`Evaluation.measure`
    with `as_written`): not a figure to report but a file that fails its check (dyndq.written)."""


class OnOrt(Runner):
    """One model on ONNX Runtime for the evaluation: `dyndq.run`'s Runner (its feeds and outputs
    checked alike), on a session made more frugally.  A model of standard ops only (the float
    model, as a rule) has its big initializers fed as arrays, each read once (from `loaded`'s
    external data when given: `model` is then `loaded.model`, its data on disk), and only its light
    view (no weights in it) exported and serialized for ONNX Runtime; any other model (ours, or with
    contrib ops or functions, whose export may read its constants) is exported whole, as the
    Runner does, unless `as_written` (its path): a file written for ONNX Runtime (quantize's --emit
    onnx and onnxruntime) runs as it is, its MatMulNBits and all, never rewritten.  ONNX Runtime's arena
    is off either way.  `how` says which of these ran, for the report.

    `outputs`: {value name: its dtype name} of the main graph to give instead of the graph's outputs
    (the calibration's layer inputs, activations.py), exposed on a copy made for the run (the model
    passed in is never changed): as `dyndq.run(..., outputs=)` asks for values (run_outputs.with_outputs),
    each typed as the model declares it, else as ONNX infers it, else by the dtype given with an
    open shape (ONNX Runtime needs a type; a model over 2 GiB is not inferred).

    `weights`: {name: array} of big initializers already at hand (the calibration's, mapped from a
    file: activations.MappedWeights), fed as they are instead of read."""

    def __init__(self, model: onnx.ModelProto, loaded=None, as_written: str | None = None, outputs=None, weights=None):
        from dyndq.ort_session import OrtSession
        from dyndq.run_outputs import exported_for_onnxruntime

        self.how = ENGINE  # (our op exported exactly, as dyndq run --engine onnxruntime runs it)
        if as_written is not None and outputs is not None:
            raise TypeError("OnOrt: outputs are exposed on the float model, not on a file as written")
        if as_written is not None:  # (the file's path; `model` read from it, its external data left there)
            self.how = f"{ENGINE}, the file as written"
            super().__init__(model, ENGINE, session=OrtSession(model, level=ORT_LEVEL, arena=False, path=as_written))
            self.ops = sorted({n.op_type for n in model.graph.node})
            return
        if not _standard(model):
            if loaded is not None:  # (exported whole: its data loaded)
                from dyndq.model_files import load_model

                model = load_model(loaded.path)
            if outputs is not None:
                model = _exposing(model, outputs)
            super().__init__(model, ENGINE, arena=False)
            self.ops = sorted({n.op_type for n in self.exported.graph.node})  # (what ran, for the report and its tests)
            del self.exported  # (the session holds what it runs: the whole export is not kept beside it)
            return
        light, weights = _weights_apart(model, loaded, weights)
        face = model  # (what the Runner checks feeds and outputs against: the model's own inputs, its weights fed apart)
        if outputs is not None:
            light = _exposing(light, outputs)
            face = _face(model, light.graph.output)
        exported = exported_for_onnxruntime(light)
        super().__init__(face, ENGINE, session=OrtSession(exported, level=ORT_LEVEL, weights=weights, arena=False))
        self.ops = sorted({n.op_type for n in exported.graph.node})


def _exposing(model: onnx.ModelProto, outputs) -> onnx.ModelProto:
    """A copy of `model` whose graph outputs are `outputs` ({name: dtype name}), as OnOrt says."""
    from dyndq.plumbing.types import elem_type
    from dyndq.run_outputs import with_outputs

    copy = with_outputs(model, list(outputs))  # (names checked: each a value of the main graph)
    for vi in copy.graph.output:
        if not vi.type.tensor_type.elem_type and outputs[vi.name] is not None:
            vi.CopyFrom(onnx.helper.make_tensor_value_info(vi.name, elem_type(outputs[vi.name]), None))
    return copy


def _face(model: onnx.ModelProto, outputs) -> onnx.ModelProto:
    """The model's inputs and these outputs, no node and no data: what a Runner checks feeds and
    outputs against (its initializers named, for the inputs that are initializers below IR 4)."""
    face = onnx.ModelProto()
    face.graph.input.extend(model.graph.input)
    face.graph.output.extend(outputs)
    face.graph.initializer.extend(onnx.TensorProto(name=t.name) for t in model.graph.initializer)
    return face


def _quantized_runner(model: onnx.ModelProto, as_written: str | None):
    """OnOrt for the quantized model; for a file of standard ONNX that ONNX Runtime has no kernel
    for (float4 codes, an opset newer than it runs), the file as written on onnx.reference."""
    from dyndq.ort_session import missing_kernel

    try:
        return OnOrt(model, as_written=as_written)
    except Exception as e:
        lacking = missing_kernel(e) if as_written is not None else None
        if lacking is None:
            raise
        return OnReference(as_written, f"onnx.reference, the file as written (ONNX Runtime has no kernel for {lacking})")


class OnReference(Runner):
    """The file at `path` on the reference engine (`dyndq.run`'s Runner), with `how` for the report."""

    def __init__(self, path: str, how: str):
        from dyndq.model_files import load_model

        super().__init__(load_model(path), "reference")
        self.how, self.ops = how, sorted({n.op_type for n in self.model.graph.node})


def _standard(model: onnx.ModelProto) -> bool:
    """No node outside ai.onnx, no function, no nested graph: nothing the export would rewrite."""
    return not model.functions and all(
        n.domain in ("", "ai.onnx") and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                 for a in n.attribute) for n in model.graph.node)


def _weights_apart(model: onnx.ModelProto, loaded=None, given=None) -> tuple[onnx.ModelProto, dict]:
    """(the model without its big initializers' data, each a graph input instead, as `light_view`
    makes them; {name: array} of them, each read once, or taken from `given`); a small tensor with
    external data is read into the model."""
    from dyndq.model_files import tensor_array, tensor_with_data
    from dyndq.plumbing.light import BIG, copy_fields, nbytes

    light = onnx.ModelProto()
    copy_fields(model, light, skip={"graph"})
    copy_fields(model.graph, light.graph, skip={"initializer"})
    inputs = {vi.name for vi in model.graph.input}
    weights = {}
    for t in model.graph.initializer:
        if nbytes(t) <= BIG:
            light.graph.initializer.append(t if loaded is None else tensor_with_data(t, loaded))
            continue
        if given is not None and t.name in given:
            weights[t.name] = given[t.name]
        else:
            weights[t.name] = onnx.numpy_helper.to_array(t) if loaded is None else tensor_array(t, loaded)
        if t.name not in inputs:  # (IR < 4 lists initializers among the inputs already)
            light.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return light, weights


class Evaluation:
    """The float model run once on the evaluation's inputs (its session dropped when done), to
    measure any number of quantized models of it against (`measure`).  `loaded`: the float
    model as `model_files.read_model(..., load_data=False)` read it (`float_model` its model), its
    weights read from its external data for the run, never the whole model loaded."""

    def __init__(self, float_model: onnx.ModelProto, *, seed: int = 0, inputs=None, samples: int = SAMPLES,
                 progress=None, loaded=None):
        started = time.perf_counter()
        self.model, self.seed, self.progress, self.given = float_model, seed, progress, inputs is not None
        try:
            self.feeds = inputs if self.given else seeded_samples(float_model, seed, samples)
            run = OnOrt(float_model, loaded)  # (not runner(): its cache would keep the sessions, weights and all)
            self.want = [_progress(run, f, "float", i, len(self.feeds), progress) for i, f in enumerate(self.feeds)]
            del run
        except Exception as e:  # noqa: BLE001 - a model the engine cannot run, inputs it refuses: said
            raise NotMeasured(f"not measured: {first_line(e)}") from e
        # what is measured depends on the float model alone: found once, for every measure()
        names = [name for name, w0 in self.want[0].items()
                 if isinstance(w0, np.ndarray) and (w0.dtype.kind == "f" or w0.dtype.name == "bfloat16")]
        # (an output empty in every sample has no error to measure: 0 of 0 rows agree)
        self.empty = [name for name in names if all(w[name].size == 0 for w in self.want)]
        # (an error against infinity or NaN means nothing)
        self.unbounded = [name for name in names if name not in self.empty
                          and not all(np.isfinite(w[name]).all() for w in self.want)]
        self.names = [name for name in names if name not in self.unbounded and name not in self.empty]
        self.kinds = {name: output_kind(float_model, name, [w[name] for w in self.want]) for name in self.names}
        self.described = describe_samples(self.feeds, self.given, seed, bool(index_bounds(float_model)))
        self.seconds = time.perf_counter() - started

    def inputs_used(self) -> dict:
        """Which inputs, for tools: their source, seed (seeded ones), and each sample's arrays as dtype[shape]."""
        return {"source": "given" if self.given else "seeded", "seed": None if self.given else self.seed,
                "samples": [{name: f"{v.dtype.name}{list(v.shape)}" for name, v in f.items() if hasattr(v, "shape")}
                            for f in self.feeds]}

    def measure(self, quantized, *, as_written: str | None = None) -> tuple[list[OutputDifference], str]:
        """(per output differences, how they were measured: which inputs, on what, how long) or
        ([], why they were not).  `quantized`: a model (run as OnOrt runs it: exported, or the
        file at `as_written` as it is), or a callable taking the float model's feeds and giving its outputs by the
        float model's names, with a `how` (a file read back in another form)."""
        started = time.perf_counter()
        names, kinds, unbounded = self.names, self.kinds, self.unbounded
        stats = {name: ErrorStats() for name in names}
        tasks = {name: [0, 0, 0.0] for name in names if kinds[name]}  # top-1 agreeing rows, rows, summed KL
        how = getattr(quantized, "how", ENGINE)
        try:
            try:
                run = quantized if callable(quantized) else _quantized_runner(quantized, as_written)
            except Exception as e:
                if as_written is not None:  # (the file itself does not load: its check tells why)
                    raise Unloadable(first_line(e)) from e
                raise
            how = run.how
            for i, (feeds, want) in enumerate(zip(self.feeds, self.want)):
                got = _progress(run, feeds, "quantized", i, len(self.feeds), self.progress)
                for name in names:  # (a sample at a time: only the float model's outputs are kept)
                    w, g = want[name].astype(np.float64), got[name].astype(np.float64)
                    stats[name].add(w.ravel(), g.ravel())
                    if name in tasks:
                        for k, v in enumerate(row_sums(w, g, kinds[name])):
                            tasks[name][k] += v
                del got
            del run
        except Unloadable:
            raise
        except Exception as e:  # noqa: BLE001 - a model the engine cannot run: said, not raised
            return [], f"not measured: {first_line(e)}"
        errors = []
        for name in names:
            difference = OutputDifference(name, stats[name].relative, stats[name].max_abs, stats[name].cosine)
            if name in tasks and tasks[name][1]:  # (rows in some sample)
                agree, rows, kl = tasks[name]
                difference.task = kinds[name]
                difference.top1_agreement, difference.kl_divergence = agree / rows, kl / rows
            errors.append(difference)
        seconds = self.seconds + time.perf_counter() - started
        note = f"{self.described}; {how}, {2 * len(self.feeds)} runs in {seconds:.2f} s"
        if unbounded:
            note += f"; left out: {', '.join(unbounded)}, where the float model gives NaN or infinity"
        if self.empty:
            note += f"; left out: {', '.join(self.empty)}, empty on these inputs"
        return errors, note if errors else f"not measured: no float output to compare ({note})"


def evaluate_into(report, float_model: onnx.ModelProto, quantized, *, as_written: str | None = None,
                  **options) -> bool:
    """`report`'s outputs, outputs_note and inputs: `Evaluation(float_model, **options).measure(quantized,
    as_written=...)`, or ([], why) when the float model cannot run on the inputs (said, not raised).
    Returns whether the quantized model was made ready on its engine (not when the float model
    could not run); Unloadable when the file `as_written` does not load there."""
    try:
        evaluation = Evaluation(float_model, **options)
    except NotMeasured as e:
        report.outputs, report.outputs_note = [], str(e)
        return False
    report.outputs, report.outputs_note = evaluation.measure(quantized, as_written=as_written)
    report.inputs = evaluation.inputs_used()
    return True


def _progress(run, feeds: dict, which: str, i: int, count: int, progress) -> dict:
    if progress:
        progress(f"evaluating: {which} model, sample {i + 1}/{count}")
    return run(feeds)


def task_metrics(want: list[np.ndarray], got: list[np.ndarray], kind: str) -> tuple[float, float]:
    """(top-1 agreement over every row of the last axis, mean KL(float || quantized) in nats)."""
    agree = rows = 0
    kl = 0.0
    for w, g in zip(want, got):
        a, r, k = row_sums(w, g, kind)
        agree, rows, kl = agree + a, rows + r, kl + k
    return agree / rows, kl / rows

