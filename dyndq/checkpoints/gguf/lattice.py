"""GGUF's lattice (codebook) types taken so far: IQ2_XXS and IQ3_XXS, super-blocks of 256.

Each group of 32 values has a 4-bit scale s and, per 8 values, a grid row (IQ2_XXS: one of 256
rows of 8 values, IQ3_XXS: two of 256 rows of 4) and 8 signs (a 7-bit index into llama.cpp's
ksigns: 128 sign patterns of even parity).  gguf.quants dequantizes, in float32,

    db = d * (0.5 + s) * F        (F = 0.25 for IQ2_XXS, 0.5 for IQ3_XXS)
    db * grid * sign

The nodes compute `float32(c) * float32(d) * (F / 2)` with the integer `c = (2s + 1) * grid *
sign` made at run time (Gather from the grid and from a table of the signs of each ksigns index,
both int8, each Cast to int32, then Mul on int32: exact), by one DynamicDequantize(int32 c,
float16 d) and one Mul.  Why that is gguf's float32: every product on both sides is exact — d has 11 significant bits, 2s + 1 at most 5,
a grid value at most 6 (IQ2_XXS: 8, 25, 43; IQ3_XXS: 4 ... 62), so |c| fits 11 bits and d * c 22 of
float32's 24, F and F / 2 are powers of two, and no product leaves float32's range (|d| <= 65504,
2^-24 <= |d| where not 0, so the smallest result is 2^-27) — so both sides are the one exact
value, and where d is ±0, ±inf or NaN both give what IEEE multiplication gives for the same signs
(c is never 0: a grid value is at least 4).

The grids are gguf's own (`gguf.quants.IQ2_XXS.grid`, decoded from llama.cpp's tables), read when
the first tensor of the type is written: these types need the `gguf` package, as reading the file
does.  The file keeps GGUF's bytes (the grid index bytes and the 32-bit words of signs and scale);
the tables (a few kB) are the only cost beyond them.  The other lattice types (IQ1_S, IQ1_M, IQ2_XS,
IQ2_S, IQ3_S) are refused, by name, until a table makes them exact.
"""
from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto

from dyndq.checkpoints.gguf.registry import block_type
from dyndq.checkpoints.gguf.writer import Writer, field

ODD = np.arange(1, 32, 2, dtype=np.int32)  # 2s + 1 of each 4-bit s


@functools.lru_cache(maxsize=None)
def tables(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The grid of lattice type `name` (int8 [rows, width]) and the signs of each ksigns index
    (int8 [128, 8]: +1 or -1), from the `gguf` package."""
    try:
        from gguf import quants
    except ImportError as e:
        raise ImportError(f"GGUF's {name} tensors need the `gguf` package for its grid: pip install 'dyndq[import]'") from e
    kind = getattr(quants, name)
    kind.init_grid()
    grid = np.asarray(kind.grid, np.float32).reshape(kind.grid_shape)
    assert (grid == np.rint(grid)).all() and 0 < grid.min() and grid.max() < 64, name  # small positive integers
    ksigns = np.frombuffer(quants.IQ2_XXS.ksigns, np.uint8)
    signs = 1 - 2 * ((ksigns[:, None] >> np.arange(8, dtype=np.uint8)) & 1).astype(np.int8)
    return grid.astype(np.int8), signs


def lattice(w: Writer, blocks: np.ndarray, name: str, indices: np.ndarray, words: np.ndarray, factor: float) -> str:
    """`float32((2s + 1) * grid[indices] * sign) * d * factor` for the 8 groups of 32 of each super-block:
    `indices` uint8 [rows, n, 8, k] (the grid rows of each group), `words` uint32 [rows, n, 8, 1] (4
    7-bit sign indices from bit 0, the 4-bit s from bit 28), d the float16 at byte 0."""
    grid, signs = tables(name)
    rows, n = blocks.shape[:2]
    shape = (rows, n, 8, 32)
    word = w.tensor(words, "signs_and_scales")
    values = w.reshape(w.lookup(grid, w.tensor(indices, "grid_indices"), "grid_values"), shape, "grid_in_order")
    sign_indices = w.unpack(word, [0, 7, 14, 21], 0x7F, "sign_indices", inner=True, dtype=np.uint32)  # [r, n, 8, 1, 4]
    sign = w.reshape(w.lookup(signs, sign_indices, "signs"), shape, "signs_in_order")
    signed = w.op("Mul", [w.op("Cast", [v], f"{v}_int32", to=TensorProto.INT32) for v in (values, sign)], "signed_grid")
    odd = w.lookup(ODD, w.reshape(w.unpack(word, [28], 0x0F, "scale", dtype=np.uint32), (rows, n, 8, 1), "scale_in_order"),
                   "two_s_plus_one")
    codes = w.op("Mul", [signed, odd], "codes")
    product = w.dequantize(codes, w.tensor(field(blocks, 0, 2).view(np.float16)[..., None], "scales"),
                           group_shape=(1, 1, 8, 32), hint="product")
    return w.op("Mul", [product, w.tensor(np.array(factor / 2, np.float32), "factor")], "times_factor")


@block_type("IQ2_XXS", block=256, size=66,
            composition="DynamicDequantize(int32 (2s+1) * grid * sign, float16 d) * 0.125, grid and signs by Gather")
def iq2_xxs(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    groups = field(blocks, 2, 64).reshape(rows, n, 8, 8)  # per group: 4 grid index bytes, then a 32-bit word
    return lattice(w, blocks, "IQ2_XXS", groups[..., :4], groups[..., 4:].view(np.uint32), 0.25)


@block_type("IQ3_XXS", block=256, size=98,
            composition="DynamicDequantize(int32 (2s+1) * grid * sign, float16 d) * 0.25, grid and signs by Gather")
def iq3_xxs(w: Writer, blocks: np.ndarray) -> str:
    rows, n = blocks.shape[:2]
    indices = field(blocks, 2, 64).reshape(rows, n, 8, 8)  # 8 grid rows of 4 a group
    return lattice(w, blocks, "IQ3_XXS", indices, field(blocks, 66, 32).view(np.uint32)[..., None], 0.5)
