"""A GGUF file's tensors, one at a time, and the nodes standing for one.

`read` streams the tensors of a file through `gguf.GGUFReader` (memory-mapped: a tensor's bytes
are read when its nodes are made, and only that tensor's); `nodes` turns one into ONNX tensors and
nodes by its block type's write function (registry.py).  GGUF stores a tensor's dims fastest
first (ne[0] = the row length); the shape here is NumPy's, the row last, as gguf.quants takes it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from dyndq.checkpoints.gguf.registry import get, names
from dyndq.checkpoints.writer import Writer, Written
from dyndq.opdefs import Problem, ValidationError
from dyndq.plumbing.names import NameScope


class UnsupportedType(ValidationError):
    """A GGUF tensor of a block type no registered type writes (Q8_1, Q8_K, the integer types ...)."""


@dataclass
class GGUFTensor:
    name: str
    type_name: str  # gguf's name of its block type: "Q4_K"
    shape: tuple[int, ...]  # NumPy's order: the row (the blocks' axis) last
    data: np.ndarray  # its bytes, [*shape[:-1], bytes per row] (a view into the file where read; any dtype, read as bytes)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def read(path: str | os.PathLike) -> Iterator[GGUFTensor]:
    """The tensors of GGUF file `path`, in the file's order, each a view of its bytes in the file."""
    try:
        from gguf import GGUFReader
    except ImportError as e:  # (an optional extra: dyndq itself runs without it)
        raise ImportError("reading GGUF files needs the `gguf` package: pip install 'dyndq[import]'") from e
    yield from tensors_of(GGUFReader(os.fspath(path), "r"))


def tensors_of(reader) -> Iterator[GGUFTensor]:
    """The GGUFTensors of an open gguf.GGUFReader, in the file's order (gguf's dims reversed to
    NumPy's, each a view of its bytes)."""
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))
        data = t.data.view(np.uint8)
        yield GGUFTensor(t.name, t.tensor_type.name, shape, data.reshape(*shape[:-1], -1))


def nodes(tensor: GGUFTensor, names_in_use: NameScope | None = None, *, name: str | None = None) -> Written:
    """The ONNX tensors and nodes whose output (`Written.output`, float32 of the tensor's shape)
    holds exactly `gguf.quants.dequantize` of the tensor, named after `name` (the tensor's own by
    default); UnsupportedType, naming the tensor and its type, for a type none writes."""
    kind = get(tensor.type_name)
    if kind is None:
        raise UnsupportedType([Problem(f"GGUF tensor {tensor.name!r}", f"of type {tensor.type_name} (a type no GGUF block "
                                       "type writes: gguf.quants has no dequantization of it either)",
                                       f"one of {', '.join(names())}")])
    row = tensor.shape[-1] if tensor.shape else 1
    data = np.ascontiguousarray(tensor.data)
    data = data.view(np.uint8).reshape(*data.shape[:-1], -1) if data.ndim else data.reshape(1).view(np.uint8)
    if row % kind.block or data.shape[-1] != row // kind.block * kind.size:
        raise ValidationError([Problem(f"GGUF tensor {tensor.name!r}",
                                       f"{data.shape[-1]} bytes per row of {row} {tensor.type_name} values",
                                       f"{row // kind.block * kind.size} (blocks of {kind.block} in {kind.size} bytes)")])
    blocks = data.reshape(-1, row // kind.block, kind.size)
    w = Writer(name or tensor.name, names_in_use)
    out = kind.write(w, blocks)
    return w.finish(out, tensor.shape, f"GGUF {tensor.type_name}: {kind.composition}")
