"""Writing files atomically: staged beside their target, moved into place by one rename.

A file is never left half-written: what a command writes goes to a staging file (or folder)
beside its target, named with the writer's process id, and is moved onto the target with
`os.replace` once whole (flushed to disk, checked when the caller asks).  `staged_write` does
so for a model and its one external data file (the data first, under a name no file has yet,
the model last: the model's rename is the one step that switches from old to new, and an
existing data file is never rewritten, other models may point into it); `write_atomically`
for one file; `write_together` for a file and the folder of files beside it, all or nothing.

An interrupted write (an error, Ctrl-C, SIGTERM: `_terminate_cleanly` turns SIGTERM into
SystemExit for the while) leaves the previous file untouched and removes its staging files;
ones left by a killed writer are removed by the next write to that name.  Only a regular file
(or a link to one) is replaced (`check_target` tells a command before its work).

`ModelFileError`, the error of every file dyndq reads or writes (dyndq.model_files, dyndq.npy),
is defined here, the lowest of them.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import tempfile
import threading
from dataclasses import dataclass


class ModelFileError(Exception):
    """A model file that cannot be read or written (missing, unreadable, not ONNX, unsafe)."""


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


def _fsync(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
