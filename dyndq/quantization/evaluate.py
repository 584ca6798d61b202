"""The output error of a quantized model: both models run on the same inputs, the user's or seeded samples.

The inputs are the user's (`inputs`: one feed dict or a list of them, each a sample; checked
against the graph's inputs before anything is quantized, a feed that does not fit raising
`FeedError` naming it), or `samples` seeded samples, drawn as `dyndq.parity.example_feeds`
draws them (floats from N(0, 1), booleans at random, other integers in 0..3, a dimension
without a fixed size 4 long), with every integer input that reaches a Gather's indices (directly or through Cast, Reshape, Unsqueeze, Squeeze,
Flatten, Identity) drawn across the rows of the table it indexes, the first sample holding its
first and last row (token ids across every embedding's vocabulary).

Per float output: the relative error, the largest difference and the cosine over every sample;
for an output whose last axis is a distribution (non-negative, summing to 1: a Softmax's) or
logits (made by LogSoftmax; or made by MatMul, Gemm or Add and named "...logits..." or as long
on its last axis as an embedding has rows, a language model's head), also what a task sees: how often the top-1
answer along that axis stays the same, and the mean KL divergence KL(float || quantized) of
the distributions (of softmax(logits) for logits), in nats.

Both models run on ONNX Runtime through `dyndq.run`'s Runner (the quantized one exported to
standard ONNX first; its basic graph optimizations only, so the dequantized weights are the
graph's exactly), one after the other: the float model's session is dropped before the
quantized one's is made.
"""
from __future__ import annotations

import time

import numpy as np
import onnx

from dyndq.quantization.numerics import ErrorStats
from dyndq.quantization.report import OutputDifference
from dyndq.wording import first_line, plural

ENGINE = "onnxruntime"
SAMPLES = 4  # seeded samples by default: the evaluation's cost is this many runs of each model
OPEN_DIM = 4  # the size of a dimension the model leaves open, in a seeded sample (parity's)
OTHER_INTEGERS = 4  # an integer input that indexes no table: 0..3
PASS_INDICES = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")  # ops that keep an index an index
LOGIT_MAKERS = ("MatMul", "Gemm", "Add", "LogSoftmax", "MatMulNBits", "Einsum")


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
    """`samples` seeded feed dicts covering each input's valid range (see the module doc).

    (As `dyndq.parity.example_feeds` draws them, but a dimension an exporter writes as -1 or 0,
    paddle2onnx's dynamic batch, is open here: NumPy refuses a negative size.)"""
    from dyndq.opdefs import dtypes
    from dyndq.plumbing.types import spec_of_type

    initializers = {t.name for t in model.graph.initializer}
    bounds = index_bounds(model)
    out = []
    for i in range(samples):
        rng = np.random.default_rng([seed, i])
        feeds = {}
        for vi in model.graph.input:
            if vi.name in initializers:
                continue
            spec = spec_of_type(vi.type)
            if spec is None or spec.dtype is None:
                raise ValueError(f"graph input {vi.name!r}: its type is not a known tensor type; give it with --input")
            shape = tuple(d if isinstance(d, int) and d > 0 else OPEN_DIM for d in (spec.shape or ()))
            kind = dtypes.by_name(spec.dtype)
            if kind.name == "bool":
                feeds[vi.name] = rng.random(shape) < 0.5
            elif kind.is_integer:
                rows = bounds.get(vi.name, OTHER_INTEGERS)
                ids = rng.integers(0, rows, shape)
                if i == 0 and vi.name in bounds and ids.size:  # (the first and the last row of the table, always)
                    ids.flat[0], ids.flat[-1] = 0, rows - 1
                feeds[vi.name] = ids.astype(kind.numpy)
            else:
                feeds[vi.name] = rng.standard_normal(shape).astype(np.float32).astype(kind.numpy)
        out.append(feeds)
    return out


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """graph input -> the rows of the smallest table whose Gather it indexes (main graph), through
    the ops that keep an index an index (PASS_INDICES)."""
    from dyndq.scopes import value_types

    spec = value_types(model).specs_at("main")
    made_by = {o: n for n in model.graph.node for o in n.output}
    inputs = {vi.name for vi in model.graph.input}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type not in ("Gather", "GatherBlockQuantized") or len(node.input) < 2:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        axis = attrs.get("axis" if node.op_type == "Gather" else "gather_axis", 0)
        data = spec(node.input[0])
        if data is None or data.shape is None or not -len(data.shape) <= axis < len(data.shape):
            continue
        rows = data.shape[axis]
        name = node.input[1]
        while name not in inputs and name in made_by and made_by[name].op_type in PASS_INDICES:
            name = made_by[name].input[0]
        if isinstance(rows, int) and rows > 0 and name in inputs:
            bounds[name] = min(bounds.get(name, rows), rows)
    return bounds


def describe_samples(samples: list[dict], given: bool, seed: int, tables: bool = False) -> str:
    """Which inputs the evaluation used, in a few words."""
    shapes = ", ".join(f"{name} {v.dtype.name}{list(v.shape)}" for name, v in samples[0].items() if hasattr(v, "shape"))
    ids = "; token ids across each embedding's rows" if tables else ""
    source = f"{plural(len(samples), 'sample')} given" if given else f"{plural(len(samples), 'seeded sample')} (seed {seed}{ids})"
    return f"{source}: {shapes}" if shapes else source


class Evaluation:
    """The float model run once on the evaluation's inputs (its session dropped when done), to
    measure any number of quantized models of it against (`measure`)."""

    def __init__(self, float_model: onnx.ModelProto, *, seed: int = 0, inputs=None, samples: int = SAMPLES,
                 progress=None):
        from dyndq.runner import Runner  # (not runner(): its cache would keep the sessions, weights and all)

        started = time.perf_counter()
        self.model, self.seed, self.progress, self.given = float_model, seed, progress, inputs is not None
        self.feeds = inputs if self.given else seeded_samples(float_model, seed, samples)
        self.want = _run_all(Runner(float_model, ENGINE), self.feeds, "float", progress)
        self.seconds = time.perf_counter() - started

    def inputs_used(self) -> dict:
        """Which inputs, for tools: their source, seed (seeded ones), and each sample's arrays as dtype[shape]."""
        return {"source": "given" if self.given else "seeded", "seed": None if self.given else self.seed,
                "samples": [{name: f"{v.dtype.name}{list(v.shape)}" for name, v in f.items() if hasattr(v, "shape")}
                            for f in self.feeds]}

    def measure(self, quantized: onnx.ModelProto) -> tuple[list[OutputDifference], str]:
        """(per output differences, how they were measured: which inputs, how long) or ([], why
        they were not)."""
        from dyndq.runner import Runner

        started = time.perf_counter()
        try:
            got = _run_all(Runner(quantized, ENGINE), self.feeds, "quantized", self.progress)
        except Exception as e:  # noqa: BLE001 - a model the engine cannot run: said, not raised
            return [], f"not measured: {first_line(e)}"
        errors, unbounded = [], []
        for name, w0 in self.want[0].items():
            if not isinstance(w0, np.ndarray) or w0.dtype.kind != "f" and w0.dtype.name != "bfloat16":
                continue
            ws = [w[name].astype(np.float64) for w in self.want]
            gs = [g[name].astype(np.float64) for g in got]
            if not all(np.isfinite(w).all() for w in ws):  # (an error against infinity or NaN means nothing)
                unbounded.append(name)
                continue
            stats = ErrorStats()
            for w, g in zip(ws, gs):
                stats.add(w.ravel(), g.ravel())
            difference = OutputDifference(name, stats.relative, stats.max_abs, stats.cosine)
            kind = task_kind(self.model, name, ws)
            if kind is not None:
                difference.task = kind
                difference.top1_agreement, difference.kl_divergence = task_metrics(ws, gs, kind)
            errors.append(difference)
        seconds = self.seconds + time.perf_counter() - started
        note = f"{describe_samples(self.feeds, self.given, self.seed, bool(index_bounds(self.model)))}; {ENGINE}, {2 * len(self.feeds)} runs in {seconds:.2f} s"
        if unbounded:
            note += f"; left out: {', '.join(unbounded)}, where the float model gives NaN or infinity"
        return errors, note if errors else f"not measured: no float output with finite values ({note})"


def evaluate_into(report, float_model: onnx.ModelProto, quantized: onnx.ModelProto, **options) -> None:
    """`report`'s outputs, outputs_note and inputs: `Evaluation(float_model, **options).measure(quantized)`,
    or ([], why) when the float model cannot run on the inputs (said, not raised)."""
    try:
        evaluation = Evaluation(float_model, **options)
    except Exception as e:  # noqa: BLE001 - a model the engine cannot run, inputs it refuses: said, not raised
        report.outputs, report.outputs_note = [], f"not measured: {first_line(e)}"
        return
    report.outputs, report.outputs_note = evaluation.measure(quantized)
    report.inputs = evaluation.inputs_used()


def _run_all(runner, feeds: list[dict], which: str, progress) -> list[dict]:
    results = []
    for i, f in enumerate(feeds):
        if progress:
            progress(f"evaluating: {which} model, sample {i + 1}/{len(feeds)}")
        results.append(runner(f))
    return results


def task_kind(model: onnx.ModelProto, output: str, values: list[np.ndarray]) -> str | None:
    """"distribution" or "logits" when the output's last axis is one (see the module doc), else None."""
    if values[0].ndim == 0 or values[0].shape[-1] < 2:
        return None
    if all((v >= 0).all() and np.allclose(v.sum(axis=-1), 1.0, atol=1e-3) for v in values):
        return "distribution"
    made_by = {o: n for n in model.graph.node for o in n.output}
    node = made_by.get(output)
    while node is not None and node.op_type in ("Identity", "Reshape", "Squeeze", "Flatten") and node.input:
        node = made_by.get(node.input[0])
    if node is None or node.op_type not in LOGIT_MAKERS:
        return None
    # (a hidden state is made by the same ops: only a name or a vocabulary-long axis tells logits apart)
    head = "logit" in output.lower() or values[0].shape[-1] in index_bounds(model).values()
    return "logits" if node.op_type == "LogSoftmax" or head else None


def task_metrics(want: list[np.ndarray], got: list[np.ndarray], kind: str) -> tuple[float, float]:
    """(top-1 agreement over every row of the last axis, mean KL(float || quantized) in nats)."""
    agree = rows = 0
    kl = 0.0
    for w, g in zip(want, got):
        w, g = w.reshape(-1, w.shape[-1]), g.reshape(-1, g.shape[-1])
        agree += int((w.argmax(axis=-1) == g.argmax(axis=-1)).sum())
        rows += w.shape[0]
        log_p, log_q = (_log_softmax(w), _log_softmax(g)) if kind == "logits" else (_log_normalized(w), _log_normalized(g))
        p = np.exp(log_p)
        kl += float(np.sum(np.where(p > 0, p * (log_p - log_q), 0.0)))
    return agree / rows, kl / rows


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _log_normalized(p: np.ndarray) -> np.ndarray:
    """log of a distribution, a zero probability floored at 1e-12 (KL against an exact 0 is infinite)."""
    p = np.maximum(p, 1e-12)
    return np.log(p / p.sum(axis=-1, keepdims=True))
