"""A model's large tensors held beside it in memory while a rewrite works on it, the model's graph
holding stubs of them (the in-memory counterpart of the streamed import's data files).

Why: protobuf's upb backend keeps a message's fields in its root message's arena and frees that
memory only when the whole model goes; a tensor cleared or removed from a model in memory still
takes its bytes there.  So a model rewritten in place (an export writing MatMulNBits' B beside the
codes it replaces) keeps every weight's old form and its new one until the end, in the model it
returns.  Held beside the model instead, each tensor is a Python object of its own: the walker
lets go of a weight's old form as soon as its new one exists (`let_go`,
converters.walker.external_constants), and `given_back` puts each tensor still read into the
model once, in its final form (docs/import.md, "Memory").

The stubs are tensors of external data at a location no file has (LOCATION), their offset the key
of their bytes here: the walker, the rules and the checkpoint import read them as they read the
streamed import's (`read`, `raw`), and write new tensors through `stored` and `stored_bytes`.
"""
from __future__ import annotations

import io
import itertools

import numpy as np
import onnx
from onnx import external_data_helper, numpy_helper

from dyndq.model_files import external_entry
from dyndq.plumbing.light import copy_fields, nbytes

LOCATION = "dyndq-held-tensors"  # (no file: the stubs' bytes are in a HeldTensors)
SMALL = 1024  # tensors under this many bytes stay in the graph (as DataFile keeps them)
# a tensor's data: what a stub leaves out, and `given_back` puts back (data_location where it was set)
_DATA = {"raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data",
         "data_location"}


class HeldTensors:
    """Tensors held by key: a TensorProto of its own (`stored`, `lend`: given back by CopyFrom, every
    field as it was) or the bytes of one made a band at a time (`stored_bytes`)."""

    def __init__(self):
        self._held: dict[str, onnx.TensorProto | bytes] = {}
        self._keys = itertools.count()

    def __len__(self) -> int:
        return len(self._held)

    # -- what the graph holds -----------------------------------------------------------------

    def stored(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """The stub standing for `tensor` (held as it is), or `tensor` itself when it is small or holds
        no data of its own (a stub already)."""
        if external_data_helper.uses_external_data(tensor) or nbytes(tensor) < SMALL \
                or tensor.data_type == onnx.TensorProto.STRING:
            return tensor
        stub = onnx.TensorProto()
        copy_fields(tensor, stub, skip=_DATA | {"external_data"})
        return self._point(stub, tensor)

    def stored_bytes(self, name: str, data_type: int, dims, chunks) -> onnx.TensorProto:
        """The stub of a tensor whose raw bytes are `chunks` (bytes-like, in order), held as one bytes
        object (BytesIO grows in place and gives its buffer back without a copy)."""
        buffer = io.BytesIO()
        for chunk in chunks:
            buffer.write(chunk)
        data = buffer.getvalue()
        del buffer
        return self._point(onnx.TensorProto(name=name, data_type=data_type, dims=list(dims)), data)

    def lend(self, tensor: onnx.TensorProto) -> onnx.TensorProto:
        """A stub of `tensor` (another model's: read, never copied, until `given_back` copies it
        into the model holding the stub), or `tensor` itself when `stored` would keep it."""
        return self.stored(tensor)

    def _point(self, stub: onnx.TensorProto, held) -> onnx.TensorProto:
        key = str(next(self._keys))
        self._held[key] = held
        stub.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", LOCATION), ("offset", key)) + ((("length", str(len(held))),) if isinstance(held, bytes) else ()):
            stub.external_data.add(key=k, value=v)  # (a tensor held whole: its length unread, raw_data gives a copy)
        return stub

    # -- reading ------------------------------------------------------------------------------

    def _entry(self, tensor: onnx.TensorProto):
        """(key, what is held) for a stub of ours; (None, None) for any other tensor."""
        if not external_data_helper.uses_external_data(tensor) or external_entry(tensor, "location") != LOCATION:
            return None, None
        key = external_entry(tensor, "offset")
        if key not in self._held:  # (a bug, not the user's: the walker let go of a tensor still read)
            raise RuntimeError(f"tensor {tensor.name!r}: its bytes were let go while the model still reads it")
        return key, self._held[key]

    def read(self, tensor: onnx.TensorProto) -> np.ndarray:
        """The values of `tensor` (a stub of ours, or a tensor with its data), as numpy_helper gives them."""
        _, held = self._entry(tensor)
        if held is None:
            return numpy_helper.to_array(tensor)
        if isinstance(held, onnx.TensorProto):
            return numpy_helper.to_array(held).reshape(tuple(tensor.dims))
        whole = onnx.TensorProto()
        copy_fields(tensor, whole, skip={"external_data", "data_location"})
        whole.raw_data = held
        return numpy_helper.to_array(whole)

    def raw(self, tensor: onnx.TensorProto) -> np.ndarray | None:
        """The stored bytes of a stub of ours (uint8, read-only), else None (GraphView.raw)."""
        _, held = self._entry(tensor)
        if held is None:
            return None
        if isinstance(held, onnx.TensorProto):
            if not held.HasField("raw_data"):
                return None
            held = held.raw_data  # (protobuf hands it out as a copy: one tensor's bytes, while it is read)
        return np.frombuffer(held, np.uint8)

    # -- letting go ---------------------------------------------------------------------------

    def let_go(self, tensor: onnx.TensorProto) -> None:
        """The bytes of a stub of ours dropped: nothing reads it any more (the walker's, or a decode
        the checkpoint import rewrote)."""
        key, held = self._entry(tensor)
        if held is not None:
            del self._held[key]

    def given_back(self, model: onnx.ModelProto) -> None:
        """Every stub of ours in `model` filled, in place, with what it stands for (its own fields, as
        the rewrite left them, and the held tensor's data: the tensor a model held whole would have),
        each held tensor dropped once its last stub is filled; what no stub reads any more is dropped too."""
        stubs: dict[str, list[onnx.TensorProto]] = {}
        for t in _all_tensors(model):
            if external_data_helper.uses_external_data(t) and external_entry(t, "location") == LOCATION:
                self._entry(t)
                stubs.setdefault(external_entry(t, "offset"), []).append(t)
        for key, ts in stubs.items():
            held = self._held.pop(key)
            for t in ts:
                t.ClearField("data_location")
                del t.external_data[:]
                if isinstance(held, onnx.TensorProto):
                    copy_fields(held, t, skip={f.name for f in held.DESCRIPTOR.fields} - _DATA)
                else:
                    t.raw_data = held
            del held
        self._held.clear()


def _all_tensors(model: onnx.ModelProto):
    """Every tensor of the model: initializers and node attributes, in every graph and function."""
    return external_data_helper._get_all_tensors(model)


def lent_copy(model: onnx.ModelProto, held: HeldTensors) -> onnx.ModelProto:
    """A copy of `model` whose main-graph initializers of SMALL bytes or more are stubs lent from it
    (`held.lend`: the given model's tensors read in place, copied into the copy only by `given_back`),
    so that a rewrite working on the copy never holds a weight twice beyond one weight's work."""
    out = onnx.ModelProto()
    copy_fields(model, out, skip={"graph"})
    copy_fields(model.graph, out.graph, skip={"initializer"})
    for t in model.graph.initializer:
        lent = held.lend(t)
        if lent is t:
            out.graph.initializer.add().CopyFrom(t)
        else:
            out.graph.initializer.append(lent)
    return out
