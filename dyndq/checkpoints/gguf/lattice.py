"""GGUF's lattice (codebook) types, super-blocks of 256: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M.

Each group of values (16 or 32) has a small scale s, each 4 or 8 values a grid row (an index into
a table of small integers), and each value a sign (IQ2_XXS, IQ2_XS, IQ3_XXS: 8 signs by a 7-bit
index into llama.cpp's ksigns; IQ2_S, IQ3_S: a bit each; IQ1_*: grid values -1, 0, 1 and a delta
of ±1/8 per row instead).  gguf.quants dequantizes, in float32,

    IQ2_*:    d * (0.5 + s) * 0.25 * grid * sign          IQ3_XXS:  d * (0.5 + s) * 0.5 * grid * sign
    IQ3_S:    d * (1 + 2s) * grid * sign                  IQ1_*:    d * (2s + 1) * (grid ± 0.125)

which is `c * d * F` with an integer `c = (2s + 1) * grid * sign` (IQ1_*: `(2s + 1) * (8 grid ± 1)`)
and a power of two F (1/8, 1/4, 1, 1/8).  The nodes make c at run time (grid rows and signs by
Gather from int8 tables, the fields by BitShift and BitwiseAnd, then Mul and Add on int32: all
exact) and compute `float32(c) * float32(d)` by one DynamicDequantize(int32 c, float16 d) and a Mul
by F.  Why that is gguf's float32: every product on both sides is exact — d has 11 significant
bits, 2s + 1 at most 5, a grid value at most 6 (IQ2_*: 8, 25, 43; IQ3_XXS: 4 ... 62; IQ3_S: 1 ...
15; IQ1_*: 8 grid ± 1 at most 9), so d * c needs at most 22 of float32's 24, F is a power of two,
and nothing leaves float32's range (|d| <= 65504; 2^-24 <= |d| where not 0, so the smallest result
is 2^-27) — so both sides are the one exact value; and c is never 0 (a grid value is at least 1,
8 grid ± 1 is odd), so a d of ±0, ±inf or NaN gives what IEEE multiplication gives for the same
signs on both sides.  IQ1_M's float16 d is spread over the top nibbles of its four scale words:
its bits are put together here (2 bytes a block, the only bytes beyond GGUF's).

The grids are gguf's own (`gguf.quants.IQ2_XXS.grid` ..., decoded from llama.cpp's tables), read
when the first tensor of a type is written: these types need the `gguf` package, as reading the
file does.  The file keeps GGUF's bytes; the tables (2 to 16 kB a type: `Written.tables`) are
the same for every tensor of a type, so a model needs them once.
"""
from __future__ import annotations

import functools

import numpy as np
from onnx import TensorProto

from dyndq.checkpoints.gguf.registry import block_type
from dyndq.checkpoints.writer import Writer, field

ODD = np.arange(1, 32, 2, dtype=np.int32)  # 2s + 1 of each 4-bit s
SIGN_OF_BIT = np.array([1, -1], np.int8)


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
    assert (grid == np.rint(grid)).all() and np.abs(grid).max() < 64, name  # small integers
    ksigns = np.frombuffer(quants.IQ2_XXS.ksigns, np.uint8)
    signs = 1 - 2 * ((ksigns[:, None] >> np.arange(8, dtype=np.uint8)) & 1).astype(np.int8)
    return grid.astype(np.int8), signs


class Lattice:
    """The pieces of a lattice type's integer c, each an int8 or int32 value of the groups' shape
    [rows, n_blocks, groups, values a group] (or [..., 1] for one per group)."""

    def __init__(self, w: Writer, blocks: np.ndarray, name: str, groups: int):
        self.w, self.blocks, self.name = w, blocks, name
        rows, n = blocks.shape[:2]
        self.shape, self.one = (rows, n, groups, 256 // groups), (rows, n, groups, 1)

    def words(self, array: np.ndarray, hint: str) -> str:
        """GGUF's 16- or 32-bit words kept as they are, as uint32 at run time (BitShift takes no uint16)."""
        value = self.w.tensor(array, hint)
        return value if array.dtype == np.uint32 else self.w.op("Cast", [value], f"{hint}_uint32", to=TensorProto.UINT32)

    def grid(self, indices: str) -> str:
        return self.w.reshape(self.w.lookup(tables(self.name)[0], indices, "grid_values"), self.shape, "grid_in_order")

    def ksigns(self, indices: str) -> str:
        return self.w.reshape(self.w.lookup(tables(self.name)[1], indices, "signs"), self.shape, "signs_in_order")

    def bit_signs(self, packed: np.ndarray) -> str:
        """The sign of each value from GGUF's sign bytes (bit j of byte i: value 8i + j; set: -1)."""
        bits = self.w.fields(packed, range(8), 1, self.shape, "sign_bits", inner=True)
        return self.w.lookup(SIGN_OF_BIT, bits, "signs")

    def eighths(self, grid: str, delta_bits: str) -> str:
        """8 * grid + 1, or - 1 where the delta bit is set: IQ1's `grid ± 0.125` in eighths (int32)."""
        w = self.w
        eight = w.op("Mul", [w.op("Cast", [grid], "grid_int32", to=TensorProto.INT32),
                             w.tensor(np.array(8, np.int32), "eight")], "grid_eighths")
        delta = w.op("Cast", [w.lookup(SIGN_OF_BIT, delta_bits, "delta_sign")], "delta_int32", to=TensorProto.INT32)
        return w.op("Add", [eight, delta], "grid_plus_delta")

    def odd(self, scales: str) -> str:
        """2s + 1 for each group's s."""
        return self.w.lookup(ODD, self.w.reshape(scales, self.one, "scales_in_order"), "two_s_plus_one")

    def index(self, low: np.ndarray, high: str) -> str:
        """low | high << 8, a grid index of more than 8 bits (int64, as Gather takes it)."""
        wide = [self.w.op("Cast", [v], f"{h}_int64", to=TensorProto.INT64)
                for v, h in ((self.w.tensor(low, "index_low"), "index_low"), (high, "index_high"))]
        lifted = self.w.op("Mul", [wide[1], self.w.tensor(np.array(256, np.int64), "index_step")], "index_high_lifted")
        return self.w.op("Add", [wide[0], lifted], "grid_indices")

    def times_d(self, parts: list[str], factor: float, d: str | None = None) -> str:
        """float32(the product of `parts`, in int32) * float32(d) [* factor]: d the float16 at byte 0."""
        w = self.w
        c = None
        for part in parts:
            wide = w.op("Cast", [part], f"{part}_int32", to=TensorProto.INT32)
            c = wide if c is None else w.op("Mul", [c, wide], "codes")
        d = d or w.tensor(field(self.blocks, 0, 2).view(np.float16)[..., None], "scales")
        product = w.dequantize(c, d, group_shape=(1, 1, *self.shape[2:]), hint="product")
        return product if factor == 1 else w.op("Mul", [product, w.tensor(np.array(factor, np.float32), "factor")],
                                                   "times_factor")


@block_type("IQ2_XXS", block=256, size=66,
            composition="DynamicDequantize(int32 (2s+1) * grid * sign, float16 d) * 0.125, grid and signs by Gather")
def iq2_xxs(w: Writer, blocks: np.ndarray) -> str:
    t = Lattice(w, blocks, "IQ2_XXS", 8)
    groups = field(blocks, 2, 64).reshape(*blocks.shape[:2], 8, 8)  # per group: 4 grid index bytes, then a 32-bit word
    word = t.words(groups[..., 4:].view(np.uint32), "signs_and_scales")
    signs = w.unpack(word, [0, 7, 14, 21], 0x7F, "sign_indices", inner=True, dtype=np.uint32)
    scales = w.unpack(word, [28], 0x0F, "scale", dtype=np.uint32)
    return t.times_d([t.grid(w.tensor(groups[..., :4], "grid_indices")), t.ksigns(signs), t.odd(scales)], 0.125)


@block_type("IQ2_XS", block=256, size=74,
            composition="DynamicDequantize(int32 (2s+1) * grid * sign, float16 d) * 0.125, per 16, grid and signs by Gather")
def iq2_xs(w: Writer, blocks: np.ndarray) -> str:
    t = Lattice(w, blocks, "IQ2_XS", 16)
    word = t.words(field(blocks, 2, 64).view(np.uint16), "grid_and_signs")  # [r, n, 32]: a 9-bit grid index, 7-bit signs
    grid = w.op("BitwiseAnd", [word, w.tensor(np.array(511, np.uint32), "index_mask")], "grid_indices")
    signs = w.op("BitShift", [word, w.tensor(np.array(9, np.uint32), "sign_shift")], "sign_indices", direction="RIGHT")
    scales = w.fields(field(blocks, 66, 8), [0, 4], 0x0F, t.one, "scale", inner=True)
    return t.times_d([t.grid(grid), t.ksigns(signs), t.odd(scales)], 0.125)


@block_type("IQ2_S", block=256, size=82,
            composition="DynamicDequantize(int32 (2s+1) * grid * sign, float16 d) * 0.125, per 16, grid and sign bits by Gather")
def iq2_s(w: Writer, blocks: np.ndarray) -> str:
    return with_sign_bits(w, blocks, "IQ2_S", 16, indices=32, high_bits=2, signs_at=34, scales_at=74, factor=0.125)


@block_type("IQ3_XXS", block=256, size=98,
            composition="DynamicDequantize(int32 (2s+1) * grid * sign, float16 d) * 0.25, grid and signs by Gather")
def iq3_xxs(w: Writer, blocks: np.ndarray) -> str:
    t = Lattice(w, blocks, "IQ3_XXS", 8)
    word = t.words(field(blocks, 66, 32).view(np.uint32)[..., None], "signs_and_scales")  # [r, n, 8, 1]
    signs = w.unpack(word, [0, 7, 14, 21], 0x7F, "sign_indices", inner=True, dtype=np.uint32)
    scales = w.unpack(word, [28], 0x0F, "scale", dtype=np.uint32)
    grid = t.grid(w.tensor(field(blocks, 2, 64).reshape(*blocks.shape[:2], 8, 8), "grid_indices"))  # 8 rows of 4 a group
    return t.times_d([grid, t.ksigns(signs), t.odd(scales)], 0.25)


@block_type("IQ3_S", block=256, size=110,
            composition="DynamicDequantize(int32 (2s+1) * grid * sign, float16 d), grid and sign bits by Gather")
def iq3_s(w: Writer, blocks: np.ndarray) -> str:
    return with_sign_bits(w, blocks, "IQ3_S", 8, indices=64, high_bits=1, signs_at=74, scales_at=106, factor=1)


def with_sign_bits(w: Writer, blocks: np.ndarray, name: str, groups: int, *, indices: int, high_bits: int, signs_at: int,
                   scales_at: int, factor: float) -> str:
    """IQ2_S and IQ3_S: `indices` grid index bytes at byte 2, their high bits (`high_bits` each) at
    byte 66, a sign bit a value at `signs_at`, a 4-bit scale a group at `scales_at`."""
    t = Lattice(w, blocks, name, groups)
    high = w.fields(field(blocks, 66, indices * high_bits // 8), range(0, 8, high_bits), (1 << high_bits) - 1,
                    (*blocks.shape[:2], indices), "index_high", inner=True)
    grid = t.grid(t.index(field(blocks, 2, indices), high))
    scales = w.fields(field(blocks, scales_at, groups // 2), [0, 4], 0x0F, t.one, "scale", inner=True)
    return t.times_d([grid, t.bit_signs(field(blocks, signs_at, 32)), t.odd(scales)], factor)


@block_type("IQ1_S", block=256, size=50,
            composition="DynamicDequantize(int32 (2s+1) * (8 grid ± 1), float16 d) * 0.125, grid by Gather")
def iq1_s(w: Writer, blocks: np.ndarray) -> str:
    t = Lattice(w, blocks, "IQ1_S", 8)
    rows, n = blocks.shape[:2]
    word = t.words(field(blocks, 34, 16).view(np.uint16)[..., None], "high_bits")  # [r, n, 8, 1]
    high = w.reshape(w.unpack(word, [0, 3, 6, 9], 0x07, "index_high", inner=True, dtype=np.uint32), (rows, n, 32),
                     "index_high_in_order")
    grid = t.grid(t.index(field(blocks, 2, 32), high))
    scales = w.unpack(word, [12], 0x07, "scale", dtype=np.uint32)
    delta_bits = w.reshape(w.unpack(word, [15], 0x01, "delta_bit", dtype=np.uint32), t.one, "delta_bits")
    return t.times_d([t.eighths(grid, delta_bits), t.odd(scales)], 0.125)


@block_type("IQ1_M", block=256, size=56,
            composition="DynamicDequantize(int32 (2s+1) * (8 grid ± 1), float16 d) * 0.125, per 16, grid by Gather")
def iq1_m(w: Writer, blocks: np.ndarray) -> str:
    t = Lattice(w, blocks, "IQ1_M", 16)
    rows, n = blocks.shape[:2]
    words = field(blocks, 48, 8).view(np.uint16)  # [r, n, 4]: 3-bit scales from bit 0, 3, 6, 9; d's nibbles on top
    d_bits = ((words & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], np.uint16)).sum(axis=-1, dtype=np.uint16)
    d = w.tensor(d_bits.view(np.float16)[..., None, None], "scales")  # (its bits put together here: 2 bytes a block)
    scales = w.unpack(t.words(words, "scale_words"), [0, 3, 6, 9], 0x07, "scale", inner=True, dtype=np.uint32)
    nibbles = w.fields(field(blocks, 32, 16), [0, 4], 0x0F, (rows, n, 32, 1), "high", inner=True)  # one per 8 values
    high = w.op("BitwiseAnd", [nibbles, w.tensor(np.array(7, np.uint8), "index_high_mask")], "index_high")
    delta_bit = w.op("BitShift", [nibbles, w.tensor(np.array(3, np.uint8), "delta_shift")], "delta_bit", direction="RIGHT")
    grid = w.lookup(tables("IQ1_M")[0], t.index(field(blocks, 0, 32)[..., None], high), "grid_values")  # [r, n, 32, 1, 8]
    grid = w.reshape(grid, (rows, n, 32, 8), "grid_rows")
    eighths = w.reshape(t.eighths(grid, delta_bit), t.shape, "grid_plus_delta_in_order")
    return t.times_d([eighths, t.odd(scales)], 0.125, d)
