"""The streamed import's export: `--emit onnx|onnxruntime|openvino` from a model with external data,
one tensor at a time (docs/import.md, "Memory").

The import writes its decodes and the weights it keeps to a scratch data file beside the new one
(`ReadableDataFile`), the graph holding stubs of them.  The export (`dyndq.export`, its rules as
they are) then runs on that graph with its large tensors left on disk: a rule asking a
constant's value reads that one tensor from the scratch file, and each tensor a rule makes (a
MatMulNBits' packed B, codes re-encoded for an engine) is written to the new data file as it is
made (converters.walker.external_constants).  Last, every tensor the exported graph still reads
from the scratch file is copied into the new data file a few MiB at a time; the scratch file
goes.  What is in memory beyond the graph is one tensor and what a rule makes of it.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from dyndq.model_files import DataFile, external_entry

COPY_BYTES = 4 << 20  # the bytes copied at once from the scratch file to the new one


class ReadableDataFile(DataFile):
    """A DataFile (open for reading too) whose tensors can be read back, one at a time, while it is
    written: `read(tensor)` gives a stub's values (or a tensor's own), from `folder`."""

    def __init__(self, f, location: str, folder: str):
        super().__init__(f, location)
        self.folder = folder

    def read(self, tensor: onnx.TensorProto) -> np.ndarray:
        if not external_data_helper.uses_external_data(tensor):
            return numpy_helper.to_array(tensor)
        self.file.flush()
        stub = onnx.TensorProto()
        stub.CopyFrom(tensor)  # (no data in it; older onnx loads the data into the tensor it is given)
        return numpy_helper.to_array(stub, base_dir=self.folder)

    def raw(self, tensor: onnx.TensorProto) -> np.ndarray | None:
        """A tensor's bytes as stored in this file (uint8, read-only), mapped in place: the pages a
        caller touches are read, never the whole tensor at once into an array of its own (None: its
        data is not in this file)."""
        if not external_data_helper.uses_external_data(tensor) or external_entry(tensor, "location") != self.location:
            return None
        offset, length = int(external_entry(tensor, "offset") or 0), int(external_entry(tensor, "length"))
        if not length:
            return np.empty(0, np.uint8)
        self.file.flush()
        return np.memmap(self.file, np.uint8, mode="r", offset=offset, shape=(length,))


def exported_streamed(model: onnx.ModelProto, emit: str, scratch: ReadableDataFile, stage):
    """(the model exported for `emit`, its ExportReport): `model` (its large tensors stubs into
    `scratch`) exported with each constant read from `scratch` when a rule asks for it and each
    new tensor written to the stage's data file as it is made, then the tensors still read from
    `scratch` copied there (the caller removes `scratch`)."""
    from dyndq.converters.walker import external_constants
    from dyndq.exporter import export_with_report

    with open(os.path.join(stage.folder, stage.location), "wb") as f:
        data = DataFile(f, stage.location)
        with external_constants(scratch.read, data.stored, scratch.raw, data.stored_bytes):
            out, report = export_with_report(model, target=emit, consume=True)
        scratch.file.flush()
        for t in external_data_helper._get_all_tensors(out):
            if external_data_helper.uses_external_data(t) and external_entry(t, "location") == scratch.location:
                _copy(t, scratch, data)
    return out, report


def _copy(t: onnx.TensorProto, scratch: ReadableDataFile, data: DataFile) -> None:
    """`t`'s bytes moved from `scratch` to `data` a few MiB at a time (never one tensor whole in
    memory), its stub pointed there."""
    offset, length = int(external_entry(t, "offset") or 0), int(external_entry(t, "length"))
    fd = scratch.file.fileno()

    def chunks():
        at, end = offset, offset + length
        while at < end:
            chunk = os.pread(fd, min(COPY_BYTES, end - at), at)
            if not chunk:
                raise OSError(f"{scratch.location}: ends before tensor {t.name!r}'s bytes")
            at += len(chunk)
            yield chunk

    stub = data.stored_bytes(t.name, t.data_type, t.dims, chunks())
    del t.external_data[:]
    t.external_data.extend(stub.external_data)
