"""`runtime_parity(model)`: does ONNX Runtime's graph optimization change what a model computes?

ONNX Runtime rewrites a graph when it loads it, more at each optimization level, and some
rewrites change the arithmetic: at its default level (all) it fuses DequantizeLinear (blocked
int4) + MatMul into MatMulNBits with accuracy_level 4, which quantizes the activations to
int8 (set by its session option `session.qdq_matmulnbits_accuracy_level`, 4 unless told).
This runs the model on ONNX Runtime (CPU) twice with the same example inputs, with graph
optimizations off (the graph as written) and at `level`, and names every output that
differs beyond what summing MatMuls in another order explains, with the node types ONNX
Runtime's rewrite changed (read from the optimized graph it saves,
`SessionOptions.optimized_model_filepath`).

The tolerance: a float output differs when max |a - b| > TOLERANCE * max |b| (a is the output
at `level`, b with optimizations off).  float32 sums of K terms in another order move a
result by about sqrt(K) * 2^-24 of its terms' size (1e-6 and below for the models here);
int8 activations move it by 1e-3 and more.  Any other output differs when one element does.
A model holding our ops is exported first (`dyndq.export`, target "onnxruntime" with no contrib
op written: standard forms ONNX Runtime runs, version 3's float4/float6 codes included).  ONNX Runtime is fed
and read through `dyndq.ort_session.OrtSession`, as `dyndq.run(engine="onnxruntime")` feeds it
(int4/uint4 and bfloat16 inputs and outputs included), after the same check of the feeds.
"""
from __future__ import annotations

import collections
import os
import tempfile
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import onnx

from dyndq.opdefs import dtypes

TOLERANCE = 1e-4
LEVELS = ("basic", "extended", "all")
# A dimension the model leaves open (a symbol such as "batch" or "seq") takes this size in the example inputs.
OPEN_DIM = 4


class ExamplesDoNotFit(ValueError):
    """ONNX Runtime failed while running the model on example inputs made up for it (a model
    whose open dims must relate, say one twice another, needs inputs given); the engine's error
    is the cause."""

    def __init__(self, names: list[str]):
        super().__init__(f"ONNX Runtime failed on the example inputs made for {', '.join(map(repr, names))} (dims "
                         f"the model leaves open take {OPEN_DIM}; give inputs that fit with --input NAME=FILE.npy)")
        self.names = names


@dataclass(frozen=True)
class OutputParity:
    name: str
    differs: bool
    max_abs: float  # max |a - b|
    scale: float  # max |b|
    frobenius: float  # ||a - b|| / ||b||

    def __str__(self) -> str:
        if self.scale == 0 and self.max_abs == 0:
            return f"{self.name}: {'differs' if self.differs else 'agrees'}"
        ratio = self.max_abs / self.scale if self.scale else float("inf")
        return (f"{self.name}: {'differs' if self.differs else 'agrees'}: max |a - b| {self.max_abs:.3g} "
                f"({ratio:.2g} of max |b|), relative Frobenius norm {self.frobenius:.2g}")


@dataclass
class ParityReport:
    """What `runtime_parity` found: each output, and the node types ONNX Runtime's rewrite changed."""

    level: str
    version: str
    outputs: list[OutputParity] = field(default_factory=list)
    rewritten: list[tuple[str, int, int]] = field(default_factory=list)  # (node type, count as written, after)
    accuracy_levels: list[int] = field(default_factory=list)  # of the MatMulNBits in the optimized graph

    @property
    def differing(self) -> list[OutputParity]:
        return [o for o in self.outputs if o.differs]

    def summary(self) -> str:
        head = f"ONNX Runtime {self.version}, graph optimizations off vs {self.level}: "
        rule = f"(max |a - b| > {TOLERANCE:g} * max |b|)"
        if self.differing:
            return head + f"{len(self.differing)} of {len(self.outputs)} output(s) differ beyond MatMul reordering {rule}"
        return head + f"every output ({len(self.outputs)}) agrees within MatMul reordering {rule.replace('>', '<=')}"

    def lines(self) -> list[str]:
        out = [str(o) for o in self.outputs]
        if self.rewritten:
            changes = []
            for op, before, after in self.rewritten:
                note = ""
                if op.endswith("::MatMulNBits") and self.accuracy_levels:
                    note = f" (accuracy_level {'/'.join(str(v) for v in sorted(set(self.accuracy_levels)))})"
                changes.append(f"{op} {before} -> {after}{note}")
            out.append(f"ONNX Runtime rewrote: {', '.join(changes)}")
        else:
            out.append("ONNX Runtime rewrote no node type")
        return out


def runtime_parity(model: onnx.ModelProto | str | os.PathLike, *, level: str = "all",
                   feeds: Mapping[str, np.ndarray] | None = None, seed: int = 0) -> ParityReport:
    """Run `model` on ONNX Runtime with optimizations off and at `level`; compare (see the module doc).

    Inputs not in `feeds` get example values (`example_feeds`).  Every feed is checked against
    the graph's inputs and fed as `dyndq.run(engine="onnxruntime")` feeds it (int4/uint4 and
    bfloat16 included): one that does not fit raises `dyndq.runner.FeedError` naming the input."""
    import onnxruntime as ort

    from dyndq.files import model_of
    from dyndq.opdefs import domains
    from dyndq.ort_session import OrtSession
    from dyndq.runner import fitting_feeds, graph_inputs

    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; choose one of: {', '.join(LEVELS)}")
    model = model_of(model, "runtime_parity")
    if any(o.domain in domains() for o in model.opset_import):
        from dyndq.exporter import export

        model = export(model, target="onnxruntime", own_ops=False)
    given = dict(feeds or {})
    examples = example_feeds(model, seed, skip=given)
    feeds = fitting_feeds(graph_inputs(model), {**examples, **given})
    report = ParityReport(level, ort.__version__)
    results, graphs, added = {}, {}, set()
    names = [o.name for o in model.graph.output]
    with tempfile.TemporaryDirectory(prefix="dyndq-parity-") as folder:
        for label in ("off", level):
            path = os.path.join(folder, f"{label}.onnx")
            session = OrtSession(model, level=label, optimized_model_path=path)
            try:
                results[label] = dict(zip(names, session.run(names, feeds)))
            except Exception as e:  # (ONNX Runtime's own errors: it has no one class for them)
                if not examples:  # given inputs: the engine's failure, as `dyndq run` reports it
                    raise
                raise ExamplesDoNotFit(list(examples)) from e
            graphs[label] = onnx.load(path, load_external_data=False)
            added = session.boundary.added
    for name in names:
        report.outputs.append(_compare(name, np.asarray(results[level][name]), np.asarray(results["off"][name])))
    before = _node_types(model.graph.node)
    after = _node_types(n for n in graphs[level].graph.node if n.name not in added)
    report.rewritten = [(op, before.get(op, 0), after.get(op, 0)) for op in sorted(set(before) | set(after))
                        if before.get(op, 0) != after.get(op, 0)]
    report.accuracy_levels = [a.i for n in graphs[level].graph.node if n.op_type == "MatMulNBits"
                              for a in n.attribute if a.name == "accuracy_level"]
    return report


def _node_types(nodes) -> collections.Counter:
    return collections.Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}" for n in nodes)


def _compare(name: str, a: np.ndarray, b: np.ndarray) -> OutputParity:
    if a.shape != b.shape:
        return OutputParity(name, True, float("inf"), 0.0, float("inf"))
    if not (_floating(a) and _floating(b)):
        same = bool(np.array_equal(a, b))
        return OutputParity(name, not same, 0.0 if same else float("inf"), 0.0, 0.0 if same else float("inf"))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    if not np.array_equal(nan_a, nan_b):
        return OutputParity(name, True, float("nan"), float("nan"), float("nan"))
    d = np.where(nan_a, 0.0, a64 - b64)
    finite = np.where(nan_b, 0.0, b64)
    max_abs = float(np.abs(d).max(initial=0.0)) if not np.isnan(d).any() else float("inf")
    scale = float(np.abs(finite).max(initial=0.0))
    norm = float(np.linalg.norm(finite))
    frobenius = float(np.linalg.norm(d)) / norm if norm else (0.0 if max_abs == 0 else float("inf"))
    return OutputParity(name, max_abs > TOLERANCE * scale, max_abs, scale, frobenius)


def _floating(a: np.ndarray) -> bool:
    """A float array, ml_dtypes' bfloat16 and float8 too (NumPy's kind of those is "V")."""
    return a.dtype.name in {d.name for d in dtypes.DTYPES if d.is_float}


def example_feeds(model: onnx.ModelProto, seed: int = 0, skip=()) -> dict[str, np.ndarray]:
    """One array per graph input (not an initializer, nor named in `skip`): dims the model leaves open take OPEN_DIM;
    floats are drawn from N(0, 1); integers that index a Gather (or GatherBlockQuantized) lie in
    the range of the axis they index, other integers in 0..3; booleans are random."""
    from dyndq.plumbing.types import spec_of_type
    from dyndq.scopes import value_types

    rng = np.random.default_rng(seed)
    initializers = {t.name for t in model.graph.initializer}
    spec = value_types(model).specs_at("main")
    bounds = _index_bounds(model, spec)
    feeds = {}
    for vi in model.graph.input:
        if vi.name in initializers or vi.name in skip:
            continue
        s = spec_of_type(vi.type)
        if s is None or s.dtype is None:
            raise ValueError(f"graph input {vi.name!r}: its type is not a known tensor type; give it with --input")
        shape = tuple(d if isinstance(d, int) else OPEN_DIM for d in (s.shape or ()))
        kind = dtypes.by_name(s.dtype)
        if kind.name == "bool":
            feeds[vi.name] = rng.random(shape) < 0.5
        elif kind.is_integer:
            feeds[vi.name] = rng.integers(0, bounds.get(vi.name, 4), shape).astype(kind.numpy)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(np.float32).astype(kind.numpy)
    return feeds


def _index_bounds(model: onnx.ModelProto, spec) -> dict[str, int]:
    """input name -> the size of the axis it indexes, for inputs that are a Gather's indices."""
    bounds = {}
    for node in model.graph.node:
        if node.op_type not in ("Gather", "GatherBlockQuantized") or len(node.input) < 2:
            continue
        attrs = {a.name: a.i for a in node.attribute}
        axis = attrs.get("axis" if node.op_type == "Gather" else "gather_axis", 0)
        data = spec(node.input[0])
        if data is not None and data.shape is not None and -len(data.shape) <= axis < len(data.shape):
            size = data.shape[axis]
            if isinstance(size, int) and size > 0:
                bounds[node.input[1]] = min(bounds.get(node.input[1], size), size)
    return bounds
