"""The registry of GGUF block types: what each is, and the function that writes its nodes.

A sibling of the quantization formats' registry (dyndq/quantization/formats/), not a part of it: a
`Format` there is a way to quantize a float weight (its options, its quantize, its budget choices,
its `--format` name), where a GGUF block type is a decoder of blocks someone else quantized.  None
of a Format's parts but its nodes would apply (a GGUF type has no options, no quantize of ours, no
budget), and registering them there would put 26 names into `quantize --format` that cannot
quantize; so GGUF's types are registered here, by the same pattern (one module per family, each
registering its types at import, `scope()` for tests), keyed by gguf's own type names.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

_TYPES: dict[str, "BlockType"] = {}


@dataclass(frozen=True)
class BlockType:
    name: str  # gguf's name of the type (GGMLQuantizationType.<name>)
    block: int  # elements per block (along a row: the tensor's last axis)
    size: int  # bytes per block
    composition: str  # the nodes it becomes, in a few words (the docs' table)
    write: Callable  # write(writer, blocks) -> the output value: blocks is uint8 [rows, n_blocks, size]
    ratio: float = 1.10  # the most the tensors written may weigh against the GGUF tensor's bytes


def block_type(name: str, *, block: int, size: int, composition: str, ratio: float = 1.10):
    """Register the decorated write function as GGUF type `name` (a name taken is refused)."""
    def register(write: Callable) -> Callable:
        if name in _TYPES:
            raise ValueError(f"GGUF type {name!r} registered already")
        _TYPES[name] = BlockType(name, block, size, " ".join(composition.split()), write, ratio)
        return write
    return register


def get(name: str) -> BlockType | None:
    """The registered type of that name, or None."""
    return _TYPES.get(name)


def names() -> tuple[str, ...]:
    """Every registered type's name, in registration order."""
    return tuple(_TYPES)


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Types registered inside the block are removed when it ends (for tests)."""
    before = dict(_TYPES)
    try:
        yield
    finally:
        _TYPES.clear()
        _TYPES.update(before)
