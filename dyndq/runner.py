"""`run(model, feeds, engine=...)`: run a graph holding our ops, on either engine.

- "reference": ONNX's `ReferenceEvaluator`, with our kernel for our ops (`dyndq.reference_session`).
- "onnxruntime": the model is exported to standard ONNX (`dyndq.export`) and
  run by ONNX Runtime on the CPU (`dyndq.ort_session`), with its basic graph optimizations only
  (its extended level fuses MatMul+Add and pre-packs weights, which changes
  float32 results in the last bits).  int4/uint4 and bfloat16 inputs and outputs,
  which ONNX Runtime's Python API neither takes nor gives, pass through exact
  conversions (`OrtBoundary`), so both engines return the same dtypes.

The engines are those of the engine table (`dyndq.converters.engines`) that give our kernel's
bits on every model (no deviation).  A `Runner` checks the feeds against the graph's inputs and
the engine's outputs against the graph's outputs, whatever session it runs: quantize's
evaluation and size budget run ONNX Runtime through it too.

Both give identical outputs for our ops (README, "The op").  What an
engine builds for a model (an evaluator, or an export and an ORT session) is
cached, keyed on the SHA-256 of the serialized model, so repeated calls with
the same model (or an identical copy) do not build it again, while a model
changed in place gets a new one.  The cache holds the last `CACHE_SIZE` models.
Hashing costs one serialization per call; for a tight loop over a big model,
keep the `Runner` from `runner(model, engine)` and call it directly.
"""
from __future__ import annotations

import collections
import hashlib
import os
import threading
from typing import Mapping, Sequence

import numpy as np
import onnx

from dyndq.plumbing.types import open_dim, spec_of_type
from dyndq.opdefs import Problem, TensorSpec, ValidationError, dtypes
from dyndq.ort_session import OrtBoundary  # noqa: F401  (also dyndq.runner.OrtBoundary, where it was first defined)
from dyndq.run_outputs import OutputNameError  # noqa: F401  (beside FeedError and OutputError)
from dyndq.wording import a as article


def _exact_engines() -> tuple[str, ...]:
    from dyndq.converters.engines import ENGINES as TABLE

    return tuple(e.runner for e in TABLE.values() if not e.deviations)


ENGINES = _exact_engines()  # ("reference", "onnxruntime")
# the session class of each runner the engine table names (`Engine.runner`, `Engine.loads_on`),
# `Class(model, **settings).run(names, feeds)`; its module also holds `installed()`, `INSTALL` (how
# to install it) and `user_session(source)`, the session a user of the engine makes of a file
SESSIONS = {"reference": "dyndq.reference_session.ReferenceSession", "onnxruntime": "dyndq.ort_session.OrtSession",
            "openvino": "dyndq.openvino_session.OpenVinoSession"}
CACHE_SIZE = 8
# ONNX Runtime's graph optimization level for dyndq.run and quantize's runs: basic only (constant
# folding, redundant-node removal); its extended and full levels fuse MatMul+Add and pre-pack
# constant weights, which changes float32 results in their last bits, and the engines must agree
# to the bit.
ORT_LEVEL = "basic"


class FeedError(ValidationError):
    """The feeds do not fit the graph's inputs (a missing or unknown input, a wrong dtype, rank
    or fixed dimension): told apart from a ValidationError that a node raises while running."""


class OutputError(ValidationError):
    """An engine gave an output that does not fit the type the graph declares for it (its
    dtype, rank or a fixed dimension; a symbolic dimension takes any size): a wrong result
    is refused, never returned."""


class Runner:
    """One model made ready on one engine; call it with feeds.

    `session`: the session to run (its `run(names, feeds)`), made by the caller (quantize's
    evaluation runs a file as written, or a float model with its weights fed apart; verify an
    engine setting, on any engine of SESSIONS); None: the engine's own for the model, our nodes
    judged first.  `settings` go to ONNX Runtime's session
    (`arena=False`: its memory arena off)."""

    def __init__(self, model: onnx.ModelProto, engine: str, *, session=None, **settings):
        known = ENGINES if session is None else tuple(SESSIONS)
        if engine not in known:
            raise ValueError(f"unknown engine {engine!r}; choose one of: {', '.join(known)}")
        self.engine = engine
        self.model = model
        self.inputs = graph_inputs(model)
        self.outputs = [(o.name, _declared(o.type)) for o in model.graph.output]
        self.output_names = [name for name, _ in self.outputs]
        if session is not None:
            self.session = session
        elif engine == "reference":
            from dyndq.reference_session import ReferenceSession

            _validate_our_nodes(model)
            # ONNX Runtime's contrib ops (which onnx.reference lacks) run through their exact lift
            self.session = ReferenceSession(model)
        elif engine == "onnxruntime":
            from dyndq.ort_session import OrtSession
            from dyndq.run_outputs import exported_for_onnxruntime

            _validate_our_nodes(model)
            # export asks for what check_model(full_check=True) asks, graph outputs with
            # types and shapes among it, and ONNX Runtime for types; the reference engine runs
            # without them, so this one lets ONNX's inference fill them in rather than refuse
            # the model (an output whose type nobody can know is named).
            self.exported = exported_for_onnxruntime(model)
            self.session = OrtSession(self.exported, level=ORT_LEVEL, **settings)
        else:  # (an engine row of the table without deviations that dyndq.run has not learned to export for)
            raise ValueError(f"dyndq.run does not run engine {engine!r} yet: Runner exports a model for "
                             "'onnxruntime' only")

    def __call__(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        arrays = fitting_feeds(self.inputs, feeds)
        values = self.session.run(self.output_names, arrays)
        results = {name: _output(value) for name, value in zip(self.output_names, values)}
        problems = [problem for name, spec in self.outputs if spec is not None
                    for problem in [_value_problem(name, spec, results[name], "graph output")] if problem]
        if problems:
            raise OutputError(problems)
        return results


def _output(value):
    """A tensor output as an ndarray; a sequence output as a list of ndarrays (np.asarray on
    it would stack its tensors into one array, or fail when their shapes differ)."""
    if isinstance(value, (list, tuple)):
        return [np.asarray(v) for v in value]
    return value if value is None else np.asarray(value)


_cache: collections.OrderedDict[tuple[str, str], Runner] = collections.OrderedDict()
_lock = threading.Lock()


def model_key(model: onnx.ModelProto) -> str:
    """A key that changes whenever the model does: the SHA-256 of its serialization."""
    from dyndq.plumbing.light import big_initializers, light_view

    digest = hashlib.sha256(light_view(model).SerializeToString(deterministic=True))
    for t in big_initializers(model):  # their data, which the light view leaves out (a model over 2 GiB
        digest.update(t.name.encode())  # cannot be serialized whole, nor a tensor over 2 GiB)
        digest.update(t.raw_data)
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "external_data"):
            digest.update(repr(list(getattr(t, field))).encode() if field == "external_data" else np.asarray(getattr(t, field)).tobytes())
    return digest.hexdigest()


def runner(model: onnx.ModelProto | str | os.PathLike, engine: str = "reference",
           outputs: Sequence[str] | None = None) -> Runner:
    """The cached Runner for this model, engine and outputs (None: the graph's), built on first use."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose one of: {', '.join(ENGINES)}")
    if isinstance(model, (str, os.PathLike)):
        from dyndq.model_files import load_model

        model = load_model(model)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"run() takes an onnx.ModelProto or a file path, not {type(model).__name__}")
    if outputs is not None:
        from dyndq.run_outputs import asked_outputs

        outputs = tuple(asked_outputs(model, outputs))
    key = (engine, model_key(model), outputs)
    with _lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
            return found
    if outputs is None:
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # the runner keeps its own: later edits to `model` cannot reach it
    else:
        from dyndq.run_outputs import with_outputs

        copy = with_outputs(model, outputs)  # (a copy too)
    built = Runner(copy, engine)
    with _lock:
        _cache[key] = built
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return built


def run(model: onnx.ModelProto | str | os.PathLike, feeds: Mapping[str, object], *, engine: str = "reference",
        outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Run the model's main graph on `feeds` (input name -> array); returns output name -> array
    (a list of arrays for a sequence output).

    `outputs`: the values to return, by name, in that order, in place of the graph's outputs:
    any value of the main graph (a graph input, an initializer, the output of any of its nodes),
    on either engine.  A name that is none raises `dyndq.run_outputs.OutputNameError`.

    Feeds are checked against the graph's inputs first: a missing or unknown
    input, or a feed of the wrong dtype, rank or fixed dimension, raises
    `dyndq.ValidationError` naming the input.  A model using our ops wrongly
    raises `dyndq.ValidationError` with every problem.
    """
    return runner(model, engine, outputs)(feeds)


def session_module(name: str):
    """The module of runner `name` (SESSIONS)."""
    import importlib

    return importlib.import_module(SESSIONS[name].rpartition(".")[0])


def session_class(name: str):
    """The session class of runner `name` (SESSIONS)."""
    return getattr(session_module(name), SESSIONS[name].rpartition(".")[2])


def clear_cache() -> None:
    with _lock:
        _cache.clear()


# -- feeds -------------------------------------------------------------------------------


def graph_inputs(model: onnx.ModelProto) -> list[tuple[str, TensorSpec | None, bool]]:
    """(name, spec or None for non-tensor types, required) of each graph input."""
    initializers = {t.name for t in model.graph.initializer} | {t.values.name for t in model.graph.sparse_initializer}
    return [(vi.name, _declared(vi.type), vi.name not in initializers) for vi in model.graph.input]


def _declared(tp: onnx.TypeProto) -> TensorSpec | None:
    """The declared spec of a graph input or output: None for non-tensor types (and none)."""
    from dyndq.plumbing.types import untyped_tensor

    return TensorSpec(None, None) if untyped_tensor(tp) else spec_of_type(tp)


def fitting_feeds(inputs, feeds: Mapping[str, object]) -> dict[str, object]:
    """`check_feeds`, its problems raised as FeedError."""
    try:
        return check_feeds(inputs, feeds)
    except FeedError:
        raise
    except ValidationError as e:
        raise FeedError(e.problems) from None


def check_feeds(inputs, feeds: Mapping[str, object]) -> dict[str, object]:
    """The feeds as arrays, or ValidationError with every problem (each naming its input)."""
    if not isinstance(feeds, Mapping):
        raise TypeError(f"feeds must be a mapping of input name to array, not {type(feeds).__name__}")
    known = {name: (spec, required) for name, spec, required in inputs}
    problems: list[Problem] = []
    arrays: dict[str, object] = {}
    for name, value in feeds.items():
        if name not in known:
            names = ", ".join(repr(n) for n in known) or "none"
            problems.append(Problem(name, "a feed, but the graph has no input of that name", f"the graph's inputs: {names}"))
            continue
        spec, _ = known[name]
        if spec is None:  # a sequence, map or optional input: the engine judges it
            arrays[name] = value
            continue
        array = _typed(_native(value), spec)
        problem = _value_problem(name, spec, array, "graph input")
        if problem:
            problems.append(problem)
        arrays[name] = array
    for name, (spec, required) in known.items():
        if required and name not in feeds:
            problems.append(Problem(name, "no feed", f"{article(_describe(spec))} array, the type of graph input {name!r}"))
    if problems:
        raise ValidationError(problems)
    return arrays


# ml_dtypes' types that a .npy file stores as raw bytes ("|V2", "|V1"): np.load gives them back
# as void arrays, which are taken as the input's dtype when the item size fits.
_RAW_IN_NPY = {"bfloat16": 2, "int4": 1, "uint4": 1}


def _typed(array: np.ndarray, spec: TensorSpec) -> np.ndarray:
    """A void array (as np.load gives an ml_dtypes array back) viewed as the input's dtype."""
    size = _RAW_IN_NPY.get(spec.dtype)
    if size is not None and array.dtype.kind == "V" and array.dtype.names is None and array.dtype.itemsize == size:
        return array.view(dtypes.by_name(spec.dtype).numpy)
    return array


def _native(value) -> np.ndarray:
    """The feed as a plain ndarray in the machine's byte order. Engines take the bytes as they
    are: a big-endian array (a '>f4' .npy) gives ONNX Runtime garbage and the reference engine
    a type error, and an ndarray subclass (np.matrix keeps two dimensions whatever is done to
    it) breaks the kernel's broadcasting."""
    array = np.asarray(value)  # (subok=False: np.matrix and other subclasses become ndarray)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return array


def _value_problem(name: str, spec: TensorSpec, array, role: str) -> Problem | None:
    """How a feed or an engine's output does not fit the declared type of the graph input or
    output `name` (`role`): its dtype, rank, or a fixed dimension; None when it fits."""
    allowed = f"{_describe(spec)}, the type of {role} {name!r}"
    if not isinstance(array, np.ndarray):  # an output: a sequence or no value where a tensor is declared
        found = "no value" if array is None else f"a sequence of {len(array)} tensors"
        return Problem(name, found, allowed)
    found = f"{article(array.dtype.name)} array of shape {list(array.shape)}"
    strings = spec.dtype == "string" and array.dtype.kind in "OUS"  # (NumPy has no one string dtype)
    if spec.dtype is not None and array.dtype.name != spec.dtype and not strings:
        return Problem(name, found, allowed)
    if spec.shape is not None:
        if array.ndim != len(spec.shape):
            return Problem(name, f"{found} (rank {array.ndim})", f"rank {len(spec.shape)}: {allowed}")
        for i, (want, got) in enumerate(zip(spec.shape, array.shape)):
            if not open_dim(want) and want != got:
                return Problem(name, f"{found} (dimension {i} is {got})", f"dimension {i} = {want}: {allowed}")
    return None


def _describe(spec: TensorSpec | None) -> str:
    if spec is None:
        return "a value"
    return str(spec)


# -- the model -----------------------------------------------------------------------------


def _validate_our_nodes(model: onnx.ModelProto) -> None:
    """Refuse a model that uses our ops wrongly, with every problem.  (ONNX's own
    checker findings are left to the engine: a model ONNX would not fully check,
    e.g. one without output shapes, may still run.)"""
    from dyndq.checker import check

    problems = [p for p in check(model) if p.op is not None]
    if problems:
        raise ValidationError(problems)
