"""`import_weights(model, checkpoint)`: a quantized checkpoint's weights put onto the float ONNX model
of the same network, exactly (`dyndq.import_weights`, `dyndq import-weights`; docs/import.md).

The checkpoint is opened by its format's reader (source.py: GGUF, safetensors), its tensors matched to
the model's float weights (matching.py: by name, the format's name map, --names, by shape and
closeness), each matched tensor decoded once by its exact nodes and put in place of its weights
(placing.py), then the model written for the engine asked (`emit`: "dyndq", our op; or an export
target of the engine table, `dyndq.export` of it).  The model passed in is never modified.
`import_file` from a model with external data streams (docs/import.md, "Memory"): the float
model's graph read alone, one checkpoint tensor decoded at a time, written to the new data file
(for an emit other than dyndq, to a scratch file the export then reads a tensor at a time:
streamed.py).  `import_weights` on a model in memory lends its float weights to the copy it works
on (`_lent`): a weight replaced is never copied.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import onnx

from dyndq.checkpoints import fused
from dyndq.checkpoints.matching import float_weights, match, unused, weight_values
from dyndq.checkpoints.placing import Imported, decoder, place
from dyndq.checkpoints.source import Checkpoint, open_checkpoint
from dyndq.checkpoints.writer import written_to
from dyndq.converters.rules import TARGETS
from dyndq.opdefs import Problem, ValidationError
from dyndq.plumbing.opsets import ai_onnx_version

EMITS = ("dyndq", *TARGETS)  # ("dyndq", "onnx", "onnxruntime", "openvino")
# --emit onnxruntime: "exact" writes ONNX Runtime's fused ops wherever they give the format's bits
# (fast; GGUF Q4_0/Q8_0 at 1.00x its bytes: the float16 d and a Cast to float32), "never" the
# composition everywhere (the checkpoint's own bytes too, 1.00x; slower on ONNX Runtime)
FUSES = ("exact", "never")


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
    forms: dict = field(default_factory=dict)  # weight -> the form written for ONNX Runtime, with why (fused.py)

    def summary(self) -> str:
        tensors = len({r.tensor for r in self.imported})
        fused = sum(not f.startswith("composition") for f in self.forms.values())
        return (f"{len(self.imported)} weight(s) from {tensors} {self.format} tensor(s), {len(self.left_float)} left float, "
                f"{len(self.unused)} checkpoint tensor(s) unused; emit {self.emit}"
                + (f" ({fused} fused, {len(self.forms) - fused} composition)" if self.forms else ""))

    def table(self) -> list[str]:
        lines = [f"  {r.weight} <- {r.tensor} ({r.kind}, {r.how}"
                 + (f", relative error {r.error:.3g}" if r.error is not None else "") + f", {r.orientation})"
                 + (f": {r.note}" if r.note else "")
                 + (f"\n    form: {self.forms[r.weight]}" if r.weight in self.forms else "") for r in self.imported]
        lines += [f"  left float: {name} {list(shape)}" for name, shape in self.left_float]
        lines += [f"  unused: {name} ({kind} {list(shape)})" for name, kind, shape in self.unused]
        lines += [f"  note: {n}" for n in ([self.converted] if self.converted else []) + self.notes]
        lines += [f"  {line}" for line in self.emitted]
        return lines

    def as_dict(self) -> dict:
        return {"checkpoint": self.checkpoint, "format": self.format, "architecture": self.architecture,
                "emit": self.emit, "imported": [{**r.as_dict(), **({"written_as": self.forms[r.weight]}
                                                                     if r.weight in self.forms else {})}
                                                    for r in self.imported],
                "left_float": [{"weight": n, "shape": list(s)} for n, s in self.left_float],
                "unused": [{"tensor": n, "kind": k, "shape": list(s)} for n, k, s in self.unused],
                "notes": ([self.converted] if self.converted else []) + self.notes, "emitted": self.emitted,
                "data_file": self.data_file}


def import_weights(model, checkpoint, names=None, emit: str = "dyndq", *, unpermute: bool = True,
                   fuse: str = "exact"):
    """(the model with the checkpoint's weights in place of its float ones, ImportReport).
    model: an onnx.ModelProto or a path; checkpoint: a path or an open Checkpoint; names: a dict
    {checkpoint tensor: initializer} or a JSON file of one; emit: "dyndq" (our op) or an export
    target ("onnx", "onnxruntime", "openvino").  Raises ValidationError for the problems found (a
    tensor matched to a weight of another shape, a --names entry naming nothing, nothing matched).
    unpermute=False leaves a GGUF file's Q/K rows as stored (llama.cpp's rotary permutation not
    undone: a Mistral-format checkpoint converted as llama); for an open Checkpoint, give it to
    its constructor.  fuse ("exact", "never"): for emit "onnxruntime", whether the weights ONNX
    Runtime's fused ops compute exactly are written fused (fast, GGUF Q4_0 at 1.00x its bytes) or
    every weight as the composition (the checkpoint's bytes); docs/import.md "Fused or not"."""
    from dyndq.model_files import model_of

    _check_emit(emit, fuse)
    given = model_of(model, "import_weights")
    names_map = _names(names)
    ckpt = _opened(checkpoint, unpermute)
    if given is not model:  # (one read from a path here is ours to change)
        return _in_memory(given, ckpt, names_map, emit, fuse)
    # the model passed in is never modified: the import works on a copy whose large initializers
    # are lent (their data copied back only for the weights kept), so the float weights replaced
    # are never copied; the by-shape matching reads the given model's values
    out, lent = _lent(given)
    return _in_memory(out, ckpt, names_map, emit, fuse, values_from=given,
                      before_placing=lambda model, replaced: _given_back(model, replaced, lent))


def _in_memory(out: onnx.ModelProto, ckpt: Checkpoint, names_map: dict | None, emit: str, fuse: str, **kwargs):
    """`_imported` on a model in memory.  For an emit other than dyndq, the decodes and the tensors
    the export makes are held beside the model (dyndq.held_tensors, as the streamed import keeps
    them in its files), each weight's decode let go as soon as its new form is made, and put into
    the model returned once, at the end: in the model itself, protobuf would keep every decode the
    export replaced until the model goes (docs/import.md, "Memory")."""
    if emit == "dyndq":
        return _imported(out, ckpt, names_map, emit, fuse=fuse, **kwargs)
    from dyndq.converters.walker import external_constants
    from dyndq.exporter import export_with_report
    from dyndq.held_tensors import HeldTensors

    held = HeldTensors()

    def export(model):
        with external_constants(held.read, held.stored, held.raw, held.stored_bytes, held.let_go):
            exported = export_with_report(model, target=emit, consume=True)
        held.given_back(exported[0])
        return exported

    return _imported(out, ckpt, names_map, emit, fuse=fuse, data=held, export=export, **kwargs)


def _lent(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """(a copy of `model` whose main-graph float initializers of 1 KiB or more hold no data (stubs
    of external data no file holds), their names, types and shapes kept; {name: the given tensor})."""
    from dyndq.plumbing.light import copy_fields, nbytes

    out = onnx.ModelProto()
    copy_fields(model, out, skip={"graph"})
    copy_fields(model.graph, out.graph, skip={"initializer"})
    lent = {}
    for t in model.graph.initializer:
        if nbytes(t) >= 1024 and t.data_type in _FLOATS:  # (a stub of external data: the checker and the
            # opset's conversion take it as they take the streamed import's, no file read)
            stub = out.graph.initializer.add()
            copy_fields(t, stub, skip=_DATA_FIELDS | {"external_data", "data_location"})
            stub.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", "dyndq-lent-weights"), ("offset", "0"), ("length", str(nbytes(t)))):
                stub.external_data.add(key=key, value=value)
            lent[t.name] = t
        else:
            out.graph.initializer.add().CopyFrom(t)
    return out, lent


_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
_DATA_FIELDS = {"raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"}


def _given_back(model: onnx.ModelProto, replaced: set[str], lent: dict) -> None:
    """The data of each lent initializer kept (no tensor replaced it) copied from the given model."""
    for t in model.graph.initializer:
        if t.name in lent and t.name not in replaced:
            t.CopyFrom(lent[t.name])


def _imported(out: onnx.ModelProto, ckpt: Checkpoint, names_map: dict | None, emit: str, *, loaded=None,
              data=None, before_placing=None, fuse: str = "exact", export=None, values_from=None):
    """The import's work on `out` (the caller's own model: changed in place, or replaced by its
    opset's conversion), (the model, ImportReport).  `loaded`: where `out`'s external data is
    (read one weight at a time, for the by-shape matching alone: the weights matched by name are
    never read); `data`: the new external data file (a model_files.DataFile) each decode's tensors
    are written to as they are made (writer.written_to), the graph holding stubs of them;
    `before_placing(model, replaced)`: called once the weights to replace are known; `export(model)`:
    (the model written for `emit`, its ExportReport), for an emit other than "dyndq" (default:
    dyndq.export of the model held whole; the streamed import's, one tensor at a time);
    `values_from`: the model whose weights' values the by-shape matching reads (`out`'s own by default)."""
    tensors = {t.name: t for t in ckpt.tensors()}
    weights = float_weights(out)
    values = weight_values(values_from if values_from is not None else out, loaded)
    try:
        matches, problems = match(out, ckpt, tensors, names_map, values)
    finally:
        values.close()
    if problems:
        raise ValidationError(problems)
    orientations = {m.weight: m.orientation for m in matches}
    if not matches:
        raise ValidationError([Problem(f"checkpoint {ckpt.path!r}", f"no tensor of its {len(tensors)} matched a float "
                                       "weight of the model (by name, name map, --names or shape)",
                                       "at least one weight matched (--names maps tensors to initializers)")])
    report = ImportReport(ckpt.path, ckpt.format, ckpt.architecture, emit, notes=ckpt.notes())
    out = _opset_for(out, _opset_needed(matches, tensors), report)
    decoded = plan = None
    if emit == "onnxruntime" and fuse == "never":
        report.forms = fused.never(matches, tensors)
    elif emit == "onnxruntime":  # (ONNX Runtime's fused ops where the format fits them exactly: fused.py; each
        # decode made and rewritten in turn, before any is placed; streamed: written to the data file as it goes)
        decoded, matches, plan = fused.prepare(out, matches, tensors, decoder(out, matches, tensors), data=data)
        report.forms = plan.forms
    replaced = {m.weight for m in matches}
    if before_placing is not None:
        before_placing(out, replaced)
    if data is None:
        report.imported = place(out, matches, tensors, decoded=decoded)  # (else one tensor decoded at a time)
    else:
        with written_to(data):
            report.imported = place(out, matches, tensors, store=data.stored, decoded=decoded)
    if plan is not None:
        fused.share(out, plan, data=data)
    for row in report.imported:  # (a fused weight's decode is read as stored; the report says how the model reads it)
        row.orientation = orientations.get(row.weight, row.orientation)
    report.left_float = [(w.name, w.shape) for w in weights.values() if w.name not in replaced]
    report.unused = unused(tensors, matches)  # (a 3-D tensor's experts: those no weight took)
    if emit != "dyndq":
        from dyndq.exporter import export_with_report

        out, exported = export(out) if export is not None else export_with_report(out, target=emit, consume=True)
        report.emitted = [f"written for {emit}: {exported.summary()}", *exported.lines()]
        report.forms = fused.confirm(out, report.forms, report.emitted)
    return out, report


def _opened(checkpoint, unpermute: bool) -> Checkpoint:
    """The checkpoint open (a path opened by its format's opener); unpermute=False with one opened
    already is refused, not ignored (its constructor took the choice)."""
    if not isinstance(checkpoint, Checkpoint):
        return open_checkpoint(checkpoint, unpermute=unpermute)
    if not unpermute and checkpoint.unpermute:
        raise ValidationError([Problem("unpermute", "False with a checkpoint opened already",
                                       f"{type(checkpoint).__name__}(path, unpermute=False), or the checkpoint's path")])
    return checkpoint


def _check_emit(emit: str, fuse: str = "exact") -> None:
    if emit not in EMITS:
        raise ValidationError([Problem("emit", repr(emit), ", ".join(EMITS))])
    if fuse not in FUSES:
        raise ValidationError([Problem("fuse", repr(fuse), ", ".join(FUSES))])


def _opset_needed(matches, tensors: dict) -> int:
    """The ai.onnx opset the decodes need (21; F16's BitCast 26), asked of the smallest matched
    tensor of each kind, decoded and let go (a kind's nodes are the same whatever its tensor):
    the float model is converted before any decode is placed, so the decodes, made one at a time
    as they are placed, are not all held to learn it."""
    smallest: dict = {}
    for m in matches:
        t = tensors[m.tensor]
        if t.kind not in smallest or t.nbytes < smallest[t.kind].nbytes:
            smallest[t.kind] = t
    with written_to(_Nowhere()):  # (the probe's tensors kept nowhere: its nodes are all it is asked for)
        return max([21] + [t.nodes().opset for t in smallest.values()])


class _Nowhere:
    """A data file that keeps nothing (writer.written_to's): each tensor's bytes passed by, a few
    rows at a time, its stub returned."""

    def stored_bytes(self, name: str, data_type: int, dims, chunks) -> onnx.TensorProto:
        for _ in chunks:
            pass
        return onnx.TensorProto(name=name, data_type=data_type, dims=list(dims))


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
                unpermute: bool = True, fuse: str = "exact") -> ImportReport:
    """Import into the model file `src` and write `dst` (as the input was stored: its external data
    in a file beside it when it had one, or when too big for one message), staged and checked
    (`dyndq.written.verify_model`: `dyndq check`, and it loads on the engine `emit` is for) before
    it is put in place; `dst` naming `src` is refused unless `overwrite`.

    Streamed from a model with external data (every emit): the model is read without its
    data, the weights kept are copied to the new data file one at a time, the weights replaced
    are never read (but for the by-shape matching: each candidate read once), and each checkpoint
    tensor is read, decoded and written to the new data file before the next; for an emit other
    than dyndq to a scratch file beside it, which the export reads one tensor at a time, writing
    what it makes to the new data file as it goes (streamed.py; docs/import.md: the memory it
    takes)."""
    from dyndq.atomic_writes import ModelFileError, check_target, same_file, staged_write
    from dyndq.checkpoints.streamed import ReadableDataFile, exported_streamed
    from dyndq.model_files import Moved, needs_external_data, read_model, write_staged
    from dyndq.written import verify_model

    _check_emit(emit, fuse)
    check_target(dst)
    if not overwrite and same_file(src, dst):
        raise ModelFileError(f"{dst}: is the input model itself; write to another file")
    loaded = read_model(src, load_data=False)  # (the model's graph: its data read as needed, or whole below)
    names_map = _names(names)
    ckpt = _opened(checkpoint, unpermute)
    if loaded.external_data:
        with staged_write(dst, external_data=True) as stage:
            # (emit dyndq: the decodes go to the new data file itself; another emit: to a scratch file
            # beside it, which the export reads a tensor at a time, writing the new file: streamed.py)
            location = stage.location if emit == "dyndq" else stage.location + ".import"
            with open(os.path.join(stage.folder, location), "w+b") as f:
                data = ReadableDataFile(f, location, stage.folder)
                moved = Moved(loaded, data)
                export = None if emit == "dyndq" else lambda model: exported_streamed(model, emit, data, stage)
                out, report = _imported(loaded.model, ckpt, names_map, emit, loaded=loaded, data=data, fuse=fuse,
                                        export=export,
                                        before_placing=lambda model, replaced: _kept(model, replaced, moved, loaded))
            if location != stage.location:
                os.remove(os.path.join(stage.folder, location))
            onnx.save_model(out, stage.model, format="protobuf")  # (binary, whatever dst's name)
            del out
            report.notes += verify_model(stage.model, emit, shown_as=os.fspath(dst), source=os.fspath(src))
    else:  # (a model held in memory: an export to another form takes the model whole)
        if loaded.external_data:
            loaded = read_model(src)
        had_data = loaded.external_data
        out, report = _in_memory(loaded.model, ckpt, names_map, emit, fuse)  # (the model read here: ours to change)
        del loaded
        with staged_write(dst, external_data=needs_external_data(out, had_data)) as stage:
            write_staged(out, stage)
            del out
            report.notes += verify_model(stage.model, emit, shown_as=os.fspath(dst), source=os.fspath(src))
    report.data_file = stage.location
    return report


def _kept(model: onnx.ModelProto, replaced: set[str], moved, loaded) -> None:
    """Before the decodes are placed: each main-graph initializer kept copied to the new data file
    (`moved`, one at a time: its stub then points there), the weights replaced never read; any
    other tensor whose data is in the input's files (in a subgraph, a Constant's value) read into
    the model, whose new data file does not hold it."""
    from onnx import external_data_helper as h

    from dyndq.model_files import tensor_with_data

    for t in model.graph.initializer:
        if t.name not in replaced:
            moved.keep(t)
    for t in _tensors_beside_initializers(model, replaced):
        if h.uses_external_data(t):
            t.CopyFrom(tensor_with_data(t, loaded))
            t.data_location = onnx.TensorProto.DEFAULT
            del t.external_data[:]


def _tensors_beside_initializers(model: onnx.ModelProto, replaced: set[str]):
    """Every tensor of the model but the main graph's initializers and the Constant values replaced."""
    def of_nodes(nodes, main: bool):
        for n in nodes:
            if main and n.op_type == "Constant" and list(n.output) and n.output[0] in replaced:
                continue
            for a in n.attribute:
                if a.HasField("t"):
                    yield a.t
                yield from a.tensors
                if a.HasField("g"):
                    yield from of_graph(a.g)
                for g in a.graphs:
                    yield from of_graph(g)

    def of_graph(g):
        yield from g.initializer
        yield from of_nodes(g.node, False)

    yield from of_nodes(model.graph.node, True)
    for f in model.functions:
        yield from of_nodes(f.node, False)
