"""oneDNN's int4 memory <-> ml_dtypes arrays in logical (row-major) order.

oneDNN packs two 4-bit values per byte by *physical offset*: the element at offset
`sum(index * stride)` sits in byte offset // 2, the low nibble when the offset is
even.  Strides count elements, so a transposed tensor (`stride [.., 1, 128]`) is
packed in its physical order, not its logical one.
"""
from __future__ import annotations

import numpy as np

from dyndq.opdefs import dtypes


def _offsets(shape, strides) -> np.ndarray:
    shape, strides = tuple(int(d) for d in shape), tuple(int(s) for s in strides)
    if len(strides) != len(shape):
        raise ValueError(f"{len(strides)} strides for a rank-{len(shape)} shape {list(shape)}")
    if any(s < 0 for s in strides):
        raise ValueError(f"strides {list(strides)}: negative strides are not oneDNN memory")
    offsets = np.zeros(shape, dtype=np.int64)
    for axis, (n, s) in enumerate(zip(shape, strides)):
        view = [1] * len(shape)
        view[axis] = n
        offsets = offsets + (np.arange(n, dtype=np.int64) * s).reshape(view)
    return offsets


def dense_strides(shape) -> list[int]:
    """Row-major strides, in elements."""
    strides, step = [], 1
    for d in reversed(list(shape)):
        strides.append(step)
        step *= max(int(d), 1)
    return strides[::-1]


def unpack_int4(buffer, shape, strides=None, signed: bool = True) -> np.ndarray:
    """The int4 (signed) or uint4 array of `shape` held in oneDNN's packed `buffer` (bytes or uint8)."""
    raw = np.frombuffer(bytes(buffer), dtype=np.uint8) if not isinstance(buffer, np.ndarray) else buffer.view(np.uint8).ravel()
    offsets = _offsets(shape, dense_strides(shape) if strides is None else strides)
    need = (int(offsets.max()) // 2 + 1) if offsets.size else 0
    if raw.size < need:
        raise ValueError(f"buffer of {raw.size} bytes; shape {list(shape)} with strides {strides} needs {need}")
    nibbles = np.where(offsets % 2 == 0, raw[offsets // 2] & 0x0F, raw[offsets // 2] >> 4).astype(np.uint8)
    if signed:
        return (nibbles.astype(np.int8) - ((nibbles & 0x8).astype(np.int8) << 1)).astype(dtypes.by_name("int4").numpy)
    return nibbles.astype(dtypes.by_name("uint4").numpy)


def pack_int4(array, strides=None) -> bytes:
    """oneDNN's packed bytes of an int4/uint4 array laid out with `strides` (dense row-major by default)."""
    array = np.asarray(array)
    if array.dtype.name not in ("int4", "uint4"):
        raise TypeError(f"pack_int4 takes an int4 or uint4 array, not {array.dtype.name}")
    offsets = _offsets(array.shape, dense_strides(array.shape) if strides is None else strides)
    if offsets.size and np.unique(offsets).size != offsets.size:
        raise ValueError(f"strides {strides} put two elements of shape {list(array.shape)} at one offset")
    size = (int(offsets.max()) // 2 + 1) if offsets.size else 0
    nibbles = (array.astype(np.int8).astype(np.uint8) & 0x0F).ravel()
    offsets = offsets.ravel()
    out = np.zeros(size, dtype=np.uint8)
    even = offsets % 2 == 0
    np.bitwise_or.at(out, offsets[even] // 2, nibbles[even])
    np.bitwise_or.at(out, offsets[~even] // 2, (nibbles[~even] << 4).astype(np.uint8))
    return out.tobytes()
