"""com.microsoft::MatMulNBits <-> DynamicDequantize + MatMul (+ Add), exactly.

MatMulNBits(A, B, scales, zero_points?, g_idx?, bias?) with attributes K, N, bits,
block_size (and accuracy_level) computes A @ W (+ bias), W[k, n] = (q[n, k] - zp) * scale
with one scale and zero point per block of `block_size` along K.  B is uint8
[N, ceil(K/block_size), block_size*bits/8]: the weight transposed, each column's codes
packed low bits first, K padded up to whole blocks.  An absent zero point means
2^(bits-1) (2, 8 or 128), where DynamicDequantize's (and DequantizeLinear's) means 0.
Packed zero points are `bits`-bit codes, low bits first, each column's row padded to whole
bytes.  (Measured on ONNX Runtime 1.32's CPU kernel, 2-bit included: tests/converters/contrib.)

Lifting writes, in the weight's own orientation [K_pad, N]:

    codes  uint2/uint4/uint8 [K_pad, N]  (B unpacked and transposed; the padding kept)
    scales [n_blocks, N], zps [n_blocks, N] of the codes' type  (the absent zero point written out)
    W = DynamicDequantize(codes, scales, zps, per_group, group_shape [block_size, 1])
    W = Slice(W, [0], [K], [0])      when K is not a multiple of block_size
    Y = MatMul(A, W)  (+ Add(Y, bias))

DynamicDequantize-2 for 4- and 8-bit codes, version 3 for 2-bit ones (uint2: MatMulNBits'
codes are unsigned).  Codes, scales and zero points carry over value for value.

Float zero points (of the scales' type) that are integers or half-integers (zp = 1.5) are
lifted where exact (a -0.0 one as 0, its sign kept in the form for the way back): integers as codes of the codes' type (int32 when out of range), and
half-integers by doubling, (q - zp) * s = (2q - 2zp) * (s / 2): codes 2q in the next unsigned
type (uint4 for 2 bits, uint8 for 4, uint16 for 8), zero points 2zp in the smallest integer type
holding them, scales halved, when halving is exact for every scale (it is not for a subnormal
whose last bit is set).  Either way ONNX Runtime's CPU kernel computes q*scale - zp*scale there
(float32 products and difference, then rounded to the scales' type), which equals
(q - zp)*scale only where no rounding happens: lifted only when they agree on every weight (always
for float16 scales at 2 and 4 bits, where float32 holds every product exactly), and otherwise
left alone with the count of weights that differ.  The lift report names the bytes the doubled
form costs.  (That arithmetic and the doubled form: float_zero_points.py.)

Left alone, with the reason: a block size MatMulNBits does not take, weights that are not
initializers, weight_prepacked, float zero points that are neither integers nor half-integers
or beside 8-bit codes (ONNX Runtime refuses those),
a g_idx other than the identity (act-order groups are not blocks), and a g_idx with 2- or 8-bit
codes (ONNX Runtime computes other weights there).

Lowering (export for ONNX Runtime) takes the reverse path from a DynamicDequantize per_group node
(groups of a power of two >= 16 along K, 1 along N) on constant 2-D codes (int2/uint2 -> bits 2,
int4/uint4 -> bits 4, int8/uint8 -> bits 8; signed codes shifted by 2^(bits-1) with their zero
points, which leaves every difference q - zp as it was) and float32/float16 scales whose output
feeds (through that Slice, if any) the B of one MatMul; a following Add of a constant [N] becomes
the bias.  The form a lifted node remembers (zero points absent, packed or float; the shapes of
scales and zero points; an identity g_idx; the doubled form of half-integer zero points) is
written back, so MatMulNBits -> lift -> export gives back the same initializers.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import onnx

from dyndq.opdefs import DOMAIN, PER_CHANNEL, PER_GROUP, dtypes
from dyndq.plumbing.types import attribute_values

from .. import rewrite as rw
from ..walker import written_in_bands
from ..rewrite import GraphView, Rewrite
from ..rules import LIFT, WRITE, rule, says_why
from . import float_zero_points as fzp
from . import shared
from .shared import ACCURACY_LEVEL, CODE_TYPES, MS_DOMAIN, MS_OPSET, RUNTIME_FLOATS

OP = "MatMulNBits"
QUALNAME = f"{MS_DOMAIN}::{OP}"


# the bits each code type of ours is written back with (signed codes shifted by 2^(bits-1))
BITS_OF = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "int8": 8, "uint8": 8}


def absent_zero_point(bits: int) -> int:
    """MatMulNBits' zero point when none is given: 2^(bits-1)."""
    return 1 << (bits - 1)


# == lifting ===================================================================================



@dataclass(frozen=True)
class _Weights:
    """What the lift of one MatMulNBits found: its attributes, inputs, and weights decoded."""

    attrs: dict
    inputs: tuple
    q: np.ndarray  # codes [K_pad, N]
    scales: np.ndarray
    zero: np.ndarray  # int64 [N, n_blocks]: the zero points (doubled: 2zp)
    form: dict  # form["doubled"]: half-integer zero points, lifted as codes 2q, zero points 2zp, scales / 2
    cast: onnx.NodeProto | None = None  # the Cast of float16 scales to float32 feeding the node (shared.cast_scales)



def _lift_found(node: onnx.NodeProto, view: GraphView) -> _Weights | str:
    """What a MatMulNBits holds, decoded, or why it has no exact DynamicDequantize form."""
    attrs = shared.int_attributes(node, {"K": None, "N": None, "block_size": None, "bits": 4, "accuracy_level": 0,
                                          "weight_prepacked": 0})
    if isinstance(attrs, str):
        return attrs
    a, b, s, z, g, bias = rw.inputs_of(node, 6)
    K, N, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    if bits not in CODE_TYPES:
        return f"bits={bits}: MatMulNBits takes 2, 4 and 8"
    if not shared.power_of_two_block(block):
        return f"block_size {block}: MatMulNBits takes powers of two from 16"
    if attrs["weight_prepacked"]:
        return f"weight_prepacked={attrs['weight_prepacked']}: B is in an execution provider's own layout"
    if K <= 0 or N <= 0:
        return f"K={K}, N={N}: an empty weight"
    blocks, blob = -(-K // block), block * bits // 8
    codes = view.constant(b) if b else None
    if codes is None:
        return "B is not a constant (an initializer or a Constant of this graph): its codes are repacked offline"
    if codes.dtype != np.uint8 or codes.shape != (N, blocks, blob):
        return f"B is {codes.dtype}{list(codes.shape)}, not uint8[N, n_blocks, blob] = uint8{[N, blocks, blob]}"
    found = shared.float_scales(view, s)
    cast = None
    if isinstance(found, str):
        through = shared.cast_scales(view, s)  # (float16 scales read as float32 through a Cast: lifted with output_dtype)
        if through is None:
            return found
        cast, found = through[0], (through[1], "float16")
    scales, t = found
    if scales.shape not in ((N, blocks), (N * blocks,)):
        return f"scales has shape {list(scales.shape)}, not {[N, blocks]} or {[N * blocks]}"
    form = {"op": QUALNAME, "scales_shape": list(scales.shape), "attribute_order": [x.name for x in node.attribute]}
    zero, problem = _lift_zero_points(view, z, N, blocks, bits, t, form)
    if problem:
        return problem
    if cast is not None and form["zero_points"] == "float":
        return "float zero points beside float16 scales cast to float32: not lifted"
    if g:
        index = view.constant(g)
        if index is None:
            return "g_idx is not a constant"
        if index.dtype.kind not in "iu" or index.size not in (K, blocks * block) \
                or not np.array_equal(index.astype(np.int64).ravel(), np.arange(index.size) // block):
            return "g_idx is not the identity (act-order groups are not contiguous blocks)"
        if bits == 8:
            return f"g_idx with {bits}-bit codes: ONNX Runtime's CPU kernel takes g_idx with 2- and 4-bit codes only"
        if bits == 2:
            return ("g_idx with 2-bit codes: ONNX Runtime 1.32's CPU kernel gives other weights than "
                    "(q - zp)*scale there (measured)")
        if form["zero_points"] == "packed":
            return ("g_idx with packed zero points: ONNX Runtime's kernel takes 2^(bits-1) for every zero point "
                    "there, whatever they hold, which is no form of DynamicDequantize's")
        form["g_idx"] = [g, list(index.shape), dtypes.name_of(index.dtype)]
    if zero is None:
        zero = np.full((N, blocks), absent_zero_point(bits), np.int64)
    q = shared.unpack(codes.reshape(N, blocks * blob), bits).T  # [K_pad, N]
    if form.get("doubled"):
        form["bits"] = bits
        bad = fzp.inexact_halves(scales)
        if bad:
            return (f"half-integer zero points: lifted as (2q - 2zp) * (scales / 2), but halving is not exact "
                    f"for {bad} of the {scales.size} scales (subnormals)")
    if form["zero_points"] == "float" or g:
        # ONNX Runtime computes q*scale - zp*scale here (each product rounded to float32), not
        # (q - zp)*scale: lifted only where the two agree on every weight
        differ = fzp.onnxruntime_differences(q, scales.reshape(N, blocks).T.astype(np.float32) if cast is not None
                                             else scales.reshape(N, blocks).T, zero.T, block, K, bits,
                                               form.get("doubled"))
        if differ:
            return (f"{'g_idx' if g else 'float zero points'}: ONNX Runtime computes q*scale - zp*scale there, "
                    f"which differs from (q - zp)*scale in {differ} of {K * N} weights")
    return _Weights(attrs, (a, b, s if cast is None else cast.input[0], z, g, bias), q, scales, zero, form, cast)


@rule("MatMulNBits -> DynamicDequantize + MatMul", kind=LIFT, pattern=(MS_DOMAIN, OP),
      check=says_why(_lift_found), targets=("onnx", "openvino"))
def lift(found: _Weights, node: onnx.NodeProto, view: GraphView) -> Rewrite:
    """One MatMulNBits as DynamicDequantize-2 + MatMul (+ Slice, Add)."""
    attrs, (a, b, s, z, _, bias), q, scales, zero, form = \
        found.attrs, found.inputs, found.q, found.scales, found.zero, found.form
    K, N, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
    blocks = -(-K // block)
    doubled = bool(form.get("doubled"))
    if doubled:  # (q - zp) * s as (2q - 2zp) * (s / 2): integer codes and zero points, exactly
        code_type = fzp.DOUBLED_CODE_TYPES[bits]
        zps_type = fzp.smallest_zero_type(zero)
        q, kept_scales = q * 2, (scales / 2).astype(scales.dtype)
    else:
        code_type = CODE_TYPES[bits]
        zps_type = code_type if zero.min() >= 0 and zero.max() < (1 << bits) else "int32"
        kept_scales = scales
    new = rw.Constants(view.names)
    codes_name = new.add(shared.as_codes(q, code_type), b)
    scales_name = new.add(np.ascontiguousarray(kept_scales.reshape(N, blocks).T), s)
    zps_name = new.add(shared.as_codes(zero.T, zps_type), z) if z else new.add(
        shared.as_codes(zero.T, zps_type), b, "zero_points")

    base = node.name or node.output[0]
    ctx = rw.context(view, base)
    w = shared.dynamic_dequantize(ctx, codes_name, scales_name, zps_name, (block, 1), form)
    if found.cast is not None:  # (float16 scales, a float32 result: DynamicDequantize-3's output_dtype, as the Cast gave)
        ctx.nodes[-1].attribute.append(onnx.helper.make_attribute("output_dtype", onnx.TensorProto.FLOAT))
    padded = blocks * block != K
    if padded:
        w = rw.slice_to(ctx, w, 0, K)
    y = ctx.op("MatMul", a, w, hint="matmul")
    shared.remember(ctx.nodes[-1], ACCURACY_LEVEL, str(attrs["accuracy_level"]))
    if bias:
        y = ctx.op("Add", y, bias, hint="biased")
    ctx.output_as(y, node.output[0])
    shared.stand_in(ctx.nodes[-1], node)
    shown = f"DynamicDequantize per_group [{block}, 1] + {'Slice + ' if padded else ''}MatMul" + (" + Add" if bias else "")
    if doubled:
        shown += f" ({code_type} codes 2q, {zps_type} zero points 2zp, scales / 2)"
    before = sum(view.constant(n).nbytes for n in (b, s, z) if n)
    notes = [fzp.cost(f"{QUALNAME} {node.name or node.output[0]!r}", before, new.tensors, code_type, zps_type)] \
        if doubled else []
    if found.cast is not None:
        shown += " (float16 scales, output_dtype float32: the Cast folded)"
    out = rw.lifted(node, ctx, new, shown, padded=padded, broadcast=bool(bias), notes=notes)
    out.replaces[:0] = shared.lifted_cast(view, node, found.cast)
    return out


def _lift_zero_points(view, z, N, blocks, bits, t, form) -> tuple[np.ndarray | None, str | None]:
    """The zero points as int64 [N, blocks] (None when absent), recording their form; or a reason."""
    if not z:
        form["zero_points"] = "absent"
        return None, None
    packed = view.constant(z)
    if packed is None:
        return None, "zero_points is not a constant"
    form["zero_points_shape"] = list(packed.shape)
    if packed.dtype == np.uint8:
        per_row = -(-blocks * bits // 8)
        if packed.size != N * per_row:
            return None, f"zero_points (uint8) has {packed.size} elements, not N * ceil(n_blocks*bits/8) = {N * per_row}"
        every = shared.unpack(packed.reshape(N, per_row), bits)
        padding = every[:, blocks:]
        if padding.size and np.all(padding == padding.flat[0]) and int(padding.flat[0]) != absent_zero_point(bits):
            form["zero_points_padding"] = int(padding.flat[0])
        form["zero_points"] = "packed"
        return every[:, :blocks].astype(np.int64), None
    if dtypes.name_of(packed.dtype) != t:
        return None, f"zero_points is {dtypes.name_of(packed.dtype)}, not uint8 or the scales' {t}"
    if bits == 8:  # (no weights of ONNX Runtime's to be equal to)
        return None, ("float zero points with 8-bit codes: ONNX Runtime 1.32's CPU kernel refuses them "
                      "(it takes uint8 zero points there)")
    if packed.size != N * blocks:
        return None, f"zero_points has {packed.size} elements, not N * n_blocks = {N * blocks}"
    values = shared.integer_values(packed)
    form["zero_points"] = "float"
    negative = fzp.negative_zeros(packed)
    if negative is not None:  # (a value of 0 either way; the way back writes the sign again)
        form["negative_zero_points"] = negative
    if values is None:  # half-integers (1.5, ...): lifted doubled, 2zp (x * 2 is exact in float64)
        values = shared.integer_values(np.asarray(packed).astype(np.float64) * 2)
        if values is None:
            return None, (f"zero_points ({t}) hold values that are neither integers nor half-integers: "
                          f"DynamicDequantize's zero points are integers")
        form["doubled"] = True
    return values.reshape(N, blocks), None


# == writing for ONNX Runtime ==================================================================================

@dataclass(frozen=True)
class _Chain:
    """What the write of one MatMulNBits found: the codes, scales and zero points (unsigned),
    the nodes from the DynamicDequantize to the MatMul, and the form the lift remembered."""

    inputs: tuple
    codes: np.ndarray
    scales: np.ndarray
    zero: np.ndarray
    bits: int
    shift: int
    block: int
    nodes: list
    matmul: onnx.NodeProto
    K: int
    t: str
    form: dict  # (shared.lifted_from's: empty when the node was not lifted from MatMulNBits)
    doubled: bool = False  # the lifted form of half-integer zero points: codes 2q, zero points 2zp, scales / 2
    cast: bool = False  # float16 scales, output_dtype float32: the scales written float16 and Cast to float32



def _write_found(node: onnx.NodeProto, view: GraphView) -> _Chain | str:
    """The chain a DynamicDequantize-2 starts that one MatMulNBits expresses, or why not."""
    qtype, group = rw.ddq_attrs(node)
    src, s, z = rw.inputs_of(node, 3)
    if qtype not in (PER_GROUP, PER_CHANNEL):
        return f"{qtype}: MatMulNBits takes blocks along K (per_group, or per_channel along N)"
    form = shared.lifted_from(node, QUALNAME)
    codes = _on_disk(view, src) if qtype == PER_GROUP and not form else None
    if codes is None:
        codes = view.constant(src)
    if codes is None or codes.ndim != 2:
        return "src is not a constant 2-D weight" if codes is None else f"src has rank {codes.ndim}, not 2"
    src_type = dtypes.name_of(codes.dtype)
    doubled = bool(form.get("doubled")) and form.get("zero_points") == "float" and bool(z) \
        and src_type == fzp.DOUBLED_CODE_TYPES.get(form.get("bits"))
    if src_type not in BITS_OF and not doubled:
        return f"src is {src_type}: MatMulNBits takes 2-, 4- and 8-bit integer codes"
    output_dtype = attribute_values(node).get("output_dtype")
    if qtype == PER_CHANNEL:
        axis = attribute_values(node).get("axis", 1)
        if axis not in (1, -1):
            return f"per_channel along axis {axis}: MatMulNBits takes a scale per column of B (axis 1), blocks along K"
    elif len(group) != 2 or group[1] != 1 or not shared.power_of_two_block(group[0]):
        return f"group_shape {list(group)}: MatMulNBits takes [block, 1] with block a power of two from 16"
    found = shared.float_scales(view, s, RUNTIME_FLOATS, f"ONNX Runtime's CPU {OP} takes float32 and float16")
    if isinstance(found, str):
        return found
    scales, t = found
    zero = view.constant(z) if z else None
    if z and zero is None:
        return "zps is not a constant"
    if qtype == PER_CHANNEL:
        if src_type not in BITS_OF:
            return f"src is {src_type}: MatMulNBits takes 2-, 4- and 8-bit integer codes"
        codes, scales, zero, block = _whole_columns(codes, scales, zero, BITS_OF[src_type])
    else:
        block = int(group[0])
    cast = output_dtype is not None and dtypes.by_onnx(output_dtype).name == "float32" and t == "float16"
    if cast:  # (MatMulNBits' scales are A's type: float32 ones made by a Cast of the float16 ones, exact)
        t = "float32"
    elif output_dtype is not None and dtypes.by_onnx(output_dtype).name != t:
        return (f"output_dtype {dtypes.by_onnx(output_dtype).name}: MatMulNBits gives the scales' type, {t} (or float32 "
                "from float16 scales, through a Cast)")
    chain = rw.chain_to(view, node, "MatMul", 1, 0, "the B of a MatMul")
    if isinstance(chain, str):
        return chain
    nodes, matmul, K = chain
    k_pad, N = codes.shape
    blocks = k_pad // block
    if not k_pad - block < K <= k_pad:
        return f"Slice keeps {K} of {k_pad} rows: MatMulNBits pads K only up to a whole block"
    a = matmul.input[0]
    a_spec = view.spec(a)
    if a_spec is not None and a_spec.rank is not None and a_spec.rank < 2:
        return f"the MatMul's A has rank {a_spec.rank}: MatMulNBits takes A of rank 2 or more"
    if zero is None:
        zero = np.zeros((blocks, N), np.int16)
    if doubled and cast:
        return "half-integer zero points beside float16 scales of a float32 result: MatMulNBits' form of them is float32"
    if doubled:
        why = fzp.doubled_problem(codes, scales, form["bits"])
        if why is None:
            return _Chain((src, s, z), codes, scales, zero.astype(np.int64), form["bits"], 0, block, nodes, matmul, K,
                          t, form, doubled=True)
        if src_type not in BITS_OF:
            return f"the doubled form of half-integer zero points no longer holds: {why}"
    bits = BITS_OF[src_type]
    shift = absent_zero_point(bits) if src_type.startswith("int") else 0
    # (integers of at most 8 bits shifted by at most 128 held in int16: a quarter of int64's bytes; wider ones in int64)
    zero = zero.astype(np.int16 if zero.dtype.itemsize <= 1 or zero.dtype == np.int16 else np.int64)
    zero += shift
    if zero.min(initial=0) < 0 or zero.max(initial=0) >= 1 << bits:
        return f"zero points outside MatMulNBits' {bits}-bit range once shifted to unsigned codes"
    return _Chain((src, s, z), codes, scales, zero, bits, shift, block, nodes, matmul, K, t, form, cast=cast)


# The block sizes ONNX Runtime 1.32's CPU MatMulNBits takes: powers of two from 16, up to 256 for 2-bit
# codes ("2-bit MatMulNBits block_size must not exceed 256"), any for 4 and 8 (measured to 8192, A =
# identity giving the weights value for value); a block may be longer than K: the padding is not read.
MAX_BLOCK = {2: 256}


def _whole_columns(codes: np.ndarray, scales: np.ndarray, zero: np.ndarray | None, bits: int):
    """A per_channel weight (one scale and zero point per column, whole K) as MatMulNBits' blocks:
    (codes padded to whole blocks along K with the zero point, so the padding is 0, scales and zero
    points [blocks, N], the block size).  Each block of a column repeats the column's scale and zero
    point, which gives the same weights for any block size: the one chosen stores them in the
    fewest bytes (K itself where K is a power of two from 16; one block of the next power of two
    where that is fewer bytes than smaller blocks with their scales)."""
    K, N = codes.shape
    zp_bytes = 0 if zero is None else bits / 8
    sizes = []
    block = 16
    while block <= MAX_BLOCK.get(bits, max(16, 1 << (K - 1).bit_length())):
        blocks = -(-K // block)
        sizes.append((blocks * (block * bits / 8 + scales.itemsize + zp_bytes), -block))
        if block >= K:
            break
        block *= 2
    block = -min(sizes)[1]
    blocks = -(-K // block)
    zero_row = np.zeros(N, np.int64) if zero is None else np.broadcast_to(zero.astype(np.int64).reshape(-1), (N,))
    padding = np.broadcast_to(zero_row, (blocks * block - K, N)).astype(codes.dtype)
    padded = np.concatenate([codes, padding]) if len(padding) else codes
    repeat = lambda row: np.ascontiguousarray(np.broadcast_to(row.reshape(1, N), (blocks, N)))  # noqa: E731
    return padded, repeat(scales.reshape(-1)), None if zero is None else repeat(zero_row), block


def _accuracy_level_problem(value) -> str | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= 4:
        return f"accuracy_level {value!r}: MatMulNBits takes 0 (unset), 1 (fp32), 2 (fp16), 3 (bf16) or 4 (int8)"
    return None


@rule("DynamicDequantize + MatMul -> MatMulNBits", kind=WRITE, pattern=(DOMAIN, "DynamicDequantize"),
      check=says_why(_write_found), targets=("onnxruntime",), makes=OP,
      options={"accuracy_level": _accuracy_level_problem})
def write(found: _Chain, node: onnx.NodeProto, view: GraphView) -> Rewrite:
    """A DynamicDequantize-2 (and the MatMul it feeds) as one MatMulNBits."""
    (src, s, z), codes, scales, zero, bits, shift, block = \
        found.inputs, found.codes, found.scales, found.zero, found.bits, found.shift, found.block
    nodes, matmul, K, t, form = found.nodes, found.matmul, found.K, found.t, found.form
    if found.doubled:  # back to q, zp and scales: exact (the lift halved exactly what it doubles now)
        codes, zero, scales = codes.astype(np.int64) // 2, zero / 2, (scales * 2).astype(scales.dtype)
    k_pad, N = codes.shape
    blocks = k_pad // block
    a = matmul.input[0]

    bias, last = _bias(view, matmul, N, t)
    replaced = [node] + nodes + [matmul] + ([last] if bias else [])
    new = rw.Constants(view.names)
    s_shape = form.get("scales_shape", [N, blocks])
    inputs = [a, _add_b(new, codes, shift, bits, [N, blocks, block * bits // 8], src),
              new.add(np.ascontiguousarray(scales.T).reshape(s_shape if np.prod(s_shape) == N * blocks else [N, blocks]), s)]
    cast = [shared.scales_cast(view, inputs[2], matmul.name or matmul.output[0])] if found.cast else []
    if cast:
        inputs[2] = cast[0].output[0]
    zp_form = form.get("zero_points", "packed" if np.any(zero != absent_zero_point(bits)) else "absent")
    if zp_form == "absent" and np.any(zero != absent_zero_point(bits)):
        zp_form = "packed"  # the codes were changed since the lift: the zero points are needed now
    if zp_form != "absent":
        zero_points = _zero_points(zero.T, bits, zp_form, form, t)
        inputs.append(new.add(zero_points, z) if z else new.add(zero_points, src, "zero_points"))
    if "g_idx" in form:
        name, shape, kind = form["g_idx"]
        if int(np.prod(shape)) in (K, k_pad):
            inputs += [""] * (4 - len(inputs))
            inputs.append(new.add((np.arange(int(np.prod(shape))) // block).astype(kind).reshape(shape), src, "g_idx",
                                  hint=name if name not in view.names.used else None))
    if bias:
        inputs += [""] * (5 - len(inputs)) + [bias]
    level, why = _accuracy_level(view.options.get("accuracy_level"), matmul)
    out = (last if bias else matmul).output[0]
    fused = onnx.helper.make_node(OP, inputs, [out], domain=MS_DOMAIN, K=K, N=N, accuracy_level=level, bits=bits,
                                  block_size=block)
    order = form.get("attribute_order")
    if isinstance(order, list):  # the lifted node's order (make_node sorts them; ONNX Runtime's quantizer does not)
        rank = {name: i for i, name in enumerate(order) if isinstance(name, str)}
        dropped = "accuracy_level" not in rank and level == 0 and why != "asked"  # (absent, as it was: 0)
        attributes = sorted((x for x in fused.attribute if not (dropped and x.name == "accuracy_level")),
                            key=lambda x: rank.get(x.name, len(rank)))
        del fused.attribute[:]
        fused.attribute.extend(attributes)
    shared.stand_in(fused, last if bias else matmul)
    shown = f"{QUALNAME} (bits {bits}, block_size {block}, accuracy_level {level}: {why}" + (", with bias)" if bias else ")")
    if cast:
        shown += ", its float16 scales through a Cast to float32"
    return Rewrite(replaced, cast + [fused], new.tensors, shown, domains={MS_DOMAIN: MS_OPSET}, derived=new.derived)


BAND_BYTES = 1 << 18  # the codes shifted and packed at once (_b_bands): 4x that in int16 temporaries


def _add_b(new: rw.Constants, codes, shift: int, bits: int, dims: list, src: str) -> str:
    """MatMulNBits' B (uint8 `dims`) made from the codes [K_pad, N] as a new constant derived from
    `src` (as `new.add` names it): in the streamed export written to the data file a band at a time
    as it is packed (walker.written_in_bands: never whole in memory, nor beside the codes), else
    packed into one array (docs/import.md, "Memory")."""
    name = new.names.fresh(src)
    stub = written_in_bands(name, onnx.TensorProto.UINT8, dims, (band.data for band in _b_bands(codes, shift, bits)))
    new.tensors.append(stub if stub is not None else rw.tensor(_packed_b(codes, shift, bits).reshape(dims), name))
    new.derived[name] = (src, "")
    return name


def _packed_b(codes, shift: int, bits: int) -> np.ndarray:
    """MatMulNBits' B rows, uint8 [N, K_pad*bits/8], packed a band at a time (`_b_bands`) into one array."""
    k_pad, N = codes.shape
    out = np.empty((N, k_pad * bits // 8), np.uint8)
    at = 0
    for band in _b_bands(codes, shift, bits):
        out[at:at + len(band)] = band
        at += len(band)
    return out


def _b_bands(codes, shift: int, bits: int):
    """MatMulNBits' B rows, uint8 [band, K_pad*bits/8] (C order) a band at a time: the codes [K_pad, N]
    (an array, or `_Nibbles` on disk) shifted to unsigned, transposed and packed a band of columns at
    a time, so that no whole-weight temporary (the codes widened to int16, shifted, transposed) is
    made: the streamed import exports one weight at a time, and this was its peak."""
    k_pad, N = codes.shape
    band = max(1, BAND_BYTES // max(1, k_pad))
    for start in range(0, N, band):
        q = codes.columns(start, start + band) if isinstance(codes, _Nibbles) else \
            shared.mapped_columns(codes, start, start + band, np.int16)  # (codes of at most 8 bits, shifted: int16 holds them)
        q += shift
        yield np.ascontiguousarray(shared.pack(q.T, bits))


class _Nibbles:
    """4-bit codes [K, N] (N even) as ONNX stores them, two a byte, low nibble first, read in place
    from their data file (GraphView.raw): `columns(start, stop)` unpacks those columns alone."""

    def __init__(self, raw: np.ndarray, K: int, N: int, signed: bool):
        self.raw, self.shape, self.ndim, self.signed = raw.reshape(K, N // 2), (K, N), 2, signed
        self.dtype = dtypes.by_name("int4" if signed else "uint4").numpy

    def columns(self, start: int, stop: int) -> np.ndarray:
        """Columns start:stop of the codes, int16 [K, stop - start]."""
        stop = min(stop, self.shape[1])
        packed = shared.mapped_columns(self.raw, start // 2, (stop + 1) // 2, np.uint8)
        q = np.empty((self.shape[0], 2 * packed.shape[1]), np.int16)
        q[:, 0::2], q[:, 1::2] = packed & 0x0F, packed >> 4
        if self.signed:  # (a nibble's two's complement)
            q ^= 8
            q -= 8
        return q[:, start % 2:start % 2 + stop - start]


def _on_disk(view: GraphView, name: str):
    """The codes of `name` read in place from the data file where the streamed export keeps them
    (8-bit: an array mapped on it; 4-bit with an even N: `_Nibbles`), else None."""
    raw = view.raw(name)
    spec = view.spec(name)
    if raw is None or spec is None or spec.rank != 2 or spec.size is None:
        return None
    K, N = spec.shape
    if spec.dtype in ("int8", "uint8") and raw.size == K * N:
        return raw.view(np.dtype(spec.dtype)).reshape(K, N)
    if spec.dtype in ("int4", "uint4") and N % 2 == 0 and raw.size == K * N // 2:
        return _Nibbles(raw, K, N, spec.dtype == "int4")
    return None


def _bias(view: GraphView, matmul, N: int, t: str):
    """(bias name, Add) when the MatMul's one reader adds a constant [N] of the scales' type to it."""
    out = matmul.output[0]
    readers = view.consumers(out)
    if len(readers) != 1 or view.is_output(out):
        return None, None
    add = readers[0]
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2 or list(add.input).count(out) != 1:
        return None, None
    other = add.input[1] if add.input[0] == out else add.input[0]
    value = view.constant(other)
    if value is None or value.shape != (N,) or dtypes.name_of(value.dtype) != t:
        return None, None
    return other, add


def _zero_points(zero: np.ndarray, bits: int, form_name: str, form: dict, t: str) -> np.ndarray:
    """MatMulNBits' zero points from unsigned int64 [N, blocks]: packed uint8 rows (padded with the
    value the lifted node had, 2^(bits-1) by default, as ONNX Runtime's quantizer writes), or
    floats of the scales' type when the lifted node had those."""
    N, blocks = zero.shape
    shape = form.get("zero_points_shape")
    if form_name == "float":
        values = zero.astype(dtypes.by_name(t).numpy)
        values = values.reshape(shape) if shape and int(np.prod(shape)) == zero.size else values
        return fzp.with_negative_zeros(values, form.get("negative_zero_points"))
    per = 8 // bits
    pad = (-blocks) % per
    fill = form.get("zero_points_padding", absent_zero_point(bits))
    rows = np.concatenate([zero, np.full((N, pad), fill, np.int64)], axis=1) if pad else zero
    packed = shared.pack(rows, bits)
    return packed.reshape(shape) if shape and int(np.prod(shape)) == packed.size else packed


def _accuracy_level(asked: int | None, matmul) -> tuple[int, str]:
    """The accuracy_level to write, and where it came from."""
    if asked is not None:
        return int(asked), "asked"
    for p in matmul.metadata_props:
        if p.key == ACCURACY_LEVEL and p.value.strip().lstrip("-").isdigit():
            return int(p.value), "kept from the lifted node"
    return 0, "the graph's float meaning"
