"""Reading and writing model files: external data included, writes atomic.

- `read_model(path)` loads a model with its external data and remembers where
  that data was; `load_model(path)` returns just the model.  ONNX's own loader
  refuses external data that points outside the model's folder (a `..` path,
  an absolute path or a symbolic link); we rely on that check and turn its
  error, like every other reason a file cannot be read, into `ModelFileError`.
- `save_model(model, path)` never leaves a half-written file: the model (and
  its external data file, when there is one) is written into a temporary folder
  beside the target, then moved into place with `os.replace`, the data first
  under a name no file has yet, and the model last: the model's rename is the one
  step that switches from old to new, and an existing data file is never
  rewritten (other models may point into it).  An interrupted save (an error,
  Ctrl-C, SIGTERM) leaves the previous file untouched and removes its staging
  files; ones left by a killed writer are removed by the next write.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from dataclasses import dataclass, field

import onnx
from onnx import external_data_helper

from dyndq.wording import a as article, first_line, plural

# A protobuf message cannot be serialized past 2 GiB; bigger models must keep
# their tensors in an external data file.
_PROTOBUF_LIMIT = 2**31 - 1


class ModelFileError(Exception):
    """A model file that cannot be read or written (missing, unreadable, not ONNX, unsafe)."""


@dataclass
class LoadedModel:
    model: onnx.ModelProto
    path: str
    external_data: bool = False  # whether some tensors were stored in external files
    locations: list[str] = field(default_factory=list)  # those files, relative to the model's folder


def read_model(path: str | os.PathLike, *, load_data: bool = True) -> LoadedModel:
    """Load a model file with its external data; raise ModelFileError with a plain reason.

    With `load_data=False` the external data stays on disk (its fields checked, the tensors
    pointing into it): `tensor_with_data(tensor, loaded)` reads one tensor's when needed."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a folder, not a model file")
    try:
        model = _read(path)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read it ({e.strerror or e})") from None
    except Exception as e:  # DecodeError, a JSON/text parse error, ...
        raise ModelFileError(f"{path}: not an ONNX model ({first_line(e)})") from None
    if not model.HasField("graph") or model.ir_version == 0:
        raise ModelFileError(f"{path}: not an ONNX model (no graph or no IR version in it)")
    tensors = [t for t in external_data_helper._get_all_tensors(model) if external_data_helper.uses_external_data(t)]
    locations = sorted({_location(t) for t in tensors})
    if tensors:
        for t in tensors:
            _check_external_fields(path, t)
        if not load_data:
            return LoadedModel(model, path, True, locations)
        folder = _data_folder(path)
        try:
            # ONNX checks here that each location is a regular file inside `folder`, and that
            # each tensor's offset and length lie within it.
            external_data_helper.load_external_data_for_model(model, folder)
        except onnx.checker.ValidationError as e:
            raise ModelFileError(f"{path}: refused: {first_line(e)}") from None
        except ValueError as e:  # an offset or length out of the file's range
            raise ModelFileError(f"{path}: its external data does not fit its file: {first_line(e)}") from None
        except OSError as e:
            raise ModelFileError(f"{path}: cannot read its external data ({e.strerror or e})") from None
    return LoadedModel(model, path, bool(tensors), locations)


def _read(path: str) -> onnx.ModelProto:
    """The model in the file, in ONNX's binary form (what dyndq writes and every engine reads),
    whatever its name ends in; else in the text form onnx.load infers from the name (.json,
    .txt, .textproto)."""
    try:
        return onnx.load(path, format="protobuf", load_external_data=False)
    except OSError:
        raise
    except Exception:  # noqa: BLE001 - not binary ONNX: the text forms' readers have their own errors
        return onnx.load(path, load_external_data=False)


def _data_folder(path: str) -> str:
    return os.path.dirname(os.path.realpath(path))  # (a link to a model: its data is beside the model itself)


def tensor_with_data(tensor: onnx.TensorProto, loaded: LoadedModel) -> onnx.TensorProto:
    """`tensor` itself when its data is in the model, else a copy holding its external data
    (read with ONNX's own checks, as `read_model` reads it: one tensor's bytes in memory)."""
    if not external_data_helper.uses_external_data(tensor):
        return tensor
    copy = onnx.TensorProto()
    copy.CopyFrom(tensor)
    with _reading_external_data(loaded):
        external_data_helper.load_external_data_for_tensor(copy, _data_folder(loaded.path))
    return copy


def tensor_array(tensor: onnx.TensorProto, loaded: LoadedModel):
    """A tensor's values as an array, its external data read (one tensor's bytes in memory,
    with ONNX's own checks)."""
    if not external_data_helper.uses_external_data(tensor):
        return onnx.numpy_helper.to_array(tensor)
    stub = onnx.TensorProto()
    stub.CopyFrom(tensor)  # (no data in it; older onnx loads the data into the tensor it is given)
    with _reading_external_data(loaded):
        return onnx.numpy_helper.to_array(stub, base_dir=_data_folder(loaded.path))


@contextlib.contextmanager
def _reading_external_data(loaded: LoadedModel):
    """ONNX's errors reading external data, as ModelFileError naming the model."""
    try:
        yield
    except onnx.checker.ValidationError as e:
        raise ModelFileError(f"{loaded.path}: refused: {first_line(e)}") from None
    except ValueError as e:
        raise ModelFileError(f"{loaded.path}: its external data does not fit its file: {first_line(e)}") from None
    except OSError as e:
        raise ModelFileError(f"{loaded.path}: cannot read its external data ({e.strerror or e})") from None


def model_of(model, what: str) -> onnx.ModelProto:
    """The model itself, or the model in a file when given a path (every whole-model operation
    takes either)."""
    if isinstance(model, (str, os.PathLike)):
        return load_model(model)
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"{what}() takes an onnx.ModelProto or a file path, not {type(model).__name__}")
    return model


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """The model in a file, with its external data loaded."""
    return read_model(path).model


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    external_data: bool = False,
    location: str | None = None,
    check=None,
) -> str | None:
    """Write `model` to `path` atomically; the model passed in is not modified.

    `check`, when given, is called with the path of the file written in its staging place (its
    external data beside it) before it is moved onto `path`; what it raises leaves `path` as it
    was (`dyndq.written.verify_model` is the check every command makes).

    With `external_data=True` (or when the model is too big for one protobuf
    message), tensors go to one file beside the model, named `location`
    (default: the model's file name + ".data").  A data file is never rewritten:
    when one of that name exists (other models may point into it, a copy of the
    model made before, say), the data goes to a new name (`NAME.1.data`, ...)
    and the old file is left as it is.  Returns the data file's name, or None.

    `path` must be a new path or a regular file; a symbolic link to a regular
    file is written through.
    """
    with staged_write(path, external_data=needs_external_data(model, external_data), location=location) as stage:
        write_staged(model, stage)
        if check is not None:
            check(stage.model)
    return stage.location


def needs_external_data(model: onnx.ModelProto, asked: bool = False) -> bool:
    """Whether `model` is saved with external data: when asked, or when it is too big for one
    protobuf message."""
    return asked or _too_big_for_one_message(model)


def write_staged(model: onnx.ModelProto, stage: Stage) -> None:
    """Write `model` into its staging place (a `staged_write` block's Stage): its tensors of 1 KiB
    or more into the external data file when the stage has one."""
    try:
        # (the model passed in is never modified: with external data a light copy is written)
        out = _with_tensors_out(model, stage.folder, stage.location) if stage.location else model
        onnx.save_model(out, stage.model, format="protobuf")  # (binary whatever the name: onnx would write
        # a .json or .txt as text, which no engine loads)
    except OSError as e:
        raise ModelFileError(f"{stage.path}: cannot write it ({e.strerror or e})") from None
    except ValueError as e:  # protobuf: message too large, ...
        raise ModelFileError(f"{stage.path}: cannot write it ({first_line(e)})") from None


@dataclass
class Stage:
    """Where a model being written goes before it is moved into place: write the model to
    `model` and its external data (if any) to folder/location."""

    folder: str
    model: str
    location: str | None
    path: str  # where the model goes in the end


@contextlib.contextmanager
def staged_write(path: str | os.PathLike, *, external_data: bool, location: str | None = None):
    """Write a model (and its one external data file) atomically: yields a `Stage` in a
    staging folder beside `path`; on leaving the block the data file is moved in under a
    name no file has yet (`location`, default the model's name + ".data", or NAME.1.data ...
    when that exists: other models may point into it), then the model onto `path`.  An error
    or an interrupt inside the block leaves `path` as it was and no staging file behind."""
    path = _writable_target(os.fspath(path))
    folder, name = os.path.split(path)
    location = location or name + ".data"
    if external_data:
        if os.path.isabs(location) or os.path.dirname(os.path.normpath(location)):
            raise ModelFileError(f"{location}: the external data file must be a plain file name beside the model")
        location = _unused_name(folder, location)
    _remove_stale_staging(folder, name)
    placed: str | None = None  # the new data file, once moved into the folder
    with _terminate_cleanly():
        try:
            staging = tempfile.mkdtemp(prefix=_staging_prefix(name), suffix=".tmp", dir=folder)
        except OSError as e:
            raise ModelFileError(f"{path}: cannot write there ({e.strerror or e})") from None
        try:
            staged = os.path.join(staging, name)
            yield Stage(staging, staged, location if external_data else None, path)  # (the caller writes)
            try:
                for f in os.listdir(staging):
                    _fsync(os.path.join(staging, f))
                if external_data and os.path.exists(os.path.join(staging, location)):
                    # A new name nothing refers to yet; the model's rename below is then the one
                    # step that switches from the old model (and its data, untouched) to the new.
                    placed = os.path.join(folder, location)
                    os.replace(os.path.join(staging, location), placed)
                os.replace(staged, path)
                placed = None
                _fsync_folder(folder)
            except OSError as e:
                raise ModelFileError(f"{path}: cannot write it ({e.strerror or e})") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            if placed is not None:  # the model was not replaced: its new data file has no reader
                _remove_quietly(placed)


def _too_big_for_one_message(model: onnx.ModelProto) -> bool:
    """Whether the model's initializers near protobuf's 2 GiB limit (counted from dims and
    dtypes: ByteSize() would serialize the whole model to count it). 64 MiB are left for the
    rest of the model."""
    from dyndq.plumbing.light import nbytes

    return sum(nbytes(t) for t in model.graph.initializer) > _PROTOBUF_LIMIT - (64 << 20)


def _with_tensors_out(model: onnx.ModelProto, folder: str, location: str) -> onnx.ModelProto:
    """A copy of `model` whose initializers of 1 KiB or more are written to folder/location and
    point there, their bytes never copied into the new model.

    What onnx.save_model(save_as_external_data=True) does, by the same rule (initializers with
    raw data of 1 KiB or more, every one into one file), less two costs: it works on a full copy
    of the model (twice its size in memory, three times with the bytes it writes), and it
    refuses when a file named `location` exists relative to the *current* folder rather than
    the model's (so re-running an export from the model's own folder failed, onnx 1.23)."""
    from dyndq.plumbing.light import copy_fields

    out = onnx.ModelProto()
    copy_fields(model, out, skip={"graph"})
    copy_fields(model.graph, out.graph, skip={"initializer"})
    with open(os.path.join(folder, location), "wb") as f:
        data = DataFile(f, location)
        for t in model.graph.initializer:
            data.add(out.graph, t)
    return out


class DataFile:
    """One external data file being written, a tensor at a time: `add(graph, tensor)` appends
    to the graph's initializers `stored(tensor)`: the tensor itself when it is small (under
    1 KiB) or holds no raw data, else a stub pointing at its bytes, written to the file (the
    bytes never copied into the graph)."""

    def __init__(self, f, location: str):
        self.file, self.location = f, location

    def add(self, graph: onnx.GraphProto, tensor: onnx.TensorProto) -> None:
        graph.initializer.append(self.stored(tensor))

    def stored(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """What stands in a graph for `tensor` written so (see the class doc)."""
        from dyndq.plumbing.light import copy_fields, nbytes

        if not (tensor.HasField("raw_data") and nbytes(tensor) >= 1024):
            return tensor
        stub = onnx.TensorProto()
        copy_fields(tensor, stub, skip={"raw_data", "external_data", "data_location"})
        offset = self.file.tell()
        data = tensor.raw_data  # (one tensor's bytes at a time)
        self.file.write(data)
        del data
        stub.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(self.file.tell() - offset))):
            stub.external_data.add(key=key, value=value)
        return stub


def _unused_name(folder: str, location: str) -> str:
    """`location`, or when a file of that name exists in `folder`, NAME.1.data, NAME.2.data, ..."""
    if not os.path.lexists(os.path.join(folder, location)):
        return location
    stem = location[: -len(".data")] if location.endswith(".data") else location
    k = 1
    while os.path.lexists(os.path.join(folder, f"{stem}.{k}.data")):
        k += 1
    return f"{stem}.{k}.data"


def _writable_target(path: str) -> str:
    """The file to replace for `path`: itself, or the regular file a symbolic link points to.

    Anything else is refused: replacing a FIFO, a device (/dev/null, /dev/stdout) or a
    folder with a regular file would change what the path is, not write to it; so is a path
    that names a folder by its form ("out/", "out/.", ".."), which abspath would turn into a file
    named like the folder."""
    if os.path.basename(path) in ("", ".", ".."):
        raise ModelFileError(f"{path}: names a folder, not a file; give the path of the file to write "
                             f"(e.g. {os.path.join(path, 'model.onnx')})")
    absolute = os.path.abspath(path)
    target = os.path.realpath(absolute)
    if os.path.islink(absolute) and not os.path.lexists(target):
        raise ModelFileError(f"{path}: is a symbolic link to {target}, which does not exist")
    if os.path.lexists(target):
        mode = os.stat(target).st_mode
        if stat.S_ISDIR(mode):
            raise ModelFileError(f"{path}: is a folder")
        if not stat.S_ISREG(mode):
            raise ModelFileError(f"{path}: is {_kind(mode)}, not a regular file; give a file path to write")
    if not os.path.isdir(os.path.dirname(target)):
        raise ModelFileError(f"{path}: its folder does not exist")
    return target


def check_target(path: str | os.PathLike) -> None:
    """Refuse (ModelFileError) a path no file can be written to, as a write would: for a command
    to tell before its work, not after it."""
    _writable_target(os.fspath(path))


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether the two paths name one file (the same path, a link to it, a hard link)."""
    a, b = os.fspath(a), os.fspath(b)
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # (one of them does not exist)
        return False


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "a special file"


def _staging_prefix(name: str) -> str:
    # The writer's process id is in the name, so a later write can tell a staging file
    # left by a killed writer (SIGKILL, power loss) from one still in use.
    return f".{name}.{os.getpid()}."


def _remove_stale_staging(folder: str, name: str) -> None:
    """Remove staging files and folders for `name` left by writers that no longer run."""
    prefix = f".{name}."
    try:
        entries = os.listdir(folder)
    except OSError:
        return
    for entry in entries:
        if not (entry.startswith(prefix) and entry.endswith(".tmp")):
            continue
        pid = entry[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            full = os.path.join(folder, entry)
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full, ignore_errors=True)
            else:
                _remove_quietly(full)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it runs, as another user
        return True
    return True


@contextlib.contextmanager
def _terminate_cleanly():
    """Within this block SIGTERM ends the process through SystemExit (code 143, as the signal
    would), so `finally` blocks remove the staging files, as they do on KeyboardInterrupt.
    Only in the main thread (Python runs signal handlers there), and only when the signal has
    its default action: a handler the program installed is left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def make_folders(path: str | os.PathLike) -> list[str]:
    """Create the folder `path` and its missing parents; returns those it created, outermost
    first (none when it existed), for `remove_empty_folders` to take back."""
    created = []
    folder = os.path.abspath(os.fspath(path))
    while not os.path.exists(folder):
        created.insert(0, folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        remove_empty_folders(created)
        raise
    return created


def remove_empty_folders(created: list[str]) -> None:
    """Remove the folders `make_folders` created, innermost first, as long as they are empty
    (a folder someone else wrote into is left, with its parents)."""
    for folder in reversed(created):
        try:
            os.rmdir(folder)
        except OSError:
            return


def save_array(path: str | os.PathLike, array) -> None:
    """`numpy.save` to exactly `path` (no ".npy" added), atomically; the file gets the mode a
    new file gets (0666 less the umask), as models do."""
    import numpy as np

    write_atomically(path, lambda f: np.save(f, np.asarray(array), allow_pickle=False))


class NpyNameClash(ModelFileError):
    """Two arrays whose .npy files would have one name (names equal but for case)."""


_UNSAFE_IN_FILE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def _file_stem(name: str) -> str:
    safe = _UNSAFE_IN_FILE_NAME.sub("_", name)
    return "_" + safe[1:] if safe.startswith(".") else safe  # no hidden files, no "." or ".."


def npy_files(folder: str, arrays: dict) -> list[tuple[str, str, object]]:
    """(what, path, array) for each array to save in `folder`: NAME.npy for an array, NAME.I.npy
    for item I of a list of arrays (a sequence output), nothing for None; NAME cleaned of
    characters unsafe in a file name. A cleaned name that meets another array's file name gets
    a short hash of the whole name added ('a/b' and 'a_b', two non-ASCII names of one length), so
    each array keeps a file of its own. Two that still meet (names equal but for case, which some
    file systems do not tell apart) are refused (NpyNameClash) before anything is written."""
    items = []
    for name, value in arrays.items():
        if isinstance(value, list):
            items += [(f"{name}[{i}]", f"{name}.{i}", v) for i, v in enumerate(value)]
        elif value is not None:
            items.append((name, name, value))
    stems = [_file_stem(raw) for _, raw, _ in items]
    counts: dict[str, int] = {}
    for stem in stems:
        counts[stem.casefold()] = counts.get(stem.casefold(), 0) + 1
    files, taken = [], {}
    for (label, raw, array), stem in zip(items, stems):
        if stem != raw and counts[stem.casefold()] > 1:
            import hashlib

            stem = f"{stem}-{hashlib.sha256(raw.encode('utf-8', 'surrogatepass')).hexdigest()[:8]}"
        key = stem.casefold()
        if key in taken:
            raise NpyNameClash(f"{folder}: outputs {taken[key]!r} and {label!r} would both be "
                               f"saved as {stem}.npy; rename one of them in the model")
        taken[key] = label
        files.append((label, os.path.join(folder, stem + ".npy"), array))
    return files


def npy_inputs(folders: list[str], names: list[str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The .npy file of each input in `names`, as `npy_files` names it (NAME.npy, as `dyndq run
    --output-dir` and `import-onednn --inputs-dir` write them), from the first of `folders` that
    holds one; and the (folder, file) of each .npy file there that is for no input. A folder that
    does not exist, or inputs with no file in any of them (every one named at once), raise
    ModelFileError. Read the files with `read_array`."""
    import numpy as np

    for folder in folders:
        if not os.path.isdir(folder):
            raise ModelFileError(f"{folder}: no such folder")
    found, known = {}, set()
    for folder in folders:
        files = {label: path for label, path, _ in npy_files(folder, {n: np.empty(0) for n in names})}
        known |= {os.path.abspath(p) for p in files.values()}
        found.update({n: files[n] for n in names if n not in found and os.path.isfile(files[n])})
    missing = [n for n in names if n not in found]
    if missing:
        raise ModelFileError(f"{', '.join(folders)}: no file for {plural(len(missing), 'input')}: " +
                             ", ".join(f"{n} ({npy_files('', {n: np.empty(0)})[0][1]})" for n in missing))
    unused = [(folder, extra) for folder in folders
              for extra in sorted(f for f in os.listdir(folder) if f.endswith(".npy"))
              if os.path.abspath(os.path.join(folder, extra)) not in known]
    return {n: found[n] for n in names}, unused


def check_writable(folder: str) -> list[str]:
    """Create `folder` if needed and make sure a file can be written in it (ModelFileError if
    not); returns the folders it created, outermost first (see `make_folders`)."""
    created = []
    try:
        created = make_folders(folder)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        remove_empty_folders(created)
        raise ModelFileError(f"{folder}: cannot write there ({e.strerror or e})") from None
    return created


def write_atomically(path: str | os.PathLike, write, check=None) -> None:
    """`write(binary file)` to a staging file beside `path`, then one rename onto it: `path` is
    never half-written, only a regular file (or a link to one) is replaced, and the file gets
    the mode a new file gets (0666 less the umask).  `check(staged path)`, when given, is called
    before the rename; what it raises leaves `path` as it was."""
    path = _writable_target(os.fspath(path))
    folder, name = os.path.split(path)
    _remove_stale_staging(folder, name)
    with _terminate_cleanly():
        try:
            fd, tmp = tempfile.mkstemp(prefix=_staging_prefix(name), suffix=".tmp", dir=folder)
        except OSError as e:
            raise ModelFileError(f"{path}: cannot write there ({e.strerror or e})") from None
        try:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            if check is not None:
                check(tmp)
            os.replace(tmp, path)
        except OSError as e:
            raise ModelFileError(f"{path}: cannot write it ({e.strerror or e})") from None
        finally:
            _remove_quietly(tmp)


def write_together(path: str | os.PathLike, write, folder: str | os.PathLike, files: dict, check=None) -> list[str]:
    """`write(binary file)` to `path` and `files[name](binary file)` to folder/name for each name,
    all or nothing (a graph and the arrays beside it).  Every file is written to a staging folder
    first; then the folder's files are moved in (the folder is made when it is missing, in one
    rename; a file of the same name is replaced, other files are left alone) and `path` last.  An
    error or an interrupt at any step leaves `path` and the folder as they were (files replaced
    are put back, a folder made is removed) and no staging file behind.  Returns the paths written
    into the folder (as `folder` names them).  `check(staged path, staged folder)`, when given, is
    called once every file is staged, before anything is moved; what it raises leaves both as
    they were."""
    target = _writable_target(os.fspath(path))
    given, folder = os.fspath(folder), os.path.realpath(os.path.abspath(os.fspath(folder)))
    for name in files:
        if not name or name in (".", "..") or os.path.basename(name) != name:
            raise ModelFileError(f"{name!r}: not a plain file name (for {folder})")
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise ModelFileError(f"{folder}: is not a folder")
    if not os.path.isdir(os.path.dirname(folder)):
        raise ModelFileError(f"{folder}: its folder does not exist")
    existing = os.path.isdir(folder)
    dests = [_writable_target(os.path.join(folder, n)) if existing else os.path.join(folder, n) for n in files]
    places = [os.path.split(target), os.path.split(folder)]  # (folder, name): staging beside each
    for where, name in places:
        _remove_stale_staging(where, name)
    stagings: list[str] = []
    undo: list = []  # steps that put back what was there, run last first on a failure
    with _terminate_cleanly():
        try:
            for where, name in places:
                stagings.append(tempfile.mkdtemp(prefix=_staging_prefix(name), suffix=".tmp", dir=where))
            staged, staged_files = os.path.join(stagings[0], "file"), stagings[1]
            _write_new(staged, write, os.fspath(path))
            for name, write_one in files.items():
                _write_new(os.path.join(staged_files, name), write_one, os.path.join(given, name))
            if check is not None:
                check(staged, staged_files)
            if not existing:  # the folder and its files appear at once
                os.chmod(staged_files, 0o777 & ~_umask())
                os.rename(staged_files, folder)
                stagings.pop()
                undo.append(lambda: shutil.rmtree(folder, ignore_errors=True))
            else:
                replaced = os.path.join(stagings[0], "replaced")
                os.mkdir(replaced)
                for name, dest in zip(files, dests):
                    kept = _keep(dest, os.path.join(replaced, name))
                    os.replace(os.path.join(staged_files, name), dest)
                    undo.append(lambda dest=dest, kept=kept: os.replace(kept, dest) if kept else _remove_quietly(dest))
            os.replace(staged, target)
            _fsync_folder(folder)
            _fsync_folder(os.path.dirname(target))
        except BaseException as e:
            for step in reversed(undo):
                with contextlib.suppress(OSError):
                    step()
            if isinstance(e, OSError):
                raise ModelFileError(f"{e.filename or path}: cannot write it ({e.strerror or e})") from None
            raise
        finally:
            for staging in stagings:
                shutil.rmtree(staging, ignore_errors=True)
    return [os.path.join(given, name) for name in files]


def _write_new(path: str, write, meant: str) -> None:
    """`write(binary file)` to a new file (mode 0666 less the umask), flushed to disk; an OSError
    names `meant`, the file it is staged for."""
    try:
        with open(path, "xb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), meant) from None


def _keep(path: str, copy: str) -> str | None:
    """A copy of the file at `path` (a hard link where the file system allows), or None when
    there is none."""
    if not os.path.lexists(path):
        return None
    try:
        os.link(path, copy)
    except OSError:
        shutil.copy2(path, copy)
    return copy


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _fsync_folder(folder: str) -> None:
    """Make the renames in `folder` durable (where the platform allows opening a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _check_external_fields(path: str, tensor: onnx.TensorProto) -> None:
    """An offset or length must be a non-negative decimal integer (ONNX's loader raises a bare
    int() ValueError on "abc" or "1e3", naming neither the tensor nor the field)."""
    for entry in tensor.external_data:
        if entry.key in ("offset", "length") and not (entry.value.isascii() and entry.value.isdigit()):
            raise ModelFileError(f"{path}: tensor {tensor.name!r}: external data {entry.key} {entry.value!r} "
                                 "is not a non-negative whole number")


def read_array(path: str | os.PathLike):
    """The array in a .npy file, refusing (ModelFileError) anything else: a missing file, a
    folder, an .npz archive, pickled objects, or a header that declares more data than the
    file holds (numpy would try to allocate it first: a MemoryError for a huge shape)."""
    import numpy as np
    from numpy.lib import format as npy

    path = os.fspath(path)
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a folder, not a .npy file")
    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such file")
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
            if magic != b"\x93NUMPY":
                what = "an .npz archive; give one array per .npy file" if magic.startswith(b"PK") else "not a .npy file"
                raise ModelFileError(f"{path}: {what}")
            f.seek(0)
            version = npy.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = npy.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = npy.read_array_header_2_0(f)
            else:  # 3.0 (utf-8 field names) has no public reader
                shape, fortran, dtype = npy._read_array_header(f, version)
            if dtype.hasobject:
                raise ModelFileError(f"{path}: cannot read it: it holds Python objects (pickled), which are not loaded")
            need = int(np.prod(shape, dtype=object)) * dtype.itemsize
            have = os.fstat(f.fileno()).st_size - f.tell()
            if need > have:
                raise ModelFileError(f"{path}: cannot read it: its header declares {article(dtype.name)} array of shape {list(shape)} "
                                     f"({need} bytes) but the file holds {have} bytes of data")
            f.seek(0)
            return np.load(f, allow_pickle=False)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read it ({e.strerror or e})") from None
    except (ValueError, EOFError) as e:
        raise ModelFileError(f"{path}: cannot read it ({first_line(e)})") from None


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def _fsync(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
