"""A file a command wrote, checked before it is put in place: `verify_model(staged, form)`.

Every command that writes a model (quantize with each --emit, export with each --target, lift,
import-onednn, the demo's files) writes it to its staging place (`dyndq.atomic_writes`), checks
the file there, and only then renames it onto OUT; a file that fails its check is never put in place.
The check, of the file as written (read back from disk, not the model in memory):

- `dyndq check` finds no problem: our rules on our nodes, and onnx.checker's full check;
- it loads on the engine it is written for: a model holding DynamicDequantize ("dyndq") makes
  a reference evaluator with our kernel (ONNX's ReferenceEvaluator, its weights made inputs: it
  reads none when it is made), or, where that cannot run it (a contrib op `dyndq lift` left
  alone), ONNX Runtime's session of its export, as `dyndq run --engine onnxruntime` makes it,
  said in a note; standard ONNX ("onnx") and ONNX Runtime's form
  ("onnxruntime") make an ONNX Runtime CPU session from the file, at ONNX Runtime's default
  settings, as a user's `InferenceSession(path)` does (standard ONNX that ONNX Runtime has no
  kernel for, float4 codes or an opset newer than it runs, loads on onnx.reference instead, said
  in a note); "openvino" compiles it on OpenVINO's CPU plugin where OpenVINO is installed, and
  says it was not loaded there where it is not.

A file that fails is a bug of dyndq when the input passes the same test (`WrittenFileError`,
exit 70 in the CLI, told with the checker's or the engine's own words), and a problem of the
model when the input fails it too (`InheritedProblem`, exit 1): the input is tried only then,
so a file that passes costs nothing more.
"""
from __future__ import annotations

import os

import onnx

from dyndq.converters.engines import ENGINES as TABLE
from dyndq.converters.rules import TARGETS
from dyndq.wording import first_line

# ours, then each export target of the engine table ("onnx", "onnxruntime", "openvino"), loaded on
# the runners its row's `loads_on` names
FORMS = ("dyndq", *TARGETS)


class WrittenFileError(Exception):
    """The file made for `path` fails `dyndq check` or does not load on the engine it is written
    for, while the input passes the same test: a bug of dyndq.  Nothing was put at `path`."""

    def __init__(self, path: str, what: str, details: list[str]):
        self.path, self.what, self.details = path, what, list(details)
        super().__init__(f"{path}: not written: {what}" + "".join(f"\n  - {d}" for d in self.details))


class InheritedProblem(WrittenFileError):
    """The file made for `path` fails its check or its engine as the input model does: a problem
    of the model, not of the writing.  Nothing was put at `path`."""


def verify_model(path: str | os.PathLike, form: str, *, shown_as: str | None = None, source=None,
                 load: bool = True, model: onnx.ModelProto | None = None) -> list[str]:
    """Check the model file at `path` (its external data beside it) written for `form` (one of
    FORMS); `shown_as`: the path its errors name (where it goes in the end); `source`: the input
    model (a path or a ModelProto), tried on the same test when the file fails it, to tell whose
    problem it is; `load=False` leaves the engine out (a caller that runs the file on it anyway);
    `model`: the model the caller read from `path` already (it is not read again).
    Returns notes (an engine not installed here); raises WrittenFileError or InheritedProblem."""
    from dyndq.checker import check
    from dyndq.model_files import read_model

    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; one of {', '.join(FORMS)}")
    path = os.fspath(path)
    shown = shown_as or path
    model = read_model(path, load_data=False).model if model is None else model
    problems = check(model)  # (the external data left on disk: the checker is told not to look for it)
    if problems:
        inherited = source is not None and bool(check(_model(source, load_data=False)))
        raise (InheritedProblem if inherited else WrittenFileError)(
            shown, "the model made fails `dyndq check`" + (", as the input does" if inherited else ""),
            [str(p) for p in problems])
    if not load:
        return []
    if form != "dyndq" and not _session_module(TABLE[form].loads_on[0]).installed():
        first = TABLE[form].loads_on[0]
        return [f"not loaded on {_title(first)}: it is not installed here (make test-{first} installs it)"]
    try:
        return _load(path, model, form)
    except Refused as e:
        inherited = source is not None and _source_fails(source, form)
        raise (InheritedProblem if inherited else WrittenFileError)(
            shown, e.what + (", nor the input" if inherited else ""),
            [d.replace(path, shown).replace(os.path.dirname(path), os.path.dirname(os.path.abspath(shown)))
             for d in e.details]) from None  # (the staging place is no name to give)


class Refused(Exception):
    """An engine's refusal to load a file: what could not ("ONNX Runtime cannot load the model
    made"), and the engine's own words."""

    def __init__(self, what: str, details: list[str]):
        self.what, self.details = what, details
        super().__init__(f"{what}: {'; '.join(details)}")


def _words(e: BaseException) -> str:
    return f"{type(e).__name__}: {first_line(e)}"


def verify_onednn_json(path: str | os.PathLike, folder: str | None = None, ports=(), *,
                       shown_as: str | None = None) -> onnx.ModelProto:
    """A oneDNN graph file (`export-onednn`, `quantize --emit onednn-json`) read back by dyndq's
    reader (`dyndq.onednn.load`, the one reader of the format here; oneDNN itself is not), and
    `dyndq check` on the model it reads; `ports`: its weights' input ports, whose arrays are
    NAME.npy in `folder`, made initializers of that model again.  Returns the model; raises
    WrittenFileError (a graph dyndq writes, its reader must read)."""
    from dyndq import onednn
    from dyndq.checker import check
    from dyndq.npy import read_array
    from dyndq.opdefs import ValidationError

    shown = shown_as or os.fspath(path)
    try:
        model, _ = onednn.load(os.fspath(path))
    except ValidationError as e:
        raise WrittenFileError(shown, "dyndq's oneDNN reader refuses the graph made", [str(p) for p in e.problems]) from None
    if ports:
        from dyndq.opdefs import dtypes

        declared = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.input}
        kept = [vi for vi in model.graph.input if vi.name not in set(ports)]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        for name in ports:
            array = read_array(os.path.join(folder, f"{name}.npy"))
            if array.dtype.kind == "V":  # (NumPy keeps int4 and the like as raw bytes: the port's dtype says which)
                array = array.view(dtypes.by_onnx(declared[name]).numpy)
            model.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    problems = check(model)
    if problems:
        raise WrittenFileError(shown, "the oneDNN graph made, as dyndq's reader reads it, fails `dyndq check`",
                               [str(p) for p in problems])
    return model


def _model(source, load_data: bool = True) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return source
    from dyndq.model_files import read_model

    return read_model(source, load_data=load_data).model


def _load(path: str, model: onnx.ModelProto, form: str) -> list[str]:
    """Make the engine's session for the file (what a user of that engine does first: the runner's
    `user_session`, at the engine's defaults); returns notes (another engine than the form's own
    loaded it, and why), raises Refused."""
    if form == "dyndq":
        return _on_dyndqs_engines(path, model)
    first, *then = TABLE[form].loads_on
    runner = _session_module(first)
    try:
        runner.user_session(path)
    except Exception as e:  # noqa: BLE001 - the engine's own error, whatever its type
        lacking = runner.missing_kernel(e) if "reference" in then else None
        if lacking is not None:  # (valid standard ONNX that the engine has no kernel for: ONNX's own engine)
            try:
                _reference(_weights_as_inputs(model))
            except Exception:  # noqa: BLE001 - told below, in the engine's words
                pass
            else:
                return [f"not loaded on {_title(first)}, which has no kernel for {lacking}: loaded on onnx.reference "
                        f"instead (the target {first} writes forms {_title(first)} runs)"]
        raise Refused(f"{_title(first)} cannot load the model made", [_words(e)]) from None
    return []


def _session_module(name: str):
    from dyndq.runner import session_module

    return session_module(name)


def _title(runner: str) -> str:
    """What a message calls a runner's engine: its row's title ("ONNX Runtime", "OpenVINO")."""
    return next(e.title for e in TABLE.values() if e.runner == runner)


def _on_dyndqs_engines(path: str, model: onnx.ModelProto) -> list[str]:
    """A model holding our op on the reference engine (a ReferenceEvaluator with our kernel), or,
    where that cannot run it (a contrib op the exact lift leaves alone, which `dyndq lift` keeps),
    on ONNX Runtime through its export, as `dyndq run --engine onnxruntime` runs it, said in a
    note.  The reference engine is given the weights as inputs (it reads none to be made) unless
    the model holds contrib ops, whose exact lift reads their constants."""
    from dyndq.model_files import load_model
    from dyndq.reference import holds_foreign_ops

    whole = load_model(path) if holds_foreign_ops(model) else None
    try:
        _reference(whole if whole is not None else _weights_as_inputs(model))
        return []
    except Exception as e:  # noqa: BLE001 - the engine's own error, whatever its type
        why = _words(e)
    from dyndq.runner import Runner

    try:
        Runner(whole if whole is not None else load_model(path), "onnxruntime")  # (dyndq run's own session)
    except Exception as e:  # noqa: BLE001 - the engine's own error, whatever its type
        raise Refused("neither the reference engine nor ONNX Runtime can load the model made",
                      [f"the reference engine: {why}", f"ONNX Runtime (through export): {_words(e)}"]) from None
    return [f"not loaded on the reference engine ({why}): loaded on ONNX Runtime through its export instead, as "
            "dyndq run --engine onnxruntime runs it"]


def _reference(model: onnx.ModelProto) -> None:
    """The reference engine's session of the model (contrib ops through their exact lift, as `dyndq.run`
    makes it; our nodes were judged by `dyndq check` before)."""
    from dyndq.reference_session import ReferenceSession

    ReferenceSession(model)


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model, or, when its main graph holds big initializers (the light view's) or ones whose
    data is on disk, a copy in which each of them is a graph input of its type instead: a
    ReferenceEvaluator turns every initializer into an array when it is made (int4 codes unpacked,
    twice their bytes), and refuses one whose external data is not loaded."""
    from onnx import external_data_helper

    from dyndq.plumbing.light import BIG, initializers_as_inputs, nbytes

    return initializers_as_inputs(model, {t.name for t in model.graph.initializer
                                          if external_data_helper.uses_external_data(t) or nbytes(t) > BIG})


def _source_fails(source, form: str) -> bool:
    """Whether the input fails on the same engine, run as dyndq runs it there (a model holding our
    op exported first, as `dyndq run --engine onnxruntime` does)."""
    from dyndq.plumbing.walk import walk
    from dyndq.opdefs import domains

    try:
        if form == "dyndq":
            path = source if not isinstance(source, onnx.ModelProto) else None
            if path is None:
                _reference(source)
            else:
                _on_dyndqs_engines(os.fspath(path), _model(path, load_data=False))
            return False
        model = _model(source)
        ours = any(site.node.domain in domains() for site in walk(model))
        first = TABLE[form].loads_on[0]
        if ours:  # (exported for the engine as dyndq runs it there: `dyndq run --engine onnxruntime` so)
            if first == "onnxruntime":
                from dyndq.run_outputs import exported_for_onnxruntime

                model = exported_for_onnxruntime(model)
            else:
                from dyndq.exporter import export

                model = export(model, target=form)
        _session_module(first).user_session(model)
    except Exception:  # noqa: BLE001 - any failure of the input there: the model's own
        return True
    return False
