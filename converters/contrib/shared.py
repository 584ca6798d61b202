"""What the rules of ONNX Runtime's quantized contrib ops share.

`com.microsoft::MatMulNBits` and `com.microsoft::GatherBlockQuantized` are foreign forms
of DynamicDequantize: each has a module beside this one registering its rules, a lift
(the foreign node -> DynamicDequantize and standard nodes: version 2, or 3 for 2-bit codes)
and a write for export target "onnxruntime" (a DynamicDequantize on constant weights and the
node it feeds -> the foreign node).  Unlike an op version's lifting, which renames one node, these
rewrite several nodes and their weights (MatMulNBits stores its codes transposed and
bit-packed).  What they share: the domain, the form a lifted node remembers for the way
back, attribute and scale checks, and the bit packing.
"""
from __future__ import annotations

import json

import numpy as np
import onnx

from dyndq.opdefs import DOMAIN, PER_GROUP, dtypes

from .. import rewrite
from ..lowering_context import LoweringContext
from ..rewrite import GraphView

MS_DOMAIN = "com.microsoft"
MS_OPSET = 1  # the one version of com.microsoft's MatMulNBits and GatherBlockQuantized
# Metadata on a lifted DynamicDequantize: the foreign form it came from (JSON), so that the
# way back writes the same bytes.  Only the form is kept there; every value comes from the graph.
LIFTED_FROM = "dyndq.lifted_from"
# Metadata on a lifted MatMul: MatMulNBits' accuracy_level, which a MatMul has no attribute for.
ACCURACY_LEVEL = "dyndq.accuracy_level"
# The scales (and A) types ONNX Runtime 1.32's CPU kernels of both contrib ops take.
RUNTIME_FLOATS = ("float32", "float16")
# Our code type of each width ONNX Runtime's contrib ops pack into uint8 (MatMulNBits' B,
# GatherBlockQuantized's uint8 data); half-integer zero points: float_zero_points.
CODE_TYPES = {2: "uint2", 4: "uint4", 8: "uint8"}

def int_attributes(node: onnx.NodeProto, wanted: dict[str, int | None]) -> dict[str, int] | str:
    """The node's integer attributes among `wanted` (name -> default; None: required), or why not:
    one missing, given twice, or of another kind than INT (ONNX Runtime refuses such a node too)."""
    out, seen = {}, set()
    for a in node.attribute:
        if a.name not in wanted:
            continue
        if a.name in seen:
            return f"attribute {a.name} given more than once"
        seen.add(a.name)
        if a.type != onnx.AttributeProto.INT:
            kind = onnx.AttributeProto.AttributeType.Name(a.type)
            return f"attribute {a.name} is {kind}, not INT"
        out[a.name] = int(a.i)
    missing = [k for k, default in wanted.items() if default is None and k not in out]
    if missing:
        return f"attribute {', '.join(missing)} missing"
    return {k: out.get(k, default) for k, default in wanted.items()}


def power_of_two_block(block: int) -> bool:
    """What both contrib ops take as block_size: a power of two, 16 or more."""
    return block >= 16 and block & (block - 1) == 0


def lifted_from(node: onnx.NodeProto, op: str) -> dict:
    """The foreign form a lifted DynamicDequantize remembers (empty when it has none or another op's)."""
    for p in node.metadata_props:
        if p.key == LIFTED_FROM:
            try:
                form = json.loads(p.value)
            except ValueError:
                return {}
            return form if isinstance(form, dict) and form.get("op") == op else {}
    return {}


def remember(node: onnx.NodeProto, key: str, value) -> None:
    """Set a metadata entry (JSON for anything but a string)."""
    entry = node.metadata_props.add()
    entry.key, entry.value = key, value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def float_scales(view: GraphView, name: str | None, allowed=("float32", "float16", "bfloat16"), refusal: str = ""):
    """(the constant scales, their dtype name), or why not: not a constant, or a dtype not `allowed`
    (`refusal` says whose rule that is)."""
    scales = view.constant(name) if name else None
    if scales is None:
        return "scales is not a constant"
    t = dtypes.name_of(scales.dtype)
    if t not in allowed:
        return f"scales is {t}" + (f": {refusal}" if refusal else f", not {'/'.join(allowed)}")
    return scales, t


# Scales stored narrower than the op's result: both contrib ops take scales of A's type (their
# output's), so float16 scales of a float32 result (GGUF Q4_0/Q8_0's d) are written as the float16
# initializer and a Cast to float32 feeding the op (exact: every float16 is a float32), not a
# float32 copy (4 bytes a block where the checkpoint has 2).  ONNX Runtime's constant folding
# (level basic and up) folds the Cast at load, before the kernels prepack (measured: docs/import.md).

def cast_scales(view: GraphView, name: str | None) -> tuple[onnx.NodeProto, np.ndarray] | None:
    """(the Cast, the float16 constant it reads) where `name` is a Cast to float32 of a constant
    float16 tensor; else None."""
    cast = view.producer(name) if name else None
    if cast is None or cast.op_type != "Cast" or cast.domain not in ("", "ai.onnx") or len(cast.input) != 1 \
            or next((a.i for a in cast.attribute if a.name == "to"), None) != onnx.TensorProto.FLOAT:
        return None
    values = view.constant(cast.input[0])
    return (cast, values) if values is not None and values.dtype == np.float16 else None


def lifted_cast(view: GraphView, node: onnx.NodeProto, cast: onnx.NodeProto | None) -> list[onnx.NodeProto]:
    """The Cast of a lifted node's float16 scales, to be replaced with it where the node is its
    only reader (the lifted DynamicDequantize reads the float16 scales itself, output_dtype
    float32); else nothing (another reader keeps it)."""
    if cast is None or view.is_output(cast.output[0]) or [n for n in view.consumers(cast.output[0]) if n is not node]:
        return []
    return [cast]


def scales_cast(view: GraphView, scales: str, base: str) -> onnx.NodeProto:
    """A Cast of the float16 scales `scales` to float32: the scales input of a fused op whose
    result is float32 (exact)."""
    return onnx.helper.make_node("Cast", [scales], [view.names.fresh(f"{base}/scales_float32")],
                                 name=view.names.fresh(f"{base}/Cast"), to=onnx.TensorProto.FLOAT)


def integer_values(array: np.ndarray) -> np.ndarray | None:
    """The values of a zero-point tensor as int64, when every one is a finite integer (None otherwise)."""
    a = np.asarray(array)
    if a.dtype.kind in "iu" or a.dtype.name in ("int4", "uint4"):
        return a.astype(np.int64)
    wide = a.astype(np.float64)
    if not np.all(np.isfinite(wide)) or not np.array_equal(wide, np.round(wide)):
        return None
    if wide.size and np.abs(wide).max() >= 2**31:
        return None
    return wide.astype(np.int64)


# ONNX Runtime packs codes of `bits` bits into bytes along the last axis, low bits first: the
# layout onnx.numpy_helper gives int4 tensors, but over rows of a uint8 tensor (MatMulNBits'
# blobs, GatherBlockQuantized's uint8 data), which numpy_helper has no call for; so by hand.

def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """uint8 bytes holding `bits`-bit codes, low bits first -> one uint8 per code (last axis x 8/bits)."""
    packed = np.asarray(packed, np.uint8)
    if bits == 8:
        return packed
    per, mask = 8 // bits, (1 << bits) - 1
    parts = [(packed >> (bits * i)) & mask for i in range(per)]
    return np.stack(parts, axis=-1).reshape(*packed.shape[:-1], packed.shape[-1] * per)


RELEASE_BYTES = 1 << 20  # the rows of a mapped tensor read before their pages are let go (mapped_columns)


def mapped_columns(codes: np.ndarray, start: int, stop: int, dtype) -> np.ndarray:
    """codes[:, start:stop] (2-D) as a new array of `dtype`, copied a few rows at a time.  Where the
    codes are mapped on a file (np.memmap: the streamed export's data on disk) the pages read are
    let go after each few rows (madvise MADV_DONTNEED: they stay in the OS's cache), so that a band
    of columns, which reads a page of every row, never keeps the whole tensor resident."""
    stop = min(stop, codes.shape[1])
    out = np.empty((codes.shape[0], max(0, stop - start)), dtype)
    mapped = getattr(codes, "_mmap", None)
    step = codes.shape[0] if mapped is None else max(1, RELEASE_BYTES // max(1, codes.strides[0]))
    for row in range(0, codes.shape[0], step):
        out[row:row + step] = codes[row:row + step, start:stop]
        if mapped is not None:
            let_go(mapped)
    return out


def let_go(mapped) -> None:
    """The pages of `mapped` (an mmap.mmap) read so far let go from this process (where the platform can)."""
    import mmap

    if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            mapped.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):  # (the pages stay, as the OS keeps them)
            pass


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of `unpack`: codes in [0, 2^bits) along the last axis (a multiple of 8/bits) -> uint8."""
    codes = np.asarray(codes).astype(np.uint8)
    if bits == 8:
        return codes
    per = 8 // bits
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    out = np.zeros(grouped.shape[:-1], np.uint8)
    for i in range(per):
        out |= (grouped[..., i] << (bits * i)).astype(np.uint8)
    return out


def as_codes(values: np.ndarray, dtype: str) -> np.ndarray:
    """Integer values as an array of our dtype name (uint4 codes in ml_dtypes' uint4, ...)."""
    return np.asarray(values).astype(np.int64).astype(dtypes.by_name(dtype).numpy)


def dynamic_dequantize(ctx: LoweringContext, src: str, scales: str, zps: str | None, group_shape, form: dict) -> str:
    """A DynamicDequantize per_group node remembering `form` (the foreign form); returns dst.  (Its
    version is the model's import of our domain, which the rewrite's `domains` raise to what its
    codes need: 3 for uint2.)"""
    inputs = [src, scales] + ([zps] if zps else [])
    dst = ctx.op("DynamicDequantize", *inputs, domain=DOMAIN, hint="weight", qtype=PER_GROUP,
                 group_shape=[int(g) for g in group_shape])
    remember(ctx.nodes[-1], LIFTED_FROM, form)
    return dst


def stand_in(new: onnx.NodeProto, old: onnx.NodeProto) -> None:
    """`rewrite.stand_in`, but for what a lifting noted for the way back."""
    rewrite.stand_in(new, old, drop=(ACCURACY_LEVEL,))
