"""Reading and writing model files: external data included, writes atomic.

- `read_model(path)` loads a model with its external data and remembers where
  that data was; `load_model(path)` returns just the model.  ONNX's own loader
  refuses external data that points outside the model's folder (a `..` path,
  an absolute path or a symbolic link); we rely on that check and turn its
  error, like every other reason a file cannot be read, into `ModelFileError`.
- `save_model(model, path)` never leaves a half-written file: the model (and
  its external data file, when there is one) is written into a temporary folder
  beside the target, then moved into place with `os.replace`, the data first
  and the model last.  An interrupted save leaves the previous file untouched.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

import onnx
from onnx import external_data_helper

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


def read_model(path: str | os.PathLike) -> LoadedModel:
    """Load a model file with its external data; raise ModelFileError with a plain reason."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a folder, not a model file")
    try:
        model = onnx.load(path, load_external_data=False)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot read it ({e.strerror or e})") from None
    except Exception as e:  # DecodeError, a JSON/text parse error, ...
        raise ModelFileError(f"{path}: not an ONNX model ({_first_line(e)})") from None
    if not model.HasField("graph") or model.ir_version == 0:
        raise ModelFileError(f"{path}: not an ONNX model (no graph or no IR version in it)")
    tensors = [t for t in external_data_helper._get_all_tensors(model) if external_data_helper.uses_external_data(t)]
    locations = sorted({_location(t) for t in tensors})
    if tensors:
        folder = os.path.dirname(os.path.abspath(path))
        try:
            # ONNX checks here that each location is a regular file inside `folder`.
            external_data_helper.load_external_data_for_model(model, folder)
        except onnx.checker.ValidationError as e:
            raise ModelFileError(f"{path}: refused: {_first_line(e)}") from None
        except OSError as e:
            raise ModelFileError(f"{path}: cannot read its external data ({e})") from None
    return LoadedModel(model, path, bool(tensors), locations)


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """The model in a file, with its external data loaded."""
    return read_model(path).model


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    external_data: bool = False,
    location: str | None = None,
) -> None:
    """Write `model` to `path` atomically; the model passed in is not modified.

    With `external_data=True` (or when the model is too big for one protobuf
    message), tensors go to one file beside the model, named `location`
    (default: the model's file name + ".data"); it is replaced atomically too.
    """
    path = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(path)
    if not os.path.isdir(folder):
        raise ModelFileError(f"{path}: its folder does not exist")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a folder")
    external_data = external_data or model.ByteSize() > _PROTOBUF_LIMIT
    location = location or name + ".data"
    if external_data and (os.path.isabs(location) or os.path.dirname(os.path.normpath(location))):
        raise ModelFileError(f"{location}: the external data file must be a plain file name beside the model")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving with external data rewrites the tensors it moves
    try:
        staging = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot write there ({e.strerror or e})") from None
    try:
        staged = os.path.join(staging, name)
        if external_data:
            onnx.save_model(copy, staged, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=location, size_threshold=1024)
        else:
            onnx.save_model(copy, staged)
        files = sorted(os.listdir(staging))
        for f in files:
            _fsync(os.path.join(staging, f))
        for f in files:  # external data first, so the model never points at missing data
            if f != name:
                os.replace(os.path.join(staging, f), os.path.join(folder, f))
        os.replace(staged, path)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot write it ({e.strerror or e})") from None
    except ValueError as e:  # protobuf: message too large, ...
        raise ModelFileError(f"{path}: cannot write it ({_first_line(e)})") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def save_array(path: str | os.PathLike, array) -> None:
    """`numpy.save` to exactly `path` (no ".npy" added), atomically."""
    import numpy as np

    path = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot write there ({e.strerror or e})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, np.asarray(array), allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        raise ModelFileError(f"{path}: cannot write it ({e.strerror or e})") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def _fsync(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
