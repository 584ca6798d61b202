"""`--emit onnxruntime`: ONNX Runtime's fused contrib ops where a checkpoint's format fits them
exactly, the standard composition elsewhere, and the form of each weight said with its reason.

The export for ONNX Runtime (converters/contrib/matmul_nbits.py, gather_block_quantized.py) writes
com.microsoft::MatMulNBits from a DynamicDequantize per_group on constant 2-D codes [K, N] in
blocks [bs, 1] (bs a power of two >= 16) feeding a MatMul's B, and GatherBlockQuantized from one
on codes [V, D] in blocks [1, bs] feeding a Gather's data.  A format's decode (gguf/, safetensors/)
keeps its blocks' axes ([rows, n_blocks, 32]) and the checkpoint's [out, in] orientation, so it
never has that form: `prepare` rewrites the decode of each weight that fits into it (the codes and
scales moved into the graph's orientation: moving values is exact), before the decodes are placed.

Which formats fit, and why.  ONNX Runtime 1.32's CPU MatMulNBits (measured: the tests) multiplies A
by the weights (q - z) * s computed in float32 and rounded once there, with float32 scales and with
float16 ones alike (integer zero points, given or absent: (q - z) * s, not q*s - z*s); its float16
form does not round a weight to float16 before using it.  So:

- GGUF Q4_0 ((q - 8) * d) and Q8_0 (x * d): gguf computes float32(q) * float32(d), one rounding
  (exact anyway: at most 19 significant bits).  Fused, with float32 scales (d widened: exact) the
  kernel's weights are gguf's bits.  Int4 codes q - 8 are written as MatMulNBits' 4-bit codes with
  its absent zero point 8; int8 codes x as uint8 x + 128 with zero point 128 (the exporter's
  shift, which leaves q - z as it was).  The scales are stored as the checkpoint's float16 d and
  a Cast to float32 feeds the op's scales (the op takes scales of A's type; float16 ones would
  give a float16 result, the product rounded to float16, not gguf's float32): every float16 is a
  float32, so the Cast is exact, and the file holds 18 bytes a Q4_0 block and 34 a Q8_0 one, as
  the checkpoint (stored float32, 20 and 36: 1.111x and 1.059x).  ONNX Runtime folds the Cast at
  load (constant folding, level basic and up) before the kernels prepack: the same bits and speed
  as float32 scales stored, the session holding about one more float32 copy of the scales
  (measured: docs/import.md).  In our graph the decode
  is DynamicDequantize-3 with float16 scales and output_dtype float32, float32(q - z) * float32(d),
  which the export writes so.
- GPTQ, AWQ GEMM, compressed-tensors pack-quantized: their weights are the product rounded to the
  scales' type (float16 or bfloat16).  On a float32 weight MatMulNBits would give the float32
  product unrounded; on a float16 one too (measured above): other weights either way, so the
  composition.  Where the scales are float32 (compressed-tensors can store them so) the weights
  are the float32 product: fused, exact.  So too AWQ GEMV, whose weights are the float32 product
  of its float16 scales (its GEMV kernel's): fused, its float16 scales read as float32 through a Cast
  as GGUF's d (exact).
- everything else keeps the composition, with the reason (`why_not`): a min added after the
  product (Q4_1, Q5_1, K-quants' dmin), codes of 3, 5 or 6 bits, lookup tables (IQ, fp4),
  act-order (a Gather puts the decode's rows back in the inputs' order), a tied embedding (one decode read twice: kept once),
  a weight read through another node than a MatMul's B or a Gather's data.

Each fused weight's row says its bytes against the checkpoint's (1.000x for GGUF Q4_0 and Q8_0);
`fuse="never"` (`--fuse never`) writes every weight as the composition instead.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from dyndq.build import make_node
from dyndq.checkpoints.matching import STORED, TRANSPOSED, Match
from dyndq.checkpoints.writer import Written
from dyndq.converters.contrib.shared import let_go, mapped_columns, pack
from dyndq.opdefs import dtypes

MATMUL, GATHER = "com.microsoft::MatMulNBits", "com.microsoft::GatherBlockQuantized"
FITS = ("GGUF Q4_0", "GGUF Q8_0")  # GGUF types a fused op computes exactly, float16 d read as float32 (a Cast)
# safetensors formats whose decode may be one DynamicDequantize (q - z) * s: fused where its
# weights are float32 (float32 scales) and the model's too; float16 ones: see EXACT_RESULTS
SAFETENSORS_FITS = ("gptq", "awq", "pack-quantized")

# The types of a decode a fused op gives exactly: ONNX Runtime 1.32's CPU MatMulNBits multiplies A
# by the weights (q - z) * s computed in float32 and rounded once there, with float32 and with
# float16 scales alike (measured with rows of A holding two ones: tests/checkpoints/
# test_import_fused.py), so it keeps a float16 format's products unrounded where the format
# rounds each weight to float16 first.
EXACT_RESULTS = {TensorProto.FLOAT}
_FLOAT16_PRODUCT = ("the format's weights are {t} ((q - z) * s rounded to {t}); ONNX Runtime 1.32's MatMulNBits "
                    "multiplies by the float32 products unrounded (measured), other weights")
_REASONS = {  # kind prefix -> why the composition is written
    "GGUF Q4_1": "a min added after the product (d*q + m): MatMulNBits' zero points are integer codes",
    "GGUF Q5_1": "a min added after the product (d*q + m): MatMulNBits' zero points are integer codes",
    "GGUF Q5_0": "5-bit codes: MatMulNBits and GatherBlockQuantized take 2, 4 and 8 bits",
    "GGUF Q6_K": "super-block scales nested (d * sc) over blocks of 16 of 6-bit codes: not written fused yet",
    "GGUF Q2_K": "a min per sub-block (d*sc*q - dmin*m): MatMulNBits' zero points are integer codes",
    "GGUF Q3_K": "super-block scales nested (d * (sc - 32)) over 3-bit codes: MatMulNBits takes 2, 4 and 8 bits",
    "GGUF Q4_K": "a min per sub-block (d*sc*q - dmin*m): MatMulNBits' zero points are integer codes",
    "GGUF Q5_K": "a min per sub-block (d*sc*q - dmin*m) over 5-bit codes",
    "GGUF IQ": "codes index a lookup table (a grid or a non-uniform table), not (q - zp) * scale",
    "GGUF TQ": "ternary codes with their own packing: not (q - zp) * scale in MatMulNBits' layout",
    "GGUF MXFP4": "fp4 values with an e8m0 scale: not (q - zp) * scale",
    "GGUF NVFP4": "fp4 values with an fp8 scale: not (q - zp) * scale",
    "GGUF F": "a float tensor: no codes to fuse",
    "GGUF BF16": "a float tensor: no codes to fuse",
    "dense": "a float tensor: no codes to fuse",
    "nvfp4-pack-quantized": "fp4 values with two scales: not (q - zp) * scale",
}


# the fused form's bytes where GGUF's float16 d is read as float32 through a Cast (stored float16)
WIDENED_SIZE = {"GGUF Q4_0": "18 bytes per 32 weights, as Q4_0's: 1.000x",
                "GGUF Q8_0": "34 bytes per 32 weights, as Q8_0's: 1.000x"}


def never(matches: list[Match], tensors: dict) -> dict:
    """{weight: its form} with fuse "never": every weight the composition, the checkpoint's own
    bytes; the row of a weight that would have been fused says what fusing would have cost."""
    forms = {}
    for m in matches:
        kind = tensors[m.tensor].kind
        reason = why_not(kind)
        if reason:
            forms[m.weight] = f"composition: {reason}"
        else:
            cost = WIDENED_SIZE.get(kind, "")
            forms[m.weight] = ("composition: fuse 'never' asked: the checkpoint's own bytes kept"
                               + (f" (fused, the float16 d read as float32 through a Cast: {cost})" if cost else ""))
    return forms


def why_not(kind: str) -> str:
    """Why a tensor of `kind` keeps the composition whatever the model ("": its format may fit)."""
    if kind in FITS or kind.split(" ")[0] in SAFETENSORS_FITS:
        return ""
    for prefix, reason in _REASONS.items():
        if kind.startswith(prefix):
            return reason
    return f"{kind}: no fused form written for it"


def prepare(model: onnx.ModelProto, matches: list[Match], tensors: dict, decoded, data=None):
    """(decoded, matches) with each weight that fits rewritten into the lowering's form, and
    {weight: the form planned, or "composition: <reason>"}.  A rewritten weight's decode gives
    the graph's orientation itself, so its match reads it as stored (no Transpose after).
    `decoded`: {tensor: its Written}, or a function making one (one tensor's decode at a time);
    `data` (streamed.ReadableDataFile, the streamed import's scratch file), when given: each decode
    is written to it as it is made (writer.written_to: its tensors stubs), read back from it, and
    each tensor of a rewritten decode stored there once settled, so that one decode is held at a
    time; 8- and 4-bit codes are moved to [K, N] from the file a band at a time, written back
    straight from the bands: never whole in memory, nor beside the decode (docs/import.md, "Memory")."""
    by_tensor: dict[str, list[Match]] = {}
    for m in matches:
        by_tensor.setdefault(m.tensor, []).append(m)
    readers = _readers(model)
    dtypes = {t.name: t.data_type for t in model.graph.initializer}
    make = decoded if callable(decoded) else decoded.__getitem__
    store = None if data is None else data.stored
    if data is not None:
        make = _written_to(make, data)
    decoded, planned, oriented, shared = {}, {}, {}, {}
    settled = None
    for tensor, ms in by_tensor.items():
        written = rewritten = None  # (the last decode let go before the next is made)
        if store is not None and settled is not None:
            decoded[settled] = _stored(decoded[settled], store)
        settled = tensor
        source = tensors[tensor]
        written = decoded[tensor] = make(tensor)
        widen = source.kind in FITS  # (GGUF: float16 d, float32 result)
        reason, use = why_not(source.kind), None
        if not reason:
            reason = _dtype_problem(dtypes.get(ms[0].weight), TensorProto.FLOAT if widen else written.dtype)
        tied = _tied(ms, readers) if not reason and widen else None
        if tied is not None:  # (one set of codes and scales, read by GatherBlockQuantized and MatMulNBits)
            rewritten, form = _rewrite(written, tuple(source.shape), "gather", widen, data)
            if rewritten is not None:
                decoded[tensor] = rewritten
                _let_go_replaced(data, written, rewritten)
                shared[tensor] = (rewritten.nodes[0].name, *tied)
                for m in ms:
                    planned[m.weight] = (f"{GATHER} and {MATMUL} sharing one set of initializers, {form}: "
                                         "a tied embedding" + _size(rewritten, source))
                    oriented[m.weight] = STORED
                continue
            reason = form
        if not reason and (len(ms) > 1 or len(readers.get(ms[0].weight, [])) > 1):
            reason = (f"a tied embedding read as {len(ms)} weight(s) by {sum(len(readers.get(m.weight, [])) for m in ms)} "
                      "nodes, not one Gather of its rows and one MatMul (through torch's Transpose): one decode kept, as "
                      "the composition")
        if not reason:
            use, reason = _use(ms[0], readers.get(ms[0].weight, []), readers)
        rewritten = None
        if use is not None:
            rewritten, reason = _rewrite(written, tuple(source.shape), use.split(" ")[0], widen, data)
        if rewritten is None:
            for m in ms:
                planned[m.weight] = f"composition: {reason}"
            continue
        decoded[tensor] = rewritten
        _let_go_replaced(data, written, rewritten)
        if use == "matmul through Transpose":  # (the decode is [in, out] itself: the MatMul reads it, the Transpose goes)
            _drop_transpose(model, readers[ms[0].weight][0][0], ms[0].weight)
        op = MATMUL if use.startswith("matmul") else GATHER
        planned[ms[0].weight] = f"{op} {reason}" + _size(rewritten, source)
        oriented[ms[0].weight] = STORED
    if store is not None and settled is not None:
        decoded[settled] = _stored(decoded[settled], store)
    matches = [dataclasses.replace(m, orientation=oriented[m.weight]) if m.weight in oriented else m for m in matches]
    return decoded, matches, Plan(planned, list(shared.values()))


def _written_to(make, data):
    """`make` with each decode's tensors written to `data` as they are made (writer.written_to)."""
    from dyndq.checkpoints.writer import written_to

    def made(tensor):
        with written_to(data):
            return make(tensor)
    return made


def _let_go_replaced(data, written: Written, rewritten: Written) -> None:
    """A model in memory (`data` a dyndq.held_tensors.HeldTensors, which can let go): the tensors of
    the decode `written` its rewrite no longer reads dropped now, not held beside the rewritten
    ones till the end (a data file on disk keeps them: it has no `let_go`)."""
    if not hasattr(data, "let_go"):
        return
    from dyndq.model_files import external_entry

    kept = {external_entry(t, "offset") for t in rewritten.tensors if external_entry(t, "location")}
    for t in written.tensors:
        if external_entry(t, "location") and external_entry(t, "offset") not in kept:
            data.let_go(t)


def _stored(written: Written, store) -> Written:
    """`written` with its tensors handed to `store` (its lookup tables kept: placing compares their bytes)."""
    return dataclasses.replace(written, tensors=[t if t.name in written.tables else store(t) for t in written.tensors])


@dataclasses.dataclass
class Plan:
    """What `prepare` decided: the form of each weight, and the tied embeddings to write shared
    (after the decodes are placed: `share`)."""
    forms: dict
    tied: list


def _size(rewritten: Written, source) -> str:
    """The fused form's bytes against the checkpoint tensor's, in a few words (fuse "never" keeps 1.00x)."""
    from dyndq.plumbing.light import nbytes

    def stored(t):  # (2- and 4-bit codes packed, as ONNX stores them)
        bits = _bits(t.data_type)
        return nbytes(t) if bits in (None, 8) else -(-int(np.prod(t.dims)) * bits // 8)

    ratio = sum(stored(t) for t in rewritten.tensors) / max(1, source.nbytes)
    return f"; {ratio:.3f}x the checkpoint's bytes" + (" (fuse 'never': 1.00x)" if ratio > 1.001 else "")


def _tied(ms: list[Match], readers: dict):
    """(the Gather reading the embedding's rows, the MatMul reading it as B, the Transpose between
    or None) where the weights of one tensor are read by exactly those; else None."""
    gathers, matmuls = [], []
    for m in ms:
        for node, i in readers.get(m.weight, []):
            if node is None:
                return None
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            if node.op_type == "Gather" and node.domain in ("", "ai.onnx") and i == 0 and axis == 0 \
                    and m.orientation == STORED:
                gathers.append(node)
            elif (use := _use(m, [(node, i)], readers)[0]) == "matmul":
                matmuls.append((node, None))
            elif use == "matmul through Transpose":
                matmuls.append((readers[node.output[0]][0][0], node))
            else:
                return None
    if len(gathers) != 1 or len(matmuls) != 1:
        return None
    return gathers[0].output[0], matmuls[0][0].output[0], matmuls[0][1].output[0] if matmuls[0][1] is not None else None


def share(model: onnx.ModelProto, plan: "Plan", data=None) -> None:
    """Each tied GGUF Q4_0/Q8_0 embedding (placed as one 2-D decode [V, D] in blocks [1, 32], its
    weights read by one Gather and one MatMul) written as GatherBlockQuantized and MatMulNBits
    reading one set of initializers, as ONNX Runtime's model builder writes tied embeddings:
    MatMulNBits' B [V, D/32, 32*bits/8] (uint8 codes, q - 8 + 8 and x + 128: their absent zero
    points 8 and 128 are the same for both ops), GatherBlockQuantized's data the same bytes through
    a Reshape [V, D*bits/8], the scales [V, D/32] one float16 tensor (the checkpoint's d) and one
    Cast to float32 read by both (the ops' scales are A's type; exact).  `data`: as `prepare`'s (the
    codes read from it in place, B written to it a band of rows at a time)."""
    if not plan.tied:
        return
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    gone, new_inits = set(), []
    for ddq_name, gather_out, matmul_out, transpose_out in plan.tied:
        ddq = next(n for n in graph.node if n.name == ddq_name)
        codes_t, scales_t = inits[ddq.input[0]], inits[ddq.input[1]]
        bits = _bits(codes_t.data_type)
        vocab, width = codes_t.dims
        per = 8 // bits
        b_name, shape_name, data_name = (f"{codes_t.name}_B", f"{codes_t.name}_data_shape", f"{codes_t.name}_data")
        b_dims = [vocab, width // 32, 32 // per]
        raw = None if data is None else data.raw(codes_t)
        if raw is not None and bits in (4, 8) and width * bits % 8 == 0 and raw.size == vocab * width * bits // 8:
            b = data.stored_bytes(b_name, TensorProto.UINT8, b_dims, _unsigned_rows(raw.reshape(vocab, -1), bits))
        else:
            read = numpy_helper.to_array if data is None else data.read
            codes = read(codes_t).reshape(vocab, width).astype(np.int16) + (1 << (bits - 1))  # (unsigned: MatMulNBits' codes)
            packed = pack(codes, bits)  # (MatMulNBits' and GatherBlockQuantized's bytes: low bits first)
            b = numpy_helper.from_array(packed.reshape(b_dims), b_name)
            del codes, packed
            b = b if data is None else data.stored(b)
        new_inits += [b,
                      numpy_helper.from_array(np.array([vocab, width // per], np.int64), shape_name)]
        gather, matmul = producers[gather_out], producers[matmul_out]
        reshape = helper.make_node("Reshape", [b_name, shape_name], [data_name], name=f"{codes_t.name}_Reshape")
        scales = scales_t.name
        if scales_t.data_type == TensorProto.FLOAT16:  # (GGUF's d, a float32 model: read as float32 through a Cast)
            scales = f"{scales_t.name}_float32"
            reshape = [reshape, helper.make_node("Cast", [scales_t.name], [scales], name=f"{scales_t.name}_Cast",
                                                 to=TensorProto.FLOAT)]
        gbq = helper.make_node("GatherBlockQuantized", [data_name, gather.input[1], scales], [gather_out],
                               name=gather.name or f"{gather_out}_GatherBlockQuantized", domain="com.microsoft",
                               bits=bits, block_size=32, gather_axis=0, quantize_axis=1)
        nbits = helper.make_node("MatMulNBits", [matmul.input[0], b_name, scales], [matmul_out],
                                 name=matmul.name or f"{matmul_out}_MatMulNBits", domain="com.microsoft",
                                 K=width, N=vocab, bits=bits, block_size=32, accuracy_level=0)
        weights = {ddq.output[0]} | {n.output[0] for n in graph.node if n.op_type == "Identity" and n.input[0] == ddq.output[0]}
        replaced = {gather_out: gbq, matmul_out: nbits, ddq.output[0]: reshape}
        drop = weights - {ddq.output[0]} | ({transpose_out} if transpose_out else set())
        nodes = []
        for n in graph.node:
            if n.output[0] not in drop:
                made = replaced.get(n.output[0], n)
                nodes += made if isinstance(made, list) else [made]
        del graph.node[:]
        graph.node.extend(nodes)
        gone.add(codes_t.name)
        if hasattr(data, "let_go"):  # (in memory: the codes B replaced go now, not with the model)
            data.let_go(codes_t)
    from dyndq.checkpoints.placing import drop_initializers

    drop_initializers(graph, gone)
    graph.initializer.extend(new_inits)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _unsigned_rows(raw: np.ndarray, bits: int):
    """The bytes of codes [V, D] (int8, or int4 two a byte with D even) as MatMulNBits' unsigned
    codes (q + 2^(bits-1): for a nibble, its high bit flipped), a band of rows at a time."""
    band = max(1, BAND_BYTES // max(1, raw.shape[1]))
    flip = np.uint8(0x80 if bits == 8 else 0x88)
    mapped = getattr(raw, "_mmap", None)
    for start in range(0, raw.shape[0], band):
        yield (raw[start:start + band] ^ flip).data
        if mapped is not None:  # (the pages read let go: a tied embedding is often a model's largest tensor)
            let_go(mapped)


def _dtype_problem(weight: int | None, result: int) -> str:
    """Why a fused op cannot give a weight of type `weight` whose decode is of type `result` ("": it can)."""
    name = lambda t: TensorProto.DataType.Name(t).lower()  # noqa: E731
    if result == TensorProto.BFLOAT16:
        return "the format's weights are bfloat16: the fused ops' scales are float32 or float16"
    if result not in EXACT_RESULTS:
        return _FLOAT16_PRODUCT.format(t=name(result))
    if weight == result:
        return ""
    return (f"the model's weight is {name(weight) if weight else 'not an initializer'}, the decode {name(result)}: "
            "the fused op gives its scales' type")


def confirm(exported: onnx.ModelProto, planned: dict, export_lines: list[str]) -> dict:
    """The forms written: a planned fused weight whose value the exported graph still computes
    was not fused by the export (its reason is in the export's lines)."""
    computed = {o for n in exported.graph.node for o in n.output}
    return {w: (f"composition: the export did not fuse it ({_line_for(w, export_lines)})"
                if not form.startswith("composition") and w in computed else form) for w, form in planned.items()}


def _line_for(weight: str, lines: list[str]) -> str:
    return next((line.strip() for line in lines if weight in line), "see the export's lines")


def _drop_transpose(model: onnx.ModelProto, transpose: onnx.NodeProto, weight: str) -> None:
    """The MatMul reading `transpose`'s output reads `weight` instead; the Transpose is removed."""
    for n in model.graph.node:
        for i, name in enumerate(n.input):
            if name == transpose.output[0]:
                n.input[i] = weight
    gone = transpose.output[0]
    kept = [n for n in model.graph.node if gone not in n.output]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    infos = [v for v in model.graph.value_info if v.name != gone]
    del model.graph.value_info[:]
    model.graph.value_info.extend(infos)


def _readers(model: onnx.ModelProto) -> dict:
    """value -> [(node, input index)] of the main graph; a graph output: (None, -1)."""
    out: dict[str, list] = {}
    for n in model.graph.node:
        for i, name in enumerate(n.input):
            out.setdefault(name, []).append((n, i))
    for o in model.graph.output:
        out.setdefault(o.name, []).append((None, -1))
    return out


def _use(m: Match, readers: list, next_readers: dict | None = None) -> tuple[str | None, str]:
    """("matmul" | "matmul through Transpose" | "gather", "") where the weight's one reader is a
    MatMul's B (the weight stored [in, out]), a Transpose whose one reader is a MatMul's B (torch's
    export of a linear layer: the weight stored [out, in]), or a Gather's data on axis 0 (stored as
    the checkpoint's [rows, D]); else (None, why)."""
    if len(readers) != 1:
        return None, (f"read by {len(readers)} nodes ({', '.join(sorted({n.op_type for n, _ in readers}))}; a tied "
                      f"embedding): one decode kept, as the composition (each fused op would hold its own codes)")
    node, i = readers[0]
    if node is None:
        return None, "the weight is a graph output"
    if _is_matmul_b(node, i) and m.orientation == TRANSPOSED:
        return "matmul", ""
    if node.op_type == "Transpose" and node.domain in ("", "ai.onnx") and m.orientation == STORED \
            and next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0]) == [1, 0]:
        after = (next_readers or {}).get(node.output[0], [])
        if len(after) == 1 and _is_matmul_b(*after[0]):
            return "matmul through Transpose", ""
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if node.op_type == "Gather" and node.domain in ("", "ai.onnx") and i == 0 and axis == 0 and m.orientation == STORED:
        return "gather", ""
    return None, (f"read by {node.op_type} (input {i}, {m.orientation}): the fused ops replace a MatMul reading the "
                  "weight as its B, or a Gather of its rows")


def _is_matmul_b(node: onnx.NodeProto | None, i: int) -> bool:
    return node is not None and node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and i == 1


def _bits(data_type: int) -> int | None:
    """The bits of a code type the fused ops take (2-, 4- and 8-bit integers), else None."""
    return dtypes.narrow_integer_bits(dtypes.by_onnx(data_type))


def _rewrite(written: Written, shape: tuple, use: str, widen: bool, data=None) -> tuple[Written | None, str]:
    """(the decode, the fused form in a few words) or (None, why not): the decode of a tensor
    [rows, K] (one DynamicDequantize per_group in blocks along K, then Reshape; a Cast to the
    scales' type folded) as one DynamicDequantize on 2-D codes: [K, rows] in blocks [bs, 1] (a MatMul's B) or
    [rows, K] in blocks [1, bs] (a Gather's table).  Codes, scales and zero points are the same
    values moved; `widen`: float16 scales kept float16 (the checkpoint's bytes), the output float32
    (DynamicDequantize-3's output_dtype: float32(q - z) * float32(d), gguf's arithmetic), which the
    export writes as the float16 scales and a Cast to float32 feeding the fused op; `data`: as
    `prepare`'s (the decode's tensors stubs into it)."""
    ddq = [n for n in written.nodes if n.op_type == "DynamicDequantize"]
    casts = [n for n in written.nodes if n.op_type == "Cast"]
    if len(ddq) != 1 or len(shape) != 2 or any(n.op_type not in ("DynamicDequantize", "Reshape", "Cast") for n in written.nodes):
        return None, "its decode is more than one DynamicDequantize of a 2-D tensor (act-order's Gather putting the rows back, bit ops)"
    node = ddq[0]
    by_name = {t.name: t for t in written.tensors}
    # (GPTQ, AWQ: float32 product, then Cast to the float16 of the scales: one rounding, which a
    # DynamicDequantize writing float16 does itself)
    scales_type = by_name[node.input[1]].data_type if node.input[1] in by_name else None
    if len(casts) > 1 or (casts and (casts[0].input[0] != node.output[0] or _to(casts[0]) != scales_type)):
        return None, "its decode casts to another type than its scales'"
    given = [by_name.get(n) for n in node.input]
    if any(t is None for t in given):
        return None, "its codes, scales or zero points are not initializers of its decode"
    codes_t, scales_t, zps_t = (given + [None])[:3]
    if _bits(codes_t.data_type) is None or scales_t.data_type not in (TensorProto.FLOAT16, TensorProto.FLOAT):
        return None, (f"{TensorProto.DataType.Name(codes_t.data_type).lower()} codes, "
                      f"{TensorProto.DataType.Name(scales_t.data_type).lower()} scales: the fused ops take 2-, 4- and "
                      "8-bit codes and float32 or float16 scales")
    rows, k = shape
    group = _group_of(node)
    read = numpy_helper.to_array if data is None else data.read
    scales = read(scales_t)
    if scales.size == 0 or k % (scales.size // rows) or group[-1] != k // (scales.size // rows) \
            or any(g != 1 for g in group[:-1]):
        return None, f"its blocks {group} are not runs along K of [{rows}, {k}]"
    bs = group[-1]
    if bs < 16 or bs & (bs - 1):
        return None, f"blocks of {bs}: the fused ops take a power of two from 16"
    scales = scales.reshape(rows, k // bs)  # (`widen`: kept float16, the checkpoint's bytes; the node's output_dtype float32)
    # (a float32 decode of float16 scales, AWQ GEMV's float32 product: the same, float16 kept and read as float32)
    widen = widen or (written.dtype == TensorProto.FLOAT and scales.dtype == np.float16)
    zps = None if zps_t is None else read(zps_t).reshape(rows, k // bs)
    bits = _bits(codes_t.data_type)
    raw = None if data is None else data.raw(codes_t)  # (streamed: the codes moved from the file, never read whole)
    codes = moved_codes = None
    if raw is not None and use != "matmul":  # (the same bytes, seen as [rows, K])
        moved_codes = onnx.TensorProto()
        moved_codes.CopyFrom(codes_t)
        moved_codes.dims[:] = [rows, k]
    elif raw is not None and (bits == 8 or (bits == 4 and rows % 2 == 0 and k % 2 == 0)):
        # (the codes [K, rows] written a band of K at a time: the bytes from_array would give, never a whole copy)
        bands = _bands_transposed(raw.view(np.uint8).reshape(rows, k)) if bits == 8 else _nibble_bands_transposed(raw, rows, k)
        moved_codes = data.stored_bytes(codes_t.name, codes_t.data_type, [k, rows], bands)
    else:
        codes = (_values(codes_t) if raw is None else read(codes_t).reshape(-1)).reshape(rows, k)
    if use == "matmul":
        codes = None if codes is None else np.ascontiguousarray(codes.T)
        scales = np.ascontiguousarray(scales.T)
        zps = None if zps is None else np.ascontiguousarray(zps.T)
        group = [bs, 1]
    else:
        group = [1, bs]
    tensors = [moved_codes if codes is None else _codes_tensor(codes, codes_t), numpy_helper.from_array(scales, scales_t.name)]
    if zps is not None:
        tensors.append(_codes_tensor(zps, zps_t))
    out_type = TensorProto.FLOAT if widen or scales.dtype == np.float32 else TensorProto.FLOAT16
    new = make_node(list(node.input), [node.output[0]], name=node.name, version=3, qtype="per_group",
                    group_shape=group, output_dtype=out_type)
    form = (f"{_bits(codes_t.data_type)}-bit block {bs}, "
            + ("float16 scales read as float32 through a Cast" if widen
               else f"{'float32' if out_type == TensorProto.FLOAT else 'float16'} scales")
            + (", zero points" if zps is not None else ""))
    moved = f"{written.form}; codes and scales moved to {'[K, N]' if use == 'matmul' else '[rows, K]'}, blocks {group}"
    return Written([new], tensors, node.output[0], moved, written.opset, (), out_type), form


BAND_BYTES = 1 << 18  # about the codes moved at once when they are written a band at a time


def _bands_transposed(codes: np.ndarray):
    """The bytes of codes.T (C order), a band of its rows at a time (codes mapped on a file: read a
    few rows at a time, their pages let go: shared.mapped_columns)."""
    rows, k = codes.shape
    band = max(1, BAND_BYTES // max(1, rows * codes.itemsize))
    for start in range(0, k, band):
        yield np.ascontiguousarray(mapped_columns(codes, start, start + band, codes.dtype).T).data


def _nibble_bands_transposed(raw: np.ndarray, rows: int, k: int):
    """The bytes of codes.T, 4-bit codes [rows, K] (rows and K even) two a byte as ONNX stores them
    (low nibble first), a band of K at a time: each band's nibbles moved, never the codes one a byte."""
    packed = raw.reshape(rows, k // 2)
    band = max(1, BAND_BYTES // max(1, rows)) // 2 or 1  # (bytes of a row of the source per band)
    for start in range(0, k // 2, band):
        some = mapped_columns(packed, start, start + band, np.uint8)
        q = np.empty((rows, 2 * some.shape[1]), np.uint8)
        q[:, 0::2], q[:, 1::2] = some & 0x0F, some >> 4
        t = q.T  # [2 * band, rows]: pairs along rows packed, the first in the low nibble
        yield np.ascontiguousarray(t[:, 0::2] | (t[:, 1::2] << 4)).data


def _to(node: onnx.NodeProto) -> int | None:
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _group_of(node: onnx.NodeProto) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == "group_shape"), [])


def _values(t: onnx.TensorProto) -> np.ndarray:
    """A codes tensor's values, flat, in their own integer type (numpy_helper unpacks int4/uint4/int2/uint2 as ONNX
    packs them, one a byte: moved, never computed with, so not widened)."""
    return numpy_helper.to_array(t).reshape(-1)


def _codes_tensor(codes: np.ndarray, like: onnx.TensorProto) -> onnx.TensorProto:
    """`codes` (int64 values) as a tensor of `like`'s type and name (numpy_helper packs 2- and 4-bit ones)."""
    return numpy_helper.from_array(np.asarray(codes).astype(helper.tensor_dtype_to_np_dtype(like.data_type), copy=False),
                                   like.name)
