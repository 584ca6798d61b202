"""Arrays in .npy files: the file each named array gets, and reading one back safely.

`npy_files` names the file of each array (an output of `dyndq run --output-dir`, an input of
`import-onednn --inputs-dir`): NAME.npy, cleaned of characters unsafe in a file name, with a
short hash where two cleaned names meet, refused where they differ only in case; `npy_inputs`
finds those of a model's inputs; `save_array` writes one atomically (dyndq.atomic_writes);
`read_array` reads one, refusing anything that is not a plain .npy array.
"""
from __future__ import annotations

import os
import re

from dyndq.atomic_writes import ModelFileError, write_atomically
from dyndq.wording import a as article, first_line, plural


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
