"""com.microsoft::MatMulNBits <-> DynamicDequantize-2 + MatMul (+ Add), exactly.

MatMulNBits(A, B, scales, zero_points?, g_idx?, bias?) with attributes K, N, bits,
block_size (and accuracy_level) computes A @ W (+ bias), W[k, n] = (q[n, k] - zp) * scale
with one scale and zero point per block of `block_size` along K.  B is uint8
[N, ceil(K/block_size), block_size*bits/8]: the weight transposed, each column's codes
packed low bits first, K padded up to whole blocks.  An absent zero point means
2^(bits-1) (8 for 4 bits), where DynamicDequantize's (and DequantizeLinear's) means 0.

Lifting writes, in the weight's own orientation [K_pad, N]:

    codes  uint4/uint8 [K_pad, N]  (B unpacked and transposed; the padding kept)
    scales [n_blocks, N], zps uint4/uint8 [n_blocks, N]  (the absent zero point written out)
    W = DynamicDequantize-2(codes, scales, zps, per_group, group_shape [block_size, 1])
    W = Slice(W, [0], [K], [0])      when K is not a multiple of block_size
    Y = MatMul(A, W)  (+ Add(Y, bias))

Codes, scales and zero points carry over value for value.  Left alone, with the reason:
bits other than 4 and 8 (2-bit codes have no type of ours), a block size MatMulNBits does
not take, weights that are not initializers, weight_prepacked, float zero points that are
not integers, and a g_idx other than the identity (act-order groups are not blocks).  A
float zero point that is an integer is lifted (uint4/uint8, or int32 when out of the
codes' range) with a note: ONNX Runtime's CPU kernel computes q*scale - zp*scale there,
which differs from (q - zp)*scale in the last bit of float32 weights.

Lowering (export for ONNX Runtime) takes the reverse path from a DynamicDequantize-2
per_group node (groups of a power of two >= 16 along K, 1 along N) on constant 2-D codes
(int4/uint4 -> bits 4, int8/uint8 -> bits 8; signed codes shifted by 2^(bits-1) with their
zero points, which leaves every difference q - zp as it was) and float32/float16 scales
whose output feeds (through that Slice, if any) the B of one MatMul; a following Add of a
constant [N] becomes the bias.  The form a lifted node remembers (zero points absent,
packed or float; the shapes of scales and zero points; an identity g_idx) is written back,
so MatMulNBits -> lift -> export gives back the same initializers.
"""
from __future__ import annotations

import numpy as np
import onnx

from dyndq.opdefs import PER_GROUP, dtypes

from . import foreign
from .foreign import RUNTIME_FLOATS, ACCURACY_LEVEL, MS_DOMAIN, MS_OPSET, GraphView, Rewrite
from .onnx_types import attribute_values

OP = "MatMulNBits"
SOURCE = (MS_DOMAIN, OP)
QUALNAME = f"{MS_DOMAIN}::{OP}"


def absent_zero_point(bits: int) -> int:
    """MatMulNBits' zero point when none is given: 2^(bits-1)."""
    return 1 << (bits - 1)


# == lifting ===================================================================================

def lift(node: onnx.NodeProto, view: GraphView) -> Rewrite | str:
    """The rewrite of one MatMulNBits into DynamicDequantize-2 + MatMul (+ Slice, Add), or why not."""
    attrs = attribute_values(node)
    a, b, s, z, g, bias = foreign.inputs_of(node, 6)
    missing = [k for k in ("K", "N", "block_size") if k not in attrs]
    if missing:
        return f"attribute {', '.join(missing)} missing"
    K, N, bits, block = int(attrs["K"]), int(attrs["N"]), int(attrs.get("bits", 4)), int(attrs["block_size"])
    if bits not in (4, 8):
        return (f"bits={bits}: DynamicDequantize takes 4- and 8-bit codes (int4/uint4, int8/uint8); "
                f"{bits}-bit codes have no type of its own")
    if not foreign.power_of_two_block(block):
        return f"block_size {block}: MatMulNBits takes powers of two from 16"
    if attrs.get("weight_prepacked", 0):
        return f"weight_prepacked={attrs['weight_prepacked']}: B is in an execution provider's own layout"
    if K <= 0 or N <= 0:
        return f"K={K}, N={N}: an empty weight"
    blocks, blob = -(-K // block), block * bits // 8
    codes = view.constant(b) if b else None
    if codes is None:
        return "B is not a constant (an initializer or a Constant of this graph): its codes are repacked offline"
    if codes.dtype != np.uint8 or codes.shape != (N, blocks, blob):
        return f"B is {codes.dtype}{list(codes.shape)}, not uint8[N, n_blocks, blob] = uint8{[N, blocks, blob]}"
    found = foreign.float_scales(view, s)
    if isinstance(found, str):
        return found
    scales, t = found
    if scales.shape not in ((N, blocks), (N * blocks,)):
        return f"scales has shape {list(scales.shape)}, not {[N, blocks]} or {[N * blocks]}"
    form = {"op": QUALNAME, "scales_shape": list(scales.shape)}
    notes = []
    zero, problem = _lift_zero_points(view, z, N, blocks, bits, t, form)
    if problem:
        return problem
    if zero is None:
        zero = np.full((N, blocks), absent_zero_point(bits), np.int64)
    if g:
        index = view.constant(g)
        if index is None:
            return "g_idx is not a constant"
        if not np.array_equal(index.astype(np.int64).ravel(), np.arange(index.size) // block) or index.size not in (K, blocks * block):
            return "g_idx is not the identity (act-order groups are not contiguous blocks)"
        form["g_idx"] = [g, list(index.shape), dtypes.name_of(index.dtype)]
    if form["zero_points"] == "float":
        notes.append(f"{QUALNAME} {node.name or node.output[0]!r}: float zero points lifted as integers: "
                     "ONNX Runtime's CPU kernel computes q*scale - zp*scale for them, which can differ from "
                     "(q - zp)*scale in the last bit")

    readers = [node]
    code_type = "uint4" if bits == 4 else "uint8"
    q = foreign.unpack(codes.reshape(N, blocks * blob), bits).T  # [K_pad, N]
    zps_type = code_type if zero.min() >= 0 and zero.max() < (1 << bits) else "int32"
    inits = [foreign.tensor(foreign.as_codes(q, code_type), foreign.new_name(view, b, readers)),
             foreign.tensor(np.ascontiguousarray(scales.reshape(N, blocks).T), foreign.new_name(view, s, readers))]
    zps_name = foreign.new_name(view, z, readers) if z else view.names.fresh(f"{b}_zero_points")
    inits.append(foreign.tensor(foreign.as_codes(zero.T, zps_type), zps_name))

    base = node.name or node.output[0]
    ctx = foreign.context(view, base)
    w = foreign.dynamic_dequantize(ctx, inits[0].name, inits[1].name, zps_name, (block, 1), form)
    if blocks * block != K:
        w = foreign.slice_to(ctx, w, 0, K)
    y = ctx.op("MatMul", a, w, hint="matmul")
    foreign.remember(ctx.nodes[-1], ACCURACY_LEVEL, str(int(attrs.get("accuracy_level", 0))))
    if bias:
        y = ctx.op("Add", y, bias, hint="biased")
    ctx.output_as(y, node.output[0])
    foreign.stand_in(ctx.nodes[-1], node)
    shown = f"DynamicDequantize per_group [{block}, 1] + {'Slice + ' if blocks * block != K else ''}MatMul" + (" + Add" if bias else "")
    return Rewrite([node], list(ctx.nodes), inits, shown, notes)


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
        every = foreign.unpack(packed.reshape(N, per_row), bits)
        padding = every[:, blocks:]
        if padding.size and np.all(padding == padding.flat[0]) and int(padding.flat[0]) != absent_zero_point(bits):
            form["zero_points_padding"] = int(padding.flat[0])
        form["zero_points"] = "packed"
        return every[:, :blocks].astype(np.int64), None
    if dtypes.name_of(packed.dtype) != t:
        return None, f"zero_points is {dtypes.name_of(packed.dtype)}, not uint8 or the scales' {t}"
    if packed.size != N * blocks:
        return None, f"zero_points has {packed.size} elements, not N * n_blocks = {N * blocks}"
    values = foreign.integer_values(packed)
    if values is None:
        return None, f"zero_points ({t}) hold values that are not integers: DynamicDequantize's zero points are integers"
    form["zero_points"] = "float"
    return values.reshape(N, blocks), None


# == lowering ==================================================================================

def lower(node: onnx.NodeProto, view: GraphView, *, accuracy_level: int | None = None) -> Rewrite | str:
    """The rewrite of a DynamicDequantize-2 (and the MatMul it feeds) into one MatMulNBits, or why not."""
    qtype, group = foreign.ddq_attrs(node)
    src, s, z = foreign.inputs_of(node, 3)
    if qtype != PER_GROUP:
        return f"{qtype}: MatMulNBits takes blocks along K (per_group)"
    codes = view.constant(src)
    if codes is None or codes.ndim != 2:
        return "src is not a constant 2-D weight" if codes is None else f"src has rank {codes.ndim}, not 2"
    src_type = dtypes.name_of(codes.dtype)
    if src_type not in ("int4", "uint4", "int8", "uint8"):
        return f"src is {src_type}"
    if len(group) != 2 or group[1] != 1 or not foreign.power_of_two_block(group[0]):
        return f"group_shape {list(group)}: MatMulNBits takes [block, 1] with block a power of two from 16"
    block = int(group[0])
    found = foreign.float_scales(view, s, RUNTIME_FLOATS, f"ONNX Runtime's CPU {OP} takes float32 and float16")
    if isinstance(found, str):
        return found
    scales, t = found
    chain = foreign.chain_to(view, node, "MatMul", 1, 0, "the B of a MatMul")
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
    bits = 4 if src_type in ("int4", "uint4") else 8
    shift = absent_zero_point(bits) if src_type in ("int4", "int8") else 0
    zero = (view.constant(z) if z else np.zeros((blocks, N), np.int64))
    if zero is None:
        return "zps is not a constant"
    zero = zero.astype(np.int64) + shift
    if zero.min(initial=0) < 0 or zero.max(initial=0) >= 1 << bits:
        return f"zero points outside MatMulNBits' {bits}-bit range once shifted to unsigned codes"
    form = foreign.lifted_from(node, QUALNAME)

    bias, last = _bias(view, matmul, N, t)
    replaced = foreign.chain_nodes(view, [node] + nodes + [matmul] + ([last] if bias else []))
    readers = replaced
    q = (codes.astype(np.int64) + shift).T  # [N, K_pad]
    b_name = foreign.new_name(view, src, readers)
    s_shape = form.get("scales_shape", [N, blocks])
    inits = [foreign.tensor(foreign.pack(q, bits).reshape(N, blocks, block * bits // 8), b_name),
             foreign.tensor(np.ascontiguousarray(scales.T).reshape(s_shape if np.prod(s_shape) == N * blocks else [N, blocks]),
                            foreign.new_name(view, s, readers))]
    inputs = [a, b_name, inits[1].name]
    zp_form = form.get("zero_points", "packed" if np.any(zero != absent_zero_point(bits)) else "absent")
    if zp_form == "absent" and np.any(zero != absent_zero_point(bits)):
        zp_form = "packed"  # the codes were changed since the lift: the zero points are needed now
    if zp_form != "absent":
        inits.append(_zero_points(zero.T, bits, zp_form, form, t, foreign.new_name(view, z, readers) if z else
                                  view.names.fresh(f"{b_name}_zero_points")))
        inputs.append(inits[-1].name)
    if "g_idx" in form:
        name, shape, kind = form["g_idx"]
        if int(np.prod(shape)) in (K, k_pad) and name not in view.names.used:
            inputs += [""] * (4 - len(inputs)) + [name]
            view.names.used.add(name)
            inits.append(foreign.tensor((np.arange(int(np.prod(shape))) // block).astype(kind).reshape(shape), name))
    if bias:
        inputs += [""] * (5 - len(inputs)) + [bias]
    level, why = _accuracy_level(accuracy_level, matmul)
    out = (last if bias else matmul).output[0]
    fused = onnx.helper.make_node(OP, inputs, [out], domain=MS_DOMAIN, K=K, N=N, accuracy_level=level, bits=bits,
                                  block_size=block)
    foreign.stand_in(fused, last if bias else matmul)
    shown = f"{QUALNAME} (bits {bits}, block_size {block}, accuracy_level {level}: {why}" + (", with bias)" if bias else ")")
    return Rewrite(replaced, [fused], inits, shown, domains={MS_DOMAIN: MS_OPSET})


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


def _zero_points(zero: np.ndarray, bits: int, form_name: str, form: dict, t: str, name: str) -> onnx.TensorProto:
    """MatMulNBits' zero points from unsigned int64 [N, blocks]: packed uint8 rows (padded with the
    value the lifted node had, 2^(bits-1) by default, as ONNX Runtime's quantizer writes), or
    floats of the scales' type when the lifted node had those."""
    N, blocks = zero.shape
    shape = form.get("zero_points_shape")
    if form_name == "float":
        values = zero.astype(dtypes.by_name(t).numpy)
        return foreign.tensor(values.reshape(shape) if shape and int(np.prod(shape)) == zero.size else values, name)
    per = 8 // bits
    pad = (-blocks) % per
    fill = form.get("zero_points_padding", absent_zero_point(bits))
    rows = np.concatenate([zero, np.full((N, pad), fill, np.int64)], axis=1) if pad else zero
    packed = foreign.pack(rows, bits)
    return foreign.tensor(packed.reshape(shape) if shape and int(np.prod(shape)) == packed.size else packed, name)


def _accuracy_level(asked: int | None, matmul) -> tuple[int, str]:
    """The accuracy_level to write, and where it came from."""
    if asked is not None:
        return int(asked), "asked"
    for p in matmul.metadata_props:
        if p.key == ACCURACY_LEVEL and p.value.strip().lstrip("-").isdigit():
            return int(p.value), "kept from the lifted node"
    return 0, "the graph's float meaning"
