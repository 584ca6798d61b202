"""What a checkpoint format's write functions build their nodes with: tensors, standard ops, our op.

Shared by the GGUF block types (gguf/) and the safetensors formats (safetensors/).  Every block type writes through one `Writer`, so the pieces they share are written once: the
float16 scale read from its bytes in the block, 2- and 4-bit codes packed as ONNX packs them (a
few rows at a time: `codes`), GGUF's code bytes kept unchanged and unpacked at run time (BitShift,
BitwiseAnd, BitwiseOr on uint8: exact; `fields`, `join`), a lookup table (Gather: `lookup`,
`indexed`), a constant made at run time (ConstantOfShape: zero points that weigh nothing in the
file) and DynamicDequantize-3, per_group, writing float32.  Fields are views of the file's blocks:
a tensor's bytes are copied once, into its initializers.

Values keep the blocks' axes: [rows, n_blocks, ...] (rows: the tensor's leading dims as one), so a
sub-block's scale broadcasts over its codes without reshaping; `finish` reshapes the result to the
tensor's shape.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dyndq.build import make_node
from dyndq.plumbing.names import NameScope

FLOAT = TensorProto.FLOAT
CHUNK_BYTES = 1 << 18  # the blocks whose codes are unpacked at once (codes: Writer.codes; a few times that in temporaries)
DIRECT_BYTES = 1024  # tensors of this many bytes or more go straight to the data file `written_to` names
# the dtypes whose array bytes are ONNX's raw_data as they are (not int4's one code a byte, which ONNX packs)
_PLAIN = {np.dtype(t) for t in (np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                np.uint32, np.int64, np.uint64)}
_DATA_FILE: contextvars.ContextVar = contextvars.ContextVar("dyndq_checkpoint_data_file", default=None)


@contextlib.contextmanager
def written_to(data):
    """Within it, the Writers put each tensor of DIRECT_BYTES or more straight into `data` (a
    model_files.DataFile: the streamed import's new external data file) as they make it, their
    tensors stubs pointing there: a decode's bytes are in memory once (as an array), never again
    in a TensorProto and in the copy protobuf gives of its raw_data to write it."""
    token = _DATA_FILE.set(data)
    try:
        yield
    finally:
        _DATA_FILE.reset(token)


class Writer:
    """The tensors and nodes standing for one GGUF tensor `name`, named after it."""

    def __init__(self, name: str, names: NameScope | None = None):
        self.name = name
        self.names = names if names is not None else NameScope()
        self.nodes: list[onnx.NodeProto] = []
        self.tensors: list[onnx.TensorProto] = []
        self.opset = 21  # the ai.onnx opset the nodes need (DynamicDequantize-3's lowering: 21)
        self.tables: list[str] = []  # the lookup tables: the same for every tensor of the type

    def needs_opset(self, opset: int) -> None:
        """The nodes use an op of ai.onnx `opset` (F16's BitCast: 26)."""
        self.opset = max(self.opset, opset)

    def fresh(self, hint: str) -> str:
        return self.names.fresh(f"{self.name}_{hint}")

    # -- tensors --------------------------------------------------------------------------

    def tensor(self, array: np.ndarray, hint: str, *, table: bool = False) -> str:
        """An initializer holding `array` (its dtype as it is: float16, int8, ...; a view into the
        file's blocks is copied once, into the tensor, or into the data file `written_to` names;
        a lookup table, `table`, always into the tensor: placing compares tables by their bytes)."""
        name = self.fresh(hint)
        data = _DATA_FILE.get()
        if data is not None and not table and array.nbytes >= DIRECT_BYTES and array.dtype in _PLAIN:
            self.tensors.append(data.stored_bytes(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape,
                                                  _chunks(array)))
        else:
            self.tensors.append(numpy_helper.from_array(array, name))
        return name

    def codes(self, make, blocks: np.ndarray, dtype: int, shape, hint: str = "quantized") -> str:
        """An initializer of 2- or 4-bit codes (`dtype`: TensorProto.UINT2, INT4, UINT4) of `shape`
        ([rows, n_blocks, ...]): `make(blocks of some rows)` gives them one a byte, in element order
        (their low bits: an int4 as its two's complement nibble), and they are packed as ONNX packs
        them (the first element in the lowest bits) a few rows at a time, so that the whole tensor's
        codes never stand one a byte in memory (and, with a data file `written_to` names, each few
        rows are written there as they are packed: the packed tensor is never whole either)."""
        bits = {TensorProto.UINT2: 2, TensorProto.INT2: 2, TensorProto.INT4: 4, TensorProto.UINT4: 4}[dtype]
        per_byte = 8 // bits
        size = int(np.prod(shape)) // per_byte

        def packed_chunks():
            step = max(1, CHUNK_BYTES // max(1, blocks[:1].nbytes))
            for start in range(0, blocks.shape[0], step):
                some = make(blocks[start:start + step]).reshape(-1, per_byte)
                chunk = some[:, 0].copy()
                for k in range(1, per_byte):
                    chunk |= some[:, k] << np.uint8(bits * k)
                yield chunk

        name = self.fresh(hint)
        data = _DATA_FILE.get()
        if data is not None and size >= DIRECT_BYTES:  # (each chunk written as it is packed: never the whole tensor)
            self.tensors.append(data.stored_bytes(name, dtype, shape, (chunk.data for chunk in packed_chunks())))
            return name
        packed, at = np.empty(size, np.uint8), 0
        for chunk in packed_chunks():
            packed[at:at + len(chunk)] = chunk
            at += len(chunk)
        self.tensors.append(helper.make_tensor(name, dtype, list(shape), packed.tobytes(), raw=True))
        return name

    def half(self, blocks: np.ndarray, at: int, hint: str) -> str:
        """The float16 at byte `at` of every block, as a tensor [rows, n_blocks, 1] (its two bytes as they are)."""
        return self.tensor(field(blocks, at, 2).view(np.float16), hint)

    # -- nodes ----------------------------------------------------------------------------

    def op(self, op_type: str, inputs: list[str], hint: str, **attrs) -> str:
        out = self.fresh(hint)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.fresh(op_type), **attrs))
        return out

    def reshape(self, value: str, shape, hint: str) -> str:
        return self.op("Reshape", [value, self.tensor(np.array(shape, np.int64), f"{hint}_shape")], hint)

    def unpack(self, packed: str, shifts, mask: int, hint: str, *, inner: bool = False, dtype=np.uint8) -> str:
        """The bit fields of `packed` (of `dtype`: uint8 or uint32), `(packed >> shift) & mask` for
        each shift, on a new axis before the last (`inner`: after it), as gguf.quants' NumPy
        unpacking writes it."""
        shifts = np.asarray(shifts, dtype)
        axis = -1 if inner else -2
        spread = self.op("Unsqueeze", [packed, self.tensor(np.array([axis], np.int64), f"{hint}_axis")], f"{hint}_spread")
        shifts = self.tensor(shifts if inner else shifts.reshape(-1, 1), f"{hint}_shifts")
        shifted = self.op("BitShift", [spread, shifts], f"{hint}_shifted", direction="RIGHT")
        return self.op("BitwiseAnd", [shifted, self.tensor(np.array(mask, dtype), f"{hint}_mask")], hint)

    def fields(self, packed: np.ndarray, shifts, mask: int, shape, hint: str, *, inner: bool = False) -> str:
        """The bit fields of GGUF's bytes `packed`, kept as they are in a tensor, unpacked at run time
        (`unpack`) and laid out in `shape` (element order)."""
        unpacked = self.unpack(self.tensor(packed, f"{hint}_bytes"), shifts, mask, hint, inner=inner, dtype=packed.dtype)
        return self.reshape(unpacked, shape, f"{hint}_codes")

    def join(self, low: str, high: str, bits: int, hint: str) -> str:
        """`low | (high << bits)` on uint8: a code whose width ONNX has no type for, from its two fields."""
        lifted = self.op("BitShift", [high, self.tensor(np.array(bits, np.uint8), f"{hint}_bits")], f"{hint}_high",
                         direction="LEFT")
        return self.op("BitwiseOr", [low, lifted], hint)

    def lookup(self, table: np.ndarray, indices: str, hint: str) -> str:
        """table[indices]: Gather from a constant table, the unsigned indices cast to int64 first."""
        index = self.op("Cast", [indices], f"{hint}_index", to=TensorProto.INT64)
        table = self.tensor(table, f"{hint}_table", table=True)
        self.tables.append(table)
        return self.op("Gather", [table, index], hint, axis=0)

    def indexed(self, table: np.ndarray, packed: np.ndarray, shape, hint: str = "values") -> str:
        """table[index] in `shape`, the 4-bit indices held by GGUF's nibble bytes `packed` [..., k]
        (per group of k bytes: byte i holds index i low, index i + k high), unpacked at run time."""
        return self.lookup(table, self.fields(packed, [0, 4], 0x0F, shape, "indices"), hint)

    def filled(self, value: np.ndarray, shape, hint: str) -> str:
        """A tensor of `shape` holding `value` everywhere, made at run time (nothing in the file)."""
        return self.op("ConstantOfShape", [self.tensor(np.array(shape, np.int64), f"{hint}_shape")], hint,
                       value=numpy_helper.from_array(np.asarray(value).reshape(1)))

    def dequantize(self, src: str, scales: str, zps: str | None = None, *, group_shape, hint: str,
                   output_dtype: int = FLOAT) -> str:
        """DynamicDequantize-3, per_group, writing float32 (or `output_dtype`): float32(src - zps) *
        float32(scales), one rounding (then one more to float16/bfloat16 where asked)."""
        out = self.fresh(hint)
        self.nodes.append(make_node([src, scales] + ([zps] if zps else []), [out], name=self.fresh("DynamicDequantize"),
                                    version=3, qtype="per_group", group_shape=list(group_shape), output_dtype=output_dtype))
        return out

    def finish(self, value: str, shape, form: str, dtype: int = FLOAT) -> "Written":
        """The value (of ONNX type `dtype`) reshaped to the tensor's `shape`: what stands for the tensor."""
        out = self.reshape(value, shape, "dequantized")
        return Written(self.nodes, self.tensors, out, form, self.opset, tuple(self.tables), dtype)


def _chunks(array: np.ndarray):
    """The array's bytes in C order: itself when contiguous, else a few rows copied at a time (a
    field of the file's blocks is a strided view: copied whole, it would be a second tensor)."""
    if array.flags.c_contiguous or array.ndim == 0:
        yield np.ascontiguousarray(array).data
        return
    step = max(1, CHUNK_BYTES // max(1, array[:1].nbytes))
    for start in range(0, array.shape[0], step):
        yield np.ascontiguousarray(array[start:start + step]).data


@dataclass
class Written:
    """What stands for one checkpoint tensor (as the quantizer's rewrite.Placed, without depending on
    it): its nodes and initializers, the value holding its values, the form in a few words, the
    ai.onnx opset its nodes need, the names of its lookup tables (constants the same for every
    tensor of its type, which a model needs once) and the value's ONNX element type (`dtype`:
    float32 for every GGUF type; float16 or bfloat16 where the format's own dequantization computes
    in it, as GPTQ's and AWQ's float16 scales do)."""
    nodes: list[onnx.NodeProto]
    tensors: list[onnx.TensorProto]
    output: str
    form: str
    opset: int = 21
    tables: tuple[str, ...] = ()
    dtype: int = FLOAT


def field(blocks: np.ndarray, at: int, size: int) -> np.ndarray:
    """Bytes at..at+size of every block, [rows, n_blocks, size] uint8 (a view: nothing copied)."""
    return blocks[..., at:at + size]


def nibbles(packed: np.ndarray) -> np.ndarray:
    """The 4-bit fields of `packed` (uint8 [..., k]) as codes in element order, [..., 2k] uint8:
    byte i holds element i (low nibble) and element i + k (high nibble), as GGUF's blocks lay them."""
    return np.concatenate([packed & 0x0F, packed >> 4], axis=-1)


def sub_block_scales(w: Writer, scales: np.ndarray, blocks: np.ndarray, at: int, hint: str) -> str:
    """dl = DynamicDequantize(scales, float16 at byte `at`): scales [rows, n_blocks, k, 1] times
    their super-block's d, float32 [rows, n_blocks, k, 1]."""
    d = w.tensor(field(blocks, at, 2).view(np.float16)[..., None], f"{hint}_scale")
    return w.dequantize(w.tensor(scales, hint), d, group_shape=(1, 1, scales.shape[2], 1), hint=f"{hint}_dequantized")


def spread(packed: np.ndarray, shifts, mask: int) -> np.ndarray:
    """NumPy's `(packed[..., None, :] >> shifts[:, None]) & mask`: the fields on a new axis before the last."""
    return (packed[..., None, :] >> np.asarray(shifts, np.uint8)[:, None]) & np.uint8(mask)
