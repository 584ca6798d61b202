"""`import_weights(model, checkpoint)`: a quantized checkpoint's weights put onto the float ONNX model
of the same network, exactly (`dyndq.import_weights`, `dyndq import-weights`; docs/import.md).

The checkpoint is opened by its format's reader (source.py: GGUF today), its tensors matched to
the model's float weights (matching.py: by name, the format's name map, --names, by shape and
closeness), each matched tensor decoded once by its exact nodes and put in place of its weights
(placing.py), then the model written for the engine asked (`emit`: "dyndq", our op; or an export
target of the engine table, `dyndq.export` of it).  The model passed in is never modified.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import onnx

from dyndq.checkpoints.matching import float_weights, match, weight_values
from dyndq.checkpoints.placing import Imported, decode, place
from dyndq.checkpoints.source import Checkpoint, open_checkpoint
from dyndq.converters.rules import TARGETS
from dyndq.opdefs import Problem, ValidationError
from dyndq.plumbing.opsets import ai_onnx_version

EMITS = ("dyndq", *TARGETS)  # ("dyndq", "onnx", "onnxruntime", "openvino")


@dataclass
class ImportReport:
    checkpoint: str
    format: str
    architecture: str | None
    emit: str = "dyndq"
    imported: list[Imported] = field(default_factory=list)
    left_float: list[tuple[str, tuple]] = field(default_factory=list)  # (weight, shape): no tensor for it
    unused: list[tuple[str, str, tuple]] = field(default_factory=list)  # (tensor, kind, shape): no weight for it
    notes: list[str] = field(default_factory=list)
    emitted: list[str] = field(default_factory=list)
    converted: str = ""  # the float model's opset raised, in a few words
    data_file: str | None = None

    def summary(self) -> str:
        tensors = len({r.tensor for r in self.imported})
        return (f"{len(self.imported)} weight(s) from {tensors} {self.format} tensor(s), {len(self.left_float)} left float, "
                f"{len(self.unused)} checkpoint tensor(s) unused; emit {self.emit}")

    def table(self) -> list[str]:
        lines = [f"  {r.weight} <- {r.tensor} ({r.kind}, {r.how}"
                 + (f", relative error {r.error:.3g}" if r.error is not None else "") + f", {r.orientation})"
                 + (f": {r.note}" if r.note else "") for r in self.imported]
        lines += [f"  left float: {name} {list(shape)}" for name, shape in self.left_float]
        lines += [f"  unused: {name} ({kind} {list(shape)})" for name, kind, shape in self.unused]
        lines += [f"  note: {n}" for n in ([self.converted] if self.converted else []) + self.notes]
        lines += [f"  {line}" for line in self.emitted]
        return lines

    def as_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "format": self.format, "architecture": self.architecture,
                "emit": self.emit, "imported": [r.as_dict() for r in self.imported],
                "left_float": [{"weight": n, "shape": list(s)} for n, s in self.left_float],
                "unused": [{"tensor": n, "kind": k, "shape": list(s)} for n, k, s in self.unused],
                "notes": ([self.converted] if self.converted else []) + self.notes, "emitted": self.emitted,
                "data_file": self.data_file}


def import_weights(model, checkpoint, names=None, emit: str = "dyndq", *, unpermute: bool = True):
    """(the model with the checkpoint's weights in place of its float ones, ImportReport).
    model: an onnx.ModelProto or a path; checkpoint: a path or an open Checkpoint; names: a dict
    {checkpoint tensor: initializer} or a JSON file of one; emit: "dyndq" (our op) or an export
    target ("onnx", "onnxruntime", "openvino").  Raises ValidationError for the problems found (a
    tensor matched to a weight of another shape, a --names entry naming nothing, nothing matched).
    unpermute=False leaves a GGUF file's Q/K rows as stored (llama.cpp's rotary permutation not
    undone: a Mistral-format checkpoint converted as llama); for an open Checkpoint, give it to
    its constructor."""
    from dyndq.model_files import model_of

    if emit not in EMITS:
        raise ValidationError([Problem("emit", repr(emit), ", ".join(EMITS))])
    given = model_of(model, "import_weights")
    names_map = _names(names)
    if isinstance(checkpoint, Checkpoint):
        ckpt = checkpoint
        if not unpermute and ckpt.unpermute:
            raise ValidationError([Problem("unpermute", "False with a checkpoint opened already",
                                           f"{type(ckpt).__name__}(path, unpermute=False), or the checkpoint's path")])
    else:
        ckpt = open_checkpoint(checkpoint, unpermute=unpermute)
    tensors = {t.name: t for t in ckpt.tensors()}
    out = onnx.ModelProto()
    out.CopyFrom(given)  # (the model passed in is never modified)
    matches, problems = match(out, ckpt, tensors, names_map, weight_values(out))
    if problems:
        raise ValidationError(problems)
    if not matches:
        raise ValidationError([Problem(f"checkpoint {ckpt.path!r}", f"no tensor of its {len(tensors)} matched a float "
                                       "weight of the model (by name, name map, --names or shape)",
                                       "at least one weight matched (--names maps tensors to initializers)")])
    report = ImportReport(ckpt.path, ckpt.format, ckpt.architecture, emit, notes=ckpt.notes())
    decoded = decode(out, matches, tensors)
    out = _opset_for(out, max(w.opset for w in decoded.values()), report)
    report.imported = place(out, matches, tensors, decoded)
    used = {m.tensor for m in matches}
    replaced = {m.weight for m in matches}
    report.left_float = [(w.name, w.shape) for w in float_weights(given).values() if w.name not in replaced]
    report.unused = [(t.name, t.kind, t.shape) for t in tensors.values() if t.name not in used]
    if emit != "dyndq":
        from dyndq.exporter import export_with_report

        out, exported = export_with_report(out, target=emit)
        report.emitted = [f"written for {emit}: {exported.summary()}", *exported.lines()]
    return out, report


def _opset_for(model: onnx.ModelProto, need: int, report: ImportReport) -> onnx.ModelProto:
    """The model at the ai.onnx opset the decodes need (21; F16's BitCast 26), converted by
    onnx.version_converter (through dyndq.export) where it is lower."""
    have = ai_onnx_version(model.opset_import) or 1
    if have >= need:
        return model
    from dyndq.exporter import export_with_report

    converted, _ = export_with_report(model, opset=need, target="onnx")
    report.converted = f"the float model's ai.onnx opset {have} raised to {need} (onnx.version_converter): the decodes need it"
    return converted


def _names(names) -> dict | None:
    """--names: a dict, or the JSON file of one, {checkpoint tensor: initializer}."""
    from dyndq.atomic_writes import ModelFileError

    if names is None or isinstance(names, dict):
        given = names
    else:
        try:
            with open(os.fspath(names), encoding="utf-8") as f:
                given = json.load(f)
        except OSError as e:
            raise ModelFileError(f"{os.fspath(names)}: cannot read it ({e.strerror or e})") from None
        except ValueError as e:
            raise ModelFileError(f"{os.fspath(names)}: not JSON ({e})") from None
    if given is not None and not (isinstance(given, dict) and all(isinstance(k, str) and isinstance(v, str)
                                                                  for k, v in given.items())):
        raise ModelFileError(f"{names if not isinstance(names, dict) else '--names'}: expected a JSON object "
                             "{checkpoint tensor: initializer name}")
    return given


def import_file(src, checkpoint, dst, *, names=None, emit: str = "dyndq", overwrite: bool = False,
                unpermute: bool = True) -> ImportReport:
    """Import into the model file `src` and write `dst` (as the input was stored: its external data
    in a file beside it when it had one, or when too big for one message), staged and checked
    (`dyndq.written.verify_model`: `dyndq check`, and it loads on the engine `emit` is for) before
    it is put in place; `dst` naming `src` is refused unless `overwrite`."""
    from dyndq.atomic_writes import ModelFileError, check_target, same_file, staged_write
    from dyndq.model_files import needs_external_data, read_model, write_staged
    from dyndq.written import verify_model

    check_target(dst)
    if not overwrite and same_file(src, dst):
        raise ModelFileError(f"{dst}: is the input model itself; write to another file")
    loaded = read_model(src)
    out, report = import_weights(loaded.model, checkpoint, names, emit, unpermute=unpermute)
    with staged_write(dst, external_data=needs_external_data(out, loaded.external_data)) as stage:
        write_staged(out, stage)
        del out
        report.notes += verify_model(stage.model, emit, shown_as=os.fspath(dst), source=os.fspath(src))
    report.data_file = stage.location
    return report
