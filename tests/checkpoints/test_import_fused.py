"""`--emit onnxruntime`: ONNX Runtime's fused ops where the checkpoint's format fits them exactly
(GGUF Q4_0 and Q8_0 on a MatMul's B: MatMulNBits; on a Gather's table: GatherBlockQuantized), the
composition elsewhere, and the report's form per weight with its reason.

Each fused weight is compared bit for bit with gguf's dequantization through the fused node
itself on ONNX Runtime: MatMulNBits with A = identity(K) gives W (each output the sum of one weight
and zeros: equal in value, a -0 weight may come out +0), GatherBlockQuantized of every row gives
the table.  The model's outputs equal the float model holding gguf's weights within 1e-5 of the
largest (ONNX Runtime's MatMul sums in its own order)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dyndq
import gguf_models
from dyndq.cli import main
from engines import run_onnxruntime
from gguf_blocks import gguf, qtype
from gguf_models import DOWN, EMBED, HEAD_W, K, Q, UP, expected, float_model, gguf_tensors, ids, source_weights, write_gguf

MS = "com.microsoft"


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def alone(model: onnx.ModelProto, node: onnx.NodeProto, replaced: int, value: np.ndarray) -> np.ndarray:
    """`node` of the exported `model` run by itself on ONNX Runtime, its input `replaced` fed `value`
    (with the Cast of its float16 scales to float32, where it has one)."""
    inits = {t.name: t for t in model.graph.initializer}
    feed = node.input[replaced]
    casts = [n for n in model.graph.node if n.op_type == "Cast" and n.output[0] in node.input]
    graph = helper.make_graph([*casts, node], "alone", [helper.make_tensor_value_info(
        feed, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape))],
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
        [inits[n] for n in [*node.input, *(c.input[0] for c in casts)] if n in inits and n != feed])
    alone_model = helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    return run_onnxruntime(alone_model, {feed: value})[0]


def weights_through_fused(exported: onnx.ModelProto) -> dict[str, np.ndarray]:
    """{the fused node's output: the weights it computes}: MatMulNBits with A = identity, GatherBlockQuantized of every row."""
    out = {}
    for n in exported.graph.node:
        attrs = {a.name: a.i for a in n.attribute}
        if n.domain == MS and n.op_type == "MatMulNBits":
            out[n.output[0]] = alone(exported, n, 0, np.eye(attrs["K"], dtype=np.float32))
        elif n.domain == MS and n.op_type == "GatherBlockQuantized":
            rows = next(t for t in exported.graph.initializer if t.name == n.input[0]).dims[0]
            out[n.output[0]] = alone(exported, n, 1, np.arange(rows, dtype=np.int64))
    return out


CAST_SCALES = "float16 scales read as float32 through a Cast"


def scales_cast_from_float16(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Whether the fused `node`'s scales are a Cast to float32 of a float16 initializer."""
    inits = {t.name: t for t in model.graph.initializer}
    cast = next((n for n in model.graph.node if node.input[2] in n.output), None)
    return cast is not None and cast.op_type == "Cast" and cast.attribute[0].i == TensorProto.FLOAT \
        and node.input[2] not in inits and inits[cast.input[0]].data_type == TensorProto.FLOAT16


def same_bits(got: np.ndarray, want: np.ndarray, zeros_by_value: bool = False) -> None:
    assert got.shape == want.shape and got.dtype == np.float32
    differ = got.view(np.uint32) != want.view(np.uint32)
    if zeros_by_value:
        differ &= ~((got == 0) & (want == 0))
    assert not differ.any(), f"{differ.sum()} of {want.size} differ, the first at {np.flatnonzero(differ)[0]}"


@pytest.mark.parametrize("k_type,embed_type", [("Q4_0", "Q8_0"), ("Q8_0", "Q4_0")])
def test_q4_0_and_q8_0_become_fused_ops_giving_ggufs_bits(tmp_path, monkeypatch, k_type, embed_type):
    monkeypatch.setitem(gguf_models.TYPES, "blk.0.attn_k.weight", k_type)
    monkeypatch.setitem(gguf_models.TYPES, "token_embd.weight", embed_type)
    monkeypatch.setitem(gguf_models.TYPES, "blk.0.ffn_up.weight", k_type)
    src = source_weights()
    tensors = gguf_tensors(src)
    write_gguf(tmp_path / "m.gguf", tensors)
    model = float_model(src)
    out, report = dyndq.import_weights(model, tmp_path / "m.gguf", emit="onnxruntime")
    bits = {"Q4_0": 4, "Q8_0": 8}
    size = "; 1.000x the checkpoint's bytes"  # (the float16 d stored as it is, read as float32 through a Cast)
    assert report.forms[K] == f"com.microsoft::MatMulNBits {bits[k_type]}-bit block 32, {CAST_SCALES}" + size
    assert report.forms[EMBED] == f"com.microsoft::GatherBlockQuantized {bits[embed_type]}-bit block 32, {CAST_SCALES}" + size
    # Q: torch's Transpose + MatMul, its Transpose gone (the decode written [in, out] itself)
    assert report.forms[Q] == f"com.microsoft::MatMulNBits 8-bit block 32, {CAST_SCALES}" + size
    # each fused op's scales: a Cast to float32 of the checkpoint's float16 d, stored as it is
    for n in out.graph.node:
        if n.domain == MS:
            assert scales_cast_from_float16(out, n), n.name
    assert ops(out).count("MatMulNBits") == 2 and ops(out).count("GatherBlockQuantized") == 1
    assert "qT" in {o for n in model.graph.node for o in n.output} and "qT" not in {o for n in out.graph.node for o in n.output}
    # the rest: the composition, each with its reason
    assert report.forms[UP].startswith("composition: read by Gemm (input 1, as stored)")  # (a Q4_0/Q8_0 tensor)
    assert report.forms[DOWN].startswith("composition: a min added after the product")  # Q4_1
    assert report.forms[HEAD_W].startswith("composition: 5-bit codes")  # Q5_0
    rows = {r.weight: r for r in report.imported}
    assert rows[K].orientation == "transposed"  # (as the model reads it: the decode itself is written [in, out])
    # the weights through the fused nodes: gguf's float32 bits
    want = expected(tensors)
    fused = weights_through_fused(out)
    same_bits(fused["k"], want[K], zeros_by_value=True)
    same_bits(fused["q"], np.ascontiguousarray(want[Q].T), zeros_by_value=True)
    same_bits(fused["e"], want[EMBED])
    # the outputs: the float model holding gguf's weights, within 1e-5 of the largest
    oracle = gguf_models.with_weights(model, want)
    theirs = run_onnxruntime(oracle, ids())
    for value, wanted in zip(run_onnxruntime(out, ids()), theirs):
        np.testing.assert_allclose(value, wanted, rtol=1e-5, atol=1e-5 * float(np.abs(wanted).max()))


def drawn_finite(name: str, rows: int, n_blocks: int, seed: int) -> np.ndarray:
    """Raw Q4_0/Q8_0 blocks: random codes, float16 d drawn over its whole finite range (subnormals,
    -0, 65504 and their negatives included; inf and NaN left out: A = identity would spread them
    along a column as 0 * inf)."""
    rng = np.random.default_rng(seed)
    size = gguf.GGML_QUANT_SIZES[qtype(name)][1]
    data = rng.integers(0, 256, (rows * n_blocks, size), dtype=np.uint8)
    d = rng.integers(0, 1 << 16, rows * n_blocks, dtype=np.uint16).view(np.float16)
    d[~np.isfinite(d)] = np.float16(1.5)
    d[:6] = np.array([0.0, -0.0, 6e-8, -6e-8, 65504, -65504], np.float16)
    data[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, n_blocks * size)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
def test_drawn_blocks_over_the_whole_float16_range_are_exact_through_matmul_nbits(tmp_path, name):
    """Every code value and float16 scales from subnormals to 65504: MatMulNBits with float32
    scales (the float16 d through a Cast: exact) gives gguf's float32 product, the same one rounding."""
    n_out, n_in = 64, 128
    data = drawn_finite(name, n_out, n_in // 32, seed=5)
    write_gguf(tmp_path / "w.gguf", {"blk.0.ffn_down.weight": (name, data)})
    w = np.zeros((n_in, n_out), np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", n_in])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n_out])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    out, report = dyndq.import_weights(model, tmp_path / "w.gguf", names={"blk.0.ffn_down.weight": "w"},
                                       emit="onnxruntime")
    assert ops(out) == ["Cast", "MatMulNBits"], ops(out)  # (the float16 d, Cast to float32)
    assert scales_cast_from_float16(out, out.graph.node[1])
    with np.errstate(all="ignore"):
        want = np.ascontiguousarray(gguf.quants.dequantize(data, qtype(name)).astype(np.float32).T)
    same_bits(run_onnxruntime(out, {"x": np.eye(n_in, dtype=np.float32)})[0], want, zeros_by_value=True)
    # sums of two weights: the kernel multiplies by gguf's float32 weights themselves
    same_bits(run_onnxruntime(out, {"x": pairs(n_in, np.float32)})[0], summed(want, np.float32), zeros_by_value=True)
    assert report.forms["w"] == f"com.microsoft::MatMulNBits {name[1]}-bit block 32, {CAST_SCALES}; 1.000x the checkpoint's bytes"


def test_the_exporter_without_the_rewrite_writes_no_fused_op(tmp_path, monkeypatch):
    """The rewrite is what makes them: without it the decode keeps its blocks' axes and a Transpose."""
    from dyndq.checkpoints import fused

    src = source_weights()
    write_gguf(tmp_path / "m.gguf", gguf_tensors(src))
    monkeypatch.setattr(fused, "_rewrite", lambda *a: (None, "turned off"))
    out, report = dyndq.import_weights(float_model(src), tmp_path / "m.gguf", emit="onnxruntime")
    assert "MatMulNBits" not in ops(out) and "GatherBlockQuantized" not in ops(out)
    assert report.forms[K] == "composition: turned off"


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
@pytest.mark.parametrize("two_initializers", [False, True])
def test_a_tied_embedding_is_written_as_two_fused_ops_sharing_one_set_of_initializers(tmp_path, monkeypatch, kind,
                                                                                      two_initializers):
    """Tied in either form (one initializer read by the Gather and, through torch's Transpose, the
    output projection; or lm_head's own initializer matched to token_embd): GatherBlockQuantized and
    MatMulNBits reading one B and one float16 scales tensor through one Cast to float32, each giving gguf's bits."""
    monkeypatch.setitem(gguf_models.TYPES, "token_embd.weight", kind)
    src = source_weights()
    if two_initializers:
        src["lm_head"] = src["embed"].copy()
    tensors = gguf_tensors(src, tied=True)
    write_gguf(tmp_path / "t.gguf", tensors)
    model = float_model(src, tied=not two_initializers)
    out, report = dyndq.import_weights(model, tmp_path / "t.gguf", emit="onnxruntime")
    tied = [EMBED, HEAD_W] if two_initializers else [EMBED]
    for weight in tied:
        assert report.forms[weight].startswith(f"com.microsoft::GatherBlockQuantized and com.microsoft::MatMulNBits sharing one "
                                        f"set of initializers, {kind[1]}-bit block 32, {CAST_SCALES}: a tied "
                                        "embedding; 1.000x the checkpoint's bytes"), report.forms[weight]
    gbq = next(n for n in out.graph.node if n.op_type == "GatherBlockQuantized")
    nbits = next(n for n in out.graph.node if n.op_type == "MatMulNBits" and n.output[0] == "logits")
    reshape = next(n for n in out.graph.node if n.output[0] == gbq.input[0])
    assert reshape.op_type == "Reshape" and reshape.input[0] == nbits.input[1] and gbq.input[2] == nbits.input[2]
    assert scales_cast_from_float16(out, nbits) and scales_cast_from_float16(out, gbq)  # (one Cast, read by both)
    cast = next(n for n in out.graph.node if n.output[0] == gbq.input[2])
    codes = [t for t in out.graph.initializer if t.data_type in (TensorProto.INT4, TensorProto.INT8)
             and t.dims[0] == gguf_models.V]
    assert codes == []  # (the decode's codes gone: only B, once)
    want = expected(tensors, tied=True)[EMBED]
    nbits_alone = alone(out, nbits, 0, np.eye(gguf_models.D, dtype=np.float32))
    same_bits(nbits_alone, np.ascontiguousarray(want.T), zeros_by_value=True)
    rows = run_onnxruntime(helper.make_model(helper.make_graph(
        [reshape, cast, gbq], "gbq", [helper.make_tensor_value_info(gbq.input[1], TensorProto.INT64, [gguf_models.V])],
        [helper.make_tensor_value_info(gbq.output[0], TensorProto.FLOAT, None)],
        [t for t in out.graph.initializer if t.name in (*reshape.input, cast.input[0])]),
        opset_imports=list(out.opset_import), ir_version=out.ir_version), {gbq.input[1]: np.arange(gguf_models.V)})[0]
    same_bits(rows, want)
    oracle = gguf_models.with_weights(model, {**expected(tensors, tied=True), **({HEAD_W: want} if two_initializers else {})})
    for value, wanted in zip(run_onnxruntime(out, ids()), run_onnxruntime(oracle, ids())):
        np.testing.assert_allclose(value, wanted, rtol=1e-5, atol=1e-5 * float(np.abs(wanted).max()))


def test_a_tied_embedding_read_otherwise_keeps_one_decode_and_says_why(tmp_path, monkeypatch):
    """A tied Q4_0 embedding also read by a third node: one decode, the composition, the reason."""
    monkeypatch.setitem(gguf_models.TYPES, "token_embd.weight", "Q4_0")
    src = source_weights()
    tensors = gguf_tensors(src, tied=True)
    write_gguf(tmp_path / "t.gguf", tensors)
    model = float_model(src, tied=True)
    model.graph.node.append(helper.make_node("ReduceSum", [EMBED], ["total"]))
    model.graph.output.append(helper.make_tensor_value_info("total", TensorProto.FLOAT, [1, 1]))
    out, report = dyndq.import_weights(model, tmp_path / "t.gguf", emit="onnxruntime")
    assert report.forms[EMBED].startswith("composition: a tied embedding read as 1 weight(s) by 3 nodes"), report.forms
    assert "GatherBlockQuantized" not in ops(out)
    assert len([t for t in out.graph.initializer if t.data_type == TensorProto.INT4]) == 1  # (its codes, once)


def gptq_folder(tmp_path, bits: int, *, finite: bool = False):
    """A GPTQ v2 folder of one module (UP) [64, 256], groups of 64 (`finite`: scales without inf/NaN,
    which A = identity would spread along a column as 0 * inf)."""
    safetensors = pytest.importorskip("safetensors.numpy")
    from safetensors_checkpoints import gptq_tensors

    t = gptq_tensors(256, 64, bits, 64, v1=False, seed=3)
    if finite:
        t["scales"] = (np.random.default_rng(1).standard_normal(t["scales"].shape) * 0.013).astype(np.float16)
    folder = tmp_path / f"gptq{bits}"
    folder.mkdir()
    safetensors.save_file({f"{LINEAR}.{k}": v for k, v in t.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": bits, "group_size": 64, "checkpoint_format": "gptq_v2"}}))
    return folder, t


LINEAR = "model.layers.0.mlp.up_proj"


def linear_model(dtype=np.float32, n_in=256, out=64) -> onnx.ModelProto:
    """x [m, n_in] @ the weight stored [in, out] (a MatMul's B: the form MatMulNBits replaces)."""
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph([helper.make_node("MatMul", ["x", f"{LINEAR}.weight"], ["y"])], "linear",
                              [helper.make_tensor_value_info("x", t, ["m", n_in])],
                              [helper.make_tensor_value_info("y", t, ["m", out])],
                              [numpy_helper.from_array(np.zeros((n_in, out), dtype), f"{LINEAR}.weight")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def pairs(n: int, dtype) -> np.ndarray:
    """Rows of A holding two ones (row i: columns i and i + 1): A @ W sums two weights, once rounded,
    so the weights the kernel multiplies by show (A = identity rounds each to the output type, which
    hides a float16 weight's rounding)."""
    a = np.zeros((n - 1, n), dtype)
    a[np.arange(n - 1), np.arange(n - 1)] = 1
    a[np.arange(n - 1), np.arange(1, n)] = 1
    return a


def summed(w: np.ndarray, dtype) -> np.ndarray:
    """The sums of consecutive rows of float32 weights `w`, in float32, then in `dtype`."""
    return (w[:-1].astype(np.float32) + w[1:].astype(np.float32)).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gptq_keeps_the_composition_with_the_measured_reason(tmp_path, dtype):
    folder, t = gptq_folder(tmp_path, 4)
    out, report = dyndq.import_weights(linear_model(dtype), folder, emit="onnxruntime")
    assert report.forms[f"{LINEAR}.weight"].startswith("composition: the format's weights are float16"), report.forms
    assert "MatMulNBits" not in ops(out)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_fused_float16_matmul_nbits_multiplies_by_unrounded_products_which_is_why_it_is_not_written(tmp_path, monkeypatch, bits):
    """The measurement behind the decision (ONNX Runtime 1.32's CPU kernel): forced, the fused form
    of a GPTQ float16 weight gives the format's weights through A = identity (each rounded to the
    float16 output), but sums of two weights show it multiplies by the float32 products (q - z) * s
    unrounded, not by the format's float16 weights."""
    from dyndq.checkpoints import fused
    from safetensors_checkpoints import gptq_oracle

    folder, t = gptq_folder(tmp_path, bits, finite=True)
    monkeypatch.setattr(fused, "EXACT_RESULTS", {TensorProto.FLOAT, TensorProto.FLOAT16})
    out, report = dyndq.import_weights(linear_model(np.float16), folder, emit="onnxruntime")
    assert ops(out) == ["MatMulNBits"], ops(out)
    assert report.forms[f"{LINEAR}.weight"].startswith(f"com.microsoft::MatMulNBits {bits}-bit block 64, float16 scales, "
                                                       "zero points; ")
    want = np.ascontiguousarray(gptq_oracle(t, bits, v1=False).T)  # [in, out] float16: the format's weights
    same = run_onnxruntime(out, {"x": np.eye(256, dtype=np.float16)})[0]
    differ = (same.view(np.uint16) != want.view(np.uint16)) & ~((same == 0) & (want == 0))  # (a -0 weight: +0)
    assert not differ.any(), (differ.sum(), same[differ][:4], want[differ][:4])
    got = run_onnxruntime(out, {"x": pairs(256, np.float16)})[0]
    rounded_first = summed(want, np.float16)
    products = gptq_products(t, bits)
    assert (got.view(np.uint16) != rounded_first.view(np.uint16)).sum() > 0.01 * got.size
    assert (got.view(np.uint16) == summed(products, np.float16).view(np.uint16)).mean() > 0.95


def gptq_products(t, bits) -> np.ndarray:
    """GPTQ v2's (q - z) * s as float32 products (rounded once, in float32), [in, out]."""
    mask = (1 << bits) - 1
    shifts = np.arange(0, 32, bits, dtype=np.int32)
    q = ((t["qweight"][:, None, :] >> shifts[None, :, None]) & mask).reshape(-1, t["qweight"].shape[1])
    z = ((t["qzeros"][:, :, None] >> shifts[None, None, :]) & mask).reshape(t["qzeros"].shape[0], -1)[:, :q.shape[1]]
    g = t["g_idx"].astype(np.int64)
    return (q - z[g]).astype(np.float32) * t["scales"].astype(np.float32)[g]


@pytest.mark.parametrize("bits", [4, 8])
def test_compressed_tensors_with_float32_scales_are_fused_exactly(tmp_path, bits):
    """pack-quantized int4/int8 with float32 scales: its weights are the float32 product (q * s,
    rounded once), which MatMulNBits multiplies by: fused, bit for bit through A = identity and
    through sums of two weights."""
    safetensors = pytest.importorskip("safetensors.numpy")
    from safetensors_checkpoints import pack_bits

    out_f, n_in, group = 64, 256, 32
    rng = np.random.default_rng(7)
    q = rng.integers(-(1 << bits - 1), 1 << bits - 1, (out_f, n_in))
    scales = (rng.standard_normal((out_f, n_in // group)) * np.exp2(rng.integers(-30, 10, (out_f, 1)))).astype(np.float32)
    stored = (q + (1 << bits - 1)).astype(np.uint8)  # (compressed-tensors packs q + 2^(bits-1))
    safetensors.save_file({f"{LINEAR}.weight_packed": pack_bits(stored, bits), f"{LINEAR}.weight_scale": scales,
                           f"{LINEAR}.weight_shape": np.array([out_f, n_in], np.int64)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": {"num_bits": bits, "type": "int", "symmetric": True, "strategy": "group",
                                               "group_size": group}}}}}))
    out, report = dyndq.import_weights(linear_model(), tmp_path, emit="onnxruntime")
    assert ops(out) == ["MatMulNBits"], (ops(out), report.forms)
    assert report.forms[f"{LINEAR}.weight"].startswith(f"com.microsoft::MatMulNBits {bits}-bit block 32, float32 scales; ")
    want = np.ascontiguousarray((q.astype(np.float32) * np.repeat(scales, group, axis=1)).T)  # [in, out]
    same_bits(run_onnxruntime(out, {"x": np.eye(n_in, dtype=np.float32)})[0], want, zeros_by_value=True)
    same_bits(run_onnxruntime(out, {"x": pairs(n_in, np.float32)})[0], summed(want, np.float32), zeros_by_value=True)


def test_the_report_says_the_form_per_weight_in_text_and_json(tmp_path, capsys):
    src = source_weights()
    write_gguf(tmp_path / "m.gguf", gguf_tensors(src))
    onnx.save(float_model(src), tmp_path / "m.onnx")
    args = ["import-weights", str(tmp_path / "m.onnx"), str(tmp_path / "m.gguf"), "--emit", "onnxruntime"]
    assert main(args + ["-o", str(tmp_path / "a.onnx")]) == 0
    said = capsys.readouterr().out
    assert "form: com.microsoft::MatMulNBits 4-bit block 32" in said, said
    assert "form: composition: 5-bit codes" in said
    assert "(3 fused, 4 composition)" in said
    assert main(args + ["-o", str(tmp_path / "b.onnx"), "--json"]) == 0
    rows = {r["weight"]: r for r in json.loads(capsys.readouterr().out)["imported"]}
    assert rows[K]["written_as"].startswith("com.microsoft::MatMulNBits")
    assert rows[HEAD_W]["written_as"].startswith("composition: 5-bit codes")
    # another emit says nothing of forms
    assert main(["import-weights", str(tmp_path / "m.onnx"), str(tmp_path / "m.gguf"), "-o", str(tmp_path / "c.onnx"),
                 "--json"]) == 0
    assert all("written_as" not in r for r in json.loads(capsys.readouterr().out)["imported"])


def _initializer_bytes(model: onnx.ModelProto) -> int:
    """The bytes the file holds for the model's initializers (2- and 4-bit codes packed, as ONNX stores them)."""
    return sum(len(t.raw_data) if t.HasField("raw_data") else numpy_helper.to_array(t).nbytes for t in model.graph.initializer)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0"])
def test_fused_and_fuse_never_both_keep_the_checkpoints_bytes_and_the_weights_bits(tmp_path, name):
    """The default ("exact") fuses a weight MatMulNBits holds exactly at the checkpoint's own bytes:
    its float16 d stored as it is, read as float32 through a Cast (float32 d stored would be 20/18
    bytes a Q4_0 block, 36/34 a Q8_0 one: 1.111x and 1.059x, over the 1.10x bound for Q4_0);
    fuse="never" (--fuse never) the composition at the same bytes; the same weights bit for bit,
    and each row says its size."""
    n_out, n_in = 64, 4096
    data = drawn_finite(name, n_out, n_in // 32, seed=7)
    write_gguf(tmp_path / "w.gguf", {"blk.0.ffn_down.weight": (name, data)})
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", n_in])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n_out])],
                              [numpy_helper.from_array(np.zeros((n_in, n_out), np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    names = {"blk.0.ffn_down.weight": "w"}
    fused, fused_report = dyndq.import_weights(model, tmp_path / "w.gguf", names=names, emit="onnxruntime")
    never, report = dyndq.import_weights(model, tmp_path / "w.gguf", names=names, emit="onnxruntime", fuse="never")
    assert ops(fused) == ["Cast", "MatMulNBits"]
    assert not any(n.domain == MS for n in never.graph.node), ops(never)
    assert _initializer_bytes(fused) / data.nbytes == pytest.approx(1.0, abs=1e-3)  # (the bound: 1.10x)
    assert _initializer_bytes(never) / data.nbytes <= 1.001
    assert [t.data_type for t in fused.graph.initializer if t.name == next(
        n for n in fused.graph.node if n.op_type == "Cast").input[0]] == [TensorProto.FLOAT16]
    assert fused_report.forms["w"].endswith("; 1.000x the checkpoint's bytes")
    assert report.forms["w"].startswith("composition: fuse 'never' asked: the checkpoint's own bytes kept (fused, "
                                        "the float16 d read as float32 through a Cast: ")
    assert "1.000x" in report.forms["w"]
    assert report.summary().endswith("(0 fused, 1 composition)")
    # the same weights: A = identity gives each weight, on ONNX Runtime, through both forms
    with np.errstate(all="ignore"):
        want = np.ascontiguousarray(gguf.quants.dequantize(data, qtype(name)).astype(np.float32).T)
    eye = {"x": np.eye(n_in, dtype=np.float32)[:256]}
    for out in (fused, never):
        same_bits(run_onnxruntime(out, eye)[0], want[:256], zeros_by_value=True)


def test_fuse_is_checked_and_reaches_the_command(tmp_path, capsys):
    src = source_weights()
    write_gguf(tmp_path / "m.gguf", gguf_tensors(src))
    onnx.save(float_model(src), tmp_path / "m.onnx")
    with pytest.raises(dyndq.ValidationError, match="fuse"):
        dyndq.import_weights(tmp_path / "m.onnx", tmp_path / "m.gguf", emit="onnxruntime", fuse="sometimes")
    args = ["import-weights", str(tmp_path / "m.onnx"), str(tmp_path / "m.gguf"), "--emit", "onnxruntime"]
    assert main(args + ["-o", str(tmp_path / "a.onnx"), "--fuse", "never"]) == 0
    said = capsys.readouterr().out
    assert "(0 fused, 7 composition)" in said and "form: composition: fuse 'never' asked" in said, said
    written = onnx.load(str(tmp_path / "a.onnx"))
    assert not any(n.domain == MS for n in written.graph.node)
    assert main(args + ["-o", str(tmp_path / "b.onnx"), "--fuse", "sometimes"]) == 2


def gemv_folder(tmp_path, n_in, out, group_size):
    """An AWQ GEMV checkpoint of LINEAR (AutoAWQ's WQLinear_GEMV), finite scales: the sums below compare numbers."""
    from safetensors_checkpoints import awq_gemv_tensors

    safetensors = pytest.importorskip("safetensors.numpy")
    t = awq_gemv_tensors(n_in, out, group_size, seed=group_size)
    groups = n_in // group_size
    t["scales"][:, :groups] = (np.random.default_rng(1).standard_normal((out, groups)) * 0.013).astype(np.float16)
    safetensors.save_file({f"{LINEAR}.{k}": v for k, v in t.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "awq", "bits": 4, "group_size": group_size, "version": "gemv"}}))
    return t


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_awq_gemv_on_a_float32_model_becomes_matmul_nbits_giving_its_kernels_weights(tmp_path, group_size):
    """AWQ GEMV's weights are the float32 product (its GEMV kernel's): its float16 scales, stored as
    they are and read as float32 through a Cast (exact), make MatMulNBits multiply by that product,
    bit for bit (fed float16 scales, the op's result would be float16: the product rounded)."""
    from safetensors_checkpoints import awq_gemv_oracle, awq_gemv_product

    t = gemv_folder(tmp_path, 256, 64, group_size)
    out, report = dyndq.import_weights(linear_model(), tmp_path, emit="onnxruntime")
    assert ops(out) == ["Cast", "MatMulNBits"], (ops(out), report.forms)
    (cast,) = [n for n in out.graph.node if n.op_type == "Cast"]
    inits = {t.name: t for t in out.graph.initializer}
    assert inits[cast.input[0]].data_type == onnx.TensorProto.FLOAT16
    assert report.forms[f"{LINEAR}.weight"].startswith(f"com.microsoft::MatMulNBits 4-bit block {group_size}, float16 "
                                                       "scales read as float32 through a Cast, zero points; "), report.forms
    want = np.ascontiguousarray(awq_gemv_oracle(t, group_size).T if group_size != 32 else awq_gemv_product(t, 32).T)
    same_bits(run_onnxruntime(out, {"x": np.eye(256, dtype=np.float32)})[0], want, zeros_by_value=True)
    same_bits(run_onnxruntime(out, {"x": pairs(256, np.float32)})[0], summed(want, np.float32), zeros_by_value=True)


def test_awq_gemv_on_a_float16_model_keeps_the_composition_saying_why(tmp_path):
    gemv_folder(tmp_path, 256, 64, 64)
    out, report = dyndq.import_weights(linear_model(np.float16), tmp_path, emit="onnxruntime")
    assert "MatMulNBits" not in ops(out)
    assert report.forms[f"{LINEAR}.weight"].startswith("composition: the model's weight is float16, the decode float"), \
        report.forms
