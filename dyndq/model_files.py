"""Reading and writing model files, external data included.

- `read_model(path)` loads a model with its external data and remembers where
  that data was; `load_model(path)` returns just the model.  ONNX's own loader
  refuses external data that points outside the model's folder (a `..` path,
  an absolute path or a symbolic link); we rely on that check and turn its
  error, like every other reason a file cannot be read, into `ModelFileError`.
  With `load_data=False` the data stays on disk and `tensor_with_data` /
  `tensor_array` read one tensor's at a time.
- `save_model(model, path)` writes the model (its tensors of 1 KiB or more into
  one external data file, when asked or when it is too big for one protobuf
  message: `DataFile`, one tensor at a time) through `staged_write`
  (dyndq.atomic_writes): never a half-written file, never an existing data file
  rewritten.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

import onnx
from onnx import external_data_helper

from dyndq.atomic_writes import ModelFileError, Stage, staged_write
from dyndq.wording import first_line


# A protobuf message cannot be serialized past 2 GiB; bigger models must keep
# their tensors in an external data file.
_PROTOBUF_LIMIT = 2**31 - 1


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
    locations = sorted({external_entry(t, "location") for t in tensors})
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
        data = tensor.raw_data  # (one tensor's bytes at a time)
        self._point(stub, [data])
        del data
        return stub

    def stored_bytes(self, name: str, data_type: int, dims, chunks) -> onnx.TensorProto:
        """The stub of a tensor `name` of ONNX type `data_type` and `dims` whose raw bytes are
        `chunks` (bytes-like objects, in order: a C-contiguous array's `.data`, or a few rows of
        one at a time), written straight from them: a tensor made to be written here never holds
        its bytes in a TensorProto (whose raw_data protobuf hands out as a copy)."""
        stub = onnx.TensorProto(name=name, data_type=data_type, dims=list(dims))
        self._point(stub, chunks)
        return stub

    def _point(self, stub: onnx.TensorProto, chunks) -> None:
        offset = self.file.tell()
        for data in chunks:
            self.file.write(data)
        stub.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(self.file.tell() - offset))):
            stub.external_data.add(key=key, value=value)


class Moved:
    """Tensors moved from a model read without its external data (`loaded`) to a new external data
    file (`data`, a DataFile), one at a time: `put(tensor)` writes a tensor (its data read from
    `loaded`'s files when it points there) and returns its stub; `keep(tensor)` does so to a
    tensor of the graph in place.  What is in memory at once is one tensor's bytes.  With no
    `data`, `put` returns the tensor as it is (a model kept in memory).  quantize's store
    (`quantization.quantizer.Tensors`) and the checkpoint import write through it."""

    def __init__(self, loaded: LoadedModel | None = None, data: DataFile | None = None):
        self.loaded, self.data = loaded, data

    def put(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        if self.data is None:
            return tensor
        return self.data.stored(tensor if self.loaded is None else tensor_with_data(tensor, self.loaded))

    def keep(self, tensor: onnx.TensorProto) -> None:
        stored = self.put(tensor)
        if stored is not tensor:
            tensor.CopyFrom(stored)


def _check_external_fields(path: str, tensor: onnx.TensorProto) -> None:
    """An offset or length must be a non-negative decimal integer (ONNX's loader raises a bare
    int() ValueError on "abc" or "1e3", naming neither the tensor nor the field)."""
    for entry in tensor.external_data:
        if entry.key in ("offset", "length") and not (entry.value.isascii() and entry.value.isdigit()):
            raise ModelFileError(f"{path}: tensor {tensor.name!r}: external data {entry.key} {entry.value!r} "
                                 "is not a non-negative whole number")


def external_entry(tensor: onnx.TensorProto, key: str) -> str:
    """The value of one of a tensor's external_data entries ("location", "offset", "length"), "" when absent."""
    return next((e.value for e in tensor.external_data if e.key == key), "")
