"""The seam between a checkpoint format and the import: what a checkpoint reader gives.

A format (GGUF here; the safetensors formats beside it) registers an opener (`@opener`): given a
path, it returns a `Checkpoint` or None (not its format).  A `Checkpoint` lists its tensors as
`SourceTensor`s, each in the source model's order (torch's [out, in] for a linear layer, the
blocks along the last axis: a format's own reordering, llama.cpp's rotary row permutation say,
undone by its reader), and may map a model's weight names onto its own (`mapped_name`: GGUF's
`TensorNameMap`).  A tensor's `nodes(names, name)` gives the `Written` computing its float32 values
exactly; `values()` the same values in NumPy (its format's own dequantization: the by-shape
matching compares them with the float model's weights).  Bytes are read when asked for, one
tensor at a time.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np


_OPENERS: list[tuple[str, Callable]] = []


class MissingExtra(ImportError):
    """A format's reader needs a package of an optional extra that is not installed (its message says which)."""


@dataclass
class SourceTensor:
    name: str  # its name in the checkpoint (GGUF: "blk.0.attn_q.weight"; a safetensors module: PREFIX.weight)
    shape: tuple[int, ...]  # in the source model's order, the blocks along the last axis
    kind: str  # its format and type in a few words: "GGUF Q4_K"
    nbytes: int  # its bytes in the checkpoint
    make_nodes: Callable  # (NameScope | None, name) -> Written
    make_values: Callable  # () -> float32 array of `shape`
    note: str = ""  # what the reader did to it (rows un-permuted, ...)

    def nodes(self, names=None, name: str | None = None):
        return self.make_nodes(names, name or self.name)

    def values(self) -> np.ndarray:
        return self.make_values()


class Checkpoint:
    """A checkpoint opened for import (a base for each format's)."""

    format = "?"
    path = ""
    architecture: str | None = None
    # GGUF: undo llama.cpp's rotary Q/K row permutation (a format that has none ignores it)
    unpermute = True

    def tensors(self) -> list[SourceTensor]:
        raise NotImplementedError

    def mapped_name(self, weight_name: str) -> str | None:
        """The checkpoint tensor a model's weight of that name is, by the format's own name map (None: none)."""
        return None

    def notes(self) -> list[str]:
        return []

    def expert(self, tensor: str, index: int) -> SourceTensor | None:
        """Slice `index` of 3-D tensor `tensor` along its first axis (a mixture-of-experts tensor's
        expert: GGUF's `blk.N.ffn_gate_exps.weight`), decoded alone; None where the format cannot."""
        return None


def opener(name: str):
    """Register `open(path) -> Checkpoint | None` for the format `name`."""
    def register(fn: Callable) -> Callable:
        _OPENERS.append((name, fn))
        return fn
    return register


def open_checkpoint(path: str | os.PathLike, *, unpermute: bool = True) -> Checkpoint:
    """The checkpoint at `path`, by the first registered format that takes it; ModelFileError
    (a file the command cannot use) where there is no such file or no format takes it.
    unpermute=False: llama.cpp's Q/K row permutation left as stored (see Checkpoint.unpermute)."""
    from dyndq.atomic_writes import ModelFileError

    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such file")
    for _, fn in _OPENERS:
        found = fn(path)
        if found is not None:
            found.unpermute = unpermute
            return found
    raise ModelFileError(f"{path}: not a checkpoint dyndq reads (it reads: {', '.join(n for n, _ in _OPENERS)})")
