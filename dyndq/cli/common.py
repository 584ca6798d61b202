"""What the commands share: the Command record, the stdout that survives a closed pipe, loading
and saving models as they came, the .npy files they write and read. The helpers that are not
about the command line (naming .npy files, reading them, summaries, the schema as text, an
engine's error in one line) live in the API: dyndq.model_files, dyndq.atomic_writes, dyndq.npy,
dyndq.arrays, dyndq.schema, dyndq.wording."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from dyndq.cli.exits import UsageError


@dataclass(frozen=True)
class Command:
    """One command: its name, what adds its parser to the subparsers, what runs it (parsed
    arguments -> exit code; a failure is raised, for `exits.tell`), and the argument naming the
    file whose problems a ValidationError tells (None: the command reads no model)."""

    name: str
    add_parser: Callable[[argparse._SubParsersAction], None]
    run: Callable[[argparse.Namespace], int]
    subject: str | None = None


class UntilClosed:
    """A text stream that writes to `inner` until its reader goes away (EPIPE), then drops
    what is printed, so a closed pipe stops the printing but never the work (the outputs and
    files a command writes). The file descriptor is pointed at os.devnull then, so the
    interpreter's last flush at exit does not fail either."""

    def __init__(self, inner):
        self._inner = inner
        self._closed = False

    def write(self, text: str) -> int:
        if not self._closed:
            try:
                return self._inner.write(text)
            except BrokenPipeError:
                self._close()
        return len(text)

    def flush(self) -> None:
        if not self._closed:
            try:
                self._inner.flush()
            except BrokenPipeError:
                self._close()

    def _close(self) -> None:
        self._closed = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._inner.fileno())
            os.close(devnull)
        except (OSError, AttributeError, ValueError):  # not a real file (a test's capture)
            pass

    def __getattr__(self, name):
        return getattr(self._inner, name)


def load(path: str):
    """The model file at `path` with its external data (dyndq.model_files.LoadedModel); one that cannot
    be read raises ModelFileError, a usage error. (dyndq.model_files, which imports onnx, is imported
    when a command runs, not when the parser is built.)"""
    from dyndq.model_files import read_model

    return read_model(path)


def refuse_same_file(given: str, output: str, overwrite: bool | None = None) -> None:
    """OUT naming IN itself (the same path, a link to it) is refused: a model passed in is never
    modified, unless --overwrite (`overwrite` True) asks for it; a command without that flag
    (`overwrite` None: OUT is of another format than IN) refuses it always.  Also refused before
    any work: an OUT no file can be written to (a folder, "out/", a device)."""
    from dyndq.atomic_writes import ModelFileError, check_target, same_file

    check_target(output)
    if not overwrite and same_file(given, output):
        if overwrite is None:
            raise ModelFileError(f"{output}: is the input itself; write to another file")
        raise ModelFileError(f"{output}: is the input model itself; write to another file, or add --overwrite "
                             "to replace it")


def save(handed: list, path: str, loaded, form: str) -> list[str]:
    """Save the model `handed` holds (a list of one, emptied here: with no other reference left,
    the model's memory goes back once it is written, before the file is loaded on its engine) as
    the input was saved (with external data or not), checked as written for `form` before it is
    put in place (dyndq.written); returns notes to print."""
    from dyndq.model_files import needs_external_data, write_staged
    from dyndq.atomic_writes import staged_write
    from dyndq.written import verify_model

    model = handed.pop()
    with staged_write(path, external_data=needs_external_data(model, loaded.external_data)) as stage:
        write_staged(model, stage)
        del model
        notes = verify_model(stage.model, form, shown_as=path, source=loaded.path)
    location = stage.location
    same = os.path.realpath(path) == os.path.realpath(loaded.path)
    return data_notes(location, [loc for loc in loaded.locations if loc != location] if same else []) + [
        f"  note: {note}" for note in notes]


def data_notes(location: str | None, kept: list[str]) -> list[str]:
    """What became of the external data: the file written (if any), and the data files of the
    model a write replaced, which are kept (a copy of the model made before may point into them:
    never ours to delete)."""
    notes = []
    if location is not None:
        notes.append(f"  its tensors are in {location}, beside it")
    if kept:
        notes.append(f"  kept {', '.join(kept)}, the data of the model it replaced: other copies of that "
                     "model may point into it; delete it when none does")
    return notes


def parse_inputs(specs: list[str]) -> dict[str, np.ndarray]:
    from dyndq.atomic_writes import ModelFileError
    from dyndq.npy import read_array

    feeds: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UsageError(f"--input {spec!r}: expected NAME=FILE.npy")
        if name in feeds:
            raise UsageError(f"--input {spec!r}: input {name!r} given twice")
        try:
            feeds[name] = read_array(path)
        except ModelFileError as e:
            raise UsageError(f"--input {spec!r}: {e}") from None
    return feeds


def emit_help() -> str:
    """--emit's words for our op and each engine of the table (quantize, import-weights)."""
    from dyndq.converters.engines import ENGINES

    return "dyndq: DynamicDequantize (default); " + "; ".join(f"{e.name}: {e.writes}" for e in ENGINES.values())


def _stem(path: str) -> str:
    return os.path.basename(path)[: -len(".npy")]


def say_saved(path: str, value: np.ndarray, label: str | None = None, *, raw_bytes_note: bool = False) -> None:
    """"wrote PATH: DTYPE[SHAPE]" (with the output's name when the file's differs), and, with
    raw_bytes_note, how to read back the dtypes NumPy stores as raw bytes."""
    print(f"wrote {path}: {value.dtype.name}{list(value.shape)}  ({label})" if label and label != _stem(path)
          else f"wrote {path}: {value.dtype.name}{list(value.shape)}")
    if raw_bytes_note and value.dtype.kind == "V":  # ml_dtypes' int4, uint4, bfloat16: bytes only
        print(f"  note: NumPy stores {value.dtype.name} as raw bytes: dyndq run reads it back as "
              f"the input's dtype; in Python, numpy.load(path).view(ml_dtypes.{value.dtype.name})")


def output_files(folder: str, arrays: dict) -> list[tuple[str, str, np.ndarray]]:
    """(what, path, array) for each array to save in `folder` (files.npy_files names them)."""
    from dyndq.npy import NpyNameClash, npy_files

    try:
        return npy_files(folder, arrays)
    except NpyNameClash as e:
        raise UsageError(f"--output-dir {e}") from None
